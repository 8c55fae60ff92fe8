"""The training loop: truncated BPTT over B streams, early stopping, checkpoints and resume.

A run directory holds (all written atomically):
  config.json           model kind and size, alphabet, training config, data source
  latest/               weights.safetensors, optimizer.safetensors, progress.json (resume point)
  best.safetensors      the weights with the best validation bpc so far
  train_log.jsonl       one JSON object per line: step, valid, nonfinite and done events
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from isan.atomic import atomic_directory, atomic_path, write_json_atomic
from isan.errors import CheckpointError, IsanError
from isan.train.data import Corpus, load_corpus
from isan.train.models import build_model
from isan.train.parentheses import task_for

log = logging.getLogger(__name__)
LN2 = math.log(2.0)
CHECKPOINT_FORMAT = "isan-checkpoint"


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in config.json; a resumed run reuses it)."""

    model: str = "isan"
    d: int | None = None  # hidden size; None: largest within `params`
    params: float | None = 1.28e6
    data: str = "../shared/data/text8_head/text8_head.txt"
    dataset: str = "text8"  # "text8" (text8-10M split) or "text" (90/10 split of any file)
    batch_size: int = 256  # B parallel streams
    bptt: int = 64  # T steps per chunk (truncated BPTT; the state is carried across chunks)
    lr: float = 2e-3
    lr_decay: float = 0.5  # multiply the rate by this when valid bpc does not improve
    weight_decay: float = 0.0
    clip: float = 1.0
    max_epochs: int = 30
    max_chars: int | None = None  # training budget in characters seen (None: no limit)
    patience: int = 2  # epochs without improvement before stopping
    eval_every: float = 1.0  # evaluate on valid every this many epochs
    valid_streams: int = 100
    max_valid_chars: int | None = None
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    ckpt_every: int = 100  # chunks between resume checkpoints
    log_every: int = 20  # chunks between step log lines
    max_steps: int | None = None  # stop after this many optimizer steps (tests, smoke runs)
    init_scale: float | None = None  # irnn only: W_hh starts at init_scale * I (None: the model's 1.0)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Progress:
    epoch: int = 0
    chunk: int = 0  # next chunk within the epoch
    step: int = 0
    chars_seen: int = 0
    lr: float = 0.0
    best_valid_bpc: float | None = None
    best_epoch: float | None = None
    bad_evals: int = 0
    next_eval_chars: int = 0
    nonfinite: int = 0
    done: bool = False
    stop_reason: str | None = None
    train_seconds: float = 0.0
    history: list = field(default_factory=list)


def _detach(state):
    if isinstance(state, tuple):
        return tuple(s.detach() for s in state)
    return state.detach()


def _state_tensors(state) -> dict:
    if isinstance(state, tuple):
        return {f"carry.{i}": s.contiguous() for i, s in enumerate(state)}
    return {"carry.0": state.contiguous()}


def _state_from(tensors: dict):
    parts = [tensors[k] for k in sorted(k for k in tensors if k.startswith("carry."))]
    return parts[0] if len(parts) == 1 else tuple(parts)


@torch.no_grad()
def evaluate_bpc(model, ids: np.ndarray, streams: int = 100, bptt: int = 256, device: str = "cpu") -> float:
    """Bits per character of ``ids`` split into ``streams`` contiguous pieces, each from the initial state."""
    model.eval()
    n = len(ids) // streams
    X = torch.as_tensor(ids[: n * streams].reshape(streams, n).T.copy(), device=device)  # (n, streams)
    state = model.initial_state(streams)
    total = 0.0
    for s in range(0, n, bptt):
        x = X[s : s + bptt]
        logits, state = model(x, state)
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1), reduction="sum").item()
    model.train()
    return total / (n * streams) / LN2


