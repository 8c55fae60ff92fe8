"""`isan bench frontier` (issue 37): each model's exact test bpc and its speed in one process."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner


def test_frontier_of_two_models(default_engine, small_bundle, text8_path, text8_test, tmp_path):
    """The default and a small random model: the default's test bpc is the engine's (read, not
    copied), the small model has no certificate, ratios are against the first, and the table, JSON
    and plot are written."""
    from isan.cli import main
    from isan.engine import default_model_path

    out, png = tmp_path / "frontier.json", tmp_path / "frontier.png"
    r = CliRunner().invoke(main, ["bench", "frontier", "--models", f"{default_model_path()},{small_bundle}",
                                  "--data", str(text8_path), "--repeats", "1", "--long-chars", "20000",
                                  "--no-kenlm", "--out", str(out), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    big, small = res["rows"]
    assert (big["d"], small["d"]) == (default_engine.d, 16)
    want = default_engine.score(default_engine.encode(text8_test), normalize="none").bpc
    assert np.isclose(big["test_bpc"], want, rtol=1e-12)
    assert big["rho"] is not None and big["rho"] < 1 and small["rho"] is None
    assert big["speed_vs_first"] == 1.0 and small["speed_vs_first"] > 0
    assert all(x["chars_per_s"] > 0 and x["chars_per_s_1_thread"] > 0 for x in res["rows"])
    assert res["long_chars"] == 20_000 and res["kenlm"] is None
    assert f"| {default_model_path().name} | {default_engine.d} |" in r.output and "| small | 16 |" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_frontier_names_a_bad_bundle(tmp_path, text8_path):
    from isan.cli import main

    r = CliRunner().invoke(main, ["bench", "frontier", "--models", str(tmp_path / "nope"), "--data", str(text8_path),
                                  "--no-kenlm"])
    assert r.exit_code != 0 and "nope" in r.output and "Traceback" not in r.output
