"""GPU scoring throughput (``isan bench gpu``, issue 35): the torch backend against the CPU's
compiled kernels in the same process, and its exactness against the float64 reference.

Rows (medians over ``repeats`` timings after one untimed run each):

* the CPU's compiled kernels (the baseline, all the CPUs this process may use): ``docs`` documents
  of ``doc_chars`` characters, and the long text;
* the torch backend on ``device`` in float32 and float64, with each of its steps on a GPU (``mm``:
  a torch GEMM per symbol between a gather and a scatter; ``triton``: one fused grouped kernel a
  step, engine/kernels/torch/grouped.py): the same documents (one row a document, one call), the
  same documents with the steps alone (no readout: where the time goes), and the long text
  chunk-parallel (``Engine.score``). A step that fails (Triton cannot compile, say) is a row with
  its error, not the end of the run.

Facts: per-document bits of the float32 run against the float64 run on the device (relative), the
float64 run against the numpy float64 reference on the first ``check_docs`` documents, the long
text's total bits in each dtype against the CPU's, useful TFLOP/s (``2 (d (d + 1) + (d + 1) V)``
FLOPs a character, 105 kFLOP at d = 216), the device's name, torch and CUDA versions, and the
chunk plan and extra work of the long text. Nothing on the GPU is claimed that this command has
not printed; ``--quick`` runs small sizes on any device, a check that it runs (the test suite runs
it on the CPU device).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isan.bench.common import machine, median_time

#: The issue's sizes: 65,536 documents of 512 characters; the long text is the whole data file.
SIZES = {"docs": 65_536, "doc_chars": 512, "long_chars": None, "check_docs": 256, "pipeline_batches": 4}
QUICK_SIZES = {"docs": 48, "doc_chars": 200, "long_chars": 30_000, "check_docs": 8, "pipeline_batches": 2}


def _median_time(fn, repeats: int) -> tuple[float, list[float], object]:
    """:func:`isan.bench.common.median_time` after one untimed run (first-call costs: weights to the
    device, the allocator, the certificate), with the last run's result."""
    out = {"r": fn()}
    med, times = median_time(lambda: out.update(r=fn()), repeats)
    return med, times, out["r"]


#: Every (dtype, step) run a GPU has; the CPU device runs the torch step only.
GPU_RUNS = (("float32", "mm"), ("float32", "triton"), ("float32", "triton-tf32x3"), ("float64", "mm"),
            ("float64", "triton"))


class _Rows:
    """The result's rows (``rows``), one a measurement: characters a second, useful TFLOP/s
    (``flops`` a character) and the ratio to a baseline's characters a second; each is logged."""

    def __init__(self, flops: int, log):
        self.rows, self.flops, self.log = [], flops, log

    def __call__(self, name: str, chars: int, seconds: float, times: list, base: float | None = None) -> dict:
        r = {"name": name, "chars": int(chars), "seconds": seconds, "times": times, "chars_per_s": chars / seconds,
             "useful_tflops": chars * self.flops / seconds / 1e12}
        r["ratio"] = r["chars_per_s"] / base if base else 1.0
        self.rows.append(r)
        self.log(f"  {name}: {r['chars_per_s']:,.0f} chars/s ({r['ratio']:.2f}x)")
        return r


@dataclass
class _Work:
    """What every run scores, and how: the documents (``L`` ids each) and their start states ``h0``
    (docs, d), the long text's ids, the timing repeats, the overlapped batches, whether to profile."""

    docs: list
    h0: np.ndarray
    ids_all: np.ndarray
    L: int
    repeats: int
    n_batches: int
    profile: bool
    device: str
    log: object

    @property
    def n_doc_chars(self) -> int:
        return len(self.docs) * self.L


def _engines(src, device: str, runs: list[tuple[str, str]]) -> dict:
    """{(dtype, step): the torch backend's Engine for that run, or the IsanError that refused it}."""
    from isan.engine.core import Engine
    from isan.errors import IsanError

    gpu = {}
    for dt, st in runs:
        step, _, precision = st.partition("-")
        try:  # the backend with this step, for every path (documents and the long text alike)
            gpu[dt, st] = Engine.load(src, progress_bar=False, device=device, dtype=dt, kernels="torch", step=step,
                                      precision=precision or "ieee")
        except IsanError as e:
            gpu[dt, st] = e
    return gpu


