"""A stable ISAN: a contractive parametrisation with a certificate (issue 20).

Every transition matrix is ``W_x = P^-1 U_x P`` with ``||U_x||_2 <= rho < 1`` for every input symbol
x, and an invertible basis ``P`` (learned, or the identity). Then, for every input sequence,

    ||P h_t|| <= rho^t ||P h_0|| + max_x ||P b_x|| (1 - rho^t) / (1 - rho)
             <= max(||P h_0||, max_x ||P b_x|| / (1 - rho)),

so ``max_i |h_t,i| <= ||P^-1||_2 max(||P h_0||, max_x ||P b_x|| / (1 - rho))`` (the *state bound*), and a
start-state error ``e`` is carried as ``P^-1 U... P e``: it shrinks at least as ``cond(P) rho^t``.

How the constraint is kept (projected gradient descent): after every optimizer step each ``U_x`` is
projected onto the spectral-norm ball, its singular values clipped at rho (``U V diag(min(1, rho / s_i))
V^T`` from the eigendecomposition of ``U_x^T U_x``: 50-70 ms for 27 matrices of d = 216 on 1-2 cores,
beside a training step of 16k characters of 100-250 ms; on a GPU, in float64: :func:`eigh_dtype_for`).
Rescaling the whole matrix by ``rho / sigma_max`` instead (spectral normalisation) is cheaper but
shrinks every other direction whenever the top one grows: measured at d = 216 after 6M characters
(power iteration, exact norms every 25 steps) it collapsed the matrices to a few directions (median
singular value 0.001) and valid bpc stalled at 2.89 against 2.03 unconstrained.
With ``exact_every`` N > 1 the projection runs every N steps only (the bound then holds at those
steps, and for the evaluated and saved weights, which are always projected). Without a
basis ``U_x`` *is* ``W_x`` and the model's tensors are exactly the plain ISAN's; with a basis the
parameters are ``U`` and ``P`` and ``W`` is materialised as ``P^-1 U P`` for every forward pass (the
fast scan of :mod:`isan.train.scan` runs on it unchanged). ``P`` is kept well-conditioned by an
auxiliary loss on its log singular values (the loop's ``aux_loss`` contract).

:func:`isan.export.checkpoint.certificate` recomputes the certificate in float64 on the exported
float32 weights (numpy only); the export writes it beside the weights (``certificate.safetensors`` and the manifest's
``"certificate"`` key; :mod:`isan.export.checkpoint`).
"""

from __future__ import annotations

import torch
from torch import nn

from isan.errors import IsanError
from isan.train.models import ISAN



