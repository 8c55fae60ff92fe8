"""What a new user hit (issue #19), each with the test that failed before its fix: documented options
that were refused, a file's memory, a BOM, a directory, sizes that disagreed, a silently ignored
option, and `isan bench engine --quick`."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from isan.engine import Engine
from isan.engine.blocks import DEFAULT_BLOCK_CHARS, NotUTF8Error, read_blocks, score_blocks
from isan.errors import AlphabetError, StateDivergedError
from tolerances import default_model_tolerance


def isan(*args, input=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "isan.cli", *map(str, args)], input=input, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def engine():
    return Engine.default()


def test_path_chunked_is_accepted_by_the_cli(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("the cat sat on the mat " * 20)
    r = isan("score", "--json", "--path", "chunked", f)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["scoring"]["path"] == "chunked"
    r = isan("score", "--json", "--path", "chunked", "--runtime", "onnx", f)
    assert r.returncode == 2 and "--runtime numpy" in r.stderr and "Traceback" not in r.stderr


def test_onnx_backend_says_how_it_scored(tmp_path):
    pytest.importorskip("onnxruntime")
    r = isan("score", "--json", "--runtime", "onnx", "-", input="the cat sat")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["scoring"]
    assert s["backend"] == "onnx" and s["provider"] == "CPUExecutionProvider" and s["path"]


def test_a_directory_is_not_called_missing(tmp_path):
    r = isan("score", tmp_path)
    assert r.returncode == 2 and "is a directory" in r.stderr


def test_a_leading_bom_is_dropped_and_counted(tmp_path, engine):
    plain, marked = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_bytes(b"hello world")
    marked.write_bytes(b"\xef\xbb\xbfhello world")
    a = json.loads(isan("score", "--json", plain).stdout)
    b = json.loads(isan("score", "--json", marked).stdout)
    assert b["bits"] == a["bits"] and b["chars"] == a["chars"] == 11
    assert b["normalization"]["chars_read"] == 12 and b["normalization"]["dropped"] == 1
    # the raw path too, and in the engine; a BOM inside a stream is text, not a file mark
    assert engine.score("\ufeffhello", normalize="none").bits == engine.score("hello", normalize="none").bits
    st = engine.score("hello ").state
    with pytest.raises(AlphabetError):
        engine.score("\ufeffx", state=st, normalize="none")


# ---- a file of any size in bounded memory ------------------------------------------------------------
@pytest.mark.parametrize("block_chars", [7, 1_000, 99_999])
def test_block_scoring_equals_one_call(engine, text8_test, block_chars):
    text = "The  Cat!!  " + text8_test[:150_000] + "  End.\n"
    whole = engine.score(text)
    r = score_blocks(engine, read_blocks(io.BytesIO(text.encode()), block_chars))
    assert r.chars == whole.chars and r.normalization == whole.normalization
    tol = default_model_tolerance().for_chars(len(text)).twice()  # two float32 computations (tests/tolerances.py)
    assert abs(r.bits - whole.bits) <= tol.total_bits
    assert r.state.last_symbol == whole.state.last_symbol
    assert np.abs(r.state.h - whole.state.h).max() <= tol.state


def test_block_errors_count_offsets_from_the_start(unconstrained_engine):
    engine = unconstrained_engine  # a model whose states can diverge
    bad = "hello " * 1000 + "é" + "x"
    with pytest.raises(AlphabetError) as e:
        score_blocks(engine, read_blocks(io.BytesIO(bad.encode()), 100), normalize="none")
    assert e.value.offset == 6000 and "offset 6000 " in str(e.value)
    run = "the " + "h" * 30_000  # a repeat that spans many blocks is counted whole
    with pytest.raises(StateDivergedError) as e:
        score_blocks(engine, read_blocks(io.BytesIO(run.encode()), 1_000))
    with pytest.raises(StateDivergedError) as whole:
        engine.score(run)
    assert e.value.offset == whole.value.offset
    assert f"after {whole.value.offset - 3} characters repeating 'h'" in str(e.value)
    with pytest.raises(NotUTF8Error) as e:
        list(read_blocks(io.BytesIO(b"abc" * 1_000_000 + b"\xff"), 100))
    assert e.value.byte_offset == 3_000_000
    # a character split between two reads is decoded whole
    text = "é" * 700_000
    assert "".join(read_blocks(io.BytesIO(text.encode()), 333)) == text


def test_isan_score_memory_is_bounded_by_the_block_not_the_file(tmp_path, text8_test):
    """6M characters: scored whole this peaked near 500 MB (about 68 bytes a character); in blocks
    of 1M characters the process stays near 230 MB whatever the size."""
    f = tmp_path / "big.txt"
    with open(f, "w") as out:
        for _ in range(12):
            out.write(text8_test)
    # a fresh parent, so that its children's peak is this command's alone
    probe = ("import resource, subprocess, sys; r = subprocess.run([sys.executable, '-m', 'isan.cli', 'score', "
             f"'--json', {str(f)!r}], capture_output=True, text=True); sys.stderr.write(r.stderr); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(r.stdout, end='')")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    peak_kb, out = r.stdout.split("\n", 1)
    j = json.loads(out)
    assert j["chars"] == 6_000_000 and j["scoring"]["blocks"] == -(-6_000_000 // DEFAULT_BLOCK_CHARS)
    print(f"isan score of 6M characters peaked at {int(peak_kb) / 1024:.0f} MB")
    assert int(peak_kb) / 1024 < 380, f"isan score peaked at {int(peak_kb) / 1024:.0f} MB"
    eng = Engine.default()
    one = eng.score(text8_test)
    again = eng.score(text8_test, state=one.state)  # every later copy starts where a copy ended
    tol = default_model_tolerance().for_chars(j["chars"]).twice()  # two float32 computations (tests/tolerances.py)
    assert abs(j["bits"] - (one.bits + 11 * again.bits)) <= tol.total_bits


# ---- tables: one size, no option ignored -------------------------------------------------------------
def test_table_info_and_the_manifest_give_the_same_size():
    from isan.engine.paths import default_model_path

    m = json.loads((default_model_path() / "manifest.json").read_text())
    info = json.loads(isan("table", "info", "--json").stdout)
    assert info["bytes"] == m["table"]["bytes"] and info["bytes_on_disk"] > info["bytes"]


def test_export_of_a_bundle_refuses_a_table_mode_it_would_ignore(tmp_path):
    r = isan("export", "default", tmp_path / "copy", "--onnx", "--table-mode", "full")
    assert r.returncode == 2 and "isan table build" in r.stderr and not (tmp_path / "copy").exists()


def test_bench_engine_quick_is_quick_and_checks_kenlm_before_counting(tmp_path, monkeypatch):
    """It counted an order-8 n-gram on 9M characters (68 s, 1.3 GB) that KenLM then could not load."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    env_cache = tmp_path / "cache"
    import os

    env = {**os.environ, "ISAN_CACHE_DIR": str(env_cache)}
    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "text8_head" / "text8_head.txt"
    if not data.exists():
        pytest.skip("no shared data")
    r = subprocess.run([sys.executable, "-m", "isan.cli", "bench", "engine", "--quick", "--repeats", "1",
                        "--no-progress", "--data", str(data)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    arpas = sorted(p.name for p in (env_cache / "bench").glob("*.arpa"))
    try:
        import kenlm

        kenlm.Model(str(env_cache / "bench" / "probe-order8.arpa"))
        loads8 = True
    except Exception:  # noqa: BLE001
        loads8 = False
    if loads8:
        assert "peer: KenLM" in r.stdout + r.stderr
    else:  # nothing counted in vain: only the tiny probe was written
        assert arpas == ["probe-order8.arpa"] and "MAX_ORDER=8" in r.stdout + r.stderr


def test_train_without_a_progress_bar_logs_each_validation(tmp_path, text8_path):
    """With --no-progress nothing printed for minutes; now each validation prints a line."""
    pytest.importorskip("torch")
    data = tmp_path / "small.txt"
    data.write_text(text8_path.read_text()[:20_000])
    r = isan("train", "--out", tmp_path / "run", "--data", data, "--dataset", "text", "--d", "8", "--batch-size", "4",
             "--bptt", "16", "--max-steps", "20", "--eval-every", "0.05", "--no-progress")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "valid bpc" in ln]
    assert len(lines) >= 2 and "characters seen" in lines[0]


def test_a_resumed_run_keeps_its_options_unless_given_again(tmp_path, text8_path):
    """Resuming with `isan train --out DIR` passed the CLI's defaults (--patience 2) over the saved
    config: a run set to --patience 1000 stopped early after its resume."""
    pytest.importorskip("torch")
    data = tmp_path / "small.txt"
    data.write_text(text8_path.read_text()[:20_000])
    common = ["--out", tmp_path / "run", "--data", data, "--dataset", "text", "--d", "8", "--batch-size", "4",
              "--bptt", "16", "--eval-every", "0.05", "--no-progress"]
    r = isan("train", *common, "--patience", "1000", "--max-steps", "10")
    assert r.returncode == 0, r.stderr
    r = isan("train", "--out", tmp_path / "run", "--max-steps", "40", "--no-progress")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    resume = [e for e in events if e["event"] == "resume"][-1]
    assert resume["budget"]["patience"] == 1000 and resume["budget"]["max_steps"] == 40
    assert json.loads(r.stdout)["stop_reason"] != "early stop: no improvement in 2 evaluations"