def _measure_run(w: _Work, eng, tag: str, key: tuple[str, str], row: _Rows, facts: dict, base_docs: float,
                 base_long: float, doc_bits: dict, long_res: dict) -> None:
    """One run's rows (the documents: per character, totals, overlapped batches, steps only; the long
    text) and facts; its per-document bits in ``doc_bits[key]``, its long text's result in
    ``long_res[key]``. Raises what the run raised (the caller reports it)."""
    from isan.engine.batches import score_batches

    docs, h0, ids_all, repeats, dt, st = w.docs, w.h0, w.ids_all, w.repeats, *key
    sec, times, (bits, _, rep) = _median_time(lambda: eng.score_ids(docs, h0, chunks="none"), repeats)
    row(f"{tag}: {len(docs):,} documents x {w.L}", w.n_doc_chars, sec, times, base_docs)
    doc_bits[dt, st] = np.array([b.sum() for b in bits])
    if w.profile and "profile" not in facts:
        facts["profile"] = _where_time_goes(lambda: eng.score_ids(docs, h0, chunks="none"), w.device, tag,
                                            "documents", w.n_doc_chars, w.log)
        if "kernel_device_s" in facts["profile"]:
            row(f"{tag}: the same, the step's kernel alone (device time)", w.n_doc_chars,
                facts["profile"]["kernel_device_s"], [], base_docs)
    sec, times, tot = _median_time(lambda: eng.score_ids(docs, h0, chunks="none", want_bits="totals"), repeats)
    row(f"{tag}: the same, each document's total only (reduced on the device)", w.n_doc_chars, sec, times,
        base_docs)
    facts[f"docs {dt} step {st}: totals vs per-character sums (max rel)"] = float(
        np.max(np.abs(tot[0] - doc_bits[dt, st]) / doc_bits[dt, st]))
    n_batches = w.n_batches
    sec, times, outs = _median_time(lambda: list(score_batches(eng, [(docs, h0)] * n_batches)), repeats)
    row(f"{tag}: {n_batches} such batches, overlapped (score_batches, totals)", n_batches * w.n_doc_chars, sec,
        times, base_docs)
    facts[f"docs {dt} step {st}: overlapped totals vs one call's (max rel)"] = float(
        max(np.max(np.abs(o.values - tot[0]) / tot[0]) for o in outs))
    sec, times, _ = _median_time(lambda: eng.score_ids(docs, h0, chunks="none", want_bits=False), repeats)
    row(f"{tag}: the same, steps only (no readout)", w.n_doc_chars, sec, times, base_docs)
    sec, times, res = _median_time(lambda: eng.score(ids_all), repeats)
    row(f"{tag}: long text, chunk-parallel", len(ids_all), sec, times, base_long)
    if w.profile and "profile_long" not in facts:
        facts["profile_long"] = _where_time_goes(lambda: eng.score(ids_all), w.device, tag, "long text",
                                                 len(ids_all), w.log)
        if "kernel_device_s" in facts["profile_long"]:
            row(f"{tag}: long text, the step's kernel alone (device time)", len(ids_all),
                facts["profile_long"]["kernel_device_s"], [], base_long)
    long_res[dt, st] = res


def _exactness(facts: dict, cpu, docs: list, n_ref: int, bits_cpu, long_cpu, doc_bits: dict, long_res: dict) -> None:
    """The runs' exactness facts: each run's per-document bits against the CPU's and against the
    float64 reference on the first ``n_ref`` documents, float32 against float64, and the long text's."""
    from isan.engine.reference import score_ref

    def rel(a, b):
        return float(np.max(np.abs(a - b) / b))

    cpu_doc_bits = np.array([b.sum() for b in bits_cpu])
    ref64 = np.array([score_ref(cpu.params, docs[i].astype(np.int64), cpu.params.h0)[0].sum() for i in range(n_ref)])
    facts["check_docs"] = n_ref
    for (dt, st), bits in doc_bits.items():
        facts[f"docs {dt} step {st}: max rel vs the CPU kernels"] = rel(bits, cpu_doc_bits)
        facts[f"docs {dt} step {st}: max rel vs the float64 reference ({n_ref} docs)"] = rel(bits[:n_ref], ref64)
        if dt == "float32" and ("float64", st) in doc_bits:
            facts[f"docs float32 step {st}: max rel vs float64 step {st}"] = rel(bits, doc_bits["float64", st])
    for (dt, st), res in long_res.items():
        facts[f"long text {dt} step {st}"] = {"scoring": res.scoring, "bits": res.bits,
                                              "bits_rel_vs_cpu": abs(res.bits - long_cpu.bits) / long_cpu.bits}
        if dt == "float32" and ("float64", st) in long_res:
            b64 = long_res["float64", st].bits
            facts[f"long text float32 step {st}: rel vs float64"] = abs(res.bits - b64) / b64


