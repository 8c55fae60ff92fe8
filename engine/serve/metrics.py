"""Prometheus metrics of one app (``GET /metrics``), in a registry of its own.

Names (all prefixed ``isan_``): ``requests_total{endpoint,status}``, ``request_seconds{endpoint}``
(HTTP scoring, from the end of the body to the answer), ``stream_frames_total{status}``,
``stream_frame_seconds``, ``streams_open``, ``pending_bytes`` (the memory budget in use),
``pending_jobs``, ``rounds_total``, ``round_seconds``, ``round_jobs``, ``chars_scored_total``,
``cancelled_total{reason}`` (disconnect, timeout) and ``rejected_total{reason}`` (busy, streams).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
JOB_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("isan_requests", "HTTP answers by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.request_seconds = Histogram("isan_request_seconds", "HTTP scoring latency (body read to answer)",
                                         ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.frames = Counter("isan_stream_frames", "stream frames answered, by status", ["status"], registry=r)
        self.frame_seconds = Histogram("isan_stream_frame_seconds", "stream frame latency (frame read to answer)",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.streams_open = Gauge("isan_streams_open", "open WebSocket streams", registry=r)
        self.pending_bytes = Gauge("isan_pending_bytes", "estimated bytes of request data held (the memory budget)",
                                   registry=r)
        self.pending_jobs = Gauge("isan_pending_jobs", "texts waiting for or in a scheduler round", registry=r)
        self.rounds = Counter("isan_rounds", "scheduler rounds", registry=r)
        self.round_seconds = Histogram("isan_round_seconds", "time of one scheduler round", buckets=LATENCY_BUCKETS,
                                       registry=r)
        self.round_jobs = Histogram("isan_round_jobs", "texts scored together in one round", buckets=JOB_BUCKETS,
                                    registry=r)
        self.chars = Counter("isan_chars_scored", "characters scored", registry=r)
        self.cancelled = Counter("isan_cancelled", "jobs dropped before they finished", ["reason"], registry=r)
        self.rejected = Counter("isan_rejected", "requests or streams refused at a limit", ["reason"], registry=r)

    def on_round(self, stats) -> None:
        self.rounds.inc()
        self.round_seconds.observe(stats.seconds)
        self.round_jobs.observe(stats.jobs)
        self.chars.inc(stats.chars)
        self.pending_jobs.set(stats.pending)

    def render(self) -> bytes:
        return generate_latest(self.registry)
