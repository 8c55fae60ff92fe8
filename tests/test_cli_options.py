"""Every numeric option of every ``isan`` command is typed and bounded: NaN, infinities and values out of
its range are a usage error (exit 2, one ``Error: Invalid value for '--x'`` line, no traceback) before any
work. The walk below reads the command tree from :data:`isan.cli.main`, so an option added later is
covered without a change here."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from isan.cli import main
from isan.cli.helpers import ByteSize, CommaList, IntList
from isan.click_types import FiniteFloat, WholeNumber


def commands(group: click.Group, path: tuple[str, ...] = ()):
    """(path, command) for every command under ``group``, depth first."""
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def numeric_options():
    """(command path, option) for every option whose type is a number."""
    return [(path, p) for path, cmd in commands(main) for p in cmd.params
            if isinstance(p, click.Option) and isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))]


NUMERIC = numeric_options()


def out_of_range(t) -> list[str]:
    """Values just outside the bounds of a click range type (at an open bound, the bound itself)."""
    values = []
    is_int = isinstance(t, click.types.IntParamType)
    if t.min is not None:
        values.append(str(t.min) if t.min_open else str(t.min - 1 if is_int else t.min - 1.0))
    if t.max is not None:
        values.append(str(t.max) if t.max_open else str(t.max + 1 if is_int else t.max + 1.0))
    return values


def assert_usage_error(args: list[str], option: click.Option):
    r = CliRunner().invoke(main, args)
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (args, r.output, r.exception)
    assert "Traceback" not in r.output and len(errors) == 1, (args, r.output)
    named = [o for o in option.opts if o.startswith("-")]
    assert errors[0].startswith("Error: Invalid value for ") and any(f"'{o}'" in errors[0] for o in named), \
        (args, errors[0])


def test_the_walk_finds_the_numeric_options():
    """The walk reaches nested groups (bench, analyze, study elman) and the options listed in the README."""
    found = {(" ".join(path), p.opts[0]) for path, p in NUMERIC}
    assert {("train", "--d"), ("train", "--lr"), ("sample", "--temperature"), ("model check", "--max-chars"),
            ("bench serve", "--duration"), ("analyze samples", "--inverse-temperature"),
            ("study elman fig1", "--runs")} <= found
    assert len(found) >= 80
    assert {(" ".join(path), p.opts[0]) for path, p in LISTS} >= {("train", "--orders"), ("bench engine", "--threads"),
                                                                ("bench budgets", "--budgets")}
    assert {(" ".join(path), p.opts[0]) for path, p in SIZES} >= {("export", "--table-budget")}


@pytest.mark.parametrize("path, option", NUMERIC, ids=[f"{' '.join(c)} {p.opts[0]}" for c, p in NUMERIC])
def test_every_numeric_option_is_bounded_and_refuses_nan_inf_and_out_of_range(path, option):
    t = option.type
    assert isinstance(t, (click.IntRange, click.FloatRange)) and (t.min is not None or t.max is not None), \
        f"isan {' '.join(path)} {option.opts[0]}: give it a bounded type (click.IntRange, isan.click_types.FiniteFloat)"
    for value in ["nan", "inf", "-inf", *out_of_range(t)]:
        assert_usage_error([*path, option.opts[0], value], option)


LISTS = [(path, p) for path, cmd in commands(main) for p in cmd.params
         if isinstance(p, click.Option) and isinstance(p.type, CommaList)]


@pytest.mark.parametrize("path, option", LISTS, ids=[f"{' '.join(c)} {p.opts[0]}" for c, p in LISTS])
def test_every_list_refuses_an_empty_list_and_items_its_type_refuses(path, option):
    values = ["nan", ",", "1,x", "-1"]
    if isinstance(option.type, IntList):
        values += ["2.5", f"{option.type.min + 1},{option.type.min - 1}"]
        assert option.type.convert(f"{option.type.min}, {option.type.min + 3}", option, None) == \
            (option.type.min, option.type.min + 3)
    for value in values:
        assert_usage_error([*path, option.opts[0], value], option)


SIZES = [(path, p) for path, cmd in commands(main) for p in cmd.params
         if isinstance(p, click.Option) and isinstance(p.type, ByteSize)]


@pytest.mark.parametrize("path, option", SIZES, ids=[f"{' '.join(c)} {p.opts[0]}" for c, p in SIZES])
def test_every_size_refuses_nan_inf_zero_negative_and_words(path, option):
    for value in ["nan", "inf", "1e400MB", "0", "0MB", "-5MB", "abc", "16XB"]:
        assert_usage_error([*path, option.opts[0], value], option)
    assert [option.type.convert(v, option, None) for v in ("16MB", "512KB", "1GB", "4096")] == \
        ["16MB", "512KB", "1GB", "4096"]


# ---- isan train: the values that ended in tracebacks or were taken silently -------------------------
@pytest.mark.parametrize("option, value", [
    ("--d", "0"), ("--d", "-5"), ("--params", "0"), ("--params", "-5"), ("--params", "nan"), ("--batch-size", "0"),
    ("--bptt", "0"), ("--bptt", "-1"), ("--lr", "nan"), ("--lr", "-1"), ("--threads", "-2"), ("--max-chars", "nan"),
    ("--max-chars", "-1"), ("--max-chars", "2.5"), ("--eval-every", "nan"), ("--eval-every", "-1"),
    ("--state-dropout", "1.5"), ("--max-steps", "0"), ("--max-steps", "-1"), ("--ema", "1.5"), ("--ema", "nan"),
    ("--lr-min", "nan"), ("--orders", "2,x"),
])
def test_train_refuses_each_value_before_any_work(tmp_path, option, value):
    """Each is a usage error naming the option, before the data is read (--data names a file that does not
    exist) and before --out is made."""
    run = tmp_path / "run"
    r = CliRunner().invoke(main, ["train", "--out", str(run), "--data", str(tmp_path / "absent.txt"), option, value])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"Invalid value for '{option}'" in r.output, r.output
    assert not run.exists()


def test_dplr_with_a_negative_hidden_size_blames_d(tmp_path):
    r = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "run"), "--structure", "dplr", "--d", "-4",
                                  "--rank", "1"])
    assert r.exit_code == 2 and "Invalid value for '--d'" in r.output and "--rank" not in r.output.splitlines()[-1]


def test_counts_in_float_notation_are_whole_numbers():
    t = WholeNumber(min=1)
    assert [t.convert(v, None, None) for v in ("36000000", "36e6", " 5 ", "2.0")] == [36_000_000, 36_000_000, 5, 2]
    for bad in ("2.5", "nan", "inf", "0", "abc"):
        with pytest.raises(click.BadParameter):
            t.convert(bad, None, None)


def test_finite_float_refuses_what_click_float_range_takes():
    """click's FloatRange(min=0) takes 'nan', 'inf' and '1e400' (= inf); FiniteFloat does not."""
    assert click.FloatRange(min=0).convert("inf", None, None) == float("inf")
    t = FiniteFloat(min=0, min_open=True)
    for bad in ("nan", "inf", "1e400", "-inf", "0", "-1e-300"):
        with pytest.raises(click.BadParameter):
            t.convert(bad, None, None)
    assert t.convert("1e-300", None, None) == 1e-300 and t.convert(2, None, None) == 2.0


@pytest.mark.parametrize("value", ["0-5", "5-1", "nan", "x", "-3"])
def test_bench_serve_chunk_sizes_are_read_before_the_benchmark(value):
    option = next(p for p in main.commands["bench"].commands["serve"].params if p.name == "chunk_chars")
    assert_usage_error(["bench", "serve", "--chunk-chars", value], option)
