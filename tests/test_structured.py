"""The structured ISAN (issue #48 step 1, train/structured.py): its scans equal the dense ISAN's scan run
with ``dense_W()`` (states and gradients), the model's bits on real text equal the dense model's built
from the same maps, the equal-cost shapes, the CLI's refusals, and a tiny run that resumes and exports."""

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings, strategies as st  # noqa: E402

from isan.train.loop import TrainConfig, Trainer, evaluate_bpc  # noqa: E402
from isan.train.models import ISAN  # noqa: E402
from isan.train.scan import isan_scan  # noqa: E402
from isan.train.structured import (DPLRISAN, dense_cost, dplr_cost, dplr_param_count, dplr_scan,  # noqa: E402
                                   dplr_scan_ref, equal_cost_rank)
from tolerances import U32, U64, depth_scan, gamma, lam  # noqa: E402

#: the scan's states and the gradients of its five inputs
NAMES = ("H", "a", "U", "V", "b", "h_init")


def _inputs(K, d, r, B, T, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = DPLRISAN(K, 5, d, r, seed=seed)
    a, U, V = m.a.detach().double(), m.U.detach().double(), m.V.detach().double()
    U = U + 0.3 * torch.randn(U.shape, generator=g, dtype=torch.float64)  # a low-rank part not near 0
    b = torch.randn(K, d, generator=g, dtype=torch.float64)
    h = torch.randn(B, d, generator=g, dtype=torch.float64)
    x = torch.randint(0, K, (T, B), generator=g)
    w = torch.randn(T, B, d, generator=g, dtype=torch.float64)  # the loss is sum(w * H)
    return [t.to(dtype) for t in (a, U, V, b, h)], x, w.to(dtype)


def _run(fn, params, x, w):
    ps = [p.detach().clone().requires_grad_() for p in params]
    H = fn(ps, x)
    (H * w).sum().backward()
    return [H.detach()] + [p.grad for p in ps]


def _dense(ps, x):
    a, U, V, b, h = ps
    return isan_scan(torch.diag_embed(a) + U @ V.transpose(1, 2), b, h, x, impl="sorted")


def _float64_bounds(params64, x, w64, d, r):
    """Worst-case bounds on |computed - exact| of H and the five gradients in float64: gamma(depth) times
    the scan evaluated on absolute values (Higham 2002, section 3.1; tests/tolerances.py). A step of the
    DPLR scan rounds d + r + 2 times (V^T h, U z, the diagonal and b); the backward scan as many again."""
    T, B = x.shape
    mags = _run(_dense, [p.abs() for p in params64], x, w64.abs())
    n_fwd, n_grad = depth_scan(T, d + r + 2), depth_scan(T, d + r + 2, batch=B, gradient=True)
    return [gamma(n_fwd if i == 0 else n_grad, U64) * m for i, m in enumerate(mags)]


def _perturbed_scan(ps, x, g, gen):
    """The dense scan in float64 with every product and bias perturbed by a relative g, random signs."""
    a, U, V, b, h = ps
    W = torch.diag_embed(a) + U @ V.transpose(1, 2)
    out = []
    for t in range(x.shape[0]):
        sign_W, sign_b = (2.0 * torch.randint(0, 2, s, generator=gen, dtype=torch.float64) - 1.0
                          for s in ((x.shape[1],) + W.shape[1:], h.shape))
        h = torch.einsum("bij,bj->bi", W[x[t]] * (1 + g * sign_W), h) + b[x[t]] * (1 + g * sign_b)
        out.append(h)
    return torch.stack(out, 0)


def _float32_tolerances(params64, x, w64, d, r, samples=8):
    """Tolerances of the float32 H and five gradients against the exact (float64) scan on the same inputs,
    by the probabilistic model of tests/tolerances.py: a step's products and bias perturbed relatively by
    sqrt(d + r + 2) u32 with random signs (the size of the step's rounding, Higham and Mary 2019), the
    deviations' largest root mean square over ``samples`` runs, times lam for the tensor's elements and 2
    (the backward pass rounds as much as the forward one)."""
    exact = _run(_dense, params64, x, w64)
    g, gen = math.sqrt(d + r + 2) * U32, torch.Generator().manual_seed(0)
    devs = [[a - e for a, e in zip(_run(lambda p, x: _perturbed_scan(p, x, g, gen), params64, x, w64), exact)]
            for _ in range(samples)]
    rms = [torch.stack([dv[i] ** 2 for dv in devs]).mean(0).sqrt().max() for i in range(len(exact))]
    return exact, [2.0 * lam(e.numel()) * float(m) for e, m in zip(exact, rms)]


def _check(K, d, r, B, T, impl, seed=0):
    ref64, x, w64 = _inputs(K, d, r, B, T, torch.float64, seed)
    want = _run(_dense, ref64, x, w64)  # the dense ISAN's scan (train/scan.py) on dense_W, float64
    got = _run(lambda ps, x: dplr_scan(*ps, x, impl=impl), ref64, x, w64)
    for name, g_, w_, bound in zip(NAMES, got, want, _float64_bounds(ref64, x, w64, d, r)):
        assert bool(((g_ - w_).abs() <= 2 * bound).all()), (impl, "float64", name)  # both round
    ps32 = [p.float() for p in ref64]
    exact, tols = _float32_tolerances([p.double() for p in ps32], x, w64.float().double(), d, r)
    got = _run(lambda ps, x: dplr_scan(*ps, x, impl=impl), ps32, x, w64.float())
    for name, g_, w_, tol in zip(NAMES, got, exact, tols):
        assert float((g_.double() - w_).abs().max()) <= tol, (impl, "float32", name, tol)


@pytest.mark.parametrize("impl", ["sorted", "masked", "ref"])
def test_scan_equals_dense_isan_scan(impl):
    _check(K=6, d=10, r=3, B=11, T=9, impl=impl)


@settings(max_examples=12, deadline=None)
@given(K=st.integers(1, 5), d=st.integers(1, 9), r=st.integers(1, 4), B=st.integers(1, 7), T=st.integers(1, 6),
       seed=st.integers(0, 1000))
def test_scan_shapes(K, d, r, B, T, seed):
    r = min(r, d)
    for impl in ("sorted", "masked"):
        _check(K, d, r, B, T, impl, seed)


def test_ref_twin_matches_fast_path_float32():
    """The float32 twin and fast paths on the same float32 inputs: each within its derived tolerance of the
    exact result (tests/tolerances.py), so within twice it of each other, whatever the machine's order."""
    ps, x, w = _inputs(7, 16, 4, 8, 12, torch.float32, seed=3)
    _, tols = _float32_tolerances([p.double() for p in ps], x, w.double(), 16, 4)
    ref = _run(lambda p, x: dplr_scan_ref(*p, x), ps, x, w)
    for impl in ("sorted", "masked"):
        got = _run(lambda p, x: dplr_scan(*p, x, impl=impl), ps, x, w)
        for name, g_, r_, tol in zip(NAMES, got, ref, tols):
            assert float((g_.double() - r_.double()).abs().max()) <= 2 * tol, (impl, name, tol)


def test_model_bits_equal_dense_model_on_text(text8_path):
    """The DPLR model's bits on a real text slice are the dense ISAN's with W = dense_W() (same b, readout,
    h0), and its numpy_params are those dense tensors."""
    from isan.alphabet import Alphabet

    text = text8_path.read_text()[:3000]
    ids = np.asarray(Alphabet.text8().encode(text), dtype=np.int64)
    m = DPLRISAN(27, 27, 24, 4, seed=1)
    with torch.no_grad():
        m.U.add_(0.2 * torch.randn_like(m.U))
        m.b.normal_(0, 0.3)
        m.h0.normal_(0, 0.3)
    dense = ISAN(27, 27, 24, seed=0)
    with torch.no_grad():
        for n, v in m.numpy_params().items():
            getattr(dense, n).copy_(torch.from_numpy(v))
    got = evaluate_bpc(m, ids, streams=3, bptt=50)
    want = evaluate_bpc(dense, ids, streams=3, bptt=50)
    assert got == pytest.approx(want, abs=2e-5)
    assert 1.0 < got < 8.0


def test_equal_cost_shapes():
    assert dense_cost(216) == 216 ** 2 + 27 * 216 == 52_488
    assert dplr_cost(384, 54) == 52_224 and dplr_cost(512, 37) == 52_224
    assert equal_cost_rank(384, dense_cost(216)) == 54
    assert equal_cost_rank(512, dense_cost(216)) == 37
    assert dplr_cost(384, 55) > dense_cost(216)
    with pytest.raises(ValueError):
        equal_cost_rank(2000, dense_cost(216))
    m = DPLRISAN(27, 27, 20, 3)
    assert sum(p.numel() for p in m.parameters()) == dplr_param_count(27, 27, 20, 3)


def test_init_is_stable():
    """||diag(a) + U V^T||_2 <= 0.95 (the dense init's scale) for every symbol at the start."""
    m = DPLRISAN(27, 27, 64, 8, seed=0)
    norms = torch.linalg.matrix_norm(m.dense_W().detach().double(), ord=2)
    assert float(norms.max()) <= 0.95 + 1e-6


@pytest.mark.parametrize("args, words", [
    (["--structure", "dplr", "--d", "32"], "--rank"),
    (["--structure", "dplr", "--rank", "4"], "--d"),
    (["--structure", "dplr", "--d", "32", "--rank", "4", "--stable-rho", "0.98"], "--stable-rho"),
    (["--structure", "dplr", "--d", "32", "--rank", "4", "--alphabet", "bytes"], "--alphabet bytes"),
    (["--structure", "dplr", "--d", "32", "--rank", "4", "--teacher", "x"], "--teacher"),
    (["gru", "--structure", "dplr", "--d", "32", "--rank", "4"], "isan model only"),
    (["--rank", "4"], "--structure dplr"),
])
def test_cli_refuses_unsupported_options(tmp_path, args, words):
    from click.testing import CliRunner

    from isan.cli import main

    res = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "r"), *args])
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output
    assert not (tmp_path / "r").exists()


