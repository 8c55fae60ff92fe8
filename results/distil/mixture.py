"""Valid bpc of the shipped models and of their mixtures, measured as the ensemble teacher was (results/distil/
README.md, "A better teacher"): ``train/distill.py``'s ``teacher_log_probs`` over text8-10M's valid split, cut
into 100 contiguous pieces each read after 256 characters of warm-up from h0, the mixture ``q = (1/M) sum_m q_m``;
bits a character of the true next character under q (the stored float16 log-probabilities, as training reads
them). From the repository root (one thread, about a minute):

    OMP_NUM_THREADS=1 python results/distil/mixture.py [--data ../shared/data/text8_head/text8_head.txt] \
        [--out results/distil/mixture.json]

The d = 128 model of results/frontier was not kept (only its log), so mixtures with it cannot be measured here.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from isan.atomic import write_json_atomic
from isan.train.data import load_corpus
from isan.train.distill import load_teacher, teacher_log_probs

#: the four shipped models, in the order the README adds them to the mixture
MODELS = ["text8-d320-stable", "text8-d216-distil", "text8-d216-stable", "text8-d216-unconstrained"]
STREAMS, WARMUP = 100, 256


def bits(logq: np.ndarray, ids: np.ndarray) -> float:
    """Bits a character of ``ids`` under the (N, V) natural-log probabilities ``logq``."""
    return float(-logq[np.arange(len(ids)), ids].astype(np.float64).mean() / math.log(2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/text8_head/text8_head.txt")
    ap.add_argument("--out", default="results/distil/mixture.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    corpus = load_corpus(args.data, "text8")
    ids = corpus.valid
    imap = getattr(corpus.alphabet, "input_map", None)
    teachers = []
    for name in MODELS:
        manifest, model, _ = load_teacher(Path("isan/models") / name)
        teachers.append((name, manifest["params_sha256"], model))
    t0 = time.perf_counter()
    logqs = {name: teacher_log_probs(model, ids, input_map=imap, streams=STREAMS, warmup=WARMUP)
             for name, _, model in teachers}
    members = {name: bits(q, ids) for name, q in logqs.items()}
    mixtures = []
    for m in range(2, len(MODELS) + 1):
        names = MODELS[:m]
        q = teacher_log_probs([model for _, _, model in teachers[:m]], ids, input_map=imap, streams=STREAMS,
                              warmup=WARMUP)
        mixtures.append({"models": names, "valid_bpc": bits(q, ids)})
    out = {
        "what": "valid bpc under teacher_log_probs (train/distill.py): text8-10M valid split, 100 pieces each "
                "after 256 characters of warm-up, float16 log-probabilities; a mixture is the mean of the "
                "members' distributions",
        "command": "OMP_NUM_THREADS=1 python results/distil/mixture.py",
        "split": "valid", "chars": int(len(ids)), "streams": STREAMS, "warmup": WARMUP,
        "params_sha256": {name: sha for name, sha, _ in teachers},
        "members": members,
        "mixtures": mixtures,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_json_atomic(args.out, out)
    print(json.dumps({"members": members, "mixtures": [(len(x["models"]), round(x["valid_bpc"], 4)) for x in mixtures]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
