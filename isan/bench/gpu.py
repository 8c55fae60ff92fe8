"""GPU scoring throughput (``isan bench gpu``, issue 35): the torch backend against the CPU's
compiled kernels in the same process, and its exactness against the float64 reference.

Rows (medians over ``repeats`` timings after one untimed run each):

* the CPU's compiled kernels (the baseline, all the CPUs this process may use): ``docs`` documents
  of ``doc_chars`` characters, and the long text;
* the torch backend on ``device`` in float32 and float64: the same documents (one row a document,
  one call), and the long text chunk-parallel (``Engine.score``).

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
from pathlib import Path

import numpy as np

from isan.bench.engine import machine, median_time

#: The issue's sizes: 65,536 documents of 512 characters; the long text is the whole data file.
SIZES = {"docs": 65_536, "doc_chars": 512, "long_chars": None, "check_docs": 256}
QUICK_SIZES = {"docs": 48, "doc_chars": 200, "long_chars": 30_000, "check_docs": 8}


def _median_time(fn, repeats: int) -> tuple[float, list[float], object]:
    """:func:`isan.bench.engine.median_time` after one untimed run (first-call costs: weights to the
    device, the allocator, the certificate), with the last run's result."""
    out = {"r": fn()}
    med, times = median_time(lambda: out.update(r=fn()), repeats)
    return med, times, out["r"]


def bench_gpu(model: str | None, data: str | Path, device: str = "cuda", repeats: int = 3,
              sizes: dict | None = None, dtypes: tuple[str, ...] = ("float32", "float64"), seed: int = 0,
              log=print) -> dict:
    """Run the benchmark; returns a JSON-ready dict (see the module docstring).

    Raises:
        BackendUnavailableError: no such device (or no torch).
    """
    import torch

    from isan.engine.core import Engine, default_model_path
    from isan.engine.kernels.backends import resolve_device
    from isan.engine.reference import score_ref

    sz = {**SIZES, **(sizes or {})}
    device = resolve_device(device)
    src = model or default_model_path()
    cpu = Engine.load(src, progress_bar=False)
    gpu = {dt: Engine.load(src, progress_bar=False, device=device, dtype=dt, kernels="torch") for dt in dtypes}
    text = Path(data).read_text(encoding="utf-8", errors="replace")
    ids_all = cpu.prepare(text[: sz["long_chars"]] if sz["long_chars"] else text).ids
    rng = np.random.default_rng(seed)
    L = sz["doc_chars"]
    starts = rng.integers(0, len(ids_all) - L, sz["docs"])
    docs = [ids_all[s : s + L] for s in starts]
    n_doc_chars = len(docs) * L
    h0 = np.tile(cpu.params.h0, (len(docs), 1))
    d, V = cpu.d, len(cpu.alphabet)
    flops = 2 * (d * (d + 1) + (d + 1) * V)
    rows, facts = [], {"flops_per_char": flops}

    def row(name, chars, seconds, times, base=None):
        r = {"name": name, "chars": int(chars), "seconds": seconds, "times": times, "chars_per_s": chars / seconds,
             "useful_tflops": chars * flops / seconds / 1e12}
        r["ratio"] = r["chars_per_s"] / base if base else 1.0
        rows.append(r)
        log(f"  {name}: {r['chars_per_s']:,.0f} chars/s ({r['ratio']:.2f}x)")
        return r

    log(f"documents: {len(docs):,} x {L:,} characters; long text: {len(ids_all):,} characters; device {device}")
    sec, times, (bits_cpu, _, _) = _median_time(lambda: cpu.score_ids(docs, h0, chunks="none"), repeats)
    base_docs = row(f"CPU compiled kernels: {len(docs):,} documents x {L}", n_doc_chars, sec, times)["chars_per_s"]
    sec, times, long_cpu = _median_time(lambda: cpu.score(ids_all), repeats)
    base_long = row(f"CPU compiled kernels: long text, {len(ids_all):,} chars", len(ids_all), sec, times)["chars_per_s"]
    doc_bits, long_res = {}, {}
    for dt, eng in gpu.items():
        sec, times, (bits, _, rep) = _median_time(lambda: eng.score_ids(docs, h0, chunks="none"), repeats)
        row(f"{device} {dt}: {len(docs):,} documents x {L}", n_doc_chars, sec, times, base_docs)
        doc_bits[dt] = np.array([b.sum() for b in bits])
        sec, times, res = _median_time(lambda: eng.score(ids_all), repeats)
        row(f"{device} {dt}: long text, chunk-parallel", len(ids_all), sec, times, base_long)
        long_res[dt] = res
        facts[f"long_text_{dt}"] = {"scoring": res.scoring, "bits": res.bits,
                                    "bits_rel_vs_cpu": abs(res.bits - long_cpu.bits) / long_cpu.bits}
    cpu_doc_bits = np.array([b.sum() for b in bits_cpu])
    for dt in doc_bits:
        facts[f"docs_{dt}_max_rel_vs_cpu"] = float(np.max(np.abs(doc_bits[dt] - cpu_doc_bits) / cpu_doc_bits))
    if "float64" in doc_bits:
        ref64 = np.array([score_ref(cpu.params, docs[i].astype(np.int64), cpu.params.h0)[0].sum()
                          for i in range(min(sz["check_docs"], len(docs)))])
        facts["docs_float64_max_rel_vs_reference"] = float(np.max(np.abs(doc_bits["float64"][: len(ref64)] - ref64) / ref64))
        facts["check_docs"] = len(ref64)
        if "float32" in doc_bits:
            facts["docs_float32_max_rel_vs_float64"] = float(np.max(np.abs(doc_bits["float32"] - doc_bits["float64"])
                                                                    / doc_bits["float64"]))
        if "float32" in long_res:
            facts["long_text_float32_rel_vs_float64"] = abs(long_res["float32"].bits - long_res["float64"].bits) / long_res["float64"].bits
    dev = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.startswith("cuda"):
        dev["device_name"] = torch.cuda.get_device_name(torch.device(device))
        dev["memory_gib"] = round(torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30, 1)
    return {"benchmark": "isan bench gpu", "machine": machine(), "gpu": dev, "command": " ".join(["isan"] + sys.argv[1:]),
            "model": {"source": str(src), "params_sha256": cpu.params_sha256, "d": d, "V": V},
            "sizes": {**sz, "long_chars": len(ids_all)}, "repeats": repeats, "cpu_threads": cpu.threads,
            "rows": rows, "facts": facts}


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
    for k in ("docs_float32_max_rel_vs_float64", "docs_float64_max_rel_vs_reference", "docs_float32_max_rel_vs_cpu",
              "long_text_float32_rel_vs_float64"):
        if k in f:
            lines.append(f"| {k.replace('_', ' ')} | {f[k]:.1e} |")
    for dt in ("float32", "float64"):
        lt = f.get(f"long_text_{dt}")
        if lt:
            sc = lt["scoring"]
            lines.append(f"| long text {dt}: chunks, extra work, total vs the CPU's (relative) | {sc.get('chunks')}, "
                         f"{sc.get('extra_fraction', 0):.1%}, {lt['bits_rel_vs_cpu']:.1e} |")
    return "\n".join(lines)
