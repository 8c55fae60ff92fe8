"""The Occam-gated LSTM (Raiman and Sidor 2015, "Occam's Gates"): an LSTM whose input passes through a
scalar gate that an L1 penalty pushes shut, so the model reads as few inputs as it can.

Cell (column vectors, torch gate order i, f, g, o; ``x_t`` one-hot, so ``p . x_t = p[x_t]``)::

    gate   g_t = sigmoid(p[x_t] + q . h_{t-1})                        first order (gate="first")
           g_t = sigmoid(p[x_t] + q . h_{t-1} + Q[x_t] . h_{t-1})     second order (gate="second": the
                                                                     bilinear term x^T Q h)
    input  a_t = g_t E[x_t] + b_in                                   (the gate multiplies the input)
    LSTM   z = a_t + W_hh h_{t-1};  c_t = s(z_f) c_{t-1} + s(z_i) tanh(z_g);  h_t = s(z_o) tanh(c_t)
    logits l_t = W_ro h_{t-1} + b_ro predicts x_t (the state *before* it: docs/ARCHITECTURE.md)

The gate's bias is folded into ``p`` (one-hot input: ``p[x] + b`` is one number per symbol). ``p``
starts at +3 (every gate 95% open) so the model begins as a plain LSTM; the forget gate's part of
``b_in`` starts at 1 as in :class:`isan.train.baselines.LSTM`.

Penalty: ``lambda(progress) * mean_t,b g_t`` (nats per symbol, added to the cross-entropy), with
``lambda(progress) = lam * s(progress)`` and, as in Raiman and Sidor's section 4.4,

    lambda_sparse(e) = lambda_max                                 flat regimen
                       min{(e / T_max) * lambda_max, lambda_max}    linear regimen
                       min{(e / T_max)^2 * lambda_max, lambda_max}  quadratic regimen

with ``e / T_max`` read as ``progress / t_max``: progress in [0, 1] is the fraction of the training
budget seen, and ``t_max`` the fraction at which lambda reaches lambda_max and is then held. The
paper counts e and T_max in epochs and gives no value of T_max. The first four kinds below were run
with ``t_max = 1`` (lambda reached lambda_max only at the last step: the paper's formula with T_max
at the end of training, kept so that their committed runs reload as they were trained); the
``occam_sched_*`` kinds (issue #26) use ``t_max = 0.5``: the ramp over the first half, lambda_max
held over the second. The loop calls
:meth:`OccamLSTM.aux_loss` (its aux-loss hook); where a loop has no hook, ``penalty_mode="inject"``
adds the penalty's gradient inside the forward pass (the same gradient; the logged loss then
excludes the penalty), with progress read from ``progress_fn``.

Registered in :data:`isan.train.models.MODELS` as ``occam`` (first order, lam 0.05, linear
annealing), ``occam_nopenalty`` (first order, lam 0), ``occam2`` (second order, lam 0.05, linear),
``occam_strong`` (first order, lam 0.2, linear), all with ``t_max = 1``; and ``occam_sched_flat``,
``occam_sched_linear``, ``occam_sched_quadratic`` (first order, lam_max 0.2, ``t_max = 0.5``: the
three regimens of section 4.4 side by side).
The numpy twin is :mod:`isan.engine.baselines.occam`.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from isan.params import largest_d

GATE_FORMS = ("first", "second")
SCHEDULES = ("flat", "linear", "quadratic")
DEFAULT_LAMBDA = 0.05
GATE_INIT = 3.0


def anneal(schedule: str, progress: float, t_max: float = 1.0) -> float:
    """The annealing factor in [0, 1] of ``schedule`` at ``progress``: Raiman and Sidor's section 4.4,
    ``min{(e / T_max)^k, 1}`` with ``e / T_max = progress / t_max`` (k = 0 flat, 1 linear, 2 quadratic);
    from ``progress >= t_max`` on the factor is 1 (lambda_max held)."""
    if not t_max > 0:
        raise ValueError(f"t_max must be > 0; got {t_max!r}")
    p = min(max(float(progress) / float(t_max), 0.0), 1.0)
    if schedule == "flat":
        return 1.0
    if schedule == "linear":
        return p
    if schedule == "quadratic":
        return p * p
    raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")


def occam_param_count(K: int, V: int, d: int, gate: str = "first") -> int:
    """E (K, 4d) + b_in (4d) + W_hh (4d, d) + p (K) + q (d) [+ Q (K, d)] + W_ro, b_ro + h0, c0."""
    n = K * 4 * d + 4 * d + 4 * d * d + K + d + V * d + V + 2 * d
    return n + (K * d if gate == "second" else 0)


class _AddGrad(torch.autograd.Function):
    """Identity forward; backward adds a constant to the gradient (the gradient of ``c * sum(x)``)."""

    @staticmethod
    def forward(ctx, x, c: float):
        ctx.c = c
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad + ctx.c, None


class OccamLSTM(nn.Module):
    """LSTM with an Occam input gate (see the module docstring)."""

    kind = "occam"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, gate: str = "first",
                 lam: float = DEFAULT_LAMBDA, schedule: str = "linear", forget_bias: float = 1.0,
                 t_max: float = 1.0):
        super().__init__()
        if gate not in GATE_FORMS:
            raise ValueError(f"gate must be one of {GATE_FORMS}; got {gate!r}")
        anneal(schedule, 0.0, t_max)  # validates
        self.K, self.V, self.d = int(K), int(V), int(d)
        self.gate, self.lam, self.schedule, self.t_max = gate, float(lam), schedule, float(t_max)
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        bound = 1 / math.sqrt(d)
        u = lambda *s: torch.empty(*s).uniform_(-bound, bound, generator=g)  # noqa: E731
        self.E = nn.Parameter(u(K, 4 * d))
        b_in = torch.zeros(4 * d)
        b_in[d:2 * d] = forget_bias
        self.b_in = nn.Parameter(b_in)
        self.W_hh = nn.Parameter(u(4 * d, d))
        self.p = nn.Parameter(torch.full((K,), GATE_INIT))
        self.q = nn.Parameter(torch.zeros(d))
        if gate == "second":
            self.Q = nn.Parameter(torch.zeros(K, d))
        self.W_ro = nn.Parameter(u(V, d))
        self.b_ro = nn.Parameter(torch.zeros(V))
        self.h0 = nn.Parameter(torch.zeros(d))
        self.c0 = nn.Parameter(torch.zeros(d))
        self._last_gates: torch.Tensor | None = None
        #: "hook": the loop calls aux_loss; "inject": forward adds the penalty's gradient itself
        self.penalty_mode = "hook"
        self.progress_fn: Callable[[], float] | None = None

    # ---- the baselines' interface ----------------------------------------------------------------
    @classmethod
    def param_count(cls, K: int, V: int, d: int, gate: str = "first") -> int:
        return occam_param_count(K, V, d, gate)

    @classmethod
    def for_budget(cls, K: int, V: int, params: float, **kw) -> "OccamLSTM":
        gate = kw.get("gate", getattr(cls, "default_gate", "first"))
        d = largest_d(lambda d: cls.param_count(K, V, d, gate), params, f"{cls.kind} with K={K}, V={V}")
        return cls(K, V, d, **kw)

    def config(self) -> dict:
        return {"kind": self.kind, "K": self.K, "V": self.V, "d": self.d, "gate": self.gate, "lam": self.lam,
                "schedule": self.schedule, "t_max": self.t_max, "state": self.state_names()}

    def state_names(self) -> list[str]:
        return ["h", "c"]

    def initial_state(self, B: int):
        return self.h0.unsqueeze(0).expand(B, self.d), self.c0.unsqueeze(0).expand(B, self.d)

    def lam_at(self, progress: float) -> float:
        return self.lam * anneal(self.schedule, progress, self.t_max)

    def aux_loss(self, progress_fraction: float) -> torch.Tensor | None:
        """``lambda(progress) * mean gate`` of the last forward pass (None without a penalty)."""
        if self.lam == 0 or self._last_gates is None or self.penalty_mode != "hook":
            return None
        lam = self.lam_at(progress_fraction)
        return None if lam == 0 else lam * self._last_gates.mean()

    def gate_logit(self, x_t: torch.Tensor, h: torch.Tensor, hq: torch.Tensor) -> torch.Tensor:
        """x_t (B,) int64, h (B, d), hq = h @ q (B,) -> the gate's pre-activation (B,)."""
        z = self.p[x_t] + hq
        if self.gate == "second":
            z = z + (self.Q[x_t] * h).sum(-1)
        return z

    def forward(self, x: torch.Tensor, state, return_gates: bool = False):
        """x (T, B) int64; state (h, c) of (B, d) before x[0].

        Returns (logits (T, B, V), (h, c) after x[-1]) [, gates (T, B)]; logits[t] predicts x[t]
        from the state before it. The gates are kept for :meth:`aux_loss`.
        """
        h, c = state
        d = self.d
        Ex = self.E[x]  # (T, B, 4d)
        W_cat = torch.cat([self.W_hh, self.q.unsqueeze(0)], 0)  # (4d + 1, d): one matmul a step
        hs, gs = [], []
        for t in range(x.shape[0]):
            hs.append(h)
            zz = h @ W_cat.T  # (B, 4d + 1)
            g = torch.sigmoid(self.gate_logit(x[t], h, zz[:, -1]))
            gs.append(g)
            z = g.unsqueeze(-1) * Ex[t] + self.b_in + zz[:, :4 * d]
            i, f = torch.sigmoid(z[:, :d]), torch.sigmoid(z[:, d:2 * d])
            gg, o = torch.tanh(z[:, 2 * d:3 * d]), torch.sigmoid(z[:, 3 * d:])
            c = f * c + i * gg
            h = o * torch.tanh(c)
        if x.shape[0]:
            S = torch.stack(hs, 0)
            G = torch.stack(gs, 0)
        else:
            S = h.new_zeros(0, h.shape[0], d)
            G = h.new_zeros(0, h.shape[0])
        if self.training and self.penalty_mode == "inject" and self.lam and G.numel():
            lam = self.lam_at(self.progress_fn() if self.progress_fn else 1.0)
            if lam:
                G = _AddGrad.apply(G, lam / G.numel())
                # route the injected gradient through the graph: S depends on G only via later steps,
                # so add a zero that carries G into the loss
                S = S + 0.0 * G.unsqueeze(-1)
        self._last_gates = G
        logits = torch.matmul(S, self.W_ro.T) + self.b_ro
        return (logits, (h, c), G) if return_gates else (logits, (h, c))

    def numpy_params(self) -> dict:
        return {n: t.detach().cpu().float().numpy() for n, t in self.state_dict().items()}


