"""Benchmarks (``isan bench``): throughput of the engine's paths on real text, with ratios.

Every figure is the median of ``repeats`` runs in this process; ratios are against the
per-character reference path measured in the same run. Results print as a Markdown table
and are written as JSON with the machine, the command and the raw timings.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from isan.bench.common import machine, median_time, rss_mb
from isan.bench.peers import PeerUnavailable, bench_kenlm, bench_onnx_lstm
from isan.bench.sweep import fma_peak, markdown_peak, markdown_scaling, peak_fractions, sweep_rows, thread_scaling


#: What `isan bench engine` measures (issue "The fast engine"); sizes in characters.
SIZES = {"long": 2_500_000, "stream_chunk": 1_000, "stream": 300_000, "batch_texts": 256, "batch_len": 2_000,
         "ref": 100_000, "peer_stream": 20_000, "peer_batch": 256, "peer_batch_len": 200}
#: A quick run (`isan bench engine --quick`, and the test of the benchmark itself).
QUICK_SIZES = {"long": 60_000, "stream_chunk": 1_000, "stream": 20_000, "batch_texts": 16, "batch_len": 2_000,
               "ref": 10_000, "peer_stream": 2_000, "peer_batch": 16, "peer_batch_len": 100,
               "ngram_train": 500_000, "sweep_rows": (16, 64), "sweep_len": 500, "big_batch_texts": 0}
STREAM_CHUNK = SIZES["stream_chunk"]


def useful_flops_per_char(d: int, V: int, readout: bool = True) -> float:
    """The useful FLOPs of one character without composition (two a multiply-add), a float: the step,
    ``[W[x] | b[x]]`` (d, d + 1) times ``[h; 1]``, 2 d (d + 1); with ``readout``, also the logits,
    ``[W_ro | b_ro]`` (V, d + 1) times ``[h; 1]``, 2 V (d + 1). ``d`` is the state's width, ``V`` the
    number of symbols the readout predicts. A row that runs no readout (``isan bench engine``'s
    "ingest") is counted with ``readout=False``."""
    return 2.0 * (d + 1) * (d + V) if readout else 2.0 * (d + 1) * d


class _Run:
    """One run of `isan bench engine`: the engine, the text, and what it has measured so far (rows
    of chars/s with their ratio against the reference, raw timings, facts)."""

    def __init__(self, eng, ids: np.ndarray, ref_ids: np.ndarray, threads: int, repeats: int, sz: dict, log):
        self.eng, self.ids, self.n, self.ref_ids = eng, ids, len(ids), ref_ids
        self.threads, self.repeats, self.sz, self.log = threads, repeats, sz, log
        self.rows: list[dict] = []
        self.raw: dict = {}
        self.facts: dict = {}
        self.ref_bits: np.ndarray | None = None  # the reference's per-character bits (measure_reference)
        self.long_text = None  # the default path's long-text result (measure_long_text)

    def add(self, name, chars, fn, reps=None, baseline="reference"):
        return self.record(name, chars, median_time(fn, self.repeats if reps is None else reps)[1], baseline)

    def add_interleaved(self, entries, reps=None):
        """Rows (name, chars, fn) measured in alternation, one run of each a repeat: a slow spell
        of this shared machine falls on all of them alike, so their ratios hold. One untimed run of
        each first (the first chunk-parallel call checks the model's stability certificate, about
        0.1 s, and its first runs were up to a fifth slower: start-up, not throughput)."""
        times = {name: [] for name, _, _ in entries}
        for _, _, fn in entries:
            fn()
        for _ in range(self.repeats if reps is None else reps):
            for name, _, fn in entries:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        for name, chars, _ in entries:
            self.record(name, chars, times[name])

    def record(self, name, chars, times, baseline="reference"):
        med = statistics.median(times)
        cps = chars / med
        self.raw[name] = {"chars": chars, "seconds": times, "median_s": med, "chars_per_s": cps}
        base = self.raw.get(baseline)
        self.rows.append({"name": name, "chars": chars, "chars_per_s": cps,
                          "ratio": cps / base["chars_per_s"] if base and name != baseline else 1.0,
                          "vs": baseline if name != baseline else "-"})
        self.log(f"  {name}: {cps:,.0f} chars/s")
        return med


def measure_reference(run: _Run) -> None:
    """1. the per-character float64 reference (the baseline of every ratio)."""
    ref = run.eng.with_path("reference")
    out = {}

    def run_ref():
        out["r"] = ref.score(run.ref_ids, per_char=True, normalize="none")

    run.add("reference", len(run.ref_ids), run_ref)
    run.ref_bits = out["r"].per_char_bits


def measure_long_text(run: _Run, bar) -> str:
    """2. long text, chunk-parallel, all threads: the default path (composed jumps when the text
    makes enough chunks for them), one character a step (path="chunked") and float16 jumps,
    interleaved; then the default on one thread. Returns the default row's name."""
    eng, ids, n, threads = run.eng, run.ids, run.n, run.threads
    long_result = {}

    def run_long(th=threads):
        long_result["r"] = eng.score(ids, per_char=True, normalize="none", threads=th)

    eng.jump_table()  # composed once, outside the timing (as the per-symbol layout is)
    long_name = f"long text ({n:,} unseen chars, chunk-parallel, default path)"
    sym_result, f16 = {}, {}

    def run_long_symbol():
        sym_result["r"] = eng.score(ids, per_char=True, normalize="none", threads=threads, path="chunked")

    # the same with the composed matrices stored in float16 (half the bytes; not exact)
    h_init = eng.initial_state().h[None]
    eng.jump_table("float16")

    def run_long_f16():
        f16["r"] = eng.score_ids([ids], h_init, threads=threads, kernel="jumps-f16")

    run.add_interleaved([(long_name, n, run_long),
                         (f"long text ({n:,} unseen chars, chunk-parallel, one character a step)", n, run_long_symbol),
                         (f"long text ({n:,} unseen chars, composed jumps, float16 matrices: not exact)", n, run_long_f16)])
    r, nref = long_result["r"], len(run.ref_ids)
    err = np.abs(r.per_char_bits[:nref] - run.ref_bits)
    run.facts["long_text"] = {"scoring": r.scoring, "max_abs_bits_vs_reference": float(err.max()),
                              "reference_chars": nref, "bpc": r.bpc, "threads": threads}
    rs = sym_result["r"]
    run.facts["long_text_per_symbol"] = {"scoring": rs.scoring, "max_abs_bits_vs_reference": float(
        np.abs(rs.per_char_bits[:nref] - run.ref_bits).max()),
        "total_bits_rel_vs_default": abs(rs.bits - r.bits) / r.bits}
    b16 = f16["r"][0][0]
    run.facts["long_text_float16"] = {
        "scoring": f16["r"][2].to_json(),
        "max_abs_bits_vs_reference": float(np.abs(b16[:nref] - run.ref_bits).max()),
        "total_bits_rel_vs_default": float(abs(b16.sum() - r.bits) / r.bits)}
    bar.update()
    run.add("long text, 1 thread", n, lambda: run_long(1))
    run.facts["long_text"]["scoring_1_thread"] = long_result["r"].scoring
    run.long_text = r  # the default path's result on all threads (measure_ingest reads its extra work)
    return long_name


