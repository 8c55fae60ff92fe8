"""One meaning a word: the *runtime* scores (numpy or onnx: ``runtime=``, ``--runtime``), the *kernel
backend* advances the state rows (native, numpy, torch: ``Engine.kernels``), the *executor* runs a corpus
job (local or ray: ``executor=``, ``--executor``) and a *runner* is a kernel. The old spellings
(``backend=``/``--backend`` for the runtime, ``runner=``/``--runner`` for the executor) still work for a
release: the keywords warn (DeprecationWarning), the options print one line on stderr, and both
spellings at once are an error."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from isan.engine import Engine, default_model_path, load_engine
from isan.errors import IsanError
from tolerances import bundle_float32_tolerance

TEXT = "the cat sat on the mat and the dog ate the bone"


def run(cmd: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *cmd], input=input, capture_output=True, text=True, timeout=300)


def isan(*args, input: str | None = None) -> subprocess.CompletedProcess:
    return run(["isan.cli", *map(str, args)], input=input)


def deprecation_line(stderr: str, old: str, new: str) -> None:
    """One line on stderr says that ``old`` is deprecated and names ``new``; no traceback."""
    lines = [line for line in stderr.splitlines() if "deprecated" in line]
    assert len(lines) == 1 and old in lines[0] and new in lines[0], stderr
    assert "Traceback" not in stderr


# ---- the runtime ------------------------------------------------------------------------------------------
def test_load_engine_takes_the_runtime_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new keyword warns of nothing
        e = load_engine(runtime="numpy")
    assert isinstance(e, Engine) and e.runtime == "numpy" and e.describe()["backend"] == "numpy"
    assert e.score(TEXT).bits == load_engine().score(TEXT).bits


def test_backend_keyword_warns_and_still_loads_the_same_runtime():
    with pytest.warns(DeprecationWarning, match="use runtime="):
        e = load_engine(backend="numpy")
    assert e.runtime == "numpy" and e.score(TEXT).bits == load_engine(runtime="numpy").score(TEXT).bits


def test_runtime_and_backend_together_are_an_error():
    with pytest.raises(IsanError, match="not both"):
        load_engine(runtime="numpy", backend="numpy")
    with pytest.raises(IsanError, match="runtime must be numpy or onnx"):
        load_engine(runtime="torch")  # a kernel backend is not a runtime


def test_isan_score_backend_still_works_with_a_one_line_notice():
    new = isan("score", "--runtime", "numpy", "--json", "-", input=TEXT)
    old = isan("score", "--backend", "numpy", "--json", "-", input=TEXT)
    assert new.returncode == old.returncode == 0 and "deprecated" not in new.stderr
    assert json.loads(old.stdout) == json.loads(new.stdout)  # the JSON is unchanged
    deprecation_line(old.stderr, "--backend", "--runtime")
    both = isan("score", "--backend", "numpy", "--runtime", "numpy", "-", input=TEXT)
    assert both.returncode == 2 and "not both" in both.stderr and "Traceback" not in both.stderr
    assert "--backend" not in isan("score", "--help").stdout  # hidden: --runtime is the one shown


def test_isan_score_runtime_onnx_on_the_default_model():
    """The shipped model's ONNX graphs (built into the user cache on first use) under onnxruntime, within
    twice the derived float32 tolerance of the numpy runtime (as tests/test_cli.py holds them)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    tol = bundle_float32_tolerance(default_model_path(), Engine.default().encode(TEXT))[0].twice().total_bits
    numpy_json = json.loads(isan("score", "--json", "-", input=TEXT).stdout)
    r = isan("score", "--runtime", "onnx", "--json", "-", input=TEXT)
    assert r.returncode == 0, r.stderr
    onnx_json = json.loads(r.stdout)
    assert onnx_json["scoring"]["backend"] == "onnx"  # the JSON's key is unchanged
    assert onnx_json["chars"] == numpy_json["chars"] and abs(onnx_json["bits"] - numpy_json["bits"]) <= tol
    old = isan("score", "--backend", "onnx", "--json", "-", input=TEXT)
    deprecation_line(old.stderr, "--backend", "--runtime")
    assert json.loads(old.stdout)["scoring"] == onnx_json["scoring"]


def test_isan_sample_asks_the_default_rule_for_the_torch_backend():
    r = isan("sample", "-n", "5", "--seed", "1", "--dtype", "float64")
    assert r.returncode == 2 and "--dtype float64 is for scoring" in r.stderr
    old = isan("sample", "-n", "5", "--seed", "1", "--backend", "numpy")
    assert old.returncode == 0 and old.stdout == isan("sample", "-n", "5", "--seed", "1").stdout
    deprecation_line(old.stderr, "--backend", "--runtime")


