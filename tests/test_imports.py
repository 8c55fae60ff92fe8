"""The house's rules (docs/ARCHITECTURE.md): every module imports alone; the import graph, imports inside
functions counted, has no cycle and no arrow up the documented order (the root's ground modules <
trie_tables/ < engine/ < the public faces isan/corpus.py and isan/kenlm.py < export/, train/ < isan/cli/,
isan/bench/; a package's __main__.py above them all, imported by nothing); engine/ never imports train/, export/, torch or triton (but the rooms ENGINE_ALLOWED names); trie_tables/
imports only the standard library, numpy, marisa-trie, tqdm and the root; no CLI command module
imports another. Imports are read from each module's source (ast), wherever they stand: at the
top, inside a function, a try or an if (the lazy imports too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"isan": REPO / "isan", "isan.engine": REPO / "engine", "isan.export": REPO / "export",
         "isan.train": REPO / "train", "isan.trie_tables": REPO / "trie_tables"}
CLI_COMMANDS = {"score", "train", "export", "model", "bench", "analyze", "studies", "corpus"}
#: what no module of engine/ imports
ENGINE_FORBIDDEN = ("isan.train", "isan.export", "torch", "triton")
#: rooms of engine/ allowed a forbidden import, each by one line: {room (a module or a package): {imports}}
ENGINE_ALLOWED: dict[str, set[str]] = {
    "isan.engine.kernels.torch": {"torch", "triton"},  # the torch backend (issue #35), imported only when asked for
    "isan.engine.kernels.backends": {"torch"},  # the registry: imports torch only when a torch device is asked for
}
#: what trie_tables/ may import besides the standard library, the root's modules (isan/*.py) and itself
TRIE_TABLES_THIRD_PARTY = ("numpy", "marisa_trie", "tqdm")


def modules() -> dict[str, Path]:
    out = {}
    for pkg, root in ROOTS.items():
        for f in sorted(root.rglob("*.py")):
            rel = f.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(p.startswith(".") or p == "__main__" for p in parts) or "models" in rel.parts[:1] and pkg == "isan":
                continue
            name = ".".join([pkg, *parts]) if parts else pkg
            if pkg == "isan" and parts and parts[0] in ("engine", "export", "train", "trie_tables"):
                continue
            out[name] = f
    return out


def imported_names(path: Path, module: str | None = None) -> set[str]:
    """Every module a file imports, wherever the statement stands (top, function, try, if):
    ``import a.b`` gives a.b; ``from a import b`` gives a and a.b (b may be a module); a relative
    import is resolved against ``module`` (the file's dotted name); ``importlib.import_module``
    and ``__import__`` of a literal name count too."""
    names = set()
    package = (module or "").split(".") if path.name == "__init__.py" else (module or "").split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert module, f"{path}: a relative import, and no module name to resolve it against"
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            names.add(source)
            names.update(f"{source}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (isinstance(node.func, ast.Name) and node.func.id in ("__import__", "import_module")
                   or isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")):
            names.add(node.args[0].value)
    return names


def within(name: str, package: str) -> bool:
    """Whether the dotted ``name`` is ``package`` or inside it."""
    return name == package or name.startswith(package + ".")


def engine_offences(name: str, imports: set[str]) -> set[str]:
    """The imports of engine module ``name`` that break the rule (ENGINE_FORBIDDEN but ENGINE_ALLOWED)."""
    allowed = set().union(*(a for room, a in ENGINE_ALLOWED.items() if within(name, room)))
    return {n for n in imports if any(within(n, f) for f in ENGINE_FORBIDDEN) and not any(within(n, a) for a in allowed)}


def trie_tables_offences(imports: set[str]) -> set[str]:
    """The imports of a trie_tables module outside the standard library, numpy, marisa-trie, tqdm,
    the root's modules (isan/*.py) and trie_tables itself."""
    root = {"isan"} | {f"isan.{f.stem}" for f in (REPO / "isan").glob("*.py") if f.stem != "__init__"}

    def ok(n: str) -> bool:
        top = n.split(".")[0]
        if top != "isan":
            return top in sys.stdlib_module_names or top in TRIE_TABLES_THIRD_PARTY
        # `from isan import x`/`from isan.errors import E` also name isan.x/isan.errors.E: check the module
        return within(n, "isan.trie_tables") or n in root or ".".join(n.split(".")[:2]) in root and n.count(".") >= 2
    return {n for n in imports if not ok(n)}


# ------------------------------------------------------------------ the import graph: cycles and the order
#: the documented order, bottom first: an arrow may point down or sideways (within a layer), never up
LAYERS = ("ground", "trie_tables", "engine", "face", "export/train", "cli/bench", "command")
#: the root's public faces over the engine (docs/ARCHITECTURE.md): modules of isan/ that may import engine/
FACES = ("isan.corpus", "isan.kenlm")


def entry_points() -> dict[str, Path]:
    """Every package's ``__main__.py`` (what ``python -m PACKAGE`` runs), by dotted name."""
    out = {}
    for pkg, root in ROOTS.items():
        for f in sorted(root.rglob("__main__.py")):
            parts = f.relative_to(root).parent.parts
            if pkg == "isan" and parts and parts[0] in ("engine", "export", "train", "trie_tables"):
                continue
            out[".".join([pkg, *parts, "__main__"])] = f
    return out


def layer(name: str) -> str:
    """The layer of module ``name`` in :data:`LAYERS`."""
    if name.endswith(".__main__"):
        return "command"
    parts = name.split(".")
    if len(parts) == 1:
        return "ground"  # isan/__init__.py
    if any(within(name, f) for f in FACES):
        return "face"
    return {"trie_tables": "trie_tables", "engine": "engine", "export": "export/train", "train": "export/train",
            "cli": "cli/bench", "bench": "cli/bench"}.get(parts[1], "ground")


def import_targets(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the file of ``module`` imports, wherever the statement stands: for
    ``import a.b.c`` the longest of a.b.c, a.b, a that is known; for ``from a import b`` a.b when it is a
    module, else a (importing a submodule runs its package's ``__init__`` first, but that is not an arrow
    of this module's); relative imports resolved; ``importlib.import_module``/``__import__`` of a literal."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]

    def known_prefix(n: str) -> str | None:
        parts = n.split(".")
        return next((c for k in range(len(parts), 0, -1) if (c := ".".join(parts[:k])) in known), None)

    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (isinstance(node.func, ast.Name) and node.func.id in ("__import__", "import_module")
                   or isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")):
            names = [node.args[0].value]
        else:
            continue
        out.update(t for n in names if (t := known_prefix(n)) and t != module)
    return out


def import_graph(mods: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """{module: the modules of ours it imports} over ``mods`` (default: every module and entry point)."""
    mods = {**modules(), **entry_points()} if mods is None else mods
    return {name: import_targets(path, name, set(mods)) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) for each strongly connected component of ``graph`` that has one
    (Tarjan's algorithm, iterative), sorted; empty when the graph is acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph.get(v, ()):
                    components.append(comp)
    out = []
    for comp in components:  # the shortest way from the component's first module back to it, inside it
        start = min(comp)
        paths = {start: [start]}
        queue = [start]
        cycle = None
        while queue and cycle is None:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    cycle = paths[v] + [start]
                    break
                if w in comp and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
        out.append(cycle)
    return sorted(out)


def order_offences(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The arrows (module, import) of ``graph`` that point up :data:`LAYERS`, or at a ``__main__``."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return {(m, t) for m, ts in graph.items() for t in ts
            if rank[layer(t)] > rank[layer(m)] or t.endswith(".__main__")}


def test_no_import_cycle():
    graph = import_graph()
    assert "isan.train.ddp.__main__" in graph and "isan.engine.serve.app" in graph["isan.engine.serve.workers"]
    found = cycles(graph)
    assert not found, "import cycles (imports inside functions counted):\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_import_arrow_breaks_the_documented_order():
    offences = order_offences(import_graph())
    assert not offences, "arrows up the order " + " < ".join(LAYERS) + ":\n" + "\n".join(
        f"{m} ({layer(m)}) -> {t} ({layer(t)})" for m, t in sorted(offences))
    rules = (REPO / "docs" / "ARCHITECTURE.md").read_text().split("## Rules the tests hold")[1]
    for face in FACES:  # the faces allowed over the engine are named in the rules
        assert f"`isan/{face.split('.')[1]}.py`" in rules, f"docs/ARCHITECTURE.md's rules do not name {face}"


def test_the_graph_checks_fail_on_a_planted_cycle_and_an_arrow_up(tmp_path):
    """The checks can fail: a cycle planted in a copy of the real graph is found, and so is one through an
    import inside a function of a package on disk; an arrow up the order is reported."""
    graph = {m: set(ts) for m, ts in import_graph().items()}
    assert "isan.engine.serve.scheduler" in graph["isan.engine.serve.service"]
    graph["isan.engine.serve.scheduler"].add("isan.engine.serve.service")  # the arrow back: a cycle
    found = cycles(graph)
    assert any(c[0] == c[-1] and {"isan.engine.serve.scheduler", "isan.engine.serve.service"} <= set(c)
               for c in found), found
    for c in found:  # each reported cycle is a real path of the graph
        assert all(b in graph[a] for a, b in zip(c, c[1:])), c

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import c  # a submodule: an arrow to pkg.sub.c only\n")
    (pkg / "a.py").write_text("import os\n\ndef f():\n    from . import b\n    return b\n")
    (pkg / "b.py").write_text("import importlib\nC = importlib.import_module('pkg.sub.c')\n")
    (pkg / "sub" / "c.py").write_text("from ..a import f\n")
    mods = {"pkg": pkg / "__init__.py", "pkg.sub": pkg / "sub" / "__init__.py", "pkg.a": pkg / "a.py",
            "pkg.b": pkg / "b.py", "pkg.sub.c": pkg / "sub" / "c.py"}
    g = import_graph(mods)
    assert g == {"pkg": set(), "pkg.sub": {"pkg.sub.c"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"},
                 "pkg.sub.c": {"pkg.a"}}
    assert cycles(g) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    (pkg / "a.py").write_text("import os\n")
    assert cycles(import_graph(mods)) == []
    assert cycles({"x": {"x"}}) == [["x", "x"]]

    up = {"isan.engine.bundle": {"isan.cli.helpers", "isan.errors"}, "isan.train.ddp": {"isan.cli"},
          "isan.kenlm": {"isan.engine"}, "isan.data": {"isan.corpus"}, "isan.cli.train": {"isan.train.ddp.__main__"},
          "isan.train.ddp.__main__": {"isan.cli"}, "isan.export.tables": {"isan.train.models", "isan.trie_tables"}}
    assert order_offences(up) == {("isan.engine.bundle", "isan.cli.helpers"), ("isan.train.ddp", "isan.cli"),
                                  ("isan.data", "isan.corpus"), ("isan.cli.train", "isan.train.ddp.__main__")}


PROBE = r"""
import importlib, json, sys
mods = json.loads(sys.argv[1])
bad = {}
for m in mods:
    for k in [k for k in sys.modules if k == "isan" or k.startswith("isan.")]:
        del sys.modules[k]  # each module alone: nothing of isan imported before it
    try:
        importlib.import_module(m)
    except ImportError as e:
        bad[m] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001
        bad[m] = f"{type(e).__name__}: {e}"
print(json.dumps(bad))
"""


def test_every_module_imports_alone():
    import json

    mods = sorted(modules())
    assert len(mods) > 60
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(mods)], capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    bad = json.loads(r.stdout.strip().splitlines()[-1])
    # optional extras may be absent on a machine; a circle or a missing module of ours never
    ours = {m: e for m, e in bad.items() if "isan" in e or "circular" in e or "partially initialized" in e}
    assert not ours, ours


def test_engine_never_imports_train_export_or_torch():
    mods = {name: path for name, path in modules().items() if within(name, "isan.engine")}
    assert len(mods) > 40 and "isan.engine.baselines.onnx" in mods and "isan.engine.serve.app" in mods
    offenders = {name: sorted(hits) for name, path in mods.items() if (hits := engine_offences(name, imported_names(path, name)))}
    assert not offenders, offenders
    rules = (REPO / "docs" / "ARCHITECTURE.md").read_text().split("## Rules the tests hold")[1]
    for room in ENGINE_ALLOWED:  # each allowed room exists and is named in the rules
        assert any(within(n, room) for n in mods), f"ENGINE_ALLOWED names {room}, which does not exist"
        assert f"`{room[len('isan.'):].replace('.', '/')}" in rules, f"docs/ARCHITECTURE.md's rules do not name {room}"


def test_trie_tables_import_only_the_stdlib_numpy_marisa_tqdm_and_the_root():
    mods = {name: path for name, path in modules().items() if within(name, "isan.trie_tables")}
    assert {"isan.trie_tables.format", "isan.trie_tables.build"} <= set(mods)
    offenders = {name: sorted(hits) for name, path in mods.items() if (hits := trie_tables_offences(imported_names(path, name)))}
    assert not offenders, offenders


def test_the_import_rules_see_every_kind_of_import(tmp_path, monkeypatch):
    """The checks can fail: lazy, relative and importlib imports are seen, and the allow-list is by room."""
    f = tmp_path / "mod.py"
    f.write_text("import numpy\n"
                 "def f():\n    from isan.export.onnx_export import cached_graphs\n"
                 "def g():\n    try:\n        import torch.nn\n    except ImportError:\n        pass\n"
                 "from ...train import loop\n"
                 "from . import results\n"
                 "import importlib\nimportlib.import_module('isan.train.models')\n"
                 "from isan import engine, errors\n")
    names = imported_names(f, "isan.engine.baselines.mod")
    forbidden = {"isan.export.onnx_export", "isan.export.onnx_export.cached_graphs", "torch.nn", "isan.train",
                 "isan.train.loop", "isan.train.models"}
    assert engine_offences("isan.engine.baselines.mod", names) == forbidden
    monkeypatch.setitem(ENGINE_ALLOWED, "isan.engine.kernels.torch", {"torch"})
    assert engine_offences("isan.engine.kernels.torch.scan", names) == forbidden - {"torch.nn"}
    assert engine_offences("isan.engine.kernels.streams", names) == forbidden
    monkeypatch.delitem(ENGINE_ALLOWED, "isan.engine.kernels.torch")
    assert engine_offences("isan.engine.kernels.torch.scan", names) == forbidden
    assert trie_tables_offences(names) == forbidden | {"isan.engine", "isan.engine.baselines",
                                                       "isan.engine.baselines.results"}
    assert trie_tables_offences({"os", "numpy", "marisa_trie", "tqdm.auto", "isan", "isan.errors", "isan.errors.X",
                                 "isan.trie_tables.codes"}) == set()


def test_no_cli_command_imports_another():
    for name, path in modules().items():
        if name.startswith("isan.cli.") and name.split(".")[-1] in CLI_COMMANDS:
            for n in imported_names(path):
                if n.startswith("isan.cli."):
                    assert n.split(".")[2] not in CLI_COMMANDS, (name, n)


def test_the_engine_top_holds_only_the_isan_core():
    core = {"__init__", "core", "results", "bundle", "normalize", "guard", "divergence", "certificate", "reference",
            "composed", "sampling", "blocks", "paths", "loading", "verify", "prepare", "forgetting", "planning", "exact",
            "batches", "packed", "route"}
    top = {p.stem for p in (REPO / "engine").glob("*.py")}
    assert top <= core, top - core
