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
from isan.engine.bundle import read_manifest
from isan.errors import install_hint

#: the form no package index can satisfy (isan is installed from its repository, #34 item 11): a bare
#: requirement ``isan[extra]``; a checkout's path that ends in ``/isan[extra]`` is the working form
NO_INDEX_HAS_IT = re.compile(r"""pip install (-c \S+ )?['"]?isan\[""")

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
    assert install_hint(extra) in e.value.message and not NO_INDEX_HAS_IT.search(e.value.message)


def test_install_hint_runs_as_printed_from_a_folder_named_isan_with_a_space(tmp_path, monkeypatch):
    """A clone is a folder named ``isan`` (``git clone``), its path may hold a space: the hint names
    the editable checkout, quoted, so the shell splits it into pip's arguments unchanged (#45 item 1)."""
    import shlex

    import isan.errors as errors

    root = tmp_path / "my work" / "isan"
    (root / "requirements").mkdir(parents=True)
    (root / "requirements" / "ci.txt").write_text("")
    (root / "pyproject.toml").write_text("")
    (root / "isan").mkdir()
    monkeypatch.setattr(errors, "__file__", str(root / "isan" / "errors.py"))
    hint = errors.install_hint("plot")
    assert shlex.split(hint) == ["pip", "install", "-c", str(root / "requirements" / "ci.txt"), f"{root}[plot]"]
    assert not NO_INDEX_HAS_IT.search(hint)


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


# ---- item 13: most_changed lists changed characters only, most_dropped the dropped ones --------------
def test_a_squeezed_space_is_dropped_not_changed(engine):
    n = engine.score("a  b").normalization
    assert (n["changed"], n["dropped"]) == (0, 1)
    assert n["most_changed"] == [] and n["most_dropped"] == [{"char": " ", "count": 1}]
    n = engine.score("The cat sat on the mat.\n").normalization
    assert n["most_changed"] == [{"char": ".", "count": 1}, {"char": "T", "count": 1}]
    assert n["most_dropped"] == [{"char": "\n", "count": 1}]
    out = json.loads(isan("score", "--json", "-", input="a  b").stdout)["normalization"]
    assert out["most_changed"] == [] and out["most_dropped"] == [{"char": " ", "count": 1}]


@pytest.mark.parametrize("text", ["a  b", "Hello, World!\n", "Привет мир", "1984  and   café\t\t", "\ufeffabc"])
def test_the_lists_agree_with_the_counts(engine, text):
    n = engine.score(text).normalization
    assert sum(m["count"] for m in n["most_changed"]) <= n["changed"]
    assert sum(m["count"] for m in n["most_dropped"]) <= n["dropped"]
    assert bool(n["most_changed"]) == bool(n["changed"]) and bool(n["most_dropped"]) == bool(n["dropped"])


# ---- item 14: text the model cannot read is not scored without a word --------------------------------
def test_a_mostly_dropped_text_gets_a_warning_on_stderr(engine):
    r = isan("score", "--json", "-", input="Привет мир")
    assert r.returncode == 0
    assert json.loads(r.stdout) == json.loads(json.dumps(engine.score("Привет мир").to_json()))  # unchanged
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning:"), r.stderr
    assert "9 of the 10 characters read" in lines[0] and "'и' 2" in lines[0] and "'р' 2" in lines[0]
    r = isan("score", "-", input="Привет мир")  # the text output too
    assert r.returncode == 0 and r.stderr.startswith("warning:") and "chars  1" in r.stdout


@pytest.mark.parametrize("text", ["The cat sat on the mat.\n", "HELLO WORLD 1984", "a  b"])
def test_readable_text_gets_no_warning(text):
    r = isan("score", "--json", "-", input=text)
    assert r.returncode == 0 and r.stderr == ""


# ---- item 15: short reprs ----------------------------------------------------------------------------
def test_reprs_are_short(engine):
    r = engine.score("The quick brown fox.\n", per_char=True)
    for obj in (r.state, r, engine.attribute("the cat sat " * 30, by="word"), engine.score("x" * 30_000)):
        s = repr(obj)
        assert len(s) < 400 and len(re.findall(r"\d\.\d{3,}", s)) < 10, s
    assert "(216,)" in repr(r.state) and "float64" in repr(r.state) and f"chars={r.chars}" in repr(r)
    other = engine.score("the quick brown cat ").state
    assert repr(other) != repr(r.state)  # two states read apart


# ---- item 15: a sample can be repeated, temperature 0 is greedy ----------------------------------------
def test_sample_without_a_seed_picks_one_and_says_which():
    a = json.loads(isan("sample", "--prompt", "the ", "-n", "40", "--json").stdout)
    assert isinstance(a["seed"], int)
    b = json.loads(isan("sample", "--prompt", "the ", "-n", "40", "--json", "--seed", a["seed"]).stdout)
    assert b["text"] == a["text"] and b["seed"] == a["seed"]
    r = isan("sample", "--prompt", "the ", "-n", "40")  # text output: the seed on stderr
    seed = int(re.search(r"seed (\d+)", r.stderr).group(1))
    again = isan("sample", "--prompt", "the ", "-n", "40", "--seed", seed)
    assert again.stdout == r.stdout and again.stderr == ""


