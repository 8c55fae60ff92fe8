"""Distillation (issue 37, train/distill.py): the teacher's distributions equal the numpy reference's on
real text, they line up with the training streams position by position, the loss reaches the gradient,
and a resume checks that the teacher is the same."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from isan.alphabet import Alphabet  # noqa: E402
from isan.engine.bundle import write_bundle  # noqa: E402
from isan.engine.reference import log_softmax, logits_ref, states_ref  # noqa: E402
from isan.errors import CheckpointError, IsanError  # noqa: E402
from isan.train.distill import load_teacher, soft_cross_entropy, teacher_log_probs, teacher_samples  # noqa: E402
from isan.train.loop import TrainConfig, Trainer  # noqa: E402

from conftest import random_params  # noqa: E402


def tiny(text_path, teacher, **kw):
    base = dict(d=16, params=None, data=str(text_path), dataset="text", batch_size=32, bptt=32, lr=1e-2, eval_every=0.1, patience=1000,
                max_valid_chars=10_000, valid_streams=10, ckpt_every=10, log_every=10, max_steps=40,
                teacher=str(teacher) if teacher else None, distill=1.0, max_epochs=5)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def small_text(tmp_path_factory, text8_path):
    """The first 300k characters of text8 (the 90/10 split of --dataset text), so a teacher pass is short."""
    path = tmp_path_factory.mktemp("text") / "text8_300k.txt"
    with open(text8_path) as f:
        path.write_text(f.read(300_000))
    return path


@pytest.fixture(scope="module")
def teacher_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "t"
    write_bundle(out, random_params(d=12, seed=3, scale=0.9).as_dict(), Alphabet.text8(), kind="isan")
    return out


def test_teacher_log_probs_equal_the_reference(teacher_bundle, text8_valid_head):
    """Every position, every class, against one float64 pass from h0 over the whole text: the pieces after
    the first start after a warm-up, so they differ by the forgotten context (0.9^warmup) and float16."""
    alphabet = Alphabet.text8()
    ids = alphabet.encode(text8_valid_head[:6000])
    _, model, _ = load_teacher(teacher_bundle)
    got = teacher_log_probs(model, ids, streams=7, warmup=200, bptt=64)
    assert got.dtype == np.float16 and got.shape == (len(ids), 27) and np.isfinite(got).all()
    p = random_params(d=12, seed=3, scale=0.9)
    p64 = type(p)(**{n: np.asarray(v, dtype=np.float64) for n, v in p.as_dict().items()})
    H = states_ref(p64, ids, p64.h0)
    S = np.vstack([p64.h0[None, :], H[:-1]])  # the state before each character
    want = log_softmax(logits_ref(p64, S))
    np.testing.assert_allclose(got.astype(np.float64), want, atol=2e-2, rtol=2e-3)
    # one stream, no warm-up: the same pass as the reference's
    one = teacher_log_probs(model, ids, streams=1, warmup=0, bptt=1000)
    np.testing.assert_allclose(one.astype(np.float64), want, atol=1e-2, rtol=2e-3)


def test_an_ensemble_is_the_mixture_of_its_teachers(tmp_path, teacher_bundle, text8_valid_head):
    """Two teachers: log q = log((q_1 + q_2) / 2) at every position and class, against the float64 reference
    of each; a teacher twice over is that teacher; the teachers are left where they were."""
    alphabet = Alphabet.text8()
    ids = alphabet.encode(text8_valid_head[:3000])
    second = tmp_path / "t2"
    write_bundle(second, random_params(d=20, seed=5, scale=0.9).as_dict(), alphabet, kind="isan")
    models = [load_teacher(teacher_bundle)[1], load_teacher(second)[1]]
    got = teacher_log_probs(models, ids, streams=1, warmup=0, bptt=500)
    want = []
    for p in (random_params(d=12, seed=3, scale=0.9), random_params(d=20, seed=5, scale=0.9)):
        p64 = type(p)(**{n: np.asarray(v, dtype=np.float64) for n, v in p.as_dict().items()})
        S = np.vstack([p64.h0[None, :], states_ref(p64, ids, p64.h0)[:-1]])
        want.append(np.exp(log_softmax(logits_ref(p64, S))))
    mix = np.log((want[0] + want[1]) / 2)
    np.testing.assert_allclose(got.astype(np.float64), mix, atol=1e-2, rtol=2e-3)
    assert np.abs(np.log(want[0]) - mix).max() > 0.1  # the mixture is not either member
    twice = teacher_log_probs([models[0], models[0]], ids, streams=3, warmup=100, bptt=64)
    np.testing.assert_array_equal(twice, teacher_log_probs(models[0], ids, streams=3, warmup=100, bptt=64))
    assert all(next(m.parameters()).device.type == "cpu" for m in models)


def test_training_with_an_ensemble_records_every_teacher(tmp_path, small_text, teacher_bundle):
    second = tmp_path / "t2"
    write_bundle(second, random_params(d=20, seed=5, scale=0.9).as_dict(), Alphabet.text8(), kind="isan")
    out = tmp_path / "e"
    from click.testing import CliRunner

    from isan.cli import main

    r = CliRunner().invoke(main, ["train", "--out", str(out), "--data", str(small_text), "--dataset", "text", "--d", "8",
                                  "--max-steps", "3", "--teacher", str(teacher_bundle), "--teacher", str(second),
                                  "--distill", "0.5", "--no-progress", "--batch-size", "16", "--bptt", "16"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())["train"]
    assert cfg["teacher"] == f"{teacher_bundle},{second}"
    shas = cfg["teacher_sha256"].split(",")
    assert len(shas) == 2 and all(len(x) == 64 for x in shas) and shas[0] != shas[1]


def test_the_targets_line_up_with_the_streams(tmp_path, small_text, teacher_bundle):
    """A teacher that is certain of the true next character: its argmax is X itself, at every (t, b)."""
    tr = Trainer(tiny(small_text, teacher_bundle), tmp_path / "a", progress_bar=False)
    ids = tr.corpus.train
    onehot = np.full((len(ids), 27), -60.0, dtype=np.float16)
    onehot[np.arange(len(ids)), ids] = 0.0
    tr.teacher_logq = onehot
    for epoch in (0, 1, 2):  # the epochs start at different shifts
        X, Q = tr._epoch_streams(epoch)
        assert Q.shape == (*X.shape, 27)
        np.testing.assert_array_equal(Q.argmax(-1), X.numpy())


def test_distillation_reaches_the_gradient(tmp_path, small_text, teacher_bundle):
    """With distill = 1 the only signal is the teacher's: the student's distance to it falls."""
    out = tmp_path / "d"
    p = Trainer(tiny(small_text, teacher_bundle, max_steps=60), out, progress_bar=False).run()
    assert p.step == 60
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    soft = [e["train_soft_bits"] for e in log if e["event"] == "step"]
    assert len(soft) == 6 and soft[-1] < soft[0] - 0.1
    cfg = json.loads((out / "config.json").read_text())["train"]
    assert cfg["teacher"] == str(teacher_bundle) and cfg["distill"] == 1.0 and len(cfg["teacher_sha256"]) == 64


def _mixture_ref(params, ids):
    """float64 reference: the mixture's log q(x_i | x_<i) at every position of one stream from h0."""
    qs = []
    for p in params:
        p64 = type(p)(**{n: np.asarray(v, dtype=np.float64) for n, v in p.as_dict().items()})
        S = np.vstack([p64.h0[None, :], states_ref(p64, ids, p64.h0)[:-1]])
        qs.append(np.exp(log_softmax(logits_ref(p64, S))))
    return np.log(np.mean(qs, axis=0))


