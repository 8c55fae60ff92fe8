"""The readers' parts in shared memory (engine/corpus/feed.py, shared_parts.py), with a scorer whose
device takes no time (fast, no torch): the files of one process with 1 and 2 readers; no block left
in /dev/shm after a job that ends well, one whose scoring fails mid-way, one stopped by Ctrl-C and
one whose reader fails; the next job after each works."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")
zstandard = pytest.importorskip("zstandard")

from isan.engine.corpus import shared_parts  # noqa: E402
from isan.engine.corpus.feed import run_readers  # noqa: E402
from isan.engine.corpus.parts import JobConfig, load_corpus_engine, process_file  # noqa: E402
from isan.engine.corpus.prepared import prepare_docs  # noqa: E402
from isan.errors import IsanError  # noqa: E402


class NoDevice:
    """Rows with counts and zero bits; fails (raises ``exc``) at its ``fail_at``-th part."""

    def __init__(self, engine, fail_at: int | None = None, exc: type = RuntimeError):
        self.engine, self.fail_at, self.exc, self.parts = engine, fail_at, exc, 0

    def score(self, docs):
        return prepare_docs(self.engine, docs).rows_without_bits()

    def score_prepared(self, prepared):
        self.parts += 1
        if self.parts == self.fail_at:
            raise self.exc("the scorer failed here")
        return prepared.rows_without_bits()


@pytest.fixture(scope="module")
def engine():
    return load_corpus_engine(None)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, text8_test) -> list[str]:
    """Four zstd JSONL files of several parts each (part_docs=4), a line that is not JSON, mixed text."""
    d = tmp_path_factory.mktemp("blocks")
    rng = np.random.default_rng(5)
    paths = []
    for f in range(4):
        lines = []
        for i in range(14):
            a, n = int(rng.integers(0, len(text8_test) - 3000)), int(rng.integers(50, 2500))
            lines.append(json.dumps({"id": f"{f}-{i}", "text": text8_test[a : a + n]}))
        lines[3] = "not json"
        lines[5] = json.dumps({"id": "mixed", "text": "Hello, World 1984 \u00e9t\u00e9 \u4e16\u754c"})
        p = d / f"f{f}.jsonl.zst"
        p.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
        paths.append(str(p))
    return paths


def files_of(shards: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(shards.iterdir())}


def job(engine, tmp_path: Path, name: str) -> tuple[JobConfig, Path]:
    shards = tmp_path / name / "shards"
    shards.mkdir(parents=True)
    return JobConfig(params_sha256=engine.params_sha256, part_docs=4), shards


@pytest.fixture(scope="module")
def in_process(engine, corpus, tmp_path_factory) -> dict[str, bytes]:
    cfg, shards = job(engine, tmp_path_factory.mktemp("ref"), "ref")
    for p in corpus:
        process_file(NoDevice(engine), cfg, p, shards)
    return files_of(shards)


def test_readers_write_the_files_of_one_process_and_leave_no_block(engine, corpus, in_process, tmp_path):
    before = shared_parts.count_blocks()
    for readers in (1, 2):
        cfg, shards = job(engine, tmp_path, f"r{readers}")
        records, stats = run_readers(corpus, cfg, shards, NoDevice(engine), readers)
        assert files_of(shards) == in_process
        assert stats["parts"] == sum(r["parts"] for r in records) == 16 and stats["unpickling_seconds"] > 0
        assert stats["first_part_seconds"] is not None
    assert shared_parts.count_blocks() == before


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_a_job_that_fails_mid_way_leaves_no_block_and_the_next_works(engine, corpus, in_process, tmp_path, exc):
    """The scorer fails (or Ctrl-C comes) at its third part, with readers ahead of it and parts on
    the queue: the error comes out, what was written stands, no block is left; then a new job in
    the same folder resumes to the files of one process."""
    before = shared_parts.count_blocks()
    cfg, shards = job(engine, tmp_path, "fail")
    with pytest.raises(exc, match="the scorer failed here"):
        run_readers(corpus, cfg, shards, NoDevice(engine, fail_at=3, exc=exc), 2)
    assert shared_parts.count_blocks() == before
    assert 0 < len(list(shards.glob("*.parquet"))) < 16
    run_readers(corpus, cfg, shards, NoDevice(engine), 2)
    assert files_of(shards) == in_process and shared_parts.count_blocks() == before


def test_a_failing_reader_leaves_no_block_and_the_next_job_works(engine, corpus, in_process, tmp_path):
    before = shared_parts.count_blocks()
    cfg, shards = job(engine, tmp_path, "bad")
    cfg.fmt = "bogus"
    with pytest.raises(IsanError, match="a reader process failed.*format must be one of"):
        run_readers(corpus, cfg, shards, NoDevice(engine), 2)
    assert shared_parts.count_blocks() == before and not list(shards.glob("*.parquet"))
    cfg, shards = job(engine, tmp_path, "good")
    run_readers(corpus, cfg, shards, NoDevice(engine), 1)
    assert files_of(shards) == in_process and shared_parts.count_blocks() == before
