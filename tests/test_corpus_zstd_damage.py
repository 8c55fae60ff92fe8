"""A ``.zst`` damaged in the middle (issue #45 item 16) lost the documents decoded before the damage in the
same 64 KiB read: a 21 KB file kept 0 of its documents, where a ``.gz`` with the same damage keeps all it
decoded. Now it keeps every document the decoder gives before it finds the damage, and the file is still
listed in ``file_errors``. The files are real zstd files (written with a checksum, as the ``zstd`` tool
writes them, in streaming blocks) with bytes flipped, and what is "decodable" is what zstandard gives when
fed one byte at a time."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

zstandard = pytest.importorskip("zstandard")
pytest.importorskip("pyarrow")

from isan.corpus import read_output, score_corpus  # noqa: E402
from isan.engine.corpus.job import load_corpus_engine  # noqa: E402
from isan.engine.corpus.readers import InputFileError, read_docs  # noqa: E402

WORDS = "the of and to in a is was that for on as with by he at from his an were are which this be or".split()


@pytest.fixture(scope="module")
def engine():
    return load_corpus_engine(None)


def _jsonl(n: int, words: int) -> bytes:
    rng = np.random.default_rng(n)
    return b"".join(json.dumps({"id": f"d{i}", "text": " ".join(rng.choice(WORDS, words))}).encode() + b"\n"
                    for i in range(n))


def _zst(data: bytes, write: int | None = None) -> bytes:
    """``data`` as the zstd tool writes it (a content checksum); ``write``: in streamed pieces of that size."""
    c = zstandard.ZstdCompressor(write_checksum=True)
    if write is None:
        return c.compress(data)
    out = io.BytesIO()
    with c.stream_writer(out, closefd=False) as w:
        for i in range(0, len(data), write):
            w.write(data[i : i + write])
    return out.getvalue()


def _damaged(data: bytes, at: float, i: int = 0) -> bytes:
    d = bytearray(data)
    d[int(len(d) * at) + i] ^= 0x5A
    return bytes(d)


def _decodable_lines(damaged: bytes) -> int:
    """The complete lines zstandard decodes from ``damaged`` before it raises, fed one byte at a time."""
    dec, out = zstandard.ZstdDecompressor().decompressobj(), []
    for i in range(len(damaged)):
        try:
            out.append(dec.decompress(damaged[i : i + 1]))
        except zstandard.ZstdError:
            break
    return b"".join(out).count(b"\n")


@pytest.mark.parametrize("n, words, write, at", [
    (950, 20, None, 0.5),     # one block: the damage is found by the checksum, after the whole block came out
    (3356, 30, 200, 0.9),     # streamed blocks of 128 KiB: the damage in the last one
    (3356, 30, None, 0.45),   # one call's blocks, damage in the middle
])
def test_a_damaged_zst_keeps_every_document_decoded_before_the_damage(tmp_path, engine, n, words, write, at):
    data = _jsonl(n, words)
    good = _zst(data, write)
    # the first byte from `at` on whose damage leaves documents to decode (a block that fails to decode
    # loses all of itself, in any reader: so damage in the only block of a small file must pass its decoding)
    bad, want = next((b, w) for b in (_damaged(good, at, i) for i in range(500)) if (w := _decodable_lines(b)) > 0)
    path = tmp_path / "damaged.jsonl.zst"
    path.write_bytes(bad)
    s = score_corpus([str(path)], tmp_path / "out", progress=False, engine=engine)
    rows = read_output(tmp_path / "out").to_pylist()
    kept = [r for r in rows if r["index"] >= 0]
    assert len(kept) == want  # before the fix: fewer, down to 0 of them
    assert [r["id"] for r in kept[: min(want, 100)] if r["error"] is None][:10] == [f"d{i}" for i in range(10)]
    (fe,) = s["file_errors"]
    assert fe["path"] == str(path) and "damaged or truncated" in fe["error"]
    # the same reader's documents before the error, as a .gz's (InputFileError after them)
    docs = []
    with pytest.raises(InputFileError, match="damaged or truncated"):
        for doc in read_docs(str(path)):
            docs.append(doc)
    assert len(docs) == want


def test_frames_skippable_frames_and_checksums_read_whole():
    """The reader feeds the decoder one element of the format at a time (a frame header, a block, the
    checksum): frames one after another, a skippable frame between them and an empty frame read whole."""
    from isan.engine.corpus.zstd_stream import ZstdFrames

    parts = [_jsonl(300, 10), _jsonl(301, 40), b""]
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    blob = _zst(parts[0]) + skippable + _zst(parts[1], write=100) + _zst(parts[2])
    assert io.BufferedReader(ZstdFrames(io.BytesIO(blob), zstandard), 1 << 20).read() == b"".join(parts)
    cut = io.BufferedReader(ZstdFrames(io.BytesIO(blob[:-20]), zstandard), 1 << 20)
    with pytest.raises(EOFError, match="cut short"):
        cut.read()
