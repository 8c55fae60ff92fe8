"""The rows scheduler that run_streams and run_jumps share (engine/kernels/csrc/rows.c), the one
longest-match walk of trie_segment and run_jumps (csrc/trie.h), and the bindings' keyword arguments.

On real text (the text8 test split) with the default model, and with the first (unconstrained)
model for divergence. Tolerances: derived (tests/tolerances.py) for the default model on the test
split; the compiled kernel and its numpy twin are two float32 computations, so within twice that.
"""

from __future__ import annotations

import numpy as np
import pytest

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels import native
from isan.engine.kernels.jumps import run_jumps, run_jumps_ref, segment, segment_ref
from isan.engine.kernels.sequential import seq_composed
from isan.engine.kernels.streams import StreamModel, StreamsResult, run_streams, run_streams_ref
from tolerances import default_model_tolerance as tol

needs_native = pytest.mark.skipif(native() is None, reason="the compiled kernels are not built")


@pytest.fixture(scope="module")
def table(default_engine):
    return default_engine.jump_table()


@pytest.fixture(scope="module")
def test_ids(default_engine, text8_test):
    return default_engine.encode(text8_test[:100_000]).astype(np.int32)


def _rows(stream, ids, lengths, h0, error_scale=0.0, seed=0):
    """Rows of the given lengths laid end to end in ids; with error_scale, error rows after them
    (random, no homogeneous coordinate)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    assert start[-1] + lengths[-1] <= len(ids)
    H = stream.rows(np.tile(h0, (len(lengths), 1)))
    if error_scale:
        E = np.zeros_like(H)
        E[:, : stream.d] = np.random.default_rng(seed).normal(0, error_scale, (len(H), stream.d))
        H = np.concatenate([H, E])
    return start, lengths, H


class Recorder:
    """Stands in for the compiled module: records each binding's call (name, args, kwargs) and runs it."""

    def __init__(self, nat):
        self.nat, self.calls = nat, []

    def __getattr__(self, name):
        fn = getattr(self.nat, name)

        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return fn(*args, **kwargs)

        return call


def _recorded_calls(default_engine, table, ids):
    """The bindings' calls as the Python wrappers make them (every one by keyword)."""
    rec = Recorder(native())
    stream = table.stream
    start, length, H = _rows(stream, ids, [300, 200], default_engine.params32.h0)
    run_streams.native(rec, stream, ids, start, length, H.copy(), np.zeros(len(ids)))
    run_jumps.native(rec, table, ids, start, length, H.copy(), np.zeros(len(ids)))
    segment.native(rec, table, ids[:500])
    cp, t = default_engine.composed, default_engine.table
    _, _, entries = cp.segment(ids[:500].astype(np.int64))
    seq_composed.native(rec, np.asarray(t.Ac), np.asarray(t.R), t.offsets, t.lengths, entries, ids[:500],
                        default_engine.params32.h0)
    return rec.calls