def measure_streaming(run: _Run, bar) -> None:
    """3. streaming in 1,000-character chunks through the composed table (float32, then float16)."""
    import tempfile

    eng, ids, n, sz = run.eng, run.ids, run.n, run.sz
    chunks = [ids[i : i + sz["stream_chunk"]] for i in range(0, min(n, sz["stream"]), sz["stream_chunk"])]

    def run_stream(e):
        st = e.initial_state()
        for c in chunks:
            st = e.score(c, state=st, normalize="none", path="composed").state

    nstream = sum(len(c) for c in chunks)
    med = run.add("streaming, 1,000-char chunks, float32 table", nstream, lambda: run_stream(eng))
    _, lengths, entries = eng.composed.segment(ids[:nstream])
    t = eng.table
    V, d = eng.params.V, eng.d
    bytes_per_char = (4 * d * (d + 1) * len(entries) + 4 * V * (d + 1) * nstream) / nstream
    run.facts["streaming"] = {"avg_match_length": nstream / len(entries), "table_bytes": t.nbytes,
                              "table_entries": t.n_entries, "bytes_read_per_char_f32": bytes_per_char,
                              "gb_per_s_f32": bytes_per_char * nstream / med / 1e9}
    bar.update()
    with tempfile.TemporaryDirectory() as tmp:
        eng16 = _float16_engine(eng, Path(tmp) / "table16")
        med16 = run.add("streaming, 1,000-char chunks, float16 table", nstream, lambda e=eng16: run_stream(e))
        r16 = eng16.score(run.ref_ids, per_char=True, normalize="none", path="composed")
        run.facts["streaming"]["gb_per_s_f16"] = bytes_per_char / 2 * nstream / med16 / 1e9
        run.facts["streaming"]["float16_max_abs_bits_vs_reference"] = float(
            np.abs(r16.per_char_bits - run.ref_bits).max())
        del eng16
    bar.update()


