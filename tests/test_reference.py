"""Reference path (numpy, float64) against the torch model that trained it, on real text."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from isan.engine.reference import score_ref, states_ref  # noqa: E402
from isan.params import ISANParams, isan_param_count, largest_isan_d  # noqa: E402
from isan.train.models import ISAN  # noqa: E402
from isan.train.scan import isan_scan, isan_scan_ref  # noqa: E402
from tolerances import U64, isan_float32_tolerance  # noqa: E402

LN2 = np.log(2.0)


def torch_bits_and_state(model, ids):
    """Per-character bits from the torch forward (float64), one stream, from h0."""
    x = torch.as_tensor(ids).reshape(-1, 1)
    with torch.no_grad():
        logits, h_last = model(x, model.initial_state(1))
        lp = torch.log_softmax(logits[:, 0], -1)
        bits = -lp[torch.arange(len(ids)), x[:, 0]] / LN2
    return bits.numpy(), h_last[0].numpy()


def params_of(model) -> ISANParams:
    return ISANParams(**model.numpy_params())


def test_paper_parameter_count():
    assert isan_param_count(27, 27, 216) == 1_271_619
    assert largest_isan_d(27, 27, 1.28e6) == 216
    assert sum(p.numel() for p in ISAN(27, 27, 216).parameters()) == 1_271_619


@pytest.mark.parametrize("use_default", [False, True])
def test_torch_forward_matches_numpy_reference(use_default, text8_valid_head, request):
    """Per-character bits and the final state on real text, both in float64: within twice the tolerance
    derived from the computation (tests/tolerances.py) carried to float64."""
    from isan.alphabet import Alphabet

    ids = Alphabet.text8().encode(text8_valid_head[:5000])
    if use_default:
        eng = request.getfixturevalue("default_engine")
        p = eng.params32
        model = ISAN(27, 27, p.d).double()
        with torch.no_grad():
            for n, a in p.as_dict().items():
                getattr(model, n).copy_(torch.as_tensor(np.asarray(a, dtype=np.float64)))
    else:
        torch.manual_seed(0)
        model = ISAN(27, 27, 32, seed=1).double()
        with torch.no_grad():
            model.b.normal_(0, 0.5)
            model.h0.normal_()
            for q in model.parameters():  # the weights numpy_params() gives (float32 values), in float64
                q.copy_(q.float().double())
    p64 = params_of(model).astype(np.float64)
    bits_ref, h_ref = score_ref(p64, ids, p64.h0)
    bits_t, h_t = torch_bits_and_state(model, ids)
    tol = isan_float32_tolerance(p64.W, p64.b, p64.W_ro, p64.b_ro, p64.h0, ids, samples=4).in_precision(U64).twice()
    np.testing.assert_allclose(bits_t, bits_ref, atol=tol.bits, rtol=0)
    assert np.abs(h_t - h_ref).max() <= tol.state


def test_torch_float32_forward_close_to_reference(text8_valid_head):
    """The float32 forward within the tolerance derived from the computation (tests/tolerances.py); b and h0
    drawn (at initialisation they are zero, and the state would stay zero)."""
    model = ISAN(27, 27, 24, seed=3)
    torch.manual_seed(3)
    with torch.no_grad():
        model.b.normal_(0, 0.5)
        model.h0.normal_()
    ids = __import__("isan.alphabet", fromlist=["Alphabet"]).Alphabet.text8().encode(text8_valid_head[:3000])
    p64 = params_of(model).astype(np.float64)
    bits_ref, _ = score_ref(p64, ids, p64.h0)
    bits_t, _ = torch_bits_and_state(model, ids)
    tol = isan_float32_tolerance(p64.W, p64.b, p64.W_ro, p64.b_ro, p64.h0, ids, samples=4)
    np.testing.assert_allclose(bits_t, bits_ref, atol=tol.bits, rtol=0)


@pytest.mark.parametrize("impl", ["sorted", "dense"])
def test_grouped_scan_matches_autograd_twin(impl):
    """The fast custom-autograd scans (one GEMM per symbol; the dense scan a GPU trains with, issue
    35) agree with the plain gathered version: states and gradients."""
    g = torch.Generator().manual_seed(0)
    K, d, B, T = 27, 12, 9, 17
    W = (torch.randn(K, d, d, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    b = torch.randn(K, d, generator=g, dtype=torch.float64).requires_grad_()
    h = torch.randn(B, d, generator=g, dtype=torch.float64).requires_grad_()
    x = torch.randint(0, K, (T, B), generator=g)
    H1, H2 = isan_scan(W, b, h, x, impl=impl), isan_scan_ref(W, b, h, x)
    torch.testing.assert_close(H1, H2)
    gout = torch.randn(T, B, d, generator=g, dtype=torch.float64)
    g1 = torch.autograd.grad((H1 * gout).sum(), (W, b, h))
    g2 = torch.autograd.grad((H2 * gout).sum(), (W, b, h))
    for a, c in zip(g1, g2):
        torch.testing.assert_close(a, c)
    assert torch.autograd.gradcheck(lambda W_, b_, h_: isan_scan(W_, b_, h_, x[:4], impl=impl), (W, b, h))


def test_states_ref_is_eq1(small_params):
    p = small_params.astype(np.float64)
    ids = np.array([3, 0, 7, 26])
    H = states_ref(p, ids, p.h0)
    h = p.h0
    for t, x in enumerate(ids):
        h = p.W[x] @ h + p.b[x]
        np.testing.assert_allclose(H[t], h)
