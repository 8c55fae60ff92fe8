"""The Engine on every kernel backend (issue 35): the same API and the same results, within each
backend's stated tolerance of the float64 reference, on real text.

Backends: ``native`` (the compiled kernels), ``numpy`` (their twins), ``torch`` on the CPU device
in float32 and float64 (CI has no GPU) and, marked ``gpu``, on CUDA. Tolerances against the
float64 reference: float32 per-character bits 1e-4 and totals 1e-6 relative; float64 1e-9 and
1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest

from isan.engine import Engine
from isan.errors import StateDivergedError

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
on_gpu = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]
CONFIGS = [
    pytest.param(("native", "cpu", "float32"), id="native"),
    pytest.param(("numpy", "cpu", "float32"), id="numpy"),
    pytest.param(("torch", "cpu", "float32"), id="torch-cpu-f32"),
    pytest.param(("torch", "cpu", "float64"), id="torch-cpu-f64"),
    pytest.param(("torch", "cuda", "float32"), id="torch-cuda-f32", marks=on_gpu),
    pytest.param(("torch", "cuda", "float64"), id="torch-cuda-f64", marks=on_gpu),
]
TOL = {"float32": (1e-4, 1e-6), "float64": (1e-9, 1e-12)}  # per character, total (relative)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=CONFIGS)
def engine(request):
    name, device, dtype = request.param
    return Engine.default(path_mode="chunked", kernels=name, device=device, dtype=dtype)


@pytest.fixture(scope="module")
def reference(default_engine):
    return default_engine.with_path("reference")


def close(got, want, dtype, per_char=None):
    atol, rtol = TOL[dtype]
    assert abs(got.bits - want.bits) <= rtol * want.bits
    if per_char is not None:
        np.testing.assert_allclose(got.per_char_bits, want.per_char_bits, atol=atol, rtol=0)


def test_a_long_text_equals_the_reference(engine, reference, text8_test):
    text = text8_test[:30_000]
    got = engine.score(text, per_char=True, threads=2)
    want = reference.score(text, per_char=True)
    assert got.scoring["chunks"] > 1  # it went chunk-parallel
    if engine.kernels.name != "native":
        assert got.scoring["backend"] == engine.kernels.name and got.scoring["device"] == engine.device
    close(got, want, engine.kernels.dtype, per_char=True)
    np.testing.assert_allclose(got.state.h, want.state.h, atol=1e-3 if engine.kernels.dtype == "float32" else 1e-9)


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
    assert abs(r2.state.bits - whole.bits) <= TOL[engine.kernels.dtype][1] * whole.bits * 10
    h = engine.advance(a).h
    np.testing.assert_allclose(h, reference.advance(a).h, atol=1e-3 if engine.kernels.dtype == "float32" else 1e-9)


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


def test_corpus_scoring_on_the_torch_backend(tmp_path, text8_test):
    """`isan corpus score --dtype float64` runs the torch backend (here on the CPU device): the job
    records its kernel, its bits equal the CPU kernels' within float32 tolerance, and resuming the
    job with the other kernel is refused."""
    import json

    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from isan.cli import main

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "text": text8_test[i * 700 : i * 700 + 300 + 97 * i]}) + "\n"
                            for i in range(6)))
    out = {}
    for dtype in ("float32", "float64"):
        r = CliRunner().invoke(main, ["corpus", "score", str(docs), "--out", str(tmp_path / dtype), "--dtype", dtype,
                                      "--no-progress", "--json"])
        assert r.exit_code == 0, r.output
        job = json.loads((tmp_path / dtype / "job.json").read_text())
        assert job["kernel"] == ("torch-cpu-float64" if dtype == "float64" else "jumps")
        t = pq.read_table(sorted((tmp_path / dtype / "shards").glob("*.parquet"))[0]).to_pydict()
        out[dtype] = dict(zip(t["id"], t["bits"]))
    assert out["float32"].keys() == out["float64"].keys()
    for k, bits in out["float64"].items():
        assert abs(bits - out["float32"][k]) <= 1e-6 * bits
    r = CliRunner().invoke(main, ["corpus", "score", str(docs), "--out", str(tmp_path / "float64"), "--no-progress"])
    assert r.exit_code == 2 and "torch-cpu-float64" in r.output


def test_the_cli_never_ignores_a_device(text8_test):
    """`isan score --dtype float64` runs the torch backend and says so; `--device cuda` without a GPU
    (or without torch) is a one-line error, exit 2, never a silent CPU run."""
    import json

    from click.testing import CliRunner

    from isan.cli import main

    text = text8_test[:2_000]
    cpu = json.loads(CliRunner().invoke(main, ["score", "--json", "-"], input=text).output)
    r = CliRunner().invoke(main, ["score", "--json", "--dtype", "float64", "-"], input=text)
    f64 = json.loads(r.output)
    assert f64["scoring"]["backend"] == "torch" and f64["scoring"]["dtype"] == "float64"
    assert abs(f64["bits"] - cpu["bits"]) <= 1e-6 * cpu["bits"]
    if not CUDA:
        for cmd in (["score", "--device", "cuda", "-"], ["sample", "--device", "cuda", "-n", "3"]):
            r = CliRunner().invoke(main, cmd, input=text)
            assert r.exit_code == 2 and "cuda" in r.output and "Traceback" not in r.output, r.output


def test_bench_gpu_quick_run_on_the_cpu_device(text8_path):
    """`isan bench gpu --quick --device cpu`: the benchmark runs where there is no GPU (the torch
    backend on the CPU device), records its command, machine and device, and its exactness facts
    are what the tests above promise."""
    from isan.bench.gpu import QUICK_SIZES, bench_gpu, markdown

    r = bench_gpu(None, text8_path, device="cpu", repeats=1, sizes=QUICK_SIZES, log=lambda m: None)
    names = [row["name"] for row in r["rows"]]
    # the CPU kernels' two rows, then three for each dtype (documents, steps only, long text)
    assert len(names) == 8 and names[0].startswith("CPU compiled kernels") and r["gpu"]["device"] == "cpu"
    assert all(row["chars_per_s"] > 0 and row["chars"] > 0 for row in r["rows"])
    f = r["facts"]
    assert "errors" not in f
    assert f["docs float64 step mm: max rel vs the float64 reference (8 docs)"] <= 1e-12
    assert f["docs float32 step mm: max rel vs float64 step mm"] <= 1e-6
    assert f["long text float32 step mm: rel vs float64"] <= 1e-6 and f["long text float64 step mm"]["bits_rel_vs_cpu"] <= 1e-6
    md = markdown(r)
    assert md.startswith("Machine:") and "docs float64 step mm: max rel vs the float64 reference" in md
    assert md.count("\n| ") >= 14


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
    from isan.engine.runners import onnx as onnx_runner
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