def eigh_dtype_for(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype of the projection's eigendecomposition for weights of ``dtype`` on ``device``: float64 on
    a GPU, ``dtype`` elsewhere. On an H100 (torch 2.11, CUDA 13; results/distil/gpu_h100/) ``eigh`` of the
    27 ``U^T U`` of a trained d = 216 model took 130 ms in float32 and 48 ms in float64, against a
    training step of 16 ms: float32's iterative solver converges slowly on a trained spectrum, many
    singular values clipped at rho (at initialisation, 4 ms). On the CPU float32 is the faster (93
    against 244 ms on 2 shared cores)."""
    return torch.float64 if torch.device(device).type == "cuda" else dtype


class StableISAN(ISAN):
    """ISAN with ``W_x = P^-1 U_x P``, ``||U_x||_2 <= rho`` after every optimizer step.

    Args:
        rho: the contraction bound, 0 < rho < 1.
        basis: learn ``P`` (initialised to the identity); False: ``P = I`` and ``W = U``.
        basis_penalty: weight of ``mean_i log(sigma_i(P))^2`` added to the loss (keeps P well-conditioned).
        exact_every: project every this many steps (1: after every step).
    """

    def __init__(self, K: int, V: int, d: int, rho: float = 0.98, basis: bool = False, basis_penalty: float = 1e-2,
                 exact_every: int = 1, init_scale: float = 0.95, seed: int | None = None, state_dropout: float = 0.0):
        if not 0.0 < rho < 1.0:
            raise IsanError(f"--stable-rho must lie in (0, 1), got {rho}")
        super().__init__(K, V, d, init_scale=min(init_scale, rho), seed=seed, state_dropout=state_dropout)
        self.rho, self.basis, self.basis_penalty, self.exact_every = float(rho), bool(basis), float(basis_penalty), \
            int(exact_every)
        if self.basis:
            self.U = self._parameters.pop("W")  # the contracted matrices; W is materialised from U and P
            self.P = nn.Parameter(torch.eye(d))
        self._calls = 0
        self.project_exact_()

    # ---- parameters --------------------------------------------------------------------
    @property
    def W(self) -> torch.Tensor:  # (K, d, d)
        params = self.__dict__["_parameters"]
        if "P" in params:
            P = params["P"]
            return torch.linalg.solve(P, params["U"] @ P)  # P^-1 U_x P, every x at once
        if "W" not in params:
            raise AttributeError("W")  # (while nn.Module registers it)
        return params["W"]

    def contracted(self) -> torch.Tensor:
        """The constrained matrices ``U`` (K, d, d) (``W`` itself without a basis)."""
        return self._parameters["U" if self.basis else "W"]

    def config(self) -> dict:
        return {**super().config(), "stable": {"rho": self.rho, "basis": self.basis,
                                               "basis_penalty": self.basis_penalty, "exact_every": self.exact_every}}

    # ---- the constraint ----------------------------------------------------------------
    @torch.no_grad()
    def spectral_norms(self) -> torch.Tensor:
        """sigma_max of every U_x (K,), exact (float64 eigenvalues of U^T U)."""
        U = self.contracted().double()
        return torch.linalg.eigvalsh(U.transpose(1, 2) @ U)[:, -1].clamp_min(0).sqrt()

    @torch.no_grad()
    def project_exact_(self, eigh_dtype: torch.dtype | None = None) -> None:
        """Project every U_x onto ||U_x||_2 <= rho: clip its singular values at rho (the nearest such matrix).

        ``eigh_dtype``: the eigendecomposition's dtype (default :func:`eigh_dtype_for` the weights' device:
        float64 on a GPU, the weights' own on the CPU)."""
        U = self.contracted()
        G = U.transpose(1, 2) @ U
        G = G.to(eigh_dtype or eigh_dtype_for(U.device, U.dtype))
        e, Q = torch.linalg.eigh(G)  # U^T U = Q diag(s^2) Q^T
        e, Q = e.to(U.dtype), Q.to(U.dtype)
        f = (self.rho / e.clamp_min(1e-30).sqrt()).clamp(max=1.0)  # (K, d)
        if bool((f < 1).any()):
            # U Q diag(f) Q^T = U - U Q diag(1 - f) Q^T (zero on the directions that are not clipped)
            U.sub_(U @ (Q * (1 - f).unsqueeze(1)) @ Q.transpose(1, 2))  # float32: the top lands at rho (1 +- 1e-6)

    @torch.no_grad()
    def constrain_(self) -> None:
        """Called by the loop after every optimizer step: the projection onto ||U_x||_2 <= rho."""
        self._calls += 1
        if self.exact_every <= 1 or self._calls % self.exact_every == 0:
            self.project_exact_()

    def aux_loss(self, progress_fraction: float):
        if not self.basis or not self.basis_penalty:
            return None
        s = torch.linalg.svdvals(self._parameters["P"])
        return self.basis_penalty * torch.log(s).pow(2).mean()

    def checkpoint_tensors(self) -> dict:
        """The state dict plus the materialised ``W`` (what the export reads) and ``P``."""
        t = {k: v.detach() for k, v in self.state_dict().items()}
        if self.basis:
            t["W"] = self.W.detach()
        return t

    def numpy_params(self) -> dict:
        return {n: getattr(self, n).detach().cpu().float().numpy() for n in ("W", "b", "W_ro", "b_ro", "h0")}
