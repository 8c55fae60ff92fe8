"""The server's limits and switches, one frozen dataclass (``isan-serve --help`` names each option).

Every limit protects something stated in its field's comment; the defaults are sized for the
2-core machines of the server guide's measurements (docs/guide/server.md, 'Measured', by
``isan bench serve``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from isan.engine.serve.malloc import DEFAULT_MMAP_THRESHOLD_KIB, MAX_MMAP_THRESHOLD_KIB
from isan.errors import IsanError

DEFAULT_MAX_CHARS = 1_000_000
#: the most worker processes ``isan-serve --workers`` starts
MAX_WORKERS = 256
#: the shortest state secret taken (bytes): an HMAC-SHA256 key of 32 bytes or more (RFC 2104's "L")
MIN_SECRET_BYTES = 32

#: a Host header: a bracketed IPv6 address or a name (or IPv4 address), then an optional port
_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::\d{1,5})?")


def host_name(value: str) -> str | None:
    """The name or address in a ``Host`` header (``Example.com:8000`` -> ``example.com``,
    ``[::1]:80`` -> ``::1``): lower case, without brackets or port; None if it is not one."""
    m = _HOST.fullmatch(value.strip())
    if m is None:
        return None
    return (m["v6"] or m["name"]).lower()


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
        stream_idle_timeout_s: a stream that sends nothing for this long is closed (code 1001); one
            whose client reads nothing while an answer waits this long is aborted.
        batching: True: each round scores all its slices in one batched kernel call (the
            compiled kernel ``Engine.score_batch`` would choose, exact within float32 rounding).
            False: each slice is scored alone with ``Engine.score`` on the engine's path
            (``--path``), one after another.
        threads: threads for the engine's kernels (None: the engine's own, one a CPU; see
            :func:`isan.engine.serve.service.server_threads`).
        state_secret: the HMAC key of state snapshots (:mod:`isan.engine.serve.snapshot`), at least
            :data:`MIN_SECRET_BYTES` bytes (an empty or shorter key raises IsanError); None: a random
            key per process, so snapshots are valid until the server restarts. Not in the repr.
        state_secret_drawn: ``state_secret`` was drawn at random by ``isan-serve --workers N`` for its
            workers (a snapshot made by one restores on another, until the server stops).
        workers: the worker processes serving the port (``isan-serve --workers``; each has its own
            scheduler, engine and limits: every limit here is per worker).
        read_timeout_s: a request's headers, and then its body, must each arrive within this many
            seconds (408 and the connection closed): a client that trickles bytes cannot hold a
            connection and its reserved memory for long.
        keep_alive_s: an idle keep-alive HTTP connection is closed after this many seconds.
        max_connections: open HTTP connections (WebSocket streams are counted by ``max_streams``).
            A connection that arrives at the cap first closes every connection that has kept its
            slot waiting a second for its client (408; :mod:`isan.engine.serve.connections`); if none
            did, its request is answered 503 with ``Retry-After`` and the connection closed.
        max_batch_texts: texts in one ``POST /v1/score/batch``.
        max_sample_chars: characters one ``POST /v1/sample`` may generate.
        max_attribute_chars: characters of one ``POST /v1/attribute`` text (its kappa takes
            ``T (T + 1) V`` float64 values, 54 MiB at 500 characters for V = 27).
        api_key: when set, every ``/v1/...`` endpoint and ``/metrics`` need it (``Authorization:
            Bearer KEY`` or ``X-API-Key: KEY``; a WebSocket may also pass ``?api_key=KEY``); 401 otherwise.
            Not in the repr.
        docs: serve ``/docs``, an HTML page of the API rendered from ``/openapi.json`` by the
            server itself (no scripts, nothing from a CDN).
        allow_origins: web page origins (``https://app.example.com``; ``*`` for any) that may open
            a WebSocket besides the server's own and loopback ones (a handshake without ``Origin``,
            from a client that is not a browser, is always allowed).
        allow_hosts: names (``myhost.lan``; ``*`` for any) that requests may carry in ``Host``
            besides ``localhost``, loopback addresses and, on a connection that came in on another
            address, any IP address (:func:`isan.engine.serve.access.host_refused`): other names are
            refused with 403, so a web page cannot reach the server by DNS rebinding.
        ui: serve isan lens, the web page at ``/`` (its files at ``/lens/...``; no CDN, no scripts
            from elsewhere); False (``--no-ui``): ``/`` is a 404 like any unknown path.
        model_name: the name the OpenAI-compatible API serves the model under (``GET /v1/models``,
            the requests' ``model``); None: the bundle directory's name.
        malloc_mmap_threshold_kib: glibc's mmap threshold that ``isan-serve`` fixes in each of its
            processes, in KiB (0: glibc's own, which rises): blocks of this size or more are given
            back to the system when freed (:mod:`isan.engine.serve.malloc`).
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
    state_secret: bytes | None = field(default=None, repr=False)  # out of logs: it travels to each worker
    state_secret_drawn: bool = False
    workers: int = 1
    read_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 256
    max_batch_texts: int = 1024
    max_sample_chars: int = 10_000
    max_attribute_chars: int = 500
    api_key: str | None = field(default=None, repr=False)
    docs: bool = True
    ui: bool = True
    allow_origins: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    model_name: str | None = None
    malloc_mmap_threshold_kib: int = DEFAULT_MMAP_THRESHOLD_KIB

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
            ("read_timeout_s", self.read_timeout_s > 0),
            ("keep_alive_s", self.keep_alive_s > 0),
            ("max_connections", self.max_connections >= 1),
            ("max_batch_texts", self.max_batch_texts >= 1),
            ("max_sample_chars", self.max_sample_chars >= 1),
            ("max_attribute_chars", self.max_attribute_chars >= 1),
            ("workers", 1 <= self.workers <= MAX_WORKERS),
            ("malloc_mmap_threshold_kib", 0 <= self.malloc_mmap_threshold_kib <= MAX_MMAP_THRESHOLD_KIB),
        ]
        for name, ok in checks:
            if not ok:
                raise IsanError(f"--{name.replace('_', '-')} = {getattr(self, name)!r} is out of range")
        if self.max_chars >= 2**31:
            raise IsanError("--max-chars must be below 2**31")
        if self.state_secret is not None and len(self.state_secret) < MIN_SECRET_BYTES:
            raise IsanError(("the state secret is empty" if not self.state_secret else
                             f"the state secret must be at least {MIN_SECRET_BYTES} bytes (it has "
                             f"{len(self.state_secret)})")
                            + " (ISAN_STATE_SECRET or --state-secret-file); make one with: python -c "
                              "'import secrets; print(secrets.token_hex(32))'")
        if self.model_name is not None and not 1 <= len(self.model_name) <= 256:
            raise IsanError("--served-model-name must have 1 to 256 characters")
        for h in self.allow_hosts:
            if h != "*" and host_name(h) is None:
                raise IsanError(f"--allow-host {h!r} is not a host name or address (like myhost.lan, 10.0.0.5 or "
                                "[fd00::5]; * for any)")
        if self.api_key is not None and len(self.api_key) < 8:
            raise IsanError("the API key must be at least 8 characters (ISAN_API_KEY or --api-key-file)")
        if self.api_key is not None and (self.api_key != self.api_key.strip()
                                         or any(ord(c) < 32 or ord(c) == 127 for c in self.api_key)):
            raise IsanError("the API key must not hold control characters (line breaks, tabs) or start or end with "
                            "a space: clients send it in an HTTP header (ISAN_API_KEY or --api-key-file)")

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
                                              "stream_idle_timeout_s", "batching", "threads",
                                              "read_timeout_s", "keep_alive_s", "max_connections",
                                              "max_batch_texts", "max_sample_chars", "max_attribute_chars",
                                              "workers", "malloc_mmap_threshold_kib")}
        out["max_body_bytes"] = self.max_body_bytes
        out["state_secret"] = ("random per process" if self.state_secret is None else
                               "random per run, shared by the workers" if self.state_secret_drawn else "configured")
        out["api_key"] = "required" if self.api_key is not None else "none"
        out["allow_origins"] = list(self.allow_origins)
        out["allow_hosts"] = list(self.allow_hosts)
        return out
