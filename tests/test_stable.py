"""The stable ISAN (issue 20): the contraction holds after every step, the exported certificate verifies from the
bundle's files alone, a certified model cannot diverge on any input, and resume keeps EMA and dropout."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from safetensors.numpy import load_file  # noqa: E402

from isan.engine import Engine  # noqa: E402
from isan.errors import CheckpointError  # noqa: E402
from isan.export import export_checkpoint  # noqa: E402
from isan.export.checkpoint import CERT_FILE, write_certificate  # noqa: E402
from isan.train.loop import TrainConfig, Trainer  # noqa: E402
from isan.train.stable import StableISAN  # noqa: E402


def tiny(text8_path, **kw):
    base = dict(d=16, params=None, data=str(text8_path), batch_size=32, bptt=32, lr=1e-2, eval_every=0.005,
                max_valid_chars=10_000, valid_streams=10, ckpt_every=10, log_every=10, max_steps=40)
    base.update(kw)
    return TrainConfig(**base)


def spectral_norms(W: torch.Tensor) -> np.ndarray:
    return np.linalg.svd(W.detach().double().numpy(), compute_uv=False)[:, 0]


def record_norms(tr: Trainer, of) -> list:
    """Wrap the trainer's post-step hook so that every optimizer step records ``of(model)``."""
    seen, inner = [], tr.constrain

    def hook():
        if inner is not None:
            inner()
        seen.append(of(tr.model))

    tr.constrain = hook
    return seen


@pytest.mark.parametrize("exact_every", [1, 5])
def test_constraint_holds_after_every_step(tmp_path, text8_path, exact_every):
    rho = 0.9
    tr = Trainer(tiny(text8_path, stable_rho=rho, stable_exact_every=exact_every), tmp_path / "s", progress_bar=False)
    seen = record_norms(tr, lambda m: spectral_norms(m.W).max())
    tr.run()
    assert len(seen) == 40
    projected = seen[exact_every - 1 :: exact_every]  # the steps followed by a projection (all by default)
    assert max(projected) <= rho * (1 + 1e-5)
    assert max(projected) > rho * 0.99  # the constraint is active, not vacuous
    # the saved best weights meet it (projected before every evaluation)
    best = load_file(str(tmp_path / "s" / "best.safetensors"))
    assert np.linalg.svd(best["W"].astype(np.float64), compute_uv=False)[:, 0].max() <= rho * (1 + 1e-5)


@pytest.mark.parametrize("eigh_dtype", [None, torch.float32, torch.float64])
def test_projection_clips_only_the_large_singular_values(eigh_dtype):
    """The nearest matrix in the ball: singular values above rho become rho, the others stay (no collapse);
    the same with the eigendecomposition in float64 (as on a GPU, train/stable.py eigh_dtype_for)."""
    m = StableISAN(3, 3, 12, rho=0.9, seed=0)
    with torch.no_grad():
        m.W.copy_(torch.randn(3, 12, 12, generator=torch.Generator().manual_seed(1)) * 0.5)
    before = np.linalg.svd(m.W.detach().double().numpy(), compute_uv=False)
    m.project_exact_(eigh_dtype)
    assert m.W.dtype == torch.float32
    from isan.train.stable import eigh_dtype_for

    assert eigh_dtype_for(torch.device("cuda")) == torch.float64
    assert eigh_dtype_for(torch.device("cpu")) == torch.float32
    assert eigh_dtype_for(torch.device("cpu"), torch.float64) == torch.float64  # weights' own dtype kept
    after = np.linalg.svd(m.W.detach().double().numpy(), compute_uv=False)
    np.testing.assert_allclose(after, np.minimum(before, 0.9), atol=1e-5)


def test_without_the_option_the_norms_exceed(tmp_path, text8_path):
    """The same run unconstrained: the bound the stable run keeps is broken (so the test above can fail)."""
    tr = Trainer(tiny(text8_path), tmp_path / "u", progress_bar=False)
    seen = record_norms(tr, lambda m: spectral_norms(m.W).max())
    tr.run()
    assert max(seen) > 0.9 * 1.05


