"""Regenerate the Table 1 reproduction (Foerster et al. 2017) from committed result files only.

Usage (from the repository root)::

    python -m isan.train.studies.table1 [--results results/table1] [--out README-table.md] [--plot docs/table1.png]
                                [--readme README.md]
    python -m isan.train.studies.table1 --tuning results/table1/tuning   # pick each model's learning rate

Results layout (one directory per trained cell, written by ``train/studies/table1.sh`` or by hand with
the same files; nothing else is read, and no number is computed or invented here)::

    results/table1/<model>-<budget>/     e.g. isan-8e4, linear_nlro-3.2e5, lstm-1.28e6
        score.json       `isan score --model BUNDLE --json --text8-split test DATA`: {"chars", "bits", "bpc"}
        valid.json       the same on --text8-split valid (optional)
        train_log.jsonl  the run's log (its "start" event gives n_params and the model's d,
                         its last "done" event train_chars_per_s, chars_seen, stop_reason)
        config.json      the run's config.json (optional; n_params)
        command.txt      the exact commands, one per line
    results/table1/tuning/               the tuning step (``train/studies/tune.sh``): MODEL-lrRATE.jsonl logs;
                                         ``--tuning`` writes lr.json (the chosen rates) and TUNING.md
    results/table1/ngram/                the n-gram row (no parameter budget)
        score.json, command.txt, train_log.jsonl (from `isan train ngram`: one "order" event per
        order tried and a "done" event with the chosen order and train_chars_per_s)

``<model>`` is a kind of ``isan train`` (rnn, irnn, gru, lstm, isan, linear, linear_nlro,
isan_nobias) and ``<budget>`` one of 8e4, 3.2e5, 1.28e6 (any spelling of the same number).
A cell without ``score.json`` shows "—". Each number links the log and the commands behind it.

This module needs no torch; the plot needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from isan.atomic import write_bytes_atomic
from isan.errors import IsanError

#: the paper's parameter budgets (column labels, values)
BUDGETS = (("8e4", 8e4), ("3.2e5", 3.2e5), ("1.28e6", 1.28e6))
#: Table 1's rows, in the paper's order
MAIN_ROWS = (("rnn", "RNN"), ("irnn", "IRNN"), ("gru", "GRU"), ("lstm", "LSTM"), ("isan", "ISAN"))
#: the controls the paper quotes in its text (the linear RNNs: ICML Sec 3.1; the ISAN without biases: only the
#: ICLR 2017 workshop version, Sec 6.1) and the n-gram reference
VARIANT_ROWS = (("linear", "linear RNN, linear readout"), ("linear_nlro", "linear RNN, tanh-layer readout"),
                ("isan_nobias", "ISAN without biases (h_t = W[x_t] h_{t-1})"),
                ("ngram", "character n-gram, interpolated modified Kneser-Ney"))
#: the paper's Table 1, test bpc per budget (as quoted in issue #5). Its data: text8 split "90%, 5%, and 5% for
#: train, validation, and test ... in line with (Mikolov et al., 2012)" (ICML Sec 2.2) after calling text8 "10
#: million characters" (Sec 1): 9M training characters as ours, or 90M (Mikolov et al.'s split of the full
#: text8's 100M) if "10 million" is a slip; the paper does not settle it
PAPER = {"rnn": (1.88, 1.69, 1.59), "irnn": (1.89, 1.71, 1.58), "gru": (1.83, 1.66, 1.59),
         "lstm": (1.85, 1.68, 1.59), "isan": (1.92, 1.71, 1.58)}
#: numbers the paper gives in its text for the controls (no parameter count stated)
PAPER_TEXT = {"linear": "~3.1 (Sec 3.1)", "linear_nlro": "~2.15 (Sec 3.1)", "isan_nobias": "~4.1 (ICLR workshop Sec 6.1)",
              "ngram": "n/a (not in the paper)"}
MISSING = "—"
LABELS = dict(MAIN_ROWS + VARIANT_ROWS)


@dataclass(frozen=True)
class Result:
    """One result directory, as read from its files (None where a file or field is absent)."""

    model: str
    budget: str | None  # a BUDGETS label; None for the n-gram
    path: Path
    test_bpc: float
    test_chars: int | None
    valid_bpc: float | None
    n_params: int | None
    d: int | None  # hidden size, or the n-gram's order
    chars_seen: int | None
    train_chars_per_s: float | None
    stop_reason: str | None
    has_log: bool
    has_command: bool
    valid_from: str | None = None  # "valid.json" (`isan score` of the bundle) or "log" (the training log's)
    valid_bpc_log: float | None = None  # the training log's best periodic evaluation (streams from the initial state)


def _budget_label(text: str) -> str | None:
    try:
        v = float(text)
    except ValueError:
        return None
    for label, value in BUDGETS:
        if math.isclose(v, value, rel_tol=1e-9):
            return label
    return None


def parse_result_name(name: str) -> tuple[str, str | None] | None:
    """(model, budget label) of a result directory name, or None if it names no Table 1 cell.

    ``isan-8e4`` -> ("isan", "8e4"); ``linear_nlro-320000`` -> ("linear_nlro", "3.2e5");
    ``ngram`` (or ``ngram-...``) -> ("ngram", None).
    """
    if name == "ngram" or name.startswith("ngram-"):
        return "ngram", None
    model, sep, budget = name.rpartition("-")
    if not sep or model not in LABELS or model == "ngram":
        return None
    label = _budget_label(budget)
    return (model, label) if label else None


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IsanError(f"{path} is not readable JSON ({e}); re-run the commands in command.txt beside it") from None
    if not isinstance(obj, dict):
        raise IsanError(f"{path} must hold a JSON object")
    return obj


def _read_log(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    events = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise IsanError(f"{path} line {i} is not JSON ({e})") from None
    return events


def read_result(path: Path, model: str, budget: str | None) -> Result | None:
    """The Result of one directory, or None without ``score.json``.

    Raises:
        IsanError: a result file that is not valid JSON or lacks a finite bpc.
    """
    score = path / "score.json"
    if not score.is_file():
        return None
    s = _read_json(score)
    bpc = s.get("bpc")
    if not isinstance(bpc, (int, float)) or not math.isfinite(bpc):
        raise IsanError(f"{score} lacks a finite 'bpc'; it must be the output of `isan score --json`")
    valid = _read_json(path / "valid.json").get("bpc") if (path / "valid.json").is_file() else None
    events = _read_log(path / "train_log.jsonl")
    start = next((e for e in events if e.get("event") == "start"), {})
    done = next((e for e in reversed(events) if e.get("event") == "done"), {})
    cfg = _read_json(path / "config.json") if (path / "config.json").is_file() else {}
    n_params = cfg.get("n_params", start.get("n_params"))
    d = (cfg.get("model") or start.get("model") or {}).get("d")
    logged = done.get("valid_bpc") if model == "ngram" else done.get("best_valid_bpc")
    if model == "ngram":
        d = done.get("order")
        n_params = done.get("n_ngrams")
    source = "valid.json" if valid is not None else "log" if logged is not None else None
    return Result(model, budget, path, float(bpc), s.get("chars"), valid if valid is not None else logged, n_params, d,
                  done.get("chars_seen", done.get("train_chars")), done.get("train_chars_per_s"),
                  done.get("stop_reason"), (path / "train_log.jsonl").is_file(), (path / "command.txt").is_file(),
                  source, logged)


def collect_results(results_dir: str | Path) -> dict[tuple[str, str | None], Result]:
    """Every Table 1 cell found under ``results_dir``, by (model, budget label).

    Directories whose names name no cell, and cells without ``score.json``, are left out.
    Raises:
        IsanError: ``results_dir`` is not a directory, or a result file is malformed.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise IsanError(f"{root} is not a directory of Table 1 results (see `python -m isan.train.studies.table1 --help`)")
    out = {}
    for p in sorted(root.iterdir()):
        key = parse_result_name(p.name) if p.is_dir() else None
        if key is None:
            continue
        r = read_result(p, *key)
        if r is not None:
            out[key] = r
    return out


