"""Table 1 extras: the linear controls (torch vs numpy reference), the Kneser-Ney n-gram model,
and the table generator. Real text from ../shared/data; the whole file runs in well under a minute."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from isan.errors import BundleFormatError, IsanError
from isan.engine.baselines import ngram
from isan.train import ngram as ngram_train

TEXT8 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "text8_head" / "text8_head.txt"
LINEAR_KINDS = ("linear", "linear_nlro", "isan_nobias")


@pytest.fixture(scope="module")
def corpus():
    if not TEXT8.exists():
        pytest.skip(f"{TEXT8} is missing (the project's shared data sits beside the repo)")
    from isan.train.data import load_corpus

    return load_corpus(TEXT8, "text8")


# ---- linear controls: architecture (torch) ----------------------------------------------------------
try:  # the n-gram and table tests below need no torch
    import torch

    from isan.train.linear import LINEAR
    from isan.train.models import MODELS, build_model
except ModuleNotFoundError:  # pragma: no cover
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch (the train extra)")


@needs_torch
@pytest.mark.parametrize("kind", LINEAR_KINDS)
def test_registered(kind):
    assert MODELS[kind] is LINEAR[kind] and LINEAR[kind].kind == kind


@needs_torch
@pytest.mark.parametrize("kind", LINEAR_KINDS)
def test_forward_shapes_and_causality(kind):
    m = build_model(kind, 27, 27, d=6, seed=0).double()  # float64: two computations within 1e-12
    x = torch.randint(0, 27, (7, 3), generator=torch.Generator().manual_seed(1))
    y = (x + 1) % 27
    h = m.initial_state(3)
    with torch.no_grad():
        lx, sx = m(x, h)
        ly, sy = m(y, h)
    assert lx.shape == (7, 3, 27) and sx.shape == (3, 6)
    torch.testing.assert_close(lx[0], ly[0], rtol=0, atol=0)  # logits[0]: the initial state only
    assert not torch.allclose(lx[1:], ly[1:])
    # the chunk's final state carries on: two halves equal the whole
    with torch.no_grad():
        l1, s1 = m(x[:4], h)
        l2, s2 = m(x[4:], s1)
    torch.testing.assert_close(torch.cat([l1, l2]), lx, rtol=0, atol=1e-12)
    torch.testing.assert_close(s2, sx, rtol=0, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("kind", LINEAR_KINDS)
@pytest.mark.parametrize("budget", [8e4, 3.2e5])
def test_param_count_and_budget(kind, budget):
    cls = LINEAR[kind]
    m = cls.for_budget(27, 27, budget, seed=0)
    n = sum(p.numel() for p in m.parameters())
    assert n == cls.param_count(27, 27, m.d) <= budget < cls.param_count(27, 27, m.d + 1)
    assert set(m.numpy_params()) == set(m.state_dict()) == {k for k, _ in m.named_parameters()}
    assert all(p.is_contiguous() for p in m.parameters())  # the trainer saves optimizer state as is
    assert m.config()["kind"] == kind and m.config()["d"] == m.d


@needs_torch
def test_budget_details():
    nl = LINEAR["linear_nlro"](27, 27, 10, readout_hidden=4, seed=0)
    assert sum(p.numel() for p in nl.parameters()) == LINEAR["linear_nlro"].param_count(27, 27, 10, 4)
    assert nl.config()["readout_hidden"] == 4 and nl.W_ro.shape == (27, 4)
    assert LINEAR["linear"].param_count(27, 27, 256) == 79_643  # d^2 + K d + V d + V + d
    assert LINEAR["isan_nobias"].param_count(27, 27, 53) == 27 * 53 * 53 + 27 * 53 + 27 + 53
    nb = LINEAR["isan_nobias"](27, 27, 5, seed=0)
    assert "zero_b" not in nb.state_dict() and float(nb.h0.detach().norm()) > 0  # h0 = 0 would stay 0
    with pytest.raises(ValueError, match="too small"):
        LINEAR["isan_nobias"].for_budget(27, 27, 50)


@needs_torch
def test_linear_nlro_spectral_norm_constraint(corpus, tmp_path):
    """linear_nlro trains with ||W||_2 <= w_max_norm (train/linear.py says why); the trainer applies it
    after every step. At a large rate Adam lifts ||W||_2 above 1 within a few steps when unconstrained."""
    from isan.train.loop import TrainConfig, Trainer

    m = LINEAR["linear_nlro"](27, 27, 6, seed=0).double()  # in float64: the projection's norm to 1e-12
    with torch.no_grad():
        m.W.mul_(3.0)
    m.constrain_()
    assert float(torch.linalg.matrix_norm(m.W.detach(), 2)) == pytest.approx(1.0, rel=1e-12)
    assert m.config()["w_max_norm"] == 1.0
    with pytest.raises(ValueError, match="w_max_norm"):
        LINEAR["linear_nlro"](27, 27, 6, w_max_norm=0.0)

    norms = {}
    for cap in (1.0, None):
        cfg = TrainConfig(model="linear_nlro", d=16, params=None, data=str(TEXT8), batch_size=8, bptt=16,
                          lr=5e-2, max_steps=12, eval_every=10.0, max_valid_chars=2000, valid_streams=2,
                          log_every=4, ckpt_every=100)
        t = Trainer(cfg, tmp_path / f"run-{cap}", corpus=corpus, progress_bar=False)
        t.model.w_max_norm = cap
        t.run()
        norms[cap] = float(torch.linalg.matrix_norm(t.model.W.detach(), 2))
    assert norms[1.0] <= 1.0 + 1e-5
    assert norms[None] > 1.05  # the constraint is what holds the norm down


# ---- linear controls: train, export, score with the numpy reference -------------------------------
@pytest.fixture(scope="module", params=LINEAR_KINDS)
def trained(request, corpus, tmp_path_factory):
    if torch is None:
        pytest.skip("needs torch")
    from isan.export.checkpoint import export_checkpoint
    from isan.train.loop import TrainConfig, Trainer

    kind = request.param
    out = tmp_path_factory.mktemp(f"run-{kind}")
    cfg = TrainConfig(model=kind, d=8, params=None, data=str(TEXT8), batch_size=16, bptt=16, max_steps=20,
                      eval_every=0.001, max_valid_chars=5000, valid_streams=5, log_every=5, ckpt_every=100)
    p = Trainer(cfg, out / "run", corpus=corpus, progress_bar=False).run()
    bundle = export_checkpoint(out / "run", out / "bundle")
    return kind, out / "run", bundle, p


def _torch_bits(kind, run, ids):
    from safetensors.torch import load_file

    m = build_model(kind, 27, 27, d=8)
    m.load_state_dict(load_file(str(run / "best.safetensors")))
    m = m.double()  # the checkpoint's float32 values in float64, as the numpy reference reads them
    x = torch.as_tensor(ids).reshape(-1, 1)
    with torch.no_grad():
        logits, _ = m(x, m.initial_state(1))
        nats = torch.nn.functional.cross_entropy(logits.reshape(-1, 27).double(), x.reshape(-1), reduction="none")
    return (nats / math.log(2)).numpy()


@needs_torch
def test_trained_bundle_matches_torch(trained, corpus):
    from isan.engine.baselines.linear import load_linear_engine

    kind, run, bundle, p = trained
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["event"] == "done" and p.step == 20 and math.isfinite(p.best_valid_bpc)
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["kind"] == kind and m["d"] == 8 and m["model"]["kind"] == kind
    eng = load_linear_engine(bundle)
    ids = corpus.valid[:2000]
    r = eng.score(ids, per_char=True)
    np.testing.assert_allclose(r.per_char_bits, _torch_bits(kind, run, ids), atol=1e-12, rtol=0)  # both float64
    assert r.chars == 2000 and r.state.h.shape == (8,)
    # streaming: carrying the state across chunks equals one call
    a = eng.score(ids[:700])
    b = eng.score(ids[700:], state=a.state)
    assert a.bits + b.bits == pytest.approx(r.bits, rel=1e-12)
    np.testing.assert_allclose(b.state.h, r.state.h, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(eng.advance(ids[:700]).h, a.state.h, rtol=1e-12, atol=1e-12)
    assert eng.distribution().sum() == pytest.approx(1.0) and eng.describe()["kind"] == kind
    batch = eng.score_batch([ids[:300], ids[300:900]])
    assert batch[1].bits == pytest.approx(eng.score(ids[300:900]).bits, rel=1e-12)


@needs_torch
def test_linear_bundle_errors(trained, tmp_path):
    import shutil

    from isan.engine.bundle import manifest_sha256
    from isan.engine.baselines.linear import load_linear_engine

    kind, run, bundle, _ = trained
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["params_sha256"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleFormatError, match="manifest_sha256"):  # an edited manifest is refused as such
        load_linear_engine(bad)
    m["manifest_sha256"] = manifest_sha256(m)  # re-sealed: the weights' check refuses it
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleFormatError, match="params_sha256"):
        load_linear_engine(bad)
    m["kind"] = "rnn"
    m["manifest_sha256"] = manifest_sha256(m)
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleFormatError, match="not one of"):
        load_linear_engine(bad)


# ---- n-gram --------------------------------------------------------------------------------------
def _reference_kn(train, K, N):
    """Plain-dict interpolated modified Kneser-Ney (the obviously correct twin): p(history, w)."""
    train = [int(x) for x in train]
    raw = [Counter() for _ in range(N + 1)]
    for n in range(1, N + 1):
        for i in range(len(train) - n + 1):
            raw[n][tuple(train[i : i + n])] += 1
    a = [None] * (N + 1)
    for n in range(1, N):
        a[n] = Counter(g[1:] for g in raw[n + 1])
    a[N] = raw[N]
    D, S, G = [None] * (N + 1), [None] * (N + 1), [None] * (N + 1)
    for n in range(1, N + 1):
        cc = Counter(a[n].values())
        n1, n2, n3, n4 = (cc[k] for k in (1, 2, 3, 4))
        if min(n1, n2, n3, n4) == 0:  # e.g. unigrams: every count is large
            D[n] = (0.5, 1.0, 1.5)
        else:
            Y = n1 / (n1 + 2 * n2)
            D[n] = (min(max(1 - 2 * Y * n2 / n1, 0), 1), min(max(2 - 3 * Y * n3 / n2, 0), 2),
                    min(max(3 - 4 * Y * n4 / n3, 0), 3))
        S[n], G[n] = defaultdict(float), defaultdict(float)
        for g, v in a[n].items():
            S[n][g[:-1]] += v
            G[n][g[:-1]] += D[n][min(v, 3) - 1]

    def p(h, w):
        pr = 1.0 / K
        for n in range(1, min(N, len(h) + 1) + 1):
            hh = tuple(h[len(h) - n + 1 :]) if n > 1 else ()
            if hh in S[n]:
                v = a[n].get(hh + (w,), 0)
                pr = (max(v - (D[n][min(v, 3) - 1] if v else 0.0), 0) + G[n][hh] * pr) / S[n][hh]
        return pr

    return p


@pytest.fixture(scope="module")
def small_split(corpus):
    return corpus.train[:300_000], corpus.valid[:20_000]


def test_ngram_matches_reference(corpus):
    tr, va = corpus.train[:20_000], corpus.valid[:300]
    for N in (1, 3):
        p = _reference_kn(tr, 27, N)
        ref = [-math.log2(p(list(va[max(0, t - N + 1) : t]), int(va[t]))) for t in range(len(va))]
        np.testing.assert_allclose(ngram_train.fit(tr, 27, N).bits(va), ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize("order", [1, 2, 4, 6])
def test_ngram_probabilities_sum_to_one(small_split, order):
    model = ngram_train.fit(small_split[0], 27, order)
    rng = np.random.default_rng(order)
    for _ in range(30):
        h = rng.integers(0, 27, order - 1)
        h[: rng.integers(0, order)] = -1  # the start of a text: fewer characters
        p = model.distribution(h)
        assert p.shape == (27,) and np.all(p > 0) and p.sum() == pytest.approx(1.0, abs=1e-12)
    # contexts taken from real text too (seen ones exercise every discount)
    for t in rng.integers(order, 10_000, 10):
        assert model.distribution(small_split[1][t - order + 1 : t]).sum() == pytest.approx(1.0, abs=1e-12)


def _add_one_bpc(train, valid, K, n):
    """Add-one (Laplace) n-gram bpc: p(w | h) = (c(h w) + 1) / (c(h .) + K); position t < n - 1 uses
    its t preceding characters, like the KN model."""
    b = np.uint64(ngram.bits_per_symbol(K))
    bits = []
    for L in range(n):  # context length
        u, c = np.unique(ngram.ngram_codes(train, K, L + 1), return_counts=True)
        ctx, inv = np.unique(u >> b, return_inverse=True)
        ctx_counts = np.bincount(inv, weights=c)
        q = ngram.ngram_codes(valid, K, L + 1)
        q = q[:1] if L < n - 1 else q  # the one position with L characters before it, or all the rest
        j = np.minimum(np.searchsorted(u, q), len(u) - 1)
        k = np.minimum(np.searchsorted(ctx, q >> b), len(ctx) - 1)
        num = np.where(u[j] == q, c[j], 0) + 1
        den = np.where(ctx[k] == (q >> b), ctx_counts[k], 0) + K
        bits.append(-np.log2(num / den))
    return float(np.concatenate(bits).mean())


@pytest.mark.parametrize("order, margin_bpc", [(3, 0.0), (5, 0.3)])
def test_kneser_ney_beats_add_one(small_split, order, margin_bpc):
    # measured on these slices: order 3 KN 2.940 vs add-one 2.956 (most trigrams are seen), order 5 2.171 vs 2.749
    tr, va = small_split
    kn = ngram_train.fit(tr, 27, order).bpc(va)
    assert kn < _add_one_bpc(tr, va, 27, order) - margin_bpc


def test_choose_order(small_split):
    tr, va = small_split
    best, results = ngram_train.choose_order(tr, va[:10_000], orders=(1, 2, 3, 4, 5, 6), K=27)
    assert [r["order"] for r in results] == [1, 2, 3, 4, 5, 6]
    assert best == min(results, key=lambda r: r["valid_bpc"])["order"] and best >= 3
    assert results[0]["valid_bpc"] > results[best - 1]["valid_bpc"]
    with pytest.raises(IsanError):
        ngram_train.fit(tr, 27, 13)  # codes of 13 symbols do not fit in 63 bits


def test_ngram_bundle_round_trip(small_split, tmp_path):
    from isan.alphabet import Alphabet

    tr, va = small_split
    model = ngram_train.fit(tr, 27, 4)
    out = ngram_train.save_ngram(model, tmp_path / "ng", Alphabet.text8(), training={"train_chars": len(tr)})
    m = json.loads((out / "manifest.json").read_text())
    assert (m["format"], m["format_version"], m["kind"], m["d"]) == ("isan-bundle", 3, "ngram", 4)
    _, back, alphabet = ngram.load_ngram(out)
    np.testing.assert_array_equal(back.bits(va[:5000]), model.bits(va[:5000]))
    eng = ngram.load_ngram_engine(out)
    text = alphabet.decode(va[:3000])
    r = eng.score(text, per_char=True)
    np.testing.assert_allclose(r.per_char_bits, model.bits(va[:3000]), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(r.state.h, va[2997:3000].astype(float))
    s1 = eng.score(text[:2])  # the state of a short text: the ids, -1 padded on the left
    np.testing.assert_array_equal(s1.state.h, [-1.0, va[0], va[1]])
    s2 = eng.score(text[2:], state=s1.state, per_char=True)
    assert s1.bits + s2.bits == pytest.approx(r.bits, rel=1e-12)
    assert eng.distribution(s1.state).sum() == pytest.approx(1.0, abs=1e-12)
    assert eng.describe()["kind"] == "ngram" and eng.describe()["d"] == 4
    assert len(eng.sample("the ", n=20, seed=0).text) == 20
    with pytest.raises(FileExistsError):
        ngram_train.save_ngram(model, out, Alphabet.text8())
    with pytest.raises(IsanError):
        model.bits(va[:10], history=[3, -1, 4])  # padding only on the left


def test_ngram_bundle_corrupt(small_split, tmp_path):
    import shutil

    from isan.alphabet import Alphabet

    good = ngram_train.save_ngram(ngram_train.fit(small_split[0][:50_000], 27, 3), tmp_path / "good", Alphabet.text8())
    for name, damage in [("flipped", lambda b: b[:-100] + bytes([b[-100] ^ 0xFF]) + b[-99:]),
                         ("truncated", lambda b: b[: len(b) // 2]), ("garbage", lambda b: b"not safetensors")]:
        bad = tmp_path / name
        shutil.copytree(good, bad)
        f = bad / ngram.COUNTS_FILE
        f.write_bytes(damage(f.read_bytes()))
        with pytest.raises(BundleFormatError, match="isan train ngram"):
            ngram.load_ngram(bad)
    (tmp_path / "missing").mkdir()
    shutil.copy(good / "manifest.json", tmp_path / "missing" / "manifest.json")
    with pytest.raises(BundleFormatError, match="is missing|does not exist"):
        ngram.load_ngram_engine(tmp_path / "missing")
    with pytest.raises(BundleFormatError):
        ngram.load_ngram(tmp_path)  # no manifest


def test_train_ngram_end_to_end(tmp_path):
    if not TEXT8.exists():
        pytest.skip(f"{TEXT8} is missing")
    info = ngram_train.train_ngram(TEXT8, tmp_path / "ng", orders=(2, 3))
    assert info["order"] == 3 and 2.5 < info["valid_bpc"] < 3.5
    log = [json.loads(line) for line in (tmp_path / "ng" / "train_log.jsonl").read_text().splitlines()]
    assert [e["order"] for e in log if e["event"] == "order"] == [2, 3]
    assert log[-1]["event"] == "done" and log[-1]["train_chars"] == 9_000_000 and log[-1]["train_chars_per_s"] > 0
    assert all({"order", "valid_bpc", "seconds"} <= set(e) for e in log[:-1])


# ---- table generator -----------------------------------------------------------------------------
def _fake_result(root: Path, name: str, bpc: float, log: list[dict]):
    d = root / name
    d.mkdir(parents=True)
    (d / "score.json").write_text(json.dumps({"chars": 500000, "bits": bpc * 500000, "bpc": bpc}))
    (d / "train_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    (d / "command.txt").write_text(f"isan score --model runs/{name}.bundle --json --text8-split test DATA\n")


def test_table1_generator(tmp_path):
    from isan.train.studies import table1

    root = tmp_path / "results" / "table1"
    _fake_result(root, "isan-3.2e5", 1.8765, [
        {"event": "start", "model": {"kind": "isan", "d": 107}, "n_params": 315035},
        {"event": "done", "stop_reason": "max_chars", "chars_seen": 18006016, "best_valid_bpc": 1.9,
         "train_chars_per_s": 256654}])
    _fake_result(root, "ngram", 1.7321, [{"event": "order", "order": 7, "valid_bpc": 1.8, "seconds": 1.0},
                                         {"event": "done", "order": 7, "valid_bpc": 1.8, "train_chars_per_s": 4500000,
                                          "train_chars": 9000000, "n_ngrams": 123456}])
    (root / "notes").mkdir()  # not a cell: ignored
    (root / "lstm-8e4").mkdir()  # no score.json yet: shown as missing
    out = tmp_path / "README-table.md"
    info = table1.generate(root, out, plot=None)
    md = out.read_text()
    assert info["cells"] == 2
    assert "**1.877**" in md and "**1.732**" in md and "(order 7, chosen on valid)" in md
    assert "256,654" in md and "4,500,000" in md and "315,035" in md
    assert "[log](results/table1/isan-3.2e5/train_log.jsonl)" in md
    assert "[cmd](results/table1/ngram/command.txt)" in md
    isan_run = next(line for line in md.splitlines() if line.startswith("| ISAN | 3.2e5 |"))
    assert "1.900 (log)" in isan_run  # no valid.json: the training log's number, marked
    assert "valid bpc (valid.json)" in md and "A number marked (log)" in md
    lstm_row = next(line for line in md.splitlines() if line.startswith("| LSTM |"))
    assert lstm_row.count(table1.MISSING) == 3 and "1.85" in lstm_row  # ours missing, the paper's shown
    assert table1.parse_result_name("linear_nlro-320000") == ("linear_nlro", "3.2e5")
    assert table1.parse_result_name("isan-1e5") is None
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{table1.README_BEGIN}\nold table\n{table1.README_END}\nafter\n")
    table1.generate(root, out, plot=None, readme=readme)
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# x\n\nbefore\n") and text.endswith("after\n")
    isan_row = next(line for line in text.splitlines() if line.startswith("| ISAN |"))
    assert "[1.877](results/table1/isan-3.2e5/)" in isan_row and "1.92 / 1.71 / 1.58" in isan_row
    assert "test [1.732](results/table1/ngram/) bpc (123,456 stored n-grams)" in text
    readme.write_text("no markers")
    with pytest.raises(IsanError, match="table1:begin"):
        table1.generate(root, out, plot=None, readme=readme)
    (root / "isan-3.2e5" / "score.json").write_text("{not json")
    with pytest.raises(IsanError, match="score.json"):
        table1.generate(root, out)


def test_table1_valid_column_prefers_valid_json_and_says_the_gap(tmp_path):
    """A run with valid.json shows that number, unmarked; the note gives the log's gap to it, read from the files."""
    from isan.train.studies import table1

    root = tmp_path / "results" / "table1"
    _fake_result(root, "isan-3.2e5", 1.8765, [
        {"event": "start", "model": {"kind": "isan", "d": 107}, "n_params": 315035},
        {"event": "done", "stop_reason": "max_chars", "chars_seen": 1, "best_valid_bpc": 1.9031, "train_chars_per_s": 1}])
    (root / "isan-3.2e5" / "valid.json").write_text(json.dumps({"chars": 500000, "bits": 1.9 * 500000, "bpc": 1.9}))
    out = tmp_path / "t.md"
    table1.generate(root, out, plot=None)
    md = out.read_text()
    row = next(line for line in md.splitlines() if line.startswith("| ISAN | 3.2e5 |"))
    assert "| 1.900 |" in row and "(log)" not in row
    assert "0.0031 to 0.0031 bpc" in md