def _device_facts(device: str) -> dict:
    """The device, torch's and CUDA's versions; a GPU's name and memory (GiB)."""
    import torch

    dev = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.startswith("cuda"):
        dev["device_name"] = torch.cuda.get_device_name(torch.device(device))
        dev["memory_gib"] = round(torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30, 1)
    return dev


def bench_gpu(model: str | None, data: str | Path, device: str = "cuda", repeats: int = 3,
              sizes: dict | None = None, runs: list[tuple[str, str]] | None = None, profile: bool = False,
              seed: int = 0, log=print) -> dict:
    """Run the benchmark; returns a JSON-ready dict (see the module docstring).

    ``runs``: (dtype, step) pairs, step ``"mm"``, ``"triton"`` or ``"triton-tf32x3"`` (default:
    :data:`GPU_RUNS` on a GPU, the float32 and float64 ``"mm"`` runs on the CPU device). ``profile``:
    profile one call of the documents of the first run with torch.profiler, its top kernels by
    device time in the result (``facts["profile"]``).

    Raises:
        BackendUnavailableError: no such device (or no torch).
    """
    import torch  # noqa: F401 - no torch: the error is raised here, before any work

    from isan.engine.core import Engine
    from isan.engine.paths import default_model_path
    from isan.engine.kernels.backends import resolve_device

    sz = {**SIZES, **(sizes or {})}
    device = resolve_device(device)
    src = model or default_model_path()
    cpu = Engine.load(src, progress_bar=False)
    if runs is None:
        runs = list(GPU_RUNS) if device.startswith("cuda") else [("float32", "mm"), ("float64", "mm")]
    gpu = _engines(src, device, runs)
    text = Path(data).read_text(encoding="utf-8", errors="replace")
    ids_all = cpu.prepare(text[: sz["long_chars"]] if sz["long_chars"] else text).ids
    rng = np.random.default_rng(seed)
    L = sz["doc_chars"]
    starts = rng.integers(0, len(ids_all) - L, sz["docs"])
    docs = [ids_all[s : s + L] for s in starts]
    w = _Work(docs, np.tile(cpu.params.h0, (len(docs), 1)), ids_all, L, repeats, sz["pipeline_batches"], profile,
              device, log)
    d, V = cpu.d, len(cpu.alphabet)
    flops = 2 * (d * (d + 1) + (d + 1) * V)
    row, facts = _Rows(flops, log), {"flops_per_char": flops}
    log(f"documents: {len(docs):,} x {L:,} characters; long text: {len(ids_all):,} characters; device {device}")
    sec, times, (bits_cpu, _, _) = _median_time(lambda: cpu.score_ids(docs, w.h0, chunks="none"), repeats)
    base_docs = row(f"CPU compiled kernels: {len(docs):,} documents x {L}", w.n_doc_chars, sec, times)["chars_per_s"]
    sec, times, long_cpu = _median_time(lambda: cpu.score(ids_all), repeats)
    base_long = row(f"CPU compiled kernels: long text, {len(ids_all):,} chars", len(ids_all), sec, times)["chars_per_s"]
    doc_bits, long_res, errors = {}, {}, {}  # keyed by (dtype, step)
    for (dt, st), eng in gpu.items():
        tag = f"{device} {dt}, step {st}"
        try:
            if isinstance(eng, Exception):
                raise eng
            _measure_run(w, eng, tag, (dt, st), row, facts, base_docs, base_long, doc_bits, long_res)
        except Exception as e:  # noqa: BLE001 - a step that cannot run is reported, and the others still run
            errors[tag] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            log(f"  {tag}: FAILED: {errors[tag]}")
    if errors:
        facts["errors"] = errors
    if any(st.startswith("triton") for _, st in doc_bits):
        from isan.engine.kernels.torch import grouped

        facts["triton_configs"] = grouped.tuned_configs()
    _exactness(facts, cpu, docs, min(sz["check_docs"], len(docs)), bits_cpu, long_cpu, doc_bits, long_res)
    return {"benchmark": "isan bench gpu", "machine": machine(), "gpu": _device_facts(device),
            "command": " ".join(["isan"] + sys.argv[1:]),
            "model": {"source": str(src), "params_sha256": cpu.params_sha256, "d": d, "V": V},
            "sizes": {**sz, "long_chars": len(ids_all)}, "repeats": repeats, "cpu_threads": cpu.threads,
            "rows": row.rows, "facts": facts}


