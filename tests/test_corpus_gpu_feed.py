"""Reader processes feeding the one scoring process of a torch-backend job (issue 47, part 3), run
here on torch's CPU device: the same output bytes with 0 (in process), 1 or 2 readers, bad documents
recorded, a reader killed ends the job with a message and a re-run resumes to the same files, a
failing run leaves the next one working; the preparation alone round-trips through pickle; the batch
size is the backend's unless given."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import child_pids

pytest.importorskip("pyarrow")
zstandard = pytest.importorskip("zstandard")

from isan.engine.corpus import score_corpus  # noqa: E402
from isan.errors import IsanError  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, text8_test) -> Path:
    """Small files (the torch backend on the CPU is slow): JSONL with a line that is not JSON, an
    empty document and one whose text is not a string, an empty file, a .jsonl.zst cut short, a text file."""
    d = tmp_path_factory.mktemp("feed")
    rng = np.random.default_rng(3)
    lines = []
    for i in range(24):
        a, n = int(rng.integers(0, len(text8_test) - 2000)), int(rng.integers(20, 700))
        lines.append(json.dumps({"id": f"d{i}", "text": text8_test[a : a + n]}))
    lines[3] = "not json"
    lines[4] = json.dumps({"id": "empty", "text": ""})
    lines[6] = json.dumps({"id": "number", "text": 5})
    lines[5] = json.dumps({"id": "mixed", "text": "Hello, World 12 \u00e9t\u00e9 \u4e16\u754c"})
    (d / "a.jsonl").write_text("\n".join(lines[:10]) + "\n")
    (d / "b.jsonl").write_text("\n".join(lines[10:16]) + "\n")
    (d / "empty.jsonl").write_text("\n\n")
    z = zstandard.ZstdCompressor().compress(("\n".join(lines[16:]) + "\n").encode())
    (d / "c.jsonl.zst").write_bytes(z[:-30])
    (d / "t.txt").write_text(text8_test[:1500])
    return d


def files_of(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").iterdir())}


@pytest.fixture(scope="module")
def torch_engine():
    pytest.importorskip("torch")
    from isan.engine.core import Engine, default_model_path

    return Engine.load(default_model_path(), device="cpu", kernels="torch", progress_bar=False)


@pytest.fixture(scope="module")
def in_process(corpus, torch_engine, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("r0") / "out"
    return out, score_corpus(str(corpus), out, engine=torch_engine, progress=False, part_docs=3, readers=0)


def test_readers_write_the_bytes_of_one_process(corpus, torch_engine, in_process, tmp_path):
    """1 and 2 readers write the in-process run's bytes (its parts, done records, bad rows and the
    cut file's error); the summary says how many read and how long the scorer waited."""
    out0, s0 = in_process
    assert s0["this_run"]["readers"] == 0 and s0["this_run"]["backend"] == "torch"
    assert s0["errors"] >= 3 and len(s0["file_errors"]) == 1
    for readers in (1, 2):
        s = score_corpus(str(corpus), tmp_path / f"r{readers}", engine=torch_engine, progress=False, part_docs=3,
                         readers=readers)
        assert files_of(tmp_path / f"r{readers}") == files_of(out0)
        run = s["this_run"]
        assert run["readers"] == readers and run["parts"] >= 5 and run["wait_seconds"] >= 0
        for k in ("documents", "chars_read", "chars_scored", "bits", "errors", "file_errors"):
            assert s[k] == s0[k], k
    # resumed with readers: nothing new, the same files
    s = score_corpus(str(corpus), tmp_path / "r2", engine=torch_engine, progress=False, part_docs=3, readers=2)
    assert s["this_run"]["documents"] == 0 and files_of(tmp_path / "r2") == files_of(out0)


def test_prepared_parts_pickle_and_score_as_one_call(text8_test):
    """On the CPU's kernels (fast): a part prepared, pickled (as it travels from a reader) and
    scored gives DocScorer.score's rows, long documents and errors included; ids travel as uint8."""
    from isan.engine.corpus.parts import load_corpus_engine
    from isan.engine.corpus.prepared import TextPreparer, prepare_docs
    from isan.engine.corpus.readers import Doc
    from isan.engine.corpus.scoring import DocScorer, ScoreOptions

    engine = load_corpus_engine(None)
    docs = [Doc(0, "a", text8_test[:5000]), Doc(1, "bad", error="ValueError: not JSON"),
            Doc(2, "long", text8_test[:140_000]), Doc(3, "e", ""), Doc(4, "m", "Hello World 12 \u00e9t\u00e9"),
            Doc(5, "b", text8_test[7000:7100])]
    scorer = DocScorer(engine, ScoreOptions(batch_chars=3000))
    want = scorer.score(docs)
    p = pickle.loads(pickle.dumps(prepare_docs(pickle.loads(pickle.dumps(TextPreparer.of(engine))), docs)))
    assert p.ids.dtype == np.uint8 and p.long == [2] and p.short == [0, 4, 5]
    got = scorer.score_prepared(p)
    for w, g in zip(want, got):
        assert w.keys() == g.keys()
        for k in w:
            assert (w[k] == g[k]) if not isinstance(w[k], np.ndarray) else np.array_equal(w[k], g[k]), k
    assert got[1]["error"].startswith("ValueError") and got[3]["error"].startswith("EmptyTextError")
    assert got[2]["chars_scored"] == 140_000
    # the offsets in the input rebuilt from their steps
    m = p.prepared(1, p.ids[p.bounds[1] : p.bounds[2]].astype(np.int64))
    np.testing.assert_array_equal(m.offsets, engine.prepare(docs[4].text).offsets)


