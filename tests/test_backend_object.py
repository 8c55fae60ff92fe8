"""A kernel backend is an object, made once (engine/kernels/backends.py): any object that keeps the
``Backend`` protocol runs the Engine end to end; the one default rule (``default_backend``) says
which backend runs where none is named, picks the numpy twins where the compiled kernels cannot
load and says why; ``ISAN_KERNELS`` names a registry entry, read in one place
(``kernels_override``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import isan.engine.kernels as kernels
from isan.engine.kernels import backends, kernels_override, native, native_status
from isan.engine.kernels.backends import (
    NAMES,
    Backend,
    CpuBackend,
    TorchBackend,
    check_backend,
    default_backend,
    get_backend,
)
from isan.engine.kernels.plan import Kernel, Plan
from isan.errors import BackendUnavailableError, IsanError, StateDivergedError
from tolerances import engine_float32_tolerance

USUAL = {"backend": "native", "device": "cpu", "dtype": "float32"}
TEXT = "the cat sat on the mat and the dog ran after it " * 20


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    """Each test starts without ``ISAN_KERNELS`` (and leaves the environment as it found it)."""
    monkeypatch.delenv("ISAN_KERNELS", raising=False)


class PlainBackend:
    """A backend written from scratch, no base class of the module: the numpy twin of the per-symbol
    kernel, one row a text, counting the plans it makes."""

    name = "plain"
    device = "cpu"
    dtype = "float32"
    jumps = None
    runs_tables = False
    one_process = False
    reports_where = True
    on_cpu = True
    batch_chars = 1_000_000
    rounding = None

    def __init__(self):
        from isan.engine.kernels.streams import run_streams_ref

        self.streams = run_streams_ref
        self.plans = 0

    rtol = 1e-6

    def plan(self, lengths, threads, facts, cut=True, kernel=Kernel.AUTO):
        self.plans += 1
        return Plan.one_row_a_text(None, self.streams, len(lengths))  # the planner attaches the model

    def fallback(self, params, forget_bound_chars):
        from isan.engine.kernels.chunked import Float64Fallback

        return Float64Fallback(params)

    def submit(self, plan, packed, hs, want="totals", threads=1, finals=True):
        from isan.engine.kernels.chunked import score_packed

        return score_packed(plan, packed, hs, want, threads)

    def describe(self):
        return {"backend": self.name, "device": self.device, "dtype": self.dtype}


def engine_on(engine, kernels_obj):
    """The model of ``engine`` on another backend (no trie table: every text chunk-parallel)."""
    from isan.engine import Engine

    return Engine(engine.input_params, engine.alphabet, engine.manifest, source=engine.source, kernels=kernels_obj)


def test_a_plain_object_that_keeps_the_protocol_scores_a_text(default_engine):
    plain = PlainBackend()
    assert isinstance(plain, Backend) and not isinstance(plain, (CpuBackend, TorchBackend))
    assert get_backend(plain) is plain and get_backend(plain, device="cuda", dtype="float64") is plain
    eng = engine_on(default_engine, plain)
    assert eng.kernels is plain and eng.path == "chunked"
    assert eng.describe()["kernels"]["backend"] == "plain"

    r = eng.score(TEXT, per_char=True, threads=1)
    assert plain.plans >= 1 and r.scoring["backend"] == "plain" and r.scoring["path"] == "chunked"
    ref = default_engine.with_path("reference").score(TEXT, per_char=True)
    tol = engine_float32_tolerance(default_engine, TEXT)
    assert r.chars == ref.chars
    assert np.max(np.abs(r.per_char_bits - ref.per_char_bits)) <= tol.bits
    assert abs(r.bits - ref.bits) <= tol.total(r.chars)


def test_batches_run_on_the_object_and_an_error_names_its_place(default_engine, unconstrained_engine):
    from isan.engine.batches import score_batches

    eng = engine_on(default_engine, PlainBackend())
    docs = [eng.encode("the cat sat on the mat "), eng.encode("a dog ran ")]
    h = np.tile(eng.params.h0, (2, 1))
    (res,) = score_batches(eng, [(docs, h)])
    totals = res.values
    want, _, _ = eng.score_ids(docs, h, chunks="none", want_bits="totals")
    np.testing.assert_array_equal(totals, want)  # the same runner on the same rows

    bad_eng = engine_on(unconstrained_engine, PlainBackend())
    bad = [bad_eng.encode("the cat "), bad_eng.encode("z" * 200)]
    with pytest.raises(StateDivergedError, match="chunked path") as err:  # the plan's kernel
        list(score_batches(bad_eng, [(bad, h)]))
    assert err.value.text_index == 1 and err.value.batch_index == 0
    with pytest.raises(StateDivergedError, match="corpus batches path"):  # the caller's
        list(score_batches(bad_eng, [(bad, h)], where="corpus batches"))


def test_an_object_that_is_not_a_backend_is_refused_naming_what_it_lacks():
    class NoDescribe(PlainBackend):
        describe = None  # there, but no method

    class Half:
        name, device, dtype = "half", "cpu", "float32"

    with pytest.raises(IsanError, match=r"this object has no batch_chars, describe"):
        get_backend(object())
    with pytest.raises(IsanError, match=r"Half has no batch_chars, describe, fallback, jumps, on_cpu") as err:
        check_backend(Half())
    assert "name" not in str(err.value).split("has no")[1].split(", ") and "native, numpy, torch" in str(err.value)
    with pytest.raises(IsanError, match=r"NoDescribe has no describe$"):
        get_backend(NoDescribe())
    with pytest.raises(IsanError, match="already built"):
        get_backend(PlainBackend(), step="mm")


def test_the_default_rule(monkeypatch):
    assert default_backend("cpu") == "native" and default_backend("cpu", explain=True) == ("native", None)
    assert default_backend("cpu", "float64") == "torch"
    assert default_backend("cuda") == default_backend("cuda:1", "float64") == "torch"
    assert default_backend("auto") == ("native" if backends.resolve_device("auto") == "cpu" else "torch")
    monkeypatch.setattr(backends, "resolve_device", lambda device: "cuda")  # "auto" is resolved first
    assert default_backend("auto") == "torch"
    monkeypatch.undo()
    b = get_backend()
    assert isinstance(b, CpuBackend) and b.name == "native" and b.why is None
    assert json.dumps(b.describe()) == json.dumps(USUAL)  # the usual backend's JSON, unchanged


def test_without_the_compiled_kernels_the_default_is_numpy_and_says_why(monkeypatch, default_engine):
    monkeypatch.setattr(kernels, "_native", None)  # as an install without a C compiler
    monkeypatch.setattr(kernels, "_warned", False)
    name, why = default_backend("cpu", explain=True)
    assert name == "numpy" and why.startswith("the compiled kernels are not available: ")
    b = get_backend()
    assert b.name == "numpy" and b.describe() == {"backend": "numpy", "device": "cpu", "dtype": "float32", "why": why}
    assert get_backend("numpy").describe() == {"backend": "numpy", "device": "cpu", "dtype": "float32"}
    assert default_backend("cpu", "float64") == "torch"
    with pytest.raises(BackendUnavailableError, match=r"pip install --force-reinstall \..*C compiler"):
        get_backend("native")
    status = native_status()
    assert not status["available"] and status["error"] and native() is None
    eng = engine_on(default_engine, None)
    assert eng.kernels.name == "numpy" and eng.describe()["kernels"]["why"] == why
    assert eng.score(TEXT).scoring["why"] == why  # the report says where it ran, and why
    monkeypatch.undo()
    assert get_backend().describe() == USUAL and native() is not None
    r, twins = default_engine.score(TEXT), eng.score(TEXT)  # a good call on each, the compiled one back
    assert r.chars == twins.chars
    assert abs(r.bits - twins.bits) <= engine_float32_tolerance(default_engine, TEXT).twice().total(r.chars)


def test_isan_kernels_names_the_default_on_the_cpu_in_float32(monkeypatch):
    monkeypatch.setenv("ISAN_KERNELS", "numpy")
    assert kernels_override() == "numpy" and default_backend("cpu", explain=True) == ("numpy", "ISAN_KERNELS=numpy")
    assert get_backend().describe()["why"] == "ISAN_KERNELS=numpy"
    assert native() is None and not native_status()["available"]  # every kernel runs its twin
    assert default_backend("cpu", "float64") == default_backend("cuda") == "torch"
    monkeypatch.setenv("ISAN_KERNELS", "native")
    assert default_backend("cpu", explain=True) == ("native", None) and get_backend().describe() == USUAL
    monkeypatch.setenv("ISAN_KERNELS", "")
    assert kernels_override() is None and default_backend("cpu") == "native"


def test_isan_kernels_with_an_unknown_name_is_an_error(monkeypatch):
    monkeypatch.setenv("ISAN_KERNELS", "bogus")
    for call in (kernels_override, get_backend, native, native_status, lambda: default_backend("cpu")):
        with pytest.raises(IsanError, match=f"ISAN_KERNELS must name a kernel backend, one of {', '.join(NAMES)}"):
            call()
    monkeypatch.delenv("ISAN_KERNELS")
    assert get_backend().describe() == USUAL
