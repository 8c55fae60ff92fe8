"""Benchmarks (``isan bench``): throughput of the engine's paths on real text, with ratios.

Every figure is the median of ``repeats`` runs in this process; ratios are against the
per-character reference path measured in the same run. Results print as a Markdown table
and are written as JSON with the machine, the command and the raw timings.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "platform": platform.platform()}


def rss_mb() -> float:
    """Current resident memory in MiB (Linux), else peak."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def bench_engine(model: str | None, text: str, repeats: int = 3, batch_sizes=(64, 256), ref_chars: int = 200_000,
                 log=print) -> dict:
    """Single-stream scoring and ingestion (composed vs reference), batched scoring, table facts."""
    from isan.engine import Engine, default_model_path
    from isan.trie_tables.format import load_table

    src = Path(model) if model else default_model_path()
    t0 = time.perf_counter()
    eng = Engine.load(src)  # builds the cached table on first use
    first_load = time.perf_counter() - t0
    if eng.path != "composed":
        raise SystemExit(f"{src} has no trie table; build one with `isan export` or `isan table build`")
    ref = eng.with_path("reference")
    t0 = time.perf_counter()
    load_table(eng.table.path, eng.params_sha256, eng.alphabet, eng.d)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_table(eng.table.path, eng.params_sha256, eng.alphabet, eng.d, verify=False)
    load_noverify_s = time.perf_counter() - t0
    ids = eng.encode(text)
    ref_ids = ids[:ref_chars]
    rows, raw = [], {}

    def add(name, chars, fn, baseline=None, reps=repeats):
        med, times = median_time(fn, reps)
        cps = chars / med
        raw[name] = {"chars": chars, "seconds": times, "median_s": med, "chars_per_s": cps}
        ratio = cps / raw[baseline]["chars_per_s"] if baseline else 1.0
        rows.append((name, chars, cps, ratio, baseline or "-"))
        log(f"  {name}: {cps:,.0f} chars/s")

    h0 = eng.initial_state()
    add("score, reference (per character)", len(ref_ids), lambda: ref.score(ref_ids, h0))
    add("score, composed", len(ids), lambda: eng.score(ids, h0), "score, reference (per character)")
    add("ingest, reference (per character)", len(ref_ids), lambda: ref.advance(ref_ids, h0))
    add("ingest, composed", len(ids), lambda: eng.advance(ids, h0), "ingest, reference (per character)")
    for B in batch_sizes:
        n = len(ids) // B
        texts = [ids[i * n : (i + 1) * n] for i in range(B)]
        add(f"batch {B}, grouped by symbol", n * B, lambda: eng.score_batch(texts, group="symbol"),
            "score, reference (per character)")
        add(f"batch {B}, composed, grouped by entry", n * B, lambda: eng.score_batch(texts, group="entry"),
            "score, reference (per character)")
    # where the composed path's time goes
    cp = eng._composed
    h = h0.h.astype(np.float32)
    seg_t, (starts, lengths, entries) = _timed(lambda: cp.segment(ids))
    jump_t, H = _timed(lambda: cp.jumps(entries, h))
    read_t, _ = _timed(lambda: cp.readout_bits(ids, starts, entries, H[:-1]))
    total = seg_t + jump_t + read_t
    profile = {"segment_s": seg_t, "jumps_s": jump_t, "readout_s": read_t, "matches": int(len(entries)),
               "us_per_jump": jump_t / max(len(entries), 1) * 1e6,
               "shares": {"segment": seg_t / total, "jumps": jump_t / total, "readout": read_t / total}}
    info = eng.table.info()
    build = info["build"]
    facts = {
        "avg_match_length_measured": len(ids) / len(entries),
        "avg_match_length_expected": info["expected_avg_match_length"],
        "table_entries": info["entries"], "table_bytes": info["bytes"], "table_dtype": info["dtype"],
        "table_build_s": {"mining": (build.get("mining") or {}).get("seconds"), "compose": build.get("compose_seconds")},
        "first_load_s": first_load, "load_s_verified": load_s, "load_s_unverified": load_noverify_s,
        "rss_mib": rss_mb(), "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    return {"benchmark": "engine", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
            "model": eng.describe(), "text_chars": len(ids), "repeats": repeats, "rows": [
                {"name": r[0], "chars": r[1], "chars_per_s": r[2], "ratio": r[3], "vs": r[4]} for r in rows],
            "profile": profile, "facts": facts, "raw": raw}


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, numpy {m['numpy']}",
             f"Command: `{result['command']}`  (median of {result['repeats']} runs)", "",
             "| measurement | chars | chars/s | ratio | vs |", "|---|---:|---:|---:|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {r['chars']:,} | {r['chars_per_s']:,.0f} | {r['ratio']:.2f}x | {r['vs']} |")
    if "facts" in result:
        f, p = result["facts"], result["profile"]
        lines += ["", "| fact | value |", "|---|---|",
                  f"| average match length (measured / expected) | {f['avg_match_length_measured']:.3f} / {f['avg_match_length_expected']} |",
                  f"| table | {f['table_entries']:,} entries, {f['table_bytes'] / 2**20:.1f} MiB, {f['table_dtype']} |",
                  f"| table build (mining / composition) | {f['table_build_s']['mining']} s / {f['table_build_s']['compose']} s |",
                  f"| table load (sha256-verified / size-checked) | {f['load_s_verified']:.2f} s / {f['load_s_unverified']:.3f} s |",
                  f"| resident memory (now / peak) | {f['rss_mib']:.0f} MiB / {f['peak_rss_mib']:.0f} MiB |",
                  f"| composed scoring time: segment / jumps / readout | {p['shares']['segment']:.0%} / {p['shares']['jumps']:.0%} / {p['shares']['readout']:.0%} ({p['us_per_jump']:.2f} us per jump) |"]
    return "\n".join(lines)


