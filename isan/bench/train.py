"""Training throughput (``isan bench train``): characters per second of one optimizer step
(forward, backward, gradient clipping and Adam) for every Table 1 architecture at each budget,
on real text8 chunks, with the protocol's shapes (B streams of T characters, the state carried).

Every figure is the median over ``repeats`` timings of ``steps`` steps each, after one warm-up
step; the ratio is against the ISAN of the same budget, measured in the same process. The
baselines are timed twice: through torch's fused kernels (``forward``, what training uses) and
through the step loop of ``forward_reference``, which shows what the fused path buys. The ISAN
runs its scan (train/scan.py) and the linear controls their plain ``forward``.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

from isan.train.models import build_model
from isan.train.studies.table1 import BUDGETS, MAIN_ROWS

#: Table 1's architectures, the ISAN (the ratios' baseline) first
TABLE1_MODELS = ("isan",) + tuple(kind for kind, _ in MAIN_ROWS if kind != "isan")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(model, ids: np.ndarray, B: int, T: int, steps: int, repeats: int, reference: bool,
                device: torch.device = torch.device("cpu")) -> list[float]:
    """Seconds of ``steps`` optimizer steps, ``repeats`` times, on consecutive chunks of ``ids``
    (on ``device``: the clock stops when the device has finished)."""
    per_stream = len(ids) // B
    streams = torch.as_tensor(ids[:per_stream * B].reshape(B, per_stream).T.copy()).to(device)  # (N, B)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fwd = model.forward_reference if reference else model.forward
    state = model.initial_state(B)
    pos = 0

    def step():
        nonlocal state, pos
        if pos + T + 1 > streams.shape[0]:
            pos, state = 0, model.initial_state(B)
        x = streams[pos:pos + T]
        logits, new = fwd(x, state)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state = tuple(s.detach() for s in new) if isinstance(new, tuple) else new.detach()
        pos += T

    step()  # warm-up (allocations, first-call dispatch)
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def bench_train(ids: np.ndarray, budgets=BUDGETS, models=TABLE1_MODELS, batch: int = 32, bptt: int = 64, steps: int = 5,
                repeats: int = 3, reference: bool = True, threads: int | None = None, device: str = "cpu",
                log=print) -> dict:
    """Training throughput per (model, budget); see the module docstring.

    Args:
        ids: int64 text ids (the text8 train split, say), at least batch * (bptt + 1) long.
        budgets: (label, parameters) pairs; models: names for ``isan train``.
        reference: also time the baselines' step loop (``forward_reference``).
        threads: torch CPU threads (None: torch's default).
        device: a torch device (``"cuda"``: the ISAN trains with its dense scan there,
            :class:`isan.train.scan.ISANScanDense`).
    Returns:
        {"machine", "command", "torch", "threads", "batch", "bptt", "steps", "repeats", "rows": [{"model",
        "path", "budget", "params", "d", "chars_per_s", "times_s", "ratio_vs_isan"}]}.
    """
    from isan.bench.common import machine

    if threads:
        torch.set_num_threads(threads)
    from isan.engine.kernels.backends import resolve_device

    dev = torch.device(resolve_device(device))  # a clear error for a device that is not there
    rows = []
    for label, budget in budgets:
        for kind in models:
            torch.manual_seed(0)
            model = build_model(kind, 27, 27, params=budget, seed=0).to(dev)
            fused = hasattr(model, "forward_reference")  # the recurrent baselines; isan has its scan
            paths = (["fused", "step loop"] if reference else ["fused"]) if fused else ["scan" if kind == "isan" else "forward"]
            for path in paths:
                times = _time_steps(model, ids, batch, bptt, steps, repeats, reference=path == "step loop", device=dev)
                rate = steps * batch * bptt / statistics.median(times)
                rows.append({"model": kind, "path": path, "budget": label,
                             "params": sum(p.numel() for p in model.parameters()), "d": model.d,
                             "chars_per_s": rate, "times_s": times})
                log(f"{label:>7} {kind:5} {path:9} {rate:>10,.0f} chars/s")
    isan = {r["budget"]: r["chars_per_s"] for r in rows if r["model"] == "isan"}
    for r in rows:  # None where the ISAN was not timed at that budget
        r["ratio_vs_isan"] = r["chars_per_s"] / isan[r["budget"]] if r["budget"] in isan else None
    return {"machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]) if sys.argv else "isan bench train",
            "torch": torch.__version__, "threads": torch.get_num_threads(), "device": str(dev),
            **({"device_name": torch.cuda.get_device_name(dev)} if dev.type == "cuda" else {}), "batch": batch, "bptt": bptt,
            "steps": steps, "repeats": repeats, "rows": rows}


def markdown_train(result: dict) -> str:
    m = result["machine"]
    on = result.get("device_name") or f"{result['threads']} threads"
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {result['torch']} on {on}",
             f"Command: `{result['command']}`  (B={result['batch']}, T={result['bptt']}; median of "
             f"{result['repeats']} timings of {result['steps']} steps)", "",
             "| budget | model | path | params | d | train chars/s | vs ISAN |", "|---|---|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        ratio = f"{r['ratio_vs_isan']:.2f}x" if r["ratio_vs_isan"] is not None else "n/a"
        lines.append(f"| {r['budget']} | {r['model']} | {r['path']} | {r['params']:,} | {r['d']} | "
                     f"{r['chars_per_s']:,.0f} | {ratio} |")
    return "\n".join(lines)
