"""A client of ``/v1/stream`` that survives the replica it talks to: :class:`ResumableStream`.

Behind a load balancer, ``isan-serve`` replicas that share the model and the state secret
(``--state-secret-file`` or ``ISAN_STATE_SECRET``) accept each other's snapshots, so a stream can go on
on another replica from its last snapshot (docs/guide/deployment.md, 'Streams that survive a
replica'). This module does that for a client; it needs only the ``websockets`` library (the
``serve`` extra) and imports nothing of the server.

The protocol, as the client runs it:

1. Each text chunk goes as one frame ``{"text": chunk, ...options}``; every ``snapshot_every``-th
   also asks ``"snapshot": true``, and its answer carries ``"state"``, a signed snapshot of the state
   and the running totals after it (docs/guide/server.md, 'State snapshots'). The client keeps the
   last snapshot, the running totals it was taken at (``total_chars``, ``total_bits`` of that
   answer) and every frame sent since, answered or not.
2. The stream is lost when its connection closes abnormally (a replica killed: no close frame,
   code 1006), with a code that another replica may not repeat (1001 going away, 1011 internal
   error or keepalive timeout, 1012 service restart, 1013 try again later, 1014 bad gateway), or
   when a connection cannot be opened. A replica that shuts down gracefully first sends
   ``{"event": "shutdown", "state": snapshot}``, the state after the last frame it answered, then
   closes with 1012: that snapshot replaces the client's own (the frames it answered are then
   settled) and the frames it did not answer are re-sent. A shutdown frame that comes before the
   connection answered the client's restore (or reset) hands back nothing of this stream (the
   replica had not restored it yet; ``isan-serve`` then sends ``"state": null``): its state is
   ignored and the client keeps its own snapshot.
3. To resume, the client opens the same URL again (the balancer sends it to a live replica),
   sends ``{"restore": snapshot}`` (``{"reset": true}`` when it has none: the initial state) and
   re-sends the frames since, in order, before reading. The restore's answer must give the totals
   the snapshot was taken at (else :class:`StreamLostError`: the shutdown snapshot did not follow
   the last answer); an error answer there is the replica refusing the stream or the snapshot.
   Answers to frames already handed to the caller are read and dropped; the others are handed
   on as usual. A snapshot holds the state and the totals exactly (float64;
   engine/serve/snapshot.py), so every answer equals that of a stream that was never
   interrupted, within the float32 rounding of the server's batched kernel.
4. Attempts: ``retries`` tries to open a connection per loss, the first at once, then after
   ``backoff_s``, doubled each time up to ``max_backoff_s`` (with jitter); a loss right after a
   resume, before any new answer, counts as a further attempt. Beyond them, on a close that no
   replica would undo (1002, 1003, 1007 not UTF-8, 1008 API key, Host or origin refused, 1009
   frame too big, 1010), on a handshake answered 4xx, or when the restore is refused (400 not a
   snapshot, 401 API key, 403 changed, another secret or a Host refused, 409 another model, 422
   totals out of range), :class:`StreamLostError`.

A frame answered ``{"error", "status"}`` (a chunk the model cannot score, 503 when the server is
full) leaves the stream's state as it was (docs/guide/server.md, '/v1/stream'): :meth:`recv`
raises :class:`FrameError` for it, the stream goes on, and the frame is not re-sent on a resume.
A frame re-sent after a resume must be answered as it was the first time: a 503 then is one more
loss (the stream resumes again), any other refusal a :class:`StreamLostError`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from dataclasses import dataclass

from isan.errors import IsanError, install_hint

#: close codes after which no replica would take the stream: protocol error, data the server does
#: not take, text that is not UTF-8, policy (API key, Host, origin), frame too big, extension
FATAL_CLOSE_CODES = frozenset({1002, 1003, 1007, 1008, 1009, 1010})
#: answers to a restore that no retry changes: not a snapshot (400), no API key (401), changed or another
#: secret, or a Host refused (403), another model (409), totals out of range (422)
FATAL_RESTORE_STATUSES = frozenset({400, 401, 403, 409, 422})
#: the fields the client sets itself in a frame
_OWN_FIELDS = frozenset({"text", "snapshot", "restore", "reset", "return_state", "state"})


class FrameError(IsanError, ValueError):
    """The server answered a frame with ``{"error", "status"}``; the stream's state is unchanged.

    Attributes:
        status: the HTTP status the answer names (422: a character outside the alphabet, ...).
        answer: the whole answer (a dict).
    """

    def __init__(self, answer: dict):
        super().__init__(f"the server refused the frame ({answer.get('status')}): {answer.get('error')}")
        self.status = answer.get("status")
        self.answer = answer


class StreamLostError(IsanError, ConnectionError):
    """The stream cannot go on: no connection within the retries, a close no replica would undo,
    or a snapshot the replica refused. The message says which and what to check.

    Attributes:
        code: the WebSocket close code, or the status of a refused restore, or None.
    """

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class _Lost(Exception):
    """One connection ended (internal): ``fatal`` when no retry would help."""

    def __init__(self, why: str, code: int | None = None, fatal: bool = False):
        super().__init__(why)
        self.code, self.fatal = code, fatal


@dataclass
class _Sent:
    frame: str          # the frame as sent (JSON)
    delivered: bool = False   # its answer went to the caller


def _websockets():
    try:
        from websockets.asyncio.client import connect
        from websockets import exceptions
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"the stream client needs websockets 13 or later: {install_hint('serve')}",
                                  name=e.name) from None
    return connect, exceptions


def _why_closed(exc, last_error: dict | None) -> _Lost:
    """A ``ConnectionClosed`` as a :class:`_Lost`, with the server's last error frame if it sent one."""
    rcvd = getattr(exc, "rcvd", None)
    code = rcvd.code if rcvd is not None else 1006
    why = f"closed with code {code}" + (f" ({rcvd.reason})" if rcvd is not None and rcvd.reason else "")
    if rcvd is None:
        why = "closed abnormally (no close frame: the replica or the path to it went away)"
    if last_error is not None:
        why += f" after the error {last_error.get('status')}: {last_error.get('error')}"
    return _Lost(why, code, fatal=code in FATAL_CLOSE_CODES)