# ---- the tuning step -----------------------------------------------------------------------------
def parse_tuning_name(name: str) -> tuple[str, str | None, str] | None:
    """(model, init scale or None, rate) of a tuning log name, as written; None for other names.

    ``gru-lr1e-3.jsonl`` -> ("gru", None, "1e-3"); ``irnn@0.1-lr2e-3.jsonl`` -> ("irnn", "0.1", "2e-3").
    """
    if not name.endswith(".jsonl"):
        return None
    spec, sep, rate = name[:-len(".jsonl")].rpartition("-lr")
    model, _, scale = spec.partition("@")
    try:
        float(rate), float(scale or 0)
    except ValueError:
        return None
    return (model, scale or None, rate) if sep and model else None


def collect_tuning(tuning_dir: str | Path) -> dict[tuple[str, str | None], dict[str, float | None]]:
    """{(model, init scale or None): {rate as written: best valid bpc, or None if the run logged no
    finite validation (it diverged)}}.

    Raises:
        IsanError: ``tuning_dir`` is not a directory or holds no tuning log, or a log is not JSON lines.
    """
    root = Path(tuning_dir)
    if not root.is_dir():
        raise IsanError(f"{root} is not a directory of tuning logs (run `bash train/studies/tune.sh` first)")
    out: dict[tuple[str, str | None], dict[str, float | None]] = {}
    for p in sorted(root.glob("*.jsonl")):
        key = parse_tuning_name(p.name)
        if key is None:
            continue
        valid = [e.get("valid_bpc") for e in _read_log(p) if e.get("event") == "valid"]
        valid = [v for v in valid if isinstance(v, (int, float)) and math.isfinite(v)]
        out.setdefault(key[:2], {})[key[2]] = min(valid) if valid else None
    if not out:
        raise IsanError(f"{root} holds no MODEL-lrRATE.jsonl tuning log (run `bash train/studies/tune.sh` first)")
    return out


