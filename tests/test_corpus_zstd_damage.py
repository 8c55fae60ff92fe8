"""Damaged compressed inputs: no row carries text from a frame that failed its check.

A ``.jsonl.zst`` of Tiny Shakespeare in two checksummed frames with 16 random bytes flipped was listed
in ``file_errors`` ("Restored data doesn't match checksum"), yet the rows read before the check failed
had ``error`` null and carried damaged text (``'I ef manb children, ...'``); a ``.gz`` did the same. A
checksum covers a whole zstd frame (a gzip member's CRC-32 its member), so a frame's documents are now
held until its check passes and withheld when it fails, the file error saying how many. Every document
a damaged file yields here must equal the original document at its index, and come from a frame that
decoded whole."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest

zstandard = pytest.importorskip("zstandard")
pytest.importorskip("pyarrow")

from isan.corpus import read_output, score_corpus  # noqa: E402
from isan.engine.corpus import lines as lines_module  # noqa: E402
from isan.engine.corpus.frames import GzipMembers  # noqa: E402
from isan.engine.corpus.job import load_corpus_engine  # noqa: E402
from isan.engine.corpus.readers import InputFileError, read_docs  # noqa: E402

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """3,000 documents of 20 to 200 characters of Tiny Shakespeare, one after another."""
    if not SHAKESPEARE.is_file():
        pytest.skip(f"needs {SHAKESPEARE}")
    text = SHAKESPEARE.read_text(encoding="utf-8")
    rng = np.random.default_rng(0)
    out, pos = [], 0
    for k in rng.integers(20, 200, 3000):
        out.append(text[pos : pos + int(k)])
        pos += int(k)
    return out


def _jsonl(texts: list[str]) -> bytes:
    return b"".join(json.dumps({"id": f"d{i}", "text": t}).encode() + b"\n" for i, t in enumerate(texts))


def _zst_frames(data: bytes, frames: int = 2) -> tuple[bytes, list[int]]:
    """``data`` in ``frames`` checksummed zstd frames, each written in streamed blocks as the zstd tool
    writes them; and the lines that end in each frame (cumulative)."""
    out, ends, step = io.BytesIO(), [], len(data) // frames
    for f in range(frames):
        part = data[f * step : (f + 1) * step if f < frames - 1 else len(data)]
        with zstandard.ZstdCompressor(write_checksum=True).stream_writer(out, closefd=False) as w:
            for i in range(0, len(part), 4096):
                w.write(part[i : i + 4096])
        ends.append(data[: f * step + len(part)].count(b"\n"))
    return out.getvalue(), ends


def _gz_members(data: bytes, members: int = 2) -> tuple[bytes, list[int]]:
    step = len(data) // members
    blob, ends = b"", []
    for m in range(members):
        part = data[m * step : (m + 1) * step if m < members - 1 else len(data)]
        blob += gzip.compress(part, mtime=0)
        ends.append(data[: m * step + len(part)].count(b"\n"))
    return blob, ends


def _flip16(blob: bytes, seed: int) -> bytes:
    """16 random bytes of ``blob`` replaced by random values (the issue's damage)."""
    rng = np.random.default_rng(seed)
    b = bytearray(blob)
    for at in rng.integers(0, len(b), 16):
        b[int(at)] = int(rng.integers(0, 256))
    return bytes(b)


def _read(path: Path) -> tuple[list, str | None]:
    docs = []
    try:
        for d in read_docs(str(path)):
            docs.append(d)
    except InputFileError as e:
        return docs, str(e)
    return docs, None


@pytest.mark.parametrize("kind", ["zst", "gz"])
def test_no_document_of_a_damaged_frame_comes_out(tmp_path, texts, kind):
    data = _jsonl(texts)
    blob, ends = _zst_frames(data) if kind == "zst" else _gz_members(data)
    path = tmp_path / f"d.jsonl.{kind}"
    damaged_cases = 0
    for seed in range(40):
        path.write_bytes(_flip16(blob, seed))
        docs, error = _read(path)
        # each document is the original at its index: never text from damaged bytes
        assert [(d.id, d.text) for d in docs] == [(f"d{i}", texts[i]) for i in range(len(docs))]
        assert all(d.error is None for d in docs)
        if error is None:  # the damage changed nothing that is decoded (a gzip header's time, say)
            assert len(docs) == len(texts)
            continue
        damaged_cases += 1
        assert len(docs) in [0, *ends[:-1]]  # whole frames only: those before the damaged one
        assert "damaged or truncated" in error and "withheld" in error and f"{len(docs):,} document" in error
    assert damaged_cases >= 30


def test_a_damaged_file_scores_no_row_of_its_damaged_frame(tmp_path, texts):
    """The job: the first frame's documents are scored, the second (damaged) frame's are not, and
    the file error row says how many were withheld."""
    data = _jsonl(texts)
    blob, ends = _zst_frames(data)
    b = bytearray(blob)
    b[len(b) * 3 // 4] ^= 0x5A  # in the second frame
    path = tmp_path / "damaged.jsonl.zst"
    path.write_bytes(bytes(b))
    s = score_corpus([str(path)], tmp_path / "out", progress=False, engine=load_corpus_engine(None), part_docs=500)
    rows = read_output(tmp_path / "out").to_pylist()
    docs = [r for r in rows if r["index"] >= 0]
    assert [r["id"] for r in docs] == [f"d{i}" for i in range(ends[0])]
    assert all(r["error"] is None or "EmptyText" in r["error"] for r in docs)
    (fe,) = s["file_errors"]
    assert fe["path"] == str(path.resolve()) and "zstd frame 2 " in fe["error"] and "withheld" in fe["error"]
    assert rows[-1]["index"] == -1 and rows[-1]["error"].endswith(fe["error"])


def test_a_frame_larger_than_the_hold_is_checked_first(tmp_path, texts, monkeypatch):
    """A frame whose documents pass the hold limit is checked in a second reading before any of
    them goes out: the same documents when it is whole, none of them when it is damaged."""
    calls = []
    check = lines_module.check_frame
    monkeypatch.setattr(lines_module, "check_frame", lambda *a: calls.append(a) or check(*a))
    monkeypatch.setattr(lines_module, "HOLD_BYTES", 4096)
    data = _jsonl(texts)
    blob, ends = _zst_frames(data)
    path = tmp_path / "big.jsonl.zst"
    path.write_bytes(blob)
    docs, error = _read(path)
    assert error is None and [d.text for d in docs] == texts
    assert [start for _, start in calls] == [0, blob.index(b"\x28\xb5\x2f\xfd", 4)]  # each frame, from its start
    b = bytearray(blob)
    b[len(b) * 3 // 4] ^= 0x5A
    path.write_bytes(bytes(b))
    docs, error = _read(path)
    assert len(docs) == ends[0] and "withheld" in error


def test_gzip_members_read_as_gzip_does(texts):
    """Members one after another with zero padding between them, decoded as the standard library does."""
    parts = [_jsonl(texts[:100]), b"", _jsonl(texts[100:])]
    blob = gzip.compress(parts[0]) + b"\0" * 10 + gzip.compress(parts[1]) + gzip.compress(parts[2]) + b"\0\0"
    dec, out, ends = GzipMembers(io.BytesIO(blob)), [], 0
    while (got := dec.piece()) is not None:
        out.append(got[0])
        ends += got[1]
    assert b"".join(out) == gzip.decompress(blob) and ends == 3 == dec.frames
    cut = GzipMembers(io.BytesIO(blob[: len(blob) // 2]))
    with pytest.raises(EOFError, match="cut short"):
        while cut.piece() is not None:
            pass


def test_frames_skippable_frames_and_checksums_read_whole(texts):
    """The zstd reader feeds the decoder one element of the format at a time (a frame header, a block,
    the checksum): frames one after another, a skippable frame between them and an empty frame read whole."""
    from isan.engine.corpus.zstd_stream import ZstdFrames

    parts = [_jsonl(texts[:300]), _jsonl(texts[300:700]), b""]
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    blob = _zst_frames(parts[0], 1)[0] + skippable + _zst_frames(parts[1], 1)[0] + _zst_frames(parts[2], 1)[0]
    assert io.BufferedReader(ZstdFrames(io.BytesIO(blob), zstandard), 1 << 20).read() == b"".join(parts)
    cut = io.BufferedReader(ZstdFrames(io.BytesIO(blob[:-20]), zstandard), 1 << 20)
    with pytest.raises(EOFError, match="cut short"):
        cut.read()


def test_many_short_lines_count_what_holding_them_costs(tmp_path, monkeypatch):
    """A held line costs its bytes and its bookkeeping (LINE_COST): 2,000 lines of 2 bytes pass a hold
    of 100 lines' cost, so the frame is checked ahead, although their bytes alone are far below it."""
    calls = []
    check = lines_module.check_frame
    monkeypatch.setattr(lines_module, "check_frame", lambda *a: calls.append(a) or check(*a))
    path = tmp_path / "short.txt.zst"
    path.write_bytes(_zst_frames(b"x\n" * 2000, 1)[0])
    got = list(lines_module.checked_lines(str(path), hold_bytes=100 * lines_module.LINE_COST))
    assert len(got) == 2000 and 2000 * 2 < 100 * lines_module.LINE_COST and len(calls) == 1
