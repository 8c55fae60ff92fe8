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


def test_ctrl_c_says_what_was_kept_and_a_rerun_resumes(tmp_path, monkeypatch):
    """Ctrl-C printed only "Aborted!": it now says how many parts this run wrote and kept, exit 130,
    and the same command run again resumes from them."""
    from isan.engine.corpus.scoring import DocScorer

    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document number {i}"}) + "\n" for i in range(12)))
    score = DocScorer.score
    calls = []

    def interrupted_at_the_third_part(self, docs):
        calls.append(len(docs))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return score(self, docs)

    monkeypatch.setattr(DocScorer, "score", interrupted_at_the_third_part)
    args = ["corpus", "score", str(src), "--out", str(tmp_path / "out"), "--part-docs", "4", "--no-progress"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 130 and "Aborted" not in r.output, r.output
    assert "this run wrote 2 parts; 2 parts (0 complete input files) are kept" in r.output
    assert "run the same command again to resume" in r.output
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "12 documents in 1 file" in r.output and calls == [4, 4, 4, 4], r.output
