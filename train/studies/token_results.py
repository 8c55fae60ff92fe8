"""Summarise the token-alphabet runs (train/studies/token_runs.sh) into results/tokens/TABLE.md.

Reads, for each run folder under the results directory: ``command.txt`` (the training command),
``train_log.jsonl`` and ``config.json`` (copied with their file times from the run when it ended).
Every number in the table comes from these files; the table goes to TABLE.md, the rows to summary.json.

Usage: ``python -m isan.train.studies.token_results results/tokens`` (``bash train/studies/token_runs.sh summary``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RUNS = ("bytes-isan", "bytes-lstm", "pairs-isan", "pairs-lstm")
#: characters per token, for the bits-per-character column (UTF-8 bytes of ASCII text: one)
CHARS_PER_TOKEN = {"byte": 1, "pair": 2, "char": 1}


def summarise(run_dir: Path) -> dict | None:
    """One run's row, or None if the run has not written its log yet."""
    log_path = run_dir / "train_log.jsonl"
    if not log_path.exists():
        return None
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    cfg = json.loads((run_dir / "config.json").read_text())
    start = next(e for e in events if e["event"] == "start")
    done = [e for e in events if e["event"] == "done"]
    valid = [e for e in events if e["event"] == "valid"]
    last = done[-1] if done else None
    # wall time: the log's own times where it has them, else the copied files' times (cp -p):
    # config.json is written when the run starts, the log's last line when it ends
    if "time" in events[0] and "time" in events[-1]:
        wall = events[-1]["time"] - events[0]["time"]
    else:
        wall = log_path.stat().st_mtime - (run_dir / "config.json").stat().st_mtime
    unit = start.get("unit", "char")
    best = min((e["valid_bpc"] for e in valid), default=None)
    return {
        "run": run_dir.name, "model": cfg["model"]["kind"], "n_params": cfg["n_params"], "d": cfg["model"]["d"],
        "K": cfg["model"]["K"], "V": cfg["model"]["V"], "unit": unit, "corpus": cfg["corpus"],
        "best_valid_bits_per_token": best,
        "best_valid_bits_per_char": None if best is None else best / CHARS_PER_TOKEN.get(unit, 1),
        "tokens_seen": (last or (valid[-1] if valid else {})).get("chars_seen"),
        "stop_reason": last["stop_reason"] if last else "running",
        "train_tokens_per_s": last.get("train_chars_per_s") if last else None,
        "wall_s": round(wall),
        "resumes": sum(e["event"] == "resume" for e in events),
        "lr": start["config"]["lr"], "batch_size": start["config"]["batch_size"], "bptt": start["config"]["bptt"],
        "command": (run_dir / "command.txt").read_text().strip() if (run_dir / "command.txt").exists() else "",
    }


def markdown(rows: list[dict]) -> str:
    head = ("| run | model | params | d | K | V | unit | best valid bits/token | bits/char | tokens seen | "
            "stop | tokens/s (training) | wall (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    body = "".join(
        f"| {r['run']} | {r['model']} | {r['n_params']:,} | {r['d']} | {r['K']} | {r['V']} | {r['unit']} | "
        f"{fmt(r['best_valid_bits_per_token'], '.4f')} | {fmt(r['best_valid_bits_per_char'], '.4f')} | "
        f"{fmt(r['tokens_seen'], ',')} | {r['stop_reason']} | {fmt(r['train_tokens_per_s'], ',')} | "
        f"{fmt(r['wall_s'], ',')} |\n" for r in rows)
    cmds = "".join(f"- {r['run']}: `{r['command']}`\n" for r in rows)
    return head + body + "\nCommands (each resumes its run when started again):\n\n" + cmds


def main(argv: list[str] | None = None) -> None:
    root = Path((argv or sys.argv[1:] or ["results/tokens"])[0])
    rows = [r for r in (summarise(root / name) for name in RUNS if (root / name).is_dir()) if r is not None]
    (root / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = markdown(rows)
    (root / "TABLE.md").write_text(table)
    sys.stdout.write(table)


if __name__ == "__main__":
    main()
