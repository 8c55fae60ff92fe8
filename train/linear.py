"""Linear controls of the paper's comparison (Foerster et al. 2017, ICML Sec 3.1; the bias-free
ISAN: ICLR workshop version Sec 6.1): what the ISAN's input switching and its biases buy.

Three models with the interface of :class:`isan.train.models.ISAN` (``kind``,
``__init__(K, V, d, seed=None)``, ``for_budget``, ``param_count``, ``config()``,
``initial_state(B)``, ``forward(x, state)`` whose logits at step t predict ``x[t]`` from the
state *before* it (docs/ARCHITECTURE.md, 'The model and its conventions'), ``numpy_params()``),
so the trainer, ``evaluate_bpc`` and ``export_checkpoint`` treat them like every other model.
Column-vector convention.

* ``linear``: a fully linear RNN without input switching (paper: about 3.1 bpc on text8)::

      h_t = W h_{t-1} + U onehot(x_t) + b,    logits_t = W_ro h_t + b_ro

  With a one-hot input ``U onehot(x) + b`` is one column of a table, so the input is stored
  as ``E`` (K, d) with ``E[x] = U[:, x] + b`` (as the baselines fold their input bias; no
  parameter is redundant). Parameters: ``W`` (d, d), ``E`` (K, d), ``W_ro`` (V, d),
  ``b_ro`` (V,), ``h0`` (d,): ``d^2 + K d + V d + V + d``.
* ``linear_nlro``: the same linear recurrence with a nonlinear readout (paper: about 2.15 bpc),
  one tanh hidden layer of width ``m`` (``readout_hidden``, default ``m = d``) before the
  softmax layer::

      logits_t = W_ro tanh(W_mlp h_t + b_mlp) + b_ro

  Parameters: those of ``linear`` with ``W_ro`` (V, m) instead of (V, d), plus ``W_mlp`` (m, d)
  and ``b_mlp`` (m,): ``d^2 + K d + m d + m + V m + V + d`` (``2 d^2 + (K + V + 2) d + V`` for
  ``m = d``).
  Training keeps ``W`` non-expansive: after each optimizer step ``W`` is scaled back onto the
  spectral-norm ball ``||W||_2 <= w_max_norm`` (1.0 by default; :meth:`constrain_`, which the
  trainer calls). Without it the run diverged at each rate we tried (2e-3, 1e-3 and 2.5e-4):
  Adam lifts ``W``'s spectral radius above 1 within a few steps, the tanh readout saturates but
  still predicts from the sign pattern of the state (the loss keeps falling while ``|h|`` passes
  1e16), so nothing pulls ``W`` back, and the state carried along the stream overflows float32.
  The plain ``linear`` model needs no constraint: its linear readout turns a growing state into a
  growing loss. The constraint changes training only; the exported model is the same
  architecture, with a ``W`` whose state stays bounded on any stream.
* ``isan_nobias``: the ISAN without its biases, ``h_t = W[x_t] h_{t-1}`` (ICLR workshop version Sec 6.1: about 4.1 bpc),
  ``logits_t = W_ro h_t + b_ro``. Parameters: ``W`` (K, d, d), ``W_ro`` (V, d), ``b_ro`` (V,),
  ``h0`` (d,): ``K d^2 + V d + V + d``. The state is a linear function of ``h0`` alone
  (``h_t = W[x_t] ... W[x_1] h0``), so ``h0`` starts random (N(0, 1/d) per entry, norm about 1)
  and ``W[k]`` orthogonal (``init_scale`` 1.0 by default, so the state's norm neither decays nor
  grows at the start). It runs :func:`isan.train.scan.isan_scan` with a zero bias that is a
  non-persistent buffer: not a parameter, not in the state dict, not exported.

The numpy twin is :mod:`isan.engine.baselines.linear`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from isan.params import largest_d
from isan.train.scan import isan_scan


def _orthogonal(d: int, scale: float, g: torch.Generator | None) -> torch.Tensor:
    """A random (d, d) orthogonal matrix (Haar, sign-corrected QR) times ``scale``, row-major
    (QR returns a column-major Q; a non-contiguous parameter breaks saving Adam's state)."""
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g))
    return (q * torch.sign(torch.diagonal(r)).unsqueeze(0) * scale).contiguous()


