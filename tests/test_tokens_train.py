"""Training on token alphabets (bytes, character pairs, words): corpora, model sizes, checkpoints
that resume exactly, the CLI options, and the auxiliary-loss hook of the loop."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from isan.alphabet import Alphabet  # noqa: E402
from isan.errors import CheckpointError, IsanError  # noqa: E402
from isan.tokens import ByteAlphabet, PairAlphabet, WordAlphabet, alphabet_from_json  # noqa: E402
from isan.train import models  # noqa: E402
from isan.train.data import load_corpus  # noqa: E402
from isan.train.loop import TrainConfig, Trainer  # noqa: E402

from conftest import DATA, need  # noqa: E402

SHAKESPEARE = DATA / "tinyshakespeare" / "input.txt"


@pytest.fixture(scope="module")
def shakespeare_head(tmp_path_factory):
    """The first 60,000 bytes of Tiny Shakespeare plus a non-ASCII line (so that 'other' bytes occur)."""
    text = need(SHAKESPEARE).read_text(encoding="utf-8")[:60_000] + "\nCafé — naïve 𝄞 ok\n"
    p = tmp_path_factory.mktemp("data") / "shakespeare_head.txt"
    p.write_text(text, encoding="utf-8")
    return p


def tiny(data, **kw):
    base = dict(d=8, params=None, data=str(data), dataset="text", batch_size=8, bptt=16, lr=3e-3, eval_every=100.0,
                valid_streams=4, max_valid_chars=2_000, ckpt_every=5, log_every=5, max_steps=12, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def read_log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


# ---- corpora ------------------------------------------------------------------------------------
def test_byte_corpus_round_trips_and_counts_inputs_on_train_only(shakespeare_head):
    text = shakespeare_head.read_text(encoding="utf-8")
    raw = text.encode("utf-8")
    c = load_corpus(shakespeare_head, "text", kind="bytes", inputs=20)
    a = c.alphabet
    assert isinstance(a, ByteAlphabet) and (c.K, c.V, c.unit) == (20, 256, "byte")
    assert len(c.train) == int(len(raw) * 0.9) and len(c.train) + len(c.valid) == len(raw)
    assert a.decode(np.concatenate([c.train, c.valid])) == text
    # the 19 most frequent bytes of the TRAIN part get inputs; the non-ASCII bytes (valid only) are 'other'
    counts = np.bincount(np.frombuffer(raw[: len(c.train)], dtype=np.uint8), minlength=256)
    assert set(a.frequent) == set(np.argsort(-counts, kind="stable")[:19].tolist())
    other = [b for b in "é".encode() + "𝄞".encode()]
    assert all(a.input_map[b] == c.K - 1 for b in other) and max(c.valid) >= 0x80
    assert all(a.input_map[b] == i for i, b in enumerate(a.frequent))
    # the default: at most K = 70 inputs, fewer when the train part has fewer distinct bytes
    assert load_corpus(shakespeare_head, "text", kind="bytes").K == min(70, int((counts > 0).sum()) + 1)
    with pytest.raises(IsanError, match="--inputs"):
        load_corpus(shakespeare_head, "text", kind="bytes", inputs=1)


def test_pair_and_word_corpora(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("the cat sat on the mat " * 30 + "the dog")  # odd length: the last pair is padded
    c = load_corpus(f, "text", kind="pairs")
    assert isinstance(c.alphabet, PairAlphabet) and c.unit == "pair" and c.input_map is None
    assert c.K == c.V == len(set(f.read_text())) ** 2
    assert c.alphabet.decode(np.concatenate([c.train, c.valid])) == f.read_text() + " "
    # text8 pairs are of the text8 alphabet: 27^2
    assert load_corpus(need(DATA / "text8_head" / "text8_head.txt"), "text8", kind="pairs").K == 729
    v = tmp_path / "v.txt"
    v.write_text("the bird sat\n")
    w = load_corpus(f, "text", kind="words", valid_data=v)
    assert isinstance(w.alphabet, WordAlphabet) and w.unit == "word" and w.K == w.V
    assert w.alphabet.decode(w.train).split() == f.read_text().split()
    assert w.alphabet.decode(w.valid) == "the bird sat" and w.test is None
    with pytest.raises(IsanError, match="--valid-data"):
        load_corpus(f, "text8", valid_data=v)


# ---- training -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, model", [("bytes", "isan"), ("pairs", "lstm")])
def test_token_run_resumes_exactly(shakespeare_head, tmp_path, kind, model):
    """A run stopped at step 6 and resumed to 12 ends with the weights of a run of 12 straight; the
    model is built with K inputs and V outputs and reads input_map[ids]; config.json records the alphabet."""
    whole = tiny(shakespeare_head, model=model, alphabet=kind, inputs=30)
    straight = Trainer(whole, tmp_path / "a", progress_bar=False)
    K, V = straight.corpus.K, straight.corpus.V
    assert (straight.model.K, straight.model.V) == (K, V) and (K, V) == ((30, 256) if kind == "bytes" else (K, K))
    straight.run()
    out = tmp_path / "b"
    Trainer(tiny(shakespeare_head, model=model, alphabet=kind, inputs=30, max_steps=6), out, progress_bar=False).run()
    tr = Trainer(tiny(shakespeare_head, model=model, alphabet=kind, inputs=30), out, progress_bar=False,
                 overrides={"max_steps": 12})
    assert tr.resumed and tr.progress.step == 6
    tr.run()
    a = load_file(str(tmp_path / "a" / "latest" / "weights.safetensors"))
    b = load_file(str(out / "latest" / "weights.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["unit"] == tr.corpus.unit and alphabet_from_json(cfg["alphabet"]) == tr.corpus.alphabet
    assert cfg["alphabet"]["kind"] == kind and cfg["model"]["K"] == K and cfg["model"]["V"] == V
    log = read_log(out)
    assert log[0]["event"] == "start" and log[0]["unit"] == tr.corpus.unit
    resume = [e for e in log if e["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["unit"] == tr.corpus.unit
    assert "best_valid_bpc" in log[-1] and log[-1]["step"] == 12


def test_byte_model_reads_input_map(shakespeare_head, tmp_path):
    """The loss the loop trains is that of the model on input_map[ids] with ids as targets."""
    tr = Trainer(tiny(shakespeare_head, alphabet="bytes", inputs=12, max_steps=1), tmp_path / "r", progress_bar=False)
    seen = []
    orig = tr.model.forward
    tr.model.forward = lambda x, h: (seen.append(x.clone()), orig(x, h))[1]
    tr.run()
    x_in = seen[0]
    assert x_in.max() < 12 and (x_in == 11).any()  # inputs in [0, K), 'other' among them
    X = tr._epoch_streams(0)[0][: tr.cfg.bptt]  # (ids, teacher log q or None)
    assert torch.equal(x_in, torch.as_tensor(tr.corpus.input_map)[X])


def test_char_checkpoint_keeps_its_list_and_changed_data_is_refused(shakespeare_head, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text(shakespeare_head.read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "c"
    Trainer(tiny(data, max_steps=2), out, progress_bar=False).run()
    cfg = json.loads((out / "config.json").read_text())
    assert isinstance(cfg["alphabet"], list) and "unit" not in cfg  # as before token alphabets
    assert alphabet_from_json(cfg["alphabet"]) == Alphabet.from_text(data.read_text(encoding="utf-8"))
    data.write_text("abc " * 500)  # the data changed under the run: its alphabet is another
    with pytest.raises(CheckpointError, match="another alphabet"):
        Trainer(tiny(data), out, progress_bar=False, overrides={"max_steps": 4})


def test_cli_train_bytes_and_valid_data(shakespeare_head, tmp_path):
    from isan.cli import main

    v = tmp_path / "v.txt"
    v.write_text("To be, or not to be: that is the question.\n" * 20)
    out = tmp_path / "cli"
    args = ["train", "isan", "--out", str(out), "--data", str(shakespeare_head), "--dataset", "text",
            "--alphabet", "bytes", "--inputs", "16", "--valid-data", str(v), "--d", "6", "--batch-size", "4",
            "--bptt", "8", "--max-steps", "3", "--no-progress"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    info = json.loads(res.output.strip().splitlines()[-1])
    assert info["unit"] == "byte" and info["steps"] == 3
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["train"]["valid_data"] == str(v) and cfg["model"]["K"] == 16 and cfg["model"]["V"] == 256
    res = CliRunner().invoke(main, ["train", "isan", "--out", str(tmp_path / "d"), "--distributed", "--max-steps", "1"])
    assert res.exit_code == 2 and "torchrun" in res.output


# ---- the auxiliary-loss hook --------------------------------------------------------------------
class _PenalisedISAN(models.ISAN):
    """An ISAN with an L1 penalty on W whose weight anneals with the progress fraction."""

    kind = "isan_l1_test"
    fractions: list = []

    def aux_loss(self, progress_fraction):
        type(self).fractions.append(progress_fraction)
        return 1e-2 * progress_fraction * self.W.abs().sum()


def test_aux_loss_is_added_and_logged(shakespeare_head, tmp_path, monkeypatch):
    monkeypatch.setitem(models.MODELS, "isan_l1_test", _PenalisedISAN)
    _PenalisedISAN.fractions = []
    out = tmp_path / "aux"
    tr = Trainer(tiny(shakespeare_head, model="isan_l1_test", max_steps=10), out, progress_bar=False)
    tr.run()
    # step-based without a character budget: 0/10, 1/10, ... 9/10
    assert _PenalisedISAN.fractions == pytest.approx([i / 10 for i in range(10)])
    steps = [e for e in read_log(out) if e["event"] == "step"]
    assert len(steps) == 2 and all(e["aux_loss"] > 0 for e in steps)
    # the penalty changes training: the same run without it ends elsewhere, with larger |W|
    plain = Trainer(tiny(shakespeare_head, max_steps=10), tmp_path / "plain", progress_bar=False)
    plain.run()
    assert tr.model.W.detach().abs().sum() < plain.model.W.detach().abs().sum()
    # with a character budget the fraction is chars_seen / max_chars
    _PenalisedISAN.fractions = []
    Trainer(tiny(shakespeare_head, model="isan_l1_test", max_steps=None, max_chars=4 * 8 * 16), tmp_path / "c",
            progress_bar=False).run()
    assert _PenalisedISAN.fractions == pytest.approx([0, 0.25, 0.5, 0.75])
