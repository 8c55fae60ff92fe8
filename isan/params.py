"""ISAN parameters as numpy arrays: names, shapes, validation, hashing and safetensors I/O.

Convention (docs/ARCHITECTURE.md, 'The model and its conventions'; column vectors): ``W`` (K, d, d),
``b`` (K, d), ``W_ro`` (V, d), ``b_ro`` (V,), ``h0`` (d,); ``h_t = W[x_t] @ h_{t-1} + b[x_t]``
(paper eq. 1), ``logits_t = W_ro @ h_t + b_ro`` (eqs. 2-3).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isan.errors import BudgetError, BundleFormatError, IsanError

ISAN_TENSORS = ("W", "b", "W_ro", "b_ro", "h0")


def isan_param_count(K: int, V: int, d: int) -> int:
    """Number of parameters of an ISAN: K d^2 + K d + V d + V + d (1,271,619 for K=V=27, d=216)."""
    return K * d * d + K * d + V * d + V + d


def largest_d(count, budget: float, what: str = "model") -> int:
    """The largest d >= 1 with ``count(d) <= budget``, for a parameter count increasing in d.

    Raises:
        BudgetError: not even d = 1 fits (``what`` names the model in the message).
    """
    if count(1) > budget:
        raise BudgetError(f"a parameter budget of {budget:g} is too small for any {what} (d = 1 takes "
                          f"{count(1):,}): raise --params")
    lo, hi = 1, 2
    while count(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # count(lo) <= budget < count(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid) <= budget else (lo, mid)
    return lo


def largest_isan_d(K: int, V: int, budget: float) -> int:
    """The largest hidden size d whose ISAN has at most ``budget`` parameters."""
    return largest_d(lambda d: isan_param_count(K, V, d), budget, f"ISAN with K={K}, V={V}")


def tensors_sha256(tensors: dict[str, np.ndarray], names: tuple[str, ...] | None = None) -> str:
    """sha256 over the named tensors in order: name, dtype, shape and little-endian float32 bytes.

    This is the ``params_sha256`` of a bundle manifest; tables and ONNX files carry it to
    prove they belong to these weights.
    """
    h = hashlib.sha256()
    for name in names or tuple(sorted(tensors)):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        h.update(name.encode() + b"\0" + str(a.shape).encode() + b"\0")
        h.update(a.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class ISANParams:
    """Immutable ISAN parameters (arrays are read-only). dtype float32 or float64."""

    W: np.ndarray
    b: np.ndarray
    W_ro: np.ndarray
    b_ro: np.ndarray
    h0: np.ndarray

    def __post_init__(self) -> None:
        for name in ISAN_TENSORS:
            a = np.array(getattr(self, name), copy=True)
            a.setflags(write=False)
            object.__setattr__(self, name, a)
        validate_isan_shapes(self.as_dict())

    @property
    def K(self) -> int:
        return self.W.shape[0]

    @property
    def d(self) -> int:
        return self.W.shape[1]

    @property
    def V(self) -> int:
        return self.W_ro.shape[0]

    def as_dict(self) -> dict[str, np.ndarray]:
        return {n: getattr(self, n) for n in ISAN_TENSORS}

    def astype(self, dtype) -> "ISANParams":
        return ISANParams(**{n: np.asarray(a, dtype=dtype) for n, a in self.as_dict().items()})

    def sha256(self) -> str:
        return tensors_sha256(self.as_dict(), ISAN_TENSORS)

    def n_params(self) -> int:
        return sum(int(a.size) for a in self.as_dict().values())


def expand_inputs(params: ISANParams, input_map: np.ndarray | None) -> ISANParams:
    """The parameters read by output id: ``W[input_map]``, ``b[input_map]`` (V, d, d), (V, d).

    A token alphabet with fewer inputs than outputs (:class:`isan.tokens.ByteAlphabet`: bytes
    outside the K - 1 frequent ones share the ``other`` input) is scored as a model whose input
    symbols are its outputs: the same arithmetic, one id sequence. Identity when ``input_map`` is None.
    """
    if input_map is None:
        return params
    m = np.asarray(input_map, dtype=np.int64)
    if m.ndim != 1 or (len(m) and (m.min() < 0 or m.max() >= params.K)):
        raise IsanError(f"input_map must map outputs to inputs in [0, {params.K})")
    return ISANParams(W=params.W[m], b=params.b[m], W_ro=params.W_ro, b_ro=params.b_ro, h0=params.h0)


def validate_isan_shapes(t: dict[str, np.ndarray]) -> None:
    """Raise BundleFormatError unless the tensors have consistent ISAN shapes and finite values."""
    missing = [n for n in ISAN_TENSORS if n not in t]
    if missing:
        raise BundleFormatError(f"ISAN weights lack tensors {missing}; expected {list(ISAN_TENSORS)}")
    W, b, W_ro, b_ro, h0 = (np.asarray(t[n]) for n in ISAN_TENSORS)
    if W.ndim != 3 or W.shape[1] != W.shape[2]:
        raise BundleFormatError(f"W must have shape (K, d, d); got {W.shape}")
    K, d = W.shape[0], W.shape[1]
    expect = {"b": (K, d), "W_ro": (W_ro.shape[0] if W_ro.ndim == 2 else -1, d), "h0": (d,)}
    if b.shape != expect["b"]:
        raise BundleFormatError(f"b must have shape (K, d) = {(K, d)}; got {b.shape}")
    if W_ro.ndim != 2 or W_ro.shape[1] != d:
        raise BundleFormatError(f"W_ro must have shape (V, d) with d = {d}; got {W_ro.shape}")
    if b_ro.shape != (W_ro.shape[0],):
        raise BundleFormatError(f"b_ro must have shape (V,) = {(W_ro.shape[0],)}; got {b_ro.shape}")
    if h0.shape != (d,):
        raise BundleFormatError(f"h0 must have shape (d,) = {(d,)}; got {h0.shape}")
    for n, a in zip(ISAN_TENSORS, (W, b, W_ro, b_ro, h0)):
        if not np.all(np.isfinite(a)):
            raise BundleFormatError(f"tensor {n} holds non-finite values (NaN or inf); re-export a good checkpoint")


def save_tensors(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write float32 tensors to a safetensors file atomically."""
    from safetensors.numpy import save_file

    from isan.atomic import atomic_path

    arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(arrays, str(tmp), metadata=metadata)


def load_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors file. Raises BundleFormatError on a missing or corrupt file."""
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
        raise BundleFormatError(f"{path} does not exist")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises SafetensorError / OSError / ValueError
        raise BundleFormatError(f"{path} is not a valid safetensors file ({e}); re-run `isan export`") from None
