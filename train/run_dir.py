"""A training run's directory (the files :mod:`isan.train.loop` describes): reading it for a resume, the
resume point ``latest/`` (weights, optimizer moments, the carried state, progress) written and loaded,
and ``best.safetensors``. :class:`RunDirectory` holds these methods of :class:`isan.train.loop.Trainer`
(which inherits them); it uses the trainer's ``out``, ``cfg``, ``model``, ``opt``, ``ema``, ``carry``,
``progress``, ``dist``, ``main`` and ``streams``.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import torch
from safetensors.torch import load_file, save_file

from isan.atomic import atomic_directory, atomic_path, write_json_atomic
from isan.errors import CheckpointError
from isan.train.config import Progress


def state_tensors(state) -> dict:
    """A recurrent state (a tensor, or a tuple of them) as the named tensors ``carry.0``, ``carry.1``...
    of a checkpoint."""
    if isinstance(state, tuple):
        return {f"carry.{i}": s.contiguous() for i, s in enumerate(state)}
    return {"carry.0": state.contiguous()}


def state_from_tensors(tensors: dict):
    """The recurrent state that :func:`state_tensors` wrote: a tensor, or a tuple of them."""
    parts = [tensors[k] for k in sorted(k for k in tensors if k.startswith("carry."))]
    return parts[0] if len(parts) == 1 else tuple(parts)


class RunDirectory:
    """The run directory's files, read and written for :class:`isan.train.loop.Trainer`."""

    def _read_run_dir(self):
        """What a resume needs from ``out`` ({"config", "latest": (weights, optimizer, progress)}), None
        for a new run, or the exception to raise (so that every rank raises it)."""
        d = self.out / "latest"
        if not (d / "progress.json").exists():
            return None
        try:
            config = json.loads((self.out / "config.json").read_text())
        except Exception as e:
            return CheckpointError(f"cannot read {self.out / 'config.json'}: {e}")
        try:
            w = load_file(str(d / "weights.safetensors"))
            o = load_file(str(d / "optimizer.safetensors"))
            prog = json.loads((d / "progress.json").read_text())
        except Exception as e:
            return CheckpointError(f"cannot resume from {d}: {e}; delete {d} to restart from the last best weights")
        return {"config": config, "latest": (w, o, prog)}

    # ---- checkpoints -------------------------------------------------------------------
    def _save_latest(self) -> None:
        carry = self.carry
        if self.dist is not None and carry is not None:  # every rank's streams into the one checkpoint
            carry = tuple(self.dist.gather_streams(c) for c in carry) if isinstance(carry, tuple) \
                else self.dist.gather_streams(carry)
        if not self.main:
            return
        with atomic_directory(self.out / "latest", overwrite=True) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}, str(tmp / "weights.safetensors"))
            opt_t = {}
            for name, p in self.model.named_parameters():
                st = self.opt.state.get(p)
                if st:
                    opt_t[f"{name}.exp_avg"] = st["exp_avg"].cpu().contiguous()
                    opt_t[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].cpu().contiguous()
                    opt_t[f"{name}.step"] = torch.as_tensor(float(st["step"])).reshape(1)
            if carry is not None:
                opt_t.update({k: v.cpu() for k, v in state_tensors(carry).items()})
            if self.ema is not None:
                opt_t.update({f"ema.{n}": v.cpu().contiguous() for n, v in self.ema.items()})
            save_file(opt_t, str(tmp / "optimizer.safetensors"))
            write_json_atomic(tmp / "progress.json", asdict(self.progress))

    def _load_latest(self, w: dict, o: dict, prog: dict) -> None:
        dev = self.cfg.device
        w = {k: v.to(dev) for k, v in w.items()}
        o = {k: v.to(dev) for k, v in o.items()}
        self.model.load_state_dict(w)
        for name, p in self.model.named_parameters():
            if f"{name}.exp_avg" in o:
                self.opt.state[p] = {
                    "step": torch.tensor(o[f"{name}.step"].item()),
                    "exp_avg": o[f"{name}.exp_avg"], "exp_avg_sq": o[f"{name}.exp_avg_sq"],
                }
        if self.ema is not None:
            for n in self.ema:
                if f"ema.{n}" in o:
                    self.ema[n] = o[f"ema.{n}"].clone()
        carry = {k: v for k, v in o.items() if k.startswith("carry.")}
        self.carry = state_from_tensors(carry) if carry else None
        if self.carry is not None:  # this rank's streams of the saved (B, ...) carry
            parts = self.carry if isinstance(self.carry, tuple) else (self.carry,)
            if parts[0].shape[0] != self.cfg.batch_size:
                raise CheckpointError(f"the carried state in {self.out / 'latest'} has {parts[0].shape[0]} streams; "
                                      f"the run has {self.cfg.batch_size}")
            parts = tuple(c[self.streams].contiguous() for c in parts)
            self.carry = parts if isinstance(self.carry, tuple) else parts[0]
        self.progress = Progress(**prog)
        p = self.progress
        if p.done and p.stop_reason in ("max_steps", "max_chars", "max_epochs"):
            extended = {"max_steps": self.cfg.max_steps and p.step < self.cfg.max_steps,
                        "max_chars": self.cfg.max_chars and p.chars_seen < self.cfg.max_chars,
                        "max_epochs": p.epoch < self.cfg.max_epochs}[p.stop_reason]
            if extended:
                p.done, p.stop_reason = False, None
        self._set_lr(p.lr)

    def _save_best(self) -> None:
        if not self.main:
            return
        tensors = self._best_tensors if self._best_tensors is not None else self._model_tensors()
        with atomic_path(self.out / "best.safetensors") as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp),
                      metadata={"valid_bpc": str(self.progress.best_valid_bpc), "epoch": str(self.progress.best_epoch)})

    def _model_tensors(self) -> dict:
        """What best.safetensors holds: the state dict (plus a stable ISAN's materialised W)."""
        m = self.model
        return m.checkpoint_tensors() if hasattr(m, "checkpoint_tensors") else dict(m.state_dict())
