"""`isan corpus score`'s numbers are typed and bounded: a bad one exits 2 with one line naming the
option, before any model is loaded or file read; ``--readers`` on the CPU names ``--workers N``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from isan.cli.__main__ import main


@pytest.fixture()
def doc(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text(json.dumps({"text": "a short document"}) + "\n")
    return p


@pytest.mark.parametrize("option, value", [
    ("--workers", "0"), ("--workers", "1.5"), ("--threads", "0"), ("--threads", "nan"), ("--readers", "-1"),
    ("--batch-chars", "0"), ("--per-char-max", "-1"), ("--part-docs", "0"), ("--part-docs", "inf"),
    ("--max-line-bytes", "0"), ("--ray-actors", "0"), ("--ray-cpus-per-actor", "0"),
    ("--ray-cpus-per-actor", "nan"), ("--workers", "5000"),
])
def test_a_bad_number_is_a_usage_error_before_any_work(tmp_path, doc, option, value, monkeypatch):
    import isan.engine.corpus as corpus_api

    monkeypatch.setattr(corpus_api, "score_corpus", lambda *a, **k: pytest.fail("the job started"))
    r = CliRunner().invoke(main, ["corpus", "score", str(doc), "--out", str(tmp_path / "out"), option, value])
    assert r.exit_code == 2 and f"Invalid value for '{option}'" in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not (tmp_path / "out").exists()


def test_readers_on_the_cpu_names_workers(tmp_path, doc, monkeypatch):
    import isan.engine.corpus as corpus_api

    monkeypatch.setattr(corpus_api, "score_corpus", lambda *a, **k: pytest.fail("the job started"))
    r = CliRunner().invoke(main, ["corpus", "score", str(doc), "--out", str(tmp_path / "out"), "--readers", "2"])
    assert r.exit_code == 2 and "--workers N" in r.output and "--device cuda" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
