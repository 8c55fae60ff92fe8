"""The structured ISANs' probe: its table from its run directories (results/structured/probe.sh).

    python results/structured/table.py [RUNS]        (default runs/structured)

Reads RUNS/{dense216,dplr384r54,dplr512r37}/config.json and train_log.jsonl and prints markdown: per model its
d, rank r, multiply-adds a character (train/structured.py dense_cost / dplr_cost), parameters, the valid bpc
at the last characters every run reached (and the best up to there), training chars/s, and the decision by
the rule: a structured model goes on only if its valid bpc is at least 0.015 below the dense one's
at equal characters and equal cost (decided on the best valid bpc up to the last common evaluation; the
last evaluation's difference is shown beside it). A second table lists every common evaluation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from isan.train.structured import dense_cost, dplr_cost

NAMES = ("dense216", "dplr384r54", "dplr512r37")
MARGIN = 0.015  # the decision rule: bits a character the structured model must gain


def read_run(path: Path) -> dict | None:
    if not (path / "train_log.jsonl").is_file():
        return None
    events = [json.loads(line) for line in (path / "train_log.jsonl").read_text().splitlines() if line.strip()]
    if (path / "config.json").is_file():
        cfg = json.loads((path / "config.json").read_text())
    else:  # a log brought back alone (the GPU check copies the logs out): its start event has the model
        start = next((e for e in events if e["event"] == "start"), None)
        if start is None:
            return None
        cfg = {"model": start["model"], "n_params": start.get("n_params")}
    model = cfg["model"]
    d, r, V = int(model["d"]), model.get("rank"), int(model.get("V", 27))
    valid = {e["chars_seen"]: e["valid_bpc"] for e in events if e["event"] == "valid"}
    steps = [e for e in events if e["event"] == "step"]
    done = [e for e in events if e["event"] == "done"]
    cps = done[-1].get("train_chars_per_s") if done else None
    if cps is None and steps:
        cps = round(sum(e["chars_per_s"] for e in steps) / len(steps))
    return {"d": d, "r": r, "cost": dense_cost(d, V) if r is None else dplr_cost(d, int(r), V),
            "params": cfg.get("n_params"), "valid": valid, "chars_per_s": cps, "done": bool(done),
            "chars_seen": max([e.get("chars_seen", 0) for e in events] or [0])}


def main(runs: str = "runs/structured") -> int:
    root = Path(runs)
    rows = {n: read_run(root / n) for n in NAMES}
    rows = {n: r for n, r in rows.items() if r is not None}
    if "dense216" not in rows:
        print(f"no dense216 run under {root} (run results/structured/probe.sh first)", file=sys.stderr)
        return 1
    common = sorted(set.intersection(*(set(r["valid"]) for r in rows.values())))
    if not common:
        print("the runs have no evaluation at the same characters yet", file=sys.stderr)
        return 1
    at = common[-1]
    dense = rows["dense216"]
    dense_last = dense["valid"][at]
    dense_best = min(v for c, v in dense["valid"].items() if c <= at)
    print(f"Valid bpc (text8-10M valid) at {at:,} training characters, the last evaluation every run reached.\n")
    print("| model | d | r | multiply-adds / char | params | valid bpc (last) | valid bpc (best) "
          "| vs dense (best) | vs dense (last) | train chars/s | decision |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n, r in rows.items():
        last = r["valid"][at]
        best = min(v for c, v in r["valid"].items() if c <= at)
        if n == "dense216":
            gain_b = gain_l = decision = "-"
        else:
            gb, gl = dense_best - best, dense_last - last
            gain_b, gain_l = f"{-gb:+.4f}", f"{-gl:+.4f}"
            decision = "goes on (>= 0.015 better)" if gb >= MARGIN else "no (< 0.015 better)"
        print(f"| {n}{'' if r['done'] else ' (running)'} | {r['d']} | {r['r'] or '-'} | {r['cost']:,} | "
              f"{r['params']:,} | {last:.4f} | {best:.4f} | {gain_b} | {gain_l} | "
              f"{'-' if r['chars_per_s'] is None else format(r['chars_per_s'], ',')} | {decision} |")
    print("\nEvery evaluation at equal characters (valid bpc; with --ema the better of the live and averaged "
          "weights):\n")
    print("| characters seen | " + " | ".join(rows) + " |")
    print("|---:|" + "---:|" * len(rows))
    for c in common:
        print(f"| {c:,} | " + " | ".join(f"{r['valid'][c]:.4f}" for r in rows.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
