"""Summarise the stable-ISAN probes (issue 20): a markdown table and tradeoff.png.

Reads each probe's train_log.jsonl under results/stable/<probe>/ and, where the run directory still
exists under /root/isan-runs/probes/<probe> (or the path given by --runs), scores its best weights on
the text8-10M test split and measures max_x ||W_x||_2 and the spectral radius of the weights.

Usage (from the repository root): python results/stable/summarize.py [--runs DIR] [--final DIR ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TEXT8 = HERE.parents[1].parent / "shared" / "data" / "text8_head" / "text8_head.txt"


def read_log(path: Path) -> dict:
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    start = next(e for e in events if e["event"] == "start")
    cfg = start["config"]
    steps = [e for e in events if e["event"] == "step"]
    valid = [e for e in events if e["event"] == "valid"]
    done = [e for e in events if e["event"] == "done"]
    train = float(np.mean([e["train_bpc"] for e in steps[-5:]])) if steps else float("nan")
    chars = done[-1]["chars_seen"] if done else (steps[-1]["chars_seen"] if steps else 0)
    best = min((e["valid_bpc"] for e in valid), default=float("nan"))
    return {"cfg": cfg, "rho_opt": cfg.get("stable_rho"), "basis": cfg.get("stable_basis", False),
            "steps": steps[-1]["step"] if steps else 0, "chars": chars,
            "train_bpc": train, "valid_bpc": best, "last_valid": valid[-1]["valid_bpc"] if valid else float("nan"),
            "done": bool(done), "curve": [(e["chars_seen"], e["valid_bpc"]) for e in valid]}


def measure(run_dir: Path) -> dict:
    """Test bpc of the best weights, their max spectral norm, spectral radius and certificate rho."""
    from safetensors.numpy import load_file

    from isan.engine import Engine
    from isan.data import read_text8_split
    from isan.export import export_checkpoint
    from isan.export.checkpoint import certificate

    t = load_file(str(run_dir / "best.safetensors"))
    W = t["W"].astype(np.float64)
    out = {"sigma_max": float(np.linalg.svd(W, compute_uv=False)[:, 0].max()),
           "radius": float(np.abs(np.linalg.eigvals(W)).max())}
    if "P" in t:
        out["cert_rho"] = certificate(t["W"], t["b"], t["h0"], t["P"])["rho"]
    with tempfile.TemporaryDirectory() as tmp:
        eng = Engine.load(export_checkpoint(run_dir, Path(tmp) / "b", include_log=False))
        out["test_bpc"] = eng.score(read_text8_split(TEXT8, "test")).bpc
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="/root/isan-runs/probes")
    ap.add_argument("--final", nargs="*", default=[], help="final run directories to add to the plot")
    ap.add_argument("--no-measure", action="store_true")
    args = ap.parse_args()
    rows = []
    for log in sorted(HERE.glob("*/train_log.jsonl")):
        name = log.parent.name
        r = {"name": name, **read_log(log)}
        run = Path(args.runs) / name
        if not args.no_measure and (run / "best.safetensors").exists():
            r.update(measure(run))
        rows.append(r)
    for f in args.final:
        f = Path(f)
        r = {"name": f.name, **read_log(f / "train_log.jsonl")}
        if not args.no_measure and (f / "best.safetensors").exists():
            r.update(measure(f))
        rows.append(r)
    (HERE / "probes.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    print("| probe | rho option | chars | valid bpc (best) | valid bpc (last) | test bpc (best weights) | "
          "train bpc (last 100 steps) | valid (last) - train | max_x ||W_x||_2 | max spectral radius |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rho = "free" if not r["rho_opt"] else f"{r['rho_opt']}" + (" + P" if r["basis"] else "")
        f = lambda k, n=4: f"{r[k]:.{n}f}" if k in r and r[k] == r[k] else "-"  # noqa: E731
        print(f"| {r['name']} | {rho} | {r['chars'] / 1e6:.1f}M | {f('valid_bpc')} | {f('last_valid')} | "
              f"{f('test_bpc')} | {f('train_bpc')} | {r['last_valid'] - r['train_bpc']:+.3f} | {f('sigma_max', 3)} | "
              f"{f('radius', 3)} |")
    plot(rows)


def plot(rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    ax = axes[0]
    sel = [r for r in rows if r["name"].startswith("A_") and not r["name"].endswith("_pi25")]
    for r in sel:
        x = r["rho_opt"] or 1.0
        c = "tab:red" if not r["rho_opt"] else ("tab:purple" if r["basis"] else "tab:blue")
        ax.scatter([x], [r["valid_bpc"]], color=c, marker="o", zorder=3)
        if "test_bpc" in r:
            ax.scatter([x], [r["test_bpc"]], color=c, marker="x", zorder=3)
        ax.annotate(r["name"][2:] + (" (unconstrained)" if not r["rho_opt"] else ""), (x, r["valid_bpc"]),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    free = [r for r in sel if not r["rho_opt"]]
    if free:
        ax.axhline(free[0]["valid_bpc"], color="tab:red", ls="--", lw=0.8, label="unconstrained, valid")
        if "test_bpc" in free[0]:
            ax.axhline(free[0]["test_bpc"], color="tab:red", ls=":", lw=0.8, label="unconstrained, test")
    ax.set_xlabel("rho (the certified bound on max_x ||P W_x P^-1||_2; 1.0 = unconstrained)")
    ax.set_ylabel("bits per character (o valid, x test)")
    ax.set_title("text8-10M, d = 216, 6M training characters (blue: P = I, purple: learned P)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axes[1]
    for r in rows:
        if r["name"].startswith("C_") or r["name"].startswith("B_") or not r["name"][:2] in ("A_", "B_", "C_"):
            xs = [c / 1e6 for c, _ in r["curve"]]
            ax.plot(xs, [v for _, v in r["curve"]], marker=".", label=r["name"],
                    ls="-" if r["name"].startswith("C_") else "--")
    ax.set_xlabel("training characters seen (millions)")
    ax.set_ylabel("valid bpc (text8-10M valid)")
    ax.set_title("rho = 0.98 + regularisers (C: 500k train chars, 12 epochs; B: 2M, 3 epochs)",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "tradeoff.png", dpi=120)


if __name__ == "__main__":
    main()
