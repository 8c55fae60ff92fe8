"""An input's non-blank lines, in bounded memory, each let go only once the bytes it came from checked out.

Two guarantees for every line-based format (JSONL, text one document a line):

- **Bounded memory.** A line longer than ``max_line_bytes`` is not kept: it becomes a
  :class:`Line` without bytes (its document's error says so) and the rest of it is skipped as it
  streams by. Blank lines (only spaces, tabs and line breaks) are skipped by the buffer, not one by
  one, so a file of nothing but line breaks costs no more than decoding it.
- **Nothing from a damaged frame.** A compressed file's lines are held until the gzip member or zstd
  frame they came from decoded to its end and its check (CRC-32 and length, the zstd content
  checksum where the frame has one) passed (:mod:`isan.engine.corpus.frames`). When a frame fails,
  its lines are withheld, and :class:`~isan.engine.corpus.frames.InputFileError` says how many and
  that the frames before it are kept. A frame whose held lines pass ``hold_bytes`` is checked first,
  in a second reading of the file (:func:`~isan.engine.corpus.frames.check_frame`), and its lines
  then go out as they come: memory stays bounded at the price of decoding the frame twice.
"""

from __future__ import annotations

import struct
import sys
from collections import deque
from dataclasses import dataclass
from typing import Iterator

from isan.engine.corpus.frames import InputFileError, check_frame, decode_errors, open_decoder, open_input

#: the longest line kept, in bytes (a longer one is its document's error); ``--max-line-bytes``
MAX_LINE_BYTES = 64 << 20
#: memory a frame's lines may take while they are held until the frame checks out: their bytes and
#: :data:`LINE_COST` each (a frame with more is checked first, in a second reading of the file)
HOLD_BYTES = 64 << 20

#: a byte to 1 when it is not blank (what ``bytes.strip()`` keeps), else 0: one ``translate`` a piece,
#: then ``find(1)`` finds the next non-blank byte at memchr speed
_NONBLANK_FLAGS = bytes(0 if c in b" \t\n\r\x0b\x0c" else 1 for c in range(256))


@dataclass(slots=True)
class Line:
    """A non-blank line: its number (1-based, blank lines counted), its bytes (with the line break;
    None when it is longer than the limit), its length in bytes, and the file's position (bytes of
    the file read, -1 when unknown) when it went out."""

    lineno: int
    raw: bytes | None
    length: int
    file_pos: int = -1


#: bytes a held line costs besides its own: the Line, its bytes object's header, its int fields
#: past the small-int cache, and its deque slot (so that many short lines are held within the limit too)
LINE_COST = (sys.getsizeof(Line(1 << 40, b"", 0, 1 << 40)) + sys.getsizeof(b"") + 2 * sys.getsizeof(1 << 40)
             + struct.calcsize("P"))


class LineSplitter:
    """Bytes fed in pieces to the non-blank lines they hold, none longer than ``max_bytes`` kept.

    The buffer holds the unfinished line only; each byte is scanned once for a line break (and, at
    a line's start, for its first non-blank byte)."""

    def __init__(self, max_bytes: int = MAX_LINE_BYTES):
        self.max = max_bytes
        self._buf = bytearray()
        self._lineno = 1  # the number of the line that starts the buffer
        self._content = False  # the buffer's unfinished line has a non-blank byte
        self._skipping = 0  # > 0: bytes of an over-long line skipped so far
        self._skip_content = False

    def feed(self, data: bytes) -> list[Line]:
        out: list[Line] = []
        if self._skipping:
            data = self._skip(data, out)
        buf = self._buf
        offset = look = len(buf)  # buf[:look] was scanned: no line break in it (nor a non-blank byte, unless _content)
        buf += data
        flags = None  # data.translate(_NONBLANK_FLAGS), made at the first blank byte that starts a line
        pos, content = 0, self._content
        while True:
            if not content:
                if look < len(buf) and _NONBLANK_FLAGS[buf[look]]:  # the usual line: it starts at once
                    i = look - offset
                else:
                    flags = flags if flags is not None else data.translate(_NONBLANK_FLAGS)  # flags[i]: buf[offset + i]'s
                    i = flags.find(1, look - offset)
                end = i + offset if i >= 0 else len(buf)
                nl = buf.rfind(b"\n", look, end)
                if nl >= 0:  # blank lines before the next non-blank byte
                    self._lineno += buf.count(b"\n", look, nl + 1)
                    pos = nl + 1
                if i < 0:
                    break
                content, look = True, end
            e = buf.find(b"\n", look)
            if e < 0:
                break
            n = e + 1 - pos
            out.append(Line(self._lineno, bytes(buf[pos : e + 1]) if n <= self.max else None, n))
            self._lineno += 1
            pos = look = e + 1
            content = False
        if len(buf) - pos > self.max:  # an unfinished line over the limit: skip the rest of it
            self._skipping, self._skip_content = len(buf) - pos, content
            pos, content = len(buf), False
        del buf[:pos]
        self._content = content
        return out

    def _skip(self, data: bytes, out: list) -> bytes:
        """Skip ``data`` up to the end of the over-long line; returns what follows it."""
        nl = data.find(b"\n")
        part = data if nl < 0 else data[: nl + 1]
        self._skipping += len(part)
        self._skip_content = self._skip_content or (bool(part) and not part.isspace())  # the blanks strip() drops
        if nl < 0:
            return b""
        self._end_skip(out)
        return data[nl + 1 :]

    def _end_skip(self, out: list) -> None:
        if self._skip_content:
            out.append(Line(self._lineno, None, self._skipping))
        self._lineno += 1
        self._skipping, self._skip_content = 0, False

    @property
    def pending(self) -> bool:
        """Whether a non-blank line was begun and not finished (what a damaged stream cuts off)."""
        return self._content or bool(self._skip_content)

    def finish(self) -> list[Line]:
        """The last line, when the input does not end with a line break."""
        out: list[Line] = []
        if self._skipping:
            self._end_skip(out)
        elif self._content:
            out.append(Line(self._lineno, bytes(self._buf), len(self._buf)))
        self._buf = bytearray()
        self._content = False
        return out


