"""What a new user met on main (issue #45, items 10 and 20), each with the test that failed before its fix:
a prompt the model cannot read sampled without a word, an error that named options not given, a file given
as a bundle called a missing directory, a missing corpus input scored as "1 unreadable file" (exit 0), a
slow rate printed as "0 docs/s", and ``--synthetic-chars`` values that ended in tracebacks or were cut
to 0 silently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from isan.cli import main

REPO = Path(__file__).resolve().parents[1]


def cli(*args):
    """The CLI in this process: (exit code, stdout, stderr); exceptions other than SystemExit propagate."""
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


# ---- item 10a: a prompt the model cannot read -------------------------------------------------------
def test_sample_warns_when_the_prompt_normalises_to_almost_nothing():
    """`isan sample --prompt "Привет"` printed "Приветmultiming..." with no word that the model read the
    prompt as one space; `isan score` warns in that case, and sample now says so through the same path."""
    code, out, err = cli("sample", "--prompt", "Привет", "-n", "5", "--seed", "1")
    assert code == 0 and out.startswith("Привет")
    assert "warning: the text8-v1 normaliser dropped 5 of the 6 characters read" in err
    assert "prompt" in err and "1 character" in err
    code, out, err = cli("sample", "--prompt", "the annual reve", "-n", "5", "--seed", "1")  # a prompt it reads
    assert code == 0 and "warning" not in err
    code, out, err = cli("sample", "--prompt", "Привет", "-n", "5", "--seed", "1", "--json")
    assert code == 0 and json.loads(out)["prompt_normalized"] == " " and "warning" in err


# ---- item 10b: the options named are the ones given -----------------------------------------------
@pytest.mark.parametrize("args, named, not_named", [
    (("--device", "cuda"), "--device cuda is for scoring", "--dtype"),
    (("--dtype", "float64"), "--dtype float64 is for scoring", "--device"),
    (("--device", "cuda", "--dtype", "float64"), "--device cuda and --dtype float64 are for scoring", None),
])
def test_sample_names_only_the_options_given(args, named, not_named):
    code, _, err = cli("sample", "-n", "3", *args)
    assert code == 2 and named in err, err
    assert not_named is None or not_named not in err


# ---- item 10c: a file given as the bundle ---------------------------------------------------------
@pytest.mark.parametrize("command", [("score",), ("sample", "-n", "3"), ("attribute", "--text", "hi")])
def test_a_file_given_as_model_is_called_a_file_not_a_missing_directory(tmp_path, command):
    cat = tmp_path / "cat.txt"
    cat.write_text("a cat\n")
    args = [*command, "--model", cat] + ([cat] if command[0] == "score" else [])
    code, _, err = cli(*args)
    assert code == 2 and "Traceback" not in err
    assert f"{cat} is a file, not a bundle directory" in err and "does not exist" not in err
    assert "manifest.json" in err and "isan export" in err


# ---- item 10d: a corpus input that does not exist ---------------------------------------------------
def test_corpus_score_of_a_path_that_does_not_exist_is_a_usage_error(tmp_path):
    """It scored nothing and exited 0 with "1 unreadable file"; a glob that matches nothing was already an
    error. Now a usage error, exit 2, that names the path, and nothing is written."""
    out = tmp_path / "out"
    code, stdout, err = cli("corpus", "score", tmp_path / "nothing-here.jsonl", "--out", out, "--no-progress")
    assert code == 2 and "nothing-here.jsonl does not exist" in err and "Traceback" not in err
    assert "unreadable" not in stdout and not out.exists()
    code, _, err = cli("corpus", "score", tmp_path / "nothing*.jsonl", "--out", out, "--no-progress")
    assert code == 2 and "matches no file" in err


# ---- item 10e: a slow run's rate --------------------------------------------------------------------
def test_a_slow_rate_is_not_printed_as_zero(tmp_path, monkeypatch):
    """One document in 8.2 s printed "0 docs/s"; the rate keeps three significant digits below 100."""
    import isan.engine.corpus as corpus_api

    doc = tmp_path / "one.jsonl"
    doc.write_text(json.dumps({"text": "one document"}) + "\n")
    summary = {"documents": 1, "files": 1, "chars_scored": 12, "bits": 30.0, "bpc": 2.5, "errors": 0,
               "file_errors": [], "this_run": {"runner": "local", "documents": 1, "seconds": 8.2, "docs_per_s": 1 / 8.2,
                                               "chars_per_s": 12 / 8.2, "files_skipped": 0}}
    monkeypatch.setattr(corpus_api, "score_corpus", lambda *a, **k: summary)
    code, out, _ = cli("corpus", "score", doc, "--out", tmp_path / "out", "--no-progress")
    assert code == 0 and "(0.122 docs/s, 1.46 chars/s)" in out and " 0 docs/s" not in out
    from isan.cli.corpus import format_rate

    assert [format_rate(x) for x in (0.0004, 0.12, 12.34, 99.96, 1234.5, None)] == ["0.0004", "0.12", "12.3", "100", "1,234",
                                                                           "-"]


# ---- item 20: --synthetic-chars, validated before any work -----------------------------------------
@pytest.mark.parametrize("value, says", [
    ("nan", "must be a finite number"), ("inf", "must be a finite number"), ("-inf", "must be a finite number"),
    ("1e30", "do not fit in this machine's"), ("0.5", "must be a whole number"), ("-3", "must be 0 or more"),
    ("abc", "is not a number of characters"),
])
def test_synthetic_chars_is_checked_when_the_option_is_read(tmp_path, value, says):
    """nan, inf and 1e30 ended in tracebacks (1e30 after the teacher's pass) and 0.5 became 0 without a word:
    each is a usage error (exit 2) before any data is read (--data names a file that does not exist)."""
    code, out, err = cli("train", "--out", tmp_path / "run", "--data", tmp_path / "absent.txt",
                         "--synthetic-chars", value)
    assert code == 2 and "Traceback" not in out + err
    assert "Invalid value for '--synthetic-chars'" in err and says in err, err
    assert not (tmp_path / "run").exists()


def test_synthetic_chars_accepts_whole_numbers_in_any_spelling():
    from isan.cli.train import CharCount

    assert [CharCount().convert(v, None, None) for v in ("0", "36000000", "36e6", "2.0", " 5 ")] == \
        [0, 36_000_000, 36_000_000, 2, 5]


def test_synthetic_chars_must_fit_the_models_outputs_in_memory():
    """The CLI's bound assumes the fewest outputs; the trainer checks again with the data's (before the
    teacher's pass): 10^9 characters of text8's 27 classes need 124 GB."""
    from isan.train.synthetic_budget import bytes_per_char, synthetic_chars_problem

    assert bytes_per_char(27) == 124
    assert synthetic_chars_problem(10**9, 27, memory=64 * 2**30).startswith("1,000,000,000 characters do not fit")
    assert "give at most 554,189,328" in synthetic_chars_problem(10**9, 27, memory=64 * 2**30)
    assert synthetic_chars_problem(36_000_000, 27, memory=64 * 2**30) is None


def test_a_directory_in_place_of_the_synthetic_text_is_a_clear_error_on_resume(tmp_path, text8_path):
    """A directory where the run's synthetic.safetensors should be gave IsADirectoryError on resume."""
    pytest.importorskip("torch")
    from isan.alphabet import Alphabet
    from isan.engine.bundle import write_bundle

    from conftest import random_params

    text = tmp_path / "text.txt"
    with open(text8_path) as f:
        text.write_text(f.read(60_000))
    teacher = tmp_path / "teacher"
    write_bundle(teacher, random_params(d=8, seed=3, scale=0.9).as_dict(), Alphabet.text8(), kind="isan")
    run = [sys.executable, "-m", "isan.cli", "train", "--out", str(tmp_path / "run"), "--data", str(text),
           "--dataset", "text", "--d", "8", "--batch-size", "8", "--bptt", "16", "--max-steps", "2",
           "--teacher", str(teacher), "--distill", "0.5", "--synthetic-chars", "500", "--no-progress", "--threads", "1"]
    r = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    synthetic = tmp_path / "run" / "synthetic.safetensors"
    synthetic.unlink()
    synthetic.mkdir()
    r = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{synthetic}, the run's synthetic text, is a directory" in r.stderr
    assert "restore the file or start a new --out" in r.stderr
