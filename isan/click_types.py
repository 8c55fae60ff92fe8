"""click parameter types shared by the CLIs (`isan` and `isan-serve`): numbers that refuse NaN and
infinities, and counts written in float notation. A value outside is a usage error (exit 2) that
names the option."""

from __future__ import annotations

import math

import click


class FiniteFloat(click.FloatRange):
    """A float option that refuses NaN and infinities (click's FLOAT and FloatRange take them), bounded
    as click.FloatRange is: ``FiniteFloat(min=0, min_open=True)`` takes positive numbers only. A value
    outside is a usage error (exit 2) that names the option; ``--help`` shows the range."""

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


class WholeNumber(click.IntRange):
    """A count written as an integer or in float notation (``36000000``, ``36e6``), bounded as
    click.IntRange is; NaN, infinities and fractions are usage errors (exit 2). Gives an int."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            number = count_text(value)
            if number is None:
                number = click.FLOAT.convert(value.strip(), param, ctx)  # its own error for a non-number
            if not math.isfinite(number) or number != int(number):
                self.fail(f"{value!r} is not a whole number.", param, ctx)
            value = int(number)
        return super().convert(value, param, ctx)


def count_text(text: str) -> int | float | None:
    """A count as written: an int (``36000000``), else a float (``36e6``, ``inf``, ``2.5``), else
    None where it is not a number. The caller says which floats it takes."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None