class _OneStateModel(nn.Module):
    """What the linear RNN and the bias-free ISAN share: one state h (d,) with a learned ``h0``,
    budget sizing from the subclass's ``param_count(K, V, d)``, and the export helpers."""

    kind = "?"

    @staticmethod
    def _count_args(kw: dict) -> tuple:
        """Constructor options that change the parameter count, as extra ``param_count`` arguments."""
        return ()

    @classmethod
    def for_budget(cls, K: int, V: int, params: float, **kw):
        """The model with the largest d whose :meth:`param_count` (with the size options in ``kw``)
        is at most ``params``.

        Raises:
            ValueError: not even d = 1 fits.
        """
        extra = cls._count_args(kw)
        return cls(K, V, largest_d(lambda d: cls.param_count(K, V, d, *extra), params, f"{cls.kind} with K={K}, V={V}"),
                   **kw)

    def config(self) -> dict:
        """JSON-able description of the architecture (the ``model`` field of checkpoints and bundles)."""
        return {"kind": self.kind, "K": self.K, "V": self.V, "d": self.d, "state": ["h"]}

    def initial_state(self, B: int) -> torch.Tensor:
        """The learned initial state for B streams: (B, d)."""
        return self.h0.unsqueeze(0).expand(B, self.d)

    def numpy_params(self) -> dict:
        """Every tensor of the state dict as a float32 numpy array (names as in weights.safetensors)."""
        return {n: t.detach().cpu().float().numpy() for n, t in self.state_dict().items()}


