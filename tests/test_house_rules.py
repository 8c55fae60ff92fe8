"""The house's rules on the shape of the code (docs/ARCHITECTURE.md), read from each file's source
(ast): no Python file over 600 lines (tests included); no function over 80 lines outside the tests,
but the ones listed in FUNCTION_EXCEPTIONS, a list that only shrinks; no module imports an underscore
name from another isan module or reads one from an isan module it imported (a helper used across
modules has a public name in the module of its concept), but the C extension's module
(UNDERSCORE_IMPORT_EXCEPTIONS). Each rule is shown to fail on a planted violation."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the package's folders (the import package ``isan``'s subpackages) and the benchmark scripts
PACKAGE_ROOTS = ("isan", "engine", "export", "train", "trie_tables", "bench_results")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
#: underscore names that may be imported across modules: {"module.name": reason}
UNDERSCORE_IMPORT_EXCEPTIONS = {
    "isan.engine.kernels._native": "the compiled C extension's module: setuptools builds it under this private "
                                   "name, and isan.engine.kernels.native() is its public face",
}
#: the functions allowed over MAX_FUNCTION_LINES, {"path:qualified name": reason}: none today (a table of
#: data may be listed, with the reason); each entry must still exist and still be too long
FUNCTION_EXCEPTIONS: dict[str, str] = {}


def python_files(roots=PACKAGE_ROOTS + ("tests",), repo: Path = REPO) -> list[Path]:
    """The .py files under ``roots`` (folders of ``repo``), hidden folders left out."""
    files = []
    for root in roots:
        files += [f for f in sorted((repo / root).rglob("*.py"))
                  if not any(p.startswith(".") for p in f.relative_to(repo).parts)]
    return files


def long_files(files, repo: Path = REPO) -> dict[str, int]:
    """{path: lines} of the files over MAX_FILE_LINES lines."""
    out = {}
    for f in files:
        n = len(f.read_text().splitlines())
        if n > MAX_FILE_LINES:
            out[f.relative_to(repo).as_posix()] = n
    return out


def module_name(path: Path, repo: Path = REPO) -> str:
    """The dotted name of a package file (``engine/kernels/streams.py`` is ``isan.engine.kernels.streams``)."""
    parts = list(path.relative_to(repo).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts if parts[0] == "isan" else ["isan", *parts])


def is_module(name: str, repo: Path = REPO) -> bool:
    """Whether the dotted isan ``name`` is a module or package of ``repo`` (a file, not a name in one)."""
    parts = name.split(".")[1:]
    folder = repo / (parts[0] if parts and parts[0] in PACKAGE_ROOTS else "isan")
    rest = parts[1:] if parts and parts[0] in PACKAGE_ROOTS else parts
    base = folder.joinpath(*rest) if rest else folder
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def isan_source(node: ast.ImportFrom, package: list[str]) -> str:
    """The module a ``from ... import`` reads, relative imports resolved against ``package``."""
    if node.level:
        return ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    return node.module or ""


def underscore_imports(path: Path, repo: Path = REPO) -> set[str]:
    """The ``module.name`` of every underscore name (not a dunder) that ``path`` takes from another
    isan module: imported (absolute or relative, wherever the import stands), or read as an
    attribute of an imported isan module (``import isan.x as m; m._name``)."""
    module = module_name(path, repo)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    tree = ast.parse(path.read_text(), str(path))
    out, modules = set(), {}  # modules: {the name bound in the file: the isan module it is}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update({a.asname or a.name: a.name for a in node.names if a.name.split(".")[0] == "isan"})
        if not isinstance(node, ast.ImportFrom):
            continue
        source = isan_source(node, package)
        if source.split(".")[0] != "isan":
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                out.add(f"{source}.{alias.name}")
            if is_module(f"{source}.{alias.name}", repo):
                modules[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and ast.unparse(node.value) in modules):
            out.add(f"{modules[ast.unparse(node.value)]}.{node.attr}")
    return out


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method in ``tree``, nested ones too
    (``f.<locals>.g``, ``Class.method``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def function_lengths(files, repo: Path = REPO) -> dict[str, int]:
    """{"path:qualified name": lines from its ``def`` to its last line} of every function in ``files``."""
    out = {}
    for f in files:
        for name, node in functions(ast.parse(f.read_text(), str(f))):
            out[f"{f.relative_to(repo).as_posix()}:{name}"] = node.end_lineno - node.lineno + 1
    return out


def long_functions(files, exceptions: dict[str, str], repo: Path = REPO) -> tuple[dict[str, int], list[str]]:
    """(the functions over MAX_FUNCTION_LINES not in ``exceptions``, the exceptions that no longer
    exist or no longer exceed it)."""
    lengths = function_lengths(files, repo)
    over = {k: n for k, n in lengths.items() if n > MAX_FUNCTION_LINES and k not in exceptions}
    stale = [k for k in exceptions if lengths.get(k, 0) <= MAX_FUNCTION_LINES]
    return over, stale


def test_no_python_file_over_600_lines():
    assert long_files(python_files()) == {}, "split the file by concept (one concept a file)"


def test_no_import_of_an_underscore_name_from_another_isan_module():
    found = {f.relative_to(REPO).as_posix(): names - UNDERSCORE_IMPORT_EXCEPTIONS.keys()
             for f in python_files(PACKAGE_ROOTS) for names in [underscore_imports(f)]}
    assert {k: v for k, v in found.items() if v} == {}, \
        "give the helper a public name in the module of its concept, and import that"


def test_no_function_over_80_lines_outside_the_exceptions_and_the_list_only_shrinks():
    over, stale = long_functions(python_files(PACKAGE_ROOTS), FUNCTION_EXCEPTIONS)
    assert over == {}, "split these functions by concept (or, for a table of data, list it with the reason)"
    assert stale == [], "these are gone or short now: drop them from FUNCTION_EXCEPTIONS"


def test_the_architecture_notes_state_these_rules():
    rules = (REPO / "docs" / "ARCHITECTURE.md").read_text().split("## Rules the tests hold")[1]
    for fact in (f"no Python file over {MAX_FILE_LINES} lines", f"no function over {MAX_FUNCTION_LINES} lines",
                 "`FUNCTION_EXCEPTIONS`", *(f"`{name}`" for name in UNDERSCORE_IMPORT_EXCEPTIONS)):
        assert fact in " ".join(rules.split()), f"docs/ARCHITECTURE.md's rules do not say {fact}"


def test_each_rule_fails_on_a_planted_violation(tmp_path):
    pkg = tmp_path / "engine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("def _helper():\n    return 1\n")
    long_body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (pkg / "user.py").write_text(
        "from isan.engine.helpers import _helper\nfrom .helpers import _helper as h\nfrom isan.engine import __version__\n"
        "from isan.engine import helpers as hm\nimport isan.engine.helpers\nhm._state, isan.engine.helpers._other, hm.__doc__\n"
        f"def long():\n{long_body}    return 0\n"
        "def short():\n    return 0\n")
    (pkg / "big.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    files = python_files(("engine",), tmp_path)

    assert long_files(files, tmp_path) == {"engine/big.py": MAX_FILE_LINES + 1}
    assert underscore_imports(pkg / "user.py", tmp_path) == {"isan.engine.helpers._helper", "isan.engine.helpers._state",
                                                            "isan.engine.helpers._other"}
    assert underscore_imports(pkg / "helpers.py", tmp_path) == set()
    over, stale = long_functions(files, {"engine/user.py:short": "planted", "engine/gone.py:f": "planted"}, tmp_path)
    assert over == {"engine/user.py:long": MAX_FUNCTION_LINES + 2}
    assert stale == ["engine/user.py:short", "engine/gone.py:f"]
    assert long_functions(files, {"engine/user.py:long": "planted"}, tmp_path) == ({}, [])
