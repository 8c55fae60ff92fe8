"""Shared fixtures: real text from ../shared/data, small models, bundles."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import pytest

# The Triton step of the torch backend (engine/kernels/torch/grouped.py) runs on the CPU device in
# Triton's interpreter, which must be chosen before Triton is imported: on a machine without an
# NVIDIA GPU (CI) the tests run it there; with one, they compile it for the GPU.
if not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

from isan.alphabet import Alphabet
from isan.engine.bundle import write_bundle
from isan.params import ISANParams

REPO = Path(__file__).resolve().parents[1]
#: the project's shared data, beside the repository (``ISAN_SHARED_DATA`` elsewhere: the GPU check
#: carries a copy, isan/bench/gpu_check.sh)
DATA = Path(os.environ.get("ISAN_SHARED_DATA") or REPO.parent / "shared" / "data")
TEXT8 = DATA / "text8_head" / "text8_head.txt"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is missing (the project's shared data sits beside the repo)")
    return path


@pytest.fixture(scope="session")
def text8_path() -> Path:
    return need(TEXT8)


@pytest.fixture(scope="session")
def text8_test(text8_path) -> str:
    """The text8-10M test split (500,000 characters)."""
    from isan.data import read_text8_split

    return read_text8_split(text8_path, "test")


@pytest.fixture(scope="session")
def text8_valid_head(text8_path) -> str:
    """The first 20,000 characters of the text8-10M valid split."""
    from isan.data import read_text8_split

    return read_text8_split(text8_path, "valid")[:20_000]


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for torch during a module (small products run faster so, and it is fair to
    the other tests on 2 cores); the count is restored after."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc: Linux)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def random_params(K=27, V=27, d=16, seed=0, scale=0.9) -> ISANParams:
    """A random stable ISAN (orthogonal W scaled below 1)."""
    rng = np.random.default_rng(seed)
    W = np.stack([np.linalg.qr(rng.normal(size=(d, d)))[0] * scale for _ in range(K)])
    return ISANParams(W=W.astype(np.float32), b=rng.normal(size=(K, d)).astype(np.float32) * 0.5,
                      W_ro=rng.normal(size=(V, d)).astype(np.float32) * 0.5,
                      b_ro=rng.normal(size=V).astype(np.float32) * 0.1, h0=rng.normal(size=d).astype(np.float32))


@pytest.fixture(scope="session")
def small_params() -> ISANParams:
    return random_params()


@pytest.fixture(scope="session")
def small_bundle(tmp_path_factory, small_params) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "small"
    write_bundle(out, small_params.as_dict(), Alphabet.text8(), kind="isan")
    return out


@pytest.fixture(scope="session")
def default_engine():
    from isan.engine import Engine, default_model_path

    if not (default_model_path() / "manifest.json").exists():
        pytest.fail(f"the default model is not shipped in the package ({default_model_path()})")
    return Engine.default()


#: the first default model (no stability certificate: repeats of 'z' and random letters diverge),
#: kept for the paper's analyses and for the tests of what happens when a state diverges
UNCONSTRAINED = REPO / "isan" / "models" / "text8-d216-unconstrained"


@pytest.fixture(scope="session")
def unconstrained_engine():
    from isan.engine import Engine

    return Engine.load(UNCONSTRAINED)


@pytest.fixture(scope="session")
def text8_test_ref(default_engine, text8_test):
    """The float64 reference on the whole test split from h0: (bits (500000,), final state (d,))."""
    from isan.engine.reference import score_ref

    p = default_engine.params
    return score_ref(p, default_engine.encode(text8_test).astype(np.int64), p.h0)


# ---- the compiled kernels' variants (generic; avx2 and avx512, each in several register tiles): tests
# taking `isa` run on each variant this CPU runs ----
def isas():
    """Variants this CPU can run ("generic_4x2", "avx2_3x4", ..., "avx512_14x2", "avx512_6x4", ...: every
    instruction set in every register tile the autotune may choose)."""
    from isan.engine.kernels import native

    nat = native()
    if nat is None:
        return [None]
    return [v[0] for v in nat.variants()]


@pytest.fixture
def isa(request):
    """Runs a test once for each variant of the compiled kernels this CPU can run (None: the
    kernels are not built), and restores the one that ran before after."""
    from isan.engine.kernels import native

    nat = native()
    before = nat.variant() if nat is not None else None
    if request.param is not None:
        nat.set_isa(request.param)
    yield request.param
    if nat is not None:
        nat.set_isa(before)


def pytest_generate_tests(metafunc):
    if "isa" in metafunc.fixturenames:
        metafunc.parametrize("isa", isas(), indirect=True)
