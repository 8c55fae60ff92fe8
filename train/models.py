"""PyTorch models. The ISAN exactly as in the paper (Foerster et al. 2017, eqs. 1-3).

Every model maps a chunk of ids ``x`` (T, B) and a state to per-step logits and a new
state, where the logits at step t predict ``x[t]`` from the state *before* it (docs/ARCHITECTURE.md,
'The model and its conventions': ``bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from isan.params import isan_param_count, largest_isan_d
from isan.train.scan import isan_scan


def add_bias_and_readout(m: nn.Module, K: int, V: int, d: int, g: torch.Generator) -> None:
    """What every ISAN has besides its maps ``W[x]`` (Foerster et al. 2017, eqs. 1-3), as parameters
    of ``m``: ``b`` (K, d) and ``b_ro`` (V,) zeros, the readout ``W_ro`` (V, d) uniform in
    +-1/sqrt(d) drawn from ``g``, and the learned initial state ``h0`` (d,) zeros."""
    m.b = nn.Parameter(torch.zeros(K, d))
    bound = 1 / math.sqrt(d)
    m.W_ro = nn.Parameter(torch.empty(V, d).uniform_(-bound, bound, generator=g))
    m.b_ro = nn.Parameter(torch.zeros(V))
    m.h0 = nn.Parameter(torch.zeros(d))


class ISAN(nn.Module):
    """Input Switched Affine Network: ``h_t = W[x_t] h_{t-1} + b[x_t]``, ``l_t = W_ro h_t + b_ro``.

    Parameters (column-vector convention): W (K, d, d), b (K, d), W_ro (V, d), b_ro (V,), h0 (d,).
    """

    kind = "isan"

    #: parameters AdamW does not decay (``--weight-decay`` acts on the matrices W, U and W_ro only)
    no_decay = ("b", "b_ro", "h0", "P")
    #: how the recurrence runs (:data:`isan.train.scan.SCAN_IMPLS`; auto: by the parameters' device)
    scan_impl = "auto"

    def __init__(self, K: int, V: int, d: int, init_scale: float = 0.95, seed: int | None = None,
                 state_dropout: float = 0.0):
        super().__init__()
        self.K, self.V, self.d = K, V, d
        #: dropout on the states before the readout (training only); the recurrence itself stays exact
        self.state_dropout = float(state_dropout)
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        W = torch.empty(K, d, d)
        # orthogonal init scaled below 1 (docs/guide/tables-and-speed.md, 'Measured facts the code relies on')
        for k in range(K):
            q, r = torch.linalg.qr(torch.randn(d, d, generator=g))
            W[k] = q * torch.sign(torch.diagonal(r)).unsqueeze(0) * init_scale
        self.W = nn.Parameter(W)
        add_bias_and_readout(self, K, V, d, g)

    @classmethod
    def for_budget(cls, K: int, V: int, params: float, **kw) -> "ISAN":
        return cls(K, V, largest_isan_d(K, V, params), **kw)

    @staticmethod
    def param_count(K: int, V: int, d: int) -> int:
        return isan_param_count(K, V, d)

    def config(self) -> dict:
        c = {"kind": self.kind, "K": self.K, "V": self.V, "d": self.d}
        if self.state_dropout:
            c["state_dropout"] = self.state_dropout
        return c

    def initial_state(self, B: int) -> torch.Tensor:
        return self.h0.unsqueeze(0).expand(B, self.d)

    def forward(self, x: torch.Tensor, h: torch.Tensor):
        """x: (T, B) int64; h: (B, d) state before x[0].

        Returns (logits (T, B, V) predicting x[t] from the state before it, H[-1] (B, d)).
        """
        H = isan_scan(self.W, self.b, h, x, impl=self.scan_impl)  # (T, B, d)
        S = torch.cat([h.unsqueeze(0), H[:-1]], 0)  # states before each x[t]
        if self.training and self.state_dropout:
            S = torch.nn.functional.dropout(S, self.state_dropout)  # on the readout's input only
        logits = torch.matmul(S, self.W_ro.T) + self.b_ro
        return logits, H[-1]

    def numpy_params(self) -> dict:
        return {n: getattr(self, n).detach().cpu().float().numpy() for n in ("W", "b", "W_ro", "b_ro", "h0")}


from isan.train.baselines import BASELINES  # noqa: E402
from isan.train.linear import LINEAR  # noqa: E402

#: every trainable architecture by name (`isan train MODEL`)
MODELS = {"isan": ISAN, **BASELINES, **LINEAR}


def build_model(kind: str, K: int, V: int, d: int | None = None, params: float | None = None, seed: int | None = None,
                **init):
    """Construct a model by name, sized by ``d`` or by a parameter budget (largest fitting d).

    ``init``: initialisation options of that model (the IRNN's ``init_scale``); another model given
    one raises TypeError.
    """
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; choose one of {', '.join(sorted(MODELS))}")
    cls = MODELS[kind]
    if d is None:
        if params is None:
            raise ValueError("give the hidden size d or a parameter budget")
        return cls.for_budget(K, V, params, seed=seed, **init)
    return cls(K, V, d, seed=seed, **init)
from isan.train.occam import OCCAM as _OCCAM; MODELS.update(_OCCAM)  # noqa: E402,E702  (issue #15: Occam-gated LSTM)
