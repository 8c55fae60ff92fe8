"""torch is optional (issue 46, item 5): what needs no torch runs with torch blocked.

Each test runs a fresh interpreter with ``sys.modules["torch"] = None`` (an ``import torch``
there raises ImportError, as on an install without torch), so they hold whether or not this
machine has torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the preamble of each child: torch (and Triton, which needs it) cannot be imported
BLOCK = "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"


def run_blocked(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_the_gpu_plan_imports_without_torch():
    """engine/kernels/torch/plan.py (chunk counts) needs no torch, and importing it (or the
    package) imports none; the runner itself says torch is missing."""
    r = run_blocked(
        "import isan.engine.kernels.torch.plan as plan\n"
        "from isan.engine.kernels.torch import plan as same\n"
        "assert plan is same\n"
        "assert plan.chunks([5_000], 'cuda') == [4] and plan.min_chunk('float64') == 2048\n"
        "assert plan.rtol('float64') == 1e-13\n"
        "loaded = sorted(k for k, v in sys.modules.items() if v is not None and k.split('.')[0] in ('torch', 'triton'))\n"
        "assert not loaded, loaded\n"
        "try:\n"
        "    from isan.engine.kernels.torch import TorchStreams\n"
        "except ImportError:\n"
        "    print('runner: ImportError')\n")
    assert r.returncode == 0, r.stderr
    assert "runner: ImportError" in r.stdout


def test_the_engine_scores_on_the_cpu_kernels_without_torch():
    """``isan.engine`` imports no torch, and the CPU's kernels score without it (its docstring)."""
    r = run_blocked(
        "from isan.engine import Engine\n"
        "for k in ('native', 'numpy'):\n"
        "    print(k, Engine.default(path_mode='chunked', kernels=k).score('the cat sat on the mat ' * 50).bits > 0)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["native", "True", "numpy", "True"]


def test_backend_parity_runs_without_torch():
    """tests/test_backends.py with torch blocked: the native and numpy parity tests run and pass
    (none skipped), only the torch configurations skip."""
    r = run_blocked(
        "import pytest\n"
        "sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', 'tests/test_backends.py', '-k', 'native or numpy']))\n",
        timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    tail = r.stdout.strip().splitlines()[-1]
    assert " passed" in tail and "skipped" not in tail and "error" not in tail, r.stdout[-3000:]
    # 4 parity tests x 2 backends: the long text, a batch, streaming, a diverging text
    assert int(tail.split(" passed")[0].split()[-1]) >= 8, tail
    r = run_blocked(
        "import pytest\n"
        "sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', '--collect-only', 'tests/test_backends.py']))\n")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "torch-cpu-f32" in r.stdout  # collected (and skipped when run), not an import error of the module