def test_teacher_samples_are_drawn_from_the_recorded_distributions(tmp_path, teacher_bundle):
    """Two teachers' text: each stream's recorded log q equals the float64 mixture's along the sampled text
    (from h0, stream after stream); the characters follow q (their frequencies against the mean of q);
    a seed gives the same text, another seed another; the teachers stay where they were."""
    second = tmp_path / "t2"
    params = [random_params(d=12, seed=3, scale=0.9), random_params(d=20, seed=5, scale=0.9)]
    write_bundle(second, params[1].as_dict(), Alphabet.text8(), kind="isan")
    models = [load_teacher(teacher_bundle)[1], load_teacher(second)[1]]
    ids, logq = teacher_samples(models, 1200, streams=2, seed=7)  # two streams of 600 steps
    assert ids.shape == (1200,) and ids.dtype == np.int64 and logq.shape == (1200, 27) and logq.dtype == np.float16
    assert np.isfinite(logq).all() and ids.min() >= 0 and ids.max() < 27
    for s in (0, 1):
        piece = slice(s * 600, (s + 1) * 600)
        np.testing.assert_allclose(logq[piece].astype(np.float64), _mixture_ref(params, ids[piece]),
                                   atol=1e-2, rtol=2e-3)
    n = 40_000  # 4,000 streams of 10 steps: the characters' frequencies against the mean of their q
    many, many_q = teacher_samples(models, n, streams=4000, seed=7)
    freq = np.bincount(many, minlength=27) / n
    assert np.abs(freq - np.exp(many_q.astype(np.float64)).mean(0)).max() < 0.015  # a frequency's sd < 0.0025
    again, _ = teacher_samples(models, n, streams=4000, seed=7)
    other, _ = teacher_samples(models, n, streams=4000, seed=8)
    np.testing.assert_array_equal(again, many)
    assert (other != many).mean() > 0.5
    assert all(next(m.parameters()).device.type == "cpu" for m in models)
    with pytest.raises(IsanError, match="positive"):
        teacher_samples(models, 0)


