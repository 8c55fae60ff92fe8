"""The register tile of the compiled kernels chosen at first use (isan.engine.kernels.autotune): every
tile gives the same results as its instruction set's default, the choice is cached per CPU, build and
d (a corrupt or mismatched cache is ignored and rewritten), ISAN_KERNEL_TILE forces it, and threads
that call at once time the tiles once."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import isan.engine.kernels.autotune as at
from isan.engine.kernels import autotune_kernels, native, native_status
from isan.engine.kernels.streams import StreamModel, run_streams

nat = native()
pytestmark = pytest.mark.skipif(nat is None, reason="the compiled kernels are not built")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not chosen its tile yet, with its cache in tmp_path; the tile, the status
    and the choice restored after."""
    monkeypatch.setenv("ISAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(at.ENV, raising=False)
    before, status, done = nat.variant(), dict(at._status), at._done
    monkeypatch.setattr(at, "_done", False)
    yield tmp_path
    nat.set_isa(before)
    at._status.clear()
    at._status.update(status)
    at._done = done


def fake_timings(fast: str, calls: list | None = None):
    """A stand-in for time_variants: ``fast`` 20% faster than every other tile."""

    def timed(nat_, variants, d=216, repeats=3):
        if calls is not None:
            calls.append(list(variants))
        return {v: {"seconds": 0.8 if v == fast else 1.0, "gflops": 100.0 / (0.8 if v == fast else 1.0)}
                for v in variants}

    return timed


def candidates():
    return at._candidates(nat)


def test_variants_are_listed_and_settable():
    names = [v[0] for v in nat.variants()]
    assert names[0] == "generic_4x2"
    for v, isa, mr, nvm in nat.variants():
        assert v == f"{isa}_{mr}x{nvm}"
        nat_before = nat.variant()
        try:
            assert nat.set_isa(v) == isa and nat.variant() == v
        finally:
            nat.set_isa(nat_before)
    with pytest.raises(ValueError):
        nat.set_isa("avx512_99x9")


@pytest.mark.parametrize("pairs", [False, True])
def test_every_tile_gives_its_instruction_sets_results_bit_for_bit(default_engine, text8_test, pairs):
    """The tiles differ in how rows and columns are blocked, not in the order of any sum: the bits,
    states, stops and residuals of every tile equal the default tile's of the same instruction set
    exactly (and the default's equal the numpy twin's: tests/test_kernels.py, on every variant)."""
    model = StreamModel.from_params(default_engine.params32)
    P, L = 37, 200  # row counts that leave partial tiles for every MR
    start = np.arange(P, dtype=np.int64) * L
    length = np.full(P, L, dtype=np.int64)
    length[::7] = 13
    H0 = model.rows(np.tile(default_engine.params.h0, (P, 1)))
    if pairs:
        H0 = np.concatenate([H0, model.rows(np.tile(default_engine.params.h0 * 0.5 + 0.1, (P, 1)), bias=0.0)])
    ids = np.ascontiguousarray(default_engine.encode(text8_test[: P * L]), dtype=np.int32)
    before = nat.variant()
    out = {}
    try:
        for v, isa, _, _ in nat.variants():
            nat.set_isa(v)
            H, bits = H0.copy(), np.full(P * L, np.nan)
            r = run_streams(model, ids, start, length, H, bits, pairs=pairs, stop_ratio=1e-6 if pairs else 0.0,
                            threads=2)
            out.setdefault(isa, []).append((v, H, bits, r))
    finally:
        nat.set_isa(before)
    for isa, runs in out.items():
        v0, H0_, b0, r0 = runs[0]
        for v, H, bits, r in runs[1:]:
            np.testing.assert_array_equal(H, H0_, err_msg=f"{v} vs {v0}")
            np.testing.assert_array_equal(bits, b0, err_msg=f"{v} vs {v0}")
            np.testing.assert_array_equal(r.steps_done, r0.steps_done)
            np.testing.assert_array_equal(r.residual, r0.residual)


def test_pick_keeps_the_default_within_the_margin():
    t = {"x_14x2": {"seconds": 1.0}, "x_6x4": {"seconds": 0.97}, "x_8x3": {"seconds": 1.1}}
    assert at.pick(t, "x_14x2") == "x_14x2"
    t["x_6x4"]["seconds"] = 0.9
    assert at.pick(t, "x_14x2") == "x_6x4"


def test_autotune_times_once_then_reads_the_cache(fresh, monkeypatch):
    cands = candidates()
    fast = cands[-1]
    calls = []
    monkeypatch.setattr(at, "time_variants", fake_timings(fast, calls))
    s = autotune_kernels()
    assert s["variant"] == fast and nat.variant() == fast and s["how"].startswith("autotuned")
    assert set(s["timings"]) == set(cands)
    assert calls == [cands]
    obj = json.loads((fresh / "kernels" / "tile.json").read_text())
    assert obj["format"] == at.CACHE_FORMAT and len(obj["entries"]) == 1
    (key, entry), = obj["entries"].items()
    assert entry["variant"] == fast and at.cpu_model() in key and "d=216" in key
    # a new process (the choice forgotten) reads the cache and times nothing
    at._done = False
    nat.set_isa(cands[0])
    s = autotune_kernels()
    assert s["variant"] == fast and s["how"].startswith("cached") and len(calls) == 1
    st = native_status()
    assert st["tile"] == fast and st["tile_how"].startswith("cached") and st["tile_timings"]
    # another d is another key
    s = autotune_kernels(force=True, d=64)
    assert len(calls) == 2
    assert len(json.loads((fresh / "kernels" / "tile.json").read_text())["entries"]) == 2


@pytest.mark.parametrize("garbage", [b"{not json", b'{"format": "other", "version": 1, "entries": {}}',
                                     b'{"format": "isan-kernel-tile", "version": 1, "entries": []}', b"\x00\xff"])
def test_a_corrupt_or_foreign_cache_is_ignored_and_rewritten(fresh, monkeypatch, garbage):
    cands = candidates()
    path = fresh / "kernels" / "tile.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(garbage)
    calls = []
    monkeypatch.setattr(at, "time_variants", fake_timings(cands[-1], calls))
    s = autotune_kernels()
    assert s["how"].startswith("autotuned") and len(calls) == 1
    obj = json.loads(path.read_text())
    assert obj["format"] == at.CACHE_FORMAT and len(obj["entries"]) == 1


def test_a_cached_variant_this_build_lacks_is_ignored(fresh, monkeypatch):
    cands = candidates()
    key = at._key(nat, cands[0].split("_")[0], 216)
    path = fresh / "kernels" / "tile.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": at.CACHE_FORMAT, "version": at.CACHE_VERSION,
                                "entries": {key: {"variant": "avx512_99x9"}}}))
    calls = []
    monkeypatch.setattr(at, "time_variants", fake_timings(cands[0], calls))
    assert autotune_kernels()["how"].startswith("autotuned") and len(calls) == 1


