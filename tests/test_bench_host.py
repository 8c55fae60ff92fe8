"""`isan bench host`: the host side of the torch path with a device that takes no time.

The benchmark's double (:func:`isan.bench.host.null_device`) is checked only for what it must not
break: it replaces the torch path's device work while it is held and puts every attribute back
after, an error or not. It is never used to check a score. The command itself runs end to end at
small sizes on the CPU device (no older isan to compare with), and its JSON has every row."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

pytest.importorskip("torch")

from isan.bench import host  # noqa: E402


def _originals() -> dict:
    """{(module, name): the object} of every attribute the null device replaces, as it is now."""
    out = {}
    for mod_name, names in host.NULL_PATCHES.items():
        mod = importlib.import_module(mod_name)
        for name in names:
            if hasattr(mod, name):
                out[mod_name, name] = getattr(mod, name)
    return out


def test_null_device_replaces_the_device_work_and_puts_it_back():
    before = _originals()
    assert ("isan.engine.kernels.torch.pipeline", "StepBlock") in before
    assert ("isan.engine.kernels.torch.streams", "max_abs") in before
    with host.null_device() as patched:
        for (mod_name, name), orig in before.items():
            now = getattr(importlib.import_module(mod_name), name)
            assert now is host.NULL_PATCHES[mod_name][name] and now is not orig
        assert sorted(patched) == sorted(f"{m}.{n}" for m, n in before)
    assert _originals() == before


def test_null_device_puts_everything_back_after_an_error():
    before = _originals()
    with pytest.raises(RuntimeError, match="inside"):
        with host.null_device():
            raise RuntimeError("raised inside")
    assert _originals() == before
    # a module that cannot be imported: what was replaced before it is put back too
    bad = {**host.NULL_PATCHES, "isan.engine.kernels.torch.no_such_module": {"StepBlock": host.NullStepBlock}}
    with pytest.raises(ImportError):
        with host.null_device(bad):
            pass
    assert _originals() == before


def test_null_block_reports_no_row_stopped():
    import torch

    Hall, act = torch.zeros((5, 4)), torch.arange(3)
    block = host.NullStepBlock(None, None, Hall, act, 0, None, None, None, 0, 64, 1e4, n_steps=17)
    assert block.run(None).tolist() == [17, 17, 17] and int(block.kept) == 0
    rows = torch.tensor([[3.0, -7.0, 1.0], [0.5, 2.0, 0.0]])  # a state row ends in 1, an error row in 0
    assert host.null_max_abs(rows, 1).tolist() == [1.0, 0.0]


def test_bench_host_quick_on_the_cpu_device(tmp_path, text8_path):
    from click.testing import CliRunner

    from isan.cli import main

    import torch

    out = tmp_path / "host.json"
    threads = torch.get_num_threads()
    res = CliRunner().invoke(main, ["bench", "host", "--quick", "--device", "cpu", "--data", str(text8_path),
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert torch.get_num_threads() == threads  # one thread while it measured, and put back
    r = json.loads(out.read_text())
    assert r["after"]["torch"]["threads"] == host.CPU_TORCH_THREADS
    assert r["benchmark"] == "isan bench host" and r["device"] == "cpu" and r["before"] is None
    assert r["command"].startswith("isan ") and r["machine"]["cores"] >= 1
    assert r["model"]["params_sha256"] == r["after"]["model"]["params_sha256"] and len(r["model"]["params_sha256"]) == 64
    assert [x["key"] for x in r["lines"]] == list(host.ROWS)
    sz = host.QUICK_SIZES
    rows = r["after"]["rows"]
    assert set(rows) == set(host.ROWS)
    assert rows["docs_one_call"]["chars"] == sz["docs"] * sz["doc_chars"]
    assert rows["docs_batches"]["chars"] == sz["batches"] * sz["docs"] * sz["doc_chars"]
    assert rows["long_ids"]["chars"] == rows["long_str"]["chars"] > 0
    assert 0 < rows["corpus"]["chars"] <= sz["docs"] * sz["doc_chars"]
    for row in rows.values():
        assert len(row["times"]) == sz["repeats"] and np.isfinite(row["chars_per_s"]) and row["chars_per_s"] > 0
    assert all(x["ratio"] is None for x in r["lines"])
    assert [t["met"] for t in r["targets"]][1:3] == [None, None]  # no before: no ratios to meet
    assert "| row | before | after | after/before |" in res.output and "wrote" in res.output


def test_before_needs_an_isan_package(tmp_path, text8_path):
    from isan.errors import IsanError

    with pytest.raises(IsanError, match="no isan package"):
        host.run_before(tmp_path, None, text8_path, "cpu", dict(host.QUICK_SIZES), log=lambda m: None)


def test_the_gpu_guide_quotes_the_committed_run():
    """docs/guide/gpu.md's "What the host sustains" and bench_results/host_epyc.md quote
    bench_results/host_epyc.json: every row's rate before and after (M chars/s, one decimal) and
    its ratio, and the commits it compared."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = json.loads((root / "bench_results" / "host_epyc.json").read_text(encoding="utf-8"))
    guide = (root / "docs" / "guide" / "gpu.md").read_text(encoding="utf-8")
    section = guide[guide.index("## What the host sustains"):]
    table = (root / "bench_results" / "host_epyc.md").read_text(encoding="utf-8")
    assert r["before"] is not None and [x["key"] for x in r["lines"]] == list(host.ROWS)
    for x in r["lines"]:
        for quoted in (f"{x['before_chars_per_s'] / 1e6:,.1f}M chars/s", f"{x['after_chars_per_s'] / 1e6:,.1f}M chars/s",
                       f"{x['ratio']:.2f}x"):
            assert quoted in section and quoted in table, (x["key"], quoted)
    for run in (r["before"], r["after"]):
        assert f"commit {run['revision']}" in section and f"commit {run['revision']}" in table
