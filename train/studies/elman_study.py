"""The Elman-grammar study (issue #15): Čerňanský, Makula and Beňušková (2008), Fig. 1, on our grammar
(:mod:`isan.train.tasks.elman`), plus an ISAN and an LSTM trained on the same data.

Three steps, each a command (``isan study elman ...``); the last reads only committed files:

1. ``data``: writes the train / valid / test text files (seeded; not committed, regenerated the same)
   and ``entropy.json``: sizes, the test set's entropy H (NNL and bits) from the grammar's true
   next-word distribution, and the checkers' verdict on every generated sentence.
2. ``fig1``: for each of ``runs`` seeds, ESN and ESN+ at each reservoir size, NPM-U, NPM-U+ and NPM-T
   at each number of contexts, trained on train and scored on test (NNL, eq. 7); one JSON line per
   (model, size, run) in ``fig1_runs.jsonl`` (with the seconds it took). Since issue #26 the default
   models are the paper's as written (:data:`PAPER_MODELS`: sparse ESN/ESN+ with output feedback and
   the RLS readout, eq. 6, NPM-T over an EKF-trained SRN; see :mod:`isan.train.reservoir`); the first
   study's models (:data:`MODELS`: dense ESN without feedback, ridge readout, transition ratios, Adam)
   are kept as named variants, with their ridge check on the validation sentences. ``export`` writes one bundle per reservoir model (run 0, size 100 / 100
   contexts) under ``bundles/`` and checks that the engine's scorer gives the logged NNL.
3. ``table``: ``TABLE.md``, ``table.json`` and ``fig1.png`` (NNL against reservoir size and number
   of contexts, mean and standard deviation over the runs, H as a line) from the logs, plus the
   trained models' scores (``neural/*.json``) and the kappa study (``kappa.json``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from pathlib import Path

import numpy as np

from isan.train.tasks import elman as EG
from isan.train import reservoir as RS
from isan.train import reservoir_variants as RV

log = logging.getLogger(__name__)

ESN_SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 400)
NPM_CONTEXTS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
#: the first study's models (issue #15), kept as named variants (see :mod:`isan.train.reservoir`)
MODELS = ("esn", "esn+", "npm-u", "npm-u+", "npm-t")
#: the paper's models as written (issue #26): sparse ESN with output feedback and an RLS readout, eq. 6's
#: ratios, NPM-T over an EKF-trained SRN. Each "-tf" model is the same trained ESN run on test text with
#: the feedback teacher-forced (written by the same command as its own-output twin).
PAPER_MODELS = ("esn-paper", "esn+-paper", "esn-paper-tf", "esn+-paper-tf", "npm-u", "npm-u+eq6", "npm-t-ekf")
ALL_MODELS = PAPER_MODELS + ("esn", "esn+", "npm-u+", "npm-t")
SRN_EPOCHS = 5
#: the paper's Elman-grammar data, as its text gives it (Cernansky et al. 2008, sec. 5): "The training set was
#: composed of 10000 sentences (55273 symbols) and the test set of independently generated 10000 sentences
#: (54966 symbols). The entropy estimated on the test set is H = 0.534."
PAPER_DATA = {"train_sentences": 10000, "train_symbols": 55273, "test_sentences": 10000, "test_symbols": 54966,
              "H": 0.534}
#: passes of the EKF over the training stream for NPM-T (global EKF: ~6 min a pass on one shared core)
EKF_EPOCHS = 1.0
LABELS = {"esn": "ESN-dense (ours: dense, ridge, no feedback)", "esn+": "ESN+-transition (ours)",
          "npm-u": "NPM-U", "npm-u+": "NPM-U+-transition (ours)", "npm-t": "NPM-T-Adam (ours)",
          "esn-paper": "ESN (paper: sparse, feedback, RLS)", "esn+-paper": "ESN+ (paper: eq. 6)",
          "esn-paper-tf": "ESN (paper), teacher-forced feedback", "esn+-paper-tf": "ESN+ (paper), teacher-forced feedback",
          "npm-u+eq6": "NPM-U+ (eq. 6)", "npm-t-ekf": "NPM-T (EKF)"}


def study_ids() -> dict[str, np.ndarray]:
    return {k: EG.encode(v) for k, v in EG.study_data().items()}


# --------------------------------------------------------------------------------------------- data
def write_data(out: Path, data_dir: Path) -> dict:
    """Write the text files into ``data_dir`` and ``entropy.json`` into ``out``; returns the summary."""
    data = EG.study_data()
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"grammar": {k: getattr(EG.ElmanConfig(), k) for k in EG.ElmanConfig.__dataclass_fields__},
               "alphabet": list(EG.SYMBOLS), "seeds": {"train": EG.TRAIN_SEED, "valid": EG.VALID_SEED,
                                                        "test": EG.TEST_SEED}, "splits": {}}
    for split, sents in data.items():
        (data_dir / f"{split}.txt").write_text(EG.to_text(sents))
        ids = EG.encode(sents)
        plain = sum(EG.is_grammatical_plain(s) for s in sents)
        oracle = sum(EG.is_grammatical(s) for s in sents)
        rec = {"text_sha256": hashlib.sha256(EG.to_text(sents).encode()).hexdigest(), "sentences": len(sents), "symbols": int(len(ids)), "mean_sentence_symbols": len(ids) / len(sents),
               "grammatical_recursive_descent": plain, "grammatical_oracle": oracle,
               "with_relative_clause": sum("who" in s for s in sents)}
        if split in ("test", "train"):
            rec["entropy"] = EG.stream_entropy(ids)
        summary["splits"][split] = rec
    (out / "entropy.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


# ------------------------------------------------------------------------------------------- fig 1
def _scored(lp_before: np.ndarray, ids: np.ndarray) -> float:
    """NNL from natural-log probabilities (T, V) of the symbols that came."""
    return float(-lp_before[np.arange(len(ids)), ids].mean() / math.log(lp_before.shape[1]))


def _batched_states(E: np.ndarray, W: np.ndarray, ids: np.ndarray, block: int = 2048):
    """Yield (t0, H) blocks of the states *before* each symbol for R networks at once:
    E (R, V, n), W (R, n, n) -> H (R, len(block), n); the recurrence of
    :func:`isan.engine.baselines.reservoir.reservoir_states_ref` (h0 = 0), one Python step for all runs."""
    Rn, _, n = E.shape
    h = np.zeros((Rn, n))
    WT = np.ascontiguousarray(np.transpose(W, (0, 2, 1)))
    buf = np.empty((Rn, block, n))
    k = t0 = 0
    for x in ids.tolist():
        buf[:, k] = h
        k += 1
        h = np.tanh(E[:, x, :] + np.matmul(h[:, None, :], WT)[:, 0, :])
        if k == block:
            yield t0, buf[:, :k]
            t0 += k
            k = 0
    if k:
        yield t0, buf[:, :k]


def esn_batched(runs: list[int], ids: dict, n: int, plus: bool, ridge: float = RV.ESN_RIDGE) -> list[float]:
    """Test NNL of the ESN (or ESN+) of size n of each run, all runs in one pass over the data.

    The same networks as :func:`isan.train.reservoir_variants.train_esn` with ``seed = 1000 run + n`` and the
    same ridge solution (accumulated blockwise), so the numbers equal the unbatched path's to rounding.
    """
    tr, te, V = ids["train"], ids["test"], len(EG.SYMBOLS)
    Rm = RV.transition_ratios(tr, V) if plus else None
    nets = [RV.esn_network(n, V, np.random.default_rng(1000 * r + n), Rm) for r in runs]
    E = np.stack([e for e, _ in nets])
    W = np.stack([w for _, w in nets])
    Rn = len(runs)
    G = np.zeros((Rn, n + 1, n + 1))
    Y = np.zeros((Rn, n + 1, V))
    for t0, H in _batched_states(E, W, tr):
        lo = max(0, RV.WASHOUT - t0)
        if lo >= H.shape[1]:
            continue
        Xa = np.concatenate([H[:, lo:], np.ones((Rn, H.shape[1] - lo, 1))], axis=2)
        G += np.matmul(np.transpose(Xa, (0, 2, 1)), Xa)
        y = tr[t0 + lo: t0 + H.shape[1]]
        for r in range(Rn):
            np.add.at(Y[r].T, y, Xa[r])
    outs = []
    for r in range(Rn):
        lam = ridge * float(np.mean(np.diag(G[r])[:n]))
        reg = np.full(n + 1, lam)
        reg[-1] = 0.0
        outs.append(np.linalg.solve(G[r] + np.diag(reg) + 1e-12 * np.eye(n + 1), Y[r]))
    nats = np.zeros(Rn)
    for t0, H in _batched_states(E, W, te):
        y = te[t0: t0 + H.shape[1]]
        for r in range(Rn):
            o = H[r] @ outs[r][:n] + outs[r][n]
            o = np.maximum(o, RV.O_MIN)
            lp = np.log(o[np.arange(len(y)), y]) - np.log(o.sum(1))
            nats[r] -= lp.sum()
    return [float(v / len(te) / math.log(V)) for v in nats]


def npm_records(run: int, ids: dict, contexts=NPM_CONTEXTS, models=MODELS):
    """One record per number of contexts for each NPM model of ``models`` (run ``run``)."""
    from isan.engine.baselines.reservoir import ReservoirParams

    tr, te, V = ids["train"], ids["test"], len(EG.SYMBOLS)
    for name in ("npm-u", "npm-u+", "npm-t", "npm-u+eq6", "npm-t-ekf"):
        if name not in models:
            continue
        t0 = time.perf_counter()
        rng = np.random.default_rng(1000 * run + 7)
        info = {}
        if name == "npm-t":
            E, W, info = RV.train_srn(tr, V, seed=run, epochs=SRN_EPOCHS)
        elif name == "npm-t-ekf":
            E, W, info = RS.train_srn_ekf(tr, V, seed=run, epochs=EKF_EPOCHS)
        else:
            R = {"npm-u+": RV.transition_ratios, "npm-u+eq6": RV.cooccurrence_ratios}.get(name)
            E, W = RV.untrained_network(V, rng, R=R(tr, V) if R else None)
        h0 = np.zeros(W.shape[0])
        Htr = RV.states_before(E, W, tr, h0)
        Hte = RV.states_before(E, W, te, h0)
        t_net = time.perf_counter() - t0
        for M in contexts:
            t1 = time.perf_counter()
            C, counts = RV.fit_npm(Htr, tr, V, M, seed=1000 * run + M)
            cfg, tz = RV.npm_bundle_parts(name, E, W, h0, C, counts, 1.0 / V, run)
            p = ReservoirParams.from_tensors(cfg, tz)
            rec = {"model": name, "size": M, "contexts_found": int(len(C)), "run": run,
                   "nnl": _scored(p.log_probs(Hte), te),
                   "seconds": round(time.perf_counter() - t1 + (t_net if M == contexts[0] else 0.0), 3)}
            if info and M == contexts[0]:
                rec["srn"] = info
            yield rec


#: the study fits the paper's readout by the closed form of its RLS solution (equal to rounding, see
#: :func:`isan.train.reservoir.rls_readout` and tests/test_elman_paper.py; ~10x faster at n = 400 on one core);
#: run 0 at n = 100 also runs the RLS itself and logs the largest difference of the two readouts.
RLS_CHECK_SIZE = 100


def paper_esn_records(run: int, ids: dict, plus: bool, esn_sizes=ESN_SIZES):
    """The paper's ESN (or ESN+) of each size for run ``run`` (seed ``1000 run + n``): the RLS readout on
    the teacher-forced training stream (computed in closed form), then two records per size, the test NNL
    with the network's own output fed back (``esn-paper``) and with the feedback teacher-forced
    (``esn-paper-tf``)."""
    tr, te, V = ids["train"], ids["test"], len(EG.SYMBOLS)
    name = "esn+-paper" if plus else "esn-paper"
    for n in esn_sizes:
        t0 = time.perf_counter()
        net = RS.train_paper_esn(tr, V, n, seed=1000 * run + n, plus=plus, rls=False)
        t_fit = time.perf_counter() - t0
        check = {}
        if run == 0 and n == RLS_CHECK_SIZE:
            t1 = time.perf_counter()
            rls = RS.train_paper_esn(tr, V, n, seed=1000 * run + n, plus=plus, rls=True)
            check = {"rls_check_max_abs_dW": float(np.abs(rls.W_out - net.W_out).max()),
                     "rls_check_seconds": round(time.perf_counter() - t1, 3)}
        for fb, key in (("output", name), ("teacher", name + "-tf")):
            net.feedback = fb
            yield {"model": key, "size": n, "run": run, "nnl": RS.paper_esn_nnl(net, te), "feedback": fb,
                   "p_rec": float(min(1.0, (RS.P_REC_ESN_PLUS_EG if plus else RS.P_REC_ESN) / n)),
                   "readout": "rls-closed-form", "rls_delta": RS.RLS_DELTA,
                   "seconds": round(time.perf_counter() - t0, 3), "seconds_fit": round(t_fit, 3), **check}


def ridge_check(ids: dict, n: int = 100, ridges=(1e-9, 1e-7, 1e-5, 1e-3, 1e-1)) -> list[dict]:
    """The ESN readout's ridge constant against valid NNL (run 0, size n)."""
    out = []
    for plus in (False, True):
        for r in ridges:
            cfg, tz = RV.train_esn(ids["train"], len(EG.SYMBOLS), n, seed=n, plus=plus, ridge=r)
            out.append({"event": "ridge", "model": "esn+" if plus else "esn", "size": n, "ridge": r,
                        "valid_nnl": RV.score(cfg, tz, ids["valid"]).nnl})
    return out