def write_json(result: dict, out: str | Path) -> None:
    from isan.atomic import write_json_atomic

    write_json_atomic(out, result)


def bench_budgets(model: str | None, train_text: str, test_text: str, budgets: list[str], repeats: int = 3,
                  chars: int = 200_000, log=print) -> dict:
    """Single-stream composed scoring for tables of several sizes, against the reference path.

    Tables are mined from ``train_text`` and built into a temporary directory.
    """
    import tempfile

    from isan.engine import Engine, default_model_path
    from isan.trie_tables.build import build_from_recipe, plan_table
    from isan.trie_tables.format import load_table

    src = Path(model) if model else default_model_path()
    base = Engine.load(src, path_mode="reference")
    a = base.alphabet
    train = a.encode(train_text)
    ids = a.encode(test_text)[:chars]
    med, _ = median_time(lambda: base.score(ids), repeats)
    rows = [{"budget": "none (reference, float64)", "entries": 0, "avg_match_length": 1.0, "us_per_jump": None,
             "chars_per_s": len(ids) / med, "ratio": 1.0}]
    ref_cps = rows[0]["chars_per_s"]
    with tempfile.TemporaryDirectory() as tmp:
        for b in budgets:
            rec = plan_table(train, base.params32, a, budget=b)
            d = build_from_recipe(Path(tmp) / b, rec, base.params32, a, base.params_sha256)
            eng = Engine(base.params32, a, base.manifest, table=load_table(d, base.params_sha256, a, base.d))
            med, _ = median_time(lambda: eng.score(ids), repeats)
            _, _, ent = eng._composed.segment(ids)
            jt, _ = _timed(lambda: eng._composed.jumps(ent, base.params32.h0))
            rows.append({"budget": b, "entries": len(rec["keys"]), "avg_match_length": len(ids) / len(ent),
                         "us_per_jump": jt / len(ent) * 1e6, "chars_per_s": len(ids) / med,
                         "ratio": len(ids) / med / ref_cps})
            log(f"  {b}: {rows[-1]['chars_per_s']:,.0f} chars/s")
    return {"benchmark": "table budgets", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
            "chars": len(ids), "repeats": repeats, "rows": rows}