class LinearRNN(_OneStateModel):
    """Linear RNN without input switching: ``h_t = W h_{t-1} + E[x_t]``, ``logits_t = W_ro h_t + b_ro``.

    Args:
        K: input symbols; V: output classes; d: hidden units.
        seed: seed of the initialisation (None: torch's global generator).
        init_scale: ``W`` starts orthogonal times this (0.95, as the ISAN).
    """

    kind = "linear"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, init_scale: float = 0.95):
        super().__init__()
        self.K, self.V, self.d = int(K), int(V), int(d)
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        bound = 1 / math.sqrt(d)
        self.W = nn.Parameter(_orthogonal(d, init_scale, g))
        self.E = nn.Parameter(torch.empty(K, d).uniform_(-bound, bound, generator=g))
        self._init_readout(g)
        self.h0 = nn.Parameter(torch.zeros(d))

    def _init_readout(self, g) -> None:
        bound = 1 / math.sqrt(self.d)
        self.W_ro = nn.Parameter(torch.empty(self.V, self.d).uniform_(-bound, bound, generator=g))
        self.b_ro = nn.Parameter(torch.zeros(self.V))

    @staticmethod
    def param_count(K: int, V: int, d: int) -> int:
        """sum(p.numel()): ``d^2 + K d + V d + V + d``."""
        return d * d + K * d + V * d + V + d

    def readout(self, S: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of states S (..., d)."""
        return torch.matmul(S, self.W_ro.T) + self.b_ro

    def forward(self, x: torch.Tensor, h: torch.Tensor):
        """x: (T, B) int64; h: (B, d) state before x[0].

        Returns (logits (T, B, V) where logits[t] predicts x[t] from the state before it,
        the state after x[-1] (B, d)).
        """
        A = self.E[x]  # (T, B, d): the input term of every step, one gather for the chunk
        WT = self.W.T  # row-vector convention: h_row @ W^T
        hs = [h]
        for t in range(x.shape[0]):
            hs.append(torch.addmm(A[t], hs[-1], WT))
        S = torch.stack(hs[:-1], 0)  # (T, B, d) states before each x[t]
        return self.readout(S), hs[-1]

class LinearRNNNonlinearReadout(LinearRNN):
    """The linear recurrence of :class:`LinearRNN` with a tanh hidden layer in the readout:
    ``logits_t = W_ro tanh(W_mlp h_t + b_mlp) + b_ro``.

    Args:
        readout_hidden: width m of the readout's hidden layer (None: m = d).
        w_max_norm: :meth:`constrain_` keeps the spectral norm of ``W`` at most this (None: no
            constraint; the module docstring says why it is needed).
        (others as :class:`LinearRNN`)

    Raises:
        ValueError: ``readout_hidden`` < 1 or ``w_max_norm`` <= 0.
    """

    kind = "linear_nlro"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, init_scale: float = 0.95,
                 readout_hidden: int | None = None, w_max_norm: float | None = 1.0):
        self.m = int(readout_hidden) if readout_hidden is not None else int(d)
        if self.m < 1:
            raise ValueError(f"readout_hidden must be >= 1; got {readout_hidden}")
        if w_max_norm is not None and not w_max_norm > 0:
            raise ValueError(f"w_max_norm must be > 0 or None; got {w_max_norm}")
        self.w_max_norm = None if w_max_norm is None else float(w_max_norm)
        super().__init__(K, V, d, seed=seed, init_scale=init_scale)

    @torch.no_grad()
    def constrain_(self) -> None:
        """Bring ``W`` into ``{||W||_2 <= w_max_norm}`` in place: when its largest singular value is
        above the bound, scale the whole matrix down to it (its direction kept; the nearest point of
        the ball would clip only the singular values above the bound). The trainer calls this after
        every optimizer step."""
        if self.w_max_norm is None:
            return
        s = torch.linalg.matrix_norm(self.W, ord=2)
        if s > self.w_max_norm:
            self.W.mul_(self.w_max_norm / s)

    def _init_readout(self, g) -> None:
        d, m = self.d, self.m
        self.W_mlp = nn.Parameter(torch.empty(m, d).uniform_(-1 / math.sqrt(d), 1 / math.sqrt(d), generator=g))
        self.b_mlp = nn.Parameter(torch.zeros(m))
        self.W_ro = nn.Parameter(torch.empty(self.V, m).uniform_(-1 / math.sqrt(m), 1 / math.sqrt(m), generator=g))
        self.b_ro = nn.Parameter(torch.zeros(self.V))

    @staticmethod
    def param_count(K: int, V: int, d: int, readout_hidden: int | None = None) -> int:
        """sum(p.numel()): ``d^2 + K d + m d + m + V m + V + d`` with m = readout_hidden or d."""
        m = d if readout_hidden is None else int(readout_hidden)
        return d * d + K * d + m * d + m + V * m + V + d

    @staticmethod
    def _count_args(kw: dict) -> tuple:
        """``readout_hidden`` from ``kw`` (None: m = d) for :meth:`param_count`."""
        return (kw.get("readout_hidden"),)

    def config(self) -> dict:
        return {**super().config(), "readout": "tanh", "readout_hidden": self.m, "w_max_norm": self.w_max_norm}

    def readout(self, S: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of states S (..., d) through the tanh layer."""
        return torch.matmul(torch.tanh(torch.matmul(S, self.W_mlp.T) + self.b_mlp), self.W_ro.T) + self.b_ro


class ISANNoBias(_OneStateModel):
    """The ISAN without biases: ``h_t = W[x_t] h_{t-1}``, ``logits_t = W_ro h_t + b_ro``.

    Args:
        K: input symbols; V: output classes; d: hidden units.
        seed: seed of the initialisation (None: torch's global generator).
        init_scale: every ``W[k]`` starts orthogonal times this (default 1.0: norm-preserving).
    """

    kind = "isan_nobias"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, init_scale: float = 1.0):
        super().__init__()
        self.K, self.V, self.d = int(K), int(V), int(d)
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        self.W = nn.Parameter(torch.stack([_orthogonal(d, init_scale, g) for _ in range(K)]))
        bound = 1 / math.sqrt(d)
        self.W_ro = nn.Parameter(torch.empty(V, d).uniform_(-bound, bound, generator=g))
        self.b_ro = nn.Parameter(torch.zeros(V))
        self.h0 = nn.Parameter(torch.randn(d, generator=g) / math.sqrt(d))  # h0 = 0 would stay 0 for ever
        self.register_buffer("zero_b", torch.zeros(K, d), persistent=False)  # isan_scan's b; not a parameter

    @staticmethod
    def param_count(K: int, V: int, d: int) -> int:
        """sum(p.numel()): ``K d^2 + V d + V + d``."""
        return K * d * d + V * d + V + d

    def forward(self, x: torch.Tensor, h: torch.Tensor):
        """x: (T, B) int64; h: (B, d) state before x[0].

        Returns (logits (T, B, V) predicting x[t] from the state before it, the state after x[-1] (B, d)).
        """
        H = isan_scan(self.W, self.zero_b.to(self.W.dtype), h, x)  # (T, B, d)
        S = torch.cat([h.unsqueeze(0), H[:-1]], 0)  # states before each x[t]
        return torch.matmul(S, self.W_ro.T) + self.b_ro, H[-1]


#: the linear controls by kind; merged into :data:`isan.train.models.MODELS`.
LINEAR = {"linear": LinearRNN, "linear_nlro": LinearRNNNonlinearReadout, "isan_nobias": ISANNoBias}