class OccamNoPenalty(OccamLSTM):
    """The same gated LSTM trained without the penalty (lam = 0)."""

    kind = "occam_nopenalty"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, **kw):
        kw.setdefault("lam", 0.0)
        super().__init__(K, V, d, seed=seed, **kw)


class Occam2(OccamLSTM):
    """Second-order gate ``sigmoid(p[x] + q . h + Q[x] . h)`` with the penalty."""

    kind = "occam2"
    default_gate = "second"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, **kw):
        kw.setdefault("gate", "second")
        super().__init__(K, V, d, seed=seed, **kw)


class OccamStrong(OccamLSTM):
    """A stronger penalty, lam = 0.2 annealed linearly: does the gate learn to skip inputs? (With a flat
    0.2 from the first step every gate shut within 300k characters and the model fell to the unigram.)"""

    kind = "occam_strong"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, **kw):
        kw.setdefault("lam", 0.2)
        kw.setdefault("schedule", "linear")
        super().__init__(K, V, d, seed=seed, **kw)


class _OccamSched(OccamLSTM):
    """lam_max 0.2 reached at t_max = 0.5 of the budget and held (section 4.4 of Occam's Gates)."""

    default_schedule = "linear"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, **kw):
        kw.setdefault("lam", 0.2)
        kw.setdefault("schedule", self.default_schedule)
        kw.setdefault("t_max", 0.5)
        super().__init__(K, V, d, seed=seed, **kw)


