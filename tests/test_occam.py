"""The Occam-gated LSTM (isan.train.occam) against a plain implementation and its numpy twin
(isan.engine.baselines.occam); the penalty, its annealing and the registry. The torch model is compared with
the float64 twins in float64 (on the float32 values the numpy twin reads), where rounding is far below 1e-12."""

import math

import numpy as np
import pytest
import torch

from isan.engine.baselines.occam import OccamParams, occam_score_ref, occam_states_ref
from isan.train.models import MODELS, build_model
from isan.train.occam import OCCAM, OccamLSTM, anneal, occam_from_config
from tolerances import gamma

torch.set_num_threads(1)


def _model(gate="first", seed=0, d=6, K=5, lam=0.1, schedule="linear"):
    m = OccamLSTM(K, K, d, seed=seed, gate=gate, lam=lam, schedule=schedule)
    with torch.no_grad():  # move every parameter off its initial value so each term matters
        g = torch.Generator().manual_seed(seed + 1)
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m


def plain_forward(m, x, h, c):
    """Textbook equations, one stream at a time, scalar gate, explicit one-hot input (float64)."""
    P = {k: v.detach().double() for k, v in m.state_dict().items()}
    d, K = m.d, m.K
    T, B = x.shape
    logits = torch.zeros(T, B, m.V, dtype=torch.float64)
    gates = torch.zeros(T, B, dtype=torch.float64)
    sig = torch.sigmoid
    for b in range(B):
        hb, cb = h[b].double(), c[b].double()
        for t in range(T):
            logits[t, b] = P["W_ro"] @ hb + P["b_ro"]
            onehot = torch.zeros(K, dtype=torch.float64)
            onehot[x[t, b]] = 1.0
            z = P["p"] @ onehot + P["q"] @ hb
            if m.gate == "second":
                z = z + onehot @ P["Q"] @ hb  # x^T Q h
            g = sig(z)
            gates[t, b] = g
            u = g * onehot  # the gate multiplies the input
            a = P["E"].T @ u + P["b_in"] + P["W_hh"] @ hb
            i, f, gg, o = sig(a[:d]), sig(a[d:2 * d]), torch.tanh(a[2 * d:3 * d]), sig(a[3 * d:])
            cb = f * cb + i * gg
            hb = o * torch.tanh(cb)
    return logits, gates


@pytest.mark.parametrize("gate", ["first", "second"])
def test_forward_equals_a_plain_implementation(gate):
    m = _model(gate).double()
    x = torch.randint(0, 5, (9, 3), generator=torch.Generator().manual_seed(2))
    h0, c0 = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    logits, (h, c), G = m(x, (h0, c0), return_gates=True)
    ref_logits, ref_gates = plain_forward(m, x, h0, c0)
    assert torch.allclose(logits, ref_logits, atol=1e-12)
    assert torch.allclose(G, ref_gates, atol=1e-12)


