"""The size-speed frontier (``isan bench frontier``, issue 37): certified ISANs of several widths,
each with its test bpc and its scoring speed measured in one process, beside KenLM's point.

For each bundle (in the order given; the shipped default when none is):

* **test bpc**: the text8-10M test split (500,000 characters, from the model's ``h0``) scored by
  the engine, exactly (``Engine.score``, normalisation none);
* **chars/s**: ``Engine.score`` of ``long_chars`` unseen characters (text8 from offset 10,000,000,
  as ``isan bench engine``'s long-text row), chunk-parallel on all the threads this process may use,
  and on one thread; medians over ``repeats`` after one untimed run;
* the model's width, parameters and certificate (rho, state bound), from its bundle.

KenLM's point: its Python module querying our order-8 Kneser-Ney n-gram of the train split (as
``isan bench engine``'s peer row), one thread, on the same test split: its bpc and chars/s. Ratios
are against the first model, measured in the same process. Speeds are of this machine, noisy: read
them as ratios within a run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from isan.bench.common import machine, median_time

DEFAULT_LONG_CHARS = 2_500_000


def bench_frontier(models: list[str | Path] | None, data: str | Path, repeats: int = 3,
                   long_chars: int = DEFAULT_LONG_CHARS, kenlm: bool = True, log=print) -> dict:
    """Run the benchmark; returns a JSON-ready dict (see the module docstring).

    Raises:
        IsanError: a bundle that does not load (the message names it).
    """
    from isan.data import read_text8_split
    from isan.engine.core import Engine

    from isan.engine.paths import default_model_path
    paths = [Path(m) for m in models] if models else [default_model_path()]
    test = read_text8_split(data, "test")
    unseen = read_text8_split(data, "unseen")[:long_chars]
    rows = []
    for path in paths:
        eng = Engine.load(path, progress_bar=False)
        test_ids, long_ids = eng.encode(test), eng.encode(unseen)
        bpc = eng.score(test_ids, normalize="none").bpc
        eng.score(long_ids, normalize="none")  # untimed: first-call costs
        sec_all, times_all = median_time(lambda: eng.score(long_ids, normalize="none"), repeats)
        sec_one, times_one = median_time(lambda: eng.score(long_ids, normalize="none", threads=1), repeats)
        cert = eng.certificate() or {}
        row = {"model": str(path), "name": Path(path).name, "d": eng.d, "params": eng.params.n_params(),
               "test_bpc": float(bpc),
               "chars_per_s": len(long_ids) / sec_all, "chars_per_s_1_thread": len(long_ids) / sec_one,
               "threads": eng.threads, "times": times_all, "times_1_thread": times_one,
               "rho": cert.get("rho"), "state_bound": cert.get("state_bound"), "params_sha256": eng.params_sha256}
        rows.append(row)
        log(f"  {row['name']}: d {row['d']}, test {bpc:.4f} bpc, {row['chars_per_s']:,.0f} chars/s "
            f"({row['chars_per_s_1_thread']:,.0f} on one thread)")
    for r in rows:
        r["speed_vs_first"] = r["chars_per_s"] / rows[0]["chars_per_s"]
    peer = None
    if kenlm:
        from isan.alphabet import Alphabet
        from isan.bench.peers import PeerUnavailable, bench_kenlm

        try:
            k = bench_kenlm(data, Alphabet.text8().encode(test), repeats, log)[0]
            peer = {"name": "KenLM, order-8 n-gram of the train split, 1 thread", "test_bpc": k["bpc"],
                    "chars_per_s": k["chars_per_s"]}
        except PeerUnavailable as e:
            peer = {"name": "KenLM", "not_run": str(e)}
            log(f"  KenLM: not run: {e}")
    return {"benchmark": "isan bench frontier", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
            "repeats": repeats, "long_chars": len(unseen), "test_chars": len(test), "rows": rows, "kenlm": peer}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}",
             f"Command: `{result['command']}`  (median of {result['repeats']} runs; speed on "
             f"{result['long_chars']:,} unseen characters, test bpc on the {result['test_chars']:,}-character test split)",
             "", "| model | d | parameters | test bpc | chars/s | vs first | chars/s, 1 thread | rho | state bound |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        rho = f"{r['rho']:.4f}" if r.get("rho") is not None else "none"
        sb = f"{r['state_bound']:,.0f}" if r.get("state_bound") is not None else "-"
        lines.append(f"| {r['name']} | {r['d']} | {r['params']:,} | {r['test_bpc']:.4f} | {r['chars_per_s']:,.0f} | "
                     f"{r['speed_vs_first']:.2f}x | {r['chars_per_s_1_thread']:,.0f} | {rho} | {sb} |")
    k = result.get("kenlm")
    if k and "not_run" not in k:
        lines.append(f"| {k['name']} | - | - | {k['test_bpc']:.4f} | {k['chars_per_s']:,.0f} | "
                     f"{k['chars_per_s'] / result['rows'][0]['chars_per_s']:.2f}x | {k['chars_per_s']:,.0f} | - | - |")
    elif k:
        lines.append(f"\nKenLM: not run ({k['not_run']})")
    return "\n".join(lines)


def plot(result: dict, out: str | Path) -> None:
    """bpc against chars/s, each model on all threads and on one, and KenLM's point (matplotlib, the
    plot extra)."""
    try:
        import matplotlib
    except ImportError:
        from isan.errors import IsanError, install_hint

        raise IsanError(f"the frontier's plot needs matplotlib: {install_hint('plot')}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from isan.atomic import atomic_path

    fig, ax = plt.subplots(figsize=(6.5, 4))
    rs = sorted(result["rows"], key=lambda r: r["chars_per_s"])
    bpc = [r["test_bpc"] for r in rs]
    ax.plot([r["chars_per_s"] for r in rs], bpc, "o-", label=f"certified ISAN, {rs[0]['threads']} threads")
    ax.plot([r["chars_per_s_1_thread"] for r in rs], bpc, "o--", color="C0", alpha=0.5, label="certified ISAN, 1 thread")
    for r in rs:
        ax.annotate(f"d = {r['d']}", (r["chars_per_s"], r["test_bpc"]), textcoords="offset points", xytext=(-8, 8),
                    ha="right")
    k = result.get("kenlm")
    if k and "not_run" not in k:
        ax.plot([k["chars_per_s"]], [k["test_bpc"]], "s", color="C1", label="KenLM order 8, 1 thread")
    ax.margins(x=0.1, y=0.15)
    ax.set_xscale("log")
    ax.set_xlabel("characters a second (log scale)")
    ax.set_ylabel("test bpc (text8-10M)")
    ax.set_title("Size-speed frontier")
    ax.legend()
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=Path(out).suffix.lstrip(".") or "png", dpi=120)
    plt.close(fig)