def test_temperature_zero_is_greedy_like_the_server(engine):
    greedy = engine.sample("the annual reve", n=60, top_k=1, seed=0).text
    assert engine.sample("the annual reve", n=60, temperature=0, seed=5).text == greedy
    r = isan("sample", "--prompt", "the annual reve", "-n", "60", "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == greedy
    r = isan("sample", "--temperature", "-1")
    assert r.returncode == 2 and "temperature" in r.stderr and "Traceback" not in r.stderr


# ---- item 15: bundles/ is ignored ------------------------------------------------------------------------
def test_bundles_folder_is_ignored():
    r = subprocess.run(["git", "check-ignore", "-q", "bundles/my-isan/manifest.json"], cwd=REPO)
    assert r.returncode == 0, "bundles/ (where the training guide exports) is ignored"
    r = subprocess.run(["git", "check-ignore", "-q", "results/elman/bundles/x/manifest.json"], cwd=REPO)
    assert r.returncode == 1, "the committed bundles under results/ are not"
    guide = (REPO / "docs" / "guide" / "training.md").read_text() + (REPO / "README.md").read_text()
    assert "isan export runs/my-isan bundles/my-isan" in guide


# ---- item 15: attribute's sources -----------------------------------------------------------------------
def test_attribute_text_output_gives_each_source_its_offset():
    r = isan("attribute", "--text", "The cat, the mat.", "--top", "9")
    assert r.returncode == 0, r.stderr
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("  15 "))
    # the spaces after 'the' (offset 3), after 'cat,' (the comma, offset 7) and after the second 'the' (12)
    for label in ("'the' @0", "' ' @3", "' ' @7", "'the' @9", "' ' @12", "'mat' @13", "'<h0>'"):
        assert label in row, (label, row)


# ---- item 15: help texts ---------------------------------------------------------------------------------
def _commands(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield (*prefix, name), group, cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))


def test_every_command_summary_fits_the_listing():
    """The lists of `isan --help` (and of each group) cut a summary longer than the room left by the
    longest name with "...", and cut "Foerster et al. 2017" after "et al." and "Fig. 6" after "Fig."."""
    groups = {(): main}
    groups.update({path: cmd for path, _, cmd in _commands(main) if isinstance(cmd, click.Group)})
    for path, group in groups.items():
        ctx = click.Context(group, info_name="isan")
        width = ctx.make_formatter().width
        limit = width - 6 - max(len(n) for n in group.commands)
        for name, cmd in group.commands.items():
            short = cmd.get_short_help_str(limit)
            assert short and len(short) <= limit and not short.endswith("..."), (path, name, short)
            if cmd.short_help is None:  # the first paragraph whole, not cut after "et al." or "Fig."
                assert short == " ".join((cmd.help or "").split("\n\n")[0].split()), (path, name, short)


def test_sample_help_explains_json():
    r = CliRunner().invoke(main, ["sample", "--help"])
    line = next(ln for ln in r.output.splitlines() if ln.strip().startswith("--json"))
    assert len(line.split()) > 1, line


# ---- item 15: nnl in the README -------------------------------------------------------------------------
def test_readme_says_what_nnl_is_where_it_first_appears():
    readme = (REPO / "README.md").read_text()
    i = readme.find("nnl")
    assert i >= 0, "the README shows the nnl the quick start prints"
    para = readme[i:i + 600]
    assert "negative log-likelihood" in para and "log2" in para


def test_no_source_names_an_extra_by_a_command_that_cannot_work():
    """Every install hint in the package's code is install_hint's working form, never
    ``pip install 'isan[...]'`` (no package index has isan; #34 item 11)."""
    root = Path(__file__).resolve().parents[1]
    offenders = [str(p.relative_to(root)) for folder in ("engine", "export", "isan", "train", "trie_tables")
                 for p in (root / folder).rglob("*.py")
                 if p.name != "errors.py" and re.search(r"""pip install ['"]?isan\[""", p.read_text())]
    assert not offenders, offenders


def test_the_server_sampler_takes_temperature_zero_as_greedy(engine):
    """StreamSampler (POST /v1/sample's and the stream's sampler) treats temperature 0 as the CLI and
    /v1/completions do: the most likely symbol each step, never a division by zero."""
    import warnings

    from isan.engine.serve.sampling import StreamSampler

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a division by zero would warn
        s = StreamSampler(engine, "the annual reve", n=12, temperature=0, seed=1)
    assert (s.temperature, s.top_k) == (1.0, 1)


def test_onnx_backend_install_hints_name_the_working_command(tmp_path, monkeypatch):
    """onnxruntime, its CUDA provider or the onnx package missing: each message names the command
    that installs the extra (isan.errors.install_hint), not the 'isan[onnx]' no index has (#34 item 11)."""
    from isan.engine import default_model_path
    from isan.engine.baselines import onnx as onnx_runner
    from isan.errors import install_hint

    monkeypatch.setenv("ISAN_CACHE_DIR", str(tmp_path / "cache"))
    messages = []
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "onnxruntime", None)  # its import fails, as where it is not installed
        with pytest.raises(onnx_runner.BackendUnavailableError) as e:
            onnx_runner.load_onnx_engine(default_model_path())
        assert install_hint("onnx") in str(e.value) and install_hint("gpu") in str(e.value)
        messages.append(str(e.value))
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "onnx", None)  # the shipped model's graphs cannot be built on first use
        with pytest.raises(onnx_runner.BackendUnavailableError) as e:
            onnx_runner._graphs(default_model_path(), read_manifest(default_model_path()))
        assert install_hint("onnx") in str(e.value)
        messages.append(str(e.value))
    ort = pytest.importorskip("onnxruntime")
    if onnx_runner.CUDA not in ort.get_available_providers():
        with pytest.raises(onnx_runner.BackendUnavailableError) as e:
            onnx_runner._providers("cuda")
        assert install_hint("gpu") in str(e.value)
        messages.append(str(e.value))
    # the form no index has is a bare requirement; a checkout named isan ends in "/isan[onnx]" (#45 item 1)
    assert not any(NO_INDEX_HAS_IT.search(msg) for msg in messages), messages