def measure_batched(run: _Run, bar) -> None:
    """4. 256 texts of 2,000 characters, batched (default and composed jumps), then a big batch
    (default and one character a step); which kernel each row ran comes from ``Engine.plan``."""
    eng, ids, n, threads, sz = run.eng, run.ids, run.n, run.threads, run.sz
    bt, bl = sz["batch_texts"], sz["batch_len"]
    texts = [ids[i * bl : (i + 1) * bl] for i in range(bt)]
    batch_kernel = {}

    def batch_rows(tx, groups, reps=None):  # (label, group) pairs, interleaved
        entries = []
        for label, group in groups:
            name = f"batched, {len(tx):,} texts of {bl:,} chars, {label}"
            entries.append((name, len(tx) * bl, lambda g=group: eng.score_batch(tx, normalize="none", threads=threads,
                                                                                 group=g)))
            batch_kernel[name] = eng.plan([bl] * len(tx), threads, kernel=group or "auto").kernel
        run.add_interleaved(entries, reps)

    batch_rows(texts, [("default", None), ("composed jumps", "jumps")])
    bar.update()
    big = sz.get("big_batch_texts", 4096)
    if big and len(ids) >= 1:
        bigtexts = [ids[(i * bl) % (n - bl) : (i * bl) % (n - bl) + bl] for i in range(big)]
        batch_rows(bigtexts, [("default", None), ("one character a step", "chunked")], reps=max(1, run.repeats // 2))
        del bigtexts
    run.facts["batched_kernel"] = batch_kernel  # which kernel each batched row ran ("chunked": per symbol)
    bar.update()


def measure_ingest_and_flops(run: _Run, long_name: str, scaling: list[int] | None, bar) -> None:
    """5. ingestion without readout; then where the time goes: useful FLOP/s against the FMA peak,
    the rows-and-threads sweep and (``scaling``) the thread-scaling table."""
    eng, ids, n, threads, sz = run.eng, run.ids, run.n, run.threads, run.sz
    run.add(f"ingest ({n:,} chars, no readout)", n, lambda: eng.advance(ids, normalize="none", threads=threads))
    bar.update()
    facts, r = run.facts, run.long_text
    flops = useful_flops_per_char(eng.d, eng.params.V)
    lt = run.raw[long_name]
    facts["long_text"]["gflops"] = flops * n * (1 + r.scoring.get("extra_fraction", 0.0)) / lt["median_s"] / 1e9
    facts["long_text"]["flops_per_char"] = flops
    facts["long_text"]["flop_bound_chars_per_s_at_100_gflops_per_core"] = 100e9 * threads / flops
    facts["fma_peak"] = fma_peak(threads)
    readout = [row for row in run.rows if "no readout" not in row["name"]]
    facts["peak_fraction"] = peak_fractions(readout, flops, facts["fma_peak"], threads)  # useful FLOP/s per row
    step_only = [row for row in run.rows if "no readout" in row["name"]]  # ingest: the step's FLOPs only
    peak_fractions(step_only, useful_flops_per_char(eng.d, eng.params.V, readout=False), facts["fma_peak"], threads)
    facts["sweep"] = sweep_rows(eng, ids, sz.get("sweep_rows", (64, 256, 1024, 4096)), sz.get("sweep_len", 500),
                                threads_list=sorted({1, threads}), repeats=run.repeats, log=run.log)
    if scaling:
        facts["scaling"] = thread_scaling(eng, ids, scaling, sz.get("big_batch_texts", 4096) or sz["batch_texts"],
                                          sz["batch_len"], run.repeats, run.log)
    bar.update()


def measure_peers(run: _Run, data, peers: bool, bar) -> None:
    """6. peers: onnxruntime LSTM of equal parameters; KenLM over our n-gram."""
    peer_rows = []
    if peers:
        try:
            peer_rows += bench_onnx_lstm(run.ids, run.repeats, run.log, run.sz)
        except ImportError as e:  # the onnx or train extra is missing
            run.facts["onnx_lstm"] = f"not run: {e}"
        bar.update()
        try:
            peer_rows += bench_kenlm(data, run.ids, run.repeats, run.log, train_chars=run.sz.get("ngram_train"))
        except PeerUnavailable as e:
            run.facts["kenlm"] = f"not run: {e}"
        bar.update()
    else:
        bar.update(2)
    for pr in peer_rows:
        base = run.raw["reference"]["chars_per_s"]
        run.rows.append({**pr, "ratio": pr["chars_per_s"] / base, "vs": "reference"})


def measure_startup(run: _Run, model, unseen: str, startup: bool) -> None:
    """7. start-up of `isan score` after first use; `isan score FILE` on the long text, a fresh
    process each time, net of start-up (the issue's measure): start-up is `isan score` of the
    text's first 20,000 characters, which also takes the chunk-parallel path (so the model's
    certificate check, once a process, counts as start-up); the two alternate."""
    import json
    import subprocess
    import tempfile

    n, repeats = run.n, run.repeats
    probe = unseen[:1000]
    times = []
    for _ in range(max(3, repeats) if startup else 0):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "isan.cli", "score", "--json", "-"] + (["--model", str(model)] if model else []),
                       input=probe, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - t0)
    run.facts["startup_s"] = statistics.median(times) if times else None
    if not startup:
        return
    head = 20_000 if n > 40_000 else n // 2
    with tempfile.TemporaryDirectory() as tmp:
        f, f0 = Path(tmp) / "unseen.txt", Path(tmp) / "head.txt"
        f.write_text(unseen, encoding="utf-8")
        f0.write_text(unseen[:head], encoding="utf-8")
        extra = ["--model", str(model)] if model else []
        full, starts = [], []
        for _ in range(max(3, repeats)):
            for path, acc in ((f, full), (f0, starts)):
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "isan.cli", "score", "--json", str(path)] + extra,
                                     capture_output=True, text=True, check=True).stdout
                acc.append(time.perf_counter() - t0)
                if path == f:
                    scoring = json.loads(out)["scoring"]
    net = statistics.median(full) - statistics.median(starts)
    run.facts["isan_score_file"] = {"chars": n, "seconds": full, "startup_chars": head, "startup_seconds": starts,
                                    "net_s": net, "scoring": scoring}
    run.record(f"isan score FILE ({n:,} unseen chars, a fresh process each run, net of start-up)", n - head,
               [max(net, 1e-9)])