def test_basis_constraint_and_materialised_weights(tmp_path, text8_path):
    rho = 0.9
    tr = Trainer(tiny(text8_path, stable_rho=rho, stable_basis=True, stable_exact_every=1), tmp_path / "b",
                 progress_bar=False)

    def in_basis(m):
        P = m.P.detach().double()
        M = P @ m.W.detach().double() @ torch.linalg.inv(P)
        return np.linalg.svd(M.numpy(), compute_uv=False)[:, 0].max()

    seen = record_norms(tr, in_basis)
    tr.run()
    assert max(seen) <= rho * (1 + 1e-5)
    assert not np.allclose(tr.model.P.detach().numpy(), np.eye(16))  # P is learned
    # W is materialised from U and P (the plain scan runs on it) and saved for the export
    best = load_file(str(tmp_path / "b" / "best.safetensors"))
    assert {"W", "U", "P", "b", "W_ro", "b_ro", "h0"} <= set(best)
    P = best["P"].astype(np.float64)
    np.testing.assert_allclose(np.linalg.inv(P) @ best["U"] @ P, best["W"], atol=1e-5)


def certified_run(tmp_path, text8_path, **kw):
    out = tmp_path / "run"
    Trainer(tiny(text8_path, stable_rho=0.95, **kw), out, progress_bar=False).run()
    return export_checkpoint(out, tmp_path / "bundle")


def verify_from_files(bundle) -> dict:
    """Re-verify the certificate with nothing but the bundle's files (numpy, float64)."""
    m = json.loads((bundle / "manifest.json").read_text())
    c = m["certificate"]
    w = load_file(str(bundle / "weights.safetensors"))
    P = load_file(str(bundle / c["file"]))["P"]
    assert P.dtype == np.float64 and P.shape == (m["d"], m["d"])
    assert w["W"].dtype == np.float32
    W = w["W"].astype(np.float64)
    Pinv = np.linalg.inv(P)
    rho = np.linalg.svd(P @ W @ Pinv, compute_uv=False)[:, 0].max()
    bound = np.linalg.svd(Pinv, compute_uv=False)[0] * max(
        np.linalg.norm(P @ w["h0"].astype(np.float64)),
        np.linalg.norm(w["b"].astype(np.float64) @ P.T, axis=1).max() / (1 - rho))
    assert rho < 1
    assert rho == pytest.approx(c["rho"], rel=1e-12) and bound == pytest.approx(c["state_bound"], rel=1e-9)
    assert {"rho", "state_bound", "file", "method"} <= set(c) and c["file"] == CERT_FILE
    assert CERT_FILE in m["files"]  # hashed with the rest of the bundle
    return {"rho": rho, "bound": bound, "w": w}


