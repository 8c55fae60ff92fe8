"""The GRU saturation diagnostic of Table 1's notes (train/studies/saturation.py) against the
baseline reference scorer."""

from pathlib import Path

import numpy as np
import pytest

from isan.engine.baselines.recurrent import baseline_score_ref, load_baseline_bundle
from isan.train.studies.saturation import gru_slice_stats

GRU = Path(__file__).resolve().parents[1] / "results" / "paper" / "models" / "gru-3.2e5"


def test_gru_slice_stats_matches_the_reference(text8_valid_head):
    if not GRU.is_dir():
        pytest.skip("the committed 3.2e5 GRU bundle is missing")
    text = text8_valid_head[:300]
    out = gru_slice_stats(str(GRU), text)
    _, p, alphabet = load_baseline_bundle(GRU)
    ids = np.array([alphabet.symbols.index(c) for c in text])
    bits, _ = baseline_score_ref(p, ids, p.initial_state())
    assert out["chars"] == 300 and out["bpc"] == pytest.approx(bits.mean(), rel=1e-12)
    assert 0.0 <= out["saturated"] <= 1.0 and 0.0 < out["z_mean"] < 1.0
