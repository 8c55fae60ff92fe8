"""Every model shipped in the package (isan/models/*; issue 37): its files verify, it has a card and a
training log, its scores equal the float64 reference on real text, its attribution is exact, and the
server and the paper's analyses run on it. A stable model carries a certificate that holds."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from isan.engine import Engine
from isan.engine.bundle import verify_bundle
from isan.engine.reference import score_ref, states_ref
from tolerances import U64, gamma, isan_float32_tolerance, readout_tolerance

MODELS = Path(__file__).resolve().parents[1] / "isan" / "models"
SHIPPED = sorted(p for p in MODELS.iterdir() if (p / "manifest.json").is_file())


def test_the_default_is_among_them():
    from isan.engine import default_model_path

    assert default_model_path().resolve() in [p.resolve() for p in SHIPPED] and len(SHIPPED) >= 2


@pytest.fixture(scope="module", params=SHIPPED, ids=[p.name for p in SHIPPED])
def shipped(request):
    return request.param, Engine.load(request.param, progress_bar=False)


def test_files_card_and_log(shipped):
    path, eng = shipped
    assert verify_bundle(path)["verified"]
    card = (path / "MODEL_CARD.md").read_text()
    assert f"d = {eng.d}" in card and path.name in card
    log = [json.loads(line) for line in (path / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "start" and any(e["event"] == "valid" for e in log)
    if "stable" in path.name or eng.manifest.get("certificate"):  # the distilled default is certified too
        cert = eng.certificate()
        assert cert is not None and cert["rho"] < 1


def test_scores_equal_the_reference(shipped, text8_valid_head):
    path, eng = shipped
    text = text8_valid_head[:3000]
    ids = eng.encode(text)
    got = eng.score(text, per_char=True, normalize="none")
    p64 = type(eng.params)(**{n: np.asarray(v, dtype=np.float64) for n, v in eng.params.as_dict().items()})
    want, _ = score_ref(p64, ids, p64.h0)
    tol = isan_float32_tolerance(p64.W, p64.b, p64.W_ro, p64.b_ro, p64.h0, ids, samples=4)  # tests/tolerances.py
    np.testing.assert_allclose(got.per_char_bits, want, rtol=0, atol=tol.bits)


def test_attribution_server_and_analysis(shipped, tmp_path):
    path, eng = shipped
    a = eng.attribute("the annual revenue", by="word")
    # both in float64: the scan's derived tolerance carried to u64 (tests/tolerances.py), its readout, and
    # Higham's worst case for the sum of the sources, for each of the two
    p, ids = eng.params.astype(np.float64), eng.encode("the annual revenue")
    state = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, ids).in_precision(U64).state
    one = readout_tolerance(p.W_ro, p.b_ro, states_ref(p, ids, p.h0), state, u=U64)
    one += gamma(len(ids) + 1, U64) * np.abs(a.kappa).sum(1).max()
    np.testing.assert_allclose(a.b_ro + a.kappa.sum(axis=1), a.logits, rtol=0, atol=2 * one)
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    from isan.engine.serve import create_app

    client = TestClient(create_app(eng))
    r = client.post("/v1/attribute", json={"text": "the annual reve", "by": "word"})
    assert r.status_code == 200, r.text
    r = client.post("/v1/score", json={"text": "the annual revenue"})
    assert r.status_code == 200 and r.json()["bpc"] == pytest.approx(eng.score("the annual revenue").bpc, rel=1e-6)
    from click.testing import CliRunner

    from isan.cli import main

    r = CliRunner().invoke(main, ["analyze", "words", "--model", str(path), "--compare", "none", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert list(tmp_path.glob("*.json")) and list(tmp_path.glob("*.png"))
