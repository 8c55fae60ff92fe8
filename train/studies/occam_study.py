"""The Occam-gated LSTM study (issue #15): bpc with and without the gate penalty on text8-10M at the
3.2e5 budget, beside Table 1's LSTM-3.2e5 at the same characters (from its committed log), and the
gates rendered over test text (Raiman and Sidor's Figs 9-10: does a character model learn to read
word boundaries?).

``score``: the best checkpoint of a run on test and a 200,000-character train slice (the
generalisation gap against the valid bpc the loop logged for that checkpoint), with :func:`isan.train.loop.evaluate_bpc` (the loop's own evaluator: 100
streams from the initial state), plus gate statistics by character class over the test split and a
check of the torch forward against the numpy reference (:mod:`isan.engine.baselines.occam`) on a slice.
``gates``: PNG + HTML highlights. ``table``: TABLE.md / table.json from the committed files.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np

TABLE1_LSTM = Path("results/table1/lstm-3.2e5")


def _load_model(run_dir: Path):
    import torch

    from isan.params import load_tensors
    from isan.train.occam import occam_from_config

    cfg = json.loads((run_dir / "config.json").read_text())
    model = occam_from_config(cfg["model"])
    t = load_tensors(run_dir / "best.safetensors")
    model.load_state_dict({k: torch.as_tensor(v) for k, v in t.items()})
    model.eval()
    return cfg, model, t


TRAIN_SLICE = 200_000
GATE_STATS_CHARS = 5_000


def _splits(data: str, max_chars: int | None):
    from isan.alphabet import Alphabet
    from isan.data import read_text8_split

    a = Alphabet.text8()
    out = {}
    for s in ("test", "train"):  # valid: the loop's own evaluation of the best checkpoint (its log)
        text = read_text8_split(data, s)
        if s == "train":
            text = text[:TRAIN_SLICE]  # a slice of the train split: the generalisation gap
        if max_chars:
            text = text[:max_chars]
        out[s] = (text, a.encode(text))
    return a, out


def gate_statistics(gates: np.ndarray, text: str) -> dict:
    """Mean gate by character class: space, a word's first letter, its other letters; and the
    gate's ranking power for "this character is a space or a word's first letter" (AUC)."""
    chars = np.array(list(text))
    space = chars == " "
    first = np.zeros(len(chars), dtype=bool)
    first[1:] = space[:-1] & ~space[1:]
    first[0] = not space[0]
    inner = ~space & ~first
    boundary = space | first
    out = {"chars": int(len(chars)), "mean": float(gates.mean()), "mean_space": float(gates[space].mean()),
           "mean_word_first_letter": float(gates[first].mean()), "mean_word_other_letters": float(gates[inner].mean()),
           "fraction_below_0.5": float((gates < 0.5).mean())}
    # AUC by ranks (Mann-Whitney): P(gate at a boundary char > gate at an inner char)
    r = np.argsort(np.argsort(gates, kind="stable"), kind="stable") + 1.0
    n1, n0 = boundary.sum(), (~boundary).sum()
    out["auc_boundary_vs_inner"] = float((r[boundary].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)) if n1 and n0 else None
    return out


def run_gates(model, ids: np.ndarray, with_bits: bool = False):
    """Gates (T,) of one stream from the model's initial state (torch, in chunks of 256); with
    ``with_bits`` also the bits of each character (T,) under the model."""
    import torch

    x = torch.as_tensor(np.asarray(ids, dtype=np.int64)).view(-1, 1)
    state = model.initial_state(1)
    out, bits = [], []
    with torch.no_grad():
        for s in range(0, len(x), 256):
            logits, state, g = model(x[s: s + 256], state, return_gates=True)
            out.append(g[:, 0].numpy())
            bits.append(torch.nn.functional.cross_entropy(logits[:, 0], x[s: s + 256, 0], reduction="none").numpy())
    gates = np.concatenate(out).astype(np.float64)
    return (gates, np.concatenate(bits).astype(np.float64) / math.log(2)) if with_bits else gates