def test_synthetic_text_is_kept_checked_and_read_on_resume(tmp_path, small_text, teacher_bundle):
    """--synthetic-chars: the teacher's text follows the train split in an epoch's streams with its own
    distributions; the file's sha256 is recorded; a resume reads it; a changed or lost file is refused (and
    the run goes on once it is back)."""
    out = tmp_path / "s"
    tr = Trainer(tiny(small_text, teacher_bundle, synthetic_chars=5000, max_steps=4, distill=0.8), out,
                 progress_bar=False)
    N = len(tr.corpus.train)
    assert len(tr.train_ids) == N + 5000 and tr.teacher_logq.shape == (N + 5000, 27)
    np.testing.assert_array_equal(tr.train_ids[:N], tr.corpus.train)
    path = out / Trainer.SYNTHETIC
    from safetensors.numpy import load_file

    kept = load_file(str(path))
    np.testing.assert_array_equal(tr.train_ids[N:], kept["ids"])
    np.testing.assert_array_equal(tr.teacher_logq[N:], kept["logq"])
    p = random_params(d=12, seed=3, scale=0.9)  # the teacher's q along its own text, stream by stream from h0
    T = -(-5000 // 2048)
    for s in range(0, 5000 // T, 97):
        piece = slice(N + s * T, N + (s + 1) * T)
        np.testing.assert_allclose(tr.teacher_logq[piece].astype(np.float64), _mixture_ref([p], tr.train_ids[piece]),
                                   atol=1e-2, rtol=2e-3)
    tr.run()
    cfg = json.loads((out / "config.json").read_text())["train"]
    from isan.jsonfile import file_sha256

    assert cfg["synthetic_chars"] == 5000 and cfg["synthetic_sha256"] == file_sha256(path)
    resumed = Trainer(tiny(small_text, teacher_bundle), out, progress_bar=False, overrides={"max_steps": 6})
    assert resumed.resumed and len(resumed.train_ids) == N + 5000 and resumed.run().step == 6
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(CheckpointError, match="not the synthetic text this run wrote"):
        Trainer(tiny(small_text, teacher_bundle), out, progress_bar=False)
    path.unlink()
    with pytest.raises(CheckpointError, match="is missing"):
        Trainer(tiny(small_text, teacher_bundle), out, progress_bar=False)
    path.write_bytes(good)
    again = Trainer(tiny(small_text, teacher_bundle), out, progress_bar=False, overrides={"max_steps": 8})
    assert again.run().step == 8


def test_soft_cross_entropy_is_the_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 7, generator=g)
    log_q = torch.log_softmax(torch.randn(5, 3, 7, generator=g), -1)
    want = -(log_q.exp() * torch.log_softmax(logits, -1)).sum(-1).mean()
    torch.testing.assert_close(soft_cross_entropy(logits, log_q.half()), want, atol=2e-3, rtol=1e-3)
    hard = torch.randint(0, 7, (5, 3), generator=g)  # a one-hot q is the ordinary cross-entropy
    onehot = torch.full((5, 3, 7), -60.0).scatter_(-1, hard.unsqueeze(-1), 0.0)
    logits = logits.double()  # in float64: the two differ by exp(-60) terms only, far below 1e-12
    torch.testing.assert_close(soft_cross_entropy(logits, onehot),
                               torch.nn.functional.cross_entropy(logits.reshape(-1, 7), hard.reshape(-1)), rtol=0,
                               atol=1e-12)


def test_resume_checks_the_teacher(tmp_path, small_text, teacher_bundle):
    out = tmp_path / "r"
    Trainer(tiny(small_text, teacher_bundle, max_steps=10), out, progress_bar=False).run()
    other = tmp_path / "other"
    write_bundle(other, random_params(d=12, seed=4).as_dict(), Alphabet.text8(), kind="isan")
    cfg = json.loads((out / "config.json").read_text())
    cfg["train"]["teacher"] = str(other)  # the run's teacher replaced by another model
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="not the one this run started with"):
        Trainer(tiny(small_text, teacher_bundle), out, progress_bar=False)
    cfg["train"]["teacher"] = str(teacher_bundle)
    (out / "config.json").write_text(json.dumps(cfg))
    tr = Trainer(tiny(small_text, teacher_bundle, max_steps=20), out, progress_bar=False,
                 overrides={"max_steps": 20})
    assert tr.resumed and tr.run().step == 20  # the same teacher: the run goes on


