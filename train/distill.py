"""Distillation targets: the next-character distributions of a trained ISAN bundle (or of an ensemble
of them, their mixture) over the train split.

``isan train --teacher BUNDLE --distill A`` (issue 37) trains on ``(1 - A) CE(x) + A CE(q, p)``: the
usual cross-entropy against the next character plus the cross-entropy against the teacher's
distribution ``q`` at the same position (Hinton et al. 2015, temperature 1). The teacher is any
exported ISAN bundle with the student's alphabet, trained on the same train split; the student stays
an ISAN (with its certificate, if it is trained with one): only the loss changes.

The teacher's distributions are computed once, before training, over the whole train split: the
split is cut into ``streams`` contiguous pieces and each piece is read after a warm-up over the
``warmup`` characters before it (from ``h0``), so each position sees at least ``warmup`` characters
of context (the first piece: the text from its start). They are stored as float16 log-probabilities,
(N, V): 9M characters x 27 classes is 486 MB.

``--synthetic-chars N`` adds text written by the teacher (:func:`teacher_samples`): N characters sampled
from the teacher's (or the ensemble's mixture) distribution, stored with those distributions and appended
to the train split. The student sees more inputs than the 9M characters hold; everything it learns still
comes from the train split, through the teacher (sequence-level distillation; Kim and Rush 2016).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from isan.errors import IsanError
from isan.train.scan import isan_scan


def load_teacher(bundle: str | Path):
    """(manifest, torch ISAN in eval mode, alphabet) from an exported ISAN bundle (integrity checked).

    Raises:
        BundleFormatError: the bundle is missing, corrupt or not an ISAN.
    """
    from isan.engine.bundle import load_isan_bundle
    from isan.train.models import ISAN

    manifest, params, alphabet = load_isan_bundle(bundle, verify="full")
    model = ISAN(params.K, params.V, params.d)
    with torch.no_grad():
        for name, value in params.as_dict().items():
            getattr(model, name).copy_(torch.from_numpy(np.array(value, dtype=np.float32)))
    return manifest, model.eval(), alphabet


@torch.no_grad()
def teacher_log_probs(model, ids: np.ndarray, input_map=None, streams: int = 256, warmup: int = 256,
                      bptt: int = 256, device: str = "cpu") -> np.ndarray:
    """The teacher's ``log q(x_i | x_<i)`` for every class at every position of ``ids``.

    An ensemble of teachers (a list of models) gives the mixture of their distributions, ``q = (1/M)
    sum_m q_m`` (``log q = logsumexp_m log q_m - log M``, computed in float32 before storing): an average of
    models is a better predictor than its members, and a better target (Hinton et al. 2015, section 1).

    Args:
        model: a torch model with ``initial_state(B)`` and ``forward(x (T, B), h) -> (logits (T, B, V), h)``,
            or a list of such models with the same V (an ensemble).
        ids: (N,) int output ids (the train split).
        input_map: (V,) output id -> input id, or None (the same ids).
        streams: contiguous pieces read in parallel.
        warmup: characters of context read before each piece (their outputs are dropped).
        bptt: steps a forward call.
        device: where the teachers run ("cpu", "cuda"); each is moved there and back to where it was.

    Returns:
        (N, V) float16 natural-log probabilities; finite (a log-probability below float16's range is
        clipped at -60, e^-60 ~ 1e-26).

    Raises:
        IsanError: the teacher's logits are not finite.
    """
    ids = np.asarray(ids, dtype=np.int64)
    N = len(ids)
    if N == 0:
        raise IsanError("no characters to distil on")
    streams = max(1, min(streams, N))
    L = math.ceil(N / streams)
    starts = np.arange(streams) * L
    begin = np.maximum(starts - warmup, 0)
    span = (starts - begin) + L  # warm-up plus the piece
    T_all = int(span.max())
    pad = np.zeros((T_all, streams), dtype=np.int64)  # (T, B): stream s reads ids[begin[s] : begin[s] + span]
    for s in range(streams):
        piece = ids[begin[s] : min(begin[s] + span[s], N)]
        pad[: len(piece), s] = piece
    x_all = torch.from_numpy(pad)
    if input_map is not None:
        x_all = torch.as_tensor(np.asarray(input_map), dtype=torch.int64)[x_all]
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    if not models or len({m.V for m in models}) != 1:
        raise IsanError("the teachers of an ensemble must share one output alphabet")
    V = models[0].V
    homes = [next(m.parameters()).device for m in models]
    x_all = x_all.to(device)
    out = np.empty((N, V), dtype=np.float16)
    try:
        for m in models:
            m.to(device)
        hs = [m.initial_state(streams) for m in models]
        for t0 in range(0, T_all, bptt):
            parts = []
            for i, m in enumerate(models):
                logits, hs[i] = m(x_all[t0 : t0 + bptt], hs[i])
                parts.append(torch.log_softmax(logits.float(), dim=-1))
            logq = parts[0] if len(parts) == 1 else torch.logsumexp(torch.stack(parts), 0) - math.log(len(parts))
            if not bool(torch.isfinite(logq).all()):
                raise IsanError("the teacher's logits are not finite; is it a trained, exported ISAN?")
            logq = logq.clamp_min(-60.0).cpu().numpy()
            T = logq.shape[0]
            for s in range(streams):
                # rows t0..t0+T of stream s are positions begin[s] + t; keep those at or after starts[s], before N
                lo = max(t0, int(starts[s] - begin[s]))
                hi = min(t0 + T, int(starts[s] - begin[s] + L), N - int(begin[s]))
                if hi > lo:
                    out[begin[s] + lo : begin[s] + hi] = logq[lo - t0 : hi - t0, s]
    finally:
        for m, home in zip(models, homes):
            m.to(home)
    return out


@torch.no_grad()
def teacher_samples(model, n: int, streams: int = 2048, seed: int = 0, input_map=None,
                    device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Text sampled from the teacher (an ensemble: from the mixture of its members), with its distributions.

    ``streams`` independent streams each start from the teachers' ``h0`` and run ``ceil(n / streams)``
    steps; at every step each teacher reads out ``log q_m = log softmax(W_ro h + b_ro)``, the mixture
    ``log q = logsumexp_m log q_m - log M`` is recorded, a character ``x ~ q`` is drawn (Gumbel-max,
    a seeded generator) and every teacher's state steps, ``h <- W[x] h + b[x]`` (one step of the
    training scan, :func:`isan.train.scan.isan_scan`).
    The streams are concatenated, stream after stream; ``logq[i]`` is the distribution ``ids[i]`` was
    drawn from, the convention of :func:`teacher_log_probs` (``log q(x_i | x_<i)``).

    Args:
        model: a torch ISAN (``W`` (K, d, d), ``b``, ``W_ro``, ``b_ro``, ``h0``) or a list of them with
            one V (an ensemble).
        n: characters to write (> 0).
        streams: streams sampled in parallel.
        seed: the sampling generator's seed.
        input_map: (V,) output id -> input id, or None (the same ids).
        device: where the teachers run; each is moved there and back.

    Returns:
        ``(ids (n,) int64 output ids, logq (n, V) float16 natural-log probabilities)``, finite
        (clipped at -60 as :func:`teacher_log_probs`).

    Raises:
        IsanError: ``n`` is not positive, the teachers' outputs differ, or a state or a logit is not finite.
    """
    if n <= 0:
        raise IsanError("--synthetic-chars must be positive")
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    if not models or len({m.V for m in models}) != 1:
        raise IsanError("the teachers of an ensemble must share one output alphabet")
    V = models[0].V
    streams = max(1, min(streams, n))
    T = math.ceil(n / streams)
    imap = None if input_map is None else torch.as_tensor(np.asarray(input_map), dtype=torch.int64, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    homes = [next(m.parameters()).device for m in models]
    ids = torch.empty((T, streams), dtype=torch.int64)
    logq_out = np.empty((T, streams, V), dtype=np.float16)
    try:
        for m in models:
            m.to(device)
        hs = [m.h0.detach().unsqueeze(0).expand(streams, m.d).clone() for m in models]
        for t in range(T):
            parts = [torch.log_softmax(h @ m.W_ro.T + m.b_ro, dim=-1) for m, h in zip(models, hs)]
            logq = parts[0] if len(parts) == 1 else torch.logsumexp(torch.stack(parts), 0) - math.log(len(parts))
            if not bool(torch.isfinite(logq).all()):
                raise IsanError(f"the teacher's logits are not finite at step {t} of its samples")
            gumbel = -torch.log(-torch.log(torch.rand(logq.shape, generator=gen, device=device).clamp_min(1e-20)))
            x = torch.argmax(logq + gumbel, dim=-1)  # x ~ q
            ids[t] = x.cpu()
            logq_out[t] = logq.clamp_min(-60.0).cpu().numpy()
            xin = (x if imap is None else imap[x]).unsqueeze(0)  # (1, streams): one step of the training scan
            hs = [isan_scan(m.W, m.b, h, xin, impl=m.scan_impl)[0] for m, h in zip(models, hs)]
    finally:
        for m, home in zip(models, homes):
            m.to(home)
    out_ids = ids.T.reshape(-1)[:n].numpy().copy()
    out_logq = logq_out.transpose(1, 0, 2).reshape(-1, V)[:n].copy()
    return out_ids, out_logq


def soft_cross_entropy(logits: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Mean over positions of ``-sum_v q_v log p_v``, p = softmax(logits); nats.

    logits: (..., V) float; log_q: (..., V) the teacher's log-probabilities (any float dtype).
    """
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_q.float().exp() * log_p).sum(-1).mean()
