"""Every benchmark result under bench_results/ names the model it measured: a top-level ``model`` that is
the model's ``params_sha256`` (64 hex digits) or a record holding it, and, where the record names a shipped
bundle (``source`` or ``name``), that bundle's own ``params_sha256``. The files that measure no single
trained model are listed in :data:`NO_MODEL`, each with the reason and what it names instead."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench_results"
MODELS = ROOT / "isan" / "models"
SHA256 = re.compile(r"[0-9a-f]{64}")


def _rows_name_kind_and_size(result: dict) -> bool:
    return all(r.get("model") and r.get("params") for r in result["rows"])


def _rows_name_shipped_models(result: dict) -> bool:
    return all(r.get("model") and SHA256.fullmatch(r.get("params_sha256") or "") for r in result["rows"])


def _readme_names_commit(result: dict) -> bool:
    readme = (RESULTS / "xeon_tiles" / "README.md").read_text(encoding="utf-8")
    return re.search(r"\bcommit [0-9a-f]{7}", readme) is not None


#: files without a top-level model: (the reason, a check of what the file names instead)
NO_MODEL = {
    "train.json": ("`isan bench train` times training steps of freshly initialised models of every kind and "
                   "budget; no trained model runs. Each row names its kind and parameter count.",
                   _rows_name_kind_and_size),
    "gpu_h200/run1/gpu_train.json": ("`isan bench train` on the GPU, as train.json.", _rows_name_kind_and_size),
    "gpu_h200/run2/gpu_train.json": ("`isan bench train` on the GPU, as train.json.", _rows_name_kind_and_size),
    "gpu_h200/run3/gpu_train.json": ("`isan bench train` on the GPU, as train.json.", _rows_name_kind_and_size),
    "frontier_epyc.json": ("`isan bench frontier` measures several models, one a row: each row names its bundle "
                           "and params_sha256.", _rows_name_shipped_models),
    "xeon_tiles/xeon_tiles.json": ("a one-off script's output (xeon_tiles/xeon.py), kept unedited: it times the "
                                   "kernel tiles on the default model of the commit its README names, but does "
                                   "not record the model itself.", _readme_names_commit),
}


def _results() -> list[str]:
    return sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*.json"))


def _sha_of(model) -> str | None:
    return model if isinstance(model, str) else model.get("params_sha256") if isinstance(model, dict) else None


def _shipped(model) -> Path | None:
    """The shipped bundle a model record names (by ``name`` or the last part of ``source``), if any."""
    if not isinstance(model, dict):
        return None
    name = model.get("name") or Path(str(model.get("source") or "")).name
    return MODELS / name if name and (MODELS / name / "manifest.json").is_file() else None


@pytest.mark.parametrize("rel", _results())
def test_bench_result_names_its_model(rel):
    result = json.loads((RESULTS / rel).read_text(encoding="utf-8"))
    if rel in NO_MODEL:
        reason, names_instead = NO_MODEL[rel]
        assert result.get("model") is None, f"{rel} names its model now: take it out of NO_MODEL"
        assert names_instead(result), f"{rel}: {reason}"
        return
    model = result.get("model")
    assert model is not None, f"bench_results/{rel} does not say which model it measured (a top-level 'model')"
    assert SHA256.fullmatch(_sha_of(model) or ""), f"bench_results/{rel}: 'model' has no params_sha256: {model!r}"
    bundle = _shipped(model)
    if bundle is not None:
        manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
        assert _sha_of(model) == manifest["params_sha256"], f"bench_results/{rel} names {bundle.name} with other parameters"


def test_the_list_of_model_less_results_is_current():
    assert set(NO_MODEL) <= set(_results()), "NO_MODEL lists a file that is gone"
    assert len(_results()) > len(NO_MODEL)


def test_the_check_fails_on_a_result_without_a_model(tmp_path, monkeypatch):
    """The check above can fail: a result like onnx.json before it recorded its model, and one whose record
    names a shipped bundle with another bundle's parameters."""
    monkeypatch.setitem(globals(), "RESULTS", tmp_path)
    (tmp_path / "onnx.json").write_text(json.dumps({"benchmark": "onnx", "models": {"isan": {}}}))
    with pytest.raises(AssertionError, match="does not say which model"):
        test_bench_result_names_its_model("onnx.json")
    (tmp_path / "onnx.json").write_text(json.dumps({"model": {"name": "text8-d216-distil", "params_sha256": "0" * 64}}))
    if (MODELS / "text8-d216-distil" / "manifest.json").is_file():
        with pytest.raises(AssertionError, match="other parameters"):
            test_bench_result_names_its_model("onnx.json")
