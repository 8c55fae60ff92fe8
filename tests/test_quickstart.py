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
    block = re.search(r"## Quick start\n[^#]*?```bash\n(.*?)```", text, re.S)
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


def _ci_commands() -> list[str]:
    """.ci/run's command lines: all but comments, the shebang, the shell's options and the cd to the root."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")
            and line != "set -euo pipefail" and line != 'cd "$(dirname "$0")/.."']


def test_ci_runs_the_readmes_lines_verbatim_and_nothing_else():
    """CI is a user following the README (#45 item 3): each command of .ci/run is a line of the README,
    word for word, and none sets the environment apart from them (an ``export`` would give CI what the
    README's reader lacks, as MAX_ORDER=8 did: KenLM built without order 8, no KenLM peer)."""
    readme_lines = {line.strip() for line in (REPO / "README.md").read_text().splitlines()}
    readme_text = (REPO / "README.md").read_text()
    ci = _ci_commands()
    assert ci[-1] == _readme_commands()[1], "CI ends with the README's test command"
    for cmd in ci:
        assert cmd in readme_lines or f"`{cmd}`" in readme_text, f".ci/run runs {cmd!r}, which the README does not say"
        assert not re.match(r"(export|[A-Z_]+=\S+$)", cmd), f".ci/run sets {cmd!r}, which the README's reader does not"


def test_the_readmes_kenlm_builds_order_8():
    """The README's test command compiles KenLM with MAX_ORDER=8, so its module loads the order-8 n-gram
    the benchmarks compare against (#45 item 3). A module built without it (pip's cached wheel) fails here,
    naming the command that rebuilds it."""
    kenlm = pytest.importorskip("kenlm")
    import tempfile

    from isan.alphabet import Alphabet
    from isan.export.arpa import write_arpa
    from isan.train.ngram import fit

    a = Alphabet.text8()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "order8.arpa"
        write_arpa(fit(a.encode("the quick brown fox jumps over the lazy dog " * 4), 27, 8), a, path)
        try:
            kenlm.Model(str(path))
        except Exception as e:  # noqa: BLE001 - KenLM's own error names the order it was built for
            pytest.fail(f"kenlm cannot load an order-8 model ({str(e).splitlines()[0][:200]}): rebuild it "
                        "with MAX_ORDER=8 pip install --no-cache-dir --force-reinstall kenlm")


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


def test_the_tour_writes_outside_the_committed_files():
    """Every file or folder the README's tour writes (--out, --plot) goes under out/, runs/ or bundles/, folders
    that hold no committed file: following the tour never overwrites the repository's results."""
    text = (REPO / "README.md").read_text()
    tour = re.search(r"## A tour of the commands\n.*?```bash\n(.*?)```", text, re.S)
    assert tour, "the README has a tour with a bash block"
    targets = re.findall(r"--(?:out|plot) (\S+)", tour.group(1))
    assert len(targets) >= 4
    tracked = subprocess.run(["git", "ls-files", "out", "runs", "bundles"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode == 0:  # a clone; an unpacked archive has no git to ask
        assert tracked.stdout == "", "out/, runs/ and bundles/ hold no committed file"
    for target in targets:
        assert target.split("/")[0] in ("out", "runs", "bundles"), f"the tour writes {target} into the repository"
    first = [line for line in tour.group(1).splitlines() if line.startswith("isan export")]
    assert first and all(re.search(r"isan export \S+ (runs|bundles|out)/", line) for line in first)
