"""The server's limits and switches, one frozen dataclass (``isan-serve --help`` names each option).

Every limit protects something stated in its field's comment; the defaults are sized for the
2-core machines of DESIGN.md section 6 (measured by ``isan bench serve``).
"""

from __future__ import annotations

from dataclasses import dataclass

from isan.errors import IsanError

DEFAULT_MAX_CHARS = 1_000_000


@dataclass(frozen=True)
class ServeConfig:
    """Limits of one ``isan-serve`` process.

    Attributes:
        max_chars: the largest text of one request or stream frame, in characters (413 above it).
        max_pending_mb: the memory bound: the estimated bytes of every request body being read,
            every text admitted and not yet answered and every frame read ahead, over all clients
            (:mod:`isan.engine.serve.budget` says what counts). A request that does not fit gets 503
            with ``Retry-After``; nothing is queued beyond it.
        max_streams: open WebSocket streams; one more is answered with an error frame (503) and
            closed with code 1013 (try again later).
        max_stream_frames: frames one stream may send ahead of its answers (pipelining); beyond
            that the server stops reading the stream (TCP back-pressure).
        round_chars: characters one scheduler round scores over all jobs (the batch size). A round
            serves every pending job max-min fairly; a long text takes several rounds, so a short
            request waits at most about one round behind it.
        min_slice_chars: the smallest slice of a long text scored in one round.
        request_timeout_s: a request or frame not answered by then gets 503 and its remaining
            work is dropped.
        stream_idle_timeout_s: a stream that sends nothing for this long is closed (code 1001).
        batching: True: each round scores all its slices in one ``Engine.score_batch`` call (the
            compiled symbol-grouped kernel, exact within float32 rounding). False: each slice is
            scored alone with ``Engine.score`` on the engine's path (``--path``), one after another.
        threads: threads for the engine's kernels (None: one fewer than the engine's, at least 1,
            so that the event loop keeps a core; see :func:`isan.engine.serve.service.server_threads`).
        state_secret: the HMAC key of state snapshots (:mod:`isan.engine.serve.snapshot`); None: a
            random key per process, so snapshots are valid until the server restarts.
    """

    max_chars: int = DEFAULT_MAX_CHARS
    max_pending_mb: float = 512.0
    max_streams: int = 2048
    max_stream_frames: int = 8
    round_chars: int = 131_072
    min_slice_chars: int = 1024
    request_timeout_s: float = 120.0
    stream_idle_timeout_s: float = 600.0
    batching: bool = True
    threads: int | None = None
    state_secret: bytes | None = None

    def __post_init__(self) -> None:
        checks = [
            ("max_chars", self.max_chars >= 1),
            ("max_pending_mb", self.max_pending_mb > 0),
            ("max_streams", self.max_streams >= 1),
            ("max_stream_frames", self.max_stream_frames >= 1),
            ("round_chars", self.round_chars >= 1),
            ("min_slice_chars", 1 <= self.min_slice_chars <= self.round_chars),
            ("request_timeout_s", self.request_timeout_s > 0),
            ("stream_idle_timeout_s", self.stream_idle_timeout_s > 0),
            ("threads", self.threads is None or self.threads >= 1),
        ]
        for name, ok in checks:
            if not ok:
                raise IsanError(f"--{name.replace('_', '-')} = {getattr(self, name)!r} is out of range")
        if self.max_chars >= 2**31:
            raise IsanError("--max-chars must be below 2**31")
        if self.state_secret is not None and len(self.state_secret) < 16:
            raise IsanError("the state secret must be at least 16 bytes (ISAN_STATE_SECRET or --state-secret-file)")

    @property
    def max_body_bytes(self) -> int:
        """The largest request body or frame: UTF-8 is at most 4 bytes a character, JSON escapes
        (``\\uXXXX``) at most 6 bytes for 1 character, plus room for the other fields."""
        return 6 * self.max_chars + 65_536

    @property
    def max_pending_bytes(self) -> int:
        return int(self.max_pending_mb * 2**20)

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in ("max_chars", "max_pending_mb", "max_streams", "max_stream_frames",
                                              "round_chars", "min_slice_chars", "request_timeout_s",
                                              "stream_idle_timeout_s", "batching", "threads")}
        out["max_body_bytes"] = self.max_body_bytes
        out["state_secret"] = "configured" if self.state_secret is not None else "random per process"
        return out
