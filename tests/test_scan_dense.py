"""The dense scan (issue 35): the recurrence a GPU trains with at small B (one GEMM a step against
every symbol's matrix). Its states and gradients equal the autograd twin's in
tests/test_reference.py (beside the per-symbol scan's); here a few optimizer steps of the same seed
give the per-symbol scan's losses and weights. Run on the CPU device; the GPU check
(isan/bench/gpu_check.sh) times it on a card."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from isan.train.models import ISAN  # noqa: E402
from isan.train.scan import isan_scan  # noqa: E402


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="impl must be one of"):
        isan_scan(torch.zeros(2, 3, 3), torch.zeros(2, 3), torch.zeros(1, 3), torch.zeros(1, 1, dtype=torch.long), "x")


CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not CUDA, reason="no CUDA GPU")])])
def test_training_steps_of_the_same_seed_agree(text8_valid_head, device):
    """Five Adam steps of a d = 64 ISAN on real text, B = 32 streams of 48 characters, the state
    carried: the dense scan's losses and weights (on ``device``: the GPU's trainer) equal the CPU's
    per-symbol scan's, both in float64 (float32 rounding, amplified by Adam's normalised steps, has no
    bound to derive), within 1e-10 (the weights are about 1: a float32 step would miss it by far)."""
    from isan.alphabet import Alphabet

    ids = Alphabet.text8().encode(text8_valid_head).astype(np.int64)
    B, T = 32, 48
    streams = torch.as_tensor(ids[: (len(ids) // B) * B].reshape(B, -1).T.copy())
    runs = {}
    for impl, dev in (("sorted", "cpu"), ("dense", device)):
        torch.manual_seed(0)
        model = ISAN(27, 27, 64, seed=0).to(dev, torch.float64)
        model.scan_impl = impl
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        h = model.initial_state(B)
        losses = []
        for step in range(5):
            x = streams[step * T : (step + 1) * T].to(dev)
            logits, h = model(x, h)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 27), x.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            h = h.detach()
            losses.append(loss.item())
        runs[impl] = (losses, {n: p.detach().cpu().clone() for n, p in model.named_parameters()})
    np.testing.assert_allclose(runs["dense"][0], runs["sorted"][0], rtol=0, atol=1e-10)
    for n, p in runs["sorted"][1].items():
        torch.testing.assert_close(runs["dense"][1][n], p, rtol=0, atol=1e-10)
