"""The load benchmark behind ``isan bench serve``: a real ``isan-serve`` process under many clients.

The server runs in a subprocess (its own interpreter, so client and server do not share a GIL; they
do share the machine's cores). Measurements, each checked against the library's offline bits:

* **http**: ``clients`` closed-loop clients each POST texts of ``text_chars`` characters (slices of
  real text) for ``duration_s`` seconds over keep-alive connections: requests/s, latency p50/p90/p99,
  statuses, and the largest relative difference of a response's bits from ``Engine.score``.
* **stream**: ``streams`` WebSocket streams open at once, each sending ``chunks`` chunks of
  ``chunk_chars`` characters (a fixed size, or sizes drawn uniformly from a range such as 1-400)
  and waiting for each answer: per-chunk latency p50/p90/p99, frames/s, every stream's running
  total against scoring its whole text offline, and the server's resident memory before and at
  its peak during the run.
* **memory**: ``big_requests`` concurrent requests of ``big_chars`` characters: the server's resident
  memory before and at its peak (sampled from /proc), the statuses (503 beyond the budget).
* **cancel**: ``cancel_clients`` clients each send a request of ``big_chars`` characters (at most
  500,000) and disconnect after ``cancel_after_s``; then a new stream sends a chunk: how many of
  their characters were scored before the server dropped them (from ``/metrics``), and how long
  the new stream waited.
* **slow**: ``slow_conns`` connections each declare a 1,000-byte body and send 14 bytes of it:
  how many the server refuses at once (503, ``--max-connections``), how many it answers 408
  (``--read-timeout``) and when the last one is closed; then whether a normal request is served.

With ``workers`` (``isan bench serve --workers 1,2``) the measurements run against ``isan-serve
--workers N`` for each count in turn, in one run, each once every worker has answered ``/healthz``,
and ``scaling`` gives each count's requests/s, its ratio to the first count's and each worker's
share of the HTTP load (memory is then summed over the server's processes).

**resets** (:func:`run_resets`, ``python -m isan.bench.serve``): thousands of WebSocket streams that
each send a long text with ``per_char`` and reset their connection once its answer has begun: the
server's resident memory over time, with each ``--malloc-mmap-threshold-kib`` given (the server
guide, 'Memory').

With ``url`` (``isan bench serve --url http://HOST:PORT``) no server is started: the HTTP and
stream load go to the server or load balancer already answering there (HAProxy in front of
replicas, docs/guide/deployment.md), every answer checked against the library as above.

Example:
    >>> res = run_bench(model=None, data="../shared/data/text8_head/text8_head.txt", clients=100)
    >>> res["http"]["requests_per_s"], res["http"]["latency_s"]["p99"]
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np

from isan.errors import IsanError
# the server under test and the load live in serve_process.py and serve_load.py
from isan.bench.serve_load import (
    cancel_probe, completions_answer_bits, completions_request_body, http_load, memory_probe, reset_probe,
    slow_body_probe, stream_load,
)
from isan.bench.serve_process import ServerProcess, get_healthz, rss_mib, worker_shares


def parse_chunk_chars(spec) -> tuple[int, int]:
    """``200`` -> (200, 200); ``"1-400"`` -> (1, 400)."""
    text = str(spec)
    lo, _, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise IsanError(f"chunk sizes must be N or MIN-MAX; got {text!r}") from None
    if not 1 <= a <= b:
        raise IsanError(f"chunk sizes must satisfy 1 <= MIN <= MAX; got {text!r}")
    return a, b


def run_bench(model: str | None = None, data: str = "../shared/data/text8_head/text8_head.txt", clients: int = 100,
              text_chars: int = 1000, duration_s: float = 10.0, streams: int = 1000, chunks: int = 5,
              chunk_chars="1-400", big_chars: int = 1_000_000, big_requests: int = 4, cancel_after_s: float = 0.5,
              slow_conns: int = 500, cancel_clients: int = 12, server_args: list[str] | None = None,
              which: tuple[str, ...] = ("http", "completions", "stream", "memory", "cancel", "slow"), seed: int = 0,
              workers: tuple[int, ...] | None = None, url: str | None = None, progress=None) -> dict:
    """Start ``isan-serve`` and measure it (see the module docstring); returns a JSON-able dict.

    Texts come from the text8-10M valid split (``data``); the memory and cancel probes use the
    test split's first ``big_chars`` characters (at most 500,000 each, repeated to length).

    Args:
        workers: worker counts (``isan-serve --workers N``): the measurements run against a server
            with each in turn, one after the other in this run; the answer then holds them under
            ``"workers"`` (one entry a count, with the server's memory summed over its processes)
            and, with ``http``, ``"scaling"``: each count's requests/s and its ratio to the first
            count's, with the latency and each worker's share of the characters scored (also
            under ``http.workers``: pid, chars_scored, share, from each worker's ``/healthz``).
            None: one server as ``server_args`` start it.
        url: measure the server or load balancer already answering there (``http://HOST:PORT``,
            for example HAProxy in front of replicas) instead of starting one: the ``http``,
            ``completions`` and ``stream`` measurements only (the others read one server's memory
            or metrics), with the model of ``model`` (its ``params_sha256`` must be what the
            endpoint's ``/healthz`` names). No memory figures then.

    Raises:
        IsanError: ``url`` with ``workers``, ``server_args`` or another measurement, a ``url``
            that is not ``http://HOST[:PORT]``, or an endpoint that does not answer ``/healthz``
            ready with the same model.
    """
    from isan.engine import load_engine
    from isan.data import read_text8_split

    if url is not None:
        host, port = _endpoint(url, which, workers, server_args)
    say = progress or (lambda msg: None)
    valid = read_text8_split(data, "valid")
    test = read_text8_split(data, "test")
    eng = load_engine(model)
    from isan.bench.common import machine

    out: dict = {"benchmark": "serve", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
                 "model": {"source": str(eng.source), "params_sha256": eng.params_sha256},
                 "server_args": list(server_args or [])}
    if url is not None:
        _check_endpoint(url, host, port, eng)
        out["url"] = url
    args = list(server_args or [])
    if model:
        args += ["--model", str(model)]
    load = _Load(eng, say, which, workers, clients, text_chars, duration_s, streams, chunks, big_chars, big_requests,
                 cancel_after_s, slow_conns, cancel_clients)
    load.prepare(valid, test, chunk_chars, seed)
    if url is not None:
        say(f"the endpoint at {url}")
        out.update(load.measure(host, port))
        return out
    if not workers:
        with ServerProcess(args) as srv:
            out.update(load.measure("127.0.0.1", srv.port, srv))
        return out
    out["workers"] = []
    for count in workers:
        say(f"isan-serve --workers {count}")
        with ServerProcess(args + ["--workers", str(count)]) as srv:
            out["workers"].append({"workers": count, **load.measure("127.0.0.1", srv.port, srv)})
    if "http" in which:
        out["scaling"] = _scaling(out["workers"])
    return out


def _check_endpoint(url: str, host: str, port: int, eng) -> None:
    """Raise IsanError unless ``url`` answers ``/healthz`` ready, serving ``eng``'s model."""
    h = get_healthz(host, port)
    if h is None or h.get("status") != "ready":
        raise IsanError(f"{url} does not answer GET /healthz as a ready isan-serve "
                        f"({'no answer' if h is None else h.get('status') or h.get('error')})")
    theirs = (h.get("model") or {}).get("params_sha256")
    if theirs != eng.params_sha256:
        raise IsanError(f"{url} serves another model (params_sha256 {theirs}) than the benchmark's "
                        f"{eng.source} ({eng.params_sha256}): give its bundle with --model")


def _scaling(per_count: list[dict]) -> list[dict]:
    """Each worker count's HTTP figures, its requests/s as a ratio to the first count's."""
    base = per_count[0]["http"]["requests_per_s"]
    return [{"workers": w["workers"], "requests_per_s": w["http"]["requests_per_s"],
             "ratio": w["http"]["requests_per_s"] / base if base else None,
             "latency_s": w["http"]["latency_s"], "statuses": w["http"]["statuses"],
             "max_rel_bits_error": w["http"]["max_rel_bits_error"],
             "max_abs_bits_error": w["http"]["max_abs_bits_error"], "worst_span": w["http"]["worst_span"],
             "worker_shares": [x["share"] for x in w["http"]["workers"]]} for w in per_count]


class _Load:
    """The load of :func:`run_bench` (its arguments of the same names), the texts it sends
    (:meth:`prepare`) and the measurements against one server (:meth:`measure`)."""

    def __init__(self, eng, say, which, workers, clients: int, text_chars: int, duration_s: float, streams: int,
                 chunks: int, big_chars: int, big_requests: int, cancel_after_s: float, slow_conns: int,
                 cancel_clients: int):
        self.eng, self.say, self.which, self.workers = eng, say, which, workers
        self.clients, self.text_chars, self.duration_s = clients, text_chars, duration_s
        self.streams, self.chunks, self.big_chars, self.big_requests = streams, chunks, big_chars, big_requests
        self.cancel_after_s, self.slow_conns, self.cancel_clients = cancel_after_s, slow_conns, cancel_clients

    def prepare(self, valid: str, test: str, chunk_chars, seed: int) -> None:
        """The HTTP texts and their offline bits, each stream's chunk sizes and text, the probes' big text
        (where each text lies in ``--data``: its span). Raises IsanError: bad ``chunk_chars``."""
        text_chars, streams, chunks, which = self.text_chars, self.streams, self.chunks, self.which
        n = max(1, min(len(valid) // text_chars, max(2 * self.clients, 16), 200))  # distinct texts, cycled
        self.texts = [valid[i * text_chars : (i + 1) * text_chars] for i in range(n)]
        self.spans = [["valid", i * text_chars, (i + 1) * text_chars] for i in range(n)]
        self.expected = [r.bits for r in (self.eng.score(t) for t in self.texts)] \
            if {"http", "completions"} & set(which) else []
        self.lo, self.hi = lo, hi = parse_chunk_chars(chunk_chars)
        rng = np.random.default_rng(seed)
        self.plans = plans = [rng.integers(lo, hi + 1, size=chunks).tolist() for _ in range(streams)]
        starts = rng.integers(0, max(1, len(valid) - chunks * hi), size=streams)
        self.stream_texts = [valid[a : a + sum(p)] for a, p in zip(starts, plans)]
        self.stream_spans = [["valid", int(a), int(a + sum(p))] for a, p in zip(starts, plans)]
        self.big = (test * (self.big_chars // len(test) + 1))[:self.big_chars]

    def measure(self, host: str, port: int, srv: ServerProcess | None = None) -> dict:
        """The measurements against ``host:port``; ``srv``: the server started here (memory, workers)."""
        pid = srv.pid if srv is not None else None
        res: dict = {"server_pid_rss_mib_idle": round(rss_mib(pid)[0], 1)} if pid else {}
        self._http(host, port, srv, res)
        if "stream" in self.which:
            self.say(f"stream: {self.streams} WebSocket streams x {self.chunks} chunks of {self.lo}-{self.hi} "
                     "characters")
            want = [self.eng.score(t).bits for t in self.stream_texts]  # offline, on the engine's own path
            res["stream"] = asyncio.run(stream_load(host, port, self.stream_texts, want, self.plans, pid,
                                                    spans=self.stream_spans))
        self._probes(host, port, pid, res)
        if pid:
            res["server_rss_mib_end"], res["server_rss_mib_peak"] = (round(x, 1) for x in rss_mib(pid))
        return res

    def _http(self, host: str, port: int, srv: ServerProcess | None, res: dict) -> None:
        """The HTTP load on /v1/score (``http``) and /v1/completions (``completions``) into ``res``."""
        clients, text_chars, duration_s, texts, expected = (self.clients, self.text_chars, self.duration_s,
                                                            self.texts, self.expected)
        if "http" in self.which:
            self.say(f"http: {clients} clients posting {text_chars}-character texts for {duration_s:g} s")
            asyncio.run(http_load(host, port, texts[:2], expected[:2], 2, 1.0))  # warm-up
            before = srv.worker_health() if self.workers and srv is not None else None
            res["http"] = asyncio.run(http_load(host, port, texts, expected, clients, duration_s,
                                                connect_first=before is not None, spans=self.spans))
            if before is not None:  # how the kernel shared the connections among the workers
                res["http"]["workers"] = worker_shares(before, srv.worker_health(), srv.worker_pids,
                                                       res["http"].pop("connections_by_pid", {}))
        if "completions" in self.which:  # the same texts through the OpenAI-compatible API (echo, logprobs=1)
            self.say(f"completions: {clients} clients posting {text_chars}-character prompts (max_tokens 0, echo, "
                     f"logprobs 1) for {duration_s:g} s")
            res["completions"] = asyncio.run(http_load(host, port, texts, expected, clients, duration_s,
                                                       path="/v1/completions", make_body=completions_request_body,
                                                       bits_of=completions_answer_bits, spans=self.spans))

    def _probes(self, host: str, port: int, pid: int | None, res: dict) -> None:
        """The memory, cancellation and slow-body probes into ``res``."""
        if "memory" in self.which:
            self.say(f"memory: {self.big_requests} concurrent requests of {self.big_chars:,} characters")
            res["memory"] = asyncio.run(memory_probe(host, port, pid, self.big, self.big_requests))
        if "cancel" in self.which:
            k = min(self.big_chars, 500_000)
            self.say(f"cancel: {self.cancel_clients} clients send {k:,} characters and leave after "
                     f"{self.cancel_after_s:g} s; then a new stream")
            res["cancel"] = asyncio.run(cancel_probe(host, port, self.big[:k], self.cancel_after_s,
                                                     self.cancel_clients))
        if "slow" in self.which:
            self.say(f"slow: {self.slow_conns} connections that send 14 of the 1,000 bytes they declare")
            res["slow"] = asyncio.run(slow_body_probe(host, port, self.slow_conns))


#: the measurements ``run_bench(url=...)`` takes: the load, not one server's memory or metrics
URL_MEASUREMENTS = ("http", "completions", "stream")


def _endpoint(url: str, which, workers, server_args) -> tuple[str, int]:
    """(host, port) of ``run_bench``'s ``url``, after checking what goes with it."""
    from urllib.parse import urlsplit

    if workers or server_args:
        raise IsanError("--url measures a server that is already running: --workers and --server-args start one")
    other = [w for w in which if w not in URL_MEASUREMENTS]
    if other:
        raise IsanError(f"--url takes the measurements {', '.join(URL_MEASUREMENTS)}, not {', '.join(other)} (they "
                        "read one server's memory or metrics: run them without --url); choose with --only")
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError as e:
        raise IsanError(f"--url {url!r}: {e}") from None
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise IsanError(f"--url takes http://HOST[:PORT] (the server or balancer's address), not {url!r}")
    return parts.hostname, port


def markdown(res: dict) -> str:
    """The results as the README's tables (with worker counts: the scaling table, then each count's tables)."""
    lines = [f"Machine: {res['machine']['cpu']}, {res['machine']['cores']} cores, Python {res['machine']['python']}; "
             + (f"endpoint {res['url']} (running already: not started by the benchmark)" if res.get("url") else
                f"server options: {' '.join(res['server_args']) or '(defaults)'}")]
    if res.get("command"):
        lines.append(f"Command: `{res['command']}`")
    lines.append("")
    if "workers" not in res:
        return "\n".join(lines + [_tables(res)])
    if "scaling" in res:
        lines += ["| isan-serve --workers | requests/s (200) | ratio to the first | latency p50 / p90 / p99 | statuses "
                  "| each worker's share |", "|---:|---:|---:|---|---|---|"]
        for w in res["scaling"]:
            shares = " / ".join("-" if x is None else f"{100 * x:.0f}%" for x in w.get("worker_shares") or [])
            lines.append(f"| {w['workers']} | {w['requests_per_s']:,.1f} | {w['ratio']:.2f}x | {_pct_ms(w['latency_s'])} "
                         f"| {w['statuses']} | {shares or '-'} |")
        lines.append("")
    for w in res["workers"]:
        lines += [f"{w['workers']} worker{'s' if w['workers'] > 1 else ''}:", "", _tables(w)]
    return "\n".join(lines)


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1000:,.0f} ms"


def _pct_ms(d: dict) -> str:
    return f"{_ms(d['p50'])} / {_ms(d['p90'])} / {_ms(d['p99'])}"


def _tables(res: dict) -> str:
    """The tables of one server's measurements."""
    lines: list[str] = []
    for key, title in (("http", "HTTP load (/v1/score)"), ("completions", "HTTP load (/v1/completions, echo, logprobs 1)")):
        if key not in res:
            continue
        h = res[key]
        lines += [f"| {title} | value |", "|---|---:|",
                  f"| clients x text | {h['clients']} x {h['text_chars']:,} chars |",
                  f"| requests/s (200) | {h['requests_per_s']:,.1f} |",
                  f"| chars/s | {h['chars_per_s']:,.0f} |",
                  f"| latency p50 / p90 / p99 | {_pct_ms(h['latency_s'])} |",
                  f"| statuses | {h['statuses']} |",
                  f"| max relative bits difference from offline | {h['max_rel_bits_error']:.2e} |", ""]
    if "stream" in res:
        s = res["stream"]
        lines += ["| WebSocket load | value |", "|---|---:|",
                  f"| streams x chunks x chars | {s['streams']} x {s['chunks']} x {s['chunk_chars']} "
                  f"(mean {s['mean_chunk_chars']}) |",
                  f"| frames/s | {s['frames_per_s']:,.1f} |",
                  f"| chunk latency p50 / p90 / p99 | {_pct_ms(s['chunk_latency_s'])} |",
                  f"| errors | {s['errors']} |",
                  f"| max relative total-bits difference from offline | {s['max_rel_bits_error']:.2e} |"]
        if "rss_peak_mib" in s:
            lines.append(f"| server RSS before / peak | {s['rss_before_mib']:,.0f} / {s['rss_peak_mib']:,.0f} MiB |")
        lines.append("")
    if "memory" in res:
        m = res["memory"]
        lines += ["| memory | value |", "|---|---:|",
                  f"| concurrent requests x chars | {m['requests']} x {m['chars']:,} |",
                  f"| statuses | {m['statuses']} |",
                  f"| server RSS before / peak | {m['rss_before_mib']:,.0f} / {m['rss_peak_mib']:,.0f} MiB |",
                  f"| peak extra per admitted request | {m['peak_extra_mib_per_admitted_request']:,.1f} MiB |", ""]
    if "cancel" in res:
        c = res["cancel"]
        lines += ["| cancellation | value |", "|---|---:|",
                  f"| clients x chars / left after | {c['clients']} x {c['chars']:,} / {c['disconnect_after_s']:g} s |",
                  f"| chars scored before the jobs were dropped | {c['chars_scored']:,} |",
                  f"| jobs cancelled on disconnect | {c['cancelled']} |",
                  f"| a new stream's first 200-char chunk took | {c['new_stream_first_chunk_s'] * 1000:,.0f} ms |", ""]
    if "slow" in res:
        w = res["slow"]
        lines += ["| slow bodies | value |", "|---|---:|",
                  f"| connections x bytes sent / declared | {w['connections']} x {w['sent_bytes']} / {w['declared_bytes']} |",
                  f"| answers | {w['statuses']} |",
                  f"| last one closed after | {w['last_closed_after_s']:g} s |",
                  f"| then a normal request | {w['then_a_request']} |", ""]
    return "\n".join(lines)


def write_json(res: dict, path: str) -> None:
    """``res`` as indented JSON at ``path`` (its folder made), written atomically (a temporary file renamed)."""
    from isan.atomic import write_bytes_atomic

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(res, indent=2, allow_nan=False) + "\n").encode())


def run_resets(model: str | None = None, data: str = "../shared/data/text8_head/text8_head.txt", streams: int = 5000,
               chars: int = 40_000, frames: int = 1, concurrency: int = 20, every: int = 250,
               thresholds: tuple[int, ...] = (128, 0), server_args: list[str] | None = None, progress=None) -> dict:
    """The server's memory under streams reset abruptly: for each mmap threshold in ``thresholds``
    (``isan-serve --malloc-mmap-threshold-kib``; 0 is glibc's own), a new server takes ``streams``
    streams, ``concurrency`` at a time, each sending ``frames`` frames of ``chars`` characters of the
    valid split with ``per_char`` and resetting its connection (TCP RST) once its answer has begun.

    Returns:
        ``{"benchmark": "serve_resets", "machine", "command", "model", "runs": [...]}``, a run per
        threshold: the server's VmRSS (MiB) after every ``every`` streams (``samples``), after 5 s of
        quiet (``rss_mib_settled``), its open file descriptors before and after, and its
        ``isan_streams_open`` and ``isan_pending_bytes`` gauges at the end (both 0 when nothing leaked).
    """
    from isan.bench.common import machine
    from isan.data import read_text8_split
    from isan.engine import load_engine

    say = progress or (lambda msg: None)
    valid = read_text8_split(data, "valid")
    text = (valid * (chars // len(valid) + 1))[:chars]
    eng = load_engine(model)
    out: dict = {"benchmark": "serve_resets", "machine": machine(), "command": " ".join(["python"] + sys.argv),
                 "model": {"source": str(eng.source), "params_sha256": eng.params_sha256}, "runs": []}
    args = list(server_args or []) + (["--model", str(model)] if model else [])
    for kib in thresholds:
        say(f"--malloc-mmap-threshold-kib {kib}: {streams:,} streams x {frames} frame(s) of {chars:,} characters, reset")
        with ServerProcess(args + ["--malloc-mmap-threshold-kib", str(kib)]) as srv:
            idle = round(rss_mib(srv.pid)[0], 1)
            run = asyncio.run(reset_probe("127.0.0.1", srv.port, srv.pid, text, streams, frames, concurrency, every))
        out["runs"].append({"malloc_mmap_threshold_kib": kib, "server_args": args, "rss_mib_idle": idle, **run})
    return out


def resets_markdown(res: dict) -> str:
    """One line a run: the threshold, RSS idle, at every sample, settled; fds and gauges at the end."""
    lines = ["| --malloc-mmap-threshold-kib | RSS idle | RSS after streams (MiB) | settled | fds before / after | "
             "streams open, pending bytes |", "|---:|---:|---|---:|---|---|"]
    for r in res["runs"]:
        samples = ", ".join(f"{s['streams']:,}: {s['rss_mib']:.0f}" for s in r["samples"][1:])
        lines.append(f"| {r['malloc_mmap_threshold_kib']} | {r['rss_mib_idle']:.0f} | {samples} | "
                     f"{r['rss_mib_settled']:.0f} | {r['fds_before']} / {r['fds_settled']} | "
                     f"{r['streams_open']:.0f}, {r['pending_bytes']:.0f} |")
    return "\n".join(lines)


def _resets_command():
    import shlex

    import click

    @click.command(context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
    @click.option("--data", default="../shared/data/text8_head/text8_head.txt", show_default=True,
                  help="text8 file: the streams' text from its valid split.")
    @click.option("--streams", type=click.IntRange(1, 1_000_000), default=5000, show_default=True)
    @click.option("--chars", type=click.IntRange(1, 1_000_000), default=40_000, show_default=True,
                  help="Characters of each frame (sent with per_char).")
    @click.option("--frames", type=click.IntRange(1, 64), default=1, show_default=True, help="Frames each stream sends.")
    @click.option("--concurrency", type=click.IntRange(1, 2048), default=20, show_default=True)
    @click.option("--every", type=click.IntRange(1, 1_000_000), default=250, show_default=True,
                  help="Streams between two samples of the server's memory.")
    @click.option("--thresholds", default="128,0", show_default=True,
                  help="--malloc-mmap-threshold-kib of each run, comma-separated (0: glibc's own).")
    @click.option("--out", default=None, help="Also write the results as JSON here.")
    def main(model, data, streams, chars, frames, concurrency, every, thresholds, out):
        """isan-serve's resident memory under WebSocket streams reset abruptly (a server per threshold,
        on a free localhost port)."""
        try:
            kibs = tuple(int(x) for x in thresholds.split(","))
        except ValueError:
            raise click.BadParameter("give comma-separated whole numbers, like 128,0", param_hint="--thresholds")
        try:
            res = run_resets(model, data, streams, chars, frames, concurrency, every, kibs,
                             progress=lambda m: click.echo(m, err=True))
        except IsanError as e:
            raise click.ClickException(str(e)) from None
        res["command"] = shlex.join(["python", "-m", "isan.bench.serve", *sys.argv[1:]])  # argv[0] is this file's path
        click.echo(resets_markdown(res))
        if out:
            write_json(res, out)
            click.echo(f"\nwrote {out}")

    return main


if __name__ == "__main__":
    _resets_command()()
