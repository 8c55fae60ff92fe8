"""Valid bpc of training logs at equal epochs, side by side (issue 37's distillation run against the
default model's run and its teacher's). From the repository root:

    python results/distil/compare.py [--chars] [RUN_LOG ...]

Each argument is a train_log.jsonl (a run directory's, or a bundle's); without arguments the three of
results/distil/README.md. Prints a Markdown table: the averaged (EMA) or live weights' valid bpc on the
log's 100 streams, whichever the run evaluated as better, at every epoch any log reached. ``--chars``:
at equal characters seen instead (millions, to the nearest 4.5M, half an epoch of the 9M train split),
for runs whose epochs differ in length (a run with synthetic text).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT = ["isan/models/text8-d216-stable/train_log.jsonl", "isan/models/text8-d216-distil/train_log.jsonl",
           "isan/models/text8-d320-stable/train_log.jsonl"]


#: characters between the rows of --chars (half an epoch of text8-10M's train split)
CHARS_STEP = 4.5e6


def valid_by_epoch(path: str | Path, chars: bool = False) -> dict[float, float]:
    """{epoch rounded to 0.5 (or, ``chars``, millions of characters seen to the nearest 4.5): valid bpc}."""
    out = {}
    for line in Path(path).read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "valid":
            key = round(e["chars_seen"] / CHARS_STEP) * CHARS_STEP / 1e6 if chars else round(e["epoch"] * 2) / 2
            out[key] = e["valid_bpc"]
    return out


def main(paths: list[str], chars: bool = False) -> str:
    logs = [valid_by_epoch(p, chars) for p in paths]
    epochs = sorted(set().union(*logs))
    head = "M characters" if chars else "epoch"
    rows = [f"| {head} | " + " | ".join(paths) + " |", "|---:|" + "---:|" * len(paths)]
    for ep in epochs:
        rows.append(f"| {ep:g} | " + " | ".join(f"{v[ep]:.4f}" if ep in v else "-" for v in logs) + " |")
    rows.append("| best | " + " | ".join(f"{min(v.values()):.4f}" if v else "-" for v in logs) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", action="store_true", help="rows at equal characters seen, not epochs")
    parser.add_argument("logs", nargs="*", help="train_log.jsonl files (default: the three of the README)")
    args = parser.parse_args()
    print(main(args.logs or DEFAULT, args.chars))