class ResumableStream:
    """A ``/v1/stream`` that resumes on another replica from its last snapshot (async).

    Use as ``async with ResumableStream(url) as s: answer = await s.score(chunk)``; or
    :meth:`send` several chunks ahead and :meth:`recv` their answers in order. Each answer is the
    server's dict (``chars``, ``bits``, ``bpc``, ``nnl``, ``normalization``, ``total_chars``,
    ``total_bits``, ``total_bpc``, ``total_nnl``; ``state`` on the frames that asked for a
    snapshot; ``per_char_bits`` with ``per_char``), whatever replica scored it. The protocol is in
    the module's docstring.

    Args:
        url: ``ws://HOST:PORT/v1/stream`` (``wss://`` through TLS); ``http://`` and ``https://`` are
            taken as ``ws://`` and ``wss://``. Behind a load balancer, the balancer's address.
        options: fields sent in every text frame, as ``/v1/score`` takes them (``per_char``,
            ``unknown``, ``replacement``, ``normalize``, ``top_k``); not ``text``, ``snapshot``,
            ``restore``, ``reset``, ``state`` or ``return_state``, which the client sets.
        state: a snapshot to start from (else the model's initial state).
        api_key: sent as ``Authorization: Bearer KEY`` (servers with ``--api-key-file``).
        snapshot_every: ask for a snapshot every this many text frames (1: every frame, 2.4 KB
            an answer for d = 216; more: fewer bytes, more frames re-sent after a loss).
        retries: attempts to open a connection after each loss (and for the first one).
        backoff_s, max_backoff_s: the wait before the second attempt, doubled each attempt up to
            ``max_backoff_s`` (seconds; each wait drawn in [w/2, w]).
        open_timeout_s: seconds to open a connection (TCP, the balancer and the handshake).
        connect_options: more keyword arguments of ``websockets.asyncio.client.connect`` (the
            defaults here: no limit on an answer's size or on answers waiting to be read, so
            frames sent ahead never stall the connection; websockets' keepalive pings every 20 s
            find a replica that stopped answering).

    Attributes:
        snapshot: the last snapshot (str) or None (the initial state, or ``state``).
        total_chars, total_bits: the running totals of the last answer read (int, float bits).
        resumes: seconds each resume took, from the loss to the restore's answer (a list of float).
        handed_back: shutdown frames whose snapshot the client took (int; a replica's graceful
            shutdown).
        answers_dropped: answers read and dropped because the caller already had them: frames
            answered before a loss, then re-sent (int; none after a graceful shutdown's snapshot).

    Raises:
        ValueError: ``options`` names a field the client sets, or ``snapshot_every`` / ``retries``
            below 1.
        ModuleNotFoundError: websockets is not installed (the message says how to install it).
    """

    def __init__(self, url: str, *, options: dict | None = None, state: str | None = None,
                 api_key: str | None = None, snapshot_every: int = 1, retries: int = 6, backoff_s: float = 0.25,
                 max_backoff_s: float = 4.0, open_timeout_s: float = 10.0, connect_options: dict | None = None):
        options = dict(options or {})
        if _OWN_FIELDS & options.keys():
            raise ValueError(f"options may not set {sorted(_OWN_FIELDS & options.keys())}: the client sets them")
        if snapshot_every < 1 or retries < 1:
            raise ValueError(f"snapshot_every and retries must be at least 1 (got {snapshot_every}, {retries})")
        for http, ws in (("http://", "ws://"), ("https://", "wss://")):
            if url.startswith(http):
                url = ws + url[len(http):]
        self.url = url
        self.options = options
        self.snapshot_every = snapshot_every
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._connect, self._exc = _websockets()
        self._connect_kw = {"open_timeout": open_timeout_s, "max_size": None, "max_queue": None,
                            **({"additional_headers": {"Authorization": f"Bearer {api_key}"}} if api_key else {}),
                            **(connect_options or {})}
        self.snapshot: str | None = state
        self._snap_totals: tuple[int, float] | None = None if state else (0, 0.0)
        self._pending: deque[_Sent] = deque()   # frames sent since the snapshot, in order
        self._answered = 0                       # how many of them the current connection answered
        self._frames = 0
        self._streak = 0                         # resumes since the last new answer
        self._ws = None
        self._last_error: dict | None = None     # the last error frame read (a refusal before a close)
        self._restored = False                   # the current connection answered the restore (or reset)
        self.total_chars = 0 if state is None else None
        self.total_bits = 0.0 if state is None else None
        self.resumes: list[float] = []
        self.handed_back = 0
        self.answers_dropped = 0

    # ---- the caller's API -------------------------------------------------------------------
    async def connect(self) -> "ResumableStream":
        """Open the stream (restoring ``state`` if given). Raises :class:`StreamLostError`."""
        if self._ws is None:
            await self._open()
        return self

    async def send(self, text: str) -> None:
        """Send one chunk; its answer comes from :meth:`recv`, in order. A lost connection is found
        and resumed by the next :meth:`recv` (the chunk is kept and re-sent)."""
        if not isinstance(text, str):
            raise TypeError(f"a chunk is a str, not {type(text).__name__}")
        await self.connect()
        self._frames += 1
        frame = {**self.options, "text": text}
        if self._frames % self.snapshot_every == 0:
            frame["snapshot"] = True
        sent = _Sent(json.dumps(frame, ensure_ascii=False))
        self._pending.append(sent)
        try:
            await self._ws.send(sent.frame)
        except self._exc.ConnectionClosed:
            pass  # recv reads what the replica answered before it went, then resumes

    async def recv(self) -> dict:
        """The answer to the oldest chunk not yet answered.

        Raises:
            FrameError: the server refused that chunk (the stream goes on, its state unchanged).
            StreamLostError: the stream could not be resumed.
            RuntimeError: every chunk sent has been answered.
        """
        while True:
            if self._answered >= len(self._pending):
                raise RuntimeError("recv() with no chunk waiting for its answer: send() one first")
            try:
                answer = await self._read()
            except _Lost as lost:
                await self._resume(lost)
                continue
            sent = self._pending[self._answered]
            if "error" in answer:
                status = answer.get("status")
                if sent.delivered:  # re-sent after a resume and refused now: the state must have it, again
                    await self._resume(_Lost(f"a chunk re-sent after a resume was refused ({status}: "
                                             f"{answer.get('error')})", status, fatal=status != 503))
                    continue
                del self._pending[self._answered]  # the state is as before: settled, not re-sent
                raise FrameError(answer)
            self._settle(answer)
            if not sent.delivered:
                sent.delivered = True
                self._streak = 0
                return answer
            self.answers_dropped += 1

    async def score(self, text: str) -> dict:
        """Send one chunk and return its answer (see :meth:`recv`)."""
        await self.send(text)
        return await self.recv()

    async def close(self) -> None:
        """Close the stream (code 1000)."""
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()

    async def __aenter__(self) -> "ResumableStream":
        return await self.connect()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- inside -----------------------------------------------------------------------------
    def _settle(self, answer: dict) -> None:
        """Take in a good answer to ``_pending[_answered]``: totals, and the snapshot if it has one."""
        self._answered += 1
        self.total_chars, self.total_bits = answer.get("total_chars"), answer.get("total_bits")
        if "state" in answer:
            self._new_snapshot(answer["state"])

    def _new_snapshot(self, token: str) -> None:
        """``token`` is the state after the frames answered so far: they need no re-sending."""
        self.snapshot = token
        self._snap_totals = None if self.total_chars is None else (self.total_chars, self.total_bits)
        for _ in range(self._answered):
            self._pending.popleft()
        self._answered = 0

    async def _read(self) -> dict:
        """The next answer of the current connection (a shutdown event is taken in and skipped)."""
        while True:
            try:
                raw = await self._ws.recv()
            except self._exc.ConnectionClosed as e:
                raise _why_closed(e, self._last_error) from None
            try:
                msg = json.loads(raw)
            except (TypeError, ValueError):
                raise _Lost(f"the server sent a frame that is not JSON: {str(raw)[:80]!r}") from None
            if not isinstance(msg, dict):
                raise _Lost(f"the server sent a frame that is not an object: {str(raw)[:80]!r}")
            if msg.get("event") == "shutdown":  # the replica hands the stream back: its state now
                # before the restore's answer the replica holds nothing of this stream: keep the client's snapshot
                if self._restored and isinstance(msg.get("state"), str):
                    self._new_snapshot(msg["state"])
                    self.handed_back += 1
                continue
            if "error" in msg and msg.get("status") == 408:  # the server closes a stream idle too long
                raise _Lost(f"closed by the server: {msg['error']}")
            self._last_error = msg if "error" in msg else None
            return msg

    async def _resume(self, lost: _Lost) -> None:
        t0 = time.perf_counter()
        self._streak += 1
        if lost.fatal or self._streak > self.retries:
            await self._drop()
            raise StreamLostError(f"the stream at {self.url} was {lost}"
                                  + ("; another replica would not take it either" if lost.fatal else
                                     f"; lost {self._streak - 1} times in a row without an answer"), code=lost.code)
        await self._open(lost)
        self.resumes.append(time.perf_counter() - t0)

    async def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                await ws.close()
            except Exception:  # the connection is gone already
                pass

    async def _open(self, lost: _Lost | None = None) -> None:
        """Connect (again), restore the snapshot and re-send the frames since; ``retries`` attempts,
        waiting longer each time (and from the start when the last resume led to no answer)."""
        await self._drop()
        why = str(lost) if lost else None
        for attempt in range(self.retries):
            n = attempt + max(self._streak - 1, 0)
            if n:
                wait = min(self.backoff_s * 2 ** (n - 1), self.max_backoff_s)
                await asyncio.sleep(random.uniform(wait / 2, wait))
            try:
                await self._restore()
                return
            except _Lost as e:
                await self._drop()
                if e.fatal:
                    raise StreamLostError(f"the stream at {self.url} cannot go on: {e}", code=e.code) from None
                why = str(e)
        raise StreamLostError(f"no stream at {self.url} after {self.retries} attempts"
                              + (f" ({why})" if why else "") + "; is a replica up and ready (GET /healthz)?",
                              code=lost.code if lost else None)

    async def _restore(self) -> None:
        """One attempt: connect, send the restore (or a reset: the initial state) and the frames
        since, and read the restore's answer (a refused connection's error frame comes as that)."""
        try:
            self._ws = await self._connect(self.url, **self._connect_kw)
        except self._exc.InvalidStatus as e:
            status = e.response.status_code
            raise _Lost(f"the handshake was answered {status}", status,
                        fatal=400 <= status < 500 and status not in (408, 429)) from None
        except self._exc.InvalidURI as e:
            raise _Lost(str(e), fatal=True) from None
        except (OSError, asyncio.TimeoutError, self._exc.InvalidHandshake) as e:
            raise _Lost(f"cannot connect: {e}") from None
        self._answered = 0
        self._last_error = None
        self._restored = False
        try:
            await self._ws.send(json.dumps({"restore": self.snapshot} if self.snapshot else {"reset": True}))
            for sent in self._pending:
                await self._ws.send(sent.frame)
        except self._exc.ConnectionClosed:
            pass  # the answers say why
        answer = await self._read()
        if "error" in answer:
            status = answer.get("status")
            raise _Lost(f"the replica refused the {'snapshot' if self.snapshot else 'stream'} ({status}: "
                        f"{answer.get('error')})" + ("; replicas need the same model and the same "
                                                    "--state-secret-file" if status in (403, 409) else ""),
                        status, fatal=status in FATAL_RESTORE_STATUSES)
        got = (answer.get("total_chars"), answer.get("total_bits"))
        if self._snap_totals is not None and got != self._snap_totals:
            raise _Lost(f"the restored stream is at {got[0]} characters, {got[1]} bits; the snapshot was taken at "
                        f"{self._snap_totals[0]}, {self._snap_totals[1]}", fatal=True)
        self._snap_totals = got
        self.total_chars, self.total_bits = got
        self._restored = True


