"""The shipped model's ONNX graphs: built into the user cache on first use (the package is never written
to), checked against their recorded hashes, and rebuilt when a cached graph is damaged. The float32 graphs'
total bits within the tolerance derived from the computation (tests/tolerances.py) of the float64 reference's."""

import pytest

from isan.engine import Engine
from tolerances import bundle_float32_tolerance


def test_shipped_model_onnx_graphs_are_cached_and_verified(tmp_path, monkeypatch, text8_valid_head):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from isan.engine import default_model_path
    from isan.engine.verify import verify_all
    from isan.engine.baselines.onnx import load_onnx_engine

    monkeypatch.setenv("ISAN_CACHE_DIR", str(tmp_path / "cache"))
    text = text8_valid_head[:1500]
    eng = load_onnx_engine(default_model_path())
    graphs = eng.runner.graphs_dir
    assert graphs.parent == tmp_path / "cache" / "onnx" and (graphs / "graphs.json").is_file()
    ref = Engine.default(path_mode="reference").score(text)
    tol = bundle_float32_tolerance(default_model_path(), Engine.default().encode(text))[0].total_bits
    assert abs(eng.score(text).bits - ref.bits) <= tol
    assert not list((default_model_path()).glob("*.onnx"))      # the package is never written to
    # a damaged cached graph is noticed by its hash and rebuilt
    data = bytearray((graphs / "sequence.onnx").read_bytes())
    data[len(data) // 2] ^= 4
    (graphs / "sequence.onnx").write_bytes(bytes(data))
    assert "sequence.onnx" in verify_all(default_model_path())["onnx"]
    eng2 = load_onnx_engine(default_model_path())
    assert abs(eng2.score(text).bits - ref.bits) <= tol
    assert verify_all(default_model_path())["onnx"] == "ok"
