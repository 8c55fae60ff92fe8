"""How saturated a trained GRU's hidden units are, and its bits on a train and a valid slice.

A diagnostic of Table 1's 1.28e6 GRU (issue #26, results/table1/notes/README.md). Reads a baseline
bundle (``isan export RUN BUNDLE --no-table``), runs the float64 numpy reference
(:func:`isan.engine.baselines.recurrent.baseline_states_ref`) from h0 over ``--chars``
characters of the train split (from offset 2,000,000) and of the valid split (from its start),
and prints JSON per slice: bits per character, the share of hidden units with |h| > 0.99 (tanh
saturated: their gradient is under 2% of its largest), and the mean update gate z.

Usage (from the repository root)::

    python -m isan.train.studies.saturation BUNDLE [BUNDLE ...] [--data text8_head.txt] [--chars 30000]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from isan.data import read_text8_split
from isan.engine.baselines.recurrent import sigmoid, baseline_states_ref, bits_from_logits, load_baseline_bundle

#: |h| above this counts as saturated (1 - tanh^2 < 0.02)
SATURATED = 0.99


def gru_slice_stats(bundle: str, text: str) -> dict:
    """{"chars", "bpc", "saturated", "z_mean"} of a GRU bundle over ``text`` from h0."""
    _, p, alphabet = load_baseline_bundle(bundle)
    if p.kind != "gru":
        raise SystemExit(f"{bundle} is a {p.kind} bundle; this diagnostic reads GRUs")
    ids = alphabet.encode(text)
    h0 = p.initial_state().astype(np.float64)
    H = baseline_states_ref(p, ids, h0)  # (T, d) the states after each character
    before = np.vstack([h0[None, :], H[:-1]])  # the states each character is read from
    d, W_hh = p.d, p.tensors["W_hh"]
    z = sigmoid(p.input_table()[ids, d:2 * d] + before @ W_hh[d:2 * d].T)  # the update gates (T, d)
    return {"chars": len(ids), "bpc": float(bits_from_logits(p.readout(before), ids).mean()),
            "saturated": float((np.abs(H) > SATURATED).mean()), "z_mean": float(z.mean())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--data", default="../shared/data/text8_head/text8_head.txt")
    ap.add_argument("--chars", type=int, default=30_000)
    a = ap.parse_args(argv)
    train, valid = read_text8_split(a.data, "train"), read_text8_split(a.data, "valid")
    slices = {"train@2000000": train[2_000_000 : 2_000_000 + a.chars], "valid@0": valid[: a.chars]}
    out = {b: {name: gru_slice_stats(b, text) for name, text in slices.items()} for b in a.bundles}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
