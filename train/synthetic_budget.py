"""How many characters ``isan train --synthetic-chars N`` may sample: a whole number, 0 or more, that fits
in this machine's memory. Checked before any work (the CLI when it reads the option, the Trainer before
the teacher's pass), so that a wrong N never ends in a traceback after minutes of the teacher's pass.

Standard library only: the CLI reads it while parsing options, before torch is imported.
"""

from __future__ import annotations

import math
import os

from isan.errors import IsanError

#: the fewest output classes a character model has (the CLI's bound, before the data's alphabet is read)
MIN_CLASSES = 2


def bytes_per_char(n_classes: int) -> int:
    """Bytes one sampled character holds at the peak of sampling it (train/distill.py teacher_samples):
    its id (int64, sampled and copied: 16) and its teacher's distribution (float16 over the classes,
    sampled and copied: 4 per class). For text8's 27 classes, 124 bytes."""
    return 4 * n_classes + 16


def physical_memory_bytes() -> int | None:
    """This machine's memory in bytes, None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def max_synthetic_chars(n_classes: int = MIN_CLASSES, memory: int | None = None) -> int | None:
    """The most characters whose samples fit in ``memory`` bytes (default: this machine's), None when unknown."""
    memory = physical_memory_bytes() if memory is None else memory
    return None if memory is None else memory // bytes_per_char(n_classes)


def synthetic_chars_problem(value, n_classes: int = MIN_CLASSES, memory: int | None = None) -> str | None:
    """Why ``value`` cannot be a number of synthetic characters (a sentence that says what to give), or
    None when it can: it must be finite, a whole number, 0 or more, and fit in memory."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number of characters; got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number of characters (0: none); got {value}"
    if value < 0:
        return f"must be 0 or more characters (0: none); got {value:g}"
    if value != int(value):
        return f"must be a whole number of characters; got {value:g}"
    limit = max_synthetic_chars(n_classes, memory)
    if limit is not None and int(value) > limit:
        memory = physical_memory_bytes() if memory is None else memory
        shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
        size = (f"at least {bytes_per_char(n_classes)} bytes, {bytes_per_char(27)} for text8's 27 characters"
                if n_classes == MIN_CLASSES else f"{bytes_per_char(n_classes)} bytes for the model's {n_classes} outputs")
        return (f"{shown} characters do not fit in this machine's {memory / 2**30:.1f} GiB of memory (each sampled "
                f"character holds its id and the teacher's distribution while it is sampled: {size}); give at most "
                f"{limit:,}")
    return None


def check_synthetic_chars(value, n_classes: int = MIN_CLASSES) -> None:
    """Raise IsanError when ``value`` cannot be ``--synthetic-chars`` for a model of ``n_classes`` outputs."""
    problem = synthetic_chars_problem(value, n_classes)
    if problem:
        raise IsanError(f"--synthetic-chars {problem}")
