"""The one native-or-twin dispatch of the kernels (engine/kernels/twin.py): each compiled kernel and
its numpy twin take the same parameters, and the twin runs, with the caller's arguments, exactly
when the compiled module is not there."""

import inspect

import pytest

import isan.engine.kernels as kernels
from isan.engine.kernels.jumps import run_jumps, run_jumps_ref, segment, segment_ref
from isan.engine.kernels.sequential import seq_composed, seq_composed_ref
from isan.engine.kernels.streams import run_streams, run_streams_ref
from isan.engine.kernels.twin import native_or_twin, same_signature

KERNELS = [(run_streams, run_streams_ref), (run_jumps, run_jumps_ref), (seq_composed, seq_composed_ref),
           (segment, segment_ref)]


@pytest.mark.parametrize("kernel,twin", KERNELS, ids=lambda k: getattr(k, "__name__", "?"))
def test_kernel_and_twin_take_the_same_parameters(kernel, twin):
    assert kernel.twin is twin
    assert same_signature(kernel)
    assert list(inspect.signature(kernel.native).parameters)[0] == "nat"
    assert kernel.__name__ == kernel.native.__name__ and kernel.__doc__ == kernel.native.__doc__


def _toy():
    calls = []

    def add_ref(a, b=1, *, scale=1):
        calls.append(("twin", a, b, scale))
        return (a + b) * scale

    @native_or_twin(add_ref)
    def add(nat, a, b=1, *, scale=1):
        calls.append(("native", nat, a, b, scale))
        return nat(a + b) * scale

    return add, calls


def test_native_runs_with_the_module_when_there(monkeypatch):
    add, calls = _toy()
    monkeypatch.setattr(kernels, "native", lambda: float)  # a stand-in "module": float(x)
    assert add(2, b=3, scale=2) == 10.0
    assert calls == [("native", float, 2, 3, 2)]


def test_twin_runs_with_the_same_arguments_without_the_module(monkeypatch):
    add, calls = _toy()
    monkeypatch.setattr(kernels, "native", lambda: None)
    assert add(2, 3, scale=2) == 10
    assert calls == [("twin", 2, 3, 2)]


def test_isan_kernels_numpy_chooses_the_twin(monkeypatch):
    add, calls = _toy()
    monkeypatch.setenv("ISAN_KERNELS", "numpy")
    add(1)
    assert calls == [("twin", 1, 1, 1)]


def test_signature_mismatch_is_seen():
    def f_ref(a, b=2):
        return a

    @native_or_twin(f_ref)
    def f(nat, a, b=3):
        return a

    assert not same_signature(f)
    assert str(inspect.signature(f)) == "(a, b=3)"
