"""Trie tables: exactness of the composed path, segmentation, batching, and the on-disk format.

The composed path's float32 tolerances are derived from the computation (tests/tolerances.py) for the model
on the text; two float32 computations within twice that. The stored maps are float64 products rounded to
float32: within u32 of each entry plus Higham's float64 bound of the products."""

import json
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isan.alphabet import Alphabet
from isan.engine import Engine
from isan.data import read_text8_split
from isan.errors import TableFormatError
from isan.trie_tables.build import build_from_recipe, plan_table
from isan.trie_tables.codes import code_of, decode_code, greedy_segment, longest_matches
from isan.trie_tables.format import header_sha256, load_table

from conftest import random_params
from tolerances import U32, U64, default_model_tolerance, gamma, isan_float32_tolerance

A8 = Alphabet.text8()


@pytest.fixture(scope="module")
def params():
    return random_params(d=16, seed=11, scale=0.95)


_tols: dict = {}


def f32_tol(params, text: str):
    """The derived float32 tolerance of scoring ``text`` from the model's h0 with ``params`` (cached)."""
    key = (params.sha256(), text)
    if key not in _tols:
        p = params.astype(np.float64)
        _tols[key] = isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, A8.encode(text), samples=4)
    return _tols[key]


@pytest.fixture(scope="module")
def split_tol(params, text8_test):
    """The tolerance on the test split: derived on its first 20,000 characters, carried to 500,000."""
    return f32_tol(params, text8_test[:20_000]).for_chars(len(text8_test))


@pytest.fixture(scope="module")
def recipe(params, text8_path):
    train = A8.encode(read_text8_split(text8_path, "train")[:400_000])
    return plan_table(train, params, A8, budget=3 << 20, max_len=12)


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory, params, recipe):
    return build_from_recipe(tmp_path_factory.mktemp("t") / "table", recipe, params, A8, params.sha256())


@pytest.fixture(scope="module")
def engine(params, table_dir):
    return Engine(params, A8, {"params_sha256": params.sha256()}, table=load_table(table_dir, params.sha256(), A8, 16))


def test_recipe_is_sensible(recipe):
    keys = recipe["keys"]
    assert set(A8.symbols) <= set(keys) and len(keys) > 100
    assert " the " in keys and recipe["expected_bytes"] <= 3 << 20
    assert recipe["avg_match_length"] > 1.5
    assert max(len(k) for k in keys) <= 12


def test_composed_equals_reference_on_the_test_split(engine, text8_test, split_tol):
    """Per-character bits, total bits and the final state within the derived tolerances; the composed path
    forced (a text this long would otherwise go chunk-parallel)."""
    ref = engine.with_path("reference").score(text8_test, per_char=True)
    comp = engine.score(text8_test, per_char=True, path="composed")
    assert engine.path == "composed" and comp.chars == 500_000 and comp.scoring == {"path": "composed"}
    np.testing.assert_allclose(comp.per_char_bits, ref.per_char_bits, atol=split_tol.bits, rtol=0)
    assert abs(comp.bits - ref.bits) <= split_tol.total_bits
    assert np.abs(comp.state.h - ref.state.h).max() <= split_tol.state
    np.testing.assert_allclose(engine.advance(text8_test[:50_000], path="composed").h,
                               engine.with_path("reference").advance(text8_test[:50_000]).h, rtol=0,
                               atol=split_tol.state)


def test_default_model_composed_equals_reference(default_engine, text8_test):
    assert default_engine.path == "composed", "the default bundle must ship (or build) a table"
    text = text8_test[:100_000]
    tol = default_model_tolerance().for_chars(len(text))
    ref = default_engine.with_path("reference").score(text, per_char=True)
    comp = default_engine.score(text, per_char=True, path="composed")
    np.testing.assert_allclose(comp.per_char_bits, ref.per_char_bits, atol=tol.bits, rtol=0)
    assert abs(comp.bits - ref.bits) <= tol.total_bits
    assert np.abs(comp.state.h - ref.state.h).max() <= tol.state


