"""One error shape for every 4xx and 5xx answer: ``{"error": message, "status": code, ...}``.

The message says what to fix. Extra fields: ``offset`` and ``cause`` for a diverging state (422),
``retry_after_s`` for an overloaded server (503).
"""

from __future__ import annotations

import re

from isan.errors import AlphabetError, IsanError, StateDivergedError, TextTooLongError


class RequestError(Exception):
    """A request the server answers with ``status`` and ``message`` (plus ``extra`` fields)."""

    def __init__(self, status: int, message: str, extra: dict | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": self.message, "status": self.status, **self.extra}


def busy(message: str, retry_after_s: int = 1) -> RequestError:
    """503: the server is at one of its limits; retry later."""
    return RequestError(503, message, {"retry_after_s": retry_after_s}, {"Retry-After": str(retry_after_s)})


def status_of(e: IsanError) -> int:
    """422 for text the model cannot score (characters outside its alphabet, a diverging state),
    413 for a text over a limit, a snapshot's own status, 400 otherwise."""
    if isinstance(e, (AlphabetError, StateDivergedError)):
        return 422
    if isinstance(e, TextTooLongError):
        return 413
    status = getattr(e, "status", None)
    if isinstance(status, int):
        return status
    return 400


def from_isan(e: IsanError) -> RequestError:
    """The answer to a library error (the message is the library's, which says what to fix)."""
    extra = {}
    if isinstance(e, StateDivergedError):
        extra = {"offset": getattr(e, "input_offset", e.offset), "cause": e.cause}
    return RequestError(status_of(e), str(e), extra)


def shift_diverged(e: StateDivergedError, start: int, offsets, normalizer: str | None) -> StateDivergedError:
    """``e``, raised for a slice of a text that starts at scored character ``start``, in terms of the
    whole text: offsets counted from its start and mapped to the input through ``offsets``."""
    if e.offset is None:
        return e
    pos = start + int(e.offset)
    inp = int(offsets[pos]) if offsets is not None and 0 <= pos < len(offsets) else pos
    where = f"input offset {inp}" + (f" (scored character {pos}, after {normalizer} normalisation)" if inp != pos else "")
    msg = re.sub(r"(input|character) offset \d+( \(scored character \d+, after [^)]* normalisation\))?", where,
                 str(e), count=1)
    msg = re.sub(r"^text \d+ of the batch: ", "", msg)
    new = StateDivergedError(msg, offset=pos, cause=e.cause)
    new.input_offset = inp
    return new
