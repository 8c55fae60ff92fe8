"""Worker processes of the local runner (issue 36): the same output bytes whatever their number,
bad input recorded in any worker's share, kill -9 and Ctrl-C leave a job that resumes to the same
files, and a failing run leaves the next one working."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
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
    """Files of every kind the readers take: JSONL with bad lines (two files), an empty one, a
    .jsonl.zst cut short, text files one document a file (read in blocks in the worker) and one a
    line."""
    d = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    lines = []
    for i in range(160):
        a, n = int(rng.integers(0, len(text8_test) - 6000)), int(rng.integers(20, 6000))
        lines.append(json.dumps({"id": f"d{i}", "text": text8_test[a : a + n]}))
    lines[17] = '{"text": "x", "n": ' + "9" * 5000 + "}"
    lines[90] = "not json"
    (d / "a.jsonl").write_text("\n".join(lines[:80]) + "\n")
    (d / "a2.jsonl").write_text("\n".join(lines[80:110]) + "\n")
    (d / "empty.jsonl").write_text("\n\n")  # no document: a done record of no part
    z = zstandard.ZstdCompressor().compress(("\n".join(lines[110:]) + "\n").encode())
    (d / "b.jsonl.zst").write_bytes(z[:-40])  # cut short: a file error after the documents before the cut
    (d / "c.txt").write_text(text8_test[:30_000])
    (d / "lines").mkdir()
    (d / "lines" / "d.txt").write_text("\n".join(text8_test[i * 400 : i * 400 + 300] for i in range(40)))
    return d


def files_of(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").iterdir())}


INPUTS = ("a.jsonl", "a2.jsonl", "empty.jsonl", "b.jsonl.zst", "c.txt")


def run(corpus: Path, out: Path, workers: int, **kw) -> dict:
    return score_corpus([str(corpus / f) for f in INPUTS], out, workers=workers, progress=False, part_docs=25, **kw)


@pytest.fixture(scope="module")
def one_worker(corpus, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("w1") / "out"
    return out, run(corpus, out, 1)


def test_workers_write_the_same_bytes_as_one(corpus, one_worker, tmp_path):
    """Two workers take whole files (5 files: at least 2 a worker), three share pieces of parts:
    both write one worker's bytes, the empty file's done record included."""
    out1, s1 = one_worker
    assert s1["errors"] >= 2 and len(s1["file_errors"]) == 1  # the bad lines and the cut file are recorded
    assert len(list((out1 / "shards").glob("*.done.json"))) == s1["files"] == len(INPUTS)
    for workers, shares in ((2, "files"), (3, "pieces")):
        s = run(corpus, tmp_path / f"w{workers}", workers)
        assert files_of(tmp_path / f"w{workers}") == files_of(out1)
        assert s["this_run"]["workers"] == workers and s["this_run"]["threads"] == 1
        assert s["this_run"]["shares"] == shares
        for k in ("documents", "chars_read", "chars_scored", "bits", "errors", "file_errors"):
            assert s[k] == s1[k], k


def test_the_progress_bar_hears_of_each_part_when_workers_take_files(corpus, tmp_path, monkeypatch):
    """By file, the workers write the parts themselves, and the bar heard of a file only when it was
    done (it sat at 0% for 13 s while 4 parts were written): each part now reaches it as it is written."""
    from isan.engine.corpus import job as job_mod

    seen = []
    update = job_mod.Progress.update

    def record(self, path, docs, chars, file_pos=-1, done=False):
        seen.append((path, docs, done))
        update(self, path, docs, chars, file_pos, done)

    monkeypatch.setattr(job_mod.Progress, "update", record)
    s = score_corpus([str(corpus / f) for f in INPUTS], tmp_path / "out", workers=2, progress=True, part_docs=25)
    assert s["this_run"]["shares"] == "files"
    parts = len(list((tmp_path / "out" / "shards").glob("*.part-*.parquet")))
    assert parts > len(INPUTS) and sum(1 for *_, done in seen if not done) == parts
    assert sum(1 for *_, done in seen if done) == len(INPUTS) and sum(d for _, d, _ in seen) == s["documents"]


def test_per_line_text_with_workers(corpus, tmp_path):
    kw = dict(per_line=True, progress=False, part_docs=7)
    score_corpus(str(corpus / "lines"), tmp_path / "one", workers=1, **kw)
    score_corpus(str(corpus / "lines"), tmp_path / "two", workers=2, **kw)
    assert files_of(tmp_path / "one") == files_of(tmp_path / "two")


def _cli(corpus: Path, out: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "isan.cli", "corpus", "score", *[str(corpus / f) for f in INPUTS], "--out", str(out),
            "--workers", str(workers), "--part-docs", "25", "--no-progress"]


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists() and "zombie" not in
            Path(f"/proc/{p}/status").read_text().lower()]


@pytest.mark.parametrize("how", ["kill -9 the job", "kill -9 the driver", "Ctrl-C the job", "SIGTERM the driver"])
def test_killed_or_interrupted_then_rerun_gives_the_same_files(corpus, one_worker, tmp_path, how):
    """kill -9 of the whole job (its process group) or of the driver alone (its workers end with it),
    Ctrl-C (SIGINT to the process group, as a terminal sends it) or SIGTERM to the driver (it stops
    its workers, and says how many parts it kept; it said only "Aborted!"), once some parts are
    written; no worker is left running, and a re-run with another number of workers ends with one
    worker's files."""
    out = tmp_path / "out"
    p = subprocess.Popen(_cli(corpus, out, 3), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if len(list((out / "shards").glob("*.parquet"))) >= 2 if (out / "shards").is_dir() else False:
            break
        time.sleep(0.05)
    workers = child_pids(p.pid)
    if how.startswith("kill -9"):
        if how.endswith("job"):
            os.killpg(p.pid, signal.SIGKILL)
        else:
            p.kill()
        p.wait()
    else:
        if how.startswith("Ctrl-C"):
            os.killpg(p.pid, signal.SIGINT)
        else:
            p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        if not (out / "summary.json").exists():  # interrupted (not finished before the signal came)
            # it says what it kept (every part: the first run in this folder) and how to go on, exit 130
            kept = len(list((out / "shards").glob("*.part-*.parquet")))
            assert p.returncode == 130 and "Aborted" not in err, err
            assert f"this run wrote {kept:,} part" in err and "run the same command again to resume" in err, err
        assert "Traceback" not in err, err
    deadline = time.time() + 20
    while _alive(workers) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(workers), f"workers left running after {how}"
    r = subprocess.run(_cli(corpus, out, 2), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert files_of(out) == files_of(one_worker[0])


def test_a_failing_run_then_good_runs(corpus, one_worker, tmp_path, monkeypatch):
    """Workers that cannot load the job's model (here: a job whose model hash is not the model's)
    end the run with a message and no part written; the next runs work."""
    from isan.engine.corpus import job as job_mod
    from isan.engine.corpus.workers import run_workers

    cfg = job_mod.JobConfig(params_sha256="0" * 64, kernel="jumps", part_docs=25)
    shards = tmp_path / "bad" / "shards"
    shards.mkdir(parents=True)
    with pytest.raises(IsanError, match="could not load the model"):
        run_workers([str(corpus / "a.jsonl")], cfg, shards, 2, 1)
    assert not list(shards.glob("*.parquet"))
    s = run(corpus, tmp_path / "good", 2)
    assert files_of(tmp_path / "good") == files_of(one_worker[0]) and s["errors"] == one_worker[1]["errors"]


def test_worker_options_on_the_cli(corpus, tmp_path):
    from isan.engine.corpus.workers import SMALL_JOB_BYTES, plan_workers
    from isan.engine.kernels import default_threads

    cpus = default_threads()
    assert plan_workers(None, None, SMALL_JOB_BYTES - 1) == (1, cpus)
    assert plan_workers(None, None, SMALL_JOB_BYTES) == (cpus, 1)
    assert plan_workers(2, None) == (2, max(1, cpus // 2)) and plan_workers(None, 2) == (max(1, cpus // 2), 2)
    for args, msg in ((["--workers", "0"], "Invalid value for '--workers'"),
                      (["--workers", "2", "--runner", "ray"], "--ray-actors")):
        r = subprocess.run([sys.executable, "-m", "isan.cli", "corpus", "score", str(corpus / "a.jsonl"), "--out",
                            str(tmp_path / "x"), *args], capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(IsanError, match="load the model themselves"):
        score_corpus(str(corpus / "a.jsonl"), tmp_path / "y", workers=2, engine=object(), progress=False)
    # the torch backend (a GPU, or float64) runs a job in one process: refused with workers, one by default
    assert plan_workers(None, None, 10 * SMALL_JOB_BYTES, device="cpu", dtype="float64") == (1, cpus)
    assert plan_workers(None, None, 10 * SMALL_JOB_BYTES, device="cuda") == (1, cpus)
    with pytest.raises(IsanError, match="one process drives the device"):
        score_corpus(str(corpus / "a.jsonl"), tmp_path / "z", workers=2, dtype="float64", progress=False)


def test_bench_corpus_scaling_table(tmp_path, text8_path):
    """`isan bench corpus --workers 1,2` on a small corpus: a row per count, each run's files equal
    to the local runner's, the speed-up against one worker and Amdahl's serial fraction from it."""
    from isan.bench.corpus import bench_corpus, markdown

    r = bench_corpus(text8_path.parent.parent, mb=0.3, files=2, ray=False, kenlm=False, log=lambda m: None,
                     work_dir=tmp_path, workers=[1, 2])
    sc = r["facts"]["scaling"]
    assert [row["workers"] for row in sc] == [1, 2] and all(row["identical"] for row in sc)
    assert sc[0]["speedup"] == 1.0 and sc[1]["amdahl_serial_fraction"] == pytest.approx(2 / sc[1]["speedup"] - 1)
    assert 0 <= sc[1]["driver_busy_share"] < 1
    assert "| workers | chars/s | speed-up |" in markdown(r)
