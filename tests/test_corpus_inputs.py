"""`isan corpus score` on inputs that break readers (issue #34): JSON lines Python's parser refuses
(a 5,000-digit number, nesting 100,000 deep), Parquet values Python cannot hold, compressed files cut
short (.gz and .zst: JSONL, one document a file, one a line); the progress bar (one unit, 100% at the
end) and the summary's plurals; the share of each document the normaliser changed
(``changed_fraction``), and a job written before that column resumed as it was written."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from isan.corpus import read_output, score_corpus  # noqa: E402
from isan.engine.corpus import job as job_module  # noqa: E402
from isan.engine.corpus.job import load_corpus_engine  # noqa: E402
from isan.engine.corpus.writers import COLUMNS_V1, write_part  # noqa: E402
from isan.errors import IsanError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIG_INT = "9" * 5000  # Python's int() refuses strings of more than 4,300 digits
DEEP = "[" * 100_000 + "]" * 100_000  # past the JSON parser's recursion limit


@pytest.fixture(scope="module")
def engine():
    return load_corpus_engine(None)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _zst(data: bytes, pieces: int = 200, frames: int = 1) -> bytes:
    """data compressed the way streaming writers do it (many blocks), in ``frames`` frames."""
    zstandard = pytest.importorskip("zstandard")
    out = io.BytesIO()
    step = max(1, len(data) // frames)
    for f in range(frames):
        part = data[f * step : (f + 1) * step if f < frames - 1 else len(data)]
        with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as w:
            for i in range(0, len(part), pieces):
                w.write(part[i : i + pieces])
    return out.getvalue()


WORDS = "the of and to in a is was that for on as with by he at from his an were are which this be or".split()


def _jsonl(n: int, prefix: str = "d") -> bytes:
    """n JSON lines of about 250 bytes (2,000 of them fill several zstd blocks of 128 KiB)."""
    rng = np.random.default_rng(n)
    return b"".join(json.dumps({"id": f"{prefix}{i}", "text": " ".join(rng.choice(WORDS, 50))}).encode() + b"\n"
                    for i in range(n))


def test_json_lines_the_parser_refuses_are_document_errors(tmp_path, engine):
    """A 5,000-digit number (in any field, the id too) and nesting 100,000 deep made json.loads raise
    ValueError and RecursionError, which stopped the whole job; each is now that line's error."""
    d = tmp_path / "in"
    d.mkdir()
    lines = [json.dumps({"id": "ok0", "text": "the first good document"}),
             '{"text": "x", "n": ' + BIG_INT + "}",
             '{"id": ' + BIG_INT + ', "text": "an id too long"}',
             '{"text": "x", "n": ' + DEEP + "}",
             '{"id": ' + DEEP + ', "text": "y"}',
             json.dumps({"id": "ok1", "text": "the last good document"})]
    (d / "1-bad.jsonl").write_text("\n".join(lines) + "\n")
    (d / "2-after.jsonl").write_text(json.dumps({"id": "after", "text": "a later file is scored"}) + "\n")
    s = score_corpus([str(d)], tmp_path / "out", progress=False, engine=engine)
    rows = {r["id"]: r for r in read_output(tmp_path / "out").to_pylist()}
    assert s["file_errors"] == [] and s["documents"] == 7 and s["errors"] == 4
    for name in ("ok0", "ok1", "after"):
        assert rows[name]["error"] is None and rows[name]["bits"] > 0
    for lineno in (2, 3):
        assert "cannot be read as JSON" in rows[f"1-bad.jsonl:{lineno}"]["error"]
        assert "4300 digits" in rows[f"1-bad.jsonl:{lineno}"]["error"]
    for lineno in (4, 5):
        assert "nested too deeply" in rows[f"1-bad.jsonl:{lineno}"]["error"]


def test_parquet_values_python_cannot_hold_are_document_errors(tmp_path, engine):
    """A timestamp id past Python's datetime range made the whole batch's to_pylist raise
    (OverflowError), which stopped the job; it is now that row's error, the other rows are scored."""
    t = pa.table({"id": pa.array([1, 10**15, 3], pa.timestamp("s")),
                  "text": ["a first text", "a second text", "a third text"]})
    pq.write_table(t, tmp_path / "ts.parquet")
    s = score_corpus([str(tmp_path / "ts.parquet")], tmp_path / "out", progress=False, engine=engine)
    rows = read_output(tmp_path / "out").to_pylist()
    assert s["file_errors"] == [] and s["documents"] == 3 and s["errors"] == 1
    assert rows[0]["id"] == "1970-01-01 00:00:01" and rows[0]["error"] is None
    assert rows[1]["id"] == "ts.parquet:1" and "row 1" in rows[1]["error"] and "id" in rows[1]["error"]
    assert rows[2]["error"] is None and rows[2]["bits"] > 0


