"""ONNX export: a bundle's ``model.onnx`` and ``sequence.onnx`` (``isan export --onnx``), and the
graphs of a baseline torch module.

The graphs themselves (files, inputs and outputs, the logits convention, metadata) are built by
:mod:`isan.engine.baselines.onnx_graphs` from numpy weights, without torch; the engine builds the
shipped model's graphs into the user cache with the same code. This module writes them into
bundles (:func:`onnx_hook`, :func:`export_bundle_onnx`) and bridges to torch
(:func:`export_baseline_onnx`, :func:`baseline_from_bundle`). Both need the ``onnx`` extra
(``isan.errors.install_hint("onnx")`` gives the command that installs it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from isan.atomic import write_json_atomic
from isan.params import load_tensors
# the graphs are built in the engine's room (engine/ never imports export/)
from isan.engine.baselines.onnx_graphs import (DEFAULT_OPSET, SEQUENCE_FILE, STEP_FILE, export_baseline_onnx_tensors,
                                              export_for_manifest)


def export_baseline_onnx(module, out_dir: str | Path, opset: int = DEFAULT_OPSET) -> dict:
    """Write ``model.onnx`` and ``sequence.onnx`` of a baseline torch module into ``out_dir``.

    Args:
        module: a :class:`isan.train.baselines.RecurrentBaseline` (rnn, irnn, gru, lstm).
        out_dir: directory (created if needed); existing files of the same names are replaced.
    Returns:
        the manifest's ``"onnx"`` section (see :func:`export_isan_onnx`), plus ``"model"``.
        ``params_sha256`` is the hash of ``module.state_dict()`` as a bundle would record it.
    """
    tensors = {n: t.detach().cpu().float().numpy() for n, t in module.state_dict().items()}
    return export_baseline_onnx_tensors(module.config(), tensors, out_dir, opset)


def onnx_hook(tmp_dir: str | Path, manifest: dict, opset: int = DEFAULT_OPSET) -> None:
    """Export hook (``export_checkpoint(..., hook=onnx_hook)``): write both graphs into the bundle
    being built in ``tmp_dir`` (from its ``weights.safetensors``) and set ``manifest["onnx"]``.

    Raises:
        BundleFormatError: unknown kind, missing tensors or config.
    """
    manifest["onnx"] = export_for_manifest(Path(tmp_dir), manifest, opset)


def export_bundle_onnx(bundle_dir: str | Path, opset: int = DEFAULT_OPSET) -> dict:
    """Add (or replace) ``model.onnx`` and ``sequence.onnx`` in an existing bundle directory.

    The graphs are written into a hidden temporary directory inside the bundle and renamed
    into place when both are complete; then ``manifest.json`` is rewritten atomically with the
    ``"onnx"`` section and (when it carries hashes) the files' hashes. Returns that section.

    Raises:
        BundleFormatError: not a bundle, or its weights do not match its manifest.
    """
    from isan.atomic import make_partial_dir
    from isan.engine.bundle import finalize_manifest, has_integrity, read_manifest

    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir)
    tmp = make_partial_dir(bundle_dir / "onnx")
    try:
        info = export_for_manifest(bundle_dir, manifest, opset, out_dir=tmp)
        for name in (STEP_FILE, SEQUENCE_FILE):
            os.replace(tmp / name, bundle_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    manifest["onnx"] = info
    if has_integrity(manifest):  # its hashes are checked whatever version it claims: they must follow
        finalize_manifest(bundle_dir, manifest)
    else:
        write_json_atomic(bundle_dir / "manifest.json", manifest)
    return info


def baseline_from_bundle(bundle_dir: str | Path):
    """The torch module of a baseline bundle (eval mode), weights loaded strictly.

    Raises:
        BundleFormatError: not a baseline bundle, or weights that do not match the manifest.
    """
    import torch

    from isan.engine.baselines.recurrent import load_baseline_bundle
    from isan.train.baselines import baseline_from_config

    bundle_dir = Path(bundle_dir)
    manifest, _, _ = load_baseline_bundle(bundle_dir)  # validates sha, names and shapes
    module = baseline_from_config(manifest["model"])
    tensors = load_tensors(bundle_dir / "weights.safetensors")
    module.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in tensors.items()}, strict=True)
    return module.eval()
