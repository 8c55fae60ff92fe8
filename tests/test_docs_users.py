"""The user docs speak to users: no reference to this project's own issue tracker.

A user reads README.md, the guides (docs/**/*.md), the results' and benchmarks' pages
(results/**/*.md, bench_results/**/*.md) and the shipped models' cards; a number of our tracker
("issue 22", "issues #34 and #45", a heading's anchor "...-issue-22", a bare "(#36)") means nothing
to them. An issue of another project, written ``owner/repo#N`` (``kpu/kenlm#73``), ``repo#N``
(``llama.cpp#8942``), "kpu/kenlm issue 73", "issue 73 of kpu/kenlm" or as its GitHub address, is a
citation and is allowed. Code docstrings and comments are for developers and are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: the user-facing Markdown, as globs from the repository root
USER_DOCS = ("README.md", "docs/**/*.md", "results/**/*.md", "bench_results/**/*.md", "isan/models/*/MODEL_CARD.md")

#: "issue 22", "Issue #36", "issues #34 and #45", "issue-22" (an anchor), "issues: 3"
_ISSUE_WORD = re.compile(r"\bissues?[\s:#-]*\d+", re.IGNORECASE)
#: a bare "#36" that does not follow a repository's name (kpu/kenlm#73, llama.cpp#8942), an HTML
#: entity (&#8217;) or a word, and is not the start of an anchor such as "#1-three-runs"
_BARE_NUMBER = re.compile(r"(?<![\w./&-])#\d+(?![\w-])")
_REPO_NAME = r"[\w.-]+/[\w.-]+"
#: "kpu/kenlm issue 73" (the repository before) and "issue 73 of kpu/kenlm" (after)
_REPO_BEFORE = re.compile(_REPO_NAME + r"[\s'’s]*$")
_REPO_AFTER = re.compile(r"^\s+(?:of|in)\s+" + _REPO_NAME)


def own_issue_references(text: str) -> list[str]:
    """The references to this project's issues in ``text``, in order of appearance.

    Args:
        text: Markdown.

    Returns:
        Each offending match as written (``"issue 22"``, ``"issue-22"``, ``"#36"``); empty when
        the text cites only other projects' issues (``owner/repo#N``, ``repo#N``, "issue N of
        owner/repo", "owner/repo issue N", or an ``https://github.com/.../issues/N`` address).
    """
    found = []
    for m in _ISSUE_WORD.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        line_end = text.find("\n", m.end())
        before, after = text[line_start:m.start()], text[m.end():line_end if line_end >= 0 else len(text)]
        if _REPO_BEFORE.search(before) or _REPO_AFTER.match(after):
            continue
        found.append(m.group(0))
    found.extend(m.group(0) for m in _BARE_NUMBER.finditer(text))
    return found


def user_docs() -> list[Path]:
    """The user-facing Markdown files of the checkout (see :data:`USER_DOCS`), sorted."""
    return sorted({p for pattern in USER_DOCS for p in REPO.glob(pattern) if p.is_file()})


@pytest.mark.parametrize("text", [
    "## Composed jumps in the batched kernels (issue 22)",
    "[speed](docs/guide/tables-and-speed.md#composed-jumps-in-the-batched-kernels-issue-22)",
    "2.9M chars/s from 4 threads on (issue #36: measured on 16 cores)",
    "as issues #34 and #45 asked",
    "Issue 37's 1.70 is still 0.031 away.",
    "the torch backend (#35), torch only",
])
def test_an_own_issue_is_found(text):
    """Each form of a reference to our tracker is found: the check can fail."""
    assert own_issue_references(text), text


@pytest.mark.parametrize("text", [
    "KenLM's lmplz has no such option (kpu/kenlm#73).",
    "as llama.cpp#8942 reports",
    "see issue 73 of kpu/kenlm",
    "the kpu/kenlm issue 73",
    "https://github.com/kpu/kenlm/issues/73",
    "[run 1](#1-three-ensemble-distillation-runs-at-once) and &#8217;",
    "## Composed jumps in the batched kernels",
    "the budget of 16 MB, 36 threads, run #",
])
def test_another_projects_issue_and_plain_text_pass(text):
    """Citations of other projects' issues, anchors that start with a digit, HTML entities and
    plain numbers are not references to our tracker."""
    assert own_issue_references(text) == [], text


def test_user_docs_do_not_mention_our_issues():
    """No user doc names one of our issues, in its text, its headings or the anchors it links to
    (a renamed heading's old anchor would otherwise live on in its links)."""
    docs = user_docs()
    assert REPO / "README.md" in docs and any(p.parent.name == "guide" for p in docs)
    hits = [f"{p.relative_to(REPO).as_posix()}:{n}: {ref!r} in {line.strip()[:120]}"
            for p in docs
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            for ref in own_issue_references(line)]
    assert not hits, (f"{len(hits)} references to this project's issues in user docs (say what is meant in "
                      "words; rename a heading and every link to its anchor):\n" + "\n".join(hits))