def test_tiny_run_resumes_and_exports(tmp_path, text8_path):
    """A dplr run with the probe's regularisers records its structure, resumes, and exports a dense bundle
    whose engine scores equal the model's bits."""
    from isan.engine import Engine
    from isan.export import export_checkpoint

    cfg = dict(d=16, params=None, data=str(text8_path), batch_size=16, bptt=16, lr=3e-3, eval_every=0.002,
               max_valid_chars=4000, valid_streams=4, ckpt_every=10, log_every=10, structure="dplr", rank=3,
               weight_decay=0.1, state_dropout=0.2, ema=0.998, lr_schedule="cosine")
    out = tmp_path / "r"
    Trainer(TrainConfig(max_steps=20, **cfg), out, progress_bar=False).run()
    saved = json.loads((out / "config.json").read_text())
    assert saved["model"]["structure"] == "dplr" and saved["model"]["rank"] == 3
    assert saved["train"]["structure"] == "dplr" and saved["train"]["rank"] == 3
    tr = Trainer(TrainConfig(max_steps=999, **cfg), out, progress_bar=False, overrides={"max_steps": 30})
    assert tr.resumed and tr.progress.step == 20 and isinstance(tr.model, DPLRISAN)
    U0 = tr.model.U.detach().clone()
    p = tr.run()
    assert p.step == 30 and not torch.equal(U0, tr.model.U.detach())
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [e["event"] for e in log].count("resume") == 1 and "valid_bpc_ema" in str(log)
    for which in ("best", "latest"):
        bundle = export_checkpoint(out, tmp_path / f"b-{which}", which=which)
        eng = Engine.load(bundle)
        assert eng.manifest["d"] == 16
    # the latest bundle scores text as the trained model does
    text = text8_path.read_text()[:2000]
    from isan.alphabet import Alphabet

    ids = np.asarray(Alphabet.text8().encode(text), dtype=np.int64)
    want = evaluate_bpc(tr.model, ids, streams=1, bptt=100)
    got = Engine.load(tmp_path / "b-latest").score(text).bpc
    assert got == pytest.approx(want, abs=1e-4)