class OccamSchedFlat(_OccamSched):
    kind = "occam_sched_flat"
    default_schedule = "flat"


class OccamSchedLinear(_OccamSched):
    kind = "occam_sched_linear"
    default_schedule = "linear"


class OccamSchedQuadratic(_OccamSched):
    kind = "occam_sched_quadratic"
    default_schedule = "quadratic"


#: merged into :data:`isan.train.models.MODELS` (``isan train occam ...``)
OCCAM = {"occam": OccamLSTM, "occam_nopenalty": OccamNoPenalty, "occam2": Occam2, "occam_strong": OccamStrong,
         "occam_sched_flat": OccamSchedFlat, "occam_sched_linear": OccamSchedLinear,
         "occam_sched_quadratic": OccamSchedQuadratic}


def occam_from_config(config: dict) -> OccamLSTM:
    """An untrained module with the architecture of ``config`` (as written by :meth:`OccamLSTM.config`)."""
    cls = OCCAM.get(config.get("kind"))
    if cls is None:
        raise ValueError(f"unknown Occam kind {config.get('kind')!r}; choose one of {', '.join(OCCAM)}")
    return cls(int(config["K"]), int(config["V"]), int(config["d"]), gate=config.get("gate", "first"),
               lam=float(config.get("lam", DEFAULT_LAMBDA)), schedule=config.get("schedule", "linear"),
               t_max=float(config.get("t_max", 1.0)))  # runs before issue #26 have no t_max: 1
