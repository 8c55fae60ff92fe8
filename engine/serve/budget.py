"""The memory bound of the server: one budget of estimated bytes shared by every client.

What counts (estimates measured with ``isan bench serve``, see :func:`job_bytes`):

* a request body while it is read: its bytes (Content-Length is reserved before reading);
* a stream frame read ahead of its answer: its bytes;
* an admitted text while it is normalised: :func:`prepare_bytes` (the normaliser's peak);
* an admitted text from then until its answer has been sent: :func:`job_bytes` of it (the text,
  its symbol ids and input offsets, and with ``per_char`` the bits and the JSON answer);
* the ``logprobs`` of an OpenAI-compatible answer, before they are built: :func:`logprobs_bytes`.

A reservation that does not fit is refused (the caller answers 503 with ``Retry-After``), so the
server never holds more than the budget of request data, however many clients there are.
"""

from __future__ import annotations

import threading

#: bytes per character of an admitted text: the str (1-4 bytes, counted as 4), ids (int32) and input
#: offsets (int32); with per_char, the float64 bits and the JSON answer (about 29 bytes a character).
BYTES_PER_CHAR = 12
BYTES_PER_CHAR_PER_CHAR = 12 + 8 + 32
#: fixed cost of one job (objects, the JSON answer around the numbers)
BYTES_PER_JOB = 4096


#: bytes per input character while a text is normalised and mapped to ids: the text8 normaliser
#: peaks at 63 bytes a character on Shakespeare (tracemalloc; 20 on text8 itself)
BYTES_PER_CHAR_PREPARE = 64


#: bytes an OpenAI ``logprobs`` answer holds until it is sent, per token and per ``top_logprobs``
#: entry. Measured with tracemalloc on the shipped model (k = 0, 1, 5, 27; 20,000 and 100,000 tokens):
#: the Python objects of the answer take 272 bytes a token and 48 an entry, the reference's arrays
#: 8 and 16; the JSON 58 and 23.7, with each choice's list copies 32 a token. Peak, all counted:
#: 3,343 bytes a token at k = 27 (this estimate: 3,472).
LOGPROBS_OBJ_TOKEN, LOGPROBS_OBJ_ENTRY = 352, 84  # built once per prompt
LOGPROBS_JSON_TOKEN, LOGPROBS_JSON_ENTRY = 96, 28  # per choice that sends them


def logprobs_bytes(tokens: int, k: int, copies: int = 1) -> int:
    """The estimated peak memory of the ``logprobs`` of ``tokens`` tokens with ``k`` alternatives each
    (``top_logprobs``), built once and sent in ``copies`` choices (``n`` choices echo one prompt)."""
    return tokens * (LOGPROBS_OBJ_TOKEN + LOGPROBS_OBJ_ENTRY * k
                     + copies * (LOGPROBS_JSON_TOKEN + LOGPROBS_JSON_ENTRY * k))


def prepare_bytes(chars: int) -> int:
    """The estimated peak memory of normalising a text of ``chars`` characters."""
    return BYTES_PER_JOB + chars * BYTES_PER_CHAR_PREPARE


def job_bytes(chars: int, per_char: bool) -> int:
    """The estimated peak memory of one admitted text of ``chars`` characters."""
    return BYTES_PER_JOB + chars * (BYTES_PER_CHAR_PER_CHAR if per_char else BYTES_PER_CHAR)


class Budget:
    """A thread-safe counter of reserved bytes with a limit (``on_change``: called with the bytes
    in use after each change).

    Example:
        >>> b = Budget(100)
        >>> b.try_reserve(60), b.try_reserve(60), b.used
        (True, False, 60)
    """

    def __init__(self, limit: int, on_change=None):
        self.limit = int(limit)
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()
        #: called with ``used`` after each change (a gauge's ``set``), or None
        self.on_change = on_change

    def try_reserve(self, n: int) -> bool:
        """Reserve ``n`` bytes if they fit; False (and nothing reserved) if not."""
        n = int(n)
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            if self.on_change is not None:
                self.on_change(self.used)
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - int(n))
            if self.on_change is not None:
                self.on_change(self.used)


class Reservation:
    """Bytes held in a :class:`Budget` by one request or stream frame; ``release()`` is idempotent,
    ``resize`` grows or shrinks.

    A context manager: ``with Reservation(budget) as res:`` gives the bytes back however the block
    ends (an answer sent, an error, the client gone, the task cancelled), so no exit path can keep
    them reserved.

    Example:
        >>> b = Budget(100)
        >>> with Reservation(b) as res:
        ...     res.grow(60), b.used
        (True, 60)
        >>> b.used
        0
    """

    def __init__(self, budget: Budget):
        self.budget = budget
        self.bytes = 0

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def grow(self, n: int) -> bool:
        if n <= 0:
            return True
        if not self.budget.try_reserve(n):
            return False
        self.bytes += n
        return True

    def resize(self, n: int) -> bool:
        """Hold exactly ``n`` bytes (False, holding what it held, if growing does not fit)."""
        if n > self.bytes:
            return self.grow(n - self.bytes)
        self.budget.release(self.bytes - n)
        self.bytes = n
        return True

    def release(self) -> None:
        self.budget.release(self.bytes)
        self.bytes = 0