def test_table1_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from isan.train.studies import table1

    root = tmp_path / "r"
    _fake_result(root, "gru-8e4", 2.3, [{"event": "start", "n_params": 79052, "model": {"d": 145}}])
    assert table1.main(["--results", str(root), "--out", str(tmp_path / "t.md"), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table1_tuning_step(tmp_path):
    """The tuning step picks the setting with the lowest valid bpc per model; a diverged run (no
    finite validation) is never picked; lr.json is what train/studies/table1.sh reads."""
    from isan.train.studies import table1

    root = tmp_path / "tuning"
    root.mkdir()
    runs = {("gru", "2e-3"): [2.61, 2.55], ("gru", "1e-3"): [2.58], ("gru", "5e-4"): [2.71],
            ("irnn", "2e-3"): [float("nan")], ("irnn", "1e-3"): [], ("irnn@0.1", "1e-3"): [3.0],
            ("irnn@0.1", "2e-3"): [3.1], ("lstm", "1e-3"): [2.4], ("lstm", "2.5e-4"): [2.4]}
    for (model, rate), valid in runs.items():
        events = [{"event": "start"}] + [{"event": "valid", "valid_bpc": v} for v in valid]
        (root / f"{model}-lr{rate}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (root / "notes.txt").write_text("not a log")
    chosen = table1.write_tuning(root)
    # gru: the best of a run's evaluations; lstm: a tie goes to the larger rate; irnn: the scaled init
    assert chosen == {"gru": {"lr": 2e-3}, "lstm": {"lr": 1e-3}, "irnn": {"lr": 1e-3, "init_scale": 0.1}}
    assert json.loads((root / "lr.json").read_text()) == chosen
    md = (root / "TUNING.md").read_text()
    assert "**2.550**" in md and "2.580" in md and "diverged" in md
    rows = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    assert "**" not in rows["| IRNN"] and "**3.000**" in rows["| IRNN (0.1·I init)"]
    assert table1.parse_tuning_name("irnn@0.1-lr2e-3.jsonl") == ("irnn", "0.1", "2e-3")
    assert table1.parse_tuning_name("TUNING.md") is None
    assert table1.main(["--tuning", str(root)]) == 0
    with pytest.raises(IsanError, match="train/studies/tune.sh"):
        table1.write_tuning(tmp_path / "missing")


def test_the_old_runners_package_is_a_warning_alias_of_baselines():
    """isan.engine.runners moved to isan.engine.baselines (issue #46); the old names stay for a release, the same
    module objects, and importing the old package warns."""
    import importlib
    import sys
    import warnings

    from isan.engine.baselines import ngram as new_ngram, recurrent as new_recurrent
    sys.modules.pop("isan.engine.runners", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("isan.engine.runners.recurrent")
    assert any(issubclass(w.category, DeprecationWarning) and "isan.engine.baselines" in str(w.message)
               for w in caught)
    assert old is new_recurrent and old.BaselineParams is new_recurrent.BaselineParams
    from isan.engine.runners.ngram import KneserNeyModel
    assert KneserNeyModel is new_ngram.KneserNeyModel
