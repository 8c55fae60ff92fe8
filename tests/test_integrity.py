"""Integrity of every file: a folder of corrupt and hostile files, each refused with its typed error
(never a traceback, never a silently different number); fuzzing of the manifest and header
parsers; `isan verify`; leftover partial directories; table builds from any directory; the
shipped model's ONNX graphs built into the cache on first use and verified."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isan.alphabet import Alphabet
from isan.atomic import atomic_directory, make_partial_dir, owner_tag, remove_stale_partials
from isan.engine import Engine, load_engine
from isan.engine.bundle import (finalize_manifest, manifest_sha256, read_manifest, verify_bundle,
                                write_bundle)
from isan.errors import BundleFormatError, TableFormatError
from isan.trie_tables.build import build_from_recipe, plan_table, read_recipe, write_recipe
from isan.trie_tables.format import header_sha256, load_table, read_header

from conftest import random_params

A8 = Alphabet.text8()
REPO = Path(__file__).resolve().parents[1]


def isan(*args, input=None, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "isan.cli", *map(str, args)], input=input, capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def params():
    return random_params(d=16, seed=11, scale=0.95)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory, text8_path):
    """120,000 characters of text8 as a plain text file (90% mined as train)."""
    f = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    with open(text8_path, encoding="utf-8") as src:
        f.write_text(src.read(120_000), encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def good(tmp_path_factory, params, corpus_file):
    """A complete version-2 bundle: weights, table/, recipe, ONNX graphs, text8 normaliser."""
    from isan.export.tables import make_table

    hooks = [lambda tmp, m: make_table(tmp, m, params, A8, str(corpus_file), "text", budget="1MB", max_len=8,
                                       progress_bar=False)]
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401

        from isan.export.onnx_export import onnx_hook

        hooks.append(onnx_hook)
    except ImportError:
        pass

    def hook(tmp, m):
        for h in hooks:
            h(tmp, m)

    return write_bundle(tmp_path_factory.mktemp("good") / "bundle", params.as_dict(), A8, hook=hook,
                        normalizer="text8")


def copy(src: Path, tmp_path: Path, name="b") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def load_everything(b: Path):
    """What a user does with a bundle: load it (composed path) and score real-looking text."""
    eng = Engine.load(b)
    return eng.score("The quick brown fox, 1984.\n")


# ---- the folder of corrupt and hostile files --------------------------------------------------------
def _edit_json(rel, fn, reseal=False):
    def damage(b):
        p = b / rel
        obj = json.loads(p.read_text())
        obj = fn(obj) or obj
        if reseal and rel == "manifest.json":
            obj["manifest_sha256"] = manifest_sha256(obj)
        if reseal and rel.endswith("header.json"):
            obj["header_sha256"] = header_sha256(obj)
        p.write_text(json.dumps(obj, indent=1))
    return damage


def _swap_alphabet(m):
    a = m["alphabet"]
    a[1], a[2] = a[2], a[1]  # 'a' <-> 'b': bpc 4.75 instead of 1.69 before, exit 0


def _flip(rel, pos=None, bit=0):
    def damage(b):
        data = bytearray((b / rel).read_bytes())
        i = len(data) // 2 if pos is None else pos % len(data)
        data[i] ^= 1 << bit
        (b / rel).write_bytes(bytes(data))
    return damage


def _max_len_13(b):
    p = b / "table" / "header.json"
    p.write_text(p.read_text().replace('"max_len": 8', '"max_len": 9'))  # the one-bit edit (12 -> 13)


def _truncate(rel, keep=0.5):
    def damage(b):
        data = (b / rel).read_bytes()
        (b / rel).write_bytes(data[: int(len(data) * keep)])
    return damage


def _write(rel, text):
    def damage(b):
        (b / rel).write_text(text) if isinstance(text, str) else (b / rel).write_bytes(text)
    return damage


def _drop_key(rel, key, reseal=True):
    return _edit_json(rel, lambda o: o.pop(key) and None, reseal=reseal)


def _set(rel, key, value, reseal=True):
    return _edit_json(rel, lambda o: o.__setitem__(key, value), reseal=reseal)


def _fortran_table(b):
    """Issue #19: Ac.npy rewritten in Fortran order with every hash recomputed (header and manifest)."""
    import hashlib

    ac = np.load(b / "table" / "Ac.npy")
    np.save(b / "table" / "Ac.npy", np.asfortranarray(ac))
    data = (b / "table" / "Ac.npy").read_bytes()
    rec = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    hp = b / H
    h = json.loads(hp.read_text())
    h["sections"]["Ac.npy"] = rec
    h["header_sha256"] = header_sha256(h)
    hp.write_text(json.dumps(h, indent=1))
    mp = b / M
    m = json.loads(mp.read_text())
    m["files"]["table/Ac.npy"] = {**m["files"]["table/Ac.npy"], **rec}
    hdata = hp.read_bytes()
    m["files"]["table/header.json"] = {**m["files"]["table/header.json"], "bytes": len(hdata),
                                       "sha256": hashlib.sha256(hdata).hexdigest()}
    m["manifest_sha256"] = manifest_sha256(m)
    mp.write_text(json.dumps(m, indent=1))


DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = '{"format": "isan-bundle", "format_version": ' + "9" * 5000 + "}"
M, H, R = "manifest.json", "table/header.json", "table_recipe.json"

HOSTILE = {
    # manifest: edits are refused by its own hash; hostile JSON and schema violations by type
    "swapped_alphabet": (_edit_json(M, _swap_alphabet), BundleFormatError, "manifest_sha256"),
    "normalizer_edited": (_set(M, "normalizer", {"name": "none", "version": 1}, reseal=False), BundleFormatError,
                          "manifest_sha256"),
    "d_edited": (_set(M, "d", 17, reseal=False), BundleFormatError, "manifest_sha256"),
    "manifest_bit_flip": (_flip(M, 40, 1), BundleFormatError, "manifest|JSON"),
    "manifest_truncated": (_truncate(M), BundleFormatError, "not valid JSON"),
    "manifest_empty": (_write(M, ""), BundleFormatError, "not valid JSON"),
    "manifest_not_utf8": (_write(M, b"\xff\xfe{}"), BundleFormatError, "UTF-8"),
    "manifest_deeply_nested": (_write(M, DEEP), BundleFormatError, "nesting"),
    "manifest_huge_integer": (_write(M, HUGE_INT), BundleFormatError, "digits"),
    "manifest_nan": (_write(M, '{"format": "isan-bundle", "format_version": NaN}'), BundleFormatError, "NaN"),
    "manifest_duplicate_key": (_write(M, '{"format": "isan-bundle", "format": "x"}'), BundleFormatError, "twice"),
    "manifest_a_list": (_write(M, "[1, 2, 3]"), BundleFormatError, "not an isan bundle manifest"),
    "manifest_huge_file": (_write(M, " " * (17 << 20)), BundleFormatError, "at most"),
    "manifest_lacks_d": (_drop_key(M, "d"), BundleFormatError, "lacks the field 'd'"),
    "manifest_lacks_alphabet": (_drop_key(M, "alphabet"), BundleFormatError, "lacks the field 'alphabet'"),
    "manifest_lacks_files": (_drop_key(M, "files"), BundleFormatError, "lacks the field 'files'"),
    "manifest_lacks_hash": (_drop_key(M, "manifest_sha256", reseal=False), BundleFormatError, "manifest_sha256"),
    "manifest_d_string": (_set(M, "d", "16"), BundleFormatError, "'d' must be an integer"),
    "manifest_d_bool": (_set(M, "d", True), BundleFormatError, "'d' must be an integer"),
    "manifest_d_huge": (_set(M, "d", 10**25), BundleFormatError, "out of range"),
    "manifest_alphabet_ints": (_set(M, "alphabet", list(range(27))), BundleFormatError, "invalid alphabet"),
    "manifest_alphabet_string": (_set(M, "alphabet", " abc"), BundleFormatError, "'alphabet' must be"),
    "manifest_files_escape": (_set(M, "files", {"../../etc/passwd": {"bytes": 1, "sha256": "0" * 64}}),
                              BundleFormatError, "not a plain path"),
    "manifest_files_bad_record": (_set(M, "files", {"weights.safetensors": {"bytes": "5"}}), BundleFormatError,
                                  "record of"),
    "manifest_normalizer_unknown": (_set(M, "normalizer", {"name": "nfkc", "version": 1}), BundleFormatError,
                                    "unknown normaliser"),
    "manifest_version_4": (_set(M, "format_version", 4), BundleFormatError, "format_version"),
    "manifest_sha_not_hex": (_set(M, "params_sha256", "xyz"), BundleFormatError, "params_sha256"),
    # weights
    "weights_truncated": (_truncate("weights.safetensors"), BundleFormatError, "truncated"),
    "weights_bit_flip": (_flip("weights.safetensors"), BundleFormatError, "sha256"),
    "weights_missing": (lambda b: (b / "weights.safetensors").unlink(), BundleFormatError, "missing"),
    # table: header edits refused by its checksum; sections by size and sha256
    "header_max_len_flip": (_max_len_13, TableFormatError, "header_sha256"),
    "header_bit_flip": (_flip(H, 200, 2), TableFormatError, "header"),
    "header_deeply_nested": (_write(H, DEEP), TableFormatError, "nesting"),
    "header_huge_integer": (_write(H, '{"magic": "ISAN-TRIE-TABLE", "n_entries": ' + "1" * 5000 + "}"),
                            TableFormatError, "digits"),
    "header_lacks_key": (_drop_key(H, "n_entries"), TableFormatError, "lacks the field 'n_entries'"),
    "header_lacks_sections": (_drop_key(H, "sections"), TableFormatError, "lacks the field 'sections'"),
    "header_wrong_type": (_set(H, "d", [16]), TableFormatError, "'d' must be a non-negative integer"),
    "header_max_len_resealed": (_set(H, "max_len", 13), TableFormatError, "max_len=13"),
    "header_section_not_dict": (_set(H, "sections", {"Ac.npy": 5}), TableFormatError, "section"),
    "header_truncated": (_truncate(H), TableFormatError, "not valid JSON"),
    "table_Ac_truncated": (_truncate("table/Ac.npy"), TableFormatError, "truncated"),
    "table_R_bit_flip": (_flip("table/R.npy"), TableFormatError, "sha256"),
    "table_keys_garbage": (_write("table/keys.marisa", b"\0" * 64), TableFormatError, "bytes"),
    "table_Ac_fortran_order_resealed": (_fortran_table, TableFormatError, "Fortran order"),
    "table_deleted": (lambda b: shutil.rmtree(b / "table"), TableFormatError, "table is missing|lists a full table"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_file_is_refused_with_its_typed_error(name, good, tmp_path):
    damage, error, words = HOSTILE[name]
    b = copy(good, tmp_path)
    damage(b)
    with pytest.raises(error, match=words) as e:
        load_everything(b)
    msg = str(e.value)
    assert "isan export" in msg or "isan table build" in msg, msg  # names the command that rebuilds it
    assert len(msg) < 2000


def test_the_good_bundle_loads(good):
    r = load_everything(good)
    assert np.isfinite(r.bits) and r.normalization["normalizer"] == "text8-v1"
    assert verify_bundle(good)["ok"]


def test_recipe_damage(good, tmp_path, params, corpus_file, monkeypatch):
    monkeypatch.setenv("ISAN_CACHE_DIR", str(tmp_path / "cache"))
    b = copy(good, tmp_path)
    shutil.rmtree(b / "table")  # a recipe bundle: its table is composed into the cache on first use
    recipe = plan_table(A8.encode(corpus_file.read_text()[:50_000]), params, A8, budget="256KB", max_len=6)
    write_recipe(b / R, recipe)
    finalize_manifest(b, read_manifest(b, verify="none"))
    assert Engine.load(b).path == "composed"
    for text, words in [(DEEP, "nesting"), ('{"format": "isan-table-recipe", "format_version": 1}', "keys"),
                        ('{"format": "isan-table-recipe", "format_version": 1, "keys": "ab"}', "keys"),
                        ('{"format": "isan-table-recipe", "format_version": 1, "keys": ["ab"], "dtype": []}',
                         "dtype"), ("[]", "version-1 table recipe"), ("{", "not valid JSON")]:
        (b / R).write_text(text)
        with pytest.raises(BundleFormatError, match="table_recipe.json"):  # its record in the manifest first
            Engine.load(b)
        with pytest.raises(TableFormatError, match=words) as e:
            read_recipe(b / R)
        assert "isan export" in str(e.value)
    # a damaged cached table is rebuilt, not used
    write_recipe(b / R, recipe)
    t = Engine.load(b).table.path
    _flip("Ac.npy")(t)
    assert Engine.load(b).score("the cat").chars == 7
    assert load_table(t, params.sha256(), A8, 16).n_entries > 27


def test_single_bit_flips_in_the_manifest_and_header_are_refused(good, tmp_path):
    """Flip one bit in every third byte of manifest.json and table/header.json (each flip alone): none
    loads (the issue found edits that loaded and changed the bits by 1.3% or 180%)."""
    b = copy(good, tmp_path)
    rng = np.random.default_rng(1)
    for rel, check, err in [(M, lambda: read_manifest(b), BundleFormatError),
                            (H, lambda: read_header(b / "table"), TableFormatError)]:
        orig = (b / rel).read_bytes()
        for i in range(0, len(orig), 3):
            data = bytearray(orig)
            data[i] ^= 1 << int(rng.integers(8))
            (b / rel).write_bytes(bytes(data))
            with pytest.raises(err):
                check()
        (b / rel).write_bytes(orig)
        check()


def test_version_1_bundles_still_load(tmp_path, small_params):
    """A bundle written before integrity records (format version 1) loads, as raw text, unchecked."""
    b = write_bundle(tmp_path / "b", small_params.as_dict(), A8)
    m = json.loads((b / M).read_text())
    for k in ("files", "manifest_sha256", "normalizer"):
        m.pop(k)
    m["format_version"] = 1
    (b / M).write_text(json.dumps(m))
    eng = Engine.load(b)
    assert eng.normalizer.id == "none-v1" and eng.score("abc").chars == 3
    r = verify_bundle(b)
    assert r["ok"] and "version 1" in r["warning"]


def test_fast_check_by_default_full_check_with_verify(good, tmp_path, monkeypatch):
    import isan.engine.bundle as bundle_mod

    b = copy(good, tmp_path)
    monkeypatch.setattr(bundle_mod, "FAST_HASH_MAX_BYTES", 100)  # every file counts as large
    _flip("weights.safetensors")(b)
    read_manifest(b)  # sizes only: the flip is not seen here ...
    with pytest.raises(BundleFormatError, match="params_sha256"):
        Engine.load(b)  # ... but the weights' own hash refuses them
    with pytest.raises(BundleFormatError, match="weights.safetensors does not match its sha256"):
        read_manifest(b, verify="full")
    r = verify_bundle(b)
    assert not r["ok"] and "weights.safetensors" in r["problems"][0]


def test_isan_verify_cli(good, tmp_path):
    r = isan("verify", good)
    assert r.returncode == 0 and "ok\tweights.safetensors" in r.stdout and r.stdout.rstrip().endswith(": ok")
    j = json.loads(isan("verify", good, "--json").stdout)
    assert j["ok"] and j["table"] == "ok" and set(j["checked"]) >= {"weights.safetensors", "table/Ac.npy"}
    b = copy(good, tmp_path)
    _flip("table/Ac.npy")(b)
    (b / "stray.txt").write_text("x")
    r = isan("verify", b)
    assert r.returncode == 2 and "BAD\ttable/Ac.npy" in r.stdout and "note\tstray.txt" in r.stdout
    assert r.stderr.startswith("Error: ") and "Traceback" not in r.stderr
    # an extra file alone is a problem too (issue #19: it was reported but verify said ok)
    b2 = copy(good, tmp_path, "b2")
    (b2 / "stray.txt").write_text("x")
    r = isan("verify", b2, "--json")
    assert r.returncode == 2 and any("stray.txt" in p for p in json.loads(r.stdout)["problems"])
    # a table in Fortran order with every hash recomputed (issue #19: a traceback, and verify said ok)
    b3 = copy(good, tmp_path, "b3")
    _fortran_table(b3)
    r = isan("verify", b3)
    assert r.returncode == 2 and "Fortran order" in r.stdout + r.stderr
    r = isan("score", "--model", b3, "-", input="hello")
    assert r.returncode == 2 and "Fortran order" in r.stderr and "Traceback" not in r.stderr
    r = isan("verify", tmp_path / "nothing")
    assert r.returncode == 2 and "does not exist" in r.stderr


# ---- a lower format_version does not switch the checks off (#34 item 7) ----------------------------
SHIPPED = REPO / "isan" / "models" / "text8-d216-stable"
SENTENCE = "the quick brown fox jumps over the lazy dog\n"


def _shipped_copy(tmp_path, version=None, swap=False, strip=False, reseal=False, name="b") -> Path:
    """A copy of the shipped bundle whose manifest claims ``version``, with two letters of its alphabet
    swapped (``swap``), its hashes removed (``strip``) or its manifest_sha256 recomputed (``reseal``)."""
    b = copy(SHIPPED, tmp_path, name)
    m = json.loads((b / M).read_text())
    if version is not None:
        m["format_version"] = version
    if swap:
        _swap_alphabet(m)
    if strip:
        del m["files"], m["manifest_sha256"]
    if reseal:
        m["manifest_sha256"] = manifest_sha256(m)
    (b / M).write_text(json.dumps(m, indent=1))
    return b


def _cache_env(tmp_path, monkeypatch) -> dict:
    """A private table and ONNX cache (a copy must never recompose the user's cache of the shipped model)."""
    monkeypatch.setenv("ISAN_CACHE_DIR", str(tmp_path / "cache"))
    return {**os.environ, "ISAN_CACHE_DIR": str(tmp_path / "cache")}


@pytest.mark.parametrize("swap", [False, True], ids=["downgraded", "downgraded-and-edited"])
@pytest.mark.parametrize("version", [1, 2])
def test_a_manifest_with_hashes_is_checked_whatever_version_it_claims(version, swap, tmp_path, monkeypatch):
    """The issue's copy (version 1, 'a' and 'b' swapped) scored 7,504.58 bits instead of 5,644.22 and
    verified ok: its manifest still carries files and a manifest_sha256, and they no longer match."""
    env = _cache_env(tmp_path, monkeypatch)
    b = _shipped_copy(tmp_path, version, swap)
    for load in (lambda: Engine.load(b), lambda: read_manifest(b), lambda: load_engine(b)):
        with pytest.raises(BundleFormatError, match="does not match its manifest_sha256") as e:
            load()
        assert "isan export" in str(e.value) and "good copy" in str(e.value)  # what to do
    r = verify_bundle(b)
    assert not r["ok"] and "manifest_sha256" in r["problems"][0]
    if version == 1:  # the CLI as in the issue (version 2 manifests were checked already)
        assert "whatever format_version it claims" in str(e.value)
        r = isan("score", "--model", b, "-", input=SENTENCE, env=env)
        assert r.returncode == 2 and "manifest_sha256" in r.stderr and "Traceback" not in r.stderr
        assert "bits" not in r.stdout
        r = isan("verify", b, env=env)
        assert r.returncode == 2 and not r.stdout.rstrip().endswith(": ok") and "manifest_sha256" in r.stderr


def test_an_old_version_manifest_with_hashes_loads_only_if_they_match(tmp_path, monkeypatch):
    """Version 1 with consistent hashes loads and scores as the shipped model; an edited file of it is refused."""
    env = _cache_env(tmp_path, monkeypatch)
    b = _shipped_copy(tmp_path, 1, reseal=True)
    assert read_manifest(b, verify="full")["format_version"] == 1 and verify_bundle(b)["ok"]
    assert Engine.load(b, path_mode="chunked").score(SENTENCE).bits == \
        Engine.load(SHIPPED, path_mode="chunked").score(SENTENCE).bits
    _flip("MODEL_CARD.md")(b)  # one bit, the same size
    with pytest.raises(BundleFormatError, match="MODEL_CARD.md does not match its sha256"):
        Engine.load(b)
    r = isan("verify", b, env=env)
    assert r.returncode == 2 and "BAD\tMODEL_CARD.md" in r.stdout


def test_an_old_version_manifest_without_hashes_loads_with_a_warning(tmp_path, monkeypatch, caplog):
    """Hashes stripped from a version-1 manifest: nothing can be checked, so it loads (old bundles still
    load) but never silently: a logged warning, and `isan verify` says it cannot verify."""
    env = _cache_env(tmp_path, monkeypatch)
    b = _shipped_copy(tmp_path, 1, swap=True, strip=True)
    with caplog.at_level("WARNING", logger="isan"):
        eng = Engine.load(b, path_mode="chunked")
    assert eng.score(SENTENCE).chars == len(SENTENCE)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("records no hashes" in w and "cannot be verified" in w and str(b) in w for w in warned), warned
    r = verify_bundle(b)
    assert r["ok"] and not r["verified"] and "version 1" in r["warning"]
    r = isan("verify", b, env=env)
    assert r.returncode == 0 and "cannot verify" in r.stdout and not r.stdout.rstrip().endswith(": ok")
    r = isan("score", "--model", b, "--path", "chunked", "-", input=SENTENCE, env=env)
    assert r.returncode == 0 and "records no hashes" in r.stderr and "bits" in r.stdout
    # the shipped bundle itself is verified, and says so
    assert verify_bundle(SHIPPED)["verified"]
    # a version-2 manifest without hashes was, and is, refused
    with pytest.raises(BundleFormatError, match="lacks the field"):
        Engine.load(_shipped_copy(tmp_path, 2, strip=True, name="b2"))


def test_writers_renew_the_hashes_of_an_old_version_manifest_that_carries_them(tmp_path, small_params):
    """Adding ONNX graphs to a version-1 bundle whose manifest carries hashes records them anew (they are
    checked whatever version the manifest claims: left as they were, they would refuse the bundle)."""
    pytest.importorskip("onnx")
    from isan.export.onnx_export import export_bundle_onnx

    b = write_bundle(tmp_path / "b", small_params.as_dict(), A8)
    _edit_json(M, lambda m: m.update(format_version=1), reseal=True)(b)
    export_bundle_onnx(b)
    m = read_manifest(b, verify="full")
    assert m["format_version"] == 3 and {"model.onnx", "sequence.onnx"} <= set(m["files"])


# ---- fuzzing the parsers ---------------------------------------------------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**40, 10**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
MANIFEST_KEYS = ["format", "format_version", "kind", "alphabet", "d", "params_sha256", "normalizer", "files",
                 "manifest_sha256", "training", "table", "onnx", "model", "n_params"]
HEADER_KEYS = ["magic", "format_version", "complete", "dtype", "K", "V", "d", "alphabet", "max_len",
               "params_sha256", "n_entries", "n_readout_rows", "sections", "header_sha256"]


@pytest.fixture(scope="module")
def fuzz_dirs(tmp_path_factory, good):
    root = tmp_path_factory.mktemp("fuzz")
    b = copy(good, root)
    return b, json.loads((b / M).read_text()), json.loads((b / H).read_text())


def _mutated(base: dict, key, value, drop, reseal_field=None, reseal_fn=None):
    obj = dict(base)
    if drop:
        obj.pop(key, None)
    else:
        obj[key] = value
    if reseal_field:
        obj[reseal_field] = reseal_fn(obj)
    return obj


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(MANIFEST_KEYS), value=JSON_VALUES, drop=st.booleans(), reseal=st.booleans())
def test_fuzz_manifest_parser(fuzz_dirs, key, value, drop, reseal):
    """Any value in any field, with or without a consistent hash: a dict or a BundleFormatError, nothing else."""
    b, m, _ = fuzz_dirs
    obj = _mutated(m, key, value, drop, "manifest_sha256" if reseal else None, manifest_sha256)
    (b / M).write_text(json.dumps(obj))
    try:
        out = read_manifest(b)
    except BundleFormatError:
        return
    assert isinstance(out, dict) and out["format_version"] in (1, 2, 3)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200) | JSON_VALUES.map(lambda v: json.dumps(v).encode()))