def markdown_budgets(result: dict) -> str:
    m = result["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, numpy {m['numpy']}",
             f"Command: `{result['command']}`  ({result['chars']:,} chars of the test split, median of {result['repeats']})", "",
             "| table budget | entries | avg match (chars) | us per jump | chars/s | vs reference |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        jump = f"{r['us_per_jump']:.1f}" if r["us_per_jump"] is not None else "-"
        lines.append(f"| {r['budget']} | {r['entries']:,} | {r['avg_match_length']:.2f} | {jump} | {r['chars_per_s']:,.0f} | {r['ratio']:.2f}x |")
    return "\n".join(lines)


def bench_onnx(text: str, repeats: int = 3, stream_chars: int = 50_000, steps: int = 2000, batch: int = 64,
               batch_chars: int = 128_000, device: str = "cpu", log=print) -> dict:
    """onnxruntime: the default ISAN (d=216) against an LSTM of equal parameter count (random weights).

    Measures single-step latency (``model.onnx``, one character, batch 1), streaming scoring
    through the sequence graph, and batched scoring of ``batch`` streams. Needs the ``onnx`` and
    ``train`` extras (torch only to initialise the LSTM).
    """
    import tempfile

    from isan.alphabet import Alphabet
    from isan.engine import Engine, default_model_path
    from isan.engine.bundle import write_bundle
    from isan.engine.onnx_backend import OnnxRunner
    from isan.export.checkpoint import export_from_bundle
    from isan.export.onnx_export import onnx_hook
    from isan.train.baselines import LSTM

    a = Alphabet.text8()
    ids = a.encode(text)
    results, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        isan_dir = export_from_bundle(default_model_path(), Path(tmp) / "isan", onnx=True)
        lstm = LSTM.for_budget(27, 27, 1.28e6, seed=0)
        tensors = {k: v.detach().numpy().astype(np.float32) for k, v in lstm.state_dict().items()}
        lstm_dir = write_bundle(Path(tmp) / "lstm", tensors, a, kind="lstm", extra={"model": lstm.config(), "d": lstm.d},
                                hook=onnx_hook)
        n_params = {"isan": Engine.load(isan_dir, path_mode="reference").params32.n_params(),
                    "lstm": int(sum(v.size for v in tensors.values()))}
        for name, d in (("isan", isan_dir), ("lstm", lstm_dir)):
            r = OnnxRunner.load(d, device=device)
            s0 = r.initial_state()
            x = ids[:stream_chars]
            med, _ = median_time(lambda: r.score_ids(x, s0), repeats)
            stream = len(x) / med
            toks = ids[:steps]
            st = s0[None, :].astype(np.float32)

            def stepper():
                s = st
                for t in toks:
                    _, s = r.step(np.array([t]), s)

            med, _ = median_time(stepper, repeats)
            step_us = med / len(toks) * 1e6
            n = batch_chars // batch
            texts = [ids[i * n : (i + 1) * n] for i in range(batch)]
            med, _ = median_time(lambda: r.score_batch(texts), repeats)
            batched = n * batch / med
            results[name] = {"provider": r.provider, "params": n_params[name], "stream_chars_per_s": stream,
                             "step_us": step_us, "step_chars_per_s": 1e6 / step_us, "batched_chars_per_s": batched}
            log(f"  {name}: stream {stream:,.0f} chars/s, step {step_us:.1f} us, batch {batched:,.0f} chars/s")
    for key, label in (("step_chars_per_s", "single step, batch 1 (model.onnx)"),
                       ("stream_chars_per_s", "streaming, 1 stream (sequence.onnx)"),
                       ("batched_chars_per_s", f"batched, {batch} streams (sequence.onnx)")):
        rows.append({"name": label, "isan": results["isan"][key], "lstm": results["lstm"][key],
                     "ratio": results["isan"][key] / results["lstm"][key]})
    return {"benchmark": "onnx", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
            "repeats": repeats, "models": results, "rows": rows}


def markdown_onnx(result: dict) -> str:
    m, md = result["machine"], result["models"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores; onnxruntime provider: {md['isan']['provider']}",
             f"Command: `{result['command']}`  (median of {result['repeats']})",
             f"Models: ISAN d=216 ({md['isan']['params']:,} parameters), LSTM 548 units ({md['lstm']['params']:,} parameters)", "",
             "| measurement | ISAN chars/s | LSTM chars/s | ISAN / LSTM |", "|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {r['isan']:,.0f} | {r['lstm']:,.0f} | {r['ratio']:.2f}x |")
    return "\n".join(lines)