@needs_native
def test_bindings_take_keywords_only(default_engine, table, test_ids):
    """Every call site passes keywords; a positional, missing or misspelt argument is a TypeError
    that says which."""
    nat = native()
    calls = _recorded_calls(default_engine, table, test_ids[:500])
    M = np.ones(50, dtype=np.int64)
    calls.append(("greedy_segment", (), dict(M=M, starts=np.empty(50, dtype=np.int64))))
    assert [c[0] for c in calls] == ["run_streams", "run_jumps", "trie_segment", "seq_composed", "greedy_segment"]
    for name, args, kwargs in calls:
        assert args == (), name
        fn = getattr(nat, name)
        fn(**kwargs)  # as recorded: runs
        with pytest.raises(TypeError, match="keyword arguments only"):
            fn(*kwargs.values())
        for key in list(kwargs)[:: max(1, len(kwargs) // 6)]:
            missing = {k: v for k, v in kwargs.items() if k != key}
            with pytest.raises(TypeError, match=f"'{key}'"):
                fn(**missing)
            with pytest.raises(TypeError, match=f"unexpected keyword argument '{key}_x'"):  # misspelt
                fn(**missing, **{key + "_x": kwargs[key]})
            with pytest.raises(TypeError, match=f"unexpected keyword argument '{key}_x'"):  # one too many
                fn(**kwargs, **{key + "_x": kwargs[key]})


@needs_native
@pytest.mark.parametrize("kernel", ["streams", "streams_cols", "jumps"])
@pytest.mark.parametrize("threads", [1, 2])
def test_pairs_and_stops_equal_twin(kernel, threads, default_engine, table, test_ids):
    """With pairs: some pairs converge (stop_ratio, every check_every steps), some rows finish
    first, one has no characters; the compiled scheduler stops each where the twin does and gives
    its bits and states."""
    lengths = [0, 1, 37, 250, 900, 2500, 4000, 6000] * 2
    start, length, H = _rows(table.stream, test_ids, lengths, default_engine.params32.h0, error_scale=1.0)
    P = len(lengths)
    fast, twin = (run_jumps, run_jumps_ref) if kernel == "jumps" else (run_streams, run_streams_ref)
    model = table if kernel == "jumps" else table.stream
    split = "cols" if kernel == "streams_cols" else "rows"
    out = []
    for fn in (fast, twin):
        Hx, bits = H.copy(), np.zeros(len(test_ids))
        r = fn(model, test_ids, start, length, Hx, bits, pairs=True, stop_ratio=1e-4, check_every=4,
               threads=threads, split=split, frac=0.5)
        out.append((r, Hx, bits))
    (r1, H1, b1), (r2, H2, b2) = out
    assert r1.total_steps == r2.total_steps and r1.jumps == r2.jumps
    np.testing.assert_array_equal(r1.steps_done, r2.steps_done)
    np.testing.assert_array_equal(r1.diverged, r2.diverged)
    np.testing.assert_array_equal(np.isfinite(r1.residual), np.isfinite(r2.residual))
    converged = r1.steps_done < length
    assert converged.any() and (~converged & (length > 0)).any()  # both stops happen
    assert (r1.diverged == -1).all()
    np.testing.assert_allclose(H1[:P], H2[:P], rtol=0, atol=tol().twice().state)
    written = np.concatenate([np.arange(s, s + n) for s, n in zip(start, r1.steps_done)])
    np.testing.assert_allclose(b1[written], b2[written], rtol=0, atol=tol().twice().bits)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_divergence_is_reported_the_same_way_by_both_kernels(threads, unconstrained_engine):
    """A state out of range (or bits not finite) is recorded once, where it is first seen: at the
    character before which the state left the range (run_jumps sees states at jump boundaries and
    bits inside a jump), in the same fields of the same result, as each twin records it; the row
    stops and its other rows go on."""
    eng = unconstrained_engine
    table = eng.jump_table()
    texts = ["the cat sat on the mat and the dog sat on the log " * 3, "the cat sat " + "z" * 60 + " on the mat",
             "a start out of range", "a start that is not a number"]
    ids = np.concatenate([eng.encode(t) for t in texts]).astype(np.int32)
    start, length, H = _rows(table.stream, ids, [len(t) for t in texts], eng.params32.h0)
    H[2, 0] = 2 * MAX_STATE_ABS
    H[3, 1] = np.nan
    results = {}
    for name, fn, model in (("streams", run_streams, table.stream), ("jumps", run_jumps, table),
                            ("streams_twin", run_streams_ref, table.stream), ("jumps_twin", run_jumps_ref, table)):
        bits = np.zeros(len(ids))
        r = fn(model, ids, start, length, H.copy(), bits, threads=threads)
        assert isinstance(r, StreamsResult)
        assert r.diverged.dtype == np.int64 and r.diverged.shape == (len(texts),)
        results[name] = r
    for kernel in ("streams", "jumps"):
        r, twin = results[kernel], results[kernel + "_twin"]
        np.testing.assert_array_equal(r.diverged, twin.diverged)
        np.testing.assert_array_equal(r.steps_done, twin.steps_done)
        assert r.diverged[0] == -1 and r.steps_done[0] == length[0]
        assert 12 <= r.diverged[1] <= 12 + 60  # inside the run of z
        assert r.diverged[2] == r.diverged[3] == 0  # at the first character
        assert (r.steps_done[1:] < length[1:]).all()  # stopped early
    # per character, run_streams sees the state leave the range no later than run_jumps
    assert results["streams"].diverged[1] <= results["jumps"].diverged[1]


@needs_native
def test_trie_segment_is_the_jumps_walk(default_engine, table, test_ids):
    """trie_segment (a whole text) and run_jumps (the key each row takes next) walk the trie the
    same way: a row's jumps are the text's segmentation, and the composed path's segmentation
    (its own trie of the same keys) cuts the text at the same places."""
    cp = default_engine.composed
    for n in (1, 2, 3, 7, 50, 1000, 20_000):
        x = test_ids[100 : 100 + n]
        ents = segment(table, x)
        np.testing.assert_array_equal(ents, segment_ref(table, x))
        assert table.klen[ents].sum() == n
        H = table.stream.rows(default_engine.params32.h0[None])
        r = run_jumps(table, x, np.array([0], np.int64), np.array([n], np.int64), H, None)
        assert r.jumps == len(ents) and r.total_steps == n
        starts, lengths, _ = cp.segment(x.astype(np.int64))
        np.testing.assert_array_equal(lengths, table.klen[ents])
        s2, l2, _ = cp.segment_ref(x.astype(np.int64))
        np.testing.assert_array_equal(starts, s2)
        np.testing.assert_array_equal(lengths, l2)


@needs_native
def test_trie_segment_refuses_a_symbol_outside_the_trie(table, test_ids):
    x = test_ids[:100].copy()
    x[40] = table.K
    with pytest.raises(ValueError, match="trie_segment"):
        segment(table, x)


@needs_native
@pytest.mark.parametrize("split", ["rows", "cols"])
def test_streams_equal_twin_on_real_text(isa, split, default_engine, test_ids):
    """Without pairs, on each instruction-set variant: the schedule's stops and readout."""
    model = StreamModel.from_params(default_engine.params32)
    start, length, H = _rows(model, test_ids, [0, 5, 700, 3000, 9000], default_engine.params32.h0)
    out = []
    for fn in (run_streams, run_streams_ref):
        Hx, bits = H.copy(), np.zeros(len(test_ids))
        r = fn(model, test_ids, start, length, Hx, bits, threads=2, split=split)
        out.append((r, Hx, bits))
    (r1, H1, b1), (r2, H2, b2) = out
    assert r1.total_steps == r2.total_steps == length.sum()
    np.testing.assert_array_equal(r1.steps_done, length)
    np.testing.assert_array_equal(r1.diverged, r2.diverged)
    np.testing.assert_allclose(H1, H2, rtol=0, atol=tol().twice().state)
    n = int(length.sum())
    np.testing.assert_allclose(b1[:n], b2[:n], rtol=0, atol=tol().twice().bits)
