"""The batched kernel by composed jumps (issue 22): engine/kernels/jumps.py.

Against its numpy twin (the same jumps, groups and stops), against the per-character kernel
run_streams, and against the float64 reference through the engine's ``jumps`` path, on real text
and on hypothesis-made texts of every chunk count and batch shape. Tolerances: derived from the
computation (tests/tolerances.py) for the default model on the text8 test split, or on each
hypothesis-made text; two float32 computations (the compiled kernel and its twin, which differ by
summation order only, or jumps and single characters) within twice that.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isan.engine.kernels import native
from isan.engine.kernels.chunked import score_texts_chunked
from isan.engine.kernels.plan import Kernel, Plan
from isan.engine.kernels.jumps import JumpTable, run_jumps, run_jumps_ref, segment
from isan.engine.kernels.streams import run_streams
from isan.errors import StateDivergedError
from tolerances import default_model_tolerance as tol, isan_float32_tolerance


@pytest.fixture(scope="module")
def table(default_engine):
    return default_engine.jump_table()


@pytest.fixture(scope="module")
def test_ids(default_engine, text8_test):
    return default_engine.encode(text8_test[:200_000]).astype(np.int32)


def _rows(table, ids, P, h0):
    L = len(ids) // P
    start = np.arange(P, dtype=np.int64) * L
    length = np.full(P, L, dtype=np.int64)
    H = table.stream.rows(np.tile(h0, (P, 1)))
    return start, length, H


def test_table_holds_every_symbol_and_the_bundles_keys(table, default_engine):
    K = default_engine.params.K
    assert table.keys[:K] == tuple((x,) for x in range(K))
    assert table.n_entries == default_engine.table.n_entries  # the recipe's keys (singles included)
    assert table.klen.max() > 1
    # a key's matrix composes its symbols' maps: check one against the per-symbol products (float64)
    p = default_engine.params
    e = max(range(table.n_entries), key=lambda i: table.klen[i])
    A, c = np.eye(p.d), np.zeros(p.d)
    for x in table.keys[e]:
        A, c = p.W[x] @ A, p.W[x] @ c + p.b[x]
    np.testing.assert_allclose(table.M[e][: p.d, : p.d].T, A, atol=1e-6 * np.abs(A).max())
    np.testing.assert_allclose(table.M[e][p.d, : p.d], c, rtol=1e-5, atol=1e-5 * np.abs(c).max())


@pytest.mark.skipif(native() is None, reason="the compiled kernels are not built")
@pytest.mark.parametrize("want_bits", [True, False])
@pytest.mark.parametrize("frac", [0.0, 0.5, 1.0])
def test_compiled_equals_numpy_twin(isa, table, test_ids, default_engine, want_bits, frac):
    """The same schedule (frac: 0 every row every round, 1 the longest key queue alone), so the
    same jumps and stops, and the same bits and states within float32 rounding; on each
    instruction set this CPU runs (AVX-512, AVX2, generic: machines of this kind vary)."""
    ids = test_ids[:24_000]
    start, length, H = _rows(table, ids, 48, default_engine.params32.h0)
    out = []
    for fn in (run_jumps, run_jumps_ref):
        Hx = H.copy()
        bits = np.zeros(len(ids)) if want_bits else None
        r = fn(table, ids, start, length, Hx, bits, threads=1, frac=frac)
        out.append((r, Hx, bits))
    (r1, H1, b1), (r2, H2, b2) = out
    assert r1.total_steps == r2.total_steps == len(ids)
    assert r1.jumps == r2.jumps < 0.8 * len(ids)  # greedy longest match takes multi-character keys
    np.testing.assert_array_equal(r1.steps_done, r2.steps_done)
    np.testing.assert_array_equal(r1.diverged, r2.diverged)
    np.testing.assert_allclose(H1, H2, rtol=0, atol=tol().twice().state)
    if want_bits:
        np.testing.assert_allclose(b1, b2, atol=tol().twice().bits)


@pytest.mark.skipif(native() is None, reason="the compiled kernels are not built")
def test_a_rows_jumps_are_its_greedy_segmentation(table, test_ids, default_engine):
    """Rows queue by the key they take next, so each row jumps by its own greedy longest match
    (``segment``) whatever the other rows, the schedule and the threads: the jumps counted, and
    the bits bit-identical."""
    ids = test_ids[:70_000]
    lens = np.array([1, 2, 5, 13, 400, 999, 3000, 7000] * 6, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    H = table.stream.rows(np.tile(default_engine.params32.h0, (len(lens), 1)))
    want_jumps = sum(len(segment(table, ids[s : s + n])) for s, n in zip(start, lens))
    base = None
    for threads, frac in ((1, 1.0), (2, 1.0), (2, 0.0), (1, 0.5)):
        b = np.zeros(len(ids))
        r = run_jumps(table, ids, start, lens, H.copy(), b, threads=threads, frac=frac)
        assert r.jumps == want_jumps and r.total_steps == lens.sum()
        if base is None:
            base = b
        np.testing.assert_array_equal(b, base)
    # one row alone gets the bits it gets among the others
    b1 = np.zeros(len(ids))
    run_jumps(table, ids, start[4:5], lens[4:5], H[4:5].copy(), b1, threads=1)
    sl = slice(int(start[4]), int(start[4] + lens[4]))
    np.testing.assert_array_equal(b1[sl], base[sl])


@pytest.mark.skipif(native() is None, reason="the compiled kernels are not built")
@pytest.mark.parametrize("threads", [1, 2])
def test_equals_the_per_character_kernel_on_real_text(table, test_ids, default_engine, threads):
    start, length, H = _rows(table, test_ids, 512, default_engine.params32.h0)
    H1, H2 = H.copy(), H.copy()
    b1, b2 = np.zeros(len(test_ids)), np.zeros(len(test_ids))
    r = run_jumps(table, test_ids, start, length, H1, b1, threads=threads)
    run_streams(table.stream, test_ids, start, length, H2, b2, threads=threads)
    assert r.jumps < 0.8 * r.total_steps
    n = int(length.sum())
    assert np.abs(b1[:n] - b2[:n]).max() <= tol().twice().bits
    assert abs(b1[:n].sum() - b2[:n].sum()) <= tol().twice().total(n)
    np.testing.assert_allclose(H1, H2, rtol=0, atol=tol().twice().state)


@pytest.mark.skipif(native() is None, reason="the compiled kernels are not built")
def test_pairs_mode_equals_twin(table, test_ids, default_engine):
    """The correction pass's error rows follow their rows through the same jumps, without bias."""
    ids = test_ids[:16_000]
    start, length, H = _rows(table, ids, 16, default_engine.params32.h0)
    H2 = np.concatenate([H, H * 0.0])
    H2[16:, : default_engine.d] = np.random.default_rng(0).normal(0, 1, (16, default_engine.d))
    out = []
    for fn in (run_jumps, run_jumps_ref):
        Hx = H2.copy()
        bits = np.zeros(len(ids))
        r = fn(table, ids, start, length, Hx, bits, pairs=True, stop_ratio=1e-7, check_every=4, threads=1)
        out.append((r, Hx))
    (r1, A), (r2, B) = out
    np.testing.assert_array_equal(r1.steps_done, r2.steps_done)
    assert (r1.steps_done < length).all()  # every error died out inside its chunk
    np.testing.assert_allclose(A, B, rtol=0, atol=tol().twice().state)


