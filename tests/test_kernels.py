"""The compiled kernels against their numpy twins, and chunk-parallel scoring against the float64
reference, on real text (docs/ARCHITECTURE.md, 'The rooms': every fast op has a twin with the same
signature).

Tolerances (float32 states, float64 log-softmax in the twins, float32 exponentials in C) are derived
from the computation (tests/tolerances.py): the float32 rounding of every inner product on the way,
carried through the model on the text scored; a kernel against its twin (both float32) gets twice the
tolerance of one against the float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from isan.engine.guard import MAX_STATE_ABS
from isan.engine.kernels import native, native_status
from isan.engine.kernels.chunked import plan_chunks, score_texts_chunked
from isan.engine.kernels.plan import Kernel, Plan
from isan.engine.kernels.sequential import seq_composed, seq_composed_ref
from isan.engine.kernels.streams import StreamModel, run_streams, run_streams_ref
from isan.engine.reference import score_ref

from conftest import random_params
from tolerances import default_model_tolerance as tol, isan_float32_tolerance


@pytest.fixture(scope="module")
def model(default_engine):
    return StreamModel.from_params(default_engine.params32)


@pytest.fixture(scope="module")
def test_ids(default_engine, text8_test):
    return default_engine.encode(text8_test).astype(np.int32)


@pytest.fixture(scope="module")
def ref_bits(default_engine, test_ids):
    """float64 reference bits and final state of the first 60,000 test characters."""
    p = default_engine.params
    return score_ref(p, test_ids[:60_000].astype(np.int64), p.h0)


def test_native_kernels_are_built():
    """The package install compiles the kernels here (a C compiler is on the machine)."""
    s = native_status()
    assert s["available"], s
    assert s["isa"] in ("generic", "avx2", "avx512")


def _streams(model, ids, P, L, h0, pairs=False):
    start = np.arange(P, dtype=np.int64) * L
    length = np.full(P, L, dtype=np.int64)
    H = model.rows(np.tile(h0, (P, 1)))
    if pairs:
        E = model.rows(np.tile(h0 * 0.5 + 0.1, (P, 1)), bias=0.0)
        H = np.concatenate([H, E])
    return start, length, H


@pytest.mark.parametrize("split,threads", [("cols", 1), ("cols", 2), ("rows", 2)])
def test_run_streams_equals_twin(isa, model, default_engine, test_ids, split, threads):
    P, L = 48, 300
    start, length, H0 = _streams(model, test_ids, P, L, default_engine.params.h0)
    length[::5] = np.arange(0, L, L // 10)[: len(length[::5])]  # ragged rows, one empty
    b1, b2 = np.full(P * L, np.nan), np.full(P * L, np.nan)
    H1, H2 = H0.copy(), H0.copy()
    r1 = run_streams(model, test_ids, start, length, H1, b1, threads=threads, split=split)
    r2 = run_streams_ref(model, test_ids, start, length, H2, b2)
    assert r1.total_steps == r2.total_steps == int(length.sum())
    np.testing.assert_array_equal(r1.steps_done, length)
    np.testing.assert_array_equal(r1.diverged, r2.diverged)
    assert (r1.diverged == -1).all()
    written = np.concatenate([np.arange(s, s + n) for s, n in zip(start, length)])
    assert np.isnan(np.delete(b1, written)).all()  # nothing outside the rows is written
    np.testing.assert_allclose(b1[written], b2[written], atol=tol().twice().bits, rtol=0)
    np.testing.assert_allclose(H1, H2, atol=tol().twice().state, rtol=0)


def test_run_streams_equals_float64_reference(model, default_engine, test_ids, ref_bits):
    P, L = 30, 2000
    start, length, H = _streams(model, test_ids, P, L, default_engine.params.h0)
    start[0] = 0  # row 0 scores the reference's text from h0
    bits = np.zeros(len(test_ids))
    run_streams(model, test_ids, start, length, H, bits, threads=2)
    np.testing.assert_allclose(bits[:L], ref_bits[0][:L], atol=tol().bits, rtol=0)


def test_run_streams_ingest_only_gives_the_same_states(model, default_engine, test_ids):
    start, length, H0 = _streams(model, test_ids, 20, 200, default_engine.params.h0)
    H1, H2 = H0.copy(), H0.copy()
    run_streams(model, test_ids, start, length, H1, np.zeros(len(test_ids)))
    run_streams(model, test_ids, start, length, H2, None)
    np.testing.assert_array_equal(H1, H2)


@pytest.mark.parametrize("split", ["cols", "rows"])
def test_run_streams_pairs_equal_twin(isa, model, default_engine, test_ids, split):
    P, L = 40, 400
    start, length, H0 = _streams(model, test_ids, P, L, default_engine.params.h0, pairs=True)
    b1, b2 = np.full(P * L, np.nan), np.full(P * L, np.nan)
    H1, H2 = H0.copy(), H0.copy()
    kw = dict(pairs=True, stop_ratio=1e-5, check_every=16)
    r1 = run_streams(model, test_ids, start, length, H1, b1, threads=2, split=split, **kw)
    r2 = run_streams_ref(model, test_ids, start, length, H2, b2, **kw)
    np.testing.assert_array_equal(r1.steps_done, r2.steps_done)
    assert (r1.steps_done % 16 == 0).all() and (r1.steps_done < L).all()  # stops at checks, early
    assert (r1.residual <= 1e-5).all()
    written = ~np.isnan(b2)
    np.testing.assert_array_equal(written, ~np.isnan(b1))
    np.testing.assert_allclose(b1[written], b2[written], atol=tol().twice().bits, rtol=0)
    # an error row is the difference of two true rows: check it carries W without bias
    e = H1[P:, : model.d]
    assert np.abs(e).max() <= 1e-5 * np.abs(H1[:P, : model.d]).max(axis=1).max() * 2


@pytest.mark.parametrize("pairs", [False, True])
def test_run_streams_schedule_does_not_change_results(isa, model, default_engine, test_ids, pairs):
    """The queued schedule (a round takes the symbol queues at least `frac` of the longest) gives
    the bits, states, stops and residuals of the in-step schedule (frac = 0) bit for bit: a row's
    arithmetic does not depend on the rows it is grouped with. Ragged rows (one empty), with and
    without correction pairs, one and two threads."""
    P, L = 64, 500
    start, length, H0 = _streams(model, test_ids, P, L, default_engine.params.h0, pairs=pairs)
    length[::7] = np.arange(0, L, L // 10)[: len(length[::7])]
    kw = dict(pairs=True, stop_ratio=1e-5, check_every=16) if pairs else {}
    out = {}
    for frac, threads in [(0.0, 1), (0.5, 1), (1.0, 1), (1.0, 2)]:
        b, H = np.full(len(test_ids), np.nan), H0.copy()
        r = run_streams(model, test_ids, start, length, H, b, threads=threads, split="rows", frac=frac, **kw)
        out[frac, threads] = (b, H, r)
    b0, H0_, r0 = out[0.0, 1]
    assert r0.total_steps > 0
    for key, (b, H, r) in out.items():
        np.testing.assert_array_equal(b, b0, err_msg=str(key))
        np.testing.assert_array_equal(H, H0_, err_msg=str(key))
        np.testing.assert_array_equal(r.steps_done, r0.steps_done)
        np.testing.assert_array_equal(r.residual, r0.residual)
        np.testing.assert_array_equal(r.diverged, r0.diverged)
        assert r.total_steps == r0.total_steps
    for runner in (run_streams, run_streams_ref):  # the twin checks it as the compiled kernel does
        with pytest.raises(ValueError, match="frac"):
            runner(model, test_ids, start, length, H0.copy(), None, frac=1.5, **kw)


def test_run_streams_reports_divergence(isa, unconstrained_engine):
    model = StreamModel.from_params(unconstrained_engine.params32)  # a model whose states can diverge
    a = unconstrained_engine.alphabet
    text = "the cat sat " + "z" * 60 + " on the mat"
    ids = a.encode(text).astype(np.int32)
    n = len(ids)
    start, length = np.array([0], dtype=np.int64), np.array([n], dtype=np.int64)
    for runner in (run_streams, run_streams_ref):
        H = model.rows(unconstrained_engine.params.h0[None])
        r = runner(model, ids, start, length, H, np.zeros(n))
        t = int(r.diverged[0])
        assert 12 < t < 12 + 60, t  # inside the run of z
        assert r.steps_done[0] <= t + 1


def test_seq_composed_equals_twin_and_reference(isa, default_engine, test_ids, ref_bits):
    cp, t = default_engine.composed, default_engine.table
    ids = test_ids[:60_000]
    starts, lengths, entries = cp.segment(ids.astype(np.int64))
    h = default_engine.params32.h0
    b1, h1, bad1 = seq_composed(np.asarray(t.Ac), np.asarray(t.R), t.offsets, t.lengths, entries, ids, h)
    n2 = int(t.lengths[entries[:3000]].sum())
    b2, h2, bad2 = seq_composed_ref(np.asarray(t.Ac), np.asarray(t.R), t.offsets, t.lengths, entries[:3000], ids[:n2], h)
    assert bad1 == bad2 == -1
    np.testing.assert_allclose(b1[:n2], b2, atol=tol().twice().bits, rtol=0)
    np.testing.assert_allclose(b1, ref_bits[0], atol=tol().bits, rtol=0)
    assert abs(b1.sum() - ref_bits[0].sum()) <= tol().total(len(b1))
    np.testing.assert_allclose(h1, ref_bits[1], rtol=0, atol=tol().state)
    _, h3, _ = seq_composed(np.asarray(t.Ac), np.asarray(t.R), t.offsets, t.lengths, entries, ids, h, want_bits=False)
    np.testing.assert_array_equal(h1, h3)


def test_seq_composed_float16_twin(isa, default_engine, test_ids):
    cp, t = default_engine.composed, default_engine.table
    ids = test_ids[:5000]
    _, _, entries = cp.segment(ids.astype(np.int64))
    used = np.unique(entries)
    Ac = np.zeros(t.Ac.shape, dtype=np.float16)
    Ac[used] = np.asarray(t.Ac[used], dtype=np.float16)
    R = np.asarray(t.R, dtype=np.float16)
    h = default_engine.params32.h0
    b1, h1, _ = seq_composed(Ac, R, t.offsets, t.lengths, entries, ids, h)
    b2, h2, _ = seq_composed_ref(Ac, R, t.offsets, t.lengths, entries, ids, h)
    np.testing.assert_allclose(b1, b2, atol=tol().twice().bits, rtol=0)  # float16 storage, float32 arithmetic
    np.testing.assert_allclose(h1, h2, atol=tol().twice().state, rtol=0)


def test_seq_composed_stops_at_divergence(unconstrained_engine):
    cp, t = unconstrained_engine.composed, unconstrained_engine.table
    ids = unconstrained_engine.encode("the cat " + "z" * 80).astype(np.int32)
    _, _, entries = cp.segment(ids.astype(np.int64))
    for fn in (seq_composed, seq_composed_ref):
        bits, h, bad = fn(np.asarray(t.Ac), np.asarray(t.R), t.offsets, t.lengths, entries, ids,
                          unconstrained_engine.params32.h0)
        assert 0 <= bad < len(entries)
        assert not np.abs(h).max() <= MAX_STATE_ABS


def test_kernels_reject_bad_arguments(model, default_engine, test_ids):
    start, length, H = _streams(model, test_ids, 4, 100, default_engine.params.h0)
    with pytest.raises(ValueError):
        run_streams(model, test_ids, start + len(test_ids), length, H, np.zeros(len(test_ids)))
    with pytest.raises(TypeError):
        run_streams(model, test_ids.astype(np.int64), start, length, H, None)
    bad_ids = test_ids[:400].copy()
    bad_ids[7] = 99
    with pytest.raises(ValueError):
        run_streams(model, bad_ids, start, length, H, None)


# ---- chunk-parallel scoring -----------------------------------------------------------------

@pytest.mark.parametrize("P", [1, 2, 7, 64, 256, 1024])
def test_chunked_equals_float64_reference(model, default_engine, test_ids, ref_bits, P):
    ids = test_ids[:60_000]
    bits, finals, rep, div = score_texts_chunked(Plan(Kernel.CHUNKED, model, (P,), run_streams), [ids], default_engine.params.h0[None], threads=2)
    assert div == []
    ref, href = ref_bits
    np.testing.assert_allclose(bits[0], ref, atol=tol().bits, rtol=0)
    assert abs(bits[0].sum() - ref.sum()) <= tol().total(len(ids))
    np.testing.assert_allclose(finals[0], href, rtol=0, atol=tol().state)
    assert rep.chunks == P and rep.residual <= rep.rtol / rep.margin
    if len(ids) / P >= 400:  # chunks long enough for the start error to die out inside them
        assert rep.fallback_chunks == 0
        if P > 1:
            assert 0 < rep.extra_fraction < 2 * 160 * P / len(ids)  # corrections stop early
    elif len(ids) / P < 100:  # 58-character chunks: errors outlive them, chunks fall back, bits stay exact
        assert rep.fallback_chunks > 0


def test_chunked_whole_test_split(model, default_engine, test_ids, text8_test_ref):
    """The whole text8-10M test split, 1024 chunks, against the float64 reference."""
    p = default_engine.params
    ref, href = text8_test_ref
    bits, finals, rep, div = score_texts_chunked(Plan(Kernel.CHUNKED, model, (1024,), run_streams), [test_ids], p.h0[None], threads=2)
    assert div == []
    t = tol().for_chars(len(test_ids))
    np.testing.assert_allclose(bits[0], ref, atol=t.bits, rtol=0)
    assert abs(bits[0].sum() - ref.sum()) <= t.total_bits
    np.testing.assert_allclose(finals[0], href, rtol=0, atol=t.state)


def test_chunked_numpy_twin(model, default_engine, test_ids, ref_bits):
    ids = test_ids[:6_000]
    bits, finals, rep, div = score_texts_chunked(Plan(Kernel.CHUNKED, model, (5,), run_streams_ref), [ids],
                                                 default_engine.params.h0[None])
    np.testing.assert_allclose(bits[0], ref_bits[0][:6000], atol=tol().bits, rtol=0)


def test_chunked_text_that_does_not_forget(unconstrained_engine, text8_test):
    model = StreamModel.from_params(unconstrained_engine.params32)  # a model whose states can diverge
    """Long runs of 'h' keep the state bounded but never forget its start: corrections do not die
    out there, those chunks fall back to sequential float64 scoring, and the result is no worse
    than one sequential float32 pass.

    On such text float32 rounding errors do not die out either: one sequential float32 pass
    (chunks=[1]) differs from the float64 reference by about 4e-4 bits per character after 6,000
    'h'. So the bound here is that of the sequential float32 pass plus the float32 tolerance derived for
    this model and text (tests/tolerances.py)."""
    a = unconstrained_engine.alphabet
    text = text8_test[:3000] + "h" * 6000 + text8_test[3000:6000] + "h" * 3000 + text8_test[6000:8000]
    ids = a.encode(text).astype(np.int32)
    p = unconstrained_engine.params
    ref, href = score_ref(p, ids.astype(np.int64), p.h0)
    seq, _, _, _ = score_texts_chunked(Plan(Kernel.CHUNKED, model, (1,), run_streams), [ids], p.h0[None])
    seq_err = np.abs(seq[0] - ref).max()
    assert 1e-4 < seq_err < 2e-3  # the float32 drift this test is about
    bits, finals, rep, div = score_texts_chunked(Plan(Kernel.CHUNKED, model, (16,), run_streams), [ids], p.h0[None], threads=2)
    assert div == []
    assert rep.fallback_chunks > 0
    t = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, ids)
    assert np.abs(bits[0] - ref).max() <= seq_err + t.bits
    assert abs(bits[0].sum() - ref.sum()) <= abs(seq[0].sum() - ref.sum()) + t.total_bits
    np.testing.assert_allclose(finals[0], href, rtol=0, atol=t.state)


def test_chunked_divergence_names_the_offset(unconstrained_engine, text8_test):
    model = StreamModel.from_params(unconstrained_engine.params32)  # a model whose states can diverge
    a = unconstrained_engine.alphabet
    text = text8_test[:5000] + "z" * 200 + text8_test[5000:9000]
    ids = a.encode(text).astype(np.int32)
    bits, finals, rep, div = score_texts_chunked(Plan(Kernel.CHUNKED, model, (8,), run_streams), [ids], unconstrained_engine.params.h0[None],
                                                 threads=2)
    assert len(div) == 1
    i, chunk_offset, h_start, t = div[0]
    assert i == 0 and 5000 <= chunk_offset + t <= 5000 + 40


def test_chunked_batch_of_texts_equals_each_alone(model, default_engine, test_ids):
    p = default_engine.params
    texts = [test_ids[i * 7000 : i * 7000 + n] for i, n in enumerate([5, 900, 6000, 1, 3000])]
    h = np.stack([p.h0] * len(texts))
    bits, finals, rep, div = score_texts_chunked(Plan(Kernel.CHUNKED, model, (1, 1, 4, 1, 2), run_streams), texts, h, threads=2)
    for t, b, f in zip(texts, bits, finals):
        ref, href = score_ref(p, t.astype(np.int64), p.h0)
        np.testing.assert_allclose(b, ref, atol=tol().bits, rtol=0)
        np.testing.assert_allclose(f, href, rtol=0, atol=tol().state)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_chunked_any_cut_random_model(data):
    """Hypothesis-made texts and chunk counts on a small random model: chunked equals the reference."""
    p = random_params(d=16, seed=3, scale=0.8)
    m = StreamModel.from_params(p)
    n = data.draw(st.integers(1, 3000))
    ids = np.asarray(data.draw(st.lists(st.integers(0, 26), min_size=n, max_size=n)), dtype=np.int32)
    P = data.draw(st.integers(1, max(1, min(64, n))))
    p64 = p.astype(np.float64)
    ref, href = score_ref(p64, ids.astype(np.int64), p64.h0)
    bits, finals, rep, div = score_texts_chunked(Plan(Kernel.CHUNKED, m, (P,), run_streams), [ids], p64.h0[None], threads=2)
    assert div == []
    t = isan_float32_tolerance(p64.W, p64.b, p64.W_ro, p64.b_ro, p64.h0, ids, samples=4)
    np.testing.assert_allclose(bits[0], ref, atol=t.bits, rtol=0)
    np.testing.assert_allclose(finals[0], href, rtol=0, atol=t.state)


def test_plan_chunks():
    assert plan_chunks([10]) == [1]
    assert plan_chunks([2_500_000], target_rows=1024) == [1024]
    assert plan_chunks([2_500_000], target_rows=512) == [512]
    assert plan_chunks([2000] * 256, target_rows=512) == [1] * 256
    assert sum(plan_chunks([100_000, 10], target_rows=1024)) <= 1024
    assert plan_chunks([5000, 5000], target_rows=1024) == [4, 4]  # no chunk under MIN_CHUNK characters


def test_engine_long_text_goes_chunked_and_equals_reference(default_engine, text8_test, text8_test_ref):
    """Engine.score on the whole test split: chunk-parallel (automatic above CHUNKED_MIN_CHARS),
    exact against the float64 reference, with the report of how it went; score_batch and advance too."""
    ref, href = text8_test_ref
    r = default_engine.score(text8_test, per_char=True)
    assert r.scoring["path"] == "chunked" and r.scoring["chunks"] > 1 and r.scoring["fallback_chunks"] == 0
    assert 0 < r.scoring["residual"] <= r.scoring["rtol"] / r.scoring["margin"]
    t = tol().for_chars(len(ref))
    np.testing.assert_allclose(r.per_char_bits, ref, atol=t.bits, rtol=0)
    assert abs(r.bits - ref.sum()) <= t.total_bits
    np.testing.assert_allclose(r.state.h, href, rtol=0, atol=t.state)
    one = default_engine.score(text8_test, threads=1)
    assert abs(one.bits - ref.sum()) <= t.total_bits
    np.testing.assert_allclose(default_engine.advance(text8_test).h, href, rtol=0, atol=t.state)
    texts = [text8_test[:30_000], text8_test[30_000:30_100], text8_test[:25_000]]
    batch = default_engine.score_batch(texts, per_char=True)
    np.testing.assert_allclose(batch[0].per_char_bits, ref[:30_000], atol=tol().bits, rtol=0)
    np.testing.assert_allclose(batch[2].per_char_bits, ref[:25_000], atol=tol().bits, rtol=0)
    assert batch[0].scoring["path"] == "chunked"


def test_engine_long_text_divergence_names_the_input_offset(unconstrained_engine, text8_test):
    from isan.errors import StateDivergedError

    text = text8_test[:30_000] + "Zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz" + text8_test[30_000:40_000]
    with pytest.raises(StateDivergedError) as e:
        unconstrained_engine.score(text)
    assert 30_000 < e.value.offset < 30_030 and "'z'" in str(e.value)
    assert "chunked" in str(e.value)


def test_thread_chooser_follows_speed_and_backs_off():
    from isan.engine.kernels.sequential import ThreadChooser

    c = ThreadChooser(explore=4, max_explore=64, min_chars=10)
    assert c.pick(2, 5) == 1  # short calls: one thread

    def run(calls, speed):
        used = []
        for _ in range(calls):
            t = c.pick(2, 100)
            c.report(t, 100, 100 / speed[t])
            used.append(t)
        return used

    # another process holds a core: two threads collapse to 1k chars/s; explorations back off
    used = run(200, {1: 100_000, 2: 1_000})
    assert used[:2] == [1, 2]  # both measured first
    assert 2 <= used[2:].count(2) <= 8  # intervals 4, 8, 16, 32, 64, 64 (without back-off: ~50)
    assert c.explore == 64
    # the machine is quiet again: the next exploration finds two threads faster and keeps them
    used = run(200, {1: 100_000, 2: 170_000})
    assert used[-50:].count(2) >= 45 and c.explore >= 32  # the one-thread explorations lose: backed off too


def test_bench_engine_runs_and_is_exact(text8_path):
    """`isan bench engine --quick` in process: every row is measured, and its exactness facts hold
    (the benchmark times; this checks what it reports, not the speed)."""
    from isan.bench.engine import QUICK_SIZES, bench_engine, markdown

    r = bench_engine(None, text8_path, repeats=1, peers=False, progress=False, log=lambda m: None, sizes=QUICK_SIZES,
                     startup=False, scaling=[1, 2])
    names = [row["name"] for row in r["rows"]]
    assert names[0] == "reference" and len(names) == 10
    assert sum("composed jumps" in n for n in names) == 2 and sum("one character a step" in n for n in names) == 1
    assert all(row["chars_per_s"] > 0 and np.isfinite(row["ratio"]) for row in r["rows"])
    f = r["facts"]
    assert f["long_text"]["scoring"]["path"] == "chunked"  # 60,000 characters: too few chunks for jumps
    assert f["long_text"]["max_abs_bits_vs_reference"] < tol().bits
    assert f["long_text_per_symbol"]["scoring"]["path"] == "chunked"
    assert f["long_text_per_symbol"]["max_abs_bits_vs_reference"] < tol().bits
    chars = QUICK_SIZES["long"]  # two float32 totals of the long text: twice its total's tolerance, relative
    assert f["long_text_per_symbol"]["total_bits_rel_vs_default"] < tol().twice().total(chars) / (
        f["long_text"]["bpc"] * chars)
    assert f["long_text_float16"]["scoring"]["path"] == "jumps-f16"
    assert f["long_text_float16"]["max_abs_bits_vs_reference"] < 0.02
    assert set(f["batched_kernel"].values()) == {"chunked", "jumps"}
    assert f["fma_peak"]["gflops_1_thread"] > 0
    # the fraction of the FMA peak: the long text on one thread against one thread's peak, on all
    # against all threads'; the documents; the register tile the kernels ran and why
    pf = f["peak_fraction"]
    assert "long text, 1 thread" in pf and any(k.startswith("documents") for k in pf)
    one = next(row for row in r["rows"] if row["name"] == "long text, 1 thread")
    assert one["peak_threads"] == 1 and one["of_peak"] == pytest.approx(one["useful_gflops"] / f["fma_peak"]["gflops_1_thread"])
    assert all(0 < v["of_peak"] for v in pf.values())
    assert f["kernels"]["tile"] and f["kernels"]["tile_how"]
    assert "of the FMA peak of 1 thread(s)" in markdown(r) and "register tile" in markdown(r)
    sw = f["sweep"]["points"]
    assert {p["kernel"] for p in sw} == {"per symbol", "composed jumps"} and all(p["chars_per_s"] > 0 for p in sw)
    assert f["streaming"]["float16_max_abs_bits_vs_reference"] < 0.02
    sc = f["scaling"]  # issue 36: each work on 1 and 2 threads, the speed-up and Amdahl's serial fraction
    assert [(row["what"] == "long text", row["threads"]) for row in sc] == [(True, 1), (True, 2), (False, 1), (False, 2)]
    assert all(row["chars_per_s"] > 0 for row in sc) and sc[0]["speedup"] == 1.0
    for row in (sc[1], sc[3]):
        assert row["amdahl_serial_fraction"] == pytest.approx((2 / row["speedup"] - 1) / (2 - 1))
    assert "Scaling over threads" in markdown(r)
    assert "| measurement |" in markdown(r)
