"""The training loop: truncated BPTT over B streams, early stopping, checkpoints and resume.

A run directory holds (all written atomically):
  config.json           model kind and size, alphabet, training config, data source
  latest/               weights.safetensors, optimizer.safetensors, progress.json (resume point)
  best.safetensors      the weights with the best validation bpc so far (with ``ema`` the better of the live
                        and the averaged weights; a stable ISAN with a basis adds its materialised W)
  train_log.jsonl       one JSON object per line: start/resume, step, valid, nonfinite and done events,
                        each with "time" (Unix seconds)

Stability and regularisation (issue 20): ``stable_rho`` trains :class:`isan.train.stable.StableISAN`
(every ``||P W_x P^-1||_2 <= rho``, projected after every optimizer step and before every evaluation);
``state_dropout``, ``weight_decay`` (AdamW on the matrices only), ``ema`` (the average lives in
``latest/optimizer.safetensors`` as ``ema.<name>``, so a resume keeps it) and ``lr_schedule="cosine"``.
Under data parallelism keep ``stable_exact_every`` at 1: the projection before an evaluation runs on
rank 0 only and is a no-op only when every step was projected.

Token alphabets (:mod:`isan.tokens`, ``TrainConfig.alphabet``): the corpus holds output ids X; the
model reads ``input_map[X]`` (K inputs) and is trained to predict X (V classes). Bits are per token:
the keys stay ``train_bpc`` / ``valid_bpc`` / ``best_valid_bpc`` so that existing tools keep working,
and the log's first event (start or resume) names the unit (``"unit": "char" | "byte" | "pair" |
"word"``). config.json's ``"alphabet"`` is a list of characters for a character alphabet (as before)
and ``alphabet_to_json(alphabet)`` (a dict with ``kind``) for the others, beside ``"unit"``.

Auxiliary losses (the contract): a model may define ``aux_loss(progress_fraction: float) ->
torch.Tensor | None``. Each training step the loop calls it after the forward pass with the fraction of
the planned training done so far (``chars_seen / max_chars``; without a character budget
``step / max_steps``; without either ``chars_seen / (max_epochs * train tokens)``; clamped to [0, 1]),
and adds the returned scalar (a 0-d tensor on the model's device, differentiable in the model's
parameters) to the loss before ``backward``; None adds nothing. Its value is logged as ``aux_loss``
(the mean over the logging window) in step events; the logged ``train_bpc`` is the data loss alone.
Under data parallelism every rank adds the same term (it must depend on the parameters only, not on
the rank's data), so the averaged gradient is that of a single process; DistributedDataParallel
also needs every parameter it reads to be used by ``forward`` too (tests/test_ddp.py runs one).

Data parallelism (:mod:`isan.train.ddp`): with a :class:`isan.train.ddp.DistContext` the model runs
inside DistributedDataParallel; rank r trains streams ``[r B / W, (r + 1) B / W)`` of the B streams,
the averaged gradient equals the full batch's, rank 0 alone evaluates (and broadcasts the result),
logs and writes checkpoints; the carried state of every rank is gathered into the one checkpoint, so
a run resumes with any number of processes that divides B (one included).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from isan.atomic import write_json_atomic
from isan.errors import CheckpointError, IsanError
from isan.train.data import Corpus, load_corpus
from isan.train.distill import soft_cross_entropy
from isan.train.synthetic_budget import check_synthetic_chars
from isan.train.models import build_model
from isan.train.tasks.parentheses import task_for
# the run's config and progress, and its directory's files, live in config.py and run_dir.py; their names import from here too
from isan.train.config import CHECKPOINT_FORMAT, Progress, TrainConfig, alphabet_config  # noqa: F401
from isan.train.run_dir import RunDirectory

log = logging.getLogger(__name__)
LN2 = math.log(2.0)


def _detach(state):
    if isinstance(state, tuple):
        return tuple(s.detach() for s in state)
    return state.detach()


@torch.no_grad()
def evaluate_bpc(model, ids: np.ndarray, streams: int = 100, bptt: int = 256, device: str = "cpu",
                 input_map: torch.Tensor | np.ndarray | None = None) -> float:
    """Bits per token of ``ids`` (output ids) split into ``streams`` contiguous pieces, each from the
    initial state; the model reads ``input_map[ids]`` (None: the ids themselves)."""
    model.eval()
    n = len(ids) // streams
    X = torch.as_tensor(ids[: n * streams].reshape(streams, n).T.copy(), device=device)  # (n, streams)
    imap = None if input_map is None else torch.as_tensor(input_map, device=device)
    state = model.initial_state(streams)
    total = 0.0
    for s in range(0, n, bptt):
        x = X[s : s + bptt]
        logits, state = model(x if imap is None else imap[x], state)
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1), reduction="sum").item()
    model.train()
    return total / (n * streams) / LN2


class Trainer(RunDirectory):
    """Runs or resumes one training run in ``out_dir``."""

    #: fields a resumed run may change (its budget); everything else comes from config.json
    RESUME_OVERRIDES = ("max_epochs", "max_chars", "max_steps", "patience", "threads", "device")

    def __init__(self, cfg: TrainConfig, out_dir: str | Path, corpus: Corpus | None = None, progress_bar: bool = True,
                 overrides: dict | None = None, dist=None):
        """``dist``: a :class:`isan.train.ddp.DistContext` for data-parallel training (None: one process)."""
        self.out, self.dist = Path(out_dir), dist
        self.main = dist is None or dist.is_main
        self.progress_bar = progress_bar and self.main
        cfg, stored = self._run_config(cfg, overrides)
        self.resumed, self.cfg = stored is not None, cfg
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise IsanError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        alphabet, K, V = self._load_data(cfg, corpus)
        init = self._model_options(cfg)
        self.teacher_logq = None  # (N, V) float16 log q over the train split (train/distill.py)
        self.train_ids = self.corpus.train  # what an epoch reads: the train split, and any synthetic text
        check_synthetic_chars(cfg.synthetic_chars, V)  # a whole number 0 or more that fits in memory, before any work
        if cfg.synthetic_chars and dist is not None:
            raise IsanError("--synthetic-chars is not supported with --distributed training")
        if cfg.teacher or cfg.distill or cfg.synthetic_chars:
            cfg = self.cfg = self._with_teacher(cfg, alphabet)
        self._build_model(cfg, K, V, init)
        self._build_optimizer(cfg)
        self.progress, self.carry = Progress(lr=cfg.lr), None
        self._resume_or_start(stored, alphabet_config(alphabet))

    def _run_config(self, cfg: TrainConfig, overrides: dict | None) -> tuple[TrainConfig, dict | None]:
        """(the run's config: config.json's on resume, with the budget ``overrides``; the rank's device with
        ``dist``, what a resume reads from ``out`` or None). Raises CheckpointError: it cannot resume."""
        # rank 0 reads the run directory and sends it to the others (they need not see it)
        stored = self._read_run_dir() if self.main else None
        if self.dist is not None:
            stored = self.dist.broadcast(stored)
        if isinstance(stored, Exception):
            raise stored
        if stored is not None:
            saved = stored["config"]
            if saved.get("format") != CHECKPOINT_FORMAT:
                raise CheckpointError(f"{self.out / 'config.json'} is not an isan checkpoint config")
            cfg = TrainConfig.from_dict({**saved["train"], **{k: v for k, v in (overrides or {}).items()
                                                               if k in self.RESUME_OVERRIDES and v is not None}})
        if self.dist is not None:
            cfg = TrainConfig.from_dict({**asdict(cfg), "device": self.dist.device})
        return cfg, stored

    def _load_data(self, cfg: TrainConfig, corpus: Corpus | None) -> tuple[object, int, int]:
        """Set the task (None: a language model), metric, corpus, unit and input map; (alphabet, K, V)."""
        # a task (isan.train.tasks.parentheses) brings its own data, outputs, loss and metric; else a language model
        self.task = task_for(cfg.model)
        if self.task and cfg.alphabet != "chars":
            raise IsanError(f"the {cfg.model} task brings its own symbols; --alphabet {cfg.alphabet} does not apply")
        self.metric = self.task.metric if self.task else "bpc"
        self.corpus = corpus or (self.task.corpus(cfg.seed) if self.task else
                                 load_corpus(cfg.data, cfg.dataset, kind=cfg.alphabet, inputs=cfg.inputs,
                                             valid_data=cfg.valid_data))
        alphabet = self.corpus.alphabet
        self.unit = getattr(alphabet, "unit", "char")
        K, V = int(getattr(alphabet, "K", len(alphabet))), len(alphabet)
        imap = getattr(alphabet, "input_map", None)
        self.input_map = None if imap is None else \
            torch.as_tensor(np.asarray(imap), dtype=torch.int64, device=cfg.device)  # output id -> input id (V,)
        return alphabet, K, (self.task.n_outputs if self.task else V)

    def _model_options(self, cfg: TrainConfig) -> dict:
        """The model's keyword options (``init_scale``, ``state_dropout``), once the options that shape it
        are checked (IsanError: one that does not apply, or a structure the run cannot train)."""
        init = {"init_scale": cfg.init_scale} if cfg.init_scale is not None else {}
        if (cfg.stable_rho or cfg.state_dropout) and (self.task or cfg.model != "isan"):
            raise IsanError("--stable-rho and --state-dropout apply to the isan model only")
        if cfg.lr_schedule not in ("plateau", "cosine"):
            raise IsanError(f"unknown lr schedule {cfg.lr_schedule!r}; choose plateau or cosine")
        if cfg.state_dropout:
            init["state_dropout"] = cfg.state_dropout
        if cfg.structure != "dense" or cfg.rank is not None:  # issue 48: W[x] = diag(a) + U V^T (train/structured.py)
            from isan.train.structured import structure_problem

            problem = structure_problem(cfg.structure, cfg.rank, cfg.model, cfg.d, cfg.stable_rho, cfg.stable_basis,
                                        cfg.teacher, cfg.alphabet, self.dist is not None)
            if problem:
                raise IsanError(problem)
        return init

    def _build_model(self, cfg: TrainConfig, K: int, V: int, init: dict) -> None:
        """Build the model on the device (a stable ISAN, a DPLR ISAN, or :func:`build_model`'s), its hooks
        (``constrain_``, ``aux_loss``), this rank's streams and the forward pass (DDP's with ``dist``)."""
        if cfg.stable_rho:
            from isan.train.models import ISAN
            from isan.train.stable import StableISAN

            d = cfg.d if cfg.d is not None else ISAN.for_budget(K, V, cfg.params).d
            self.model = StableISAN(K, V, d, rho=cfg.stable_rho, basis=cfg.stable_basis,
                                    basis_penalty=cfg.stable_basis_penalty, exact_every=cfg.stable_exact_every,
                                    seed=cfg.seed, **init).to(cfg.device)
        elif cfg.structure == "dplr":
            from isan.train.structured import DPLRISAN

            self.model = DPLRISAN(K, V, cfg.d, cfg.rank, seed=cfg.seed, **init).to(cfg.device)
        else:
            self.model = build_model(self.task.model_kind if self.task else cfg.model, K, V, d=cfg.d,
                                     params=cfg.params, seed=cfg.seed, **init).to(cfg.device)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.constrain, self.aux = getattr(self.model, "constrain_", None), getattr(self.model, "aux_loss", None)
        dist = self.dist
        self.streams = slice(0, cfg.batch_size) if dist is None else dist.shard(cfg.batch_size)
        self.B_local = self.streams.stop - self.streams.start
        self.forward = self.model
        if dist is not None:
            from torch.nn.parallel import DistributedDataParallel

            # find_unused_parameters: h0 (and c0) get a gradient only on an epoch's first chunk
            self.forward = DistributedDataParallel(
                self.model, device_ids=[dist.local_rank] if dist.backend == "nccl" else None,
                find_unused_parameters=True)

    def _build_optimizer(self, cfg: TrainConfig) -> None:
        """Adam (AdamW on the matrices only, with ``weight_decay``) and the weights' average (``ema``)."""
        if cfg.weight_decay:
            no_decay = set(getattr(self.model, "no_decay", ()))  # biases, h0, the basis P: not decayed
            named = list(self.model.named_parameters())
            groups = [{"params": [p for n, p in named if n not in no_decay], "weight_decay": cfg.weight_decay},
                      {"params": [p for n, p in named if n in no_decay], "weight_decay": 0.0}]
            self.opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr)
        else:
            self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        # weight averaging: an EMA of every parameter (for the stable ISAN: of U and P, so the average is
        # certified too, ||sum a_i U_i|| <= rho); evaluated beside the live weights, saved as best when better
        self.ema = {n: p.detach().clone() for n, p in self.model.named_parameters()} if cfg.ema else None
        self._best_tensors = None  # the weights _save_best writes (None: the live model's)

    def _resume_or_start(self, stored: dict | None, alpha: dict) -> None:
        """Load the resume point (CheckpointError: the data gives another alphabet than the run's), or
        write a new run's config.json (rank 0)."""
        cfg_path = self.out / "config.json"
        if self.resumed:
            if not self.task and stored["config"].get("alphabet") != alpha["alphabet"]:
                raise CheckpointError(f"the data now gives another alphabet than {cfg_path} records; "
                                      f"train with the data the run started with, or start a new --out")
            self._load_latest(*stored["latest"])
        elif self.main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cfg_path, {"format": CHECKPOINT_FORMAT, "format_version": 1,
                                         "model": self.model.config(), "n_params": self.n_params, **alpha,
                                         "corpus": self.corpus.name, "train": asdict(self.cfg),
                                         **({"task": self.task.config()} if self.task else {})})

    def _with_teacher(self, cfg: TrainConfig, alphabet) -> TrainConfig:
        """Check the distillation options, compute the teacher's distributions over the train split, and
        return ``cfg`` with the teacher's ``params_sha256`` recorded (a resume must find the same teacher)."""
        from isan.train.distill import load_teacher, teacher_log_probs

        if not cfg.teacher or not 0.0 < cfg.distill <= 1.0:
            raise IsanError("--distill A (0 < A <= 1) goes with --teacher BUNDLE"
                            + (", and so does --synthetic-chars" if cfg.synthetic_chars else ""))
        if self.task:
            raise IsanError(f"--teacher applies to language models, not to the {cfg.model} task")
        paths = [t.strip() for t in cfg.teacher.split(",") if t.strip()]  # several: an ensemble (their mixture)
        teachers, shas = [], []
        for path in paths:
            manifest, teacher, t_alphabet = load_teacher(path)
            if alphabet_config(t_alphabet) != alphabet_config(alphabet):
                raise IsanError(f"the teacher {path} has another alphabet than the training data "
                                f"({len(t_alphabet)} against {len(alphabet)} symbols); "
                                "distil with a teacher trained on this data")
            teachers.append(teacher)
            shas.append(manifest["params_sha256"])
        sha = ",".join(shas)
        if cfg.teacher_sha256 is not None and cfg.teacher_sha256 != sha:
            raise CheckpointError(f"the teacher {cfg.teacher} is not the one this run started with "
                                  f"(params_sha256 {sha[:12]} against {cfg.teacher_sha256[:12]}); "
                                  f"resume with that teacher or start a new --out")
        t0 = time.perf_counter()
        self.teacher_logq = teacher_log_probs(teachers, self.corpus.train, input_map=self.input_map,
                                              device=cfg.device)
        log.info("teacher %s (d = %s): distributions over %s train characters in %.1f s on %s", cfg.teacher,
                 ", ".join(str(t.d) for t in teachers), f"{len(self.corpus.train):,}", time.perf_counter() - t0,
                 cfg.device)
        cfg = TrainConfig.from_dict({**asdict(cfg), "teacher_sha256": sha})
        if cfg.synthetic_chars:
            cfg = self._with_synthetic(cfg, teachers)
        return cfg

    #: the teacher's text of a run with --synthetic-chars, in its run directory
    SYNTHETIC = "synthetic.safetensors"

    def _with_synthetic(self, cfg: TrainConfig, teachers) -> TrainConfig:
        """Sample (or, on resume, read and check) ``cfg.synthetic_chars`` characters of the teachers' text
        with their distributions, append both to the train split, and return ``cfg`` with the file's sha256."""
        from safetensors.numpy import load_file, save_file

        from isan.atomic import atomic_path
        from isan.jsonfile import file_sha256
        from isan.train.distill import teacher_samples

        path = self.out / self.SYNTHETIC
        t0 = time.perf_counter()
        if cfg.synthetic_sha256:  # a resume: the text the run started with, or nothing
            if not path.is_file():  # missing, or a directory in its place
                raise CheckpointError(f"{path}, the run's synthetic text, is {'a directory' if path.is_dir() else 'missing'}"
                                      "; sampling again need not give the same text: restore the file or start a new --out")
            got = file_sha256(path)
            if got != cfg.synthetic_sha256:
                raise CheckpointError(f"{path} is not the synthetic text this run wrote (sha256 {got[:12]} against "
                                      f"{cfg.synthetic_sha256[:12]}); restore it or start a new --out")
            arrays = load_file(str(path))
            ids, logq = arrays["ids"].astype(np.int64), arrays["logq"]
            if len(ids) != cfg.synthetic_chars or logq.shape != (len(ids), self.teacher_logq.shape[1]):
                raise CheckpointError(f"{path} holds {len(ids):,} characters, the run asks for "
                                      f"{cfg.synthetic_chars:,}")
            how = "read"
        else:
            ids, logq = teacher_samples(teachers, cfg.synthetic_chars, seed=cfg.seed, input_map=self.input_map,
                                        device=cfg.device)
            with atomic_path(path) as tmp:
                save_file({"ids": ids.astype(np.uint8 if logq.shape[1] <= 256 else np.int32), "logq": logq},
                          str(tmp), metadata={"teacher_sha256": cfg.teacher_sha256 or "", "seed": str(cfg.seed)})
            cfg = TrainConfig.from_dict({**asdict(cfg), "synthetic_sha256": file_sha256(path)})
            how = "sampled"
        self.train_ids = np.concatenate([self.corpus.train, ids])
        self.teacher_logq = np.concatenate([self.teacher_logq, logq])
        log.info("synthetic text: %s characters %s in %.1f s (%s)", f"{len(ids):,}", how,
                 time.perf_counter() - t0, path)
        return cfg

    def _update_ema(self) -> None:
        p = self.progress
        decay = min(self.cfg.ema, (1 + p.step) / (10 + p.step))  # a short warm-up: early weights fade fast
        with torch.no_grad():
            for n, q in self.model.named_parameters():
                self.ema[n].lerp_(q.detach(), 1.0 - decay)

    def _log(self, event: dict) -> None:
        if not self.main:
            return
        with open(self.out / "train_log.jsonl", "a") as f:
            f.write(json.dumps({**event, "time": round(time.time(), 3)}) + "\n")  # Unix seconds

    def _set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    # ---- the loop ----------------------------------------------------------------------
    def _epoch_streams(self, epoch: int) -> tuple[torch.Tensor, np.ndarray | None]:
        """(this rank's streams of the epoch (L, B / W) ids, the teacher's log q at the same positions
        (L, B / W, V) float16 view, or None without a teacher)."""
        cfg = self.cfg
        ids = self.task.epoch_ids(epoch, cfg.seed) if self.task else self.train_ids
        shift = int(np.random.default_rng(cfg.seed * 100003 + epoch).integers(0, cfg.bptt))
        L = (len(ids) - cfg.bptt) // cfg.batch_size
        X = ids[shift : shift + L * cfg.batch_size].reshape(cfg.batch_size, L).T  # (L, B)
        Q = None
        if self.teacher_logq is not None:
            Q = self.teacher_logq[shift : shift + L * cfg.batch_size].reshape(cfg.batch_size, L, -1)
            Q = Q.transpose(1, 0, 2)[:, self.streams]  # (L, B / W, V), a view
        return torch.as_tensor(X[:, self.streams].copy(), device=cfg.device), Q

    def _evaluate(self) -> tuple[float, dict]:
        """(the validation metric: bits per token, or a task's loss; a task's further numbers for the log).
        With data parallelism rank 0 evaluates and every rank gets its result."""
        result = self._evaluate_here() if self.main else None
        return result if self.dist is None else self.dist.broadcast(result)

    def _evaluate_here(self) -> tuple[float, dict]:
        ids = self.corpus.valid
        if self.cfg.max_valid_chars:
            ids = ids[: self.cfg.max_valid_chars]
        project = getattr(self.model, "project_exact_", None)
        if project is not None:
            project()  # the evaluated (and saved) weights meet the constraint exactly
        self._best_tensors = None

        def one():
            if self.task:
                return self.task.evaluate(self.model, ids, streams=self.cfg.valid_streams, device=self.cfg.device)
            return evaluate_bpc(self.model, ids, streams=self.cfg.valid_streams, device=self.cfg.device,
                                input_map=self.input_map), {}

        live, extra = one()
        if self.ema is None:
            return live, extra
        with torch.no_grad():  # swap the average in, evaluate it, swap the live weights back
            params = dict(self.model.named_parameters())
            backup = {n: q.detach().clone() for n, q in params.items()}
            buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
            for n, q in params.items():
                q.copy_(self.ema[n])
            if project is not None:
                project()
            avg, extra_avg = one()
            better = math.isfinite(avg) and not (math.isfinite(live) and live <= avg)
            if better:
                self._best_tensors = {k: v.detach().clone() for k, v in self._model_tensors().items()}
            for n, q in params.items():
                q.copy_(backup[n])
            for n, b in self.model.named_buffers():
                b.copy_(buffers[n])
        m = self.metric
        extra = {**extra, f"valid_{m}_live": round(live, 6), f"valid_{m}_ema": round(avg, 6),
                 "evaluated": "ema" if better else "live"}
        return (avg if better else live), extra

    def _progress_fraction(self) -> float:
        """The fraction of the planned training done (the aux_loss contract in the module docstring)."""
        p, cfg = self.progress, self.cfg
        if cfg.max_chars:
            f = p.chars_seen / cfg.max_chars
        elif cfg.max_steps:
            f = p.step / cfg.max_steps
        else:
            f = p.chars_seen / max(1, cfg.max_epochs * len(self.train_ids))
        return min(1.0, max(0.0, f))

    def _after_eval(self, bpc: float, extra: dict | None = None) -> None:
        """Record an evaluation; ``bpc`` is the validation metric (a task's loss for a task run:
        Progress.best_valid_bpc then holds that loss, logged as ``best_valid_<metric>``)."""
        p, cfg = self.progress, self.cfg
        epoch_f = p.chars_seen / len(self.train_ids)
        # a non-finite valid bpc (a diverged model) is never the best one, so it is never exported
        improved = math.isfinite(bpc) and (p.best_valid_bpc is None or bpc < p.best_valid_bpc)
        if improved:
            p.best_valid_bpc, p.best_epoch, p.bad_evals = bpc, round(epoch_f, 3), 0
            self._save_best()
        else:
            p.bad_evals += 1
            if cfg.lr_schedule == "plateau":
                p.lr *= cfg.lr_decay
                self._set_lr(p.lr)
        p.history.append({"epoch": round(epoch_f, 3), "chars_seen": p.chars_seen, "valid_bpc": bpc})
        m = self.metric
        self._log({"event": "valid", "epoch": round(epoch_f, 3), "step": p.step, "chars_seen": p.chars_seen,
                   f"valid_{m}": round(bpc, 5 if m == "bpc" else 8),
                   f"best_valid_{m}": None if p.best_valid_bpc is None else round(p.best_valid_bpc, 5 if m == "bpc" else 8),
                   **(extra or {}), "lr": p.lr, "improved": improved})
        log.info("epoch %.2f, %s characters seen: valid %s %.4f (best %.4f)", epoch_f, f"{p.chars_seen:,}", m, bpc,
                 bpc if p.best_valid_bpc is None else p.best_valid_bpc)
        if p.bad_evals >= cfg.patience:
            p.done, p.stop_reason = True, f"early stop: no improvement in {cfg.patience} evaluations"

    def run(self) -> Progress:
        """Train until early stopping, max_epochs, max_chars or max_steps; returns the final progress."""
        from tqdm.auto import tqdm

        cfg, p, model = self.cfg, self.progress, self.model
        where = {"unit": self.unit, "processes": 1 if self.dist is None else self.dist.world}
        if not self.resumed:
            p.next_eval_chars = int(cfg.eval_every * len(self.train_ids))
            self._log({"event": "start", **where, "model": model.config(), "n_params": self.n_params,
                       "config": asdict(cfg)})
        else:
            self._log({"event": "resume", **where, "epoch": p.epoch, "chunk": p.chunk, "step": p.step,
                       "budget": {k: getattr(cfg, k) for k in self.RESUME_OVERRIDES}})
        model.train()
        while not p.done:
            if p.epoch >= cfg.max_epochs:
                p.done, p.stop_reason = True, "max_epochs"
                break
            self._run_epoch(tqdm)
        if p.best_valid_bpc is None or (p.history and p.history[-1]["chars_seen"] != p.chars_seen):
            self._after_eval(*self._evaluate())  # a final evaluation so `best` reflects the end
            p.done = True
        self._save_latest()
        self._log({"event": "done", "stop_reason": p.stop_reason, "step": p.step, "chars_seen": p.chars_seen,
                   f"best_valid_{self.metric}": p.best_valid_bpc, "best_epoch": p.best_epoch,
                   "train_chars_per_s": round(p.chars_seen / max(p.train_seconds, 1e-9))})
        return p

    def _run_epoch(self, tqdm) -> None:
        """Train the chunks of epoch ``progress.epoch`` from ``progress.chunk`` on (until the run is done);
        an epoch read to its end moves the progress to the next one."""
        cfg, p = self.cfg, self.progress
        X, Q = self._epoch_streams(p.epoch)
        Y = self.task.stream_targets(X) if self.task else None  # a task's targets, (L, B, outputs)
        n_chunks = X.shape[0] // cfg.bptt
        if p.chunk == 0 or self.carry is None:
            self.carry = _detach(self.model.initial_state(self.B_local))
        bar = tqdm(total=n_chunks, initial=p.chunk, desc=f"epoch {p.epoch + 1}", unit="chunk",
                   disable=not self.progress_bar, dynamic_ncols=True)
        window = _StepWindow()
        while p.chunk < n_chunks and not p.done:
            rows = slice(p.chunk * cfg.bptt, (p.chunk + 1) * cfg.bptt)
            x = X[rows]  # output ids (T, B / W)
            t0 = time.perf_counter()
            stepped = self._step(x, None if Y is None else Y[rows], None if Q is None else Q[rows])
            if stepped is None:  # Guard (docs/guide/tables-and-speed.md, 'Measured facts the code relies on'):
                p.nonfinite, p.lr = p.nonfinite + 1, p.lr * 0.5  # skip the step, restart the streams, lower the rate
                self._set_lr(p.lr)
                self.carry = _detach(self.model.initial_state(self.B_local))
                self._log({"event": "nonfinite", "step": p.step, "epoch": p.epoch, "lr": p.lr})
                if p.nonfinite > 10:
                    p.done, p.stop_reason = True, "too many non-finite losses"
                p.chunk += 1
                continue
            loss, aux, soft, state = stepped
            self.carry = _detach(state)
            p.train_seconds += time.perf_counter() - t0
            p.chunk, p.step = p.chunk + 1, p.step + 1
            p.chars_seen += x.numel() * (1 if self.dist is None else self.dist.world)
            window.add(loss, aux, soft, x.numel())
            bar.update(1)
            if p.step % cfg.log_every == 0:
                self._log_window(window, bar, Q is not None)
                window = _StepWindow()
            self._after_step()
        bar.close()
        if p.chunk >= n_chunks:
            p.epoch += 1
            p.chunk = 0

    def _step(self, x: torch.Tensor, y, log_q: np.ndarray | None):
        """One optimizer step on chunk ``x`` (T, B / W) output ids (``y``: a task's targets; ``log_q``: the
        teacher's (T, B / W, V) float16). Returns (the data loss, the aux loss or None, the soft loss or
        None, the state after x), or None where the loss or gradient was not finite (no step taken)."""
        cfg, p, model, imap = self.cfg, self.progress, self.model, self.input_map
        if cfg.lr_schedule == "cosine":  # from lr to lr * lr_min over the planned budget
            f = self._progress_fraction()
            p.lr = cfg.lr * (cfg.lr_min + (1 - cfg.lr_min) * 0.5 * (1 + math.cos(math.pi * f)))
            self._set_lr(p.lr)
        state_in = self.carry if p.chunk > 0 else model.initial_state(self.B_local)
        logits, state = self.forward(x if imap is None else imap[x], state_in)
        if self.task:
            loss = self.task.loss(logits, y)
        else:
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1))
        objective, soft = loss, None
        if log_q is not None:  # distillation: (1 - A) CE(x) + A CE(q, p) (train/distill.py)
            soft = soft_cross_entropy(logits, torch.from_numpy(np.ascontiguousarray(log_q)).to(cfg.device))
            objective = (1.0 - cfg.distill) * loss + cfg.distill * soft
        aux = self.aux(self._progress_fraction()) if self.aux is not None else None
        total = objective if aux is None else objective + aux
        self.opt.zero_grad(set_to_none=True)
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        finite = bool(torch.isfinite(total) and torch.isfinite(gnorm))
        if self.dist is not None:
            finite = self.dist.all_true(finite)  # every rank skips the step together
        if not finite:
            return None
        self.opt.step()
        if self.constrain is not None:
            self.constrain()  # a model's constraint on its weights (linear_nlro: ||W||_2 <= 1)
        if self.ema is not None:
            self._update_ema()
        return loss, aux, soft, state

    def _log_window(self, w: _StepWindow, bar, distilled: bool) -> None:
        """Log a step event: the train metric (and aux, soft losses) over the steps of window ``w``."""
        p, m = self.progress, self.metric
        dt = time.perf_counter() - w.t0
        if self.dist is not None:  # every rank's streams
            w.nats, w.chars, w.soft = self.dist.sum(w.nats, w.chars, w.soft)
        bpc = w.nats / w.chars / (LN2 if m == "bpc" else 1.0)  # a task's loss is its mean
        bar.set_postfix({m: f"{bpc:.3g}", "chars_s": f"{w.chars / dt:,.0f}"})
        self._log({"event": "step", "epoch": p.epoch, "step": p.step, "chars_seen": p.chars_seen,
                   f"train_{m}": round(bpc, 5 if m == "bpc" else 8), "lr": p.lr, "chars_per_s": round(w.chars / dt),
                   **({"aux_loss": round(w.aux / max(w.steps, 1), 8)} if self.aux is not None else {}),
                   **({"train_soft_bits": round(w.soft / w.chars / LN2, 5)} if distilled else {})})

    def _after_step(self) -> None:
        """Evaluate when due, stop at the budget (max_steps, max_chars), checkpoint every ckpt_every steps."""
        cfg, p = self.cfg, self.progress
        if p.chars_seen >= p.next_eval_chars:
            p.next_eval_chars += int(cfg.eval_every * len(self.train_ids))
            self._after_eval(*self._evaluate())
        if cfg.max_steps and p.step >= cfg.max_steps:
            p.done, p.stop_reason = True, "max_steps"
        if cfg.max_chars and p.chars_seen >= cfg.max_chars:
            p.done, p.stop_reason = True, "max_chars"
        if p.step % cfg.ckpt_every == 0:
            self._save_latest()


