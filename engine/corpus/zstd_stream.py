"""Reading a ``.zst`` file as a stream of decompressed bytes that keeps what was decoded before damage.

zstandard's ``stream_reader`` (with ``read_across_frames`` or without) ends quietly at the last complete
block of a file cut short, and a ``decompressobj`` fed a large piece raises on damage inside it without
returning the output of the blocks before the damage in that piece: a 21 KB file damaged in its
middle lost every document, where a ``.gz`` with the same damage keeps all it decoded. So the
compressed bytes are fed one zstd element at a time (a frame header, a block, the checksum; the
format: RFC 8878), read from the block headers: a damaged block, or a checksum that does not match,
raises in the call that feeds it alone, after every block before it came out.

:meth:`ZstdFrames.piece` also says where each frame ends: a frame's output can be trusted only once the
frame decoded to its end (and matched its content checksum, where it has one), which
:mod:`isan.engine.corpus.lines` waits for before it lets a document of the frame go.
"""

from __future__ import annotations

import io

#: the magic number of a zstd frame, and of skippable frames (0x184D2A50 to 0x184D2A5F), little-endian
_MAGIC = 0xFD2FB528
_SKIPPABLE = 0x184D2A50
#: bytes of a frame header's fields, by the flags of its descriptor
_DICT_ID_BYTES = (0, 1, 2, 4)
_CONTENT_SIZE_BYTES = (0, 2, 4, 8)


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a ``.zst`` file, its frames one after another, that raises EOFError
    when the file ends inside a frame, and any damage only after the output of the blocks before it.

    Each frame is decoded by a ``decompressobj`` (zstandard's decompressor with the standard library's
    API), whose ``eof`` says that its frame ended and whose ``unused_data`` starts the next frame, as
    the standard library reads ``.gz``, ``.bz2`` and ``.xz`` files of several members. It is fed one
    element of the frame at a time (:meth:`_piece`), at most :data:`FEED` bytes.
    """

    #: compressed bytes decoded at a time at most (what one call may expand: text compresses 3-10x)
    FEED = 1 << 16
    #: compressed bytes read from the file at a time
    READ = 1 << 20
    #: what a frame is called in messages
    UNIT = "zstd frame"
    #: its frames are checked (decoded to their end; their checksum, where they have one)
    checks = True

    def __init__(self, raw, zstandard):
        super().__init__()
        self._raw, self._dctx, self._frame = raw, zstandard.ZstdDecompressor(), None
        self._in, self._in_pos, self._eof_in = b"", 0, False  # compressed bytes read and not yet decoded
        self._base = 0  # the file offset of self._in[0]
        #: the file offset (compressed bytes) where the frame being decoded, or the next one, starts
        self.frame_start = 0
        #: frames decoded to their end so far
        self.frames = 0
        self._out, self._out_pos = b"", 0  # decoded bytes not yet returned
        # where the next element of the format starts: "frame" (a frame or a skippable frame), "block",
        # "checksum", or "lost" (bytes that are not zstd: fed in FEED pieces, the decoder says why)
        self._expect, self._left, self._checksum = "frame", 0, False

    def readable(self) -> bool:
        return True

    def _available(self, n: int) -> int:
        """Compressed bytes available from the read position, reading the file until there are ``n``."""
        while len(self._in) - self._in_pos < n and not self._eof_in:
            more = self._raw.read(self.READ)
            if not more:
                self._eof_in = True
                break
            self._base += self._in_pos
            self._in, self._in_pos = self._in[self._in_pos :] + more, 0
        return len(self._in) - self._in_pos

    def _plan(self) -> None:
        """At the start of an element: how long it is (``_left``) and what comes after it."""
        b, at = self._in, self._in_pos
        if self._expect == "frame":
            if self._available(8) < 5:
                self._left = self.FEED  # too short for a frame header: the decoder says why
                return
            b, at = self._in, self._in_pos
            magic = int.from_bytes(b[at : at + 4], "little")
            fhd = b[at + 4]
            if magic & 0xFFFFFFF0 == _SKIPPABLE and len(b) - at >= 8:
                self._left = 8 + int.from_bytes(b[at + 4 : at + 8], "little")
            elif magic == _MAGIC:
                single = (fhd >> 5) & 1
                fcs = _CONTENT_SIZE_BYTES[fhd >> 6] or single  # one byte when the frame is a single segment
                self._left = 5 + (0 if single else 1) + _DICT_ID_BYTES[fhd & 3] + fcs
                self._checksum, self._expect = bool(fhd & 4), "block"
            else:
                self._expect, self._left = "lost", self.FEED
        elif self._expect == "block":
            if self._available(3) < 3:
                self._left = self.FEED
                return
            b, at = self._in, self._in_pos
            header = int.from_bytes(b[at : at + 3], "little")
            kind, size = (header >> 1) & 3, header >> 3
            if kind == 3:  # reserved: not a block
                self._expect, self._left = "lost", self.FEED
                return
            self._left = 3 + (1 if kind == 1 else size)  # an RLE block stores its byte once
            if header & 1:  # the frame's last block
                self._expect = "checksum" if self._checksum else "frame"
        elif self._expect == "checksum":
            self._left, self._expect = 4, "frame"
        else:
            self._left = self.FEED

    def _piece(self) -> bytes:
        """The next compressed bytes to decode: the rest of the element, at most FEED bytes (b"" at the end)."""
        if self._left <= 0:
            self._plan()
        n = min(self._left, self.FEED, max(self._available(1), 0))
        self._left -= n
        chunk = self._in[self._in_pos : self._in_pos + n]
        self._in_pos += n
        return chunk

    def piece(self) -> tuple[bytes, bool] | None:
        """The next decoded bytes and whether they end a frame that decoded whole (its checksum, where
        it has one, matched); None at the end of the file.

        Raises:
            EOFError: the file ends inside a frame. zstandard.ZstdError: the frame is damaged.
        """
        while True:
            chunk = self._piece()
            if not chunk:
                if self._frame is not None:
                    raise EOFError("the file ends inside a zstd frame (it was cut short)")
                return None
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
                self.frame_start = self._base + self._in_pos - len(chunk)
            out = self._frame.decompress(chunk)
            if self._frame.eof:  # the frame ended: the rest of the chunk starts the next one
                rest = self._frame.unused_data
                self._frame = None
                self.frames += 1
                self._expect, self._left = "frame", 0  # the decoder knows where the frame ended
                if rest:
                    self._base += self._in_pos - len(rest)
                    self._in, self._in_pos = rest + self._in[self._in_pos :], 0
                self.frame_start = self._base + self._in_pos
                return out, True
            if out:
                return out, False

    def readinto(self, b) -> int:
        while self._out_pos >= len(self._out):
            got = self.piece()
            if got is None:
                return 0
            self._out, self._out_pos = got[0], 0
        n = min(len(b), len(self._out) - self._out_pos)
        b[:n] = self._out[self._out_pos : self._out_pos + n]
        self._out_pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()
