"""The Engine, the corpus scorer and the CLI on the torch backend (here on the CPU device; the
kernels themselves: tests/test_torch_backend.py; without torch: tests/test_backends.py). A float64
total against a float32 one: within the float32 path's derived tolerance of that text's total
(tests/tolerances.py), the float64 side's own added."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tolerances import U64, isan_float32_tolerance  # noqa: E402

CUDA = torch.cuda.is_available()


def total_tolerance(text: str) -> float:
    """Between a float32 and a float64 total of ``text`` scored by the default model from its initial state:
    the float32 one's derived tolerance (four samples) plus the float64 one's (``in_precision(U64)``)."""
    from isan.engine import Engine

    eng = Engine.default()
    p = eng.params.astype(np.float64)
    t = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, eng.encode(text), samples=4)
    return t.total_bits + t.in_precision(U64).total_bits


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_corpus_scoring_on_the_torch_backend(tmp_path, text8_test):
    """`isan corpus score --dtype float64` runs the torch backend (here on the CPU device): the job
    records its kernel, its bits equal the CPU kernels' within the derived tolerance of a total (and
    the float64 side's own), and resuming the job with the other kernel is refused."""
    import json

    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from isan.cli import main

    docs = tmp_path / "docs.jsonl"
    texts = [text8_test[i * 700 : i * 700 + 300 + 97 * i] for i in range(6)]
    docs.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
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
        assert abs(bits - out["float32"][k]) <= total_tolerance(texts[int(k)])
    r = CliRunner().invoke(main, ["corpus", "score", str(docs), "--out", str(tmp_path / "float64"), "--no-progress"])
    assert r.exit_code == 2 and "torch-cpu-float64" in r.output


def test_the_cli_never_ignores_a_device(text8_test):
    """`isan score --dtype float64` runs the torch backend and says so (within the derived tolerance of
    the float32 total and its own); `--device cuda` without a GPU
    (or without torch) is a one-line error, exit 2, never a silent CPU run."""
    import json

    from click.testing import CliRunner

    from isan.cli import main

    text = text8_test[:2_000]
    cpu = json.loads(CliRunner().invoke(main, ["score", "--json", "-"], input=text).output)
    r = CliRunner().invoke(main, ["score", "--json", "--dtype", "float64", "-"], input=text)
    f64 = json.loads(r.output)
    assert f64["scoring"]["backend"] == "torch" and f64["scoring"]["dtype"] == "float64"
    assert abs(f64["bits"] - cpu["bits"]) <= total_tolerance(text)
    if not CUDA:
        for cmd in (["score", "--device", "cuda", "-"], ["sample", "--device", "cuda", "-n", "3"]):
            r = CliRunner().invoke(main, cmd, input=text)
            assert r.exit_code == 2 and "cuda" in r.output and "Traceback" not in r.output, r.output
