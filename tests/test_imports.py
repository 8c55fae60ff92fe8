"""The house's rules (docs/ARCHITECTURE.md): every module imports alone, with no import circle;
engine/ never imports train/ or torch; no CLI command module imports another."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"isan": REPO / "isan", "isan.engine": REPO / "engine", "isan.export": REPO / "export",
         "isan.train": REPO / "train", "isan.trie_tables": REPO / "trie_tables"}
CLI_COMMANDS = {"score", "train", "export", "model", "bench", "analyze", "studies", "corpus"}


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


def imported_names(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


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


def test_engine_never_imports_train_or_torch():
    offenders = {}
    for name, path in modules().items():
        if name.startswith("isan.engine"):
            hits = {n for n in imported_names(path) if n == "torch" or n.startswith("torch.")
                    or n == "isan.train" or n.startswith("isan.train.")}
            if hits:
                offenders[name] = sorted(hits)
    assert not offenders, offenders


def test_trie_tables_import_only_numpy_marisa_and_the_root():
    for name, path in modules().items():
        if name.startswith("isan.trie_tables"):
            for n in imported_names(path):
                assert not n.startswith(("isan.engine", "isan.export", "isan.train", "torch")), (name, n)


def test_no_cli_command_imports_another():
    for name, path in modules().items():
        if name.startswith("isan.cli.") and name.split(".")[-1] in CLI_COMMANDS:
            for n in imported_names(path):
                if n.startswith("isan.cli."):
                    assert n.split(".")[2] not in CLI_COMMANDS, (name, n)


def test_the_engine_top_holds_only_the_isan_core():
    core = {"__init__", "core", "results", "bundle", "normalize", "guard", "divergence", "certificate", "reference",
            "composed", "sampling", "blocks"}
    top = {p.stem for p in (REPO / "engine").glob("*.py")}
    assert top <= core, top - core
