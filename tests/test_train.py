"""Training: a short real run on text8 whose loss falls; checkpoints, resume and export."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from isan.engine import Engine  # noqa: E402
from isan.export import export_checkpoint  # noqa: E402
from isan.train.loop import TrainConfig, Trainer  # noqa: E402


def small_config(text8_path, **kw):
    base = dict(d=24, params=None, data=str(text8_path), batch_size=64, bptt=32, lr=3e-3, eval_every=0.02,
                max_valid_chars=20_000, valid_streams=20, ckpt_every=40, log_every=20, max_steps=240)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, text8_path):
    out = tmp_path_factory.mktemp("run") / "tiny"
    p = Trainer(small_config(text8_path), out, progress_bar=False).run()
    return out, p


def test_loss_falls(trained_run):
    out, p = trained_run
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [e["train_bpc"] for e in log if e["event"] == "step"]
    valid = [e["valid_bpc"] for e in log if e["event"] == "valid"]
    assert len(steps) >= 10 and len(valid) >= 2
    assert np.mean(steps[-3:]) < steps[0] - 0.8  # from ~4.7 bits towards English
    assert valid[-1] < 3.2 and p.best_valid_bpc == pytest.approx(min(valid), abs=1e-5)
    assert log[-1]["event"] == "done" and log[-1]["train_chars_per_s"] > 0


def test_resume_continues_where_it_stopped(trained_run, tmp_path, text8_path):
    out = tmp_path / "r"
    Trainer(small_config(text8_path, max_steps=60), out, progress_bar=False).run()
    tr = Trainer(small_config(text8_path, max_steps=999), out, progress_bar=False, overrides={"max_steps": 100})
    assert tr.resumed and tr.progress.step == 60
    w_before = tr.model.W.detach().clone()
    p = tr.run()
    assert p.step == 100 and p.chars_seen == 100 * 64 * 32
    assert not np.allclose(tr.model.W.detach().numpy(), w_before.numpy())
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [e["event"] for e in log].count("resume") == 1


def test_export_and_score(trained_run, tmp_path, text8_valid_head):
    out, p = trained_run
    bundle = export_checkpoint(out, tmp_path / "bundle")
    eng = Engine.load(bundle)
    m = eng.manifest
    assert m["training"]["best_valid_bpc"] == pytest.approx(p.best_valid_bpc)
    assert (bundle / "train_log.jsonl").exists()
    # the bundle scores real text about as well as training's own validation said
    assert eng.score(text8_valid_head[:20_000]).bpc == pytest.approx(p.best_valid_bpc, abs=0.15)


def test_unknown_characters_in_training_data(tmp_path):
    from isan.errors import AlphabetError
    from isan.train.data import load_corpus
    from isan.alphabet import Alphabet

    f = tmp_path / "t.txt"
    f.write_text("hello world\nHELLO")
    c = load_corpus(f, dataset="text")
    assert len(c.alphabet) == len(set("hello world\nHELLO"))
    with pytest.raises(AlphabetError, match="offset 11"):
        load_corpus(f, dataset="text", alphabet=Alphabet.text8())


def test_bench_train_rows_and_cli(tmp_path):
    """`isan bench train` on tiny budgets: one row per (model, path), the ISAN row is the 1.0x baseline,
    the JSON lands where asked, and a bad model name is a usage error."""
    from click.testing import CliRunner

    from isan.cli import main
    from isan.bench.train import bench_train, markdown_train

    ids = np.random.default_rng(0).integers(0, 27, 5000).astype(np.int64)
    r = bench_train(ids, budgets=(("tiny", 3e3),), models=("gru", "isan"), batch=4, bptt=8, steps=2, repeats=2,
                    log=lambda m: None)
    assert [(row["model"], row["path"]) for row in r["rows"]] == [("gru", "fused"), ("gru", "step loop"), ("isan", "scan")]
    isan = r["rows"][2]
    assert isan["ratio_vs_isan"] == 1.0 and all(row["chars_per_s"] > 0 for row in r["rows"])
    assert r["rows"][0]["ratio_vs_isan"] == pytest.approx(r["rows"][0]["chars_per_s"] / isan["chars_per_s"])
    assert all(row["params"] <= 3e3 and len(row["times_s"]) == 2 for row in r["rows"])
    assert "| tiny | gru | step loop |" in markdown_train(r)
    out = tmp_path / "train.json"
    res = CliRunner().invoke(main, ["bench", "train", "--budgets", "2e3", "--models", "isan,lstm", "--steps", "1",
                                    "--repeats", "1", "--no-reference", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert [row["model"] for row in json.loads(out.read_text())["rows"]] == ["isan", "lstm"]
    res = CliRunner().invoke(main, ["bench", "train", "--models", "isan,transformer", "--out", str(out)])
    assert res.exit_code == 2 and "transformer" in res.output


def test_diverged_run_has_no_best_checkpoint(tmp_path, text8_path, monkeypatch):
    """A non-finite valid bpc is never 'improved': the run keeps no best checkpoint, its log stays
    JSON, and exporting it is a clear error rather than a NaN model."""
    from isan.errors import IsanError

    monkeypatch.setattr(Trainer, "_evaluate", lambda self: (float("nan"), {}))
    out = tmp_path / "nan"
    p = Trainer(small_config(text8_path, max_steps=30, eval_every=0.005), out, progress_bar=False).run()
    assert p.best_valid_bpc is None
    events = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    valid = [e for e in events if e["event"] == "valid"]
    assert valid and not any(e["improved"] for e in valid) and all(e["best_valid_bpc"] is None for e in valid)
    assert not (out / "best.safetensors").exists()
    with pytest.raises(IsanError):
        export_checkpoint(out, tmp_path / "bundle")
