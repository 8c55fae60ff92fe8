"""The Engine's public planning API and the backends' protocol (issue 46): ``Engine.plan`` returns
the backend's frozen :class:`Plan`, the registry holds every backend by name, and the deprecated
``Engine.backend`` still answers (with a DeprecationWarning)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from isan.engine.kernels.backends import BACKENDS, NAMES, Backend, Plan, get_backend


def test_the_registry_holds_every_backend_and_each_keeps_the_protocol():
    assert tuple(BACKENDS) == NAMES
    for name in ("native", "numpy"):
        b = get_backend(name)
        assert isinstance(b, Backend) and b.name == name and b.runs_tables and not b.one_process
        assert b.rounding is None and b.reports_where == (name != "native")
        assert b.describe() == {"backend": name, "device": "cpu", "dtype": "float32"}


def test_plan_is_a_frozen_dataclass_chosen_by_the_backend(default_engine):
    p = default_engine.plan([2_500_000], 2)
    assert isinstance(p, Plan) and p.kernel == "jumps" and p.runner is default_engine.kernels.jumps
    assert p.model is default_engine.jump_table() and p.keywords() == {"runner": p.runner, "path": "jumps"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.kernel = "chunked"
    q = default_engine.plan([100_000], 2)
    assert q.kernel == "chunked" and q.model is default_engine.stream_model() and q.keywords() == {"runner": q.runner}
    assert default_engine.plan([5000] * 3, 2, cut=False).chunks == (1, 1, 1)


def test_plan_runs_as_score_ids_does(default_engine, text8_test):
    """A plan handed to the kernel gives score_ids' bits: the public API is the one the engine uses."""
    from isan.engine.kernels.chunked import score_texts_chunked

    eng = default_engine
    ids = eng.encode(text8_test[:30_000])
    h = eng.initial_state().h[None]
    p = eng.plan([len(ids)], 2)
    bits, _, _, div = score_texts_chunked(p.model, [ids], h, chunks=list(p.chunks), threads=2,
                                          fallback=eng.chunk_fallback([len(ids)], list(p.chunks)), **p.keywords())
    want, _, _ = eng.score_ids([ids], h, threads=2)
    assert not div
    np.testing.assert_array_equal(bits[0], want[0])


def test_engine_backend_is_a_deprecated_alias_of_runtime(default_engine):
    assert default_engine.runtime == "numpy"
    with pytest.warns(DeprecationWarning, match="Engine.runtime"):
        assert default_engine.backend == "numpy"
    assert default_engine.describe()["backend"] == "numpy"


def test_every_cpu_runner_declares_the_dtype_of_its_state_rows():
    """The Runner protocol holds ``state_dtype`` (#46 item 2): the CPU kernels and their twins declare
    float32 and chunk-parallel scoring reads it; a callable that declares none is not a Runner."""
    from isan.engine.kernels.chunked import Runner

    for name in ("native", "numpy"):
        b = get_backend(name)
        for runner in (b.streams, b.jumps):
            assert isinstance(runner, Runner) and runner.state_dtype == np.float32, (name, runner)

    def undeclared(model, ids, start, length, H, bits=None, pairs=False, stop_ratio=0.0, check_every=16,
                   limit=1e4, threads=1):
        raise AssertionError("never called")

    assert not isinstance(undeclared, Runner)
