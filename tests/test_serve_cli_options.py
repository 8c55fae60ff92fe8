"""``isan-serve``'s options: every numeric option is a typed range with both bounds, and a value out of
it (below, above, NaN, an infinity, a word) is one ``Error:`` line naming the option, exit status 2,
before anything is loaded or bound."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

pytest.importorskip("uvicorn")

from isan.engine.serve.cli import main  # noqa: E402

NUMERIC = [p for p in main.params if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))]


def bad_values(param: click.Option) -> list[str]:
    """Values out of the option's range: under its min, over its max, a word, and for floats NaN and inf."""
    t = param.type
    step = 1 if isinstance(t, click.IntRange) else 0.5
    out = [str(t.min - step) if not t.min_open else str(t.min), str(t.max + step) if not t.max_open else str(t.max),
           "many"]
    if isinstance(t, click.FloatRange):
        out += ["nan", "inf", "-inf"]
    return out


def test_every_numeric_option_is_a_bounded_range():
    assert {p.name for p in NUMERIC} >= {"port", "max_chars", "max_pending_mb", "round_chars", "request_timeout",
                                         "threads", "workers", "read_timeout", "keep_alive_timeout"}
    for p in NUMERIC:
        assert isinstance(p.type, (click.IntRange, click.FloatRange)), p.name
        assert p.type.min is not None and p.type.max is not None, p.name


@pytest.mark.parametrize("param", NUMERIC, ids=lambda p: p.opts[0])
def test_an_out_of_range_value_is_one_line_and_exit_2(param, monkeypatch):
    import uvicorn

    from click.testing import CliRunner

    started = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **kw: started.append(self))
    for value in bad_values(param):
        res = CliRunner().invoke(main, [param.opts[0], value])
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2, (param.opts[0], value, res.output)
        assert len(lines) == 1 and lines[0].startswith("Error: ") and param.opts[0] in lines[0], (value, lines)
        assert res.stdout == "" and not started
    default = param.default if param.default is not None else 1
    assert param.type.convert(str(default), param, None) == default  # the default is in range


def test_the_real_command_refuses_before_any_work():
    """The installed command, with a model that does not exist: the bad number is refused first."""
    r = subprocess.run([sys.executable, "-m", "isan.engine.serve", "--model", "/nonexistent", "--max-pending-mb",
                        "nan"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "Error: Invalid value for '--max-pending-mb': 'nan' is not a finite number."], r.stderr
