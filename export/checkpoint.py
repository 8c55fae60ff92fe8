"""Checkpoint directory (written by ``isan train``) to runtime bundle.

Reads ``config.json`` and ``best.safetensors`` (or ``latest/weights.safetensors``) with
safetensors only, so exporting an ISAN needs no torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from isan.alphabet import Alphabet
from isan.tokens import alphabet_from_json
from isan.engine.bundle import write_bundle
from isan.errors import CheckpointError
from isan.params import ISAN_TENSORS
from isan.engine.certificate import CERT_FILE, certificate  # the math the engine re-checks on load
from isan.export.runs import read_checkpoint, training_summary


log = logging.getLogger(__name__)


def normalizer_for(cfg: dict, alphabet: Alphabet) -> str:
    """The normaliser a model trained with checkpoint config ``cfg`` expects: ``"text8"`` for models
    trained on text8 (their text went through wikifil.pl), ``"none"`` for any other text."""
    train = cfg.get("train") if isinstance(cfg.get("train"), dict) else {}
    on_text8 = cfg.get("corpus") == "text8-10M" or train.get("dataset") == "text8"
    chars = alphabet.base if alphabet.kind == "pairs" else alphabet
    return "text8" if on_text8 and chars == Alphabet.text8() else "none"


def export_checkpoint(ckpt_dir: str | Path, out_dir: str | Path, which: str = "best", overwrite: bool = False,
                      include_log: bool = True, hook=None, normalizer: str | None = None) -> Path:
    """Write the bundle for a checkpoint (docs/guide/formats.md) atomically; returns its path.

    Args:
        hook: ``hook(tmp_dir, manifest)`` called before the bundle is renamed into place
            (tables and ONNX files are built there, so a bundle is complete or absent).
        normalizer: the normaliser the manifest declares; None: :func:`normalizer_for` the
            checkpoint (text8 for models trained on text8).
    """
    ckpt_dir = Path(ckpt_dir)
    cfg, tensors = read_checkpoint(ckpt_dir, which)
    kind = cfg["model"]["kind"]
    alphabet = alphabet_from_json(cfg["alphabet"])
    files = {}
    if include_log and (ckpt_dir / "train_log.jsonl").is_file():
        files["train_log.jsonl"] = ckpt_dir / "train_log.jsonl"
    training = training_summary(ckpt_dir, cfg)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="isan-cert-") as cert_dir:
        if kind == "isan":
            if "W" not in tensors and cfg["model"].get("structure") == "dplr":  # latest/: no materialised W
                tensors = {**tensors, "W": dplr_dense_W(tensors["a"], tensors["U"], tensors["V"])}
            basis = tensors.get("P")
            tensors = {n: tensors[n] for n in ISAN_TENSORS}
            extra = None
            if is_stable(cfg):
                extra = {"certificate": write_certificate(Path(cert_dir) / CERT_FILE, tensors, basis)}
                files[CERT_FILE] = Path(cert_dir) / CERT_FILE
        else:
            extra = {"model": cfg["model"], "d": int(cfg["model"].get("d", 0))}
        return write_bundle(out_dir, tensors, alphabet, kind=kind, training=training, extra=extra, files=files,
                            overwrite=overwrite, hook=hook,
                            normalizer=normalizer if normalizer is not None else normalizer_for(cfg, alphabet))




def dplr_dense_W(a: np.ndarray, U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """The dense maps of a structured ISAN (``isan train --structure dplr``, issue #48): ``W[k] = diag(a[k]) +
    U[k] V[k]^T``, float32 (K, d, d) from a (K, d), U and V (K, d, r); the same affine maps exactly, so the
    bundle is a normal dense ISAN bundle."""
    W = np.einsum("kir,kjr->kij", np.asarray(U, np.float64), np.asarray(V, np.float64))
    idx = np.arange(W.shape[1])
    W[:, idx, idx] += np.asarray(a, np.float64)
    return W.astype(np.float32)


def is_stable(cfg: dict) -> bool:
    """Whether a checkpoint config is of a stable ISAN (``isan train --stable-rho``)."""
    train = cfg.get("train") if isinstance(cfg.get("train"), dict) else {}
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    return bool(train.get("stable_rho")) or isinstance(model.get("stable"), dict)


def write_certificate(path: Path, tensors: dict[str, np.ndarray], basis: np.ndarray | None = None) -> dict:
    """Compute the stability certificate of ISAN weights (float64, on the float32 weights as exported),
    write its basis to ``path`` (safetensors, tensor "P" float64 (d, d)) and return the manifest's
    ``"certificate"`` record ``{"rho", "state_bound", "file", "method", ...}``.

    Raises:
        CheckpointError: the recomputed rho is not below 1 (no certificate is written for such weights).
    """
    from safetensors.numpy import save_file

    W = np.asarray(tensors["W"], dtype=np.float32)
    d = W.shape[1]
    P = np.eye(d) if basis is None else np.asarray(basis, dtype=np.float64)
    c = certificate(W, tensors["b"], tensors["h0"], P)
    if not c["rho"] < 1.0:
        raise CheckpointError(f"the weights are not contractive in their basis: max_x ||P W_x P^-1||_2 = {c['rho']:.9f} "
                              f">= 1, so no certificate can be written; retrain with `isan train --stable-rho RHO` "
                              f"(RHO < 1)")
    save_file({"P": np.ascontiguousarray(P, dtype=np.float64)}, str(path))
    return {"rho": c["rho"], "state_bound": c["state_bound"], "file": CERT_FILE, "method": CERT_METHOD,
            "cond_P": c["cond_P"], "basis": "identity" if basis is None else "learned"}


def export_bundle(ckpt_dir: str | Path, out_dir: str | Path, which: str = "best", overwrite: bool = False,
                  onnx: bool = False, table: bool = True, table_budget: str = "16MB", table_max_len: int = 12,
                  table_dtype: str = "float32", table_corpus: str | None = None, table_dataset: str | None = None,
                  table_mode: str = "full", progress_bar: bool = True, normalizer: str | None = None) -> Path:
    """``isan export``: the bundle of a checkpoint with its trie table (and ONNX graphs); atomic.

    The table is mined from ``table_corpus`` (default: the training data named in the
    checkpoint's config, its train split) within ``table_budget`` bytes.
    """
    hooks = []
    cfg, _ = read_checkpoint(ckpt_dir, which)
    if table and cfg["model"]["kind"] == "isan":
        from isan.export.tables import make_table, table_options_from
        from isan.params import ISANParams

        corpus, dataset = table_options_from(cfg, table_corpus, table_dataset)
        alphabet = alphabet_from_json(cfg["alphabet"])

        def table_hook(tmp, manifest):
            from safetensors.numpy import load_file

            t = load_file(str(tmp / "weights.safetensors"))
            from isan.trie_tables.build import DTYPES, parse_bytes
            from isan.trie_tables.mining import singles_bytes

            V, d = t["W_ro"].shape
            singles = singles_bytes(V, d, V, np.dtype(DTYPES[table_dtype]).itemsize) if table_dtype in DTYPES else 0
            if singles > parse_bytes(table_budget):
                # a large output alphabet (bytes, pairs): the budget does not even hold one entry a symbol; the
                # engine then scores chunk-parallel (its fast path for long texts) without a table
                log.warning("no trie table: the %s budget does not hold the %d single-symbol entries (%s bytes); "
                            "pass --table-budget to build one", table_budget, V, f"{singles:,}")
                manifest["table"] = {"mode": "none", "reason": f"the budget {table_budget} holds fewer than the {V} "
                                                                f"single-symbol entries ({singles:,} bytes)"}
                return
            make_table(tmp, manifest, ISANParams(**{n: t[n] for n in ISAN_TENSORS}), alphabet, corpus, dataset,
                       budget=table_budget, max_len=table_max_len, dtype=table_dtype, mode=table_mode,
                       progress_bar=progress_bar)

        hooks.append(table_hook)
    if onnx:
        from isan.export.onnx_export import onnx_hook

        hooks.append(onnx_hook)

    def hook(tmp, manifest):
        for h in hooks:
            h(tmp, manifest)

    return export_checkpoint(ckpt_dir, out_dir, which=which, overwrite=overwrite, hook=hook, normalizer=normalizer)


def export_from_bundle(src: str | Path, out_dir: str | Path, overwrite: bool = False, onnx: bool = True) -> Path:
    """Copy an existing bundle (e.g. the shipped default model) to ``out_dir``, adding ONNX graphs.

    Used by ``isan export default OUT --onnx``: users of the shipped model have no checkpoint.
    """
    import shutil

    from isan.atomic import atomic_directory
    from isan.engine.bundle import finalize_manifest, read_manifest

    src = Path(src)
    manifest = read_manifest(src, verify="full")  # copy only what is intact
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        for p in src.iterdir():
            if p.name == "manifest.json" or p.name.startswith("."):
                continue
            (shutil.copytree if p.is_dir() else shutil.copyfile)(p, tmp / p.name)
        if onnx:
            from isan.export.onnx_export import onnx_hook

            onnx_hook(tmp, manifest)
        table = manifest.get("table")
        corpus = table.get("corpus") if isinstance(table, dict) else None
        if isinstance(corpus, dict) and isinstance(corpus.get("path"), str) and not Path(corpus["path"]).is_absolute():
            from isan.export.tables import corpus_record  # the same corpus, relative to the new place

            manifest["table"] = {**table, "corpus": {**corpus, **corpus_record(src / corpus["path"],
                                                                               corpus.get("dataset", "text8"), tmp)}}
        finalize_manifest(tmp, manifest)
    return Path(out_dir)


CERT_METHOD = ("rho = max_x ||P W_x P^-1||_2 by float64 SVD of the exported float32 W; "
               "state_bound = ||P^-1||_2 * max(||P h0||, max_x ||P b_x|| / (1 - rho)) bounds max_i |h_t,i| "
               "for every input and every t; a start-state error shrinks at least as cond(P) rho^t")
