"""The Engine's public planning API and the backends' protocol (issue 46): ``Engine.plan`` returns
the backend's frozen :class:`Plan`, the registry holds every backend by name, and the deprecated
``Engine.backend`` still answers (with a DeprecationWarning)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from isan.engine.kernels.backends import BACKENDS, NAMES, Backend, get_backend
from isan.engine.kernels.plan import Kernel, Plan


def test_the_registry_holds_every_backend_and_each_keeps_the_protocol():
    assert tuple(BACKENDS) == NAMES
    for name in ("native", "numpy"):
        b = get_backend(name)
        assert isinstance(b, Backend) and b.name == name and b.runs_tables and not b.one_process
        assert b.rounding is None and b.reports_where == (name != "native")
        assert b.describe() == {"backend": name, "device": "cpu", "dtype": "float32"}


def test_plan_is_a_frozen_dataclass_chosen_by_the_backend(default_engine):
    p = default_engine.plan([2_500_000], 2)
    assert isinstance(p, Plan) and p.kernel is Kernel.JUMPS and p.runner is default_engine.kernels.jumps
    assert p.model is default_engine.jump_table() and p.path == "jumps"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.kernel = Kernel.CHUNKED
    q = default_engine.plan([100_000], 2)
    assert q.kernel is Kernel.CHUNKED and q.model is default_engine.stream_model() and q.path == "chunked"
    assert default_engine.plan([5000] * 3, 2, cut=False).chunks.tolist() == [1, 1, 1]


def test_the_plan_carries_what_the_certificate_proves(default_engine):
    """The plan is whole: its chunks are at least the certificate's forgetting bound long, so its
    fallback is the proof (no chunk can need the float64 redo), with the stopping rule it was proven
    for; chunk counts a caller gives that cut shorter get the float64 fallback instead."""
    from isan.engine.forgetting import ProvenForgetting
    from isan.engine.kernels.chunked import Float64Fallback
    from isan.engine.kernels.plan import CHECK_EVERY, DEFAULT_MARGIN, DEFAULT_RTOL

    eng = default_engine
    bound = eng.forget_bound_chars()
    assert bound is not None and eng.certificate()["holds"]
    n = 2_500_000
    p = eng.plan([n], 2)
    assert isinstance(p.fallback, ProvenForgetting) and p.fallback.bound == bound
    assert all(n // c >= bound for c in p.chunks) and n // max(p.chunks) >= eng.min_chunk()
    assert (p.rtol, p.margin, p.check_every) == (DEFAULT_RTOL, DEFAULT_MARGIN, CHECK_EVERY)
    short = eng.plan([n], 2, chunks=[n // (bound // 2)])
    assert short.chunks.tolist() == [n // (bound // 2)] and isinstance(short.fallback, Float64Fallback)


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
