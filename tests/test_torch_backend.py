"""The torch backend (issue 35): its runner against the numpy twin and the float64 reference, on
the CPU device here (CI has no GPU) and on CUDA where there is one (tests marked ``gpu``). Float32
tolerances are derived from the computation (tests/tolerances.py); float64: 1e-12 relative in total
and 1e-9 bits per character (the issue's targets)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from isan.engine.kernels.backends import get_backend, resolve_device  # noqa: E402
from isan.engine.kernels.chunked import Runner, score_texts_chunked  # noqa: E402
from isan.engine.kernels.plan import Kernel, Plan  # noqa: E402
from isan.engine.kernels.streams import StreamModel, run_streams_ref  # noqa: E402
from isan.engine.kernels.torch import TorchStreams  # noqa: E402
from isan.engine.reference import score_ref  # noqa: E402
from isan.errors import BackendUnavailableError, IsanError  # noqa: E402
from tolerances import (TF32X3_U, U32, U64, default_model_tolerance as tol,  # noqa: E402
                        inner_product_worst_case, isan_float32_bits_tolerances, isan_float32_relative_state_tolerance,
                        isan_float32_tolerance)

REPO = Path(__file__).resolve().parents[1]

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
DEVICES = ["cpu", pytest.param("cuda", marks=[gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")])]


def _triton_reason(device: str) -> str | None:
    """Why the Triton step cannot run on ``device`` in this process (None: it can)."""
    try:
        from isan.engine.kernels.torch import grouped
    except ImportError as e:
        return f"Triton cannot be imported ({e})"
    try:
        grouped.check_device(torch.device(device))
    except ValueError as e:
        return str(e)
    return None


_NO_TRITON_CPU, _NO_TRITON_CUDA = _triton_reason("cpu"), (_triton_reason("cuda") if CUDA else "no CUDA GPU")
#: (device, step) of the runners under test: the plain torch step and the fused Triton step (in
#: Triton's interpreter on the CPU device: tests/conftest.py turns it on where there is no GPU)
RUNNERS = [
    pytest.param("cpu", "mm", id="cpu-mm"),
    pytest.param("cpu", "triton", id="cpu-triton", marks=pytest.mark.skipif(bool(_NO_TRITON_CPU), reason=str(_NO_TRITON_CPU))),
    pytest.param("cuda", "mm", id="cuda-mm", marks=[gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]),
    pytest.param("cuda", "triton", id="cuda-triton",
                 marks=[gpu, pytest.mark.skipif(bool(_NO_TRITON_CUDA), reason=str(_NO_TRITON_CUDA))]),
    pytest.param("cuda", "triton-tf32x3", id="cuda-triton-tf32x3",
                 marks=[gpu, pytest.mark.skipif(bool(_NO_TRITON_CUDA), reason=str(_NO_TRITON_CUDA))]),
]


def make_runner(device: str, step: str, dtype: str = "float32", **kw) -> TorchStreams:
    """The runner of a RUNNERS entry (``"triton-tf32x3"``: the Triton step with TF32x3 products,
    which apply to float32 only: float64 runs IEEE products)."""
    step, _, precision = step.partition("-")
    return TorchStreams(device, dtype, step=step, precision=precision if dtype == "float32" and precision else "ieee",
                        **kw)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(default_engine) -> StreamModel:
    return default_engine.stream_model()


@pytest.fixture(scope="module")
def p64(default_engine):
    return default_engine.params.astype(np.float64)


@pytest.fixture(scope="module")
def test_ids(default_engine, text8_test) -> np.ndarray:
    return default_engine.encode(text8_test[:60_000]).astype(np.int32)


def rows_run(runner, model, ids, start, length, h0, pairs=False, **kw):
    P = len(start)
    H = model.rows(np.tile(h0, (P, 1)))
    if pairs:
        H = np.concatenate([H, model.rows(np.tile(h0 * 0.01, (P, 1)), bias=0.0)])
    bits = np.full(len(ids), 7.0)  # what a row does not read must stay as the caller left it
    r = runner(model, ids, start, length, H, bits, pairs=pairs, **kw)
    return H, bits, r


@pytest.mark.parametrize("device, precision", [pytest.param(p.values[0], p.values[1].partition("-")[2] or "ieee",
                                                           marks=p.marks, id=p.id)
                                              for p in RUNNERS if p.values[1].startswith("triton")])
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_fused_step_equals_a_product_per_row(device, precision, data):
    """One launch of the Triton step (engine/kernels/torch/grouped.py) on hypothesis-made rows and
    symbols (any count, symbols absent or crowded, the identity symbol of rows past their end)
    equals ``h[r] @ W^T[x_r]`` row by row: to 1e-12 in float64, in float32 within Higham's worst case
    for an inner product of d1 terms (``tf32x3``: three TF32 products a term) times ``|h| |W^T|``."""
    from isan.engine.kernels.torch import grouped

    R = data.draw(st.integers(1, 200))
    # on a GPU each width is compiled and tuned anew: two widths there
    K, d1 = data.draw(st.integers(1, 30)), data.draw(st.sampled_from([5, 33, 217] if device == "cpu" else [33, 217]))
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64] if precision == "ieee" else [torch.float32]))
    steps = data.draw(st.integers(1, 3))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    WT = grouped.with_identity(torch.randn(K, d1, d1, generator=gen, dtype=dtype)).to(device)
    h = torch.randn(R, d1, generator=gen, dtype=dtype).to(device)
    sym = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, K), min_size=R, max_size=R), min_size=steps,
                                          max_size=steps)), device=device)
    sorted_sym, perm = torch.sort(sym, dim=1, stable=True)
    rows, tile_sym = grouped.tile_layout(sorted_sym, perm, K + 1)
    assert rows.shape == (steps, grouped.max_tiles(R, K + 1) * grouped.BM)
    for j in range(steps):
        assert sorted((rows[j][rows[j] >= 0]).tolist()) == list(range(R))  # every row in one slot
        out = torch.full_like(h, float("nan"))
        grouped.grouped_step(h, out, WT, rows[j], tile_sym[j], precision=precision)
        want = torch.einsum("ri,rij->rj", h.double(), WT[sym[j]][:, :d1, :d1].double())
        mag = torch.einsum("ri,rij->rj", h.double().abs(), WT[sym[j]][:, :d1, :d1].double().abs())  # want's: U64
        bound = 1e-12 if dtype == torch.float64 else (inner_product_worst_case(d1, precision) + inner_product_worst_case(d1, u=U64)) * mag
        assert ((out.double() - want).abs() <= bound).all()


def test_the_runner_fits_the_protocol():
    assert isinstance(TorchStreams("cpu"), Runner)
    assert isinstance(run_streams_ref, Runner)


@pytest.mark.parametrize("device, step", RUNNERS)
@pytest.mark.parametrize("pairs", [False, True])
def test_rows_equal_the_numpy_twin(model, default_engine, test_ids, device, step, pairs):
    """Rows of many lengths (blocks end inside rows and rows end inside blocks), with and without
    the correction pairs: bits, final states, steps, stops and residuals as the numpy twin's, within
    twice the derived tolerances (the pairs' decaying e relative to ``max|e|``, so a residual
    ``max|e| / max|h|``, ``max|h| >= 1``, within e's and h's, and its rounding, times itself). Rows
    never overlap (the contract: two rows writing one character's bits would race on a GPU); the
    Triton interpreter gets shorter rows (it runs a program at a time)."""
    rng = np.random.default_rng(1)
    P, longest = 37, (90 if (device, step) == ("cpu", "triton") else 700)
    length = rng.integers(1, longest, P).astype(np.int64)
    start = (np.arange(P) * (len(test_ids) // P) + rng.integers(0, len(test_ids) // P - longest, P)).astype(np.int64)
    kw = dict(stop_ratio=1e-6 / 4, check_every=16) if pairs else {}
    H_ref, b_ref, r_ref = rows_run(run_streams_ref, model, test_ids, start, length, default_engine.params.h0, pairs, **kw)
    runner = make_runner(device, step, block=50)  # blocks of 50: not a divisor of anything here
    assert runner.step == step.partition("-")[0]
    H_t, b_t, r_t = rows_run(runner, model, test_ids, start, length, default_engine.params.h0, pairs, **kw)
    assert r_t.total_steps == r_ref.total_steps
    np.testing.assert_array_equal(r_t.steps_done, r_ref.steps_done)
    np.testing.assert_array_equal(r_t.diverged, r_ref.diverged)
    written = np.zeros(len(test_ids), bool)
    for s, n in zip(start, r_ref.steps_done):
        written[s : s + n] = True
    p, u = default_engine.params, U32 + TF32X3_U * step.endswith("tf32x3")  # tf32x3: each product TF32X3_U more
    t = tol().in_precision(u).twice()
    np.testing.assert_allclose(b_t[written], b_ref[written], atol=t.bits, rtol=0)
    assert (b_t[~written] == 7.0).all()  # nothing written where no row read
    np.testing.assert_allclose(H_t[:P], H_ref[:P], atol=t.state, rtol=0)
    if pairs:  # the pairs' rows: e <- W[x] e from 0.01 h0, no bias, for as long as any row
        rel_e = 2 * u / U32 * isan_float32_relative_state_tolerance(p.W, 0 * p.b, p.W_ro, p.b_ro, 0.01 * p.h0,
                                                                      test_ids[:longest], samples=4)
        assert (np.abs(H_t[P:] - H_ref[P:]) <= rel_e * np.abs(H_ref[P:]).max(1, keepdims=True)).all()
        fin = np.isfinite(r_ref.residual)
        np.testing.assert_array_equal(fin, np.isfinite(r_t.residual))
        np.testing.assert_allclose(r_t.residual[fin], r_ref.residual[fin], rtol=rel_e + t.state + 2 * U32, atol=0)


@pytest.mark.parametrize("device, step", RUNNERS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chunk_parallel_long_text_equals_the_float64_reference(model, default_engine, p64, test_ids, device, step,
                                                               dtype):
    """20,000 characters of the test split cut into 16 chunks, scored chunk-parallel on the torch
    runner (the float64 runner with a correction that stops at 1e-13); in the Triton interpreter
    (a program at a time) 1,200 characters in 3 chunks, float64 only (float32: the rows test)."""
    if (device, step) == ("cpu", "triton") and dtype == "float32":
        pytest.skip("the Triton interpreter is slow: its float32 step is tested on rows (test_rows_equal_the_numpy_twin)")
    test_ids = test_ids[: 1_200 if (device, step) == ("cpu", "triton") else 20_000]
    bits_ref, h_ref = score_ref(p64, test_ids.astype(np.int64), p64.h0)
    runner = make_runner(device, step, dtype)
    n_chunks = 3 if (device, step) == ("cpu", "triton") else 16
    rtol = 1e-13 if dtype == "float64" else 1e-6
    bits, finals, rep, div = score_texts_chunked(
        Plan(Kernel.TORCH, model, (n_chunks,), runner, rtol=rtol, fallback=default_engine.chunk_fallback()),
        [test_ids], p64.h0[None])
    assert not div and rep.chunks == n_chunks and rep.fallback_chunks == 0
    assert finals.dtype == runner.state_dtype
    t = tol().in_precision(U32 + TF32X3_U * step.endswith("tf32x3"))
    total, char, state = (t.total_bits, t.bits, t.state) if dtype == "float32" else (1e-12 * bits_ref.sum(), 1e-9, 1e-9)
    assert abs(bits[0].sum() - bits_ref.sum()) <= total
    np.testing.assert_allclose(bits[0], bits_ref, atol=char, rtol=0)
    np.testing.assert_allclose(finals[0], h_ref, atol=state, rtol=0)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hypothesis_texts_any_batch_shape(model, default_engine, p64, data):
    """Hypothesis-made texts (any symbols, lengths and chunk counts, batch shapes from 1 to 6 texts):
    float64 torch scoring equals the float64 reference to 1e-9 bits a character."""
    K = default_engine.params.K
    texts = data.draw(st.lists(st.lists(st.integers(0, K - 1), min_size=1, max_size=300), min_size=1, max_size=6))
    texts = [np.asarray(t, np.int32) for t in texts]
    chunks = [data.draw(st.integers(1, max(1, len(t) // 20))) for t in texts]
    runner = TorchStreams("cpu", "float64", block=data.draw(st.integers(1, 40)))
    bits, finals, rep, div = score_texts_chunked(
        Plan(Kernel.TORCH, model, tuple(chunks), runner, rtol=1e-13, fallback=default_engine.chunk_fallback()),
        texts, np.tile(p64.h0, (len(texts), 1)))
    assert not div
    for t, b, f in zip(texts, bits, finals):
        b_ref, h_ref = score_ref(p64, t.astype(np.int64), p64.h0)
        np.testing.assert_allclose(b, b_ref, atol=1e-9, rtol=0)
        np.testing.assert_allclose(f, h_ref, atol=1e-9)


@pytest.mark.parametrize("device", DEVICES)
def test_a_diverging_row_stops_where_the_twin_stops(device):
    """The unconstrained model's state overflows on repeated 'z': the row stops at the same step,
    with its bits written up to and including it (within twice each one's own derived tolerance, of
    row 0 or 2 from h0 at 0 and 20), and the other rows are untouched."""
    from isan.engine import Engine
    from tests.conftest import UNCONSTRAINED

    eng = Engine.load(UNCONSTRAINED, progress_bar=False)
    m = eng.stream_model()
    ids = np.concatenate([eng.encode("the cat sat on the mat " * 4), eng.encode("z" * 60)]).astype(np.int32)
    start = np.array([0, 0, 20], np.int64)
    length = np.array([len(ids), 90, len(ids) - 20], np.int64)
    _, b_ref, r_ref = rows_run(run_streams_ref, m, ids, start, length, eng.params.h0)
    _, b_t, r_t = rows_run(TorchStreams(device, block=7), m, ids, start, length, eng.params.h0)
    assert (r_ref.diverged[[0, 2]] >= 0).all() and r_ref.diverged[1] == -1
    np.testing.assert_array_equal(r_t.diverged, r_ref.diverged)
    np.testing.assert_array_equal(r_t.steps_done, r_ref.steps_done)
    ok = np.isfinite(b_ref)
    p = eng.params
    with np.errstate(over="ignore", invalid="ignore"):  # float64 may overflow past where float32 stopped
        t0, t2 = (isan_float32_bits_tolerances(p.W, p.b, p.W_ro, p.b_ro, p.h0, ids[s:], samples=4) for s in (0, 20))
    assert (np.abs(b_t[ok] - b_ref[ok]) <= 2 * np.maximum(t0, np.r_[np.zeros(20), t2])[ok]).all()


def test_a_failing_call_then_good_calls(model, default_engine, test_ids):
    """Bad arrays raise a clear error; the same runner then scores as before."""
    runner = TorchStreams("cpu")
    start, length = np.array([0, 100], np.int64), np.array([100, 200], np.int64)
    _, good, _ = rows_run(runner, model, test_ids, start, length, default_engine.params.h0)
    with pytest.raises(TypeError, match="int32"):
        runner(model, test_ids.astype(np.int64), start, length, model.rows(np.zeros((2, model.d))))
    with pytest.raises(ValueError, match="number of rows"):
        runner(model, test_ids, start, length, model.rows(np.zeros((3, model.d))))
    with pytest.raises(ValueError, match="frac"):
        runner(model, test_ids, start, length, model.rows(np.zeros((2, model.d))), frac=2.0)
    with pytest.raises(ValueError, match="inside ids"):
        runner(model, test_ids, start, np.array([100, len(test_ids)], np.int64), model.rows(np.zeros((2, model.d))))
    for _ in range(2):
        _, again, _ = rows_run(runner, model, test_ids, start, length, default_engine.params.h0)
        np.testing.assert_array_equal(again, good)


def test_backend_registry_and_its_errors(monkeypatch):
    assert get_backend().name == "native" and get_backend(device="cpu", dtype="float64").name == "torch"
    b = get_backend("torch", "cpu", "float64")
    d = b.describe()
    assert {k: d[k] for k in ("backend", "device", "dtype", "step")} == {"backend": "torch", "device": "cpu",
                                                                       "dtype": "float64", "step": "mm"}
    assert d["step_reason"] == b.streams.step_reason and d["step_reason"] and b.jumps is None
    with pytest.raises(IsanError, match="computes in float32"):
        get_backend("native", "cpu", "float64")
    if CUDA:
        with pytest.raises(IsanError, match="CPU only"):
            get_backend("native", "cuda")
    with pytest.raises(IsanError, match="device must be one of"):
        get_backend(device="tpu")
    if not CUDA:
        with pytest.raises(BackendUnavailableError, match="sees no CUDA GPU"):
            resolve_device("cuda")
        assert resolve_device("auto") == "cpu"
    # without torch (None in sys.modules: every import of it fails): a clear error naming the
    # extra, never a silent CPU run
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BackendUnavailableError, match=r"torch is not installed: pip install .*\[gpu\]"):
        get_backend(device="cuda")
    assert resolve_device("auto") == "cpu"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_gpu_plan_corrects_inside_every_chunk(model, default_engine, p64, test_ids, dtype):
    """The chunks the torch backend cuts on a GPU for the default model (kernels/torch/plan.py: at
    least 1,024 characters in float32, 2,048 in float64, and at least the characters within which
    the model's certificate proves the correction converges), run here on the CPU device: no chunk
    falls back to the host's sequential float64, and the bits are exact."""
    from isan.engine.kernels.torch import plan

    ids = test_ids[:40_000]
    bound = default_engine.forget_bound_chars(rtol=plan.rtol(dtype))
    chunks = plan.chunks([len(ids)], "cuda", dtype=dtype, forget_chars=bound)
    assert chunks[0] == len(ids) // plan.min_chunk(dtype, bound) and len(ids) // chunks[0] >= bound
    assert plan.min_chunk(dtype, bound) >= plan.GPU_MIN_CHUNK[dtype]
    bits, _, rep, div = score_texts_chunked(
        Plan(Kernel.TORCH, model, tuple(chunks), TorchStreams("cpu", dtype), rtol=plan.rtol(dtype),
             fallback=default_engine.chunk_fallback()), [ids], p64.h0[None])
    bits_ref, _ = score_ref(p64, ids.astype(np.int64), p64.h0)
    assert not div and rep.fallback_chunks == 0
    assert abs(bits[0].sum() - bits_ref.sum()) <= (1e-12 * bits_ref.sum() if dtype == "float64" else tol().total_bits)


def test_the_gpu_plan_follows_a_model_that_forgets_more_slowly(text8_test):
    """A certified model whose bound is above the plan's minimum (text8-d216-distil: 1,064 characters
    in float32) gets chunks at least that long, and they correct inside every chunk on the CPU device
    (its derived tolerance, carried from 10,000 characters); a model that forgets sooner keeps the
    plan's minimum."""
    from isan.engine import Engine
    from isan.engine.kernels.torch import plan

    eng = Engine.load(REPO / "isan" / "models" / "text8-d216-distil", progress_bar=False)
    bound = eng.forget_bound_chars(rtol=plan.rtol("float32"))
    assert bound > plan.GPU_MIN_CHUNK["float32"]  # the case under test
    assert plan.min_chunk("float32", bound) == 1280 and plan.min_chunk("float32", 500) == plan.GPU_MIN_CHUNK["float32"]
    ids = eng.encode(text8_test[:40_000]).astype(np.int32)
    chunks = plan.chunks([len(ids)], "cuda", dtype="float32", forget_chars=bound)
    assert len(ids) // chunks[0] >= bound and chunks[0] == len(ids) // 1280
    p64 = eng.params.astype(np.float64)
    bits, _, rep, div = score_texts_chunked(
        Plan(Kernel.TORCH, eng.stream_model(), tuple(chunks), TorchStreams("cpu", "float32"),
             rtol=plan.rtol("float32"), fallback=eng.chunk_fallback()), [ids], p64.h0[None])
    bits_ref, _ = score_ref(p64, ids.astype(np.int64), p64.h0)
    assert not div and rep.fallback_chunks == 0
    t = isan_float32_tolerance(p64.W, p64.b, p64.W_ro, p64.b_ro, p64.h0, ids[:10_000], samples=4).for_chars(len(ids))
    assert abs(bits[0].sum() - bits_ref.sum()) <= t.total_bits


def test_a_call_that_fails_midway_leaves_the_runner_working(model, default_engine, test_ids, monkeypatch):
    """A product that fails in the middle of a call (the device out of memory, say) raises out of
    the runner; the same runner then scores as before, and the rows and bits it was given were not
    half written."""
    runner = TorchStreams("cpu", block=8)
    start, length = np.array([0, 500], np.int64), np.array([300, 400], np.int64)
    _, good, _ = rows_run(runner, model, test_ids, start, length, default_engine.params.h0)
    real_mm, calls = torch.mm, {"n": 0}

    def failing_mm(*a, **k):
        calls["n"] += 1
        if calls["n"] == 40:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real_mm(*a, **k)

    monkeypatch.setattr(torch, "mm", failing_mm)
    H = model.rows(np.tile(default_engine.params.h0, (2, 1)))
    H_before, bits = H.copy(), np.zeros(len(test_ids))
    with pytest.raises(RuntimeError, match="simulated"):
        runner(model, test_ids, start, length, H, bits)
    np.testing.assert_array_equal(H, H_before)  # the contract's arrays are written at the end only
    assert not bits.any()
    monkeypatch.setattr(torch, "mm", real_mm)
    for _ in range(2):
        _, again, _ = rows_run(runner, model, test_ids, start, length, default_engine.params.h0)
        np.testing.assert_array_equal(again, good)


# Issue 46 item 5: a step that cannot be had is an error, or with "auto" a logged, described choice;
# TF32 held per call through a lock, never by an unguarded flip of torch's process-wide setting.

#: what importing Triton raises where it cannot run (streams.TRITON_IMPORT_ERRORS)
TRITON_FAILURES = [ImportError("No module named 'triton'"), OSError("libcuda.so.1: cannot open shared object file"),
                   RuntimeError("0 active drivers ([]). There should only be one."),
                   AttributeError("module 'triton' has no attribute 'language'"),
                   TypeError("autotune() got an unexpected keyword argument 'key'")]


def test_the_auto_step_is_a_described_choice():
    from isan.engine.kernels.torch import streams

    for runner, why in ((TorchStreams("cpu"), "auto: the CPU device"), (TorchStreams("cpu", "float64"), "auto: the CPU"),
                        (TorchStreams("cpu", step="mm"), "asked for"),
                        (TorchStreams("cuda", "float64"), "auto: float64")):  # a device object: nothing runs on it
        assert runner.step == "mm" and runner.step_reason.startswith(why), runner.step_reason
        assert runner.describe() == {"step": "mm", "step_reason": runner.step_reason}
    assert set(streams.TRITON_IMPORT_ERRORS) == {type(e) for e in TRITON_FAILURES}


@pytest.mark.parametrize("error", TRITON_FAILURES, ids=lambda e: type(e).__name__)
def test_a_gpu_without_triton_is_never_a_silent_choice(monkeypatch, caplog, error):
    """Where Triton cannot be imported (whatever its import raises): ``step="triton"`` is an error
    that says what it raised; ``"auto"`` on a GPU runs ``"mm"`` with a warning in the log, and
    describe() says which step runs and why. (A device object of CUDA: nothing runs on it.)"""
    import logging

    from isan.engine.kernels.torch import streams

    def broken():
        raise error

    monkeypatch.setattr(streams, "_import_triton_step", broken)
    with pytest.raises(ValueError, match=f"step 'triton' needs Triton.*{type(error).__name__}"):
        TorchStreams("cuda", step="triton")
    with caplog.at_level(logging.INFO, logger=streams.__name__):
        runner = TorchStreams("cuda")
    assert runner.step == "mm" and runner._grouped is None
    d = runner.describe()
    assert d["step"] == "mm" and d["step_reason"].startswith("auto: Triton cannot be imported")
    assert type(error).__name__ in d["step_reason"] and str(error) in d["step_reason"]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "step 'auto' runs 'mm'" in warned[0].getMessage()


def test_a_gpu_with_triton_missing_for_real(monkeypatch, caplog):
    """The real import, with Triton absent (None in sys.modules): the same described fall back."""
    import logging
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "isan.engine.kernels.torch.grouped", raising=False)
    with caplog.at_level(logging.WARNING):
        runner = TorchStreams("cuda")
    assert runner.describe()["step_reason"].startswith("auto: Triton cannot be imported (ModuleNotFoundError")
    assert any("runs 'mm'" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="needs Triton"):
        TorchStreams("cuda", step="triton")


def test_the_auto_step_says_when_the_interpreter_is_on(monkeypatch, caplog):
    import logging
    from types import SimpleNamespace

    from isan.engine.kernels.torch import streams

    monkeypatch.setattr(streams, "_import_triton_step", lambda: SimpleNamespace(interpreted=lambda: True))
    with caplog.at_level(logging.WARNING):
        runner = TorchStreams("cuda")
    assert runner.step == "mm" and "interpreter" in runner.step_reason and caplog.records


@pytest.fixture
def torch_tf32_setting():
    """torch's cuBLAS setting as this test found it (new API), restored after."""
    m = torch.backends.cuda.matmul
    saved = m.fp32_precision
    yield m
    m.fp32_precision = saved


def _count_writes(monkeypatch) -> dict:
    """Count every write of torch's TF32 settings (both APIs)."""
    writes = {"n": 0}
    for name in ("_set_cublas_allow_tf32", "_set_fp32_precision_setter", "_set_float32_matmul_precision"):
        real = getattr(torch._C, name)

        def counted(*a, _real=real, **k):
            writes["n"] += 1
            return _real(*a, **k)

        monkeypatch.setattr(torch._C, name, counted)
    return writes


def test_a_call_never_writes_torchs_tf32_setting_where_it_need_not(model, default_engine, test_ids, monkeypatch):
    """On the CPU device (TF32 is a CUDA setting) and in float64 a call writes none of torch's
    process-wide settings; a call that holds IEEE (float32 on CUDA) writes none where the process
    already runs IEEE (the default). (The runner whose ``_holds_tf32`` is forced runs on the CPU
    device the code a CUDA float32 call runs.)"""
    from isan.engine.kernels.torch.precision import tf32_enabled

    assert not tf32_enabled()
    start, length = np.array([0, 500], np.int64), np.array([300, 400], np.int64)
    writes = _count_writes(monkeypatch)
    held = TorchStreams("cpu")
    held._holds_tf32 = True
    for runner in (TorchStreams("cpu"), TorchStreams("cpu", "float64"), held):
        rows_run(runner, model, test_ids, start, length, default_engine.params.h0)
    assert writes["n"] == 0
    assert not TorchStreams("cuda", "float64")._holds_tf32 and TorchStreams("cuda", step="mm")._holds_tf32


def test_two_threads_each_see_their_own_tf32_setting(model, default_engine, test_ids, monkeypatch,
                                                     torch_tf32_setting):
    """The process allows TF32 (torch's new API). A runner's calls on one thread (float32 on CUDA:
    here the same code on the CPU device) see IEEE in every product, a second thread asking TF32
    (``matmul_tf32(True)``) sees TF32 throughout its block, the two interleave, and afterwards the
    process's setting is what it was: exactly, through the API it used. A call that fails midway
    releases the lock."""
    import threading
    import time

    from isan.engine.kernels.torch import precision
    from isan.engine.kernels.torch.precision import matmul_tf32, tf32_enabled

    torch_tf32_setting.fp32_precision = "tf32"
    runner = TorchStreams("cpu", block=16)
    runner._holds_tf32 = True
    seen = {"runner": [], "tf32": []}
    real_mm = torch.mm

    def watching_mm(*a, **k):  # the runner's per-symbol products (step "mm")
        if threading.current_thread().name == "runner":
            seen["runner"].append(tf32_enabled())
        return real_mm(*a, **k)

    monkeypatch.setattr(torch, "mm", watching_mm)
    start, length = np.array([0, 500], np.int64), np.array([200, 100], np.int64)
    go = threading.Barrier(2)
    errors = []

    def run_rows():
        try:
            go.wait()
            for _ in range(3):
                rows_run(runner, model, test_ids, start, length, default_engine.params.h0)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    def ask_tf32():
        try:
            go.wait()
            for _ in range(6):
                with matmul_tf32(True):
                    for _ in range(3):
                        seen["tf32"].append(tf32_enabled())
                        time.sleep(0.002)
                time.sleep(0.001)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run_rows, name="runner"), threading.Thread(target=ask_tf32, name="tf32")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert seen["runner"] and not any(seen["runner"])  # IEEE in every product of every call
    assert seen["tf32"] and all(seen["tf32"])
    assert tf32_enabled() and torch_tf32_setting.fp32_precision == "tf32"  # restored as the process set it
    # a call that fails midway holds nothing after
    monkeypatch.setattr(torch, "mm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("simulated")))
    with pytest.raises(RuntimeError, match="simulated"):
        rows_run(runner, model, test_ids, start, length, default_engine.params.h0)
    assert precision._LOCK._mode is None and precision._LOCK._holders == 0
    assert tf32_enabled() and torch_tf32_setting.fp32_precision == "tf32"
    with matmul_tf32(False), pytest.raises(RuntimeError, match="deadlock"):
        with matmul_tf32(True):
            pass


@gpu
@pytest.mark.skipif(not CUDA, reason="no CUDA GPU")
def test_a_process_that_allows_tf32_still_gets_ieee_products_on_cuda(model, default_engine, test_ids,
                                                                     torch_tf32_setting):
    """On CUDA with the process allowing TF32: the float32 runner's bits equal those of a process
    that does not (TF32 would err by about 1e-3), and the setting is as the process left it."""
    start, length = np.array([0, 500], np.int64), np.array([3000, 2000], np.int64)
    h0 = default_engine.params.h0
    _, want, _ = rows_run(TorchStreams("cuda", step="mm"), model, test_ids, start, length, h0)
    torch_tf32_setting.fp32_precision = "tf32"
    _, got, _ = rows_run(TorchStreams("cuda", step="mm"), model, test_ids, start, length, h0)
    np.testing.assert_array_equal(got, want)
    assert torch_tf32_setting.fp32_precision == "tf32"
