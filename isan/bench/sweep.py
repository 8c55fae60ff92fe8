"""The engine benchmark's scaling measurements: the batched kernels against rows and threads
(``sweep_rows``, ``plot_sweep``), thread scaling with Amdahl's law (``thread_scaling``), and the
machine's FMA peak (``fma_peak``) and the fraction of it the long text and the documents reach
(``peak_fractions``); all through the engine's public API."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from isan.bench.common import median_time


def amdahl(relative: float, speedup: float, target: float = 16.0) -> dict:
    """Amdahl's law from a measured speed-up: with ``relative`` times the workers of the baseline
    and a ``speedup`` over it, the serial fraction ``s`` of ``S = 1 / (s + (1 - s) / N)`` and the
    speed-up that ``s`` predicts at ``target`` times the baseline's workers (None where s is
    negative enough to predict nothing). ``{}`` when ``relative`` is 1 (nothing to fit)."""
    if relative <= 1:
        return {}
    s = (relative / speedup - 1) / (relative - 1)
    return {"amdahl_serial_fraction": s,
            "predicted_speedup_16": 1 / (s + (1 - s) / target) if s > -1 / (target - 1) else None}


def thread_scaling(eng, ids: np.ndarray, threads_list: list[int], batch_texts: int, batch_len: int,
                   repeats: int = 3, log=print) -> list[dict]:
    """Issue 36's scaling table: the long text (default path) and a batch of ``batch_texts`` texts of
    ``batch_len`` characters on each thread count, the counts in alternation each repeat; chars/s,
    the speed-up against the first count, and the serial fraction that Amdahl's law gives from it
    (S = 1 / (s + (1 - s) / N)), with what that predicts for 16 threads."""
    n = len(ids)
    texts = [ids[(i * batch_len) % (n - batch_len) : (i * batch_len) % (n - batch_len) + batch_len]
             for i in range(batch_texts)]
    work = {"long text": (n, lambda th: eng.score(ids, normalize="none", threads=th)),
            f"{batch_texts:,} texts of {batch_len:,}": (batch_texts * batch_len,
                                                      lambda th: eng.score_batch(texts, normalize="none", threads=th))}
    out = []
    for what, (chars, fn) in work.items():
        times = {th: [] for th in threads_list}
        for th in threads_list:
            fn(th)  # untimed
        for _ in range(repeats):
            for th in threads_list:
                t0 = time.perf_counter()
                fn(th)
                times[th].append(time.perf_counter() - t0)
        base = None
        for th in threads_list:
            cps = chars / statistics.median(times[th])
            base = base or (th, cps)
            row = {"what": what, "threads": th, "chars": chars, "chars_per_s": cps, "seconds": times[th],
                   "speedup": cps / base[1]}
            row.update(amdahl(th / base[0], row["speedup"], 16 / base[0]))
            out.append(row)
            log(f"  scaling, {what}, {th} threads: {cps:,.0f} chars/s ({row['speedup']:.2f}x)")
    return out


def markdown_scaling(rows: list[dict]) -> str:
    lines = ["| work | threads | chars/s | speed-up | Amdahl serial fraction | predicted 16 threads |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        sf = f"{r['amdahl_serial_fraction']:.1%}" if "amdahl_serial_fraction" in r else "-"
        p16 = f"{r['predicted_speedup_16']:.1f}x" if r.get("predicted_speedup_16") else "-"
        lines.append(f"| {r['what']} | {r['threads']} | {r['chars_per_s']:,.0f} | {r['speedup']:.2f}x | {sf} | {p16} |")
    return "\n".join(lines)


def fma_peak(threads: int, rounds: int = 20_000_000) -> dict:
    """The machine's float32 FMA peak as the widest instruction set of the compiled kernels reaches
    it (12 independent vector FMA chains a thread; :func:`_native.fma_peak`), median of 3, on one
    thread and on ``threads``, whatever tile or instruction set the kernels run. Empty without
    the compiled kernels."""
    from isan.engine.kernels import native

    nat = native()
    if nat is None:
        return {}
    before = nat.variant()
    try:
        out = {"isa": nat.set_isa("")}  # the widest instruction set this CPU runs
        for key, th in (("gflops_1_thread", 1), ("gflops_all_threads", threads)):
            vals = []
            for _ in range(3):
                fl, secs, used, _sink = nat.fma_peak(rounds, th)
                vals.append(fl / secs / 1e9)
            out[key] = statistics.median(vals)
    finally:
        nat.set_isa(before)
    return out


def peak_fractions(rows: list[dict], flops_per_char: float, peak: dict, threads: int) -> dict:
    """Each row's useful GFLOP/s (chars/s x ``flops_per_char``: 2 d^2 for the step and 2 V d for the
    readout, a composed jump counted by its characters) and its fraction of the FMA peak of the
    threads it ran on (rows named "..., 1 thread": one thread's peak; the others: all ``threads``');
    set in the rows ("useful_gflops", "of_peak", "peak_threads"). Returns the summary of the long
    text and the documents (batched rows, default path) on one thread and on all:
    {name: {"chars_per_s", "gflops", "threads", "of_peak"}}."""
    p1, pn = peak.get("gflops_1_thread"), peak.get("gflops_all_threads")
    out = {}
    for row in rows:
        if row["name"] == "reference" or "chars_per_s" not in row:
            continue
        th = 1 if row["name"].endswith("1 thread") else threads
        pk = p1 if th == 1 else pn
        g = row["chars_per_s"] * flops_per_char / 1e9
        row.update(useful_gflops=g, of_peak=g / pk if pk else None, peak_threads=th)
        key = None
        if row["name"].startswith("long text") and ("default path" in row["name"] or th == 1):
            key = f"long text, {th} thread{'s' if th > 1 else ''}"
        elif row["name"].startswith("batched") and row["name"].endswith("default"):
            key = "documents, " + row["name"].split(", ")[1] + f", {th} threads"
        if key:
            out[key] = {"chars_per_s": row["chars_per_s"], "gflops": g, "threads": th, "of_peak": row["of_peak"]}
    return out


def markdown_peak(facts: dict) -> list[str]:
    """Fact-table lines: the fraction of the FMA peak of the long text and the documents, and the
    kernels' register tile with the autotune's timings."""
    pk, k = facts.get("fma_peak", {}), facts.get("kernels", {})
    lines = []
    for name, r in facts.get("peak_fraction", {}).items():
        of = f"{r['of_peak']:.0%}" if r.get("of_peak") is not None else "-"
        lines.append(f"| {name}: useful GFLOP/s, of the FMA peak of {r['threads']} thread(s) | "
                     f"{r['gflops']:.0f} of {pk.get('gflops_1_thread' if r['threads'] == 1 else 'gflops_all_threads', 0):.0f}"
                     f" = **{of}** |")
    tm = k.get("tile_timings") or {}
    timings = ", ".join(f"{v} {t['gflops']:.0f}" for v, t in tm.items() if "gflops" in t)
    lines.append(f"| kernels' register tile (how chosen; autotune GFLOP/s a tile, one thread) | {k.get('tile')} "
                 f"({k.get('tile_how')}){'; ' + timings if timings else ''} |")
    return lines


def sweep_rows(eng, ids: np.ndarray, rows_list, length: int, threads_list, repeats: int = 3, log=print) -> dict:
    """chars/s of the two batched kernels (per symbol: ``group="symbol"``; composed jumps: the
    ``jumps`` kernel without cutting) against the number of rows (texts of ``length`` characters
    cut from ``ids``) and threads, in this process. Returns {"length", "rows": [...], "points":
    [{"kernel", "rows", "threads", "chars_per_s", "chars_per_jump"}]}."""
    from isan.engine.kernels.chunked import score_texts_chunked
    from isan.engine.kernels.jumps import run_jumps
    from isan.engine.kernels.plan import Kernel, Plan
    from isan.engine.kernels.streams import run_streams

    pts = []
    h0 = eng.params.h0
    jt = eng.jump_table()
    for P in rows_list:
        P = int(P)
        n = len(ids) - length
        texts = [np.ascontiguousarray(ids[(i * length) % n : (i * length) % n + length], dtype=np.int32) for i in range(P)]
        hs = np.tile(h0, (P, 1))
        for th in threads_list:
            for kernel, model, runner, k in (("per symbol", eng.stream_model(), run_streams, Kernel.CHUNKED),
                                             ("composed jumps", jt, run_jumps, Kernel.JUMPS)):
                rep = {}
                plan = Plan.one_row_a_text(model, runner, P, kernel=k, fallback=eng.chunk_fallback(), path=k.value)

                def go():
                    rep["r"] = score_texts_chunked(plan, texts, hs, threads=th)

                med, _ = median_time(go, repeats)
                r = rep["r"][2]
                cps = P * length / med
                pts.append({"kernel": kernel, "rows": P, "threads": th, "chars_per_s": cps,
                            "chars_per_jump": r.steps / r.jumps if r.jumps else 1.0})
                log(f"  sweep: {kernel}, {P} rows x {length} chars, {th} thread(s): {cps:,.0f} chars/s")
    return {"length": length, "rows": [int(p) for p in rows_list], "points": pts}


def plot_sweep(result: dict, out: str | Path) -> None:
    """chars/s against rows, one line per kernel and thread count (bench_results/*.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sw = result["facts"]["sweep"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    keys = sorted({(p["kernel"], p["threads"]) for p in sw["points"]})
    for kernel, th in keys:
        pts = sorted((p for p in sw["points"] if p["kernel"] == kernel and p["threads"] == th), key=lambda p: p["rows"])
        ax.plot([p["rows"] for p in pts], [p["chars_per_s"] / 1e6 for p in pts], marker="o",
                linestyle="-" if kernel == "per symbol" else "--", label=f"{kernel}, {th} thread{'s' if th > 1 else ''}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"rows (texts of {sw['length']} characters)")
    ax.set_ylabel("million characters / s")
    m = result["machine"]
    ax.set_title(f"batched scoring: per-symbol steps vs composed jumps\n{m['cpu']}, {m['cores']} cores", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    from isan.atomic import atomic_path

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