def test_the_environment_forces_a_tile(fresh, monkeypatch, caplog):
    cands = candidates()
    monkeypatch.setattr(at, "time_variants", fake_timings(cands[-1], []))
    monkeypatch.setenv(at.ENV, cands[-1])
    s = autotune_kernels()
    assert s["variant"] == cands[-1] and s["how"].startswith("forced")
    monkeypatch.setenv(at.ENV, "default")
    s = autotune_kernels(force=True)
    assert s["variant"] == cands[0] and s["how"].startswith("default")
    monkeypatch.setenv(at.ENV, "avx512_99x9")
    s = autotune_kernels(force=True)
    assert s["variant"] == cands[0] and "no such kernel variant" in caplog.text
    assert not (fresh / "kernels" / "tile.json").exists()  # nothing timed, nothing cached


def test_threads_calling_at_once_time_the_tiles_once(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(at, "time_variants", fake_timings(candidates()[-1], calls))
    go = threading.Barrier(8)
    out = []

    def first_call():
        go.wait()
        at.ensure(nat)
        out.append(nat.variant())

    ts = [threading.Thread(target=first_call) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(calls) == 1 and out == [candidates()[-1]] * 8


def test_the_real_timing_is_short_and_complete():
    t = at.time_variants(nat, candidates(), repeats=1)
    assert set(t) == set(candidates())
    assert all(x["seconds"] > 0 and x["gflops"] > 0 for x in t.values())


# ---- the team's threads placed on physical cores (team.c; opt-in: ISAN_PIN_THREADS=1) ----
def test_pin_plan_covers_the_affinity_mask_one_core_first(monkeypatch):
    import os

    monkeypatch.delenv("ISAN_PIN_THREADS", raising=False)
    assert nat.pin_plan() == ([], 0)  # off unless asked for
    monkeypatch.setenv("ISAN_PIN_THREADS", "1")
    cpus, n_cores = nat.pin_plan()
    allowed = os.sched_getaffinity(0)
    assert sorted(cpus) == sorted(allowed) and len(set(cpus)) == len(cpus)
    assert 1 <= n_cores <= len(cpus)
    monkeypatch.setenv("ISAN_PIN_THREADS", "0")
    assert nat.pin_plan() == ([], 0)


def test_pin_plan_respects_a_narrower_mask():
    """A worker process limited to some CPUs (as corpus workers may be) plans within them only."""
    import os
    import subprocess
    import sys

    cpu = sorted(os.sched_getaffinity(0))[-1]
    code = (f"import os; os.sched_setaffinity(0, {{{cpu}}}); from isan.engine.kernels import _native as n; "
            "print(n.pin_plan())")
    env = {**os.environ, "ISAN_PIN_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == f"([{cpu}], 1)"


@pytest.mark.parametrize("threads", [2, 3])
def test_pinning_does_not_change_results(default_engine, text8_test, monkeypatch, threads):
    model = StreamModel.from_params(default_engine.params32)
    P, L = 24, 300
    start = np.arange(P, dtype=np.int64) * L
    length = np.full(P, L, dtype=np.int64)
    ids = np.ascontiguousarray(default_engine.encode(text8_test[: P * L]), dtype=np.int32)
    H0 = model.rows(np.tile(default_engine.params.h0, (P, 1)))
    out = []
    for pin in ("1", "0"):
        monkeypatch.setenv("ISAN_PIN_THREADS", pin)
        H, bits = H0.copy(), np.zeros(P * L)
        run_streams(model, ids, start, length, H, bits, threads=threads)
        out.append((H, bits))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])
