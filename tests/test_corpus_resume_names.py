"""A resume finds its parts however the input is spelled: part names came from the path as typed
(``k`` gave ``k-61431c124b``, its absolute path ``k-d609b3703d``), so a re-run with the other spelling
started over. Inputs are now named by their resolved absolute path (symbolic links resolved), in the
parts' names and in the ``source`` column; a job started before keeps its names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from isan.corpus import read_output, score_corpus  # noqa: E402
from isan.engine.corpus.job import load_corpus_engine  # noqa: E402

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"


@pytest.fixture(scope="module")
def engine():
    return load_corpus_engine(None)


@pytest.fixture()
def corpus(tmp_path) -> Path:
    """data/k: 60 JSON lines of Tiny Shakespeare, 200 characters each."""
    if not SHAKESPEARE.is_file():
        pytest.skip(f"needs {SHAKESPEARE}")
    text = SHAKESPEARE.read_text(encoding="utf-8")
    (tmp_path / "data").mkdir()
    k = tmp_path / "data" / "k"
    k.write_text("".join(json.dumps({"id": f"d{i}", "text": text[i * 200 : (i + 1) * 200]}) + "\n" for i in range(60)))
    return k


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").glob("*.parquet"))}


def _interrupt(out: Path) -> None:
    """Leave ``out`` as a job killed after its first parts: no done record, the last two parts gone."""
    for p in (out / "shards").glob("*.done.json"):
        p.unlink()
    for p in sorted((out / "shards").glob("*.parquet"))[-2:]:
        p.unlink()


def test_a_resume_with_another_spelling_finds_the_parts(tmp_path, corpus, engine, monkeypatch):
    monkeypatch.chdir(corpus.parent)
    run = dict(progress=False, engine=engine, part_docs=10, fmt="jsonl")
    whole = score_corpus([str(corpus)], tmp_path / "whole", **run)
    assert whole["documents"] == 60
    link = tmp_path / "link"
    link.symlink_to(corpus.parent, target_is_directory=True)
    spellings = (("k", str(corpus)), ("./k", "k"), (str(corpus), str(link / "k")), ("k", "../data//k"))
    for n, (first, again) in enumerate(spellings):
        out = tmp_path / f"out-{n}"
        score_corpus([first], out, **run)
        _interrupt(out)
        s = score_corpus([again], out, **run)
        assert s["this_run"]["documents"] == 20  # the two parts removed, not all six
        assert _files(out) == _files(tmp_path / "whole")  # the same bytes as an uninterrupted run
    rows = read_output(tmp_path / "whole").to_pylist()
    assert {r["source"] for r in rows} == {str(corpus.resolve())}
    assert score_corpus(["k", str(corpus), str(link / "k")], tmp_path / "whole", **run)["files"] == 1  # one file


def test_a_job_started_before_resolved_names_keeps_its_own(tmp_path, corpus, engine):
    """Its job.json lists no input_paths (nor max_line_bytes): it goes on with the path as given."""
    run = dict(progress=False, engine=engine, part_docs=10, fmt="jsonl")
    out = tmp_path / "old"
    score_corpus([str(corpus)], out, **run)
    job = json.loads((out / "job.json").read_text())
    del job["input_paths"], job["max_line_bytes"]
    (out / "job.json").write_text(json.dumps(job))
    _interrupt(out)
    s = score_corpus([str(corpus)], out, **run)
    assert s["this_run"]["documents"] == 20 and s["documents"] == 60
    assert "input_paths" not in json.loads((out / "job.json").read_text())