def _tell(f) -> int:
    """A file's position (bytes), -1 when it cannot say."""
    try:
        return f.tell()
    except (OSError, ValueError, AttributeError):
        return -1


def checked_lines(path: str, max_line_bytes: int = MAX_LINE_BYTES, hold_bytes: int | None = None) -> Iterator[Line]:
    """The non-blank lines of ``path`` (decompressed by its name), each once its frame checked out
    (``hold_bytes``: of a frame's lines held in memory before the frame is checked ahead; default
    :data:`HOLD_BYTES`).

    Raises:
        InputFileError: (from the iterator) the file cannot be opened, or a frame is damaged or cut
            short: the message says which and how many documents it withheld; lines already
            yielded stand (they came from frames that checked out).
    """
    raw = open_input(path)
    try:
        dec = open_decoder(path, raw)
    except BaseException:
        raw.close()
        raise
    try:
        yield from _HeldLines(path, dec, raw, max_line_bytes, HOLD_BYTES if hold_bytes is None else hold_bytes).lines()
    finally:
        dec.close()


class _HeldLines:
    """The state of :func:`checked_lines`: the lines held for the frame being decoded."""

    def __init__(self, path: str, dec, raw, max_line_bytes: int, hold_bytes: int):
        self.path, self.dec, self.raw, self.hold = path, dec, raw, hold_bytes
        self.split = LineSplitter(max_line_bytes)
        self.held: deque[Line] = deque()
        self.held_bytes = 0
        self.trusted = not dec.checks  # the frame's lines may go out as they come
        self.failed: str | None = None  # the frame failed its check (found by check_frame): withhold
        self.withheld = 0
        self.kept = 0

    def lines(self) -> Iterator[Line]:
        errors = decode_errors()
        while True:
            try:
                got = self.dec.piece()
            except errors as e:
                raise self._damaged(f"{type(e).__name__}: {e}") from None
            if got is None:
                break
            data, frame_end = got
            yield from self._take(self.split.feed(data))
            if frame_end:
                if self.failed:  # the second reading failed where this one passed: the file changed
                    raise self._damaged(self.failed)
                yield from self._release()
                self.trusted = not self.dec.checks
            elif self.held_bytes > self.hold and not self.failed:
                yield from self._check_ahead()
        yield from self._take(self.split.finish())
        yield from self._release()

    def _take(self, lines: list[Line]) -> Iterator[Line]:
        for line in lines:
            if self.failed:
                self.withheld += 1
            elif self.trusted:
                line.file_pos = _tell(self.raw)
                self.kept += 1
                yield line
            else:
                self.held.append(line)
                self.held_bytes += (line.length if line.raw is not None else 0) + LINE_COST

    def _release(self) -> Iterator[Line]:
        pos = _tell(self.raw)
        while self.held:
            line = self.held.popleft()
            line.file_pos = pos
            self.kept += 1
            yield line
        self.held_bytes = 0

    def _check_ahead(self) -> Iterator[Line]:
        """The frame's held lines passed the limit: check the frame in a second reading."""
        why = check_frame(self.path, self.dec.frame_start)
        if why is None:
            self.trusted = True
            yield from self._release()
        else:
            self.failed = why
            self.withheld += len(self.held)
            self.held.clear()
            self.held_bytes = 0

    def _damaged(self, why: str) -> InputFileError:
        if not self.dec.checks:
            return InputFileError(f"{self.path}: the file is damaged or truncated ({why}); the {self.kept:,} documents "
                                  "read before it are kept")
        withheld = self.withheld + len(self.held) + int(self.split.pending)
        unit, n, start = self.dec.UNIT, self.dec.frames + 1, self.dec.frame_start
        return InputFileError(
            f"{self.path}: the file is damaged or truncated ({why}) in its {unit} {n:,} (from byte {start:,}): "
            f"the {withheld:,} document{'' if withheld == 1 else 's'} read from it {'is' if withheld == 1 else 'are'} "
            f"withheld (a {unit} that fails its check may be wrong anywhere) and nothing after it is read; "
            f"{self.kept:,} document{'' if self.kept == 1 else 's'} of the {unit}s before it "
            f"{'is' if self.kept == 1 else 'are'} kept")
