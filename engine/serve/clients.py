"""One connection's side of a request (an HTTP request or a stream): :class:`Client`, whose
:meth:`~Client.leave` fails the job it waits for at once; :class:`ClientGone` when it left, and
:class:`NotReady` while the model is not loaded.
"""

from __future__ import annotations

import asyncio


class ClientGone(Exception):
    """The client disconnected while its text was being scored (its work was dropped)."""


class TimedOut(Exception):
    """A job waited longer than the request's time limit (its work was dropped)."""


class Client:
    """One connection (an HTTP request or a stream): :meth:`leave` when it disconnects fails the job
    it waits for at once (the scheduler drops the rest of that job's work)."""

    __slots__ = ("gone", "_futs")

    def __init__(self):
        self.gone = False
        self._futs: list[asyncio.Future] = []

    def leave(self) -> None:
        self.gone = True
        for fut in self._futs:
            if not fut.done():
                fut.set_exception(ClientGone())


def expire_future(fut: asyncio.Future) -> None:
    """Fail ``fut`` with :class:`TimedOut` unless it is done."""
    if not fut.done():
        fut.set_exception(TimedOut())


class NotReady(Exception):
    """The model is not loaded (yet): every endpoint that needs it answers 503."""