#: The fused step's kernel, as torch.profiler names it (engine/kernels/torch/grouped.py).
STEP_KERNEL = "_grouped_step_kernel"


def _where_time_goes(fn, device: str, tag: str, what: str, chars: int, log, rows: int = 15) -> dict:
    """Where one call of ``fn`` spends its time, two ways: torch.profiler's top ``rows`` operations
    by device time (CPU time on the CPU device), with the fused step's kernel's total device time
    (``kernel_device_s``: the rate the step alone would give), and cProfile's top functions of the
    host by cumulative time (the Python side: preparation, bookkeeping, waits). A profiler that
    fails is reported in the result, and ends nothing."""
    out: dict = {"run": tag, "what": what}
    try:
        out.update(_profile(fn, device, rows))
    except Exception as e:  # noqa: BLE001 - the profiler is an extra: its failure ends nothing
        out["table"] = f"the profiler failed: {type(e).__name__}: {e}"
    try:
        out["host"] = _host_profile(fn, rows)
    except Exception as e:  # noqa: BLE001
        out["host"] = f"cProfile failed: {type(e).__name__}: {e}"
    if out.get("kernel_device_s"):
        out["kernel_chars_per_s"] = chars / out["kernel_device_s"]
    log(f"profile of one call ({tag}, {what}):\n{out['table']}\nhost (cProfile, by cumulative time):\n{out['host']}")
    return out


def _profile(fn, device: str, rows: int = 15) -> dict:
    """torch.profiler's table of one call of ``fn``: the top ``rows`` operations by device time
    (by CPU time on the CPU device), and the fused step kernel's device seconds where it ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    key = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    avg = prof.key_averages()
    out = {"table": avg.table(sort_by=key, row_limit=rows, max_name_column_width=60)}
    step_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in avg if STEP_KERNEL in e.key)
    if step_us:
        out["kernel_device_s"] = step_us / 1e6
    return out


def _host_profile(fn, rows: int) -> str:
    """cProfile's top ``rows`` functions of one call of ``fn``, by cumulative time."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(rows)
    return "\n".join(line for line in buf.getvalue().splitlines() if line.strip())[-6000:]


def markdown(result: dict) -> str:
    m, g, f = result["machine"], result["gpu"], result["facts"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores; {g.get('device_name', g['device'])}, torch {g['torch']} "
             f"(CUDA {g['cuda']})",
             f"Command: `{result['command']}`  (median of {result['repeats']} runs; CPU baseline on "
             f"{result['cpu_threads']} threads)", "",
             "| measurement | chars | chars/s | vs CPU | useful TFLOP/s |", "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {r['chars']:,} | {r['chars_per_s']:,.0f} | {r['ratio']:.2f}x | "
                     f"{r['useful_tflops']:.2f} |")
    lines += ["", "| exactness | value |", "|---|---|"]
    for k, v in f.items():
        if isinstance(v, float) and ("max rel" in k or k.endswith("rel vs float64")):
            lines.append(f"| {k} | {v:.1e} |")
    for k, lt in f.items():
        if k.startswith("long text ") and isinstance(lt, dict):
            sc = lt["scoring"]
            lines.append(f"| {k}: chunks, extra work, total vs the CPU's (relative) | "
                         f"{sc.get('chunks')}, {sc.get('extra_fraction', 0):.1%}, {lt['bits_rel_vs_cpu']:.1e} |")
    for key in ("profile", "profile_long"):
        if key in f:
            pr = f[key]
            lines += ["", f"Profile of one call ({pr['run']}, {pr['what']}): device", "", "```", pr["table"], "```",
                      "", "host (cProfile, by cumulative time):", "", "```", str(pr.get("host", "")), "```"]
    for key, cfg in f.get("triton_configs", {}).items():
        lines.append(f"| Triton step's tuned tile ({key}) | {cfg} |")
    for tag, err in f.get("errors", {}).items():
        lines.append(f"| {tag}: FAILED | {err} |")
    return "\n".join(lines)
