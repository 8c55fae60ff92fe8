"""``isan verify``: every file of a bundle hashed, plus what it caches on first use (the table a
recipe composes, the ONNX graphs built for a bundle that ships none)."""

from __future__ import annotations

from pathlib import Path

from isan.errors import TableFormatError


def verify_all(bundle: str | Path) -> dict:
    """``isan verify``: :func:`isan.engine.bundle.verify_bundle` (every file hashed), plus the table
    a recipe composes into the cache and the ONNX graphs cached for a bundle that ships none.

    Returns the report of verify_bundle with ``cached_table`` and ``onnx`` ("ok", a problem, or
    None when there is nothing to check); ``ok`` covers them all.
    """
    from isan.engine.bundle import verify_bundle

    bundle = Path(bundle)
    r = verify_bundle(bundle)
    r.setdefault("cached_table", None)
    if r["format_version"] is None:
        return r
    from isan.engine.bundle import read_manifest

    m = read_manifest(bundle, verify="none")
    from isan.trie_tables.build import RECIPE

    if m["kind"] == "isan" and (bundle / RECIPE).is_file() and not (bundle / "table").exists():
        import hashlib
        import json

        from isan.trie_tables.build import cache_dir, read_recipe
        from isan.trie_tables.format import load_table

        try:
            recipe = read_recipe(bundle / RECIPE)
            key = hashlib.sha256(json.dumps([m["params_sha256"], recipe["keys"], recipe.get("dtype")]).encode()
                                 ).hexdigest()[:20]
            path = cache_dir() / "tables" / key
            if (path / "header.json").exists():
                from isan.engine.bundle import key_alphabet, manifest_alphabet

                load_table(path, m["params_sha256"], key_alphabet(manifest_alphabet(m)), m["d"], verify=True)
                r["cached_table"] = "ok"
            else:
                r["cached_table"] = None  # not composed yet: nothing to check
        except TableFormatError as e:
            r["cached_table"] = f"{e} (it is rebuilt on the next use)"
            r["problems"].append(r["cached_table"])
    files = m.get("files") or {}
    graphs = [f for f in ("model.onnx", "sequence.onnx") if f in files]
    if graphs:
        bad = [f"{f}: {r['checked'][f]}" for f in graphs if r["checked"].get(f) != "ok"]
        r["onnx"] = "ok" if not bad else "; ".join(bad)
    elif "onnx" not in m and m["kind"] != "ngram":
        from isan.engine.baselines.onnx_graphs import check_cached_graphs, onnx_cache_path

        path = onnx_cache_path(m)
        if (path / "graphs.json").exists():
            problem = check_cached_graphs(path, m["params_sha256"])
            r["onnx"] = "ok" if problem is None else f"{problem} (rebuilt on the next use)"
            if problem:
                r["problems"].append(r["onnx"])
    r["ok"] = not r["problems"]
    return r
