"""Recurrent baselines of the paper's comparison (Foerster et al. 2017, Table 1): RNN, IRNN, GRU, LSTM.

Each model has the interface of :class:`isan.train.models.ISAN`: ``kind``, ``__init__(K, V, d,
seed=None, ...)``, ``for_budget``, ``param_count``, ``config()``, ``initial_state(B)`` and
``forward(x, state)`` whose logits at step t predict ``x[t]`` from the state *before* it
(docs/ARCHITECTURE.md, 'The model and its conventions'), so the trainer, ``evaluate_bpc`` and the
exporters treat them alike.

Parameters (all counted by :meth:`param_count`; G = gates: 1 for rnn/irnn, 3 for gru, 4 for lstm):

* input, ``input="onehot"`` (default): ``E`` (K, G d), the input table; ``E[x]`` equals
  ``W_ih @ onehot(x) + b_ih`` of the textbook cell (the input bias is folded into the table,
  so no parameter is redundant). ``input="embedding"``: ``emb`` (K, e), ``W_ih`` (G d, e),
  ``b_ih`` (G d,), and the input term is ``W_ih @ emb[x] + b_ih``.
* recurrence: ``W_hh`` (G d, d); the GRU also has ``b_hn`` (d,), the recurrent bias of its
  candidate inside the reset gate (the only recurrent bias that the input table cannot absorb).
* readout: ``W_ro`` (V, d), ``b_ro`` (V,) (same names and convention as the ISAN).
* learned initial state: ``h0`` (d,), and ``c0`` (d,) for the LSTM.

Cells (torch gate order, column vectors; ``a = input term`` of symbol x):

* rnn:  ``h' = tanh(a + W_hh h)``;   irnn: ``h' = relu(a + W_hh h)`` (W_hh = I at init, Le et al. 2015)
* gru:  ``r, z, n`` blocks: ``r = s(a_r + U_r h)``, ``z = s(a_z + U_z h)``,
  ``n = tanh(a_n + r * (U_n h + b_hn))``, ``h' = (1 - z) * n + z * h``
* lstm: ``i, f, g, o`` blocks of ``a + W_hh h``: ``c' = s(f) c + s(i) tanh(g)``, ``h' = s(o) tanh(c')``

The numpy twin is :mod:`isan.engine.baselines.recurrent`; ONNX export is in :mod:`isan.export.onnx_export`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from isan.params import largest_d

INPUT_MODES = ("onehot", "embedding")
#: gates per kind: rows of W_hh are G blocks of d
GATES = {"rnn": 1, "irnn": 1, "gru": 3, "lstm": 4}


def baseline_param_count(kind: str, K: int, V: int, d: int, input: str = "onehot", emb: int | None = None) -> int:
    """Number of parameters of a baseline, readout and learned initial state included.

    Example: ``baseline_param_count("lstm", 27, 27, 548) == 1_276_319``.
    """
    G = GATES[kind]
    if input == "onehot":
        n_in = K * G * d
    elif input == "embedding":
        if not emb:
            raise ValueError("input='embedding' needs the embedding width emb")
        n_in = K * emb + G * d * emb + G * d
    else:
        raise ValueError(f"input must be one of {INPUT_MODES}; got {input!r}")
    n_rec = G * d * d + (d if kind == "gru" else 0)
    n_init = 2 * d if kind == "lstm" else d
    return n_in + n_rec + V * d + V + n_init


class RecurrentBaseline(nn.Module):
    """Base class of the baselines; subclasses set ``kind``. See the module docstring for the math.

    Args:
        K: input symbols; V: output classes; d: hidden units.
        seed: seed of the initialisation (None: torch's global generator).
        input: ``"onehot"`` (input table E, default) or ``"embedding"`` (emb, W_ih, b_ih).
        emb: embedding width e for ``input="embedding"``.
    """

    kind = "baseline"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, input: str = "onehot",
                 emb: int | None = None, **init):
        super().__init__()
        if input not in INPUT_MODES:
            raise ValueError(f"input must be one of {INPUT_MODES}; got {input!r}")
        if input == "embedding" and not emb:
            raise ValueError("input='embedding' needs the embedding width emb")
        self.K, self.V, self.d = int(K), int(V), int(d)
        self.input = input
        self.emb_width = int(emb) if input == "embedding" else None
        self.G = GATES[self.kind]
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        Gd = self.G * d
        bound = 1 / math.sqrt(d)  # torch's default for recurrent cells: U(-1/sqrt(d), 1/sqrt(d))
        if input == "onehot":
            self.E = nn.Parameter(self._init_input((K, Gd), bound, g))
        else:
            self.emb = nn.Parameter(torch.randn(K, emb, generator=g))
            self.W_ih = nn.Parameter(self._init_input((Gd, emb), 1 / math.sqrt(emb), g))
            self.b_ih = nn.Parameter(torch.zeros(Gd))
        self.W_hh = nn.Parameter(self._init_recurrent(d, bound, g))
        if self.kind == "gru":
            self.b_hn = nn.Parameter(torch.zeros(d))
        self.W_ro = nn.Parameter(torch.empty(V, d).uniform_(-bound, bound, generator=g))
        self.b_ro = nn.Parameter(torch.zeros(V))
        self.h0 = nn.Parameter(torch.zeros(d))
        if self.kind == "lstm":
            self.c0 = nn.Parameter(torch.zeros(d))
        self._post_init(**init)

    # ---- initialisation hooks (subclasses override) ----------------------------------------
    def _init_input(self, shape, bound, g) -> torch.Tensor:
        return torch.empty(*shape).uniform_(-bound, bound, generator=g)

    def _init_recurrent(self, d, bound, g) -> torch.Tensor:
        return torch.empty(self.G * d, d).uniform_(-bound, bound, generator=g)

    def _post_init(self, **init) -> None:
        if init:
            raise TypeError(f"{type(self).__name__} takes no init options {sorted(init)}")

    # ---- the ISAN-like interface -------------------------------------------------------------
    @classmethod
    def param_count(cls, K: int, V: int, d: int, input: str = "onehot", emb: int | None = None) -> int:
        """sum(p.numel()) of a model with these sizes (readout and initial state included)."""
        return baseline_param_count(cls.kind, K, V, d, input, emb)

    @classmethod
    def for_budget(cls, K: int, V: int, params: float, **kw) -> "RecurrentBaseline":
        """The model with the largest d whose :meth:`param_count` is at most ``params``.

        Raises:
            ValueError: not even d = 1 fits.
        """
        d = largest_d(lambda d: cls.param_count(K, V, d, kw.get("input", "onehot"), kw.get("emb")), params,
                      f"{cls.kind} with K={K}, V={V}")
        return cls(K, V, d, **kw)

    def config(self) -> dict:
        """JSON-able description that rebuilds the architecture: ``type(self)(K, V, d, input=, emb=)``."""
        return {"kind": self.kind, "K": self.K, "V": self.V, "d": self.d, "input": self.input,
                "emb": self.emb_width, "gates": self.G, "state": self.state_names()}

    def state_names(self) -> list[str]:
        """Names of the state tensors, in the order of :meth:`initial_state`: ["h"] or ["h", "c"]."""
        return ["h", "c"] if self.kind == "lstm" else ["h"]

    def initial_state(self, B: int):
        """The learned initial state for B streams: (B, d), or for the LSTM a tuple (h, c) of (B, d)."""
        h = self.h0.unsqueeze(0).expand(B, self.d)
        if self.kind == "lstm":
            return h, self.c0.unsqueeze(0).expand(B, self.d)
        return h

    def input_term(self, x: torch.Tensor) -> torch.Tensor:
        """The input contribution ``a`` of each symbol: x int64 (...) -> (..., G d)."""
        if self.input == "onehot":
            return self.E[x]
        return torch.nn.functional.linear(self.emb[x], self.W_ih, self.b_ih)

    def cell(self, a: torch.Tensor, state):
        """One step: a (B, G d) input term, state (B, d) or (h, c) -> new state (same structure)."""
        raise NotImplementedError

    @staticmethod
    def hidden(state) -> torch.Tensor:
        """The part of the state the readout sees: h (B, d)."""
        return state[0] if isinstance(state, tuple) else state

    def forward(self, x: torch.Tensor, state):
        """x: (T, B) int64; state: the state before x[0] ((B, d), or (h, c) for the LSTM).

        Returns (logits (T, B, V) where logits[t] predicts x[t] from the state before it,
        the state after x[-1] (same structure as ``state``)).

        This is the fast path: torch's fused recurrent kernels (``torch.rnn_tanh``,
        ``torch.rnn_relu``, ``torch.gru``, ``torch.lstm``: the ops behind ``nn.RNN``, ``nn.GRU``
        and ``nn.LSTM``) run the whole chunk on this module's own parameters. On CPU that is
        1.5-8x faster than the step loop of :meth:`forward_reference` (``isan bench train``),
        which it matches to rounding (tests/test_onnx.py::test_fused_forward_equals_step_loop).
        """
        if x.shape[0] == 0:
            return self.forward_reference(x, state)
        if self.input == "onehot":  # onehot(x) @ E == E[x]: the table is the input weight, no bias
            inp = torch.nn.functional.one_hot(x, self.K).to(self.E.dtype)
            W_ih, b_ih = self.E.T, None
        else:
            inp, W_ih, b_ih = self.emb[x], self.W_ih, self.b_ih
        Gd = self.G * self.d
        if self.kind == "gru":  # torch's b_hh is [b_hr, b_hz, b_hn]; only b_hn is a parameter here
            b_hh = torch.cat([self.b_hn.new_zeros(2 * self.d), self.b_hn])
            if b_ih is None:
                b_ih = b_hh.new_zeros(Gd)
        elif b_ih is not None:
            b_hh = b_ih.new_zeros(Gd)
        weights = [W_ih, self.W_hh] if b_ih is None else [W_ih, self.W_hh, b_ih, b_hh]
        # (weights, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        args = (weights, b_ih is not None, 1, 0.0, self.training, False, False)
        if self.kind == "lstm":
            h, c = state
            H, hT, cT = torch.lstm(inp, (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()), *args)
            last = (hT[0], cT[0])
        else:
            h = state
            op = {"rnn": torch.rnn_tanh, "irnn": torch.rnn_relu, "gru": torch.gru}[self.kind]
            H, hT = op(inp, h.unsqueeze(0).contiguous(), *args)
            last = hT[0]
        S = torch.cat([h.unsqueeze(0), H[:-1]], 0)  # states before each x[t]
        logits = torch.matmul(S, self.W_ro.T) + self.b_ro
        return logits, last

    def forward_reference(self, x: torch.Tensor, state):
        """The same as :meth:`forward`, one :meth:`cell` per step in Python: the plain path."""
        A = self.input_term(x)  # (T, B, G d), one gather for the whole chunk
        hs = [self.hidden(state)]
        for t in range(x.shape[0]):
            state = self.cell(A[t], state)
            hs.append(self.hidden(state))
        S = torch.stack(hs[:-1], 0)  # states before each x[t]
        logits = torch.matmul(S, self.W_ro.T) + self.b_ro
        return logits, state

    def numpy_params(self) -> dict:
        """Every tensor of the state dict as a float32 numpy array (names as in weights.safetensors)."""
        return {n: t.detach().cpu().float().numpy() for n, t in self.state_dict().items()}


class RNN(RecurrentBaseline):
    """Elman RNN with tanh: ``h' = tanh(a + W_hh h)``."""

    kind = "rnn"

    def cell(self, a, h):
        return torch.tanh(a + h @ self.W_hh.T)


