"""The `isan` CLI end to end, as a user runs it (subprocesses), on real text."""

import json
import subprocess
import sys

import numpy as np
import pytest

from isan.engine import Engine, default_model_path
from tolerances import bundle_float32_tolerance, float64_sums_tolerance


def isan(*args, input=None, check=True):
    r = subprocess.run([sys.executable, "-m", "isan.cli", *map(str, args)], input=input, capture_output=True,
                       text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"isan {args} failed ({r.returncode}):\n{r.stderr}")
    return r


def test_help_for_every_command():
    for cmd in ["score", "sample", "attribute", "export", "train"]:
        assert "Usage" in isan(cmd, "--help").stdout


def test_score_json_matches_library(small_bundle, text8_valid_head, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(text8_valid_head[:3000])
    out = json.loads(isan("score", "--model", small_bundle, "--json", f).stdout)
    lib = Engine.load(small_bundle).score(text8_valid_head[:3000])
    assert out["chars"] == 3000 and set(out) == {"chars", "bits", "bpc", "nnl", "normalization", "scoring"}
    assert out["nnl"] == pytest.approx(out["bpc"] / np.log2(27), rel=1e-12)  # base-|A| log-likelihood (eq. 7)
    assert out["normalization"]["normalizer"] == "none-v1" and out["normalization"]["chars_read"] == 3000
    assert out["bits"] == pytest.approx(lib.bits, rel=1e-12)
    per = json.loads(isan("score", "--model", small_bundle, "--json", "--per-char", "-", input=text8_valid_head[:50]).stdout)
    assert len(per["per_char_bits"]) == 50  # the total is their float64 sum, in another order
    assert abs(sum(per["per_char_bits"]) - per["bits"]) <= float64_sums_tolerance(50, per["bits"])


def test_score_text8_split(small_bundle, text8_path, text8_test):
    out = json.loads(isan("score", "--model", small_bundle, "--json", "--text8-split", "test", text8_path).stdout)
    assert out["chars"] == 500_000 == len(text8_test)


def test_bad_input_gives_one_line_errors(small_bundle, tmp_path):
    r = isan("score", "--model", small_bundle, "-", input="Hello", check=False)
    assert r.returncode == 2 and "'H'" in r.stderr and "offset 0" in r.stderr and "Traceback" not in r.stderr
    r = isan("score", "--model", small_bundle, "-", input="", check=False)
    assert r.returncode == 2 and "empty" in r.stderr and "Traceback" not in r.stderr
    r = isan("score", "--model", tmp_path / "nope", "-", input="abc", check=False)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    r = isan("score", "--model", small_bundle, tmp_path / "missing.txt", check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    bin_file = tmp_path / "bin"
    bin_file.write_bytes(b"\xff\xfe\x00abc")
    r = isan("score", "--model", small_bundle, bin_file, check=False)
    assert r.returncode == 2 and "UTF-8" in r.stderr
    r = isan("score", "--model", small_bundle, "--unknown", "skip", "-", input="Hello world")
    assert "chars  10" in r.stdout  # "ello world"


def test_sample_is_reproducible(small_bundle):
    a = isan("sample", "--model", small_bundle, "--prompt", "annual reve", "-n", 40, "--seed", 3).stdout
    b = isan("sample", "--model", small_bundle, "--prompt", "annual reve", "-n", 40, "--seed", 3).stdout
    assert a == b and a.startswith("annual reve") and len(a.strip("\n")) == 51
    j = json.loads(isan("sample", "--model", small_bundle, "-n", 10, "--seed", 1, "--json", "--top-k", 3).stdout)
    assert len(j["text"]) == 10


def test_attribute_json_and_plot(small_bundle, tmp_path):
    png = tmp_path / "fig.png"
    j = json.loads(isan("attribute", "--model", small_bundle, "--text", "the cat sat", "--by", "word", "--json",
                        "--plot", png).stdout)
    assert j["sources"] == ["<h0>", "the", " ", "cat", " ", "sat"]
    assert len(j["next_char_kappa"]) == 11 and j["check_max_abs_error"] < 1e-9
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    txt = isan("attribute", "--model", small_bundle, "--text", "ab ab", "--by", "char").stdout
    assert "check max" in txt
    r = isan("attribute", "--model", small_bundle, "--text", "", check=False)
    assert r.returncode == 2 and "empty" in r.stderr


def test_train_and_export_cli(tmp_path, text8_path):
    pytest.importorskip("torch")
    run = tmp_path / "run"
    out = json.loads(isan("train", "--out", run, "--data", text8_path, "--d", 8, "--batch-size", 16, "--bptt", 16,
                          "--max-steps", 20, "--eval-every", 0.001, "--no-progress").stdout)
    assert out["steps"] == 20 and out["n_params"] == 27 * 64 + 27 * 8 * 2 + 27 + 8
    b = json.loads(isan("export", run, tmp_path / "bundle", "--no-table").stdout)
    assert b["kind"] == "isan" and "weights.safetensors" in b["files"] and "table" not in b["files"]
    r = isan("export", run, tmp_path / "bundle", check=False)
    assert r.returncode == 2 and "--overwrite" in r.stderr
    r = isan("export", tmp_path / "nothing", tmp_path / "b2", check=False)
    assert r.returncode == 2 and "isan train" in r.stderr


def test_export_builds_a_table_and_score_uses_it(tmp_path, text8_path):
    pytest.importorskip("torch")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text8_path.read_text()[:300_000])
    run = tmp_path / "run"
    isan("train", "--out", run, "--data", corpus, "--dataset", "text", "--d", 8, "--batch-size", 16, "--bptt", 16,
         "--max-steps", 10, "--eval-every", 0.01, "--no-progress")
    plan = json.loads(isan("export", run, tmp_path / "x", "--dry-run", "--table-budget", "1MB").stdout)
    assert plan["entries"] > 27 and plan["bytes"] <= 1 << 20 and plan["expected_avg_match_length"] > 1.2
    assert not (tmp_path / "x").exists()
    b = json.loads(isan("export", run, tmp_path / "bundle", "--table-budget", "1MB", "--no-progress").stdout)
    assert "table" in b["files"] and b["table"]["entries"] == plan["entries"]
    info = json.loads(isan("table", "info", "--model", tmp_path / "bundle", "--json").stdout)
    assert info["entries"] == plan["entries"] and info["dtype"] == "float32"
    assert "avg match" in isan("table", "info", "--model", tmp_path / "bundle").stdout
    text = corpus.read_text()[-5000:]
    comp = json.loads(isan("score", "--model", tmp_path / "bundle", "--json", "-", input=text).stdout)
    ref = json.loads(isan("score", "--model", tmp_path / "bundle", "--json", "--path", "reference", "-", input=text).stdout)
    # the composed float32 path against the float64 reference: within the tolerance derived from the
    # computation (tests/tolerances.py)
    tol = bundle_float32_tolerance(tmp_path / "bundle", Engine.load(tmp_path / "bundle").encode(text))[0]
    assert comp["chars"] == ref["chars"] and abs(comp["bits"] - ref["bits"]) <= tol.total_bits


def test_default_model_uses_its_table():
    from isan.engine import load_engine

    eng = load_engine()
    assert eng.path == "composed" and eng.table.n_entries > 27


def test_default_model_to_onnx_and_back(tmp_path, text8_valid_head):
    pytest.importorskip("onnxruntime")
    out = json.loads(isan("export", "default", tmp_path / "onnx-bundle", "--onnx").stdout)
    assert {"model.onnx", "sequence.onnx"} <= set(out["files"])
    text = text8_valid_head[:2000]
    # onnxruntime's float32 graphs against the engine's float32 path: two float32 computations, within twice
    # the tolerance derived from the computation (tests/tolerances.py)
    tol = bundle_float32_tolerance(default_model_path(), Engine.default().encode(text))[0].twice().total_bits
    a = json.loads(isan("score", "--model", tmp_path / "onnx-bundle", "--backend", "onnx", "--json", "-", input=text).stdout)
    b = json.loads(isan("score", "--json", "-", input=text).stdout)
    assert a["chars"] == b["chars"] == 2000 and abs(a["bits"] - b["bits"]) <= tol
    # the shipped model has no graphs in the package: they are built into the user cache on first use
    c = json.loads(isan("score", "--backend", "onnx", "--json", "-", input=text).stdout)
    assert c["chars"] == 2000 and abs(c["bits"] - b["bits"]) <= tol


def cli(*args, input=None):
    """The CLI in this process (click's runner): (exit code, stdout, stderr)."""
    from click.testing import CliRunner

    from isan.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args], input=input)
    return r.exit_code, r.stdout, r.stderr


