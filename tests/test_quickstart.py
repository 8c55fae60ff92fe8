"""What a new user meets first (issue #19): the README's commands, the lock, imports from anywhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "from isan.engine import Engine; r = Engine.default().score('hello world'); print(r.chars, r.bits)"


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start\s+```bash\n(.*?)```", text, re.S)
    assert block, "the README has a Quick start with a bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_second():
    install_and_run, tests = _readme_commands()
    assert "isan score" in install_and_run
    assert tests.endswith("python -m pytest -q")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert tests in [line.strip() for line in ci], ".ci/run runs the README's test command, exactly"
    # both install against the committed lock
    for cmd in (install_and_run, tests):
        assert "-c requirements/ci.txt" in cmd


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(3)
    return pins


def test_lock_pins_every_dependency_of_the_tested_extras():
    import tomllib

    pins = _pins(REPO / "requirements" / "ci.txt")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("train", "onnx", "serve", "dev", "plot", "evalharness"):
        wanted += project["optional-dependencies"][extra]
    for req in wanted:
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0).lower().replace("_", "-")
        if "sys_platform == 'win32'" in req:
            continue
        assert name in pins, f"{name} is not pinned in requirements/ci.txt (run requirements/lock.sh)"
    assert pins["torch"] == "2.13.0", "the lock names the CPU wheel's public version"


def _run(code: str, cwd: Path, *, drop_editable: bool = False) -> subprocess.CompletedProcess:
    if drop_editable:  # what a non-editable install sees: only the checkout's own folders
        code = ("import sys; sys.meta_path = [m for m in sys.meta_path if 'editable' not in repr(m).lower()]; "
                + code)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_python_example_from_the_repository_root_without_the_editable_finder():
    """The checkout's isan/ folder shadows an installed package there: it must be whole by itself."""
    out = _run(EXAMPLE, REPO, drop_editable=True)
    assert out.returncode == 0, out.stderr
    chars, bits = out.stdout.split()
    assert int(chars) == 11 and float(bits) > 0


def test_python_example_from_the_parent_of_a_clone_named_isan(tmp_path):
    """There the clone's root is imported as a namespace package ``isan``; the model must still load."""
    (tmp_path / "isan").symlink_to(REPO, target_is_directory=True)
    out = _run(EXAMPLE, tmp_path)
    assert out.returncode == 0, out.stderr
    here = _run(EXAMPLE, REPO)
    assert out.stdout == here.stdout


@pytest.mark.parametrize("where", ["root", "parent"])
def test_cli_from_both_places(tmp_path, where):
    cwd = REPO
    if where == "parent":
        (tmp_path / "isan").symlink_to(REPO, target_is_directory=True)
        cwd = tmp_path
    out = subprocess.run([sys.executable, "-m", "isan.cli", "score", "--json", "-"], input="hello world",
                         cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert '"chars": 11' in out.stdout