class Trainer:
    """Runs or resumes one training run in ``out_dir``."""

    #: fields a resumed run may change (its budget); everything else comes from config.json
    RESUME_OVERRIDES = ("max_epochs", "max_chars", "max_steps", "patience", "threads", "device")

    def __init__(self, cfg: TrainConfig, out_dir: str | Path, corpus: Corpus | None = None, progress_bar: bool = True,
                 overrides: dict | None = None):
        self.out = Path(out_dir)
        self.progress_bar = progress_bar
        cfg_path = self.out / "config.json"
        self.resumed = (self.out / "latest" / "progress.json").exists()
        if self.resumed:
            saved = json.loads(cfg_path.read_text())
            if saved.get("format") != CHECKPOINT_FORMAT:
                raise CheckpointError(f"{cfg_path} is not an isan checkpoint config")
            cfg = TrainConfig.from_dict({**saved["train"], **{k: v for k, v in (overrides or {}).items()
                                                               if k in self.RESUME_OVERRIDES and v is not None}})
        self.cfg = cfg
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise IsanError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        # a task (isan.train.parentheses) brings its own data, outputs, loss and metric; else a language model
        self.task = task_for(cfg.model)
        self.metric = self.task.metric if self.task else "bpc"
        self.corpus = corpus or (self.task.corpus(cfg.seed) if self.task else load_corpus(cfg.data, cfg.dataset))
        K = V = len(self.corpus.alphabet)
        if self.task:
            V = self.task.n_outputs
        self.model = build_model(self.task.model_kind if self.task else cfg.model, K, V, d=cfg.d, params=cfg.params,
                                 seed=cfg.seed,
                                 **({"init_scale": cfg.init_scale} if cfg.init_scale is not None else {})).to(cfg.device)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.constrain = getattr(self.model, "constrain_", None)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay) \
            if cfg.weight_decay else torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.progress = Progress(lr=cfg.lr)
        self.carry = None
        if self.resumed:
            self._load_latest()
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cfg_path, {
                "format": CHECKPOINT_FORMAT, "format_version": 1,
                "model": self.model.config(), "n_params": self.n_params,
                "alphabet": self.corpus.alphabet.to_list(), "corpus": self.corpus.name,
                "train": asdict(cfg), **({"task": self.task.config()} if self.task else {}),
            })

    # ---- checkpoints -------------------------------------------------------------------
    def _save_latest(self) -> None:
        with atomic_directory(self.out / "latest", overwrite=True) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}, str(tmp / "weights.safetensors"))
            opt_t = {}
            for name, p in self.model.named_parameters():
                st = self.opt.state.get(p)
                if st:
                    opt_t[f"{name}.exp_avg"] = st["exp_avg"].cpu().contiguous()
                    opt_t[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].cpu().contiguous()
                    opt_t[f"{name}.step"] = torch.as_tensor(float(st["step"])).reshape(1)
            if self.carry is not None:
                opt_t.update({k: v.cpu() for k, v in _state_tensors(self.carry).items()})
            save_file(opt_t, str(tmp / "optimizer.safetensors"))
            write_json_atomic(tmp / "progress.json", asdict(self.progress))

    def _load_latest(self) -> None:
        d = self.out / "latest"
        try:
            w = load_file(str(d / "weights.safetensors"), device=self.cfg.device)
            o = load_file(str(d / "optimizer.safetensors"), device=self.cfg.device)
            prog = json.loads((d / "progress.json").read_text())
        except Exception as e:
            raise CheckpointError(f"cannot resume from {d}: {e}; delete {d} to restart from the last best weights") from None
        self.model.load_state_dict(w)
        for name, p in self.model.named_parameters():
            if f"{name}.exp_avg" in o:
                self.opt.state[p] = {
                    "step": torch.tensor(o[f"{name}.step"].item()),
                    "exp_avg": o[f"{name}.exp_avg"], "exp_avg_sq": o[f"{name}.exp_avg_sq"],
                }
        carry = {k: v for k, v in o.items() if k.startswith("carry.")}
        self.carry = _state_from(carry) if carry else None
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
        with atomic_path(self.out / "best.safetensors") as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}, str(tmp),
                      metadata={"valid_bpc": str(self.progress.best_valid_bpc), "epoch": str(self.progress.best_epoch)})

    def _log(self, event: dict) -> None:
        with open(self.out / "train_log.jsonl", "a") as f:
            f.write(json.dumps(event) + "\n")

    def _set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    # ---- the loop ----------------------------------------------------------------------
    def _epoch_streams(self, epoch: int) -> torch.Tensor:
        cfg = self.cfg
        ids = self.task.epoch_ids(epoch, cfg.seed) if self.task else self.corpus.train
        shift = int(np.random.default_rng(cfg.seed * 100003 + epoch).integers(0, cfg.bptt))
        L = (len(ids) - cfg.bptt) // cfg.batch_size
        X = ids[shift : shift + L * cfg.batch_size].reshape(cfg.batch_size, L).T.copy()  # (L, B)
        return torch.as_tensor(X, device=cfg.device)

    def _evaluate(self) -> tuple[float, dict]:
        """(the validation metric: bpc, or a task's loss; a task's further numbers for the log)."""
        ids = self.corpus.valid
        if self.cfg.max_valid_chars:
            ids = ids[: self.cfg.max_valid_chars]
        if self.task:
            return self.task.evaluate(self.model, ids, streams=self.cfg.valid_streams, device=self.cfg.device)
        return evaluate_bpc(self.model, ids, streams=self.cfg.valid_streams, device=self.cfg.device), {}

    def _after_eval(self, bpc: float, extra: dict | None = None) -> None:
        """Record an evaluation; ``bpc`` is the validation metric (a task's loss for a task run:
        Progress.best_valid_bpc then holds that loss, logged as ``best_valid_<metric>``)."""
        p, cfg = self.progress, self.cfg
        epoch_f = p.chars_seen / len(self.corpus.train)
        # a non-finite valid bpc (a diverged model) is never the best one, so it is never exported
        improved = math.isfinite(bpc) and (p.best_valid_bpc is None or bpc < p.best_valid_bpc)
        if improved:
            p.best_valid_bpc, p.best_epoch, p.bad_evals = bpc, round(epoch_f, 3), 0
            self._save_best()
        else:
            p.bad_evals += 1
            p.lr *= cfg.lr_decay
            self._set_lr(p.lr)
        p.history.append({"epoch": round(epoch_f, 3), "chars_seen": p.chars_seen, "valid_bpc": bpc})
        m = self.metric
        self._log({"event": "valid", "epoch": round(epoch_f, 3), "step": p.step, "chars_seen": p.chars_seen,
                   f"valid_{m}": round(bpc, 5 if m == "bpc" else 8),
                   f"best_valid_{m}": None if p.best_valid_bpc is None else round(p.best_valid_bpc, 5 if m == "bpc" else 8),
                   **(extra or {}), "lr": p.lr, "improved": improved})
        log.info("valid %s %.4g (best %s) at epoch %.2f", m, bpc, p.best_valid_bpc, epoch_f)
        if p.bad_evals >= cfg.patience:
            p.done, p.stop_reason = True, f"early stop: no improvement in {cfg.patience} evaluations"

    def run(self) -> Progress:
        """Train until early stopping, max_epochs, max_chars or max_steps; returns the final progress."""
        from tqdm.auto import tqdm

        cfg, p, model = self.cfg, self.progress, self.model
        if not self.resumed:
            p.next_eval_chars = int(cfg.eval_every * len(self.corpus.train))
            self._log({"event": "start", "model": model.config(), "n_params": self.n_params, "config": asdict(cfg)})
        else:
            self._log({"event": "resume", "epoch": p.epoch, "chunk": p.chunk, "step": p.step,
                       "budget": {k: getattr(cfg, k) for k in self.RESUME_OVERRIDES}})
        model.train()
        while not p.done:
            if p.epoch >= cfg.max_epochs:
                p.done, p.stop_reason = True, "max_epochs"
                break
            X = self._epoch_streams(p.epoch)
            Y = self.task.stream_targets(X) if self.task else None  # a task's targets, (L, B, outputs)
            n_chunks = X.shape[0] // cfg.bptt
            if p.chunk == 0 or self.carry is None:
                self.carry = _detach(model.initial_state(cfg.batch_size))
            bar = tqdm(total=n_chunks, initial=p.chunk, desc=f"epoch {p.epoch + 1}", unit="chunk",
                       disable=not self.progress_bar, dynamic_ncols=True)
            window_nats, window_chars, t_window = 0.0, 0, time.perf_counter()
            while p.chunk < n_chunks and not p.done:
                x = X[p.chunk * cfg.bptt : (p.chunk + 1) * cfg.bptt]
                t0 = time.perf_counter()
                state_in = self.carry if p.chunk > 0 else model.initial_state(cfg.batch_size)
                logits, state = model(x, state_in)
                if self.task:
                    loss = self.task.loss(logits, Y[p.chunk * cfg.bptt : (p.chunk + 1) * cfg.bptt])
                else:
                    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1))
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
                if not (torch.isfinite(loss) and torch.isfinite(gnorm)):
                    # Guard (DESIGN.md section 6): skip the step, restart the streams, lower the rate.
                    p.nonfinite += 1
                    p.lr *= 0.5
                    self._set_lr(p.lr)
                    self.carry = _detach(model.initial_state(cfg.batch_size))
                    self._log({"event": "nonfinite", "step": p.step, "epoch": p.epoch, "lr": p.lr})
                    if p.nonfinite > 10:
                        p.done, p.stop_reason = True, "too many non-finite losses"
                    p.chunk += 1
                    continue
                self.opt.step()
                if self.constrain is not None:
                    self.constrain()  # a model's constraint on its weights (linear_nlro: ||W||_2 <= 1)
                self.carry = _detach(state)
                p.train_seconds += time.perf_counter() - t0
                p.chunk += 1
                p.step += 1
                p.chars_seen += x.numel()
                window_nats += loss.item() * x.numel()
                window_chars += x.numel()
                bar.update(1)
                if p.step % cfg.log_every == 0:
                    dt = time.perf_counter() - t_window
                    m = self.metric
                    bpc = window_nats / window_chars / (LN2 if m == "bpc" else 1.0)  # a task's loss is its mean
                    bar.set_postfix({m: f"{bpc:.3g}", "chars_s": f"{window_chars / dt:,.0f}"})
                    self._log({"event": "step", "epoch": p.epoch, "step": p.step, "chars_seen": p.chars_seen,
                               f"train_{m}": round(bpc, 5 if m == "bpc" else 8), "lr": p.lr,
                               "chars_per_s": round(window_chars / dt)})
                    window_nats, window_chars, t_window = 0.0, 0, time.perf_counter()
                if p.chars_seen >= p.next_eval_chars:
                    p.next_eval_chars += int(cfg.eval_every * len(self.corpus.train))
                    self._after_eval(*self._evaluate())
                if cfg.max_steps and p.step >= cfg.max_steps:
                    p.done, p.stop_reason = True, "max_steps"
                if cfg.max_chars and p.chars_seen >= cfg.max_chars:
                    p.done, p.stop_reason = True, "max_chars"
                if p.step % cfg.ckpt_every == 0:
                    self._save_latest()
            bar.close()
            if p.chunk >= n_chunks:
                p.epoch += 1
                p.chunk = 0
        if p.best_valid_bpc is None or (p.history and p.history[-1]["chars_seen"] != p.chars_seen):
            self._after_eval(*self._evaluate())  # a final evaluation so `best` reflects the end
            p.done = True
        self._save_latest()
        self._log({"event": "done", "stop_reason": p.stop_reason, "step": p.step, "chars_seen": p.chars_seen,
                   f"best_valid_{self.metric}": p.best_valid_bpc, "best_epoch": p.best_epoch,
                   "train_chars_per_s": round(p.chars_seen / max(p.train_seconds, 1e-9))})
        return p


def train(cfg: TrainConfig, out_dir: str | Path, progress_bar: bool = True, overrides: dict | None = None) -> Progress:
    """Train (or resume, if ``out_dir`` holds a run) and return the final progress.

    On resume the saved config is used, except for the budget fields in ``overrides``
    (:attr:`Trainer.RESUME_OVERRIDES`).
    """
    return Trainer(cfg, out_dir, progress_bar=progress_bar, overrides=overrides).run()
