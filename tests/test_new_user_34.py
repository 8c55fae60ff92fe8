"""What a new user met from a fresh clone (issue #34, items 11, 13, 14 and 15 for the CLI), each with
the test that failed before its fix: install hints that name no index's package, a report whose
``most_changed`` listed dropped characters, text the model cannot read scored without a word, long
reprs, a sample that could not be repeated, ``--temperature 0`` refused, sources that read alike,
cut help lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from isan.cli import main
from isan.cli.helpers import UserError, friendly
from isan.engine import Engine
from isan.errors import install_hint

REPO = Path(__file__).resolve().parents[1]


def isan(*args, input=None):
    return subprocess.run([sys.executable, "-m", "isan.cli", *map(str, args)], input=input, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def engine():
    return Engine.default()


# ---- item 11: the install hints, and which extra each command of the tour needs ---------------------
@pytest.mark.parametrize("module, extra", [("matplotlib", "plot"), ("torch", "train"), ("onnxruntime", "onnx"),
                                           ("fastapi", "serve")])
def test_a_missing_extra_names_the_command_that_installs_it(module, extra):
    @friendly
    def needs_it():
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)

    with pytest.raises(UserError) as e:
        needs_it()
    assert install_hint(extra) in e.value.message and "isan[" not in e.value.message


def test_bench_train_without_torch_names_the_working_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "isan.bench.train", None)  # its import fails, as without torch
    r = CliRunner().invoke(main, ["bench", "train"])
    assert r.exit_code == 2 and install_hint("train") in r.output and "-e '.[train]'" not in r.output


def _tour() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## A tour of the commands\n.*?```bash\n(.*?)```", text, re.S)
    assert block, "the README has a tour with a bash block"
    return block.group(1).splitlines()


@pytest.mark.parametrize("command, extras", [
    ("isan score", "no extra"), ("isan sample", "no extra"), ("isan attribute", "[plot]"), ("isan-serve", "[serve]"),
    ("isan corpus", "[corpus]"), ("isan train", "[train]"), ("isan export", "[onnx]"), ("isan analyze", "[plot]"),
    ("isan bench", "[train]"), ("isan model check", "no extra"), ("isan verify", "no extra")])
def test_the_readme_tour_says_which_extra_each_command_needs(command, extras):
    lines = [ln for ln in _tour() if ln.startswith(command + " ")]
    assert lines, f"the tour shows {command}"
    assert any(extras in ln.split("#", 1)[-1] for ln in lines if "#" in ln), (command, lines)
    assert "pip install -c requirements/ci.txt" in (REPO / "README.md").read_text().split("## A tour")[1].split("##")[0]
