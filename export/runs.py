"""A training run directory (written by ``isan train``), read: its config and weights
(:func:`read_checkpoint`) and what it records of its training (:func:`training_summary`).

Read with safetensors only (no torch). Both the bundle export (:mod:`isan.export.checkpoint`) and the
tables (:mod:`isan.export.tables`) read checkpoints through this module, which imports neither.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from isan.errors import AlphabetError, CheckpointError
from isan.params import load_tensors
from isan.tokens import alphabet_from_json


def read_checkpoint(ckpt_dir: str | Path, which: str = "best") -> tuple[dict, dict[str, np.ndarray]]:
    """(config, float32 tensors by name) of a training run directory.

    Args:
        which: ``"best"`` (best validation bpc) or ``"latest"`` (the resume point).
    Raises:
        CheckpointError: not a checkpoint directory, or its files are missing or corrupt.
    """
    from isan.jsonfile import read_json

    ckpt_dir = Path(ckpt_dir)
    cfg_path = ckpt_dir / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{ckpt_dir} is not a training run directory (no config.json); create one with `isan train --out {ckpt_dir}`")
    fix = f"it is written by `isan train --out {ckpt_dir}` (start a new run directory if it is damaged)"
    cfg = read_json(cfg_path, CheckpointError, fix, what="checkpoint config")
    if not isinstance(cfg, dict) or cfg.get("format") != "isan-checkpoint":
        raise CheckpointError(f"{cfg_path} is not an isan checkpoint config; {fix}")
    model = cfg.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("kind"), str):
        raise CheckpointError(f"{cfg_path} lacks the 'model' config (with its 'kind'); {fix}")
    try:
        alphabet_from_json(cfg.get("alphabet"))
    except AlphabetError as e:
        raise CheckpointError(f"{cfg_path} lacks a valid 'alphabet' (a list of symbols or a token alphabet: {e}); "
                              f"{fix}") from None
    for key in ("train", "corpus"):
        if key in cfg and not isinstance(cfg[key], (dict, str, type(None))):
            raise CheckpointError(f"{cfg_path}: {key!r} has the wrong type; {fix}")
    path = ckpt_dir / "best.safetensors" if which == "best" else ckpt_dir / "latest" / "weights.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist; the run has not finished an evaluation yet (try --which latest)")
    try:
        tensors = load_tensors(path)
    except Exception as e:
        raise CheckpointError(str(e)) from None
    return cfg, {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}


def training_summary(ckpt_dir: Path, cfg: dict) -> dict:
    """What the bundle records of its training: config, best valid bpc, chars seen, throughput."""
    summary = {"model": cfg.get("model"), "corpus": cfg.get("corpus"), "config": cfg.get("train"),
               "n_params": cfg.get("n_params")}
    prog = ckpt_dir / "latest" / "progress.json"
    if prog.is_file():
        from isan.jsonfile import read_json

        p = read_json(prog, CheckpointError, f"resume the run with `isan train --out {ckpt_dir}`", what="progress file")
        if not isinstance(p, dict):
            raise CheckpointError(f"{prog} is not a JSON object; resume the run with `isan train --out {ckpt_dir}`")
        summary.update({k: p.get(k) for k in ("best_valid_bpc", "best_epoch", "chars_seen", "step", "stop_reason")})
        if p.get("train_seconds"):
            summary["train_chars_per_s"] = round(p["chars_seen"] / p["train_seconds"])
    return summary
