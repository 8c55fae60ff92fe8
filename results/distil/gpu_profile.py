"""Where a training step of the default's recipe goes on a GPU (issue 37): the stable ISAN at d = 216,
B = 256, bptt 64, state dropout 0.2, timed part by part (forward + backward, the exact projection onto
||W_x||_2 <= rho, AdamW's step, the EMA), median of 20 after 5 of warm-up, CUDA synchronised.

    python results/distil/gpu_profile.py [--device cuda] [--d 216]

Prints one table; no file is written.
"""

from __future__ import annotations

import argparse

import torch

from isan.bench.engine import median_time
from isan.train.stable import StableISAN


def timed(fn, device, repeats=20, warmup=5):
    """Median seconds of ``fn`` (:func:`isan.bench.engine.median_time`), each call waited for on a GPU."""
    def synced():
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        synced()
    return median_time(synced, repeats)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--d", type=int, default=216)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--bptt", type=int, default=64)
    a = ap.parse_args()
    dev, B, T = a.device, a.batch, a.bptt
    m = StableISAN(27, 27, a.d, rho=0.98, seed=0, state_dropout=0.2).to(dev).train()
    opt = torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.1)
    ema = [p.detach().clone() for p in m.parameters()]
    x = torch.randint(0, 27, (T + 1, B), device=dev)
    h = m.initial_state(B)

    def fwd_bwd():
        logits, _ = m(x[:-1], h)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 27), x[1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()

    def step():
        opt.step()

    def project():
        m.project_exact_()

    def ema_update():
        with torch.no_grad():
            for e, p in zip(ema, m.parameters()):
                e.lerp_(p, 0.002)

    def project_cpu():  # the same eigendecomposition on the host, for comparison
        U = m.contracted().detach().cpu()
        torch.linalg.eigh(U.transpose(1, 2) @ U)

    rows = [("forward + backward", timed(fwd_bwd, dev)), ("AdamW step", timed(step, dev)),
            ("exact projection (eigh of K matrices)", timed(project, dev)), ("EMA", timed(ema_update, dev)),
            ("the projection's eigh on the host CPU", timed(project_cpu, "cpu", repeats=5, warmup=1))]
    # the same projection on trained weights (the shipped default's W): an iterative eigensolver's time
    # depends on the spectrum, and a trained W_x has many singular values clipped at rho
    from safetensors.torch import load_file

    W = load_file("isan/models/text8-d216-distil/weights.safetensors")["W"].float().to(dev)
    G = W.transpose(1, 2) @ W
    Gd = G.double()
    trained = [("eigh, trained W, float32", timed(lambda: torch.linalg.eigh(G), dev, repeats=5, warmup=1)),
               ("eigh, trained W, float64", timed(lambda: torch.linalg.eigh(Gd), dev, repeats=5, warmup=1)),
               ("eigh, trained W, float32, on the host", timed(lambda: torch.linalg.eigh(G.cpu()), "cpu", repeats=5,
                                                                warmup=1))]
    if dev.startswith("cuda"):
        for driver in ("gesvdj", "gesvda", "gesvd"):
            try:
                trained.append((f"svd ({driver}), trained W, float32",
                                timed(lambda: torch.linalg.svd(W, driver=driver), dev, repeats=5, warmup=1)))
            except Exception as e:  # noqa: BLE001 - a driver this build lacks
                print(f"svd {driver}: {e}")
    rows += trained
    total = sum(t for name, t in rows[:4])
    name = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu"
    print(f"# one training step, d = {a.d}, B = {B}, bptt {T}, on {dev} ({name}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads; median of 20")
    print("| part | ms | share of the step |")
    print("|---|---:|---:|")
    for i, (n, t) in enumerate(rows):
        share = f"{t / total:.0%}" if i < 4 else "-"
        print(f"| {n} | {t * 1e3:.2f} | {share} |")
    print(f"| a step (the first four) | {total * 1e3:.2f} | {B * T / total:,.0f} chars/s |")


if __name__ == "__main__":
    main()