class IRNN(RecurrentBaseline):
    """ReLU RNN with the recurrent matrix initialised to ``init_scale * I`` (Le et al. 2015).

    Input weights start N(0, input_std^2) (the paper's 0.001), biases and h0 at zero.
    """

    kind = "irnn"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, input: str = "onehot",
                 emb: int | None = None, init_scale: float = 1.0, input_std: float = 1e-3):
        self._init_scale, self._input_std = float(init_scale), float(input_std)
        super().__init__(K, V, d, seed=seed, input=input, emb=emb)

    def _init_input(self, shape, bound, g):
        return torch.randn(*shape, generator=g) * self._input_std

    def _init_recurrent(self, d, bound, g):
        return torch.eye(d) * self._init_scale

    def cell(self, a, h):
        return torch.relu(a + h @ self.W_hh.T)


class GRU(RecurrentBaseline):
    """GRU with torch's gate order (r, z, n) and the reset applied after the recurrent product."""

    kind = "gru"

    def cell(self, a, h):
        d = self.d
        gh = h @ self.W_hh.T
        r = torch.sigmoid(a[:, :d] + gh[:, :d])
        z = torch.sigmoid(a[:, d:2 * d] + gh[:, d:2 * d])
        n = torch.tanh(a[:, 2 * d:] + r * (gh[:, 2 * d:] + self.b_hn))
        return (1 - z) * n + z * h