def run_fig1(out: Path, runs: int = 10, models=MODELS, esn_sizes=ESN_SIZES, contexts=NPM_CONTEXTS,
             log_name: str = "fig1_runs.jsonl", resume: bool = True, run_from: int = 0) -> Path:
    """Append every record to ``out/log_name`` (records already there are skipped when resuming); runs
    ``run_from`` .. ``runs - 1`` (several processes may split the runs, one log each)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / log_name
    done = set()
    if resume:
        last = {m: max(esn_sizes) for m in ALL_MODELS if m.startswith("esn")}
        for r in all_records(out):
            if r.get("event") != "ridge" and r["size"] == last.get(r["model"], max(contexts)):
                done.add((r["model"], r["run"]))
    ids = study_ids()
    with open(path, "a") as f:
        if any(m in MODELS[:2] for m in models) and not any(r.get("event") == "ridge" for r in all_records(out)):
            for r in ridge_check(ids):
                f.write(json.dumps(r) + "\n")
                f.flush()
        for m in models:
            if m in ("esn-paper", "esn+-paper"):
                for run in range(run_from, runs):
                    if (m, run) in done:
                        continue
                    for r in paper_esn_records(run, ids, m == "esn+-paper", esn_sizes):
                        f.write(json.dumps(r) + "\n")
                        f.flush()
                        log.info("%s", r)
                continue
            if m.startswith("esn"):
                todo = [r for r in range(run_from, runs) if (m, r) not in done]
                for n in esn_sizes if todo else ():
                    t0 = time.perf_counter()
                    nnls = esn_batched(todo, ids, n, plus=m == "esn+")
                    sec = round((time.perf_counter() - t0) / len(todo), 3)
                    for run, v in zip(todo, nnls):
                        r = {"model": m, "size": n, "run": run, "nnl": v, "seconds": sec, "batched_runs": len(todo)}
                        f.write(json.dumps(r) + "\n")
                        log.info("%s", r)
                    f.flush()
                continue
            for run in range(run_from, runs):
                if (m, run) in done:
                    continue
                for r in npm_records(run, ids, contexts, (m,)):
                    f.write(json.dumps(r) + "\n")
                    f.flush()
                    log.info("%s", r)
    return path


def all_records(results: Path) -> list[dict]:
    """Every record of every ``fig1*.jsonl`` log under ``results`` (the study may run as several
    processes, one log each), the first of any duplicate (model, size, run) kept."""
    out, seen = [], set()
    for p in sorted(Path(results).glob("fig1*.jsonl")):
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            key = ("ridge", r["model"], r["ridge"]) if r.get("event") == "ridge" else (r["model"], r["size"], r["run"])
            if key not in seen:
                seen.add(key)
                out.append(r)
    return out


def export_bundles(out: Path, size: int = 100, contexts: int = 100) -> list[dict]:
    """One bundle per reservoir model (run 0) under ``out/bundles``; each is loaded back and scored by
    :func:`isan.engine.baselines.reservoir.load_reservoir_bundle` on the test text. Returns their records."""
    from isan.engine.baselines.reservoir import load_reservoir_bundle, write_reservoir_bundle

    ids = study_ids()
    tr, V = ids["train"], len(EG.SYMBOLS)
    alphabet = EG.elman_alphabet()
    test_text = EG.to_text(EG.study_data()["test"])
    recs = []
    for name in MODELS:
        if name.startswith("esn"):
            cfg, tz = RV.train_esn(tr, V, size, seed=size, plus=name == "esn+")
            label = f"{name}-{size}"
        elif name == "npm-t":
            cfg, tz = RV.train_npm_t(tr, V, contexts, seed=0, epochs=SRN_EPOCHS)
            label = f"{name}-{contexts}"
        else:
            cfg, tz = RV.train_npm_u(tr, V, contexts, seed=0, plus=name == "npm-u+")
            label = f"{name}-{contexts}"
        direct = RV.score(cfg, tz, ids["test"])
        path = out / "bundles" / label.replace("+", "plus")
        write_reservoir_bundle(path, cfg["kind"], cfg, tz, alphabet, overwrite=True,
                               training={"data": "isan study elman data (train split, seed %d)" % EG.TRAIN_SEED,
                                         "command": "isan study elman export"},
                               metrics={"test_nnl": direct.nnl, "test_bits_per_word": direct.bits_per_symbol})
        runner = load_reservoir_bundle(path)
        s = runner.score_text(test_text)
        recs.append({"model": name, "bundle": str(path), "nnl_direct": direct.nnl, "nnl_bundle": s["nnl"],
                     "bits_per_word": s["bits_per_token"], "tokens": s["tokens"]})
    (out / "bundles.json").write_text(json.dumps(recs, indent=1) + "\n")
    return recs


# ------------------------------------------------------------------------------------------- table
def summarise(records: list[dict]) -> dict:
    """{model: {size: {"mean", "std", "runs", "min", "max", "diverged"}}} of NNL over runs (std: population,
    ddof=0). A run whose NNL is not finite (the paper's ESN run with its own output fed back can blow up:
    eq. 3's ``y(t-1)`` term is a linear recurrence of the output on itself) is counted in "diverged" and left
    out of the statistics."""
    out: dict = {}
    for r in records:
        if r.get("event") == "ridge" or "nnl" not in r:
            continue
        out.setdefault(r["model"], {}).setdefault(int(r["size"]), []).append(r["nnl"])
    res: dict = {}
    for m, d in out.items():
        res[m] = {}
        for s, v in sorted(d.items()):
            f = [x for x in v if math.isfinite(x)]
            res[m][s] = {"mean": float(np.mean(f)) if f else float("nan"), "std": float(np.std(f)) if f else float("nan"),
                         "runs": len(f), "min": float(np.min(f)) if f else float("nan"),
                         "max": float(np.max(f)) if f else float("nan"), "diverged": len(v) - len(f)}
    return res


def welch_p(a: dict, b: dict) -> float | None:
    """Two-sided p of Welch's unpaired t-test (the paper's sec. 7 test) from two cells of :func:`summarise`
    (population std converted to the sample std); None with fewer than 2 runs or without scipy."""
    na, nb = a["runs"], b["runs"]
    if na < 2 or nb < 2:
        return None
    try:
        from scipy import stats
    except ImportError:  # pragma: no cover
        return None
    va, vb = a["std"] ** 2 * na / (na - 1), b["std"] ** 2 * nb / (nb - 1)
    se2 = va / na + vb / nb
    if se2 == 0:
        return 0.0 if a["mean"] != b["mean"] else 1.0
    t = (a["mean"] - b["mean"]) / math.sqrt(se2)
    df = se2 ** 2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    return float(2 * stats.t.sf(abs(t), df))


def claims(summary: dict) -> dict:
    """The paper's two claims, checked size by size: ESN+ below ESN, NPM-U+ below NPM-U (mean NNL),
    and whether the difference exceeds the two standard deviations combined."""
    out = {}
    for plus, base in (("esn+-paper", "esn-paper"), ("esn+-paper-tf", "esn-paper-tf"), ("npm-u+eq6", "npm-u"),
                       ("esn+", "esn"), ("npm-u+", "npm-u")):
        if plus not in summary or base not in summary:
            continue
        rows = []
        for s in sorted(set(summary[plus]) & set(summary[base])):
            a, b = summary[plus][s], summary[base][s]
            diff = b["mean"] - a["mean"]
            rows.append({"size": s, "plus": a["mean"], "base": b["mean"], "base_minus_plus": diff,
                         "plus_better": diff > 0, "beyond_std": abs(diff) > a["std"] + b["std"],
                         "welch_p": welch_p(a, b)})
        sig = [r for r in rows if r["plus_better"] and r["welch_p"] is not None and r["welch_p"] < 0.05]
        out[f"{plus} vs {base}"] = {"sizes_plus_better": sum(r["plus_better"] for r in rows), "sizes": len(rows),
                                    "sizes_plus_better_p05": len(sig), "rows": rows}
    return out


def _table_data(results: Path) -> tuple[dict, dict]:
    """(table.json's content: the test set's entropy, Fig. 1's summary and the paper's claims, the ridge
    check, the trained models' scores, the kappa study and the bundles; entropy.json) from ``results``."""
    ent = json.loads((results / "entropy.json").read_text())
    H = ent["splits"]["test"]["entropy"]["nnl"]
    recs = all_records(results)
    summ = summarise(recs)
    ridge = [r for r in recs if r.get("event") == "ridge"]
    neural = {}
    for f in sorted((results / "neural").glob("*.json")) if (results / "neural").exists() else []:
        neural[f.stem] = json.loads(f.read_text())
    neural = dict(sorted(neural.items(), key=lambda kv: (kv[1].get("kind", ""), kv[1].get("d", 0))))
    kappa = json.loads((results / "kappa.json").read_text()) if (results / "kappa.json").exists() else None
    bundles = json.loads((results / "bundles.json").read_text()) if (results / "bundles.json").exists() else None
    table = {"entropy_nnl": H, "entropy_bits": ent["splits"]["test"]["entropy"]["bits_per_symbol"],
             "fig1": summ, "claims": claims(summ), "ridge_check": ridge, "neural": neural, "kappa": kappa,
             "bundles": bundles}
    return table, ent


def _data_lines(ent: dict, table: dict) -> list[str]:
    """TABLE.md's opening: the data's sizes and entropy beside the paper's."""
    H = table["entropy_nnl"]
    return ["# Elman's grammar: untrained-network baselines (Čerňanský et al. 2008, Fig. 1), ISAN and LSTM", "",
            "Written by `isan study elman table --results results/elman` from the committed logs "
            "(`fig1_runs.jsonl`, `entropy.json`, `neural/`, `kappa.json`); commands in `command.txt`.", "",
            f"Test set: {ent['splits']['test']['sentences']:,} sentences, {ent['splits']['test']['symbols']:,} "
            f"symbols; train: {ent['splits']['train']['sentences']:,} sentences, "
            f"{ent['splits']['train']['symbols']:,} symbols. Grammar entropy of the test set "
            f"H = {H:.4f} NNL ({table['entropy_bits']:.4f} bits/word). Every generated sentence passes both "
            f"checkers: {ent['splits']['train']['grammatical_oracle']:,}/{ent['splits']['train']['sentences']:,} "
            f"train, {ent['splits']['test']['grammatical_oracle']:,}/{ent['splits']['test']['sentences']:,} test.",
            "", f"The paper's (sec. 5): train {PAPER_DATA['train_sentences']:,} sentences, "
            f"{PAPER_DATA['train_symbols']:,} symbols; test {PAPER_DATA['test_sentences']:,} sentences, "
            f"{PAPER_DATA['test_symbols']:,} symbols; H = {PAPER_DATA['H']} estimated on the test set. Ours has "
            f"{ent['splits']['train']['symbols'] - PAPER_DATA['train_symbols']:+,} training and "
            f"{ent['splits']['test']['symbols'] - PAPER_DATA['test_symbols']:+,} test symbols, and H "
            f"{H - PAPER_DATA['H']:+.4f} NNL: its rule probabilities are ours (the paper gives none).",
            "", "NNL on the test set (mean ± std over runs; lower is better; H is the floor):", ""]


def _fig1_lines(summ: dict) -> list[str]:
    """TABLE.md's Fig. 1 tables: the test NNL of each group of models by size."""
    lines = []
    groups = (("esn-paper", ESN_SIZES, "reservoir units n", "The paper's ESN and ESN+ as written (sparse reservoir, "
               "output feedback, RLS readout; eq. 6), run on test text with their own output fed back and, in the "
               "-tf columns, with the feedback teacher-forced:"),
              ("esn-ours", ESN_SIZES, "reservoir units n", "Our first ESN and ESN+ (the first version of this study: "
               "dense, no feedback, ridge; transition ratios instead of eq. 6), kept as named variants:"),
              ("npm", NPM_CONTEXTS, "contexts M", "NPMs: the paper's NPM-U, NPM-U+ (eq. 6) and NPM-T (EKF), then our "
               "first NPM-U+ (transition ratios) and NPM-T (Adam):"))
    members = {"esn-paper": ("esn-paper", "esn+-paper", "esn-paper-tf", "esn+-paper-tf"), "esn-ours": ("esn", "esn+"),
               "npm": ("npm-u", "npm-u+eq6", "npm-t-ekf", "npm-u+", "npm-t")}
    for group, sizes, label, intro in groups:
        models = [m for m in members[group] if m in summ]
        if models:
            lines += [intro, ""]
        if not models:
            continue
        allsizes = sorted(set().union(*[summ[m].keys() for m in models]))
        lines += [f"| {label} | " + " | ".join(LABELS[m] for m in models) + " |",
                  "|---:|" + "---:|" * len(models)]
        for s in allsizes:
            cells = [(f"{summ[m][s]['mean']:.4f} ± {summ[m][s]['std']:.4f}"
                      + (f" ({summ[m][s]['diverged']} diverged)" if summ[m][s].get("diverged") else "")) if s in summ[m]
                     else "—" for m in models]
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        runs = sorted({summ[m][s]["runs"] + summ[m][s].get("diverged", 0) for m in models for s in summ[m]})
        lines += ["", f"Runs per cell: {', '.join(map(str, runs))} (a diverged run, NNL not finite, is counted "
                  "beside the cell and left out of its mean).", ""]
    return lines


def _claims_lines(claims: dict) -> list[str]:
    """TABLE.md's check of the paper's claims, size by size."""
    lines = ["The paper's claims, size by size (mean NNL):", ""]
    for k, v in claims.items():
        beyond = sum(r["beyond_std"] and r["plus_better"] for r in v["rows"])
        worse = [r["size"] for r in v["rows"] if not r["plus_better"]]
        lines.append(f"- {k}: the + variant is better at {v['sizes_plus_better']} of {v['sizes']} sizes "
                     f"({beyond} by more than the two standard deviations combined; {v['sizes_plus_better_p05']} "
                     f"at p < 0.05 by Welch's t-test)"
                     + (f"; not at {worse}" if worse else "") + ".")
    return lines


def _neural_lines(neural: dict) -> list[str]:
    """TABLE.md's table of the trained models (none without them)."""
    lines = []
    if neural:
        lines += ["", "Trained models on the same data (one run each; valid and test NNL scored as one stream from "
                  "the initial state; the figure shows, per architecture, the run with the best valid NNL):", "",
                  "| model | parameters | valid NNL | test NNL | test bits/word | training log |",
                  "|---|---:|---:|---:|---:|---|"]
        for name, r in neural.items():
            lines.append(f"| {r.get('label', name)} | {r.get('n_params', 0):,} | {r['valid_nnl']:.4f} | "
                         f"{r['test_nnl']:.4f} | {r['test_bits_per_word']:.4f} | [neural/{name}/](neural/{name}/) |")
    return lines


def _kappa_lines(kappa: dict | None) -> list[str]:
    """TABLE.md's kappa study (none without it)."""
    lines = []
    if kappa:
        lines += ["", "ISAN word-level attribution (kappa) at the main verb after a relative clause: "
                  "the plural-minus-singular verb logit that each earlier word contributes "
                  "(Foerster et al. 2017, eqs. 4-6):", ""]
        for ex in kappa["examples"]:
            lines.append(f"- `{ex['sentence']}` (predicting the word after `{ex['prefix'].split()[-1]}`, the "
                         f"main verb; head noun `{ex['head']}`, relative-clause noun `{ex['rc_noun']}`): "
                         + ", ".join(f"{w} {c:+.2f}" for w, c in ex["contributions"])
                         + f"; margin {ex['margin']:+.2f}; after swapping "
                         + ", ".join(f"{w}->{v['swapped_to']}: {v['margin_after_swap']:+.2f}" for w, v in ex["swaps"].items())
                         + f"; P(plural verb) = {ex['p_plural_verb']:.3f}, true {ex['true_p_plural_verb']:.3f}.")
        lines.append("")
        lines.append(f"Over {kappa['n_sentences']} test sentences of that shape: the head noun's contribution has "
                     f"the sign of its number in {kappa['head_sign_agrees']:.1%} of them, the relative clause "
                     f"noun's in {kappa['rc_sign_agrees']:.1%}; mean |head| {kappa['mean_abs_head']:.2f} against "
                     f"mean |rc noun| {kappa['mean_abs_rc']:.2f}; the model puts more mass on the correct verb "
                     f"number in {kappa['correct_number_rate']:.1%}. Swapping a noun for its other number (its "
                     f"matrix and bias together) flips the predicted number in "
                     f"{kappa['swap_head_flips_number']:.1%} of sentences for the head noun and "
                     f"{kappa['swap_rc_noun_flips_number']:.1%} for the relative clause's noun.")
    return lines


def _bundles_and_ridge_lines(bundles: list | None, ridge: list) -> list[str]:
    """TABLE.md's bundles' check and ridge check (none without them)."""
    lines = []
    if bundles:
        lines += ["", "Bundles (run 0; `bundles/`), scored through `load_reservoir_bundle` against the direct "
                  "computation:", "", "| bundle | NNL (direct) | NNL (bundle) |", "|---|---:|---:|"]
        for b in bundles:
            lines.append(f"| {Path(b['bundle']).name} | {b['nnl_direct']:.6f} | {b['nnl_bundle']:.6f} |")
    if ridge:
        lines += ["", "ESN ridge check (run 0, n = 100, valid NNL): " + "; ".join(
            f"{r['model']} {r['ridge']:g}: {r['valid_nnl']:.4f}" for r in ridge) + "."]
    return lines


def write_table(results: Path, readme_out: Path | None = None) -> dict:
    """TABLE.md, table.json and fig1.png from the committed logs under ``results``."""
    results = Path(results)
    table, ent = _table_data(results)
    (results / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    summ, neural, H = table["fig1"], table["neural"], table["entropy_nnl"]
    lines = (_data_lines(ent, table) + _fig1_lines(summ) + _claims_lines(table["claims"]) + _neural_lines(neural)
             + _kappa_lines(table["kappa"]) + _bundles_and_ridge_lines(table["bundles"], table["ridge_check"]))
    (results / "TABLE.md").write_text("\n".join(lines) + "\n")
    chosen = {}  # per kind, the run with the best valid NNL (the one the figure shows)
    for k, r in neural.items():
        if r.get("kind") not in chosen or r["valid_nnl"] < neural[chosen[r["kind"]]]["valid_nnl"]:
            chosen[r.get("kind")] = k
    table["chosen_on_valid"] = chosen
    (results / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    plot_fig1(summ, H, results / "fig1.png", {neural[k].get("label", k) + " (test)": neural[k]["test_nnl"]
                                              for k in chosen.values()})
    return table


def plot_fig1(summ: dict, H: float, path: Path, trained: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), dpi=90)
    style = {"esn-paper": ("C0", "-"), "esn+-paper": ("C1", "-"), "esn-paper-tf": ("C0", "--"),
             "esn+-paper-tf": ("C1", "--"), "esn": ("0.6", ":"), "esn+": ("0.35", ":"),
             "npm-u": ("C2", "-"), "npm-u+eq6": ("C3", "-"), "npm-t-ekf": ("C4", "-"), "npm-u+": ("0.6", ":"),
             "npm-t": ("0.35", ":")}
    for ax, group, xl in ((axes[0], "esn", "reservoir units n"), (axes[1], "npm", "contexts M")):
        for m in ALL_MODELS:
            if not m.startswith(group) or m not in summ:
                continue
            s = sorted(summ[m])
            mu = np.array([summ[m][k]["mean"] for k in s])
            sd = np.array([summ[m][k]["std"] for k in s])
            runs = sorted({summ[m][k]["runs"] for k in s})
            c, ls = style.get(m, (None, "-"))
            ax.errorbar(s, mu, yerr=sd, marker="o", ms=3, capsize=2, color=c, ls=ls,
                        label=f"{LABELS[m]} ({'/'.join(map(str, runs))} runs)")
        ax.axhline(H, color="k", ls="--", lw=1, label=f"H = {H:.3f}")
        for (name, v), c in zip(sorted((trained or {}).items()), ("tab:red", "tab:purple", "tab:brown", "tab:gray")):
            ax.axhline(v, color=c, ls=":", lw=1.2, label=f"{name} {v:.3f}")
        ax.set_xscale("log")
        ax.set_ylim(H - 0.03, 1.0)  # an ESN run with its own output fed back can blow up: clipped, see TABLE.md
        ax.set_xlabel(xl)
        ax.set_ylabel("test NNL (base 24)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("(a) ESN / ESN+ (solid: the paper's, own output fed back; dashed: teacher-forced feedback;\n"
                      "dotted grey: our first). y clipped at 1.0", fontsize=9)
    axes[1].set_title("(b) NPM-U / NPM-U+ / NPM-T (dotted grey: our first)", fontsize=9)
    fig.suptitle("Elman's grammar (Čerňanský et al. 2008, Fig. 1a-b): test NNL against model size, mean ± std over runs",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