def bench_engine(model: str | None, data: str | Path, repeats: int = 3, threads: int | None = None,
                 peers: bool = True, log=print, progress: bool = True, sizes: dict | None = None,
                 startup: bool = True, scaling: list[int] | None = None) -> dict:
    """Everything `isan bench engine` reports, measured in this process (medians of ``repeats``).

    Rows (chars/s and the ratio against the per-character float64 reference run in the same
    process): long-text scoring of 2.5M unseen characters (text8 from offset 10,000,000: the
    chunk-parallel path), the same on one thread, streaming in 1,000-character chunks (the
    composed table, float32 and float16), 256 texts of 2,000 characters batched, ingestion
    without readout, and the peers: onnxruntime running an LSTM of equal parameters (548 units)
    streaming and batched, and KenLM querying our own order-8 n-gram exported as ARPA (where its
    Python module is installed, built with MAX_ORDER >= 8). Facts: start-up of `isan score` after
    first use, resident memory, the table, exactness on the first 100,000 characters against
    the reference, and where the time goes (GFLOP/s against the FLOP bound, GB/s drawn by the
    sequential path). ``sizes`` overrides :data:`SIZES` (e.g. :data:`QUICK_SIZES`). ``scaling``
    (thread counts) adds a scaling table (:func:`thread_scaling`).
    """
    sz = {**SIZES, **(sizes or {})}
    from tqdm.auto import tqdm

    from isan.engine import Engine, default_model_path
    from isan.data import read_text8_split
    from isan.engine.kernels import default_threads, native_status

    threads = threads or default_threads()
    src = Path(model) if model else default_model_path()
    t0 = time.perf_counter()
    eng = Engine.load(src)  # composes the cached table on first use
    first_load = time.perf_counter() - t0
    if eng.table is None:
        raise SystemExit(f"{src} has no trie table; build one with `isan export` or `isan table build`")
    unseen = read_text8_split(data, "unseen")[: sz["long"]]
    ids = eng.encode(unseen)
    steps = ["reference", "long text", "long text, 1 thread", "long text, per symbol", "streaming f32", "streaming f16",
             "batched", "batched, jumps", "ingest", "sweep", "onnx LSTM", "KenLM", "start-up"]
    bar = tqdm(total=len(steps), desc="isan bench engine", unit="step", disable=not progress)
    run = _Run(eng, ids, ids[: sz["ref"]], threads, repeats, sz, log)
    measure_reference(run)
    bar.update()
    long_name = measure_long_text(run, bar)
    bar.update(2)
    measure_streaming(run, bar)
    measure_batched(run, bar)
    measure_ingest_and_flops(run, long_name, scaling, bar)
    facts = run.facts
    facts["rss_mib_engine"] = rss_mb()  # before the peers load their models
    facts["peak_rss_mib_engine"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    measure_peers(run, data, peers, bar)
    measure_startup(run, model, unseen, startup)
    t0 = time.perf_counter()
    Engine.load(src)
    facts["load_s_in_process"] = time.perf_counter() - t0
    facts["first_load_s"] = first_load
    facts["rss_mib"] = rss_mb()
    facts["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    facts["kernels"] = native_status()
    bar.update()
    bar.close()
    return {"benchmark": "engine", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
            "model": eng.describe(), "repeats": repeats, "threads": threads, "rows": run.rows, "facts": facts,
            "raw": run.raw}


def _float16_engine(eng, out: Path):
    """The same model with its table's keys composed into a float16 table at ``out``."""
    from isan.engine import Engine
    from isan.trie_tables.build import build_table
    from isan.trie_tables.format import load_table

    t = eng.table
    keys = [k for k in t.trie.keys()]
    build_table(out, eng.params32, eng.alphabet, keys, eng.params_sha256, dtype="float16", max_len=t.max_len)
    table16 = load_table(out, eng.params_sha256, eng.alphabet, eng.d)
    return Engine(eng.params32, eng.alphabet, eng.manifest, source=str(out), table=table16)


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, numpy {m['numpy']}; "
             f"kernels {result['facts']['kernels'].get('isa')}, {result['threads']} threads",
             f"Command: `{result['command']}`  (median of {result['repeats']} runs)", "",
             "| measurement | chars | chars/s | vs reference | useful GFLOP/s (of the FMA peak of its threads) |",
             "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        g = r.get("useful_gflops")
        gf = f"{g:.0f} ({r['of_peak']:.0%})" if g and r.get("of_peak") else (f"{g:.0f}" if g else "-")
        lines.append(f"| {r['name']} | {r['chars']:,} | {r['chars_per_s']:,.0f} | {r['ratio']:.2f}x | {gf} |")
    f = result["facts"]
    lt, sm = f["long_text"], f.get("streaming", {})
    sc = lt["scoring"]
    lines += ["", "| fact | value |", "|---|---|",
              f"| long text: chunks, extra work, residual | {sc.get('chunks')}, {sc.get('extra_fraction', 0):.1%}, "
              f"{sc.get('residual', 0):.1e} (stop at rtol {sc.get('rtol')} / margin {sc.get('margin')}) |",
              f"| long text: max bits/char from the float64 reference (first {lt['reference_chars']:,} chars) | {lt['max_abs_bits_vs_reference']:.1e} |",
              f"| long text: GFLOP/s ({lt['flops_per_char'] / 1e3:.0f} kFLOP a character) | {lt['gflops']:.0f} |",
              f"| float32 FMA peak measured ({f.get('fma_peak', {}).get('isa')}; 1 thread / all) | "
              f"{f.get('fma_peak', {}).get('gflops_1_thread', 0):.0f} / {f.get('fma_peak', {}).get('gflops_all_threads', 0):.0f} GFLOP/s |",
              *markdown_peak(f),
              f"| long text: kernel (default path), characters a jump | {sc.get('path')}, "
              f"{sc.get('chars_per_jump', 1.0):.2f} |",
              f"| long text one character a step: max bits/char from the reference, total from the default (relative) | "
              f"{f.get('long_text_per_symbol', {}).get('max_abs_bits_vs_reference', float('nan')):.1e}, "
              f"{f.get('long_text_per_symbol', {}).get('total_bits_rel_vs_default', float('nan')):.1e} |",
              f"| composed jumps, float16 matrices: max bits/char from the reference, total (relative) | "
              f"{f.get('long_text_float16', {}).get('max_abs_bits_vs_reference', float('nan')):.1e}, "
              f"{f.get('long_text_float16', {}).get('total_bits_rel_vs_default', float('nan')):.1e} |",
              f"| batched rows: kernel each ran | "
              + ", ".join(f"{k.split(', ', 1)[1]}: {v}" for k, v in f.get("batched_kernel", {}).items()) + " |",
              f"| streaming: average match, bytes read a character (float32) | {sm.get('avg_match_length', 0):.2f}, "
              f"{sm.get('bytes_read_per_char_f32', 0) / 1e3:.0f} KB |",
              f"| streaming: bandwidth drawn (float32 / float16) | {sm.get('gb_per_s_f32', 0):.1f} / {sm.get('gb_per_s_f16', 0):.1f} GB/s |",
              f"| float16 table: max bits/char from the reference | {sm.get('float16_max_abs_bits_vs_reference', float('nan')):.3f} |",
              f"| table | {sm.get('table_entries', 0):,} entries, {sm.get('table_bytes', 0) / 2**20:.0f} MiB |",
              "| `isan score FILE` of the long text: a fresh process, its start-up, the kernel it ran | "
              + (f"{statistics.median(f['isan_score_file']['seconds']):.2f} s, "
                 f"{statistics.median(f['isan_score_file']['startup_seconds']):.2f} s, "
                 f"{f['isan_score_file']['scoring'].get('path')} |" if f.get("isan_score_file") else "not measured |"),
              "| start-up of `isan score` (process, after first use) | "
              + (f"{f['startup_s']:.2f} s |" if f.get("startup_s") is not None else "not measured |"),
              f"| resident memory of this process before the peers ran (now / peak) | {f['rss_mib_engine']:.0f} MiB / "
              f"{f['peak_rss_mib_engine']:.0f} MiB |"]
    for k in ("onnx_lstm", "kenlm"):
        if isinstance(f.get(k), str):
            lines.append(f"| {k} | {f[k]} |")
    if f.get("scaling"):
        lines += ["", "Scaling over threads (each count in alternation; Amdahl's serial fraction from the speed-up):", "",
                  markdown_scaling(f["scaling"])]
    return "\n".join(lines)


def bench_budgets(model: str | None, train_text: str, test_text: str, budgets: list[str], repeats: int = 3,
                  chars: int = 200_000, chunk: int = STREAM_CHUNK, dtypes=("float32", "float16"),
                  threads: int | None = None, log=print) -> dict:
    """Streaming (``chunk``-character calls, the state carried) through tables of several sizes and
    storage types, one thread and ``threads`` threads, against the per-character reference.

    Tables are mined from ``train_text`` (the train split) and built into a temporary directory;
    timing runs on ``test_text``. A bigger table gives longer matches (fewer jumps) but more of it
    lives in memory rather than in the L3 cache, so each jump reads slower (docs/guide/tables-and-speed.md,
    'The two limits, and the targets').
    """
    import tempfile

    from isan.engine import Engine, default_model_path
    from isan.engine.kernels import default_threads
    from isan.trie_tables.build import build_from_recipe, plan_table
    from isan.trie_tables.format import load_table

    threads = threads or default_threads()
    src = Path(model) if model else default_model_path()
    base = Engine.load(src, path_mode="reference")
    a = base.alphabet
    train = a.encode(train_text)
    ids = a.encode(test_text)[:chars]
    med, _ = median_time(lambda: base.score(ids, normalize="none"), repeats)
    ref_cps = len(ids) / med
    rows = [{"budget": "none (reference, float64)", "dtype": "float64", "entries": 0, "table_mib": 0.0,
             "avg_match_length": 1.0, "chars_per_s_1": ref_cps, "chars_per_s_n": None, "ratio": 1.0}]
    chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]

    def stream(eng, th):
        st = eng.initial_state()
        for c in chunks:
            st = eng.score(c, state=st, normalize="none", path="composed", threads=th).state

    with tempfile.TemporaryDirectory() as tmp:
        for b in budgets:
            for dt in dtypes:
                rec = plan_table(train, base.params32, a, budget=b, dtype=dt)
                d = build_from_recipe(Path(tmp) / f"{b}-{dt}", rec, base.params32, a, base.params_sha256)
                table = load_table(d, base.params_sha256, a, base.d)
                eng = Engine(base.params32, a, base.manifest, table=table)
                med1, _ = median_time(lambda: stream(eng, 1), repeats)
                eng2 = Engine(base.params32, a, base.manifest, table=table)  # a fresh thread chooser
                medn, _ = median_time(lambda: stream(eng2, threads), repeats) if threads > 1 else (None, None)
                _, _, ent = eng.composed.segment(ids)
                rows.append({"budget": b, "dtype": dt, "entries": len(rec["keys"]), "table_mib": table.nbytes / 2**20,
                             "avg_match_length": len(ids) / len(ent), "chars_per_s_1": len(ids) / med1,
                             "chars_per_s_n": len(ids) / medn if medn else None, "ratio": len(ids) / med1 / ref_cps})
                log(f"  {b} {dt}: {rows[-1]['chars_per_s_1']:,.0f} chars/s (1 thread)"
                    + (f", {rows[-1]['chars_per_s_n']:,.0f} ({threads} threads)" if medn else ""))
                shutil.rmtree(d, ignore_errors=True)
    return {"benchmark": "table budgets", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
            "model": {"source": str(src), "name": src.name, "params_sha256": base.params_sha256},
            "chars": len(ids), "chunk": chunk, "threads": threads, "repeats": repeats, "rows": rows}


def markdown_budgets(result: dict) -> str:
    m = result["machine"]
    th = result["threads"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, numpy {m['numpy']}",
             f"Model: {result['model']['name']} (params_sha256 {result['model']['params_sha256'][:12]})",
             f"Command: `{result['command']}`  ({result['chars']:,} chars of the test split in "
             f"{result['chunk']:,}-character calls, median of {result['repeats']})", "",
             f"| table budget | dtype | entries | MiB | avg match (chars) | chars/s, 1 thread | chars/s, {th} threads | 1 thread vs reference |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        n = f"{r['chars_per_s_n']:,.0f}" if r["chars_per_s_n"] else "-"
        lines.append(f"| {r['budget']} | {r['dtype']} | {r['entries']:,} | {r['table_mib']:.0f} | {r['avg_match_length']:.2f} | "
                     f"{r['chars_per_s_1']:,.0f} | {n} | {r['ratio']:.2f}x |")
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
    from isan.engine.baselines.onnx import OnnxRunner
    from isan.export.checkpoint import export_from_bundle
    from isan.export.onnx_export import onnx_hook
    from isan.train.baselines import LSTM

    a = Alphabet.text8()
    ids = a.encode(text)
    results, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        src = default_model_path()
        isan_dir = export_from_bundle(src, Path(tmp) / "isan", onnx=True)
        isan = Engine.load(isan_dir, path_mode="reference")
        model = {"source": str(src), "name": src.name, "params_sha256": isan.params_sha256}
        lstm = LSTM.for_budget(27, 27, 1.28e6, seed=0)
        tensors = {k: v.detach().numpy().astype(np.float32) for k, v in lstm.state_dict().items()}
        lstm_dir = write_bundle(Path(tmp) / "lstm", tensors, a, kind="lstm", extra={"model": lstm.config(), "d": lstm.d},
                                hook=onnx_hook)
        n_params = {"isan": isan.params32.n_params(),
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
    import onnxruntime

    return {"benchmark": "onnx", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]), "model": model,
            "onnxruntime": onnxruntime.__version__, "repeats": repeats, "models": results, "rows": rows}


def markdown_onnx(result: dict) -> str:
    m, md = result["machine"], result["models"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores; onnxruntime provider: {md['isan']['provider']}",
             f"Command: `{result['command']}`  (median of {result['repeats']})",
             f"Models: ISAN d=216 ({md['isan']['params']:,} parameters), LSTM 548 units ({md['lstm']['params']:,} parameters)", "",
             "| measurement | ISAN chars/s | LSTM chars/s | ISAN / LSTM |", "|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {r['isan']:,.0f} | {r['lstm']:,.0f} | {r['ratio']:.2f}x |")
    return "\n".join(lines)