class LSTM(RecurrentBaseline):
    """LSTM with torch's gate order (i, f, g, o); the forget gate's input term starts at ``forget_bias``."""

    kind = "lstm"

    def __init__(self, K: int, V: int, d: int, seed: int | None = None, input: str = "onehot",
                 emb: int | None = None, forget_bias: float = 1.0):
        super().__init__(K, V, d, seed=seed, input=input, emb=emb)
        with torch.no_grad():  # the forget gate's bias lives in E (one-hot) or b_ih (embedding)
            bias = self.E if input == "onehot" else self.b_ih
            bias[..., d:2 * d] += forget_bias

    def cell(self, a, state):
        h, c = state
        d = self.d
        g = a + h @ self.W_hh.T
        i, f = torch.sigmoid(g[:, :d]), torch.sigmoid(g[:, d:2 * d])
        gg, o = torch.tanh(g[:, 2 * d:3 * d]), torch.sigmoid(g[:, 3 * d:])
        c = f * c + i * gg
        return o * torch.tanh(c), c


#: the baselines by kind; merged into :data:`isan.train.models.MODELS`.
BASELINES = {"rnn": RNN, "irnn": IRNN, "gru": GRU, "lstm": LSTM}


def baseline_from_config(config: dict) -> RecurrentBaseline:
    """An (untrained) module with the architecture of ``config`` (as written by :meth:`config`).

    Raises:
        ValueError: unknown kind or missing sizes.
    """
    kind = config.get("kind")
    if kind not in BASELINES:
        raise ValueError(f"unknown baseline kind {kind!r}; choose one of {', '.join(BASELINES)}")
    try:
        K, V, d = int(config["K"]), int(config["V"]), int(config["d"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"baseline config {config!r} lacks integer K, V and d") from None
    return BASELINES[kind](K, V, d, input=config.get("input", "onehot"), emb=config.get("emb"))
