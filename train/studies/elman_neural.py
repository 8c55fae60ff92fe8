"""The trained models of the Elman study: scoring an ISAN or LSTM run (trained by ``isan train ...
--alphabet words`` on the study's text files) on the test set, and the ISAN's word-level kappa at
the main verb after a relative clause.

Scoring uses the engine's numpy references (:func:`isan.engine.reference.score_ref`,
:func:`isan.engine.baselines.recurrent.baseline_score_ref`) over the test stream from the model's initial
state, the same convention as every other model of the study (the state before a word predicts it).

Kappa (Foerster et al. 2017, eqs. 4-6; docs/ARCHITECTURE.md, 'The model and its conventions'):
``kappa[t, s] = W_ro (W[x_t] ... W[x_{s+1}]) b[x_s]``; with a word alphabet every token is a word,
so token attribution is word attribution. At the main verb of
``N1 who N2 V2 V1 ...`` (an object relative whose noun N2 differs from the head N1 in number), the
verb must agree with N1, while the nearest noun, and the verb just before, have the other number.
For each source word we report its contribution to ``mean(logits of plural verbs) - mean(logits of
singular verbs)`` (the margin): positive pushes towards a plural main verb. Kappa credits a word's
*bias* carried forward; a noun also acts through its *matrix* on everything before it (the sentence
start's carried bias included), so we also swap each noun for its other number and report whether
the sign of the margin flips (the noun's whole effect; the relative clause's verb is swapped with its
noun, so the prefix stays grammatical).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from isan.train.tasks import elman as EG

PLURAL_VERBS = tuple(v for v in EG.VERBS)
SINGULAR_VERBS = tuple(v + "s" for v in EG.VERBS)
PLURAL_NOUNS = tuple(n + "s" for n in EG.NOUNS)
SINGULAR_NOUNS = tuple(EG.NOUNS) + EG.PROPER
EXAMPLES = ("boys who girl chases see dog .", "girl who boys chase sees dog .",
            "dogs who cat feeds walk .", "cat who dogs hear lives .")


def _load(run_dir: Path):
    from isan.params import load_tensors
    from isan.tokens import alphabet_from_json

    cfg = json.loads((run_dir / "config.json").read_text())
    alphabet = alphabet_from_json(cfg["alphabet"])
    t = load_tensors(run_dir / "best.safetensors")
    return cfg, alphabet, t


def score_run(run_dir: Path, label: str = "", command: str = "") -> dict:
    """Test NNL and bits per word of a trained run's best checkpoint; valid too."""
    from isan.engine.baselines.recurrent import BaselineParams, baseline_score_ref
    from isan.engine.reference import score_ref
    from isan.params import ISANParams

    cfg, alphabet, t = _load(run_dir)
    kind = cfg["model"]["kind"]
    data = EG.study_data()
    out = {"label": label, "kind": kind, "d": cfg["model"]["d"], "n_params": cfg.get("n_params"),
           "run_dir": str(run_dir), "command": command, "alphabet_size": len(alphabet)}
    for split in ("valid", "test"):
        ids = alphabet.encode(EG.to_text(data[split]))
        if kind == "isan":
            p = ISANParams(**{n: t[n].astype(np.float64) for n in ("W", "b", "W_ro", "b_ro", "h0")})
            bits, _ = score_ref(p, ids, p.h0)
        else:
            p = BaselineParams.from_tensors(cfg["model"], t)
            bits, _ = baseline_score_ref(p, ids, p.initial_state())
        b = float(bits.mean())
        out[f"{split}_bits_per_word"] = b
        out[f"{split}_nnl"] = b / math.log2(len(alphabet))
        out[f"{split}_words"] = int(len(ids))
    log = [json.loads(x) for x in (run_dir / "train_log.jsonl").read_text().splitlines() if x.strip()]
    done = [e for e in log if e.get("event") == "done"]
    if done:
        out["train"] = {k: done[-1].get(k) for k in ("stop_reason", "step", "chars_seen", "best_valid_bpc",
                                                     "best_epoch", "train_chars_per_s")}
    return out