@pytest.mark.parametrize("basis", [False, True])
def test_certificate_verifies_from_the_bundle_and_nothing_diverges(tmp_path, text8_path, basis):
    bundle = certified_run(tmp_path, text8_path, stable_basis=basis)
    v = verify_from_files(bundle)
    eng = Engine.load(bundle)
    rng = np.random.default_rng(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    texts = ["z" * 2000, "q" * 2000, "".join(rng.choice(list(letters), 2000)), "xj" * 1000]
    for text in texts:
        r = eng.score(text)
        assert np.isfinite(r.bits) and r.chars == len(text)
        # and the state stays inside the proven bound (float64 recurrence from the bundle's weights)
        w, alpha = v["w"], {c: i for i, c in enumerate(eng.manifest["alphabet"])}
        h = w["h0"].astype(np.float64)
        peak = np.abs(h).max()
        for ch in text:
            h = w["W"][alpha[ch]].astype(np.float64) @ h + w["b"][alpha[ch]]
            peak = max(peak, np.abs(h).max())
        assert peak <= v["bound"]


def test_no_certificate_for_a_divergent_model(tmp_path):
    d = 4
    tensors = {"W": np.stack([1.5 * np.eye(d, dtype=np.float32)] * 3), "b": np.zeros((3, d), np.float32),
               "h0": np.zeros(d, np.float32)}
    with pytest.raises(CheckpointError, match="not contractive"):
        write_certificate(tmp_path / CERT_FILE, tensors)
    assert not (tmp_path / CERT_FILE).exists()
    ok = {**tensors, "W": 0.5 * tensors["W"]}
    c = write_certificate(tmp_path / CERT_FILE, ok)
    assert c["rho"] == pytest.approx(0.75) and c["state_bound"] == 0.0


def test_unconstrained_runs_export_no_certificate(tmp_path, text8_path):
    Trainer(tiny(text8_path, max_steps=10), tmp_path / "u", progress_bar=False).run()
    bundle = export_checkpoint(tmp_path / "u", tmp_path / "ub")
    assert "certificate" not in json.loads((bundle / "manifest.json").read_text())
    assert not (bundle / CERT_FILE).exists()


def test_resume_with_ema_dropout_and_weight_decay(tmp_path, text8_path):
    kw = dict(stable_rho=0.95, stable_basis=True, ema=0.9, state_dropout=0.2, weight_decay=0.1,
              lr_schedule="cosine")
    out = tmp_path / "r"
    first = Trainer(tiny(text8_path, max_steps=40, **kw), out, progress_bar=False)
    calls, inner = [], first.constrain

    def crash():  # the process dies after step 25; the last checkpoint is step 20 (ckpt_every=10)
        inner()
        calls.append(1)
        if len(calls) == 25:
            raise RuntimeError("killed")

    first.constrain = crash
    with pytest.raises(RuntimeError, match="killed"):
        first.run()
    saved = load_file(str(out / "latest" / "optimizer.safetensors"))
    assert {"ema.U", "ema.P", "ema.W_ro"} <= set(saved)
    tr = Trainer(tiny(text8_path, max_steps=40, **kw), out, progress_bar=False)
    assert tr.resumed and tr.progress.step == 20
    np.testing.assert_array_equal(tr.ema["U"].numpy(), saved["ema.U"])
    assert tr.model.state_dropout == 0.2 and tr.model.basis
    p = tr.run()
    assert p.step == 40
    assert not np.allclose(tr.ema["U"].numpy(), saved["ema.U"])  # the average moved on
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    valid = [e for e in log if e["event"] == "valid"]
    assert all("valid_bpc_ema" in e and "valid_bpc_live" in e for e in valid)
    for e in valid:  # the metric is the better of the two, and best is the minimum
        assert e["valid_bpc"] == pytest.approx(min(e["valid_bpc_ema"], e["valid_bpc_live"]), abs=1e-5)
    assert p.best_valid_bpc == pytest.approx(min(e["valid_bpc"] for e in valid), abs=1e-5)
    # the cosine schedule ran from lr towards lr * lr_min over the 40 steps, across the resume
    lrs = [e["lr"] for e in log if e["event"] == "step"]
    assert [e["step"] for e in log if e["event"] == "step"] == [10, 20, 30, 40]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < 0.1 * 1e-2
    verify_from_files(export_checkpoint(out, tmp_path / "rb"))


def test_state_dropout_only_in_training():
    m = StableISAN(27, 27, 8, rho=0.9, state_dropout=0.5, seed=0)
    with torch.no_grad():
        m.b.normal_()
    x = torch.randint(0, 27, (5, 3))
    h = m.initial_state(3)
    m.eval()
    a, ha = m(x, h)
    b, hb = m(x, h)
    torch.testing.assert_close(a, b)
    m.train()
    c, hc = m(x, h)
    torch.testing.assert_close(hc, ha)  # the recurrence is exact: dropout acts on the readout's input only
    assert not torch.allclose(c, a)


def test_cli_stable_options(tmp_path, text8_path):
    from click.testing import CliRunner

    from isan.cli import main

    out = tmp_path / "c"
    r = CliRunner().invoke(main, ["train", "--out", str(out), "--data", str(text8_path), "--d", "8",
                                  "--batch-size", "16", "--bptt", "16", "--max-steps", "5", "--eval-every", "0.001",
                                  "--stable-rho", "0.97", "--ema", "0.99", "--state-dropout", "0.1",
                                  "--lr-schedule", "cosine", "--no-progress"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["train"]["stable_rho"] == 0.97 and cfg["model"]["stable"]["rho"] == 0.97
    r = CliRunner().invoke(main, ["train", "gru", "--out", str(tmp_path / "g"), "--data", str(text8_path),
                                  "--d", "8", "--max-steps", "2", "--stable-rho", "0.9", "--no-progress"])
    assert r.exit_code != 0 and "isan model only" in r.output
