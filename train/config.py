"""What defines a training run and where it stands: :class:`TrainConfig` (saved in the run directory's
config.json; a resumed run reuses it), :class:`Progress` (the resume point's progress.json) and the
alphabet fields config.json records (:func:`alphabet_config`). The loop (:mod:`isan.train.loop`) and
the run directory (:mod:`isan.train.run_dir`) import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from isan.tokens import alphabet_to_json

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
    alphabet: str = "chars"  # token alphabet kind: chars, bytes, pairs or words (isan.train.data)
    inputs: int = 70  # bytes only: K input symbols (the K - 1 most frequent train bytes + other)
    valid_data: str | None = None  # dataset "text" only: all of `data` is train, this file is valid
    # ---- stability and regularisation (issue 20; isan only unless noted) ----
    stable_rho: float | None = None  # W_x = P^-1 U_x P with ||U_x||_2 <= rho after every step (train/stable.py)
    stable_basis: bool = False  # learn P (else P = I)
    stable_basis_penalty: float = 1e-2  # weight of mean log(sigma_i(P))^2 (keeps P well-conditioned)
    stable_exact_every: int = 1  # project onto the bound every this many steps (1: it holds after every step)
    state_dropout: float = 0.0  # dropout on the states before the readout (the recurrence stays exact)
    ema: float = 0.0  # decay of an exponential moving average of the weights (0: none); any model
    lr_schedule: str = "plateau"  # plateau: times lr_decay when valid does not improve; cosine: over the budget
    lr_min: float = 0.02  # cosine: the final rate as a fraction of lr
    # ---- structure (issue 48; train/structured.py; isan on characters only) ----
    structure: str = "dense"  # dense: W[x] (d, d); dplr: W[x] = diag(a[x]) + U[x] V[x]^T, U and V (d, rank)
    rank: int | None = None  # dplr only: the rank r of U V^T
    # ---- distillation (issue 37; train/distill.py; language models only) ----
    teacher: str | None = None  # an exported ISAN bundle with the same alphabet, trained on the same split;
    #                             several, comma-separated: an ensemble, distilled as the mixture of their q
    distill: float = 0.0  # the loss is (1 - distill) CE(x) + distill CE(teacher's q, p)
    teacher_sha256: str | None = None  # the teachers' params_sha256 (comma-separated), recorded at the
    #                                    start; a resume checks it
    synthetic_chars: int = 0  # characters sampled from the teacher(s), appended to the train split with their
    #                           distributions (train/distill.py teacher_samples); 0: none
    synthetic_sha256: str | None = None  # sha256 of the run's synthetic.safetensors, recorded when it is written

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




def alphabet_config(alphabet) -> dict:
    """config.json's alphabet fields: ``{"alphabet": [characters]}`` for a character alphabet (as
    runs before token alphabets wrote it), else ``{"alphabet": alphabet_to_json(a), "unit": a.unit}``."""
    if getattr(alphabet, "kind", "chars") == "chars":
        return {"alphabet": alphabet.to_list()}
    return {"alphabet": alphabet_to_json(alphabet), "unit": alphabet.unit}