@pytest.mark.parametrize("gate", ["first", "second"])
def test_numpy_reference_equals_torch(gate):
    m = _model(gate, seed=3)
    cfg = m.config()
    p = OccamParams.from_tensors(cfg, m.numpy_params())
    x = np.random.default_rng(0).integers(0, 5, 40)
    bits_np, s_np = occam_score_ref(p, x, p.initial_state())
    _, gates_np = occam_states_ref(p, x, p.initial_state())
    m = m.double()  # the same (float32) values in float64: both sides float64
    with torch.no_grad():
        xt = torch.as_tensor(x).view(-1, 1)
        logits, (h, c), G = m(xt, m.initial_state(1), return_gates=True)
        bits_t = torch.nn.functional.cross_entropy(logits[:, 0], xt[:, 0], reduction="none").numpy() / math.log(2)
    np.testing.assert_allclose(bits_np, bits_t, rtol=0, atol=1e-12)
    np.testing.assert_allclose(gates_np, G[:, 0].numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(s_np, np.concatenate([h[0].numpy(), c[0].numpy()]), rtol=0, atol=1e-12)


def test_a_shut_gate_ignores_the_input():
    m = _model()
    with torch.no_grad():
        m.p.fill_(-60.0)
        m.q.zero_()
    a = torch.tensor([[0], [1], [2], [3]])
    b = torch.tensor([[4], [4], [0], [1]])
    la, _ = m(a, m.initial_state(1))
    lb, _ = m(b, m.initial_state(1))
    assert torch.allclose(la, lb, atol=1e-6)
    with torch.no_grad():
        m.p.fill_(3.0)
    la, _ = m(a, m.initial_state(1))
    lb, _ = m(b, m.initial_state(1))
    assert not torch.allclose(la, lb, atol=1e-3)


def test_annealing_schedules():
    assert [anneal("flat", p) for p in (0, 0.5, 1)] == [1, 1, 1]
    assert [anneal("linear", p) for p in (0, 0.5, 1, 2)] == [0, 0.5, 1, 1]
    assert [anneal("quadratic", p) for p in (0, 0.5, 1)] == [0, 0.25, 1]
    with pytest.raises(ValueError):
        anneal("cubic", 0.5)


def test_annealing_reaches_lambda_max_at_t_max_and_holds_it():
    # Occam's Gates sec. 4.4: min{(e / T_max)^k lambda_max, lambda_max}
    assert [anneal("linear", p, t_max=0.5) for p in (0, 0.25, 0.5, 0.75, 1)] == [0, 0.5, 1, 1, 1]
    assert [anneal("quadratic", p, t_max=0.5) for p in (0, 0.25, 0.5, 1)] == [0, 0.25, 1, 1]
    assert anneal("flat", 0.0, t_max=0.5) == 1
    with pytest.raises(ValueError):
        anneal("linear", 0.5, t_max=0)
    for s in ("flat", "linear", "quadratic"):
        m = OCCAM[f"occam_sched_{s}"](5, 5, 4)
        assert (m.lam, m.schedule, m.t_max) == (0.2, s, 0.5)
        assert m.lam_at(0.6) == m.lam_at(1.0) == 0.2
        assert occam_from_config(m.config()).t_max == 0.5
    assert occam_from_config({k: v for k, v in OCCAM["occam"](5, 5, 4).config().items() if k != "t_max"}).t_max == 1.0


@pytest.mark.parametrize("schedule", ["flat", "linear", "quadratic"])
def test_aux_loss_is_lambda_times_the_mean_gate(schedule):
    m = _model(lam=0.2, schedule=schedule)
    x = torch.randint(0, 5, (7, 2))
    _, _, G = m(x, m.initial_state(2), return_gates=True)
    a = m.aux_loss(0.5)
    # float32 in both: a mean of positive gates and two products, each within Higham's gamma(n + 2) (relative)
    assert a.item() == pytest.approx(0.2 * anneal(schedule, 0.5) * G.mean().item(), rel=2 * gamma(G.numel() + 2))
    assert OCCAM["occam_nopenalty"](5, 5, 4).aux_loss(0.5) is None


def test_injected_penalty_gradient_equals_the_hook():
    x = torch.randint(0, 5, (6, 3), generator=torch.Generator().manual_seed(5))
    grads = []
    for mode in ("hook", "inject"):
        m = _model(lam=0.3, schedule="quadratic").double()  # in float64: rounding far below 1e-12
        m.penalty_mode = mode
        m.progress_fn = lambda: 0.7
        logits, _ = m(x, m.initial_state(3))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 5), x.reshape(-1))
        if mode == "hook":
            loss = loss + m.aux_loss(0.7)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)
    assert grads[0].abs().sum() > 0


def test_registry_budget_and_config_round_trip():
    for kind in ("occam", "occam_nopenalty", "occam2", "occam_strong"):
        assert MODELS[kind] is OCCAM[kind]
        m = build_model(kind, 27, 27, params=3.2e5, seed=0)
        n = sum(p.numel() for p in m.parameters())
        assert n == m.param_count(27, 27, m.d, m.gate) <= 3.2e5
        assert m.param_count(27, 27, m.d + 1, m.gate) > 3.2e5
        m2 = occam_from_config(m.config())
        assert m2.config() == m.config()
    assert MODELS["occam2"](5, 5, 4).gate == "second" and MODELS["occam_nopenalty"](5, 5, 4).lam == 0
    assert MODELS["occam_strong"](5, 5, 4).config()["lam"] == 0.2


def test_bundle_round_trip_through_the_engine(tmp_path):
    from isan.alphabet import Alphabet
    from isan.engine.baselines.recurrent import load_params_bundle
    from isan.engine.bundle import write_bundle
    from isan.engine.baselines.occam import OCCAM_KINDS, NumpyOccamRunner

    m = OccamLSTM(27, 27, 5, seed=4, gate="second")
    t = m.numpy_params()
    write_bundle(tmp_path / "b", t, Alphabet.text8(), kind="occam", extra={"model": m.config(), "d": 5},
                 normalizer="text8")
    _, p, alphabet = load_params_bundle(tmp_path / "b", OCCAM_KINDS, OccamParams)
    r = NumpyOccamRunner(p)
    ids = alphabet.encode("the cat sat on the mat")
    bits, _ = r.score_ids(ids, r.initial_state())
    with torch.no_grad():  # the bundle's float32 values in float64: both sides float64
        x = torch.as_tensor(ids).view(-1, 1)
        logits, _ = m.double()(x, m.initial_state(1))
        ref = torch.nn.functional.cross_entropy(logits[:, 0], x[:, 0], reduction="none").numpy() / math.log(2)
    np.testing.assert_allclose(bits, ref, rtol=0, atol=1e-12)
    from isan.engine import load_engine  # what `isan score --model` runs

    assert load_engine(tmp_path / "b").score("the cat sat on the mat").bits == pytest.approx(bits.sum(), rel=1e-9)