def score_run(run_dir: Path, data: str, out: Path, max_chars: int | None = None) -> dict:
    """Score a run's best checkpoint; writes ``out/score.json`` and copies the run's log and config."""
    import shutil

    import torch

    from isan.engine.baselines.occam import OccamParams, occam_score_ref
    from isan.train.loop import evaluate_bpc

    cfg, model, t = _load_model(run_dir)
    _, sp = _splits(data, max_chars)
    res = {"run_dir": str(run_dir), "model": cfg["model"], "n_params": cfg.get("n_params")}
    for s, (_, ids) in sp.items():
        with torch.no_grad():
            res[f"{s}_bpc"] = evaluate_bpc(model, ids, streams=100)
    log = [json.loads(x) for x in (run_dir / "train_log.jsonl").read_text().splitlines() if x.strip()]
    valids = [e for e in log if e.get("event") == "valid"]
    res["valid_bpc"] = min(e["valid_bpc"] for e in valids)  # the best checkpoint's, by the loop's evaluator
    res["gap_valid_minus_train_slice"] = res["valid_bpc"] - res["train_bpc"]
    text, ids = sp["test"]
    n = min(len(ids), GATE_STATS_CHARS)
    gates, bits = run_gates(model, ids[:n], with_bits=True)
    gs = gate_statistics(gates, text[:n])
    # Occam's idea: read an input only where it tells something. Gate of x_t against the bits of x_t
    # (how surprising the character was when it came, before the model read it)
    gs["corr_gate_vs_bits_of_that_char"] = float(np.corrcoef(gates, bits)[0, 1]) if gates.std() > 0 else None
    per = {}
    for ch in sorted(set(text[:n])):
        m = np.array([c == ch for c in text[:n]])
        per[ch] = float(gates[m].mean())
    gs["mean_by_char"] = per
    res["gate_stats"] = gs
    # the torch module against the numpy reference on a slice
    p = OccamParams.from_tensors(cfg["model"], t)
    sl = ids[:2000]
    bits_np, _ = occam_score_ref(p, sl, p.initial_state())
    with torch.no_grad():
        x = torch.as_tensor(sl).view(-1, 1)
        logits, _ = model(x, model.initial_state(1))
        bits_t = torch.nn.functional.cross_entropy(logits[:, 0].double(), x[:, 0], reduction="none").numpy() / math.log(2)
    res["numpy_vs_torch_max_abs_bits"] = float(np.abs(bits_np - bits_t).max())
    res["valid_curve"] = [{"chars_seen": e["chars_seen"], "valid_bpc": e["valid_bpc"]} for e in log
                          if e.get("event") == "valid"]
    steps = [e for e in log if e.get("event") == "step"]
    res["last_train_bpc"] = steps[-1]["train_bpc"] if steps else None
    res["train_chars_per_s"] = [e.get("train_chars_per_s") for e in log if e.get("event") == "done"][-1:] or None
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "train_log.jsonl", out / "train_log.jsonl")
    shutil.copyfile(run_dir / "config.json", out / "config.json")
    (out / "score.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


def render_gates(run_dir: Path, data: str, out: Path, chars: int = 360, warmup: int = 200, cols: int = 60) -> list[Path]:
    """The gate of every character of a test passage as a highlighter behind the text, as in Raiman and
    Sidor's Figs 9-10 ("gate action shown with yellow highlighter"), PNG + HTML.

    Two panels over the same passage: (a) the shading is the gate itself (white 0, full yellow 1: the
    paper's convention); (b) the shading is rescaled to the passage's own range [min, max], so that
    small differences between mostly open gates show (the range is printed). The first ``warmup``
    characters are read but not shown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from isan.alphabet import Alphabet
    from isan.data import read_text8_split

    _, model, _ = _load_model(run_dir)
    text = read_text8_split(data, "test")[: warmup + chars]
    g = np.asarray(run_gates(model, Alphabet.text8().encode(text))[warmup:], dtype=np.float64)
    shown = text[warmup:]
    out.mkdir(parents=True, exist_ok=True)
    rows = math.ceil(len(shown) / cols)
    lo, hi = float(g.min()), float(g.max())
    scaled = (g - lo) / (hi - lo) if hi > lo else np.zeros_like(g)
    fig, axes = plt.subplots(2, 1, figsize=(cols * 0.155, 2 * rows * 0.3 + 1.1), dpi=100)
    yellow = np.array([1.0, 0.86, 0.0])
    for ax, vals, title in ((axes[0], g, f"(a) shading = gate (white 0, yellow 1); mean {g.mean():.3f}"),
                            (axes[1], scaled, f"(b) shading rescaled to this passage's range: white {lo:.3g}, yellow {hi:.3g}")):
        for i, (ch, v) in enumerate(zip(shown, vals)):
            r, c = divmod(i, cols)
            col = 1.0 - float(np.clip(v, 0, 1)) * (1.0 - yellow)
            ax.add_patch(plt.Rectangle((c, -r - 1), 1, 1, color=col, lw=0))
            ax.text(c + 0.5, -r - 0.5, "_" if ch == " " else ch, ha="center", va="center", fontsize=9,
                    family="monospace", color="0.45" if ch == " " else "black")
        ax.set_xlim(0, cols)
        ax.set_ylim(-rows, 0)
        ax.axis("off")
        ax.set_title(title, fontsize=9, loc="left")
    fig.suptitle(f"{run_dir.name}: Occam input gate per character of test text ('_' is a space)", fontsize=10)
    fig.tight_layout()
    png = out / "gates.png"
    fig.savefig(png)
    plt.close(fig)
    spans = "".join(f'<span title="{v:.3f}" style="background: rgba(255,220,0,{v:.3f})">'
                    f'{"&nbsp;" if ch == " " else html.escape(ch)}</span>' for ch, v in zip(shown, g))
    spans_s = "".join(f'<span title="{v:.3f}" style="background: rgba(255,220,0,{w:.3f})">'
                      f'{"&nbsp;" if ch == " " else html.escape(ch)}</span>' for ch, v, w in zip(shown, g, scaled))
    page = out / "gates.html"
    page.write_text(f"<!doctype html><meta charset=utf-8><title>{run_dir.name} gates</title>"
                    f"<p>(a) highlight = gate (0 none, 1 full yellow); hover for the value</p>"
                    f"<p style='font-family: monospace; font-size: 16px; line-height: 1.7'>{spans}</p>"
                    f"<p>(b) highlight rescaled to this passage's range [{lo:.3g}, {hi:.3g}]</p>"
                    f"<p style='font-family: monospace; font-size: 16px; line-height: 1.7'>{spans_s}</p>\n")
    return [png, page]


def _table1_valid_at(chars: int) -> float | None:
    path = TABLE1_LSTM / "train_log.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "valid" and abs(e["chars_seen"] - chars) <= 4096:
            return e["valid_bpc"]
    return None


def train_bpc_window(log_path: Path, lo: int, hi: int) -> float | None:
    """Mean training bpc of the logged step windows with ``lo < chars_seen <= hi`` (the data loss only)."""
    if not Path(log_path).exists():
        return None
    events = [json.loads(x) for x in Path(log_path).read_text().splitlines() if x.strip()]
    v = [e["train_bpc"] for e in events if e.get("event") == "step" and lo < e.get("chars_seen", -1) <= hi]
    return float(np.mean(v)) if v else None


def _table1_train_at(chars: int) -> float | None:
    """Table 1's LSTM-3.2e5 mean training bpc over the last quarter of the first ``chars`` characters
    (same seed, so the same text in the same order as the Occam runs)."""
    return train_bpc_window(TABLE1_LSTM / "train_log.jsonl", int(0.75 * chars), chars)


def write_table(results: Path) -> dict:
    results = Path(results)
    runs = {}
    for d in sorted(results.iterdir()):
        if (d / "score.json").exists():
            runs[d.name] = json.loads((d / "score.json").read_text())
    table = {"runs": runs, "table1_lstm": {}}
    lines = ["# The Occam-gated LSTM on text8-10M (3.2e5 parameters)", "",
             "Written by `isan study occam table --results results/occam` from the committed files; commands in "
             "`command.txt`. bpc from `isan.train.loop.evaluate_bpc` (100 streams from the initial state) on the "
             "best checkpoint (valid: the loop's evaluation logged during training); the train slice is the first 200,000 characters of the train split; gate statistics over the first 5,000 test characters. Gates rendered over test text: `<run>/gates.png` and `<run>/gates.html`.", "",
             "| run | params | d | lambda_max (regimen, T_max) | chars trained | valid bpc | test bpc | train-slice bpc | "
             "valid - train slice | mean gate (test) | space / first letter / other letters | AUC boundary | "
             "corr(gate, bits) |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for name, r in runs.items():
        m = r["model"]
        chars = r["valid_curve"][-1]["chars_seen"] if r["valid_curve"] else 0
        gs = r["gate_stats"]
        lines.append(f"| {name} | {r['n_params']:,} | {m['d']} | {m['lam']} ({m['schedule']}, T_max {m.get('t_max', 1.0):g} of the budget) | {chars:,} | "
                     f"{r['valid_bpc']:.4f} | {r['test_bpc']:.4f} | {r['train_bpc']:.4f} | "
                     f"{r['gap_valid_minus_train_slice']:+.4f} | {gs['mean']:.4f} | {gs['mean_space']:.4f} / "
                     f"{gs['mean_word_first_letter']:.4f} / {gs['mean_word_other_letters']:.4f} | "
                     f"{_fmt(gs.get('auc_boundary_vs_inner'), 3)} | {_fmt(gs.get('corr_gate_vs_bits_of_that_char'), 3)} |")
        table["table1_lstm"][name] = {"chars": chars, "valid_bpc": _table1_valid_at(chars),
                                      "train_bpc_last_quarter": _table1_train_at(chars),
                                      "run_train_bpc_last_quarter": train_bpc_window(
                                          results / name / "train_log.jsonl", int(0.75 * chars), chars)}
    lines += ["", "Training bpc (the data loss, without the penalty), mean of the logged windows over the last quarter "
              "of the characters trained, beside Table 1's LSTM-3.2e5 on the same characters (same seed, same text "
              "order): " + "; ".join(
                  f"{n} {_fmt(train_bpc_window(results / n / 'train_log.jsonl', int(0.75 * c), c))} (LSTM "
                  f"{_fmt(_table1_train_at(c))})" for n, c in
                  ((n, r["valid_curve"][-1]["chars_seen"]) for n, r in runs.items() if r["valid_curve"])) + "."]
    first = None
    if (TABLE1_LSTM / "train_log.jsonl").exists():
        first = next((json.loads(x) for x in (TABLE1_LSTM / "train_log.jsonl").read_text().splitlines()
                      if '"valid"' in x), None)
    lines += ["", "Valid bpc at each evaluation (the loop's log). Table 1's LSTM-3.2e5 (same protocol: B = 32, T = 64, "
              "rate 3.76e-3; results/table1/lstm-3.2e5/train_log.jsonl) was first evaluated at "
              + (f"{first['chars_seen']:,} characters ({first['valid_bpc']:.4f})" if first else "—")
              + ", so the comparison at equal characters is the training bpc above.", ""]
    for name, r in runs.items():
        pts = ", ".join(f"{e['chars_seen']:,}: {e['valid_bpc']:.4f}"
                        + (f" (LSTM {_table1_valid_at(e['chars_seen']):.4f})" if _table1_valid_at(e['chars_seen']) else "")
                        for e in r["valid_curve"])
        lines.append(f"- {name}: {pts}")
    lines += ["", "AUC boundary: the probability that the gate on a space or a word's first letter exceeds the gate on "
              "a letter inside a word (0.5: no preference). corr(gate, bits): the correlation of a character's gate "
              "with its bits under the model (how surprising it was when it came). Gates by character (test, first "
              "5,000 characters; '_' is the space), the five most shut and the five most open:", ""]
    for name, r in runs.items():
        by = sorted(r["gate_stats"].get("mean_by_char", {}).items(), key=lambda kv: kv[1])
        if by:
            f = lambda kv: f"{kv[0].replace(' ', '_')} {kv[1]:.3f}"  # noqa: E731
            lines.append(f"- {name}: shut {', '.join(map(f, by[:5]))}; open {', '.join(map(f, by[-5:]))}")
    bund = {n: json.loads((results / n / "bundle.json").read_text()) for n in runs if (results / n / "bundle.json").exists()}
    if bund:
        lines += ["", "Bundles (`isan study occam export`; kind = the run's, numpy scorer, no ONNX graph yet): max |bits| "
                  "of the bundle's numpy scorer against torch over the first 2,000 test characters: " + ", ".join(
                      f"{n} {b['max_abs_bits_vs_torch']:.2e}" for n, b in bund.items()) + "."]
    lines += ["", "numpy reference vs torch (max |bits| over 2,000 test characters): " + ", ".join(
        f"{n} {r['numpy_vs_torch_max_abs_bits']:.2e}" for n, r in runs.items()) + "."]
    (results / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    (results / "TABLE.md").write_text("\n".join(lines) + "\n")
    return table


def _fmt(x, nd: int = 4):
    return "—" if x is None else f"{x:.{nd}f}"


def export_bundle(run_dir: Path, out: Path, data: str, check_chars: int = 2000) -> dict:
    """Write the best checkpoint as a bundle (``kind`` = the run's Occam kind, ``model`` = its config,
    float32 weights; the engine's :func:`isan.engine.bundle.write_bundle`), load it back with
    :func:`isan.engine.baselines.recurrent.load_params_bundle` and :class:`isan.engine.baselines.occam.OccamParams`,
    and check its numpy scorer against the torch module on the first ``check_chars`` test characters.
    No ONNX graph: the gate is not in the LSTM graph of :mod:`isan.export` yet."""
    import torch

    from isan.alphabet import Alphabet
    from isan.engine.baselines.recurrent import load_params_bundle
    from isan.engine.bundle import write_bundle
    from isan.data import read_text8_split
    from isan.engine.baselines.occam import OCCAM_KINDS, NumpyOccamRunner, OccamParams

    cfg, model, t = _load_model(run_dir)
    mc = cfg["model"]
    write_bundle(out, {k: np.asarray(v, dtype=np.float32) for k, v in t.items()}, Alphabet.text8(), kind=mc["kind"],
                 training={"run_dir": str(run_dir), "command": "isan study occam export"},
                 extra={"model": mc, "d": int(mc["d"])}, overwrite=True, normalizer="text8")
    m, p, alphabet = load_params_bundle(out, OCCAM_KINDS, OccamParams)
    runner = NumpyOccamRunner(p)
    ids = alphabet.encode(read_text8_split(data, "test")[:check_chars])
    bits_np, _ = runner.score_ids(ids, runner.initial_state())
    with torch.no_grad():
        x = torch.as_tensor(ids).view(-1, 1)
        logits, _ = model(x, model.initial_state(1))
        bits_t = torch.nn.functional.cross_entropy(logits[:, 0].double(), x[:, 0], reduction="none").numpy() / math.log(2)
    return {"bundle": str(out), "kind": m["kind"], "params_sha256": m["params_sha256"],
            "bundle_bpc_first_chars": float(bits_np.mean()), "max_abs_bits_vs_torch": float(np.abs(bits_np - bits_t).max()),
            "chars": int(len(ids))}