def test_bad_options_are_refused(tmp_path, small_text, teacher_bundle):
    with pytest.raises(IsanError, match="goes with --teacher"):
        Trainer(tiny(small_text, teacher_bundle, distill=0.0), tmp_path / "a", progress_bar=False)
    with pytest.raises(IsanError, match="and so does --synthetic-chars"):
        Trainer(tiny(small_text, None, distill=0.0, synthetic_chars=100), tmp_path / "a2", progress_bar=False)
    with pytest.raises(IsanError, match="must be 0 or more"):  # refused before the teacher's pass
        Trainer(tiny(small_text, teacher_bundle, distill=0.8, synthetic_chars=-1), tmp_path / "a3", progress_bar=False)
    with pytest.raises(IsanError, match="do not fit in this machine's"):  # with the data's 27 classes (#45 item 20)
        Trainer(tiny(small_text, teacher_bundle, distill=0.8, synthetic_chars=10**15), tmp_path / "a4", progress_bar=False)
    abc = tmp_path / "abc"
    write_bundle(abc, random_params(K=5, V=5, d=4).as_dict(), Alphabet(tuple(" abcd")), kind="isan")
    with pytest.raises(IsanError, match="another alphabet"):
        Trainer(tiny(small_text, abc), tmp_path / "b", progress_bar=False)
    from click.testing import CliRunner

    from isan.cli import main

    r = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "c"), "--data", str(small_text), "--dataset", "text", "--d", "8",
                                  "--max-steps", "2", "--teacher", str(teacher_bundle), "--no-progress"])
    assert r.exit_code != 0 and "goes with --teacher" in r.output and "Traceback" not in r.output
