"""Strict, bounded JSON for the files isan reads back (manifests, table headers, recipes, configs).

``json.loads`` on a hostile file can raise RecursionError (deep nesting), ValueError (an
integer beyond Python's digit limit), or return NaN, duplicate keys, or huge numbers that break
code further on. :func:`read_json` turns every such file into one typed error whose message names
the file and the command that rebuilds it, and :func:`canonical_sha256` gives the hash that
manifests and table headers record of their own content.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: files larger than this are refused before parsing (a manifest is a few KB)
MAX_JSON_BYTES = 16 << 20
#: deepest nesting accepted (isan's own files nest at most 5 levels)
MAX_DEPTH = 64
#: longest integer literal accepted (digits)
MAX_INT_DIGITS = 30


class JSONContentError(ValueError):
    """Raised inside :func:`loads_strict` for content that is valid-looking but unacceptable."""


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise JSONContentError(f"an integer with {len(s)} digits")
    return int(s)


def _parse_constant(s: str):
    raise JSONContentError(f"the non-standard constant {s}")


def _pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise JSONContentError(f"the key {k!r} twice")
        out[k] = v
    return out


def _depth(obj) -> int:
    """Nesting depth, iteratively (no recursion)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


def loads_strict(text: str | bytes) -> Any:
    """Parse JSON, refusing NaN/Infinity, duplicate keys, integers over MAX_INT_DIGITS digits,
    floats that overflow, and nesting deeper than MAX_DEPTH.

    Raises:
        ValueError: (JSONDecodeError, JSONContentError, UnicodeDecodeError) with the reason.
    """
    try:
        obj = json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant, object_pairs_hook=_pairs,
                         parse_float=_parse_float)
    except RecursionError:
        raise JSONContentError(f"nesting deeper than {MAX_DEPTH} levels") from None
    if _depth(obj) > MAX_DEPTH:
        raise JSONContentError(f"nesting deeper than {MAX_DEPTH} levels")
    return obj


def _parse_float(s: str) -> float:
    if len(s) > 100:
        raise JSONContentError(f"a number literal of {len(s)} characters")
    x = float(s)
    if x in (float("inf"), float("-inf")):
        raise JSONContentError(f"the number {s[:20]} overflows")
    return x


def read_json(path: str | Path, error_cls: type[Exception], fix: str, what: str = "JSON file",
              max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read and parse a JSON file strictly; every problem is one ``error_cls`` naming ``fix``.

    Args:
        error_cls: the typed error to raise (e.g. BundleFormatError).
        fix: what rebuilds the file, e.g. "re-run `isan export CHECKPOINT_DIR BUNDLE --overwrite`".
        what: the file's role in messages ("bundle manifest").
    Raises:
        error_cls: missing, unreadable, too large, not UTF-8, not JSON, or hostile content.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error_cls(f"{path} has {size:,} bytes; a {what} has at most {max_bytes:,}; {fix}")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error_cls(f"{path} does not exist; {fix}") from None
    except IsADirectoryError:
        raise error_cls(f"{path} is a directory, not a {what}; {fix}") from None
    except OSError as e:
        raise error_cls(f"{path} cannot be read ({e.strerror or e}); {fix}") from None
    try:
        return loads_strict(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error_cls(f"{path} is not UTF-8 ({e.reason} at byte {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        raise error_cls(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}") from None
    except (JSONContentError, ValueError) as e:
        raise error_cls(f"{path} is not an acceptable {what} (it holds {e}); {fix}") from None


def canonical_json(obj) -> bytes:
    """The canonical bytes of a JSON value: sorted keys, no spaces, ASCII, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def canonical_sha256(obj) -> str:
    """sha256 of :func:`canonical_json` (what a manifest or header records of its own content)."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def file_sha256(path: str | Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            h.update(chunk)
    return h.hexdigest()


def is_sha256(x) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)
