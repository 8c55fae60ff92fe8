"""Golden scores (issue 46): real texts scored through every CPU path and kernel backend, compared
with a committed file, so that a refactor of the engine changes no output.

Texts (from ``../shared/data``): a slice of the text8-10M test split, of Tiny Shakespeare and of
WikiText-2's test file (a few thousand characters each, through the model's normaliser), and a
longer text8 slice that the composed path scores chunk-parallel. Each goes through the default
model on the paths ``composed``, ``chunked``, ``jumps`` and ``reference``, on the native kernels
and on their numpy twins (``kernels="numpy"`` with ``ISAN_KERNELS=numpy``, so the sequential
composed kernel runs its twin too): per-character bits, totals, final states and the scoring
report; a streamed call (the text in two pieces, the state carried); ``score_batch`` of all the
texts; and the attribution of a short piece by character and by word (the kappa sum check).

Tolerances: the float64 reference path and the attribution (numpy float64) to 1e-12 relative; the
float32 paths within tolerances derived for each text from the computation (tests/tolerances.py):
per-character bits within the float32 tolerance of the golden float64 reference; totals and final
states within twice it of their own golden float32 values (written on another machine, in another
summation order). Reports (path, chunk counts, fallbacks, character counts) must be equal, their
floats (the residual a correction stopped at) within the float32 state tolerance relative.

Write the file again (only when an output is meant to change, and say so in the commit):
``ISAN_GOLDEN_WRITE=1 python -m pytest -q tests/test_golden_scores.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA, need
from tolerances import F32Tolerance, isan_float32_tolerance

GOLDEN = Path(__file__).resolve().parent / "golden" / "scores_text8-d216-distil.json"
WRITE = os.environ.get("ISAN_GOLDEN_WRITE") == "1"
PATHS = ("composed", "chunked", "jumps", "reference")
KERNELS = ("native", "numpy")
REF_RTOL = 1e-12
ATTR_CHARS = 300


def golden_texts() -> dict[str, str]:
    """The texts, by name: slices of the shared data (raw; the engine normalises them)."""
    from isan.data import read_text8_split

    text8 = read_text8_split(need(DATA / "text8_head" / "text8_head.txt"), "test")
    shakespeare = need(DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    wiki = need(DATA / "wikitext2" / "test.txt").read_text(encoding="utf-8")
    return {"text8": text8[10_000:13_000], "shakespeare": shakespeare[5_000:8_000], "wikitext2": wiki[2_000:5_000],
            "text8_long": text8[100_000:112_000]}


def _result(r, per_char: bool) -> dict:
    out = {"chars": r.chars, "bits": r.bits, "h": r.state.h.tolist(), "scoring": r.scoring}
    if per_char:
        out["per_char_bits"] = r.per_char_bits.tolist()
    return out


def measure(engine) -> dict:
    """Everything the golden file holds for one engine (one kernel backend, every path)."""
    texts = golden_texts()
    out: dict = {}
    for path in PATHS:
        eng = engine.with_path(path)
        res: dict = {}
        for name, text in texts.items():
            r = eng.score(text, per_char=name != "text8_long", threads=2)
            res[name] = _result(r, name != "text8_long")
            half = len(text) // 2
            a = eng.score(text[:half], threads=2)
            b = eng.score(text[half:], state=a.state, threads=2)
            res[name]["stream"] = {"chars": b.state.chars, "bits": b.state.bits, "h": b.state.h.tolist()}
        batch = eng.score_batch(list(texts.values()), threads=2)
        res["batch"] = [{"chars": r.chars, "bits": r.bits, "h": r.state.h.tolist(), "scoring": r.scoring}
                        for r in batch]
        out[path] = res
    return out


def attributions(engine) -> dict:
    text = golden_texts()["text8"][:ATTR_CHARS]
    out = {}
    for by in ("char", "word"):
        a = engine.attribute(text, by=by)
        out[by] = {"sources": a.sources, "kappa_sum": a.kappa.sum(axis=(0, 2)).tolist(),
                   "logits_sum": float(a.logits.sum()), "check_error_ok": bool(a.max_abs_error <= 1e-6)}
    return out


@pytest.fixture(scope="module")
def golden() -> dict:
    if WRITE:
        return {}
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing: write it with ISAN_GOLDEN_WRITE=1 python -m pytest {__file__}")
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def measured(default_engine, monkeypatch_module) -> dict:
    from isan.engine import Engine

    out = {"native": measure(default_engine), "attribution": attributions(default_engine)}
    monkeypatch_module.setenv("ISAN_KERNELS", "numpy")
    out["numpy"] = measure(Engine.default(kernels="numpy"))
    monkeypatch_module.delenv("ISAN_KERNELS")
    if WRITE:  # per-character bits are kept for the reference path only (float32 paths are checked against it)
        slim = json.loads(json.dumps(out))
        for k in KERNELS:
            for path in PATHS:
                for name, r in slim[k][path].items():
                    if isinstance(r, dict) and (path != "reference" or k != "native"):
                        r.pop("per_char_bits", None)
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(slim, indent=0, sort_keys=True) + "\n")
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def close_rel(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * max(abs(want), 1e-300)


@pytest.fixture(scope="module")
def tols(default_engine) -> dict[str, F32Tolerance]:
    """The float32 tolerances of each golden text on the default model (tests/tolerances.py)."""
    p = default_engine.params
    return {name: isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, default_engine.prepare(text).ids)
            for name, text in golden_texts().items()}


def same_report(got: dict | None, want: dict | None, where: str) -> None:
    """Reports equal: the same keys and values, floats (the residual a correction stopped at: a ratio of
    float32 state errors, whose last digits depend on the summation order) within 1e-5 relative."""
    if want is None or got is None:
        assert got == want, where
        return
    assert sorted(got) == sorted(want), where
    for k, w in want.items():
        if isinstance(w, float):
            assert close_rel(got[k], w, 1e-5), f"{where}: {k}"
        else:
            assert got[k] == w, f"{where}: {k}"


def check_one(got: dict, want: dict, ref: dict | None, path: str, where: str, tol: F32Tolerance) -> None:
    assert got["chars"] == want["chars"], where
    same_report(got.get("scoring"), want.get("scoring"), where)
    hg, hw = np.array(got["h"]), np.array(want["h"])
    if path == "reference":
        assert close_rel(got["bits"], want["bits"], REF_RTOL), where
        np.testing.assert_allclose(hg, hw, rtol=REF_RTOL, atol=REF_RTOL * np.abs(hw).max(), err_msg=where)
        if ref is not None and "per_char_bits" in got:
            np.testing.assert_allclose(got["per_char_bits"], ref["per_char_bits"], rtol=REF_RTOL, atol=0,
                                       err_msg=where)
        return
    assert abs(got["bits"] - want["bits"]) <= tol.twice().total(got["chars"]), where
    np.testing.assert_allclose(hg, hw, rtol=0, atol=tol.twice().state, err_msg=where)
    if ref is not None and "per_char_bits" in got:
        np.testing.assert_allclose(got["per_char_bits"], ref["per_char_bits"], atol=tol.bits, rtol=0,
                                   err_msg=where)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("path", PATHS)
def test_scores_equal_the_golden_file(measured, golden, tols, kernels, path):
    """Every text (whole, streamed in two pieces, and in one batch) on this path and backend."""
    if WRITE:
        pytest.skip(f"wrote {GOLDEN}")
    got, want = measured[kernels][path], golden[kernels][path]
    ref = golden["native"]["reference"]
    for name in golden_texts():
        where = f"{kernels} {path} {name}"
        check_one(got[name], want[name], ref[name], path, where, tols[name])
        s_got, s_want = got[name]["stream"], want[name]["stream"]
        check_one({**s_got, "scoring": None}, {**s_want, "scoring": None}, None, path, where + " streamed", tols[name])
    assert len(got["batch"]) == len(want["batch"])
    for i, (g, w, tol) in enumerate(zip(got["batch"], want["batch"], tols.values())):
        check_one(g, w, None, path, f"{kernels} {path} batch text {i}", tol)


def test_attribution_equals_the_golden_file(measured, golden):
    """Attribution by character and by word: the same sources, kappa sums to 1e-12 relative, and
    the check ``b_ro + sum kappa = logits`` held."""
    if WRITE:
        pytest.skip(f"wrote {GOLDEN}")
    for by in ("char", "word"):
        got, want = measured["attribution"][by], golden["attribution"][by]
        assert got["sources"] == want["sources"]
        assert got["check_error_ok"] and want["check_error_ok"]
        scale = np.abs(want["kappa_sum"]).max()
        np.testing.assert_allclose(got["kappa_sum"], want["kappa_sum"], rtol=REF_RTOL, atol=REF_RTOL * scale)
        assert close_rel(got["logits_sum"], want["logits_sum"], REF_RTOL)