def test_verify_takes_the_bundle_as_model_too(small_bundle, tmp_path):
    """`isan verify --model B` is `isan verify B`; both given and different is a usage error."""
    code, out, _ = cli("verify", "--model", small_bundle)
    assert code == 0 and out.splitlines()[-1] == cli("verify", small_bundle)[1].splitlines()[-1]
    assert cli("verify", small_bundle, "--model", small_bundle)[0] == 0
    code, _, err = cli("verify", small_bundle, "--model", tmp_path / "other")
    assert code == 2 and "differ" in err and "Traceback" not in err


def test_greedy_sampling_reports_no_seed(small_bundle):
    """--temperature 0 (and --top-k 1) takes the most likely character each step: nothing is drawn, so the
    JSON's seed is null, no seed line goes to stderr, and a given seed changes nothing."""
    for greedy in (["--temperature", 0], ["--top-k", 1], ["--inverse-temperature", 1000]):
        code, out, _ = cli("sample", "--model", small_bundle, "--prompt", "the ", "-n", 30, "--json", *greedy)
        j = json.loads(out)
        assert code == 0 and j["seed"] is None
        code, text, err = cli("sample", "--model", small_bundle, "--prompt", "the ", "-n", 30, "--seed", 5, *greedy)
        assert code == 0 and "seed" not in err and text.rstrip("\n") == "the " + j["text"]
    code, out, err = cli("sample", "--model", small_bundle, "-n", 30)  # sampled: the drawn seed is reported
    assert code == 0 and err.startswith("seed ")


def test_divergence_error_names_the_model_given():
    """The check the error suggests is run on the bundle the command was given."""
    import shlex

    from isan.cli.helpers import with_model_option
    from isan.engine.paths import paper_model_path

    code, _, err = cli("score", "--model", paper_model_path(), "--path", "reference", "-", input="z" * 40)
    assert code == 2 and "Traceback" not in err
    assert f"`isan model check --model {shlex.quote(str(paper_model_path()))}`" in err
    message = "the model's state diverges; `isan model check` lists the letters"
    assert with_model_option(message, None) == message
    assert with_model_option(message, "my models/b") == \
        "the model's state diverges; `isan model check --model 'my models/b'` lists the letters"