def test_a_failing_reader_then_good_runs(corpus, torch_engine, in_process, tmp_path):
    """A reader that fails (here: a job whose format no reader knows) ends the run with a message
    and no part written; the next runs, in this process, work."""
    from isan.engine.corpus.feed import run_readers
    from isan.engine.corpus.parts import JobConfig
    from isan.engine.corpus.scoring import DocScorer

    cfg = JobConfig(fmt="bogus", part_docs=3)
    shards = tmp_path / "bad" / "shards"
    shards.mkdir(parents=True)
    with pytest.raises(IsanError, match="a reader process failed.*format must be one of"):
        run_readers([str(corpus / "a.jsonl")], cfg, shards, DocScorer(torch_engine), 2)
    assert not list(shards.glob("*.parquet"))
    score_corpus(str(corpus), tmp_path / "good", engine=torch_engine, progress=False, part_docs=3, readers=1)
    assert files_of(tmp_path / "good") == files_of(in_process[0])


def _reading(pid: int, folder: Path) -> bool:
    """Whether process ``pid`` holds a file of ``folder`` open (a reader amid its file)."""
    try:
        return any(os.readlink(f).startswith(str(folder)) for f in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the reader processes in /proc")
def test_a_killed_reader_ends_the_job_and_a_rerun_resumes(corpus, tmp_path, text8_test):
    """kill -9 of a reader amid its file (float64 on the torch backend, readers blocked on the full
    queue): the job ends with a message, exit 2, no traceback, and no part left in shared memory; a
    re-run ends with the files of an in-process run."""
    pytest.importorskip("torch")
    from isan.engine.corpus.shared_parts import count_blocks

    blocks = count_blocks()
    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):  # files of several parts, so that a reader holds its file open while it waits
        (src / f"f{k}.jsonl").write_text("".join(json.dumps({"id": f"{k}-{i}", "text": text8_test[i * 97 : i * 97 + 150]})
                                                 + "\n" for i in range(12)))
    cmd = [sys.executable, "-m", "isan.cli", "corpus", "score", str(src), "--dtype", "float64", "--part-docs", "1",
           "--no-progress"]
    p = subprocess.Popen([*cmd, "--out", str(tmp_path / "out"), "--readers", "2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    victim, deadline = None, time.time() + 120
    while victim is None and time.time() < deadline and p.poll() is None:
        victim = next((c for c in child_pids(p.pid) if _reading(c, src)), None)
        time.sleep(0.02)
    assert victim is not None, "no reader was seen reading"
    os.kill(victim, signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "a reader process died" in err and "run the same command again" in err, err
    assert "Traceback" not in err, err
    assert count_blocks() == blocks
    r = subprocess.run([*cmd, "--out", str(tmp_path / "out"), "--readers", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*cmd, "--out", str(tmp_path / "ref"), "--readers", "0"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert files_of(tmp_path / "out") == files_of(tmp_path / "ref")


def test_reader_and_batch_options(corpus, tmp_path):
    """Readers are a one-process backend's: planned by default (none for a small job), refused for
    the CPU's kernels; the batch size is the backend's unless given, and never part of the job."""
    from isan.engine.corpus.feed import MAX_READERS, plan_readers
    from isan.engine.corpus.workers import SMALL_JOB_BYTES
    from isan.engine.kernels import default_threads

    assert plan_readers(None, SMALL_JOB_BYTES - 1) == 0 and plan_readers(3, 10) == 3
    assert plan_readers(None, SMALL_JOB_BYTES) == max(0, min(default_threads() - 1, MAX_READERS))
    with pytest.raises(IsanError, match="use --workers N"):
        score_corpus(str(corpus / "a.jsonl"), tmp_path / "x", readers=2, progress=False)
    s = score_corpus(str(corpus / "a.jsonl"), tmp_path / "cpu", progress=False)
    assert s["this_run"]["batch_chars"] == 2_000_000 and "readers" not in s["this_run"]
    s2 = score_corpus(str(corpus / "a.jsonl"), tmp_path / "cpu2", progress=False, batch_chars=500)
    assert s2["this_run"]["batch_chars"] == 500 and files_of(tmp_path / "cpu2") == files_of(tmp_path / "cpu")
    job = json.loads((tmp_path / "cpu" / "job.json").read_text())
    assert "batch_chars" not in job and "readers" not in job
    r = subprocess.run([sys.executable, "-m", "isan.cli", "corpus", "score", str(corpus / "a.jsonl"), "--out",
                        str(tmp_path / "y"), "--readers", "-1"], capture_output=True, text=True)
    assert r.returncode == 2 and "Invalid value for '--readers'" in r.stderr and "Traceback" not in r.stderr


def test_bench_readers_table(tmp_path, text8_path):
    """`python -m isan.bench.corpus DATA --readers 1`: the reading side alone on a small corpus, a
    row per count (in process first), each run's files equal to the first's, the table printed."""
    from isan.bench.corpus import bench_readers, readers_markdown

    r = bench_readers(text8_path.parent.parent, mb=0.3, files=2, readers=[1], log=lambda m: None, work_dir=tmp_path)
    assert [row["readers"] for row in r["rows"]] == [0, 1] and all(row["identical"] for row in r["rows"])
    assert r["rows"][1]["first_part_seconds"] is not None and r["rows"][0]["chars"] == r["rows"][1]["chars"] > 0
    assert "| readers | seconds | chars/s |" in readers_markdown(r)
