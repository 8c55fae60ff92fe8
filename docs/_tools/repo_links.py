"""An MkDocs hook for the docs site: links from a page to files of the repository outside docs/.

The guides link to committed result files (``../../results/table1/TABLE.md``), which work where
the Markdown is read in the repository (GitHub, an editor) but are not part of the built site.
For the site, each such link becomes its repository path as code (``results/table1/TABLE.md``),
and a link to a path that does not exist is a warning, so ``mkdocs build --strict`` fails on it
like on any other broken link.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.plugins import get_plugin_logger

log = get_plugin_logger("repo_links")

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"(!?)\[((?:[^\]\\]|\\.)*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _outside_link(m: re.Match, page_dir: Path, docs_dir: Path, repo: Path, where: str) -> str:
    bang, text, target = m.group(1), m.group(2), m.group(3)
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return m.group(0)
    path = target.split("#", 1)[0].split("?", 1)[0]
    if not path:
        return m.group(0)
    resolved = Path(os.path.normpath(page_dir / path))
    if resolved == docs_dir or docs_dir in resolved.parents:
        return m.group(0)  # a page or file of the site: MkDocs checks it
    if repo not in resolved.parents:
        log.warning(f"{where}: the link '{target}' leaves the repository")
        return text
    rel = resolved.relative_to(repo).as_posix() + ("/" if path.endswith("/") else "")
    if not resolved.exists():
        log.warning(f"{where}: the link '{target}' names '{rel}', which does not exist in the repository")
    if bang:
        log.warning(f"{where}: the image '{target}' is outside docs/ and cannot be shown on the site")
    plain = text.strip().strip("`")
    if plain in (rel, rel.rstrip("/"), resolved.name, path):
        return f"`{rel}`"
    return f"{text} (`{rel}`)"


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    page_dir = Path(page.file.abs_src_path).resolve().parent
    where = page.file.src_uri
    out, fence = [], None
    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1) == fence:
                fence = None
            out.append(line)
            continue
        if m:
            fence = m.group(1)
            out.append(line)
            continue
        # leave inline code alone: only the parts between code spans hold links
        parts = re.split(r"(`+[^`]*`+)", line)
        for i in range(0, len(parts), 2):
            parts[i] = _LINK.sub(lambda mm: _outside_link(mm, page_dir, docs_dir, repo, where), parts[i])
        out.append("".join(parts))
    return "\n".join(out)