def test_truncated_compressed_inputs_are_file_errors(tmp_path, engine):
    """A .zst cut short was read to its last complete block and reported nothing (exit 0, no file
    error, documents lost); a one-document .txt.gz cut short raised EOFError out of the job. Every
    compressed input now ends at its end of frame or is an error, and the job goes on. A frame cut
    short cannot be checked, so its documents are withheld (the file error says how many); the
    frames before it are kept whole."""
    data = _jsonl(2000)
    full = _zst(data)
    d = tmp_path / "in"
    d.mkdir()
    (d / "a-full.jsonl.zst").write_bytes(full)
    (d / "b-frames.jsonl.zst").write_bytes(_zst(_jsonl(300, "f"), frames=3))  # frames one after another
    (d / "c-cut100.jsonl.zst").write_bytes(full[:-100])
    (d / "d-half.jsonl.zst").write_bytes(full[: len(full) // 2])
    gz = gzip.compress(data)
    (d / "e-cut.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    (d / "e2-frames-cut.jsonl.zst").write_bytes(_zst(data, frames=4)[:-100])  # the 4th frame cut short
    text = " ".join(np.random.default_rng(1).choice(WORDS, 30_000)).encode()  # about 90 kB
    (d / "f-doc.txt.zst").write_bytes(_zst(text)[:-100])
    tgz = gzip.compress(text)
    (d / "g-doc.txt.gz").write_bytes(tgz[: len(tgz) // 2])
    (d / "h-empty.jsonl.zst").write_bytes(_zst(b""))
    (d / "i-after.jsonl").write_text(json.dumps({"id": "after", "text": "a later file is scored"}) + "\n")
    s = score_corpus([str(d)], tmp_path / "out", progress=False, engine=engine)
    rows = read_output(tmp_path / "out").to_pylist()
    files = {Path(fe["path"]).name: fe["error"] for fe in s["file_errors"]}
    assert sorted(files) == ["c-cut100.jsonl.zst", "d-half.jsonl.zst", "e-cut.jsonl.gz", "e2-frames-cut.jsonl.zst"]
    assert all("damaged or truncated" in e and "withheld" in e for e in files.values())
    by_src: dict[str, list] = {}
    for r in rows:
        by_src.setdefault(Path(r["source"]).name, []).append(r)
    assert [r["id"] for r in by_src["a-full.jsonl.zst"]] == [f"d{i}" for i in range(2000)]
    assert [r["id"] for r in by_src["b-frames.jsonl.zst"]] == [f"f{i}" for i in range(300)]
    for name in ("c-cut100.jsonl.zst", "d-half.jsonl.zst", "e-cut.jsonl.gz"):  # one frame: nothing of it is kept
        (row,) = by_src[name]
        unit = "gzip members" if name.endswith(".gz") else "zstd frames"
        assert row["index"] == -1 and "damaged or truncated" in row["error"]
        assert f"0 documents of the {unit} before it are kept" in row["error"]
    kept = [r["id"] for r in by_src["e2-frames-cut.jsonl.zst"] if r["index"] >= 0]
    whole = data[: 3 * (len(data) // 4)].count(b"\n")  # the lines that end in the three whole frames
    assert 0 < whole < 2000 and kept == [f"d{i}" for i in range(whole)]
    cut4 = files["e2-frames-cut.jsonl.zst"]
    assert "zstd frame 4 " in cut4 and f"{whole:,} documents of the zstd frames before it are kept" in cut4
    for name in ("f-doc.txt.zst", "g-doc.txt.gz"):  # one document a file: the document cannot be read
        (r,) = by_src[name]
        assert "damaged or truncated" in r["error"] and r["chars_scored"] == 0
    assert "h-empty.jsonl.zst" not in by_src
    assert by_src["i-after.jsonl"][0]["error"] is None
    # one document a line
    lines = b"".join(json.loads(x)["text"].encode() + b"\n" for x in _jsonl(3000).splitlines())
    (tmp_path / "lines.txt.zst").write_bytes(_zst(lines)[:-100])
    s = score_corpus([str(tmp_path / "lines.txt.zst")], tmp_path / "out-lines", fmt="text", per_line=True,
                     progress=False, engine=engine)
    assert len(s["file_errors"]) == 1 and "damaged or truncated" in s["file_errors"][0]["error"]
    assert s["documents"] == 0  # one frame, cut short: withheld


def test_the_progress_bar_counts_bytes_and_ends_at_100_percent(tmp_path, engine, monkeypatch):
    """The bar's total was in bytes (compressed files x4) and its count in characters read (text
    only, after decoding): it stopped short of 100%. Both are now the input files' bytes."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps({"id": i, "text": f"caf\u00e9 {i} \u2014 ok"}) + "\n"
                                       for i in range(50)))
    (d / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(40)))
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(30)]}), d / "c.parquet")
    (d / "t.txt").write_text("na\u00efve text, \u00e9t\u00e9 " * 100)
    seen = {}
    close = job_module.Progress.close

    def record(self):
        seen["n"], seen["total"], seen["desc"] = self.bar.n, self.bar.total, self.bar.desc
        close(self)

    monkeypatch.setattr(job_module.Progress, "close", record)
    inputs = [str(d), str(tmp_path / "missing.jsonl")]
    score_corpus(inputs, tmp_path / "out", progress=True, part_docs=7, engine=engine)
    size = sum(p.stat().st_size for p in d.iterdir())
    assert seen["total"] == size and seen["n"] == size and seen["desc"].startswith("scoring 5 files")
    score_corpus(inputs, tmp_path / "out", progress=True, part_docs=7, engine=engine)  # resumed: all complete
    assert seen["total"] == size and seen["n"] == size
    score_corpus([str(d / "a.jsonl")], tmp_path / "one", progress=True, engine=engine)
    assert seen["desc"].startswith("scoring 1 file") and not seen["desc"].startswith("scoring 1 files")


def test_cli_goes_on_past_bad_input_and_counts_in_words(tmp_path):
    """The CLI: the lines and files that raised a traceback ("Aborted!") are errors in the output and
    the command ends 0; its summary says "1 file", "1 document" (it said "1 files")."""
    d = tmp_path / "in"
    d.mkdir()
    (d / "1-bad.jsonl").write_text('{"text": "x", "n": ' + BIG_INT + "}\n" + '{"text": ' + DEEP + "}\n"
                                   + json.dumps({"text": "good text"}) + "\n")
    t = gzip.compress(b"one document in a compressed text file " * 200)
    (d / "2-doc.txt.gz").write_bytes(t[: len(t) // 2])
    (d / "3-good.jsonl").write_text(json.dumps({"text": "good text"}) + "\n")
    base = [sys.executable, "-m", "isan.cli", "corpus", "score"]
    r = subprocess.run(base + [str(d), "--out", str(tmp_path / "out"), "--no-progress"], env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "Aborted" not in r.stderr
    assert "5 documents in 3 files" in r.stdout and "3 documents with errors, 0 unreadable files" in r.stdout
    r = subprocess.run(base + [str(d / "3-good.jsonl"), "--out", str(tmp_path / "one"), "--no-progress"], env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "1 document in 1 file:" in r.stdout and "0 documents with errors, 0 unreadable files" in r.stdout
    assert "1 document in " in r.stdout.splitlines()[1] and "0 files were complete already" in r.stdout


def test_changed_fraction_says_how_much_the_normaliser_changed(tmp_path, engine):
    """Text the model cannot read (another script) normalises to a space or two and scores a few
    bits without a word; the row's changed_fraction, (changed + dropped + skipped + replaced) /
    chars_read, says so: 1.0 for Cyrillic, 0.0 for text already in the model's alphabet."""
    docs = [("ru", "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440"), ("en", "Hello, World!  ok"),
            ("plain", "the cat sat on the mat"), ("mixed", "hello \u043c\u0438\u0440 world")]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs)
                   + json.dumps({"id": "nofield", "body": 1}) + "\n")
    long_doc = tmp_path / "long.txt"
    long_doc.write_text("Some Text, With Capitals. " * 12_000)  # 312,000 characters: scored in blocks
    score_corpus([str(src), str(long_doc)], tmp_path / "out", progress=False, engine=engine)
    rows = {r["id"]: r for r in read_output(tmp_path / "out").to_pylist()}
    for i, t in docs:
        r = rows[i]
        rep = engine.prepare(t, "auto", "error", None).report
        want = (rep["changed"] + rep["dropped"] + rep["skipped"] + rep["replaced"]) / rep["chars_read"]
        assert r["changed_fraction"] == want and r["chars_read"] == len(t)
    assert rows["ru"]["changed_fraction"] == 1.0 and rows["ru"]["chars_scored"] == 1  # one space
    assert rows["plain"]["changed_fraction"] == 0.0
    assert 0.2 < rows["mixed"]["changed_fraction"] < 0.5
    assert rows["nofield"]["changed_fraction"] is None  # nothing was read
    r = rows[str(long_doc)]
    assert r["error"] is None and r["chars_read"] == 312_000
    rep = engine.prepare(long_doc.read_text(), "auto", "error", None).report
    assert r["changed_fraction"] == (rep["changed"] + rep["dropped"]) / 312_000 == (r["changed"] + r["dropped"]) / 312_000
    # the datatrove block carries it too
    pytest.importorskip("datatrove")
    from datatrove.data import Document

    from isan.engine.corpus.datatrove import IsanScoreFilter
    from isan.engine.corpus.scoring import DocScorer

    block = IsanScoreFilter()
    block._scorer = DocScorer(engine)  # the model already loaded
    batch = [Document(text=t, id=i) for i, t in docs]
    block.filter_batch(batch)
    assert [b.metadata["isan_changed_fraction"] for b in batch] == [rows[i]["changed_fraction"] for i, _ in docs]


def test_a_job_written_before_changed_fraction_resumes_as_written(tmp_path, engine):
    """A job whose job.json predates the column (its parts lack it) resumes without it: its parts keep
    one schema and read_output reads them as one table; a new job's parts all carry it."""
    d = tmp_path / "in"
    d.mkdir()
    for k in range(2):
        (d / f"f{k}.jsonl").write_bytes(_jsonl(30, f"{k}-"))
    out = tmp_path / "out"
    s0 = score_corpus([str(d)], out, progress=False, part_docs=10, engine=engine)
    parts = sorted((out / "shards").glob("*.parquet"))
    assert len(parts) == 6 and all("changed_fraction" in pq.read_schema(p).names for p in parts)
    job = json.loads((out / "job.json").read_text())
    job.pop("columns")
    (out / "job.json").write_text(json.dumps(job))  # as an earlier isan wrote it
    new_rows = read_output(out)
    for p in parts:  # as the earlier writer wrote them: the same rows, without the column
        t = pq.read_table(p)
        write_part(p, t.to_pylist(), t.column("source")[0].as_py(), COLUMNS_V1)
    old = {p.name: p.read_bytes() for p in parts}
    parts[-1].unlink()  # killed before its last part and its done record
    next((out / "shards").glob("f1*.done.json")).unlink()
    s = score_corpus([str(d)], out, progress=False, part_docs=10, engine=engine)
    assert s["documents"] == 60 and s["this_run"]["documents"] == 10 and s["bits"] == s0["bits"]
    assert {p.name: p.read_bytes() for p in sorted((out / "shards").glob("*.parquet"))} == old
    t = read_output(out)
    assert t.column_names == list(COLUMNS_V1) and t.equals(new_rows.drop_columns(["changed_fraction"]))
    assert "columns" not in json.loads((out / "job.json").read_text())
    job["columns"] = [*COLUMNS_V1, "a_later_column"]  # a job a later isan started: refused, with the reason
    (out / "job.json").write_text(json.dumps(job))
    with pytest.raises(IsanError, match="differs in: columns.*another isan version"):
        score_corpus([str(d)], out, progress=False, part_docs=10, engine=engine)


def test_missing_extras_name_the_command_that_installs_them(tmp_path, monkeypatch, engine):
    """A missing pyarrow, Ray or datatrove is named with isan.errors.install_hint's working command,
    not 'pip install isan[...]', which no package index has (#34 item 11)."""
    from isan.engine.corpus import datatrove as dt_module
    from isan.engine.corpus.readers import InputFileError, read_parquet
    from isan.engine.corpus.ray_runner import run_ray
    from isan.errors import install_hint

    sources = sorted((REPO / "engine" / "corpus").glob("*.py"))
    assert sources and not [p.name for p in sources if "isan[" in p.read_text()]
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "a text"}) + "\n")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(IsanError) as e:
        run_ray([str(tmp_path / "a.jsonl")], None, tmp_path / "out", None, None, 1)
    assert install_hint("ray") in str(e.value)
    monkeypatch.setitem(sys.modules, "datatrove.pipeline.filters.base_filter", None)
    monkeypatch.setattr(dt_module, "_CLASS", None)
    with pytest.raises(IsanError) as e:
        dt_module.IsanScoreFilter
    assert install_hint("datatrove") in str(e.value)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(InputFileError) as e:
        list(read_parquet(str(tmp_path / "x.parquet")))
    assert install_hint("corpus") in str(e.value)
    with pytest.raises(IsanError) as e:
        score_corpus([str(tmp_path / "a.jsonl")], tmp_path / "out", progress=False, engine=engine)
    assert install_hint("corpus") in str(e.value) and install_hint("ray") in str(e.value)