class SyncResumableStream:
    """:class:`ResumableStream` for code without an event loop: the same arguments and methods,
    each run to its end on a private event loop (not usable inside a running loop: use the async
    class there). ``with SyncResumableStream(url) as s: s.score(chunk)``."""

    def __init__(self, url: str, **kwargs):
        self._loop = asyncio.new_event_loop()
        self.stream = ResumableStream(url, **kwargs)

    def _run(self, coro):
        return self._loop.run_until_complete(coro)

    def connect(self) -> "SyncResumableStream":
        """:meth:`ResumableStream.connect`."""
        self._run(self.stream.connect())
        return self

    def send(self, text: str) -> None:
        """:meth:`ResumableStream.send`."""
        self._run(self.stream.send(text))

    def recv(self) -> dict:
        """:meth:`ResumableStream.recv`."""
        return self._run(self.stream.recv())

    def score(self, text: str) -> dict:
        """:meth:`ResumableStream.score`."""
        return self._run(self.stream.score(text))

    def close(self) -> None:
        """Close the stream and the private event loop."""
        if not self._loop.is_closed():
            self._run(self.stream.close())
            self._loop.close()

    def __enter__(self) -> "SyncResumableStream":
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name):  # snapshot, total_chars, total_bits, resumes
        if name == "stream":
            raise AttributeError(name)
        return getattr(self.stream, name)
