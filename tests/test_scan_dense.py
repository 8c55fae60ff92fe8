"""The dense scan (issue 35): the recurrence a GPU trains with at small B (one GEMM a step against
every symbol's matrix) equals the CPU's per-symbol scan and the plain autograd twin, in states and
gradients, and a few optimizer steps of the same seed give the same losses and weights. Run here
on the CPU device; the GPU check (isan/bench/gpu_check.sh) times it on a card."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from isan.train.models import ISAN  # noqa: E402
from isan.train.scan import isan_scan  # noqa: E402


@pytest.mark.parametrize("impl", ["sorted", "dense"])
def test_states_and_gradients_equal_the_autograd_twin(impl):
    g = torch.Generator().manual_seed(3)
    K, d, B, T = 27, 24, 13, 20
    W = (torch.randn(K, d, d, generator=g, dtype=torch.float64) * 0.25).requires_grad_()
    b = torch.randn(K, d, generator=g, dtype=torch.float64).requires_grad_()
    h = torch.randn(B, d, generator=g, dtype=torch.float64).requires_grad_()
    x = torch.randint(0, K, (T, B), generator=g)
    weight = torch.randn(T, B, d, generator=g, dtype=torch.float64)
    out = {}
    for name in (impl, "ref"):
        H = isan_scan(W, b, h, x, impl=name)
        grads = torch.autograd.grad((H * weight).sum(), (W, b, h))
        out[name] = (H.detach(), *grads)
    for a, r in zip(out[impl], out["ref"]):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
    Ws, bs, hs = (W[:5, :6, :6].detach().clone().requires_grad_(), b[:5, :6].detach().clone().requires_grad_(),
                  h[:4, :6].detach().clone().requires_grad_())  # gradcheck perturbs every entry: small sizes
    xs = torch.randint(0, 5, (4, 4), generator=g)
    assert torch.autograd.gradcheck(lambda W_, b_, h_: isan_scan(W_, b_, h_, xs, impl=impl), (Ws, bs, hs))


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="impl must be one of"):
        isan_scan(torch.zeros(2, 3, 3), torch.zeros(2, 3), torch.zeros(1, 3), torch.zeros(1, 1, dtype=torch.long), "x")


def test_training_steps_of_the_same_seed_agree(text8_valid_head):
    """Five Adam steps of a d = 64 ISAN on real text, B = 32 streams of 48 characters, the state
    carried: the dense scan's losses and weights equal the per-symbol scan's within float32 rounding."""
    from isan.alphabet import Alphabet

    ids = Alphabet.text8().encode(text8_valid_head).astype(np.int64)
    B, T = 32, 48
    streams = torch.as_tensor(ids[: (len(ids) // B) * B].reshape(B, -1).T.copy())
    runs = {}
    for impl in ("sorted", "dense"):
        torch.manual_seed(0)
        model = ISAN(27, 27, 64, seed=0)
        model.scan_impl = impl
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        h = model.initial_state(B)
        losses = []
        for step in range(5):
            x = streams[step * T : (step + 1) * T]
            logits, h = model(x, h)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 27), x.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            h = h.detach()
            losses.append(loss.item())
        runs[impl] = (losses, {n: p.detach().clone() for n, p in model.named_parameters()})
    np.testing.assert_allclose(runs["dense"][0], runs["sorted"][0], rtol=1e-5)
    for n, p in runs["sorted"][1].items():
        torch.testing.assert_close(runs["dense"][1][n], p, rtol=1e-4, atol=1e-5)
