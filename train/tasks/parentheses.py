"""The parentheses counting task of Foerster et al. 2017, section 4: data generator and training loss.

Inputs are five symbols: two kinds of parentheses, ``(`` ``)`` and ``[`` ``]``, and a noise symbol
``a``, drawn uniformly and independently. For each kind the count of open parentheses rises by one at
an opening and falls by one at a closing, saturating at 0 and at ``max_count`` (5: nesting 0-5). The
target is the 2-hot vector of both counts (one-hot over 0..5 for each kind, 12 outputs), **delayed by
one step**: the output read from the state after symbol t is the counts after symbol t - 1, so the
network must hold the current counts and the previous ones (a delay line).

In isan's training convention the outputs at position t are read from the state *before* symbol t
(docs/ARCHITECTURE.md, 'The model and its conventions'), i.e. from the state after symbol t - 1, so
the target at position t is the 2-hot counts after symbol t - 2 (zero counts before the start).
Streams start from the learned ``h0`` with both counts at 0.

Trained with an L2 loss by ``isan train parentheses --d 35`` (the task is chosen by the model name;
:mod:`isan.train.loop` asks :func:`task_for` for it). The data generator needs only numpy, so
the analysis (``isan analyze parentheses``) uses it without torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from isan.alphabet import Alphabet

#: input symbols in id order: kind 0 opens/closes, kind 1 opens/closes, noise
SYMBOLS = "()[]a"


@dataclass(frozen=True)
class ParenthesesTask:
    """Two kinds of parentheses, counts saturating at ``max_count``, targets delayed by ``delay`` steps.

    Attributes:
        kinds: parenthesis kinds (2: ``()`` and ``[]``); the alphabet is ``SYMBOLS``.
        max_count: counts saturate at 0 and here (5: nesting 0-5, six levels a kind).
        delay: steps between a count and its target (1 as in the paper).
        train_chars, valid_chars: symbols per training epoch and in the fixed validation stream.
    """

    kinds: int = 2
    max_count: int = 5
    delay: int = 1
    train_chars: int = 1_000_000
    valid_chars: int = 100_000

    name = "parentheses"
    model_kind = "isan"
    metric = "mse"  # the L2 loss: mean over positions and outputs of (output - target)^2

    @property
    def alphabet(self) -> Alphabet:
        return Alphabet(tuple(SYMBOLS[: 2 * self.kinds] + SYMBOLS[-1]))

    @property
    def levels(self) -> int:
        return self.max_count + 1

    @property
    def n_outputs(self) -> int:
        return self.kinds * self.levels

    def config(self) -> dict:
        return {"task": self.name, **asdict(self)}

    # ---- data (numpy) -------------------------------------------------------------------
    def sample(self, n: int, seed: int) -> np.ndarray:
        """``n`` input ids drawn uniformly from the alphabet (int64)."""
        return np.random.default_rng(seed).integers(0, len(self.alphabet), size=n, dtype=np.int64)

    def counts(self, ids: np.ndarray) -> np.ndarray:
        """Counts after each symbol, per kind: ids (T, ...) -> (T, ..., kinds) int64, from 0 at the start."""
        ids = np.asarray(ids)
        c = np.zeros(ids.shape[1:] + (self.kinds,), dtype=np.int64)
        out = np.empty(ids.shape + (self.kinds,), dtype=np.int64)
        for t in range(len(ids)):
            for k in range(self.kinds):
                c[..., k] = np.clip(c[..., k] + (ids[t] == 2 * k) - (ids[t] == 2 * k + 1), 0, self.max_count)
            out[t] = c
        return out

    def target_counts(self, ids: np.ndarray) -> np.ndarray:
        """The counts each output position must report: position t (read from the state after
        symbol t - 1) reports the counts after symbol t - 1 - delay (0 before the start). (T, ..., kinds)."""
        c = self.counts(ids)
        lag = 1 + self.delay
        out = np.zeros_like(c)
        out[lag:] = c[:-lag] if lag < len(c) else out[lag:]
        return out

    def k_hot(self, counts: np.ndarray) -> np.ndarray:
        """(..., kinds) counts -> (..., kinds * levels) float32: one-hot levels of each kind, side by side."""
        counts = np.asarray(counts)
        out = np.zeros(counts.shape[:-1] + (self.n_outputs,), dtype=np.float32)
        for k in range(self.kinds):
            np.put_along_axis(out, (counts[..., k] + k * self.levels)[..., None], 1.0, axis=-1)
        return out

    def decode(self, outputs: np.ndarray) -> np.ndarray:
        """Outputs (..., kinds * levels) -> the counts they report, (..., kinds): the largest level of each kind."""
        o = np.asarray(outputs)
        return np.stack([o[..., k * self.levels : (k + 1) * self.levels].argmax(-1) for k in range(self.kinds)], -1)

    def corpus(self, seed: int):
        """A :class:`isan.train.data.Corpus` of random symbols: a training stream (redrawn each epoch by
        :meth:`epoch_ids`) and a fixed validation stream."""
        from isan.train.data import Corpus

        return Corpus(self.alphabet, self.sample(self.train_chars, seed), self.sample(self.valid_chars, seed + 10_007),
                      None, name=f"parentheses(kinds={self.kinds}, max_count={self.max_count}, delay={self.delay})")

    def epoch_ids(self, epoch: int, seed: int) -> np.ndarray:
        """The training symbols of one epoch (fresh draws each epoch, reproducible from the seed)."""
        return self.sample(self.train_chars, seed * 100_003 + epoch + 1)

    # ---- training (torch) ---------------------------------------------------------------
    def stream_targets(self, X):
        """Targets (L, B, n_outputs) float32 for streams X (L, B) that start from h0 at row 0 (torch)."""
        import torch

        return torch.as_tensor(self.k_hot(self.target_counts(X.cpu().numpy())), device=X.device)

    def loss(self, outputs, targets):
        """The L2 loss: mean squared error over positions, streams and outputs (torch)."""
        return ((outputs - targets) ** 2).mean()

    def evaluate(self, model, ids: np.ndarray, streams: int = 20, device: str = "cpu") -> tuple[float, dict]:
        """(mean squared error, {"valid_accuracy", "valid_exact"}) on ``ids`` cut into ``streams`` pieces,
        each from h0. accuracy: the fraction of (position, kind) whose largest output is the target count;
        exact: the fraction of positions where both kinds are right."""
        import torch

        model.eval()
        n = len(ids) // streams
        X = ids[: n * streams].reshape(streams, n).T.copy()  # (n, streams)
        Y = self.k_hot(self.target_counts(X))
        with torch.no_grad():
            out, _ = model(torch.as_tensor(X, device=device), model.initial_state(streams))
        model.train()
        out = out.cpu().numpy()
        mse = float(((out - Y) ** 2).mean())
        right = self.decode(out) == self.target_counts(X)
        return mse, {"valid_accuracy": round(float(right.mean()), 6), "valid_exact": round(float(right.all(-1).mean()), 6)}


#: tasks by model name (``isan train NAME``)
TASKS = {"parentheses": ParenthesesTask}


def task_for(model: str):
    """The task trained under this model name, or None for language models."""
    cls = TASKS.get(model)
    return cls() if cls is not None else None