def test_isan_serve_takes_runtime_and_the_deprecated_backend(tmp_path):
    """Both spellings are parsed before anything is loaded: the old one says so on one line; both at
    once are a usage error (exit 2). A missing bundle then ends the command before it listens."""
    pytest.importorskip("uvicorn")
    from isan.engine.serve.config import ServeConfig
    from isan.engine.serve.workers import WorkerSpec

    missing = str(tmp_path / "nope")
    both = run(["isan.engine.serve", "--runtime", "numpy", "--backend", "numpy", "--model", missing])
    assert both.returncode == 2 and "not both" in both.stderr and "Traceback" not in both.stderr
    old = run(["isan.engine.serve", "--backend", "onnx", "--model", missing])
    assert old.returncode != 0 and "does not exist" in old.stderr
    deprecation_line(old.stderr, "--backend", "--runtime")
    new = run(["isan.engine.serve", "--runtime", "onnx", "--model", missing])
    assert new.returncode != 0 and "deprecated" not in new.stderr
    assert WorkerSpec(None, "auto", "onnx", "cpu", ServeConfig()).runtime == "onnx"


# ---- the executor -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def jsonl(tmp_path_factory, text8_valid_head):
    pytest.importorskip("pyarrow")
    d = tmp_path_factory.mktemp("words")
    with open(d / "docs.jsonl", "w") as f:
        for i in range(12):
            f.write(json.dumps({"id": i, "text": text8_valid_head[i * 400:(i + 1) * 400 - 7 * i]}) + "\n")
    return d / "docs.jsonl"


def test_score_corpus_executor_and_the_deprecated_runner_write_the_same(jsonl, tmp_path):
    from isan.corpus import read_output, score_corpus

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = score_corpus([str(jsonl)], tmp_path / "new", executor="local", progress=False, part_docs=5)
    with pytest.warns(DeprecationWarning, match="use executor="):
        old = score_corpus([str(jsonl)], tmp_path / "old", runner="local", progress=False, part_docs=5)
    assert new["this_run"]["runner"] == old["this_run"]["runner"] == "local"  # the summary's key is unchanged
    assert (new["documents"], new["bits"]) == (old["documents"], old["bits"]) and new["documents"] == 12
    assert read_output(tmp_path / "new").equals(read_output(tmp_path / "old"))
    with pytest.raises(IsanError, match="not both"):
        score_corpus([str(jsonl)], tmp_path / "both", executor="local", runner="local", progress=False)
    with pytest.raises(IsanError, match="executor must be local or ray"):
        score_corpus([str(jsonl)], tmp_path / "bad", executor="native", progress=False)


def test_isan_corpus_score_runner_still_works(jsonl, tmp_path):
    new = isan("corpus", "score", jsonl, "--out", tmp_path / "new", "--executor", "local", "--no-progress", "--json")
    old = isan("corpus", "score", jsonl, "--out", tmp_path / "old", "--runner", "local", "--no-progress", "--json")
    assert new.returncode == old.returncode == 0, old.stderr
    deprecation_line(old.stderr, "--runner", "--executor")
    a, b = json.loads(new.stdout), json.loads(old.stdout)
    assert a["bits"] == b["bits"] and a["this_run"]["runner"] == b["this_run"]["runner"] == "local"
    both = isan("corpus", "score", jsonl, "--out", tmp_path / "both", "--runner", "local", "--executor", "local")
    assert both.returncode == 2 and "not both" in both.stderr and "Traceback" not in both.stderr
    assert "--runner" not in isan("corpus", "score", "--help").stdout


# ---- one default rule, one backend object ---------------------------------------------------------------
def test_the_corpus_engine_keeps_the_engines_backend_object(default_engine):
    from isan.engine.corpus.scoring import LONG_DOC_THREADS, corpus_engine

    e = corpus_engine(default_engine)
    assert e.kernels is default_engine.kernels and e.threads == LONG_DOC_THREADS and e.path == "jumps"


def test_a_ray_jobs_kernel_is_the_torch_backends_rounding():
    """The driver names the kernel its actors record without their device (or torch): the torch
    backend's ``rounding``, as ``Backend.rounding`` says it."""
    from isan.engine.corpus.job import actors_rounding
    from isan.engine.corpus.workers import plan_workers
    from isan.engine.kernels import default_threads

    assert actors_rounding("cuda:1", "float32") == "torch-cuda-float32"
    assert actors_rounding("cpu", "float64") == "torch-cpu-float64"
    assert plan_workers(None, None, 10**9, device="cpu", dtype="float64") == (1, default_threads())
