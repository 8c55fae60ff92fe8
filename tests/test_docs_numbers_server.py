"""The numbers of the server guide's 'Measured' and 'Memory' sections agree with the committed JSON
files that back them (bench_results/serve_*.json), each rounded as the page rounds it; the guide
names the command that wrote each file and the model it measured. Nothing is served here."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = "docs/guide/server.md"


def text(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def prose(rel: str) -> str:
    """The page with every run of white space as one space (a sentence may wrap anywhere)."""
    return " ".join(text(rel).split())


def load(rel: str) -> dict:
    return json.loads(text(rel))


def row(page: str, starts: str) -> str:
    """The table row of ``page`` whose first cell starts with ``starts`` (exactly one)."""
    rows = [line for line in text(page).splitlines() if line.startswith("| " + starts)]
    assert len(rows) == 1, (starts, rows)
    return rows[0]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}"


def test_the_committed_serve_run():
    s = load("bench_results/serve_epyc.json")
    guide = prose(GUIDE)
    assert f"`{s['command']}`" in guide and s["model"]["source"].endswith("/text8-d216-distil")
    assert s["server_args"] == [] and s["machine"]["cores"] == 2 and s["machine"]["cpu"] == "AMD EPYC"
    h, c, st, m, x, w = (s[k] for k in ("http", "completions", "stream", "memory", "cancel", "slow"))
    assert h["statuses"] == {"200": h["requests"]} and st["errors"] == 0 and st["frames_ok"] == 5000
    lat = h["latency_s"]
    assert (f"**{h['requests_per_s']:.0f} requests/s, p50 / p90 / p99 {ms(lat['p50'])} / {ms(lat['p90'])} / "
            f"{ms(lat['p99'])} ms**, no errors, bits within a relative {h['max_rel_bits_error']:.1e} of offline"
            in row(GUIDE, "HTTP, 100 clients"))
    assert (f"{c['requests_per_s']:.0f} requests/s, p99 {c['latency_s']['p99']:.1f} s"
            in row(GUIDE, "`/v1/completions`, echo"))
    assert (f"none refused, no errors, {st['frames_per_s']:,.0f} frames/s, chunk p99 "
            f"{ms(st['chunk_latency_s']['p99'])} ms" in row(GUIDE, "1,000 streams x 5"))
    assert m["statuses"] == {"200": 4} and m["chars"] == 1_000_000
    assert (f"server RSS {m['rss_before_mib']:.0f} MiB before, {m['rss_peak_mib']:.0f} MiB at the peak"
            in row(GUIDE, "4 concurrent 1M"))
    assert x["clients"] == 12 and x["disconnect_after_s"] == 0.5
    assert (f"{x['chars_scored']:,} of their {x['clients'] * x['chars']:,} characters scored; a new stream's first "
            f"chunk {ms(x['new_stream_first_chunk_s'])} ms" in row(GUIDE, "12 clients leave"))
    assert (f"{w['statuses']['503']} refused at once (503), {w['statuses']['408']} answered 408 (`--read-timeout`), "
            f"the last closed after {w['last_closed_after_s']:g} s; a request then: {w['then_a_request']}"
            in row(GUIDE, "500 connections"))


def test_the_committed_workers_run_names_its_model_and_baseline():
    s = load("bench_results/serve_workers_epyc.json")
    guide = prose(GUIDE)
    assert f"`{s['command']}`" in guide
    assert s["model"]["source"].endswith("/text8-d216-stable") and "model `text8-d216-stable` (the default model then" in guide
    one, two = s["scaling"]
    assert one["workers"] == 1 and two["workers"] == 2 and one["ratio"] == 1.0
    assert abs(two["ratio"] - two["requests_per_s"] / one["requests_per_s"]) < 1e-12  # the baseline is this run's
    for w in s["scaling"]:
        lat = w["latency_s"]
        shares = " / ".join(f"{100 * x:.0f}%" for x in w["worker_shares"])
        assert (f"| {w['workers']} | {w['requests_per_s']:.0f} | {w['ratio']:.2f}x | {ms(lat['p50'])} / "
                f"{ms(lat['p90'])} / {ms(lat['p99'])} ms | {shares} | none; {w['max_rel_bits_error']:.1e} |"
                in guide), w["workers"]
        assert w["statuses"] == {"200": sum(w["statuses"].values())}


def test_memory_and_deployment_figures_are_the_committed_runs():
    s = load("bench_results/serve_epyc.json")
    st, h = s["stream"], s["http"]
    per_stream_kb = (st["rss_peak_mib"] - st["rss_before_mib"]) * 1024 / st["streams"]
    assert 25 <= per_stream_kb <= 35, per_stream_kb  # "about 30 KB per open stream"
    streams = f"1,000 streams took the server from {st['rss_before_mib']:.0f} to {st['rss_peak_mib']:.0f} MiB"
    idle = f"{s['server_pid_rss_mib_idle']:.0f} MiB resident with the 16 MiB table before any request"
    assert streams in prose(GUIDE) and idle in prose(GUIDE)
    deploy = prose("docs/guide/deployment.md")
    assert f"{s['server_pid_rss_mib_idle']:.0f} MiB resident for the model with its 16 MiB table" in deploy
    assert streams.replace("the server", "a server") in deploy
    assert f"answered {h['requests_per_s']:.0f} requests/s on 2 cores (100 clients x 1 KB" in deploy
    assert (f"({h['requests_per_s']:.0f} requests/s at p99 {ms(h['latency_s']['p99'])} ms on 2 cores for 100 clients x "
            f"1 KB; 1,000 streams at {st['frames_per_s']:,.0f} frames/s)") in deploy


def test_the_reset_streams_run():
    """'Memory given back': each run's row, its command, and the claims the text makes of them."""
    d = load("bench_results/serve_resets_epyc.json")
    assert f"\n{d['command']}\n" in text(GUIDE)
    runs = {r["malloc_mmap_threshold_kib"]: r for r in d["runs"]}
    assert set(runs) == {128, 0}
    for kib, r in runs.items():
        assert (r["streams"], r["chars"], r["frames"], r["concurrency"], r["answers_begun"]) == (5000, 40_000, 1, 20, 5000)
        assert r["streams_open"] == 0 and r["pending_bytes"] == 0 and r["fds_settled"] == r["fds_before"], kib
        by = {s["streams"]: s["rss_mib"] for s in r["samples"]}
        during = [s["rss_mib"] for s in r["samples"][1:]]
        name = "128 (the default)" if kib == 128 else "0 (glibc's own)"
        assert (f"| {name} | {r['rss_mib_idle']:.0f} | {' / '.join(f'{by[k]:.0f}' for k in (1250, 2500, 3750, 5000))} | "
                f"{min(during):.0f}-{max(during):.0f} | {r['rss_mib_settled']:.0f} |") in text(GUIDE), kib
    own = [s["rss_mib"] for s in runs[0]["samples"]]
    assert f"to {max(own):.0f} MiB, and kept most of it" in prose(GUIDE)
    assert f"came back to {runs[128]['rss_mib_settled']:.0f} MiB" in prose(GUIDE)
    assert runs[128]["rss_mib_settled"] < runs[0]["rss_mib_settled"] and max(own) > max(
        s["rss_mib"] for s in runs[128]["samples"])
    assert "5,000 WebSocket streams, 20 at a time, each sending 40,000 characters" in prose(GUIDE)