def test_engine_jumps_path_equals_reference(default_engine, text8_test):
    text = text8_test[200_000:260_000]
    ref = default_engine.with_path("reference").score(text, per_char=True)
    r = default_engine.score(text, per_char=True, path="jumps")
    assert r.scoring["path"] == "jumps" and r.scoring["chars_per_jump"] >= 1.0
    assert np.abs(r.per_char_bits - ref.per_char_bits).max() <= tol().bits
    assert abs(r.bits - ref.bits) <= tol().total(len(text))
    assert np.abs(r.state.h - ref.state.h).max() <= tol().state
    h = default_engine.advance(text, path="jumps").h
    assert np.abs(h - ref.state.h).max() <= tol().state


def _draw_batch(data, table, K: int):
    """Hypothesis-made texts (the table's multi-symbol keys and random symbols), 1-5 of them, and a
    chunk count for each (1 to one chunk per 64 characters)."""
    keys = [k for k in table.keys if len(k) > 1]
    piece = st.one_of(st.sampled_from(keys), st.lists(st.integers(0, K - 1), min_size=1, max_size=5).map(tuple))
    texts = data.draw(st.lists(st.lists(piece, min_size=1, max_size=300).map(
        lambda ps: np.array([x for p in ps for x in p], dtype=np.int32)), min_size=1, max_size=5))
    return texts, [data.draw(st.integers(1, max(1, len(t) // 64))) for t in texts]


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_chunked_by_jumps_equals_reference_any_shape(default_engine, table, data):
    """Hypothesis-made texts (table keys and random symbols), any batch shape and chunk count,
    through the exact chunk-parallel algorithm with the jumps kernel (compiled and twin)."""
    texts, chunks = _draw_batch(data, table, default_engine.params.K)
    runner = data.draw(st.sampled_from([run_jumps, run_jumps_ref]) if native() is not None else st.just(run_jumps_ref))
    threads = data.draw(st.integers(1, 2))
    h0 = default_engine.params.h0
    hs = np.tile(h0, (len(texts), 1))
    bits, finals, rep, div = score_texts_chunked(
        Plan(Kernel.JUMPS, table, tuple(chunks), runner, path="jumps"), texts, hs, threads=threads)
    assert not div
    p = default_engine.params
    for t, b, hf in zip(texts, bits, finals):
        from isan.engine.reference import score_ref

        rb, rh = score_ref(p, t.astype(np.int64), h0)
        t_ = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, h0, t, samples=4)
        assert np.abs(b - rb).max() <= t_.bits
        assert abs(b.sum() - rb.sum()) <= t_.total_bits
        assert np.abs(hf - rh).max() <= t_.state


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_chunked_by_float16_jumps_any_shape(default_engine, table, data):
    """The reduced-precision option on hypothesis-made texts, any batch shape and chunk count: the
    compiled kernel equals its numpy twin (the same half-precision matrices, float32 sums), and the
    bits stay within 0.05 of the float64 reference (6.6e-03 on real text in `isan bench engine`),
    totals within a relative 1e-3."""
    t16 = default_engine.jump_table("float16")
    texts, chunks = _draw_batch(data, t16, default_engine.params.K)
    threads = data.draw(st.integers(1, 2))
    h0 = default_engine.params.h0
    hs = np.tile(h0, (len(texts), 1))
    out = {}
    for name, runner in (("c16", run_jumps), ("ref16", run_jumps_ref)):
        if runner is run_jumps and native() is None:
            continue
        bits, finals, rep, div = score_texts_chunked(
            Plan(Kernel.JUMPS_F16, t16, tuple(chunks), runner, path="jumps-f16"), texts, hs, threads=threads)
        assert not div
        out[name] = bits
    from isan.engine.reference import score_ref

    p = default_engine.params
    for i, t in enumerate(texts):
        rb, _ = score_ref(p, t.astype(np.int64), h0)
        if "c16" in out:  # the same half-precision values, float32 sums
            t_ = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, h0, t, samples=4)
            np.testing.assert_allclose(out["c16"][i], out["ref16"][i], atol=t_.twice().bits)
        b = out["ref16"][i]
        assert np.isfinite(b).all()
        assert np.abs(b - rb).max() < 0.05
        assert abs(b.sum() - rb.sum()) <= 1e-3 * rb.sum() + 1e-3


def test_score_batch_jumps_equals_each_alone(default_engine, text8_test):
    texts = [text8_test[i * 700 : i * 700 + 300 + 97 * i] for i in range(9)]
    got = default_engine.score_batch(texts, per_char=True, group="jumps")
    for t, g in zip(texts, got):
        alone = default_engine.with_path("reference").score(t, per_char=True)
        assert np.abs(g.per_char_bits - alone.per_char_bits).max() <= tol().bits
        assert g.scoring["path"] == "jumps"


def test_segment_is_greedy_longest_match(table, default_engine):
    ids = default_engine.encode(" the cat and the dog ").astype(np.int32)
    ents = segment(table, ids)
    assert sum(int(table.klen[e]) for e in ents) == len(ids)
    # greedy: at each start no longer key matches
    pos = 0
    for e in ents:
        k = int(table.klen[e])
        assert tuple(ids[pos : pos + k]) == table.keys[e]
        longer = [kk for kk in table.keys if len(kk) > k and tuple(ids[pos : pos + len(kk)]) == kk]
        assert not longer
        pos += k


def test_jumps_path_reports_divergence_like_chunked(unconstrained_engine):
    """A diverging state (the unconstrained model on a long run of 'h') is located exactly."""
    text = "the " + "h" * 30_000
    errs = []
    for path in ("chunked", "jumps"):
        with pytest.raises(StateDivergedError) as e:
            unconstrained_engine.score(text, path=path)
        errs.append(e.value.offset)
    assert errs[0] == errs[1]


@pytest.mark.skipif(native() is None, reason="the compiled kernels are not built")
def test_a_failing_call_then_good_calls(table, test_ids, default_engine):
    """An allocation failure in a thread raises MemoryError; the next calls are correct (issue 20's rule)."""
    nat = native()  # the compiled module (the test is skipped without it)
    ids = test_ids[:40_000]
    start, length, H = _rows(table, ids, 64, default_engine.params32.h0)
    want = np.zeros(len(ids))
    run_jumps(table, ids, start, length, H.copy(), want, threads=2)
    for tid in (0, 1, 0):
        nat.inject_faults(tid, 0)
        with pytest.raises(MemoryError):
            run_jumps(table, ids, start, length, H.copy(), np.zeros(len(ids)), threads=2)
        got = np.zeros(len(ids))
        run_jumps(table, ids, start, length, H.copy(), got, threads=2)
        np.testing.assert_array_equal(got, want)
    nat.inject_faults(-1, 1)  # the system refuses the second thread: one thread does all rows
    got = np.zeros(len(ids))
    run_jumps(table, ids, start, length, H.copy(), got, threads=2)
    ref = np.zeros(len(ids))
    run_jumps(table, ids, start, length, H.copy(), ref, threads=1)
    np.testing.assert_allclose(got, ref, atol=1e-6)


def test_bad_input_is_refused(table, default_engine):
    ids = np.array([0, 1, 99], dtype=np.int32)
    start, length = np.array([0], np.int64), np.array([3], np.int64)
    H = table.stream.rows(default_engine.params32.h0[None])
    with pytest.raises(ValueError):
        run_jumps(table, ids, start, length, H, np.zeros(3))
    with pytest.raises(ValueError):
        run_jumps(table, ids[:2], start, length, H, np.zeros(3))
    with pytest.raises(ValueError):
        JumpTable.build(default_engine.params32, [[0, 99]])


def test_float16_matrices_twin_and_error(isa, default_engine, table, test_ids):
    """float16 storage of the composed matrices (the not-exact option): the compiled kernel equals
    its twin (same half-precision values) on each instruction set, and the bits stay within 0.02 of the float32 kernel's,
    totals within a relative 1e-4 (the float16 sequential table's tolerance)."""
    t16 = default_engine.jump_table("float16")
    assert t16.dtype == "float16" and t16.nbytes * 2 == table.nbytes
    ids = test_ids[:24_000]
    start, length, H = _rows(table, ids, 48, default_engine.params32.h0)
    out = {}
    for name, fn, t in (("c16", run_jumps, t16), ("ref16", run_jumps_ref, t16), ("c32", run_jumps, table)):
        if fn is run_jumps and native() is None:
            continue
        b = np.zeros(len(ids))
        fn(t, ids, start, length, H.copy(), b, threads=1)
        out[name] = b
    if "c16" in out:  # the same half-precision values, float32 sums
        np.testing.assert_allclose(out["c16"], out["ref16"], atol=tol().twice().bits)
    base = out.get("c32", out["ref16"])
    assert np.abs(out["ref16"] - base).max() < 0.02
    assert abs(out["ref16"].sum() - base.sum()) < 1e-4 * base.sum()
    with pytest.raises(ValueError):
        JumpTable.build(default_engine.params32, [], dtype="bfloat16")


def test_server_on_the_jumps_path_scores_as_the_library(default_engine, text8_test):
    """`isan-serve --path jumps`: the scheduler's rounds advance by composed jumps, and a batch of
    requests gets the library's bits."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from concurrent.futures import ThreadPoolExecutor

    from isan.engine.serve import ServeConfig, create_app
    from server_helpers import running

    eng = default_engine.with_path("jumps")
    texts = [text8_test[i * 1500 : i * 1500 + 1000 + 37 * i] for i in range(12)]
    with running(create_app(eng, config=ServeConfig(max_chars=200_000))) as addr:
        with ThreadPoolExecutor(6) as ex:
            got = list(ex.map(lambda t: httpx.post(f"http://{addr}/v1/score", json={"text": t, "per_char": True},
                                                   timeout=60).json(), texts))
    for t, g in zip(texts, got):
        want = default_engine.with_path("reference").score(t, per_char=True)
        assert abs(g["bits"] - want.bits) <= tol().total(len(t))
        assert np.abs(np.asarray(g["per_char_bits"]) - want.per_char_bits).max() <= tol().bits


def test_cli_and_loader_take_the_jumps_path(tmp_path, text8_test):
    """`isan score --path jumps FILE`: the loader keeps the table and every text takes the path
    (a short one too), with the same bits as the default path."""
    import json
    import subprocess
    import sys

    from isan.engine import load_engine

    eng = load_engine(None, path="jumps")
    assert eng.path == "jumps" and eng.table is not None
    assert eng.score(text8_test[:500]).scoring["path"] == "jumps"
    f = tmp_path / "t.txt"
    f.write_text(text8_test[:30_000])
    runs = [json.loads(subprocess.run([sys.executable, "-m", "isan.cli", "score", "--json", *extra, str(f)],
                                      capture_output=True, text=True, check=True).stdout)
            for extra in (["--path", "jumps"], [])]
    assert runs[0]["scoring"]["path"] == "jumps"
    assert abs(runs[0]["bits"] - runs[1]["bits"]) <= tol().twice().total(30_000)


def test_auto_kernel_takes_jumps_when_the_batch_has_rows_for_them(default_engine, text8_test):
    """The composed path's default (Engine.score's long texts, score_batch, the server's rounds):
    composed jumps when the batch makes MIN_ROWS_PER_THREAD rows a thread for them, one character
    a step below that; both equal the float64 reference."""
    from isan.engine.kernels.jumps import MIN_ROWS_PER_THREAD

    eng, th = default_engine, 2
    assert eng.path == "composed"
    assert eng.plan([2_500_000], th).kernel == "jumps"  # 2,441 chunks
    assert eng.plan([100_000], th).kernel == "chunked"  # 97 chunks
    assert eng.plan([2000] * 256, th).kernel == "chunked"
    assert eng.plan([2000] * 4096, th).kernel == "jumps"
    assert eng.plan([2000] * 4096, th, kernel="chunked").kernel == "chunked"
    assert eng.plan([2000] * 4096, th, cut=False).chunks.tolist() == [1] * 4096
    n = MIN_ROWS_PER_THREAD * th
    texts = [text8_test[i * 50 : i * 50 + 40 + i % 13] for i in range(n)]
    many = eng.score_batch(texts, per_char=True, threads=th)
    few = eng.score_batch(texts[: n // 4], per_char=True, threads=th)
    assert many[0].scoring["path"] == "jumps" and few[0].scoring["path"] == "chunked"
    assert eng.score_batch(texts, threads=th, group="chunked")[0].scoring["path"] == "chunked"
    ref = eng.with_path("reference")
    for got, step in ((many, 97), (few, 31)):
        for i in range(0, len(got), step):
            want = ref.score(texts[i], per_char=True)
            assert np.abs(got[i].per_char_bits - want.per_char_bits).max() <= tol().bits
            assert abs(got[i].bits - want.bits) <= tol().total(len(texts[i]))