def test_fuzz_raw_manifest_and_header_bytes(fuzz_dirs, data):
    b, _, _ = fuzz_dirs
    (b / M).write_bytes(data)
    with pytest.raises(BundleFormatError):
        read_manifest(b)
    (b / H).write_bytes(data)
    with pytest.raises(TableFormatError):
        read_header(b / "table")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(HEADER_KEYS), value=JSON_VALUES, drop=st.booleans(), reseal=st.booleans())
def test_fuzz_header_parser(fuzz_dirs, params, key, value, drop, reseal):
    b, _, h = fuzz_dirs
    obj = _mutated(h, key, value, drop, "header_sha256" if reseal else None, header_sha256)
    (b / H).write_text(json.dumps(obj))
    try:
        t = load_table(b / "table", params.sha256(), A8, 16)
    except TableFormatError:
        return
    assert t.n_entries == h["n_entries"]  # only a harmless edit (an informative field) can load


# ---- leftover partial directories ---------------------------------------------------------------------
def test_partials_of_dead_processes_are_removed_by_the_next_write(tmp_path, small_params):
    out = tmp_path / "bundle"
    code = ("import os, sys; from isan.atomic import make_partial_dir; "
            f"p = make_partial_dir({str(out)!r}); (p / 'weights.safetensors').write_bytes(b'x' * 1000); os._exit(9)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 9  # killed mid-write
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.partial-")]
    assert len(left) == 1
    write_bundle(out, small_params.as_dict(), A8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_partials_of_live_processes_are_kept_and_old_ones_removed(tmp_path):
    target = tmp_path / "t"
    mine = make_partial_dir(target)                      # this process: alive
    assert owner_tag() in mine.name
    fresh = tmp_path / ".t.partial-abcdefgh"             # untagged (an older isan): removed only when old
    fresh.mkdir()
    old = tmp_path / ".t.partial-zyxwvuts"
    old.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    other_host = tmp_path / ".t.partial-1@elsewhere-abcdefgh"
    other_host.mkdir()
    removed = remove_stale_partials(target)
    assert removed == [old]
    assert mine.exists() and fresh.exists() and other_host.exists()
    with atomic_directory(target) as tmp:
        (tmp / "f").write_text("ok")
    assert (target / "f").read_text() == "ok"
    shutil.rmtree(mine)


def test_interrupted_table_build_leaves_a_partial_that_the_next_build_removes(tmp_path, params, corpus_file):
    recipe = plan_table(A8.encode(corpus_file.read_text()[:50_000]), params, A8, budget="256KB", max_len=6)
    code = ("import os, json, numpy as np; from isan.alphabet import Alphabet; from isan.params import ISANParams; "
            "import isan.trie_tables.format as f; from isan.trie_tables.build import build_from_recipe; "
            "f.compose_entries = lambda *a, **k: os._exit(9); "
            f"p = ISANParams(**{{k: np.load({str(tmp_path)!r} + '/' + k + '.npy') for k in ('W','b','W_ro','b_ro','h0')}}); "
            f"build_from_recipe({str(tmp_path / 'table')!r}, json.load(open({str(tmp_path / 'r.json')!r})), p, "
            "Alphabet.text8(), 'x' * 64)")
    for k, v in params.as_dict().items():
        np.save(tmp_path / f"{k}.npy", v)
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 9
    assert any(p.name.startswith(".table.partial-") for p in tmp_path.iterdir())
    build_from_recipe(tmp_path / "table", recipe, params, A8, params.sha256())
    assert not any(p.name.startswith(".table.partial-") for p in tmp_path.iterdir())


# ---- table builds resolve the corpus against the bundle ------------------------------------------------
def test_table_build_works_from_any_directory(good, tmp_path):
    b = copy(good, tmp_path, "deeper/moved")
    shutil.copyfile(_corpus_of(good), tmp_path / "deeper" / "corpus.txt")
    m = read_manifest(b)
    assert m["table"]["corpus"]["path"].startswith("..")           # recorded relative to the bundle
    # the bundle moved beside a copy of its corpus: the recorded relative path no longer resolves ...
    r = isan("table", "build", "--model", b, "--overwrite", "--table-budget", "512KB", cwd=tempfile.gettempdir())
    assert r.returncode == 2 and "--table-corpus" in r.stderr and "Traceback" not in r.stderr
    # ... with --table-corpus it builds, records the corpus relative to the bundle, and rebuilds from anywhere
    r = isan("table", "build", "--model", b, "--overwrite", "--table-budget", "512KB", "--table-dataset", "text",
             "--table-corpus", tmp_path / "deeper" / "corpus.txt", cwd=tempfile.gettempdir())
    assert r.returncode == 0, r.stderr
    m = read_manifest(b)
    assert m["table"]["corpus"]["path"] == "../corpus.txt" and verify_bundle(b)["ok"]
    r = isan("table", "build", "--model", b, "--overwrite", "--table-budget", "512KB", cwd="/")
    assert r.returncode == 0, r.stderr
    assert Engine.load(b).path == "composed"


def _corpus_of(bundle: Path) -> Path:
    rec = read_manifest(bundle)["table"]["corpus"]
    return (bundle / rec["path"]).resolve()
