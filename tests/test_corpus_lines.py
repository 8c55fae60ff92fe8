"""Lines in bounded memory: a decompression bomb of one 10 GiB line took RSS past 3 GB and growing
(``readline()`` without a limit), and 10 GiB of line breaks were read one blank line at a time. A
line over ``max_line_bytes`` is now its document's error and skipped as it streams by; blank lines
are skipped by the buffer. The splitter is checked against ``readlines()`` on random input."""

from __future__ import annotations

import io
import json
import random
import tracemalloc

import pytest

zstandard = pytest.importorskip("zstandard")
pytest.importorskip("pyarrow")

from isan.corpus import read_output, score_corpus  # noqa: E402
from isan.engine.corpus.job import load_corpus_engine  # noqa: E402
from isan.engine.corpus.lines import LineSplitter  # noqa: E402
from isan.engine.corpus.readers import read_docs  # noqa: E402


def _readlines_reference(data: bytes, limit: int) -> list[tuple]:
    return [(n, line if len(line) <= limit else None, len(line))
            for n, line in enumerate(io.BytesIO(data).readlines(), 1) if line.strip()]


def test_the_splitter_gives_the_non_blank_lines_readline_gives():
    rng = random.Random(0)
    for _ in range(2000):
        data = bytes(rng.choice(b"ab \n\t\r\n\n\x0c") for _ in range(rng.randint(0, 300)))
        limit = rng.randint(1, 40)
        split, got, i = LineSplitter(limit), [], 0
        while i < len(data):
            k = rng.randint(1, 25)
            got += split.feed(data[i : i + k])
            i += k
        got += split.finish()
        assert [(x.lineno, x.raw, x.length) for x in got] == _readlines_reference(data, limit)


def _zst_stream(pieces, total: int) -> bytes:
    """The zstd frame of the pieces (an iterator of bytes), written without holding them."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(write_checksum=True).stream_writer(out, closefd=False, size=total) as w:
        for p in pieces:
            w.write(p)
    return out.getvalue()


def test_an_over_long_line_is_its_documents_error_in_bounded_memory(tmp_path):
    """A JSON document of 64 MiB of text in a 0.1% size .zst, limit 1 MiB: an error row naming the
    limit, the documents around it read, and the reader's peak allocation far below the line."""
    line_mib, limit = 64, 1 << 20
    head = json.dumps({"id": "a", "text": "before"}).encode() + b"\n"
    tail = json.dumps({"id": "c", "text": "after"}).encode() + b"\n"
    block = b"x" * (1 << 20)
    big = [b'{"id": "b", "text": "'] + [block] * line_mib + [b'"}\n']
    pieces = [head, *big, tail]
    path = tmp_path / "bomb.jsonl.zst"
    path.write_bytes(_zst_stream(iter(pieces), sum(map(len, pieces))))
    tracemalloc.start()
    try:
        docs = list(read_docs(str(path), max_line_bytes=limit))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [d.id for d in docs] == ["a", "bomb.jsonl.zst:2", "c"]
    assert docs[0].text == "before" and docs[2].text == "after"
    length = sum(map(len, big))
    assert f"line 2 is {length:,} bytes long, over the limit of 1,048,576 (--max-line-bytes)" in docs[1].error
    # held: at most the limit, a decoded piece and the compressed reads (1 MiB each): a few MiB, not 64
    assert peak < 8 * limit
    s = score_corpus([str(path)], tmp_path / "out", progress=False, engine=load_corpus_engine(None),
                     max_line_bytes=limit)
    rows = read_output(tmp_path / "out").to_pylist()
    assert [r["error"] is None for r in rows] == [True, False, True] and s["errors"] == 1 and not s["file_errors"]


def test_line_breaks_alone_are_skipped_by_the_buffer(tmp_path):
    """256 MiB of line breaks (and blank lines of spaces) before one document: its line number counts
    them all, and one line of text one a line is read as it is (leading spaces kept)."""
    n = 256 << 20
    pieces = [b"\n" * (1 << 20)] * (n >> 20) + [b"  \t\r\n", b"   two words\n"]
    path = tmp_path / "breaks.txt.zst"
    path.write_bytes(_zst_stream(iter(pieces), sum(map(len, pieces))))
    (doc,) = read_docs(str(path), fmt="text", per_line=True)
    assert doc.id == f"breaks.txt.zst:{n + 2}" and doc.text == "   two words" and doc.index == 0


def test_a_text_line_over_the_limit_is_an_error_and_the_cli_takes_the_limit(tmp_path):
    from click.testing import CliRunner

    from isan.cli.__main__ import main

    src = tmp_path / "t.txt"
    src.write_text("short line\n" + "y" * 5000 + "\nlast line\n")
    r = CliRunner().invoke(main, ["corpus", "score", str(src), "--format", "text", "--per-line", "--out",
                                  str(tmp_path / "out"), "--max-line-bytes", "4096", "--no-progress"])
    assert r.exit_code == 0, r.output
    rows = read_output(tmp_path / "out").to_pylist()
    assert [r["error"] is None for r in rows] == [True, False, True]
    assert "line 2 is 5,001 bytes long" in rows[1]["error"]
    r = CliRunner().invoke(main, ["corpus", "score", str(src), "--out", str(tmp_path / "o2"), "--max-line-bytes", "0"])
    assert r.exit_code == 2 and "--max-line-bytes" in r.output


def test_the_guide_states_the_limits_the_code_has():
    from pathlib import Path

    from isan.engine.corpus.lines import HOLD_BYTES, MAX_LINE_BYTES

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "corpora.md").read_text(encoding="utf-8")
    assert MAX_LINE_BYTES % (1 << 20) == 0 and HOLD_BYTES % (1 << 20) == 0
    assert f"`--max-line-bytes` (default {MAX_LINE_BYTES >> 20} MiB)" in guide
    assert f"held in memory up to {HOLD_BYTES >> 20} MiB (their lines' bytes and each line's" in guide
