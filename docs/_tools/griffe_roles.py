"""A griffe extension for the docs site, for two habits of isan's docstrings.

* Sphinx roles (``:class:`State```, ``:func:`~isan.corpus.read_output```): Markdown has none, so
  each becomes a code span of its target (``~`` keeps only the last name, as in Sphinx).
* Several exceptions on one line of a ``Raises:`` section with a note in parentheses
  (``AlphabetError, StateDivergedError (as score).``): written as Google style's
  ``AlphabetError, StateDivergedError: as score.``, which griffe reads as one entry.
* A section heading (``Raises:``) right after the last line of the section before it: Google
  style wants a blank line there, so one is added.
"""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|ref):`(~?)([^`<]+?)(?:\s*<([^`>]+)>)?`")


def _code(m: re.Match) -> str:
    tilde, target, explicit = m.group(1), m.group(2).strip(), m.group(3)
    shown = (explicit and target) or (target.rsplit(".", 1)[-1] if tilde else target)
    return f"`{shown}`"


_RAISES = re.compile(r"^(?P<indent>[ \t]+)(?P<names>[A-Z]\w*(?:,[ \t]*[A-Z]\w*)+)[ \t]+\((?P<note>[^\n]*)\)\.?[ \t]*$", re.M)


def _raises(text: str) -> str:
    head, sep, rest = text.partition("Raises:\n")
    if not sep:
        return text
    # the section runs to the first line indented no deeper than its heading
    indent = len(head.rsplit("\n", 1)[-1])
    lines = rest.split("\n")
    end = next((i for i, line in enumerate(lines)
                if line.strip() and len(line) - len(line.lstrip()) <= indent), len(lines))
    section = _RAISES.sub(lambda m: f"{m['indent']}{m['names']}: {m['note']}.", "\n".join(lines[:end]))
    return head + sep + "\n".join([section] + lines[end:])


_SECTION = re.compile(r"(?<=\S)\n(?P<head>[ \t]*(?:Args|Arguments|Parameters|Returns|Yields|Raises|Attributes|"
                      r"Examples?|Notes?|Warnings?):[ \t]*\n)")


def _sections(text: str) -> str:
    return _SECTION.sub(lambda m: "\n\n" + m["head"], text)


class IsanDocstrings(griffe.Extension):
    """Every docstring as Markdown and Google style read it (the module's docstring says what changes)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _sections(_raises(_ROLE.sub(_code, obj.docstring.value)))
