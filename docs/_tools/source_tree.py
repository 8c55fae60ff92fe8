"""An MkDocs hook for the API reference: a tree of the one import package ``isan`` for griffe.

``pyproject.toml`` maps the subpackages of ``isan`` to top-level folders (``isan.engine`` is
``engine/``, ``isan.trie_tables`` is ``trie_tables/``, ...). mkdocstrings reads source statically
and follows folders, not that mapping, so before the build this hook lays out
``build/docs_src/isan/`` as the installed package looks: a link to each entry of ``isan/`` and one
to each mapped folder. ``mkdocs.yml`` points mkdocstrings at ``build/docs_src``. Nothing is
imported, so the reference builds from a checkout with or without an install.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.plugins import event_priority

TREE = Path("build") / "docs_src"


def _package_dir(pyproject: Path) -> dict[str, str]:
    """``[tool.setuptools] package-dir`` of pyproject.toml."""
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:  # Python 3.10: the one inline table this needs, read by hand
        table = re.search(r"^package-dir\s*=\s*\{([^}]*)\}", text, re.M).group(1)
        return dict(re.findall(r'"([^"]+)"\s*=\s*"([^"]+)"', table))
    return tomllib.loads(text)["tool"]["setuptools"]["package-dir"]


def _link(target: Path, link: Path) -> None:
    if link.is_symlink():
        if Path(os.readlink(link)) == target:
            return
        link.unlink()
    try:
        link.symlink_to(target, target_is_directory=target.is_dir())
    except FileExistsError:  # another build laid the same link at the same moment
        pass


@event_priority(100)  # before mkdocstrings creates its handler
def on_config(config):
    repo = Path(config["config_file_path"]).resolve().parent
    package_dir = _package_dir(repo / "pyproject.toml")
    root = repo / TREE
    pkg = root / "isan"
    pkg.mkdir(parents=True, exist_ok=True)
    wanted = {}
    for entry in (repo / package_dir["isan"]).iterdir():
        if entry.name != "__pycache__":
            wanted[entry.name] = entry
    for name, folder in package_dir.items():
        parts = name.split(".")
        if parts[0] == "isan" and len(parts) == 2:  # deeper ones lie inside their parent's folder
            wanted[parts[1]] = repo / folder
    for name, target in wanted.items():
        _link(target, pkg / name)
    for link in pkg.iterdir():  # links to entries removed since the last build
        if link.name not in wanted and link.is_symlink():
            link.unlink()
    return config
