"""The stability certificate of an ISAN: a proof that no input makes its state diverge.

If an invertible basis P makes every transition a contraction, ``||P W_x P^-1||_2 <= rho < 1``
for every symbol x, then for every input and every t (by induction on
``||P h_t|| <= rho ||P h_{t-1}|| + ||P b_x||``):

    ||P h_t|| <= max(||P h_0||, max_x ||P b_x|| / (1 - rho)) =: R,   max_i |h_t,i| <= ||P^-1||_2 R,

and two states that start apart by e_0 are apart by at most ``cond(P) rho^t ||e_0||`` after t
characters, whatever the text: a start-state error dies at least as fast as rho^t. (The bound
``rho^t ||P h_0|| + max_x ||P b_x|| / (1 - rho)``, from unrolling the recursion, is looser.)

Models trained with ``isan train --stable-rho`` carry it: the bundle's manifest holds
``"certificate": {"rho", "state_bound", "file": "certificate.safetensors", "method", ...}`` and the
file holds P (float64, (d, d)). :func:`check_certificate` recomputes everything from the bundle's
own float32 weights in float64 and says whether the claim holds; nothing is taken on trust.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from isan.errors import BundleFormatError

#: the certificate's file in a bundle: one float64 tensor "P" (d, d)
CERT_FILE = "certificate.safetensors"


def certificate(W: np.ndarray, b: np.ndarray, h0: np.ndarray, P: np.ndarray | None = None) -> dict:
    """The contraction certificate of ISAN weights in basis ``P`` (identity if None), in float64.

    Args:
        W: (K, d, d), b: (K, d), h0: (d,): the weights as stored (float32 is cast up exactly).
        P: (d, d) invertible basis.
    Returns:
        ``{"rho": max_x ||P W_x P^-1||_2, "state_bound": bound on max_i |h_t,i| for every input and
        t (inf if rho >= 1), "cond_P": ||P||_2 ||P^-1||_2, "sigma": per-symbol ||P W_x P^-1||_2}``.
    """
    W = np.asarray(W, dtype=np.float64)
    d = W.shape[1]
    P = np.eye(d) if P is None else np.asarray(P, dtype=np.float64)
    Pinv = np.linalg.inv(P)
    M = P @ W @ Pinv  # (K, d, d)
    sigma = np.linalg.svd(M, compute_uv=False)[:, 0]
    rho = float(sigma.max())
    p_inv_norm = float(np.linalg.svd(Pinv, compute_uv=False)[0])
    p_norm = float(np.linalg.svd(P, compute_uv=False)[0])
    if rho < 1.0:
        ph0 = float(np.linalg.norm(P @ np.asarray(h0, dtype=np.float64)))
        pb = float(np.linalg.norm(np.asarray(b, dtype=np.float64) @ P.T, axis=1).max())
        bound = p_inv_norm * max(ph0, pb / (1.0 - rho))
    else:
        bound = float("inf")
    return {"rho": rho, "state_bound": float(bound), "cond_P": p_norm * p_inv_norm, "sigma": sigma.tolist()}


def check_certificate(bundle: str | Path, manifest: dict, W: np.ndarray, b: np.ndarray, h0: np.ndarray) -> dict | None:
    """Recompute a bundle's certificate from its files; None if the manifest claims none.

    Args:
        bundle: the bundle directory; manifest: its manifest (verified by the loader);
        W, b, h0: its stored weights (the input side: W (K, d, d)).
    Returns:
        ``{"claimed": the manifest's record, "rho", "state_bound", "cond_P", "holds": rho < 1 and the
        recomputed bound is within 1e-6 (relative) of the claim or below it, "problem": str | None}``.
    Raises:
        BundleFormatError: the manifest names a certificate file that is missing or malformed.
    """
    claim = manifest.get("certificate")
    if not claim:
        return None
    from safetensors.numpy import load_file

    path = Path(bundle) / str(claim.get("file", CERT_FILE))
    if not path.is_file():
        raise BundleFormatError(f"{path} is missing but the manifest claims a certificate; re-export the bundle "
                                "with `isan export`")
    try:
        P = load_file(str(path))["P"]
    except Exception as e:  # noqa: BLE001  (a damaged file: say which)
        raise BundleFormatError(f"{path} is not a certificate file ({e}); re-export the bundle with `isan export`") from None
    d = W.shape[1]
    if P.shape != (d, d) or not np.all(np.isfinite(P)):
        raise BundleFormatError(f"{path}: P has shape {P.shape} (finite: {bool(np.all(np.isfinite(P)))}); "
                                f"expected a finite ({d}, {d}) matrix")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):  # 27 small SVDs: 0.24 s on one BLAS thread, 17 s on two busy cores
        c = certificate(W, b, h0, P)
    problem = None
    if not c["rho"] < 1.0:
        problem = f"the recomputed rho is {c['rho']:.9f} >= 1: the weights are not contractive in this basis"
    elif "state_bound" in claim and c["state_bound"] > float(claim["state_bound"]) * (1 + 1e-6):
        problem = (f"the recomputed state bound {c['state_bound']:.6g} exceeds the claimed "
                   f"{float(claim['state_bound']):.6g}")
    return {"claimed": {k: v for k, v in claim.items()}, "rho": c["rho"], "state_bound": c["state_bound"],
            "cond_P": c["cond_P"], "holds": problem is None, "problem": problem}