@settings(max_examples=40, deadline=None)
@given(text=st.text(alphabet=" abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=400).map(lambda s: s + " the of and "),
       cuts=st.lists(st.integers(1, 420), max_size=6))
def test_composed_chunk_invariance(engine, params, text, cuts):
    tol = f32_tol(params, text)
    whole = engine.score(text, per_char=True)
    ref = engine.with_path("reference").score(text, per_char=True)
    bounds = sorted({c for c in cuts if 0 < c < len(text)})
    state, parts = None, []
    for a, b in zip([0] + bounds, bounds + [len(text)]):
        r = engine.score(text[a:b], state=state, per_char=True)
        state = r.state
        parts.append(r.per_char_bits)
    np.testing.assert_allclose(np.concatenate(parts), whole.per_char_bits, rtol=0, atol=tol.twice().bits)
    np.testing.assert_allclose(whole.per_char_bits, ref.per_char_bits, rtol=0, atol=tol.bits)
    np.testing.assert_allclose(state.h, whole.state.h, rtol=0, atol=tol.twice().state)


def test_segmentation_is_greedy_longest_match(engine, text8_valid_head):
    """Vectorized matching equals a plain loop over marisa-trie prefixes."""
    t = engine.table
    text = text8_valid_head[:3000]
    ids = A8.encode(text)
    starts, lengths, entries = engine.composed.segment(ids)
    for got, twin in zip((starts, lengths, entries), engine.composed.segment_ref(ids)):  # compiled trie walk vs codes
        np.testing.assert_array_equal(got, twin)
    i, expect = 0, []
    while i < len(text):
        best = max(t.trie.prefixes(text[i : i + t.max_len]), key=len)
        expect.append((i, len(best), t.trie.key_id(best)))
        i += len(best)
    assert list(zip(starts.tolist(), lengths.tolist(), entries.tolist())) == expect
    assert lengths.mean() > 1.5


def test_codes_are_exact():
    ids = [5, 0, 26, 26, 1]
    assert decode_code(code_of(ids, 27), 27) == ids
    codes = np.sort(np.array([code_of([1, 2], 27), code_of([1, 2, 3], 27)], dtype=np.uint64))
    M = longest_matches(np.array([1, 2, 3, 1, 2, 1]), 27, codes, 3)
    assert M.tolist() == [3, 1, 1, 2, 1, 1]
    assert [s.tolist() for s in greedy_segment(M)] == [[0, 3, 5], [3, 2, 1]]


def test_entries_are_the_composed_maps(engine, params):
    """Ac[e] = [W[x_k] ... W[x_1] | c] and the stacked prefix readouts, checked by explicit products: the
    table's float64 products rounded to float32 (u32 relative) and ours in float64, each within Higham's
    gamma(k (d + 1) + d + 1, u64) of the products on absolute values."""
    t = engine.table
    p = params.astype(np.float64)

    def check(got, want, mag, depth):
        assert (np.abs(got - want) <= U32 * np.abs(want) + 2 * gamma(depth, U64) * mag).all()

    for key in [" the ", "e", "of the"]:
        if key not in t.trie:
            continue
        e = t.trie.key_id(key)
        A, c, absA, absc = np.eye(16), np.zeros(16), np.eye(16), np.zeros(16)
        for i, x in enumerate(A8.encode(key)):
            Ri = t.R[t.offsets[e] + i]
            check(Ri[:, :16], p.W_ro @ A, np.abs(p.W_ro) @ absA, (i + 1) * 17)
            check(Ri[:, 16], p.W_ro @ c + p.b_ro, np.abs(p.W_ro) @ absc + np.abs(p.b_ro), (i + 1) * 17)
            A, c = p.W[x] @ A, p.W[x] @ c + p.b[x]
            absA, absc = np.abs(p.W[x]) @ absA, np.abs(p.W[x]) @ absc + np.abs(p.b[x])
        check(t.Ac[e][:, :16], A, absA, len(key) * 17)
        check(t.Ac[e][:, 16], c, absc, len(key) * 17)


@pytest.mark.parametrize("group", ["entry", "symbol", "chunked"])
def test_batched_scoring_equals_single_streams(engine, params, text8_test, group):
    texts = [text8_test[i * 997 : i * 997 + 200 + 37 * i] for i in range(40)]
    batch = engine.score_batch(texts, per_char=True, group=group)
    ref = engine.with_path("reference")
    for t, r in zip(texts, batch):
        single = ref.score(t, per_char=True)
        assert r.chars == len(t)
        tol = f32_tol(params, t)
        np.testing.assert_allclose(r.per_char_bits, single.per_char_bits, rtol=0, atol=tol.bits)
        np.testing.assert_allclose(r.state.h, single.state.h, rtol=0, atol=tol.state)


def test_float16_table_tolerance(tmp_path, params, recipe, text8_test):
    """float16 storage: per-character bits within 0.02, total bits within a relative 1e-3 (stated in FORMAT.md)."""
    r16 = dict(recipe, dtype="float16")
    d16 = build_from_recipe(tmp_path / "t16", r16, params, A8, params.sha256())
    t16 = load_table(d16, params.sha256(), A8, 16)
    assert t16.header["dtype"] == "float16" and (d16 / "Ac.npy").stat().st_size < 0.6 * t16.Ac.nbytes
    eng = Engine(params, A8, {"params_sha256": params.sha256()}, table=t16)
    text = text8_test[:100_000]
    comp = eng.score(text, per_char=True, path="composed")
    ref = eng.with_path("reference").score(text, per_char=True)
    assert np.abs(comp.per_char_bits - ref.per_char_bits).max() < 0.02
    assert abs(comp.bits - ref.bits) < 1e-3 * ref.bits


# ---- format --------------------------------------------------------------------------------
def test_load_is_memory_mapped_and_validated(table_dir, params):
    t = load_table(table_dir, params.sha256(), A8, 16)
    assert isinstance(t.Ac, np.memmap) and isinstance(t.R, np.memmap)
    h = json.loads((table_dir / "header.json").read_text())
    assert h["magic"] == "ISAN-TRIE-TABLE" and h["format_version"] == 2 and h["complete"] is True
    assert h["header_sha256"] == header_sha256(h)
    assert h["n_entries"] == t.n_entries == len(t.trie)
    info = t.info()
    assert info["entries"] == t.n_entries and sum(info["length_histogram"].values()) == t.n_entries


def damaged(table_dir, tmp_path, fn):
    dst = tmp_path / "bad"
    shutil.copytree(table_dir, dst)
    fn(dst)
    return dst


def edit_header(reseal=True, **kw):
    """Edit header fields; with ``reseal`` the header's checksum is recomputed, so the deeper
    checks are what refuses the table (without it, the checksum does)."""
    def f(d):
        h = json.loads((d / "header.json").read_text())
        h.update(kw)
        if reseal:
            h["header_sha256"] = header_sha256(h)
        (d / "header.json").write_text(json.dumps(h))
    return f


def truncate(name, keep=0.5):
    def f(d):
        b = (d / name).read_bytes()
        (d / name).write_bytes(b[: int(len(b) * keep)])
    return f


def flip_byte(name):
    def f(d):
        b = bytearray((d / name).read_bytes())
        b[-5] ^= 0xFF
        (d / name).write_bytes(bytes(b))
    return f


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / "header.json").unlink(), "incomplete|no header"),
    (lambda d: (d / "header.json").write_text("{oops"), "not valid JSON"),
    (edit_header(magic="NOPE"), "magic"),
    (edit_header(format_version=9), "format_version"),
    (edit_header(complete=False), "incomplete"),
    (edit_header(params_sha256="f" * 64), "another model"),
    (edit_header(d=32), "d=32"),
    (edit_header(reseal=False, max_len=13), "header_sha256"),
    (edit_header(max_len=13), "max_len=13"),
    (edit_header(max_len=1), "exceeds max_len"),
    (truncate("Ac.npy"), "truncated"),
    (truncate("keys.marisa", 0.3), "truncated"),
    (flip_byte("R.npy"), "corrupt"),
    (lambda d: (d / "index.npy").unlink(), "lacks section"),
])
def test_bad_tables_are_refused(table_dir, tmp_path, params, damage, words):
    bad = damaged(table_dir, tmp_path, damage)
    with pytest.raises(TableFormatError, match=words) as e:
        load_table(bad, params.sha256(), A8, 16)
    assert "isan export" in str(e.value) or "isan table build" in str(e.value)


def test_table_of_another_model_is_refused_by_the_engine(tmp_path, table_dir, params):
    from isan.engine.bundle import write_bundle

    other = random_params(d=16, seed=99)
    b = tmp_path / "bundle"
    write_bundle(b, other.as_dict(), A8)
    shutil.copytree(table_dir, b / "table")
    with pytest.raises(TableFormatError, match="another model"):
        Engine.load(b)
    assert Engine.load(b, path_mode="reference").path == "reference"


def test_interrupted_build_leaves_nothing(tmp_path, params, recipe, monkeypatch):
    import isan.trie_tables.format as fmt

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(fmt, "compose_entries", boom)
    with pytest.raises(KeyboardInterrupt):
        build_from_recipe(tmp_path / "t", recipe, params, A8, params.sha256())
    assert list(tmp_path.iterdir()) == []
