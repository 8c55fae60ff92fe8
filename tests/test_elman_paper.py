"""The paper's ESN, ESN+ and NPM-T as written (issue #26; Čerňanský, Makula and Beňušková 2008):
eq. 6 against a hand computation, the RLS readout against the closed-form solve, the sparse
reservoir's density, the teacher-forced run against the training rows, and the EKF's update."""

import math

import numpy as np
import pytest

from isan.train import reservoir as R
from isan.train import reservoir_variants as RV


def test_eq6_against_a_hand_computation():
    # stream a b a c: N = 4; N(a) = 2, N(b) = N(c) = 1; pairs (a,b), (b,a), (a,c)
    Rm = RV.cooccurrence_ratios(np.array([0, 1, 0, 2]), 3)
    hand = np.array([[0.0, 4 * (1 + 1) / (2 * 1), 4 * (1 + 0) / (2 * 1)],
                     [4 * (1 + 1) / (1 * 2), 0.0, 0.0],
                     [4 * (0 + 1) / (1 * 2), 0.0, 0.0]])
    assert np.array_equal(Rm, hand)
    assert np.array_equal(Rm, Rm.T)  # symmetric by construction
    # a symbol that never occurs gets a row and column of zeros, not a division by zero
    assert np.array_equal(RV.cooccurrence_ratios(np.array([0, 1, 0]), 3)[2], np.zeros(3))


def test_transition_ratios_are_ours_not_eq6():
    ids = np.array([0, 1, 0, 2])
    T = RV.transition_ratios(ids, 3)
    assert np.allclose(T.sum(0)[:2], 1.0) and not np.allclose(T, RV.cooccurrence_ratios(ids, 3))


def test_rls_equals_the_closed_form_solve():
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(400, 7))
    D = rng.normal(size=(400, 3))
    W_rls = R.rls_readout(Z, D, delta=0.5)
    W_cf = R.ridge_closed_form(Z, D, delta=0.5)
    assert np.allclose(W_rls, W_cf, rtol=0, atol=1e-9)
    # and against numpy's least squares on the augmented system [Z; sqrt(delta) I] w = [D; 0]
    A = np.vstack([Z, math.sqrt(0.5) * np.eye(7)])
    B = np.vstack([D, np.zeros((7, 3))])
    assert np.allclose(W_cf, np.linalg.lstsq(A, B, rcond=None)[0].T, rtol=0, atol=1e-10)


def test_paper_esn_rls_matches_closed_form_and_teacher_run_matches_training_rows():
    rng = np.random.default_rng(1)
    V = 5
    ids = rng.integers(0, V, 600)
    a = R.train_paper_esn(ids, V, 12, seed=3, plus=True, rls=True, washout=10)
    b = R.train_paper_esn(ids, V, 12, seed=3, plus=True, rls=False, washout=10)
    assert np.allclose(a.W_out, b.W_out, rtol=0, atol=1e-7)
    # run with teacher-forced feedback: the output after ids[t] is W_out z_t, z_t the training row
    a.feedback = "teacher"
    lp = R.paper_esn_log_probs(a, ids[:50])
    Z = R.teacher_forced_inputs(a, ids[:50])
    o = np.maximum(Z[:-1] @ a.W_out.T, a.o_min)
    assert np.allclose(lp[1:], np.log(o) - np.log(o.sum(1, keepdims=True)), rtol=0, atol=1e-12)
    assert np.allclose(lp[0], -math.log(V))  # nothing read yet: uniform
    a.feedback = "output"
    assert np.isfinite(R.paper_esn_nnl(a, ids[:50]))


def test_sparse_reservoir_density_and_radius():
    W = R.sparse_reservoir(300, 0.05, np.random.default_rng(0))
    assert abs((W != 0).mean() - 0.05) < 0.005
    assert max(abs(np.linalg.eigvals(W))) == pytest.approx(0.98)
    # sec. 6: p_rec = min(1, 10/n) for the ESN, min(1, 50/n) for the ESN+ on Elman's grammar
    net = R.paper_esn_network(200, 4, np.random.default_rng(0))
    assert abs((net.W != 0).mean() - 0.05) < 0.01
    plus = R.paper_esn_network(200, 4, np.random.default_rng(0), R=np.ones((4, 4)))
    assert abs((plus.W != 0).mean() - 0.25) < 0.02
    assert (R.paper_esn_network(8, 4, np.random.default_rng(0)).W != 0).all()  # n <= 10: full
    assert np.abs(plus.W_in).max() <= 0.04 + 1e-12  # T_rand in (-0.01, 0.01) times R (row sums 4)


def test_ekf_step_is_the_bayesian_least_squares_on_a_linear_model():
    # y = H w (a linear measurement): EKF steps with q = 0 give the posterior mean
    # (P0^-1 I + sum H^T H / r)^-1 sum H^T d / r from w = 0
    rng = np.random.default_rng(4)
    m, p0, r = 6, 10.0, 0.3
    w, P = np.zeros(m), np.eye(m) * p0
    Hs, ds = [], []
    for _ in range(20):
        H = rng.normal(size=(2, m))
        d = rng.normal(size=2)
        w, P = R.ekf_step(w, P, H, d - H @ w, r, 0.0)
        Hs.append(H)
        ds.append(d)
    Hs, ds = np.vstack(Hs), np.concatenate(ds)
    A = np.eye(m) / p0 + Hs.T @ Hs / r
    assert np.allclose(w, np.linalg.solve(A, Hs.T @ ds / r), rtol=0, atol=1e-9)
    assert np.allclose(P, np.linalg.inv(A), rtol=0, atol=1e-9)


def test_ekf_srn_learns_a_periodic_stream():
    ids = np.tile([0, 1, 2, 1], 60)
    E, W, info = R.train_srn_ekf(ids, 3, n=4, seed=0, epochs=2, log_every=120)
    assert E.shape == (3, 4) and W.shape == (4, 4)
    bits = info["train_bits_windows"]
    assert bits[-1] < 0.6 < bits[0]  # after 0 comes 1, after 2 comes 1, after 1: 0 or 2 (1 bit at 1 in 2)


def test_table_compares_our_data_with_the_papers(tmp_path):
    """TABLE.md sets our training length and H beside the paper's (issue #34 item 20), quoted as the paper
    gives them (sec. 5), and the committed TABLE.md is what the committed logs give."""
    import shutil
    from pathlib import Path

    from isan.train.studies.elman_study import PAPER_DATA, write_table

    repo = Path(__file__).resolve().parents[1]
    paper = repo.parent / "shared" / "papers" / "003_d932d524f964d4b0.txt"
    if paper.exists():
        text = paper.read_text(encoding="utf-8")
        assert (f"{PAPER_DATA['train_sentences']} sentences ({PAPER_DATA['train_symbols']} symbols)" in text
                and f"({PAPER_DATA['test_symbols']} symbols)" in text and f"H = {PAPER_DATA['H']}." in text)
    res = tmp_path / "elman"
    shutil.copytree(repo / "results" / "elman", res)
    write_table(res)
    table = (res / "TABLE.md").read_text(encoding="utf-8")
    assert table == (repo / "results" / "elman" / "TABLE.md").read_text(encoding="utf-8")
    line = next(x for x in table.splitlines() if x.startswith("The paper's (sec. 5)"))
    assert "55,273 symbols" in line and "54,966 symbols" in line and "H = 0.534" in line
    assert "-223 training and -93 test symbols, and H +0.0118 NNL" in line  # ours: 55,050, 54,873, 0.5458
