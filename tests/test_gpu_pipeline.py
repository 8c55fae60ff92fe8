"""The torch backend's batch path as a GPU runs it (issue #47): each text's total bits reduced by the
runner (``want_bits="totals"``), bits written into the runner's own memory (``empty_bits``), whole-
batch blocks and the correction checked every ``Plan.check_every`` steps. Every test runs on torch's
CPU device (CI has no GPU); those marked gpu repeat it on CUDA where there is one."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from isan.engine import Engine  # noqa: E402
from isan.engine.kernels.chunked import score_texts_chunked  # noqa: E402
from isan.engine.kernels.torch import TorchStreams  # noqa: E402
from isan.engine.reference import score_ref  # noqa: E402
from isan.errors import IsanError  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")])]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def docs(default_engine, text8_test) -> list[np.ndarray]:
    """40 documents of 20 to 400 characters of real text."""
    ids = default_engine.encode(text8_test[:40_000])
    rng = np.random.default_rng(3)
    lens = rng.integers(20, 400, 40)
    starts = rng.integers(0, len(ids) - 400, 40)
    return [ids[s : s + n] for s, n in zip(starts, lens)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, rtol", [("float32", 1e-6), ("float64", 1e-12)])
def test_totals_equal_the_sums_of_each_characters_bits(default_engine, docs, device, dtype, rtol):
    """``want_bits="totals"`` on the torch backend (reduced per row on the device) against the same
    engine's per-character bits summed, and against the float64 reference; the native backend's
    totals (summed on the host) too. Final states are the same either way."""
    eng = Engine.load(default_engine.source, progress_bar=False, device=device, dtype=dtype, kernels="torch")
    h0 = np.tile(eng.params.h0, (len(docs), 1))
    per_char, fin_c, _ = eng.score_ids(docs, h0, chunks="none")
    totals, fin_t, _ = eng.score_ids(docs, h0, chunks="none", want_bits="totals")
    assert isinstance(totals, np.ndarray) and totals.shape == (len(docs),) and totals.dtype == np.float64
    np.testing.assert_allclose(totals, [b.sum() for b in per_char], rtol=1e-13)
    np.testing.assert_array_equal(fin_t, fin_c)
    p64 = eng.params.astype(np.float64)
    ref = np.array([score_ref(p64, d.astype(np.int64), p64.h0)[0].sum() for d in docs])
    np.testing.assert_allclose(totals, ref, rtol=rtol)
    native_totals, _, _ = default_engine.score_ids(docs, h0.astype(np.float32), chunks="none", want_bits="totals")
    np.testing.assert_allclose(native_totals, [b.sum() for b in default_engine.score_ids(docs, h0, chunks="none")[0]],
                               rtol=1e-15)


def test_totals_of_cut_texts_come_from_the_hosts_sums(default_engine, text8_test):
    """Texts cut into chunks (the runner's rows are chunks, not texts) still give each text's total,
    summed on the host from the chunk-parallel bits."""
    eng = Engine.load(default_engine.source, progress_bar=False, dtype="float64")  # the torch backend, CPU
    ids = default_engine.encode(text8_test[:9_000])
    texts = [ids[:5_000], ids[5_000:]]
    h0 = np.tile(eng.params.h0, (2, 1))
    per_char, _, _ = eng.score_ids(texts, h0, chunks=[3, 2])
    totals, _, rep = eng.score_ids(texts, h0, chunks=[3, 2], want_bits="totals")
    assert rep.chunks == 5
    np.testing.assert_allclose(totals, [b.sum() for b in per_char], rtol=1e-13)


def test_a_bad_want_bits_and_bad_totals_are_clear_errors(default_engine, docs):
    runner = TorchStreams("cpu")
    model = default_engine.stream_model()
    with pytest.raises(ValueError, match="want_bits"):
        score_texts_chunked(model, docs, np.tile(default_engine.params.h0, (len(docs), 1)), want_bits="sums",
                            runner=runner)
    H = model.rows(np.tile(default_engine.params.h0, (2, 1)))
    ids = np.concatenate(docs[:2]).astype(np.int32)
    start = np.array([0, len(docs[0])], dtype=np.int64)
    length = np.array([len(docs[0]), len(docs[1])], dtype=np.int64)
    with pytest.raises(ValueError, match="totals"):
        runner(model, ids, start, length, H, None, totals=np.zeros(3))
    # the runner still works after the refused call
    tot = np.zeros(2)
    runner(model, ids, start, length, H, None, totals=tot)
    assert np.isfinite(tot).all() and (tot > 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_the_runners_own_bits_memory_and_whole_batch_blocks(default_engine, docs, device):
    """``empty_bits`` gives float64 memory the runner writes (page-locked on a GPU), and a runner
    with one block for the whole batch (the GPU's default) scores as one with blocks of 7 steps."""
    whole = TorchStreams(device, "float64", block=1_000)
    small = TorchStreams(device, "float64", block=7)
    model = default_engine.stream_model()
    buf = whole.empty_bits(10)
    assert buf.dtype == np.float64 and buf.shape == (10,)
    if device == "cuda":
        assert torch.from_numpy(buf).is_pinned()
    ids = np.concatenate(docs).astype(np.int32)
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    out = []
    for runner in (whole, small):
        H = model.rows(np.tile(default_engine.params.h0, (len(docs), 1))).astype(np.float64)
        bits = runner.empty_bits(len(ids))
        tot = np.zeros(len(docs))
        runner(model, ids, start, lens, H, bits, totals=tot)
        np.testing.assert_allclose(tot, np.add.reduceat(bits, start), rtol=1e-13)
        out.append((bits.copy(), H))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-13)
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-13)


def test_the_gpu_plan_checks_less_often_and_the_cpu_plan_as_before(default_engine):
    """The torch backend's plan on a GPU checks the correction every 64 steps, sums rows on the
    runner and writes bits into the runner's memory; on the CPU device the check stays the default."""
    from isan.engine.kernels.torch import plan

    assert plan.check_every("cuda") == plan.GPU_CHECK_EVERY == 64 and plan.check_every("cpu") is None
    eng = Engine.load(default_engine.source, progress_bar=False, dtype="float64")
    p = eng.plan([5_000], 1)
    kw = p.keywords()
    assert kw["row_totals"] is True and "check_every" not in kw and kw["empty_bits"] == eng.kernels.streams.empty_bits
    assert "row_totals" not in default_engine.plan([5_000], 1).keywords()  # the native kernels sum on the host


def test_backend_options_reach_the_runner_and_unknown_ones_are_refused(default_engine):
    eng = Engine.load(default_engine.source, progress_bar=False, dtype="float64", kernels="torch", step="mm")
    assert eng.kernels.streams.step == "mm" and eng.kernels.describe()["step_reason"] == "asked for"
    with pytest.raises(IsanError, match="no option"):
        Engine.load(default_engine.source, progress_bar=False, kernels="native", step="mm")
    with pytest.raises(IsanError, match="tf32x3"):
        Engine.load(default_engine.source, progress_bar=False, dtype="float64", kernels="torch", step="mm",
                    precision="tf32x3")
    assert Engine.load(default_engine.source, progress_bar=False, kernels=eng.kernels).kernels is eng.kernels
