"""An input file's bytes as decoded pieces, each saying whether it ends a checked frame.

A compressed file is a series of units that each carry their own check: a gzip member ends in the
CRC-32 and the length of its data (RFC 1952), a zstd frame in an optional checksum of its content
(RFC 8878). Until a unit decoded to its end and its check passed, none of its output can be trusted:
damage found at the end of a member may have changed any byte of it. A decoder here gives the
decoded bytes in pieces of bounded size (a decompression bomb never comes out in one call) and says
which piece ends a unit; :mod:`isan.engine.corpus.lines` holds a unit's documents until then.

Decoders (all with ``piece()``, ``frame_start``, ``frames``, ``UNIT`` and ``checks``):

- :class:`GzipMembers` (``.gz``): each member by its own ``zlib`` decompressor, zero padding
  between members skipped, as the standard library's ``gzip`` reads them;
- :class:`~isan.engine.corpus.zstd_stream.ZstdFrames` (``.zst``, ``.zstd``);
- :class:`PlainBytes`: a file that is not compressed has nothing to check (``checks`` False).
"""

from __future__ import annotations

import io
import zlib

from isan.errors import IsanError, install_hint

#: what a damaged or cut stream raises while it is decoded (zstandard.ZstdError is added when it is used)
DECODE_ERRORS: tuple = (zlib.error, EOFError, OSError)


class InputFileError(IsanError):
    """A whole input file cannot be read (missing, unreadable, corrupt); the reason is the message."""


def is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def open_input(path: str):
    """A binary file object for a local path or an fsspec URL.

    Raises:
        InputFileError: the file is missing, a directory, not readable, or cannot be opened.
    """
    try:
        if is_url(path):
            import fsspec

            return fsspec.open(path, "rb").open()
        return open(path, "rb")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"{path}: is a directory, not a file") from None
    except PermissionError:
        raise InputFileError(f"{path}: permission denied (cannot read it)") from None
    except OSError as e:
        raise InputFileError(f"{path}: cannot open it ({e.strerror or e})") from None


class PlainBytes:
    """A file that is not compressed, in pieces of :data:`READ` bytes; nothing to check."""

    READ = 1 << 20
    UNIT = "file"
    checks = False

    def __init__(self, raw):
        self._raw, self.frame_start, self.frames = raw, 0, 0

    def piece(self) -> tuple[bytes, bool] | None:
        data = self._raw.read(self.READ)
        return (data, True) if data else None

    def close(self) -> None:
        self._raw.close()


class GzipMembers:
    """The members of a ``.gz`` file decoded one after another, at most :data:`OUT` bytes a call.

    ``piece()`` gives ``(bytes, ends_member)``: ``ends_member`` is True once the member's CRC-32
    and length matched (zlib checks them at the member's end), None at the end of the file.
    Raises ``zlib.error`` for damage, EOFError for a file that ends inside a member.
    """

    READ = 1 << 20
    FEED = 1 << 16
    OUT = 1 << 17
    UNIT = "gzip member"
    checks = True

    def __init__(self, raw):
        self._raw, self._eof = raw, False
        self._in, self._at, self._base = b"", 0, 0  # compressed bytes read; the next to decode; file offset of _in[0]
        self._z = None
        self.frame_start, self.frames = 0, 0

    def _more(self) -> bool:
        """Read more of the file (False at its end)."""
        data = self._raw.read(self.READ) if not self._eof else b""
        if not data:
            self._eof = True
            return False
        self._base += self._at
        self._in, self._at = self._in[self._at :] + data, 0
        return True

    def _skip_padding(self) -> bool:
        """Skip zero bytes after a member, as gzip does; False at the end of the file."""
        while True:
            while self._at < len(self._in) and self._in[self._at] == 0:
                self._at += 1
            if self._at < len(self._in) or not self._more():
                return self._at < len(self._in)

    def piece(self) -> tuple[bytes, bool] | None:
        while True:
            if self._z is None:
                if not self._skip_padding():
                    return None
                self._z, self.frame_start = zlib.decompressobj(31), self._base + self._at
            if self._at >= len(self._in) and not self._more():
                raise EOFError("the file ends inside a gzip member (it was cut short)")
            feed = self._in[self._at : self._at + self.FEED]
            out = self._z.decompress(feed, self.OUT)
            rest = self._z.unused_data if self._z.eof else self._z.unconsumed_tail
            self._at += len(feed) - len(rest)
            if self._z.eof:
                self._z, self.frames = None, self.frames + 1
                self.frame_start = self._base + self._at
                return out, True
            if out:
                return out, False

    def close(self) -> None:
        self._raw.close()


def open_decoder(path: str, raw=None):
    """The decoder of ``path`` by its name (``.gz``, ``.zst``/``.zstd``, else plain), over ``raw``
    (default: the file opened with :func:`open_input`).

    Raises:
        InputFileError: the file cannot be opened, or ``.zst`` needs zstandard.
    """
    raw = open_input(path) if raw is None else raw
    name = path.lower()
    if name.endswith(".gz"):
        return GzipMembers(raw)
    if name.endswith((".zst", ".zstd")):
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise InputFileError(f"{path}: reading .zst needs zstandard: {install_hint('corpus')}") from None
        from isan.engine.corpus.zstd_stream import ZstdFrames

        return ZstdFrames(raw, zstandard)
    return PlainBytes(raw)


def decode_errors() -> tuple:
    """The exceptions a damaged or cut stream raises from ``piece()`` (with zstandard's, when installed)."""
    try:
        import zstandard
    except ImportError:
        return DECODE_ERRORS
    return DECODE_ERRORS + (zstandard.ZstdError,)


def check_frame(path: str, start: int) -> str | None:
    """Decode the frame (member) of ``path`` that starts at byte ``start`` to its end, keeping
    nothing, in a second reading of the file: None when it checks out, else why not.

    This is how a frame too large to hold in memory is checked before its documents go out
    (its compressed bytes are read and decoded twice)."""
    raw = open_input(path)
    try:
        try:
            raw.seek(start)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            left = start
            while left > 0:
                got = raw.read(min(left, 1 << 20))
                if not got:
                    return "the file is shorter than when it was first read"
                left -= len(got)
        dec = open_decoder(path, raw)
        while True:
            got = dec.piece()
            if got is None:
                return "the file ends before the frame"
            if got[1]:
                return None
    except decode_errors() as e:
        return f"{type(e).__name__}: {e}"
    finally:
        raw.close()


class DecodedStream(io.RawIOBase):
    """A decoder's output as a readable binary stream (a text file read as one document in blocks)."""

    def __init__(self, decoder):
        super().__init__()
        self._dec, self._out, self._pos = decoder, b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._pos >= len(self._out):
            got = self._dec.piece()
            if got is None:
                return 0
            self._out, self._pos = got[0], 0
        n = min(len(b), len(self._out) - self._pos)
        b[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._dec.close()
        super().close()