class _StepWindow:
    """The train losses summed since the last step event: nats and characters (over this rank's streams),
    the aux loss and steps, the soft loss (nats times characters), from ``t0`` (perf_counter seconds)."""

    def __init__(self):
        self.nats, self.chars, self.aux, self.steps, self.soft, self.t0 = 0.0, 0, 0.0, 0, 0.0, time.perf_counter()

    def add(self, loss: torch.Tensor, aux: torch.Tensor | None, soft: torch.Tensor | None, n: int) -> None:
        self.nats, self.chars, self.steps = self.nats + loss.item() * n, self.chars + n, self.steps + 1
        if aux is not None:
            self.aux += float(aux.detach())
        if soft is not None:
            self.soft += float(soft.detach()) * n


def train(cfg: TrainConfig, out_dir: str | Path, progress_bar: bool = True, overrides: dict | None = None,
          dist=None) -> Progress:
    """Train (or resume, if ``out_dir`` holds a run) and return the final progress.

    On resume the saved config is used, except for the budget fields in ``overrides``
    (:attr:`Trainer.RESUME_OVERRIDES`). ``dist``: a :class:`isan.train.ddp.DistContext` for
    data-parallel training (every rank calls this with the same arguments).
    """
    return Trainer(cfg, out_dir, progress_bar=progress_bar, overrides=overrides, dist=dist).run()