def _sentence_kappa(p, alphabet, sentence: str, verb_pos: int) -> dict:
    """Contributions (word, plural-minus-singular verb logit) at the word ``verb_pos`` of ``sentence``
    (run from the model's h0 after a sentence end ``.``)."""
    from isan.engine.reference import kappa_ref, log_softmax

    words = [EG.END] + sentence.split()
    ids = alphabet.encode(" ".join(words))
    m = verb_pos + 1  # index in ids of the main verb
    K = kappa_ref(p, ids[:m])  # rows: logits after each of ids[0..m-1]
    row = K[m - 1]  # (m + 1 sources, V): contributions to the logits predicting ids[m]
    pl = [alphabet.id(v) for v in PLURAL_VERBS]
    sg = [alphabet.id(v) for v in SINGULAR_VERBS]
    contrib = row[:, pl].mean(1) - row[:, sg].mean(1)  # (m + 1,)
    logits = row.sum(0) + p.b_ro
    from isan.engine.reference import logits_ref, states_ref

    direct = logits_ref(p, states_ref(p, ids[:m], p.h0)[-1:])[0]  # the model's own logits there
    prob = np.exp(log_softmax(logits))
    labels = ["h0"] + words[:m]
    oracle = EG.NextWordOracle()
    b = oracle.start()
    for w in words[1:m]:
        b = oracle.advance(b, w)
    true = oracle.distribution(b)
    tp = sum(true[EG.SYMBOLS.index(v)] for v in PLURAL_VERBS)
    ts = sum(true[EG.SYMBOLS.index(v)] for v in SINGULAR_VERBS)
    pp, ps = float(prob[pl].sum()), float(prob[sg].sum())

    def margin(ws):  # plural-minus-singular verb logit after ". ws" (the model's own logits)
        x = alphabet.encode(" ".join([EG.END] + ws))
        lg = logits_ref(p, states_ref(p, x, p.h0)[-1:])[0]
        return float(lg[pl].mean() - lg[sg].mean())

    base = margin(words[1:m])
    swaps = {}
    for k in (1, 3):  # the head noun and the relative clause's noun (positions in ". N1 who N2 V2")
        other = _other_number(words[k])
        if other is not None:
            ws = list(words[1:m])
            ws[k - 1] = other
            if k == 3:  # keep the relative clause grammatical: its verb agrees with its noun
                ws[3] = ws[3][:-1] if ws[3] in SINGULAR_VERBS else ws[3] + "s"
            swaps[words[k]] = {"swapped_to": " ".join(ws[k - 1:k + 1]) if k == 3 else other,
                               "margin_after_swap": margin(ws)}
    return {"sentence": sentence, "prefix": " ".join(words[1:m]), "labels": labels,
            "contributions": [(w, float(c)) for w, c in zip(labels, contrib)],
            "margin": base, "swaps": swaps, "p_plural_verb": pp / max(pp + ps, 1e-300), "true_p_plural_verb": tp / max(tp + ts, 1e-300),
            "kappa_sum_minus_logits_max_abs": float(np.abs(logits - direct).max())}


def _other_number(w: str) -> str | None:
    if w in EG.NOUNS:
        return w + "s"
    if w in PLURAL_NOUNS:
        return w[:-1]
    return None


def kappa_study(run_dir: Path, max_sentences: int = 2000) -> dict:
    """Kappa at the main verb of ``N1 who N2 V2 V1`` sentences (N1, N2 of different number)."""
    from isan.params import ISANParams

    cfg, alphabet, t = _load(run_dir)
    if cfg["model"]["kind"] != "isan":
        raise ValueError(f"{run_dir} holds a {cfg['model']['kind']} model; kappa needs an ISAN")
    p = ISANParams(**{n: t[n].astype(np.float64) for n in ("W", "b", "W_ro", "b_ro", "h0")})
    examples = []
    for s in EXAMPLES:
        EG.check_grammatical(s.split())
        r = _sentence_kappa(p, alphabet, s, 4)
        w = s.split()
        r.update(head=w[0], rc_noun=w[2])
        examples.append(r)
    agree_head = agree_rc = correct = head_flips = rc_flips = n_head = n_rc = 0
    abs_head, abs_rc = [], []
    n = 0
    verbs = set(PLURAL_VERBS) | set(SINGULAR_VERBS)
    nouns = set(PLURAL_NOUNS) | set(SINGULAR_NOUNS)
    for sent in EG.study_data()["test"]:
        if n >= max_sentences:
            break
        if len(sent) < 6 or sent[1] != "who" or sent[0] not in nouns or sent[2] not in nouns:
            continue
        if sent[3] not in verbs or sent[4] not in verbs:
            continue
        n1pl, n2pl = sent[0] in PLURAL_NOUNS, sent[2] in PLURAL_NOUNS
        if n1pl == n2pl:
            continue
        r = _sentence_kappa(p, alphabet, " ".join(sent), 4)
        c = dict(enumerate(x[1] for x in r["contributions"]))
        head, rc = c[2], c[4]  # sources: h0, ".", N1, who, N2, V2
        agree_head += (head > 0) == n1pl
        agree_rc += (rc > 0) == n2pl
        abs_head.append(abs(head))
        abs_rc.append(abs(rc))
        correct += (r["p_plural_verb"] > 0.5) == n1pl
        sw = r["swaps"]
        if sent[0] in sw:
            head_flips += (sw[sent[0]]["margin_after_swap"] > 0) != (r["margin"] > 0)
            n_head += 1
        if sent[2] in sw:
            rc_flips += (sw[sent[2]]["margin_after_swap"] > 0) != (r["margin"] > 0)
            n_rc += 1
        n += 1
    return {"run_dir": str(run_dir), "examples": examples, "n_sentences": n,
            "head_sign_agrees": agree_head / max(n, 1), "rc_sign_agrees": agree_rc / max(n, 1),
            "mean_abs_head": float(np.mean(abs_head)) if n else None,
            "mean_abs_rc": float(np.mean(abs_rc)) if n else None, "correct_number_rate": correct / max(n, 1),
            "swap_head_flips_number": head_flips / max(n_head, 1), "swap_rc_noun_flips_number": rc_flips / max(n_rc, 1),
            "swap_counts": {"head": n_head, "rc_noun": n_rc},
            "measure": "mean logit of plural verbs minus mean logit of singular verbs, per source word"}
