"""The route of a text or a batch, chosen once (engine/route.py): an Engine resolves its path into
Routes when it is made, every call asks it, ``Engine.load`` and ``Engine(...)`` agree, and
``with_path`` keeps the backend object and the planner's caches."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import isan
from isan.engine import Engine
from isan.engine.kernels.plan import Kernel
from isan.engine.route import CHUNKED_MIN_CHARS, GROUPS, PATHS, Route, Routes, Way
from isan.errors import IsanError, TableFormatError


@pytest.mark.parametrize("path", PATHS)
def test_each_path_resolves_to_one_route_for_texts_and_one_for_batches(path):
    r = Routes.resolve(path, has_table=True, runs_tables=True)
    assert r.path == path
    want = {"composed": Way.COMPOSED, "reference": Way.REFERENCE}.get(path, Way.CHUNK_PARALLEL)
    assert r.text.way is want
    if path == "composed":  # long texts go chunk-parallel, the kernel chosen by the plan
        assert r.for_text(CHUNKED_MIN_CHARS - 1) is r.text
        assert r.for_text(CHUNKED_MIN_CHARS) == Route(Way.CHUNK_PARALLEL, Kernel.AUTO)
        assert r.batch == Route(Way.CHUNK_PARALLEL, Kernel.AUTO)
    else:
        assert r.for_text(10 * CHUNKED_MIN_CHARS) is r.text
        assert r.batch.kernel is (Kernel.JUMPS if path == "jumps" else Kernel.CHUNKED)
    # a call's own path is taken as asked, without the long-text switch
    assert r.for_text(10 * CHUNKED_MIN_CHARS, "composed").way is Way.COMPOSED


def test_groups_name_routes_and_the_table_is_checked_once():
    r = Routes.resolve(None, has_table=True, runs_tables=True)
    assert [r.for_batch(g) for g in GROUPS] == [
        Route(Way.CHUNK_PARALLEL), Route(Way.CHUNK_PARALLEL, Kernel.CHUNKED),
        Route(Way.CHUNK_PARALLEL, Kernel.CHUNKED, cut=False), Route(Way.CHUNK_PARALLEL, Kernel.JUMPS), Route(Way.ENTRY)]
    with pytest.raises(IsanError, match="group must be one of"):
        r.for_batch("rows")
    bare = Routes.resolve(None, has_table=False, runs_tables=True)
    assert bare.path == "chunked"
    for group in ("jumps", "entry"):
        with pytest.raises(TableFormatError, match=f"group='{group}' needs a trie table"):
            bare.for_batch(group)
    with pytest.raises(TableFormatError, match="no trie table for the jumps path"):
        bare.for_text(10, "jumps")
    with pytest.raises(TableFormatError, match="no trie table for the composed path"):
        Routes.resolve("composed", has_table=False, runs_tables=True)
    with pytest.raises(IsanError, match="path must be one of"):
        Routes.resolve("batched", has_table=True, runs_tables=True)


def test_a_backend_without_tables_runs_everything_chunk_parallel_and_refuses_the_table_paths():
    r = Routes.resolve(None, has_table=True, runs_tables=False)
    assert r.path == "chunked" and r.for_text(CHUNKED_MIN_CHARS).way is Way.CHUNK_PARALLEL
    for path in ("composed", "jumps"):
        with pytest.raises(IsanError, match=f"the {path} path runs on the CPU's kernels"):
            Routes.resolve(path, has_table=True, runs_tables=False, device="cuda")
    with pytest.raises(IsanError, match="reference path is numpy's float64 on the CPU"):
        Routes.resolve("reference", has_table=False, runs_tables=False, device="cuda")


def test_engine_load_and_the_constructor_agree_on_a_backend_without_tables(default_engine):
    pytest.importorskip("torch")
    e = default_engine
    for path in ("composed", "jumps"):
        with pytest.raises(IsanError, match=f"the {path} path runs on the CPU's kernels") as loaded:
            Engine.load(e.source, path_mode=path, dtype="float64", progress_bar=False)
        with pytest.raises(IsanError, match=f"the {path} path runs on the CPU's kernels") as made:
            Engine(e.input_params, e.alphabet, e.manifest, e.source, e.table, path=path, dtype="float64")
        assert str(loaded.value) == str(made.value)
    # no path asked: the table is there, but the torch backend's route is chunk-parallel
    made = Engine(e.input_params, e.alphabet, e.manifest, e.source, e.table, dtype="float64")
    assert made.path == "chunked" == Engine.load(e.source, dtype="float64", progress_bar=False).path


def test_every_call_takes_the_engines_route(default_engine, text8_test):
    e = default_engine
    assert e.path == "composed" and e.route(100).way is Way.COMPOSED
    short, long_ = text8_test[:2_000], text8_test[:CHUNKED_MIN_CHARS + 5]
    assert e.score(short).scoring == {"path": "composed"}
    assert e.score(long_).scoring["path"] in ("chunked", "jumps")
    assert e.score(short, path="reference").scoring == {"path": "reference"}
    ref = e.advance(long_, path="reference")
    for path in (None, "composed", "chunked", "jumps"):
        np.testing.assert_allclose(e.advance(long_, path=path).h, ref.h, atol=1e-3, rtol=0)
    [r] = e.score_batch([short], group="entry")
    assert r.scoring == {"path": "batched, grouped by entry"}


def test_with_path_keeps_the_backend_object_and_the_planners_caches(default_engine):
    e = default_engine
    jt = e.jump_table()
    other = e.with_path("chunked", threads=1)
    assert other.path == "chunked" and other.threads == 1 and e.path == "composed"
    assert other.kernels is e.kernels and other.jump_table() is jt and other.stream_model() is e.stream_model()
    assert other.certificate() is e.certificate()
    with pytest.raises(IsanError, match="threads must be >= 1"):
        e.with_path("chunked", threads=0)
    with pytest.raises(IsanError, match="path must be one of"):
        e.with_path("batched")


def test_a_torch_engine_keeps_its_options_through_with_path_and_a_corpus_job(default_engine):
    """Made with ``step=`` and ``precision=``, a torch engine's backend object (its runner and its
    caches) is the one with_path and the corpus job's engine use: nothing rebuilds it from a name."""
    pytest.importorskip("torch")
    from isan.engine.corpus.scoring import corpus_engine

    made = Engine.load(default_engine.source, dtype="float64", kernels="torch", step="mm", precision="ieee",
                       progress_bar=False)
    e = made.with_path("chunked", threads=1)  # the corpus job's engine has threads of its own
    e.score("warm the runner's caches up")
    assert e.kernels is made.kernels
    for other in (e.with_path("chunked", threads=3), corpus_engine(e)):
        assert other is not e
        assert other.kernels is e.kernels and other.kernels.streams is e.kernels.streams
        assert other.kernels.streams.step == "mm" and other.stream_model() is e.stream_model()


def test_a_request_reaches_the_kernel_in_a_few_calls(default_engine, text8_test):
    """From the engine's batched call to the compiled kernel: one plan, asked once, then the
    scorer's phases; no call goes back from the backend into the engine, and no dict of keywords
    is rebuilt from the plan (the hops the route's docs draw)."""
    e = default_engine
    ids = e.encode(text8_test[:5_000])
    h = e.initial_state().h[None]
    e.score_ids([ids], h)  # first use builds the layouts
    calls = []
    root = str(Path(isan.__file__).resolve().parent.parent)

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls.append(frame.f_code.co_qualname)

    sys.setprofile(prof)
    try:
        e.score_ids([ids], h)
    finally:
        sys.setprofile(None)
    assert calls.count("Planner.plan") == 1 and calls.count("CpuBackend.plan") == 1
    assert "Engine.chunk_fallback" not in calls and not any("keywords" in c for c in calls)
    assert calls.index("Planner.plan") < calls.index("score_texts_chunked")