def choose_settings(tuning: dict[tuple[str, str | None], dict[str, float | None]]) -> dict[str, dict]:
    """Per model, the setting with the lowest valid bpc: {"lr": rate} plus {"init_scale": s} when
    the winner ran with one. Ties go to the larger rate; models whose runs all diverged are left out."""
    best: dict[str, tuple] = {}
    for (model, scale), runs in tuning.items():
        for rate, v in runs.items():
            if v is None:
                continue
            cand = (v, -float(rate), scale or "", rate)
            if model not in best or cand < best[model]:
                best[model] = cand
    return {m: {"lr": float(c[3]), **({"init_scale": float(c[2])} if c[2] else {})} for m, c in best.items()}


def _setting_label(model: str, scale: str | None) -> str:
    return LABELS.get(model, model) + (f" ({scale}·I init)" if scale else "")


def render_tuning(tuning: dict[tuple[str, str | None], dict[str, float | None]], chosen: dict[str, dict]) -> str:
    """Markdown: best valid bpc of every (model, init scale, rate) run, the chosen one in bold."""
    rates = sorted({r for runs in tuning.values() for r in runs}, key=lambda r: -float(r))
    order = [k for k in LABELS]
    lines = ["## Table 1 tuning step: valid bpc after 4.6M characters at the 8e4 budget", "",
             "Written by `python -m isan.train.studies.table1 --tuning results/table1/tuning` from the logs of "
             "`bash train/studies/tune.sh` (one run per cell: B=32, T=64, Adam, evaluation at half an epoch). "
             "Bold: the setting `train/studies/table1.sh` uses for that model at 8e4; at larger budgets it divides the "
             "rate by the growth of the hidden size d.", "",
             "| model | " + " | ".join(f"lr {r}" for r in rates) + " |", "|---|" + "---:|" * len(rates)]
    for model, scale in sorted(tuning, key=lambda k: ((order + [k[0]]).index(k[0]), -float(k[1] or 1e9))):
        runs, pick = tuning[(model, scale)], chosen.get(model, {})
        cells = []
        for r in rates:
            if r not in runs:
                cells.append(MISSING)
                continue
            v = runs[r]
            text = "diverged" if v is None else f"{v:.3f}"
            won = (v is not None and float(r) == pick.get("lr")
                   and (float(scale) if scale else None) == pick.get("init_scale"))
            cells.append(f"**{text}**" if won else text)
        lines.append(f"| {_setting_label(model, scale)} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""])


def write_tuning(tuning_dir: str | Path) -> dict[str, dict]:
    """Write lr.json (the chosen settings, read by train/studies/table1.sh) and TUNING.md into
    ``tuning_dir`` atomically, and return the chosen settings."""
    root = Path(tuning_dir)
    tuning = collect_tuning(root)
    chosen = choose_settings(tuning)
    write_bytes_atomic(root / "lr.json", (json.dumps(chosen, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    write_bytes_atomic(root / "TUNING.md", render_tuning(tuning, chosen).encode("utf-8"))
    return chosen


# ---- Markdown ------------------------------------------------------------------------------------
def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


def _cell(r: Result | None, base: Path) -> str:
    if r is None:
        return MISSING
    links = []
    if r.has_log:
        links.append(f"[log]({_rel(r.path / 'train_log.jsonl', base)})")
    if r.has_command:
        links.append(f"[cmd]({_rel(r.path / 'command.txt', base)})")
    return f"**{r.test_bpc:.3f}**" + (f" ({', '.join(links)})" if links else "")


def _num(v, fmt: str = "{:,}") -> str:
    if v is None:
        return MISSING
    return fmt.format(v)


def render_markdown(results: dict[tuple[str, str | None], Result], base: str | Path = ".",
                    tuning: Path | None = None) -> str:
    """The Markdown of the tables; links are relative to the directory ``base`` (where the
    Markdown file lives); ``tuning``: the tuning step's TUNING.md to link, if any."""
    base = Path(base)
    lines = ["## Table 1 on text8-10M: test bits per character", "",
             "Ours: text8-10M (train [0, 9M), valid [9M, 9.5M), test [9.5M, 10M) of text8), test split scored "
             "once by `isan score`. Protocol (train/studies/table1.sh): every model sees the same number of training "
             "characters (see `train chars seen` below) in B=32 streams of T=64, with Adam at the setting "
             "its tuning step chose (train/studies/tune.sh" + (f", [TUNING.md]({_rel(tuning, base)})" if tuning else "")
             + "). Paper: Foerster et al. 2017 (ICML), Table 1, on text8 split \"90%, 5%, and 5% for train, "
             "validation, and test respectively, in line with (Mikolov et al., 2012)\" (Sec 2.2), text8 being "
             "\"10 million characters of Wikipedia text\" (Sec 1): read as written, 9M training characters like "
             "ours; read as the full text8 (100M characters, Mikolov et al.'s 90M/5M/5M), 90M. "
             f"{MISSING}: no result yet.", ""]
    head = "| model | " + " | ".join(f"{b} | paper {b}" for b, _ in BUDGETS) + " |"
    lines += [head, "|---|" + "---:|" * (2 * len(BUDGETS))]
    for kind, label in MAIN_ROWS:
        cells = []
        for i, (b, _) in enumerate(BUDGETS):
            cells += [_cell(results.get((kind, b)), base), f"{PAPER[kind][i]:.2f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Controls (the paper gives these numbers in its text without a parameter count: the linear RNNs in "
              "ICML Sec 3.1, the ISAN without biases only in the ICLR 2017 workshop version, Sec 6.1) and an n-gram "
              "reference:", ""]
    lines += ["| model | " + " | ".join(b for b, _ in BUDGETS) + " | no budget | paper |",
              "|---|" + "---:|" * (len(BUDGETS) + 2)]
    for kind, label in VARIANT_ROWS:
        if kind == "ngram":
            r = results.get(("ngram", None))
            name = label + (f" (order {r.d}, chosen on valid)" if r is not None and r.d else "")
            cells = ["n/a"] * len(BUDGETS) + [_cell(r, base)]
        else:
            name = label
            cells = [_cell(results.get((kind, b)), base) for b, _ in BUDGETS] + ["n/a"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {PAPER_TEXT[kind]} |")
    lines += ["", "### Runs: size, validation and training throughput", "",
              "| model | budget | params | d (n-gram: order) | valid bpc (valid.json) | test bpc | train chars seen | "
              "train chars/s | stop | evidence |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    order = [k for k, _ in MAIN_ROWS + VARIANT_ROWS]
    budgets = [b for b, _ in BUDGETS] + [None]
    for key in sorted(results, key=lambda k: (order.index(k[0]), budgets.index(k[1]))):
        r = results[key]
        lines.append(
            f"| {LABELS[r.model]} | {r.budget or 'n/a'} | {_num(r.n_params)} | {_num(r.d)} | "
            f"{_num(r.valid_bpc, '{:.3f}')}{' (log)' if r.valid_from == 'log' else ''} | {r.test_bpc:.3f} | "
            f"{_num(r.chars_seen)} | "
            f"{_num(r.train_chars_per_s, '{:,.0f}')} | {r.stop_reason or MISSING} | "
            f"[{r.path.name}/]({_rel(r.path, base)}/) |")
    if not results:
        lines.append("| " + " | ".join([MISSING] * 10) + " |")
    lines += ["", valid_note(results), "",
              "n-gram: `params` counts stored n-grams and `train chars/s` is counting speed.", ""]
    return "\n".join(lines)


def valid_note(results: dict[tuple[str, str | None], Result]) -> str:
    """What the runs table's valid bpc is: the bundle's `isan score` on the whole valid split (valid.json), not
    the training log's periodic evaluation, and how far apart the two are in ``results``."""
    gaps = [r.valid_bpc_log - r.valid_bpc for r in results.values()
            if r.valid_from == "valid.json" and r.valid_bpc_log is not None and r.model != "ngram"]
    span = f" Here the log's number minus valid.json's is {min(gaps):.4f} to {max(gaps):.4f} bpc." if gaps else ""
    return ("`valid bpc`: `isan score --json --text8-split valid` of the exported bundle (each run's valid.json, the "
            "last command of its command.txt): the whole valid split read as one stream from the initial state. The "
            "bundle is the checkpoint with the best of the periodic evaluations in the training log "
            "(`best_valid_bpc`), which split the same text into parallel streams (the run's `valid_streams`), each "
            "read from the initial state, so that each stream pays for its start again and the log's number is "
            f"usually a little higher.{span} A number marked (log) is the log's, for a run without valid.json.")


README_BEGIN = "<!-- table1:begin (written by python -m isan.train.studies.table1 --readme README.md) -->"
README_END = "<!-- table1:end -->"


def render_summary(results: dict[tuple[str, str | None], Result], base: str | Path = ".") -> str:
    """The compact table for the README: our test bpc per cell (linked to its directory) beside
    the paper's; links are relative to ``base``."""
    base = Path(base)

    def cell(r: Result | None) -> str:
        return MISSING if r is None else f"[{r.test_bpc:.3f}]({_rel(r.path, base)}/)"

    lines = ["| test bpc | " + " | ".join(b for b, _ in BUDGETS) + " | paper (text8, 90/5/5 split) " +
             " / ".join(b for b, _ in BUDGETS) + " |", "|---|" + "---:|" * len(BUDGETS) + "---|"]
    for kind, label in MAIN_ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(results.get((kind, b))) for b, _ in BUDGETS)
                     + " | " + " / ".join(f"{v:.2f}" for v in PAPER[kind]) + " |")
    for kind, label in VARIANT_ROWS:
        if kind != "ngram" and any((kind, b) in results for b, _ in BUDGETS):
            lines.append(f"| {label} | " + " | ".join(cell(results.get((kind, b))) for b, _ in BUDGETS)
                         + f" | {PAPER_TEXT[kind]} (no size given) |")
    r = results.get(("ngram", None))
    if r is not None:
        order = f" of order {r.d} (chosen on valid)" if r.d else ""
        lines += ["", f"No parameter budget: a {LABELS['ngram']}{order}, test {cell(r)} bpc "
                      f"({_num(r.n_params)} stored n-grams)."]
    return "\n".join(lines)


def splice_readme(readme: str | Path, summary: str) -> None:
    """Replace the text between README_BEGIN and README_END in ``readme`` with ``summary`` (atomically).

    Raises:
        IsanError: the file lacks the two markers, in that order.
    """
    path = Path(readme)
    text = path.read_text(encoding="utf-8")
    i, j = text.find(README_BEGIN), text.find(README_END)
    if i < 0 or j < i:
        raise IsanError(f"{path} lacks the lines {README_BEGIN!r} and {README_END!r} that mark where the table goes")
    new = text[:i + len(README_BEGIN)] + "\n" + summary + "\n" + text[j:]
    write_bytes_atomic(path, new.encode("utf-8"))


# ---- plot ----------------------------------------------------------------------------------------
def plot_png(results: dict[tuple[str, str | None], Result]) -> bytes:
    """PNG bytes of test bpc against parameters (log x), ours solid and the paper's dashed, like
    the paper's Figure 1a; the controls as markers and the n-gram as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (kind, label) in enumerate(MAIN_ROWS):
        c = colors[i % len(colors)]
        ax.plot([v for _, v in BUDGETS], PAPER[kind], ls="--", marker="x", color=c, alpha=0.6, label=f"{label} (paper)")
        pts = sorted((r.n_params or dict(BUDGETS)[b], r.test_bpc) for (k, b), r in results.items() if k == kind)
        if pts:
            ax.plot(*zip(*pts), ls="-", marker="o", color=c, label=f"{label} (ours)")
    markers = {"linear": "s", "linear_nlro": "D", "isan_nobias": "^"}
    for j, kind in enumerate(markers):
        pts = sorted((r.n_params or dict(BUDGETS)[b], r.test_bpc) for (k, b), r in results.items() if k == kind)
        if pts:
            ax.plot(*zip(*pts), ls=":", marker=markers[kind], color=colors[(len(MAIN_ROWS) + j) % len(colors)],
                    label=f"{LABELS[kind]} (ours)")
    ng = results.get(("ngram", None))
    if ng is not None:
        ax.axhline(ng.test_bpc, color="gray", ls="-.", label=f"KN {ng.d or '?'}-gram (ours)")
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("test bits per character")
    # the paper's split is "90%, 5%, and 5%" of text8 (ICML Sec 2.2), which it calls "10 million characters"
    # (Sec 1): 9M training characters as ours, or 90M if that means the full text8; the title names both
    ax.set_title("Table 1: ours (text8-10M, 9M train chars) vs the paper's (9M or 90M, Sec 2.2)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def generate(results_dir: str | Path, out: str | Path, plot: str | Path | None = None,
             readme: str | Path | None = None) -> dict:
    """Read ``results_dir``, write the Markdown to ``out`` (and the PNG to ``plot``, and the
    compact table into ``readme`` between its markers) atomically.

    Returns:
        {"markdown": out path, "plot": plot path or None, "cells": number of results found}.
    Raises:
        IsanError: see :func:`collect_results`.
    """
    results = collect_results(results_dir)
    out = Path(out)
    tuning = Path(results_dir) / "tuning" / "TUNING.md"
    write_bytes_atomic(out, render_markdown(results, out.parent, tuning if tuning.is_file() else None).encode("utf-8"))
    if readme is not None:
        splice_readme(readme, render_summary(results, Path(readme).parent))
    if plot is not None:
        write_bytes_atomic(plot, plot_png(results))
    return {"markdown": str(out), "plot": str(plot) if plot is not None else None, "cells": len(results),
            "readme": str(readme) if readme is not None else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m isan.train.studies.table1", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", "--runs", dest="results", default="results/table1",
                    help="directory of result directories (default: results/table1)")
    ap.add_argument("--out", default="README-table.md", help="Markdown file to write (default: README-table.md)")
    ap.add_argument("--plot", default="docs/table1.png", help="PNG to write (default: docs/table1.png)")
    ap.add_argument("--no-plot", action="store_true", help="write only the Markdown")
    ap.add_argument("--readme", metavar="FILE", help="also write the compact table into FILE between its "
                    "table1:begin/end markers (README.md)")
    ap.add_argument("--tuning", metavar="DIR", help="instead: pick each model's learning rate from the "
                    "tuning logs in DIR and write DIR/lr.json and DIR/TUNING.md")
    args = ap.parse_args(argv)
    if args.tuning:
        try:
            chosen = write_tuning(args.tuning)
        except IsanError as e:
            ap.exit(2, f"Error: {e}\n")
        print(json.dumps(chosen, sort_keys=True))
        return 0
    try:
        info = generate(args.results, args.out, None if args.no_plot else args.plot, args.readme)
    except IsanError as e:
        ap.exit(2, f"Error: {e}\n")
    print(f"{info['cells']} results from {args.results}")
    print(f"wrote {info['markdown']}")
    for key in ("plot", "readme"):
        if info[key]:
            print(f"wrote {info[key]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
