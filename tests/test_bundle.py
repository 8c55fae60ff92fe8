"""Bundle format: round trip, validation of corrupt or mismatched files, atomic writes."""

import json
import shutil

import numpy as np
import pytest

from isan.alphabet import Alphabet
from isan.engine import Engine
from isan.engine.bundle import manifest_sha256, read_manifest, write_bundle
from isan.errors import BundleFormatError

from conftest import random_params


def test_round_trip(small_bundle, small_params):
    m = read_manifest(small_bundle)
    assert m["format"] == "isan-bundle" and m["format_version"] == 3 and m["kind"] == "isan"
    assert m["normalizer"] == {"name": "none", "version": 1} and m["manifest_sha256"] == manifest_sha256(m)
    assert set(m["files"]) == {"weights.safetensors"}
    assert m["alphabet"] == list(" abcdefghijklmnopqrstuvwxyz") and m["d"] == 16
    assert m["params_sha256"] == small_params.sha256()
    eng = Engine.load(small_bundle)
    for n, a in small_params.as_dict().items():
        np.testing.assert_array_equal(getattr(eng.params32, n), a)


def copy_bundle(src, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage, message", [
    (lambda b: (b / "manifest.json").unlink(), "not an isan bundle"),
    (lambda b: (b / "manifest.json").write_text("{not json"), "not valid JSON"),
    (lambda b: (b / "weights.safetensors").write_bytes((b / "weights.safetensors").read_bytes()[:500]), "safetensors"),
    (lambda b: (b / "weights.safetensors").write_bytes(b"\x00" * 64), "safetensors"),
])
def test_corrupt_bundles_are_refused(small_bundle, tmp_path, damage, message):
    b = copy_bundle(small_bundle, tmp_path)
    damage(b)
    with pytest.raises(BundleFormatError, match=message) as e:
        Engine.load(b)
    assert "isan export" in str(e.value)


def edit_manifest(b, reseal=True, **changes):
    """Edit manifest fields; with ``reseal`` its manifest_sha256 is recomputed, so the deeper
    checks are what refuses the bundle (without it, the manifest's own hash does)."""
    m = json.loads((b / "manifest.json").read_text())
    m.update(changes)
    if reseal:
        m["manifest_sha256"] = manifest_sha256(m)
    (b / "manifest.json").write_text(json.dumps(m))


def test_version_and_mismatch(small_bundle, tmp_path):
    b = copy_bundle(small_bundle, tmp_path)
    edit_manifest(b, format_version=4)
    with pytest.raises(BundleFormatError, match="format_version"):
        Engine.load(b)
    edit_manifest(b, format_version=3, params_sha256="0" * 64)
    with pytest.raises(BundleFormatError, match="params_sha256"):
        Engine.load(b)
    edit_manifest(b, params_sha256=random_params().sha256(), d=17)
    with pytest.raises(BundleFormatError, match="d=17"):
        Engine.load(b)
    edit_manifest(b, reseal=False, d=16)
    with pytest.raises(BundleFormatError, match="manifest_sha256"):
        Engine.load(b)


def test_weights_of_another_model_are_refused(small_bundle, tmp_path):
    other = tmp_path / "other"
    write_bundle(other, random_params(seed=9).as_dict(), Alphabet.text8())
    b = copy_bundle(small_bundle, tmp_path)
    shutil.copyfile(other / "weights.safetensors", b / "weights.safetensors")
    with pytest.raises(BundleFormatError, match="weights.safetensors does not match its sha256"):
        Engine.load(b)


def test_missing_dir():
    with pytest.raises(BundleFormatError, match="does not exist"):
        Engine.load("/nonexistent/bundle")


def test_interrupted_write_leaves_nothing(tmp_path, small_params):
    out = tmp_path / "bundle"

    def boom(tmp, manifest):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_bundle(out, small_params.as_dict(), Alphabet.text8(), hook=boom)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no partial directory left behind


def test_non_finite_weights_are_refused(tmp_path, small_params):
    t = small_params.as_dict()
    t["W"] = t["W"].copy()
    t["W"][0, 0, 0] = np.nan
    with pytest.raises(BundleFormatError, match="non-finite"):
        write_bundle(tmp_path / "b", t, Alphabet.text8())
    assert not (tmp_path / "b").exists()


def test_existing_bundle_needs_overwrite(small_bundle, small_params):
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_bundle(small_bundle, small_params.as_dict(), Alphabet.text8())
