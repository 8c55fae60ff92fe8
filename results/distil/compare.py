"""Valid bpc of training logs at equal epochs, side by side (issue 37's distillation run against the
default model's run and its teacher's). From the repository root:

    python results/distil/compare.py [RUN_LOG ...]

Each argument is a train_log.jsonl (a run directory's, or a bundle's); without arguments the three of
results/distil/README.md. Prints a Markdown table: the averaged (EMA) or live weights' valid bpc on the
log's 100 streams, whichever the run evaluated as better, at every epoch the first log reached.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT = ["isan/models/text8-d216-stable/train_log.jsonl", "isan/models/text8-d216-distil/train_log.jsonl",
           "isan/models/text8-d320-stable/train_log.jsonl"]


def valid_by_epoch(path: str | Path) -> dict[float, float]:
    """{epoch rounded to 0.5: valid bpc} of one log's validations."""
    out = {}
    for line in Path(path).read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "valid":
            out[round(e["epoch"] * 2) / 2] = e["valid_bpc"]
    return out


def main(paths: list[str]) -> str:
    logs = [valid_by_epoch(p) for p in paths]
    epochs = sorted(set().union(*logs))
    rows = ["| epoch | " + " | ".join(paths) + " |", "|---:|" + "---:|" * len(paths)]
    for ep in epochs:
        rows.append(f"| {ep:g} | " + " | ".join(f"{v[ep]:.4f}" if ep in v else "-" for v in logs) + " |")
    rows.append("| best | " + " | ".join(f"{min(v.values()):.4f}" if v else "-" for v in logs) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(main(sys.argv[1:] or DEFAULT))
