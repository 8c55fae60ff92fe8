"""The Engine on every kernel backend (issue 35): the same API and the same results, within each
backend's stated tolerance of the float64 reference, on real text.

Backends: ``native`` (the compiled kernels), ``numpy`` (their twins), ``torch`` on the CPU device
in float32 and float64 (CI has no GPU) and, marked ``gpu``, on CUDA. Tolerances against the
float64 reference: float32's derived from the computation for the default model on the text8 test
split (tests/tolerances.py); float64 1e-9 per character and 1e-12 of the total.

torch is optional here: the native-vs-numpy parity runs without it (only the torch configurations
skip; tests/test_torch_optional.py runs this module with torch blocked), and the tests that need
torch whatever the backend (corpus scoring, the CLI and the benchmark on the torch backend) live in
tests/test_torch_backend.py and tests/test_torch_engine.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from isan.engine import Engine
from isan.errors import StateDivergedError
from tolerances import default_model_tolerance

try:
    import torch
except ImportError:  # the torch configurations skip; native and numpy run
    torch = None

CUDA = torch is not None and torch.cuda.is_available()
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install '.[gpu]')")
on_gpu = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]
CONFIGS = [
    pytest.param(("native", "cpu", "float32"), id="native"),
    pytest.param(("numpy", "cpu", "float32"), id="numpy"),
    pytest.param(("torch", "cpu", "float32"), id="torch-cpu-f32", marks=needs_torch),
    pytest.param(("torch", "cpu", "float64"), id="torch-cpu-f64", marks=needs_torch),
    pytest.param(("torch", "cuda", "float32"), id="torch-cuda-f32", marks=[needs_torch, *on_gpu]),
    pytest.param(("torch", "cuda", "float64"), id="torch-cuda-f64", marks=[needs_torch, *on_gpu]),
]
#: float64 tolerances: per character (bits), total (relative), state; float32's are derived from the computation
TOL64 = (1e-9, 1e-12, 1e-9)


def tol(dtype: str, chars: int) -> tuple[float, float, float]:
    """(bits per character, total bits, state), absolute, against the float64 reference: float32's derived
    for the default model on the text8 test split (tests/tolerances.py), float64's TOL64."""
    if dtype == "float64":
        return TOL64[0], TOL64[1] * 2 * chars, TOL64[2]
    t = default_model_tolerance()
    return t.bits, t.total(chars), t.state


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(request):
    """One torch thread for the module where torch is installed (conftest's ``one_torch_thread``,
    which skips without torch: here the native and numpy tests must run without it)."""
    if torch is not None:
        request.getfixturevalue("one_torch_thread")


@pytest.fixture(scope="module", params=CONFIGS)
def engine(request):
    name, device, dtype = request.param
    return Engine.default(path_mode="chunked", kernels=name, device=device, dtype=dtype)


@pytest.fixture(scope="module")
def reference(default_engine):
    return default_engine.with_path("reference")


def close(got, want, dtype, per_char=None):
    bits, total, _ = tol(dtype, want.chars)
    assert abs(got.bits - want.bits) <= total
    if per_char is not None:
        np.testing.assert_allclose(got.per_char_bits, want.per_char_bits, atol=bits, rtol=0)


def test_a_long_text_equals_the_reference(engine, reference, text8_test):
    text = text8_test[:30_000]
    got = engine.score(text, per_char=True, threads=2)
    want = reference.score(text, per_char=True)
    assert got.scoring["chunks"] > 1  # it went chunk-parallel
    if engine.kernels.name != "native":
        assert got.scoring["backend"] == engine.kernels.name and got.scoring["device"] == engine.device
    close(got, want, engine.kernels.dtype, per_char=True)
    np.testing.assert_allclose(got.state.h, want.state.h, atol=tol(engine.kernels.dtype, len(text))[2])


def test_a_batch_of_mixed_lengths_equals_the_reference(engine, reference, text8_test):
    texts = [text8_test[i * 997 : i * 997 + n] for i, n in enumerate([1, 7, 2_500, 40, 9_000, 333])]
    got = engine.score_batch(texts, per_char=True)
    for g, t in zip(got, texts):
        close(g, reference.score(t, per_char=True), engine.kernels.dtype, per_char=True)


def test_streaming_and_advance_equal_the_whole(engine, reference, text8_test):
    a, b = text8_test[:12_345], text8_test[12_345:15_000]
    r1 = engine.score(a)
    r2 = engine.score(b, state=r1.state)
    whole = reference.score(a + b)
    _, total, state = tol(engine.kernels.dtype, whole.chars)
    assert abs(r2.state.bits - whole.bits) <= total
    h = engine.advance(a).h
    np.testing.assert_allclose(h, reference.advance(a).h, atol=state)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_diverging_text_raises_then_good_calls_work(config, text8_test):
    """The unconstrained model's state overflows on a run of 'z': every backend raises the same
    StateDivergedError at the same offset, and the same engine then scores good text as before."""
    from tests.conftest import UNCONSTRAINED

    name, device, dtype = config
    eng = Engine.load(UNCONSTRAINED, path_mode="chunked", progress_bar=False, kernels=name, device=device, dtype=dtype)
    good = text8_test[:12_000]
    first = eng.score(good).bits
    bad = text8_test[:11_000] + "z" * 300 + text8_test[:2_000]
    with pytest.raises(StateDivergedError) as e:
        eng.score(bad)
    with pytest.raises(StateDivergedError) as e_ref:
        Engine.load(UNCONSTRAINED, path_mode="reference", progress_bar=False).score(bad)
    assert e.value.offset == e_ref.value.offset
    with pytest.raises(StateDivergedError, match="text 1 of the batch"):
        eng.score_batch([good[:500], bad])
    assert eng.score(good).bits == first


def test_the_gpu_check_script_is_valid_bash():
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "isan" / "bench" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_onnx_provider_selection(monkeypatch):
    """`--backend onnx --device cuda|auto`: onnxruntime's CUDA provider where it exists (the CPU
    provider after it, for the nodes CUDA lacks), the CPU provider for device cpu, an error (never
    a silent CPU run) for cuda where there is none; auto falls back to the CPU provider."""
    ort = pytest.importorskip("onnxruntime")
    from isan.engine.baselines import onnx as onnx_runner
    from isan.errors import BackendUnavailableError, IsanError

    cuda, cpu = "CUDAExecutionProvider", "CPUExecutionProvider"
    monkeypatch.setattr(ort, "get_available_providers", lambda: [cuda, cpu])
    assert onnx_runner._providers("cuda") == [cuda, cpu] and onnx_runner._providers("auto") == [cuda, cpu]
    assert onnx_runner._providers("cpu") == [cpu]
    monkeypatch.setattr(ort, "get_available_providers", lambda: [cpu])
    assert onnx_runner._providers("auto") == [cpu]
    with pytest.raises(BackendUnavailableError, match="onnxruntime-gpu"):
        onnx_runner._providers("cuda")
    with pytest.raises(IsanError, match="device must be"):
        onnx_runner._providers("tpu")
