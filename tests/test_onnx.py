"""ONNX export and the onnxruntime backend, for the ISAN and the recurrent baselines.

Three ways on real text: onnxruntime vs the torch module vs the numpy reference; the step graph
chained over a text vs the sequence graph; chunking and batching invariance; checker, metadata and
manifest; corrupt, missing and mismatched files. Float32 tolerances are derived from the computation
(tests/tolerances.py) for each model on each text: a float32 graph or module against the float64
reference within one tolerance, two float32 computations within twice it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from isan.alphabet import Alphabet  # noqa: E402
from isan.engine.baselines.recurrent import (  # noqa: E402
    BaselineParams, baseline_score_ref, baseline_sha256, load_baseline_bundle, load_baseline_engine)
from isan.engine.bundle import read_manifest, write_bundle  # noqa: E402
from isan.engine.baselines.onnx import BackendUnavailableError, OnnxRunner, load_onnx_engine  # noqa: E402
from isan.engine.reference import log_softmax, score_ref  # noqa: E402
from isan.errors import BundleFormatError, IsanError  # noqa: E402
from isan.engine.baselines.onnx_graphs import export_isan_onnx  # noqa: E402
from isan.export.onnx_export import baseline_from_bundle, export_baseline_onnx, export_bundle_onnx, onnx_hook  # noqa: E402
from isan.train.baselines import BASELINES, baseline_param_count  # noqa: E402

from conftest import random_params  # noqa: E402
from tolerances import bundle_float32_tolerance as f32_tol, isan_worst_case, readout_tolerance  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TEXT8_HEAD = DATA / "text8_head" / "text8_head.txt"
N_CHARS = 3000
KINDS = tuple(BASELINES)
ALPHABET = Alphabet.text8()


@pytest.fixture(scope="module")
def text_ids() -> np.ndarray:
    """The first N_CHARS characters of text8_head as ids (skipped if the shared data is absent)."""
    if not TEXT8_HEAD.is_file():
        pytest.skip(f"{TEXT8_HEAD} is missing (the project's shared data sits beside the repo)")
    with open(TEXT8_HEAD, encoding="utf-8") as f:
        text = f.read(N_CHARS + 1000)
    return ALPHABET.encode(text.strip()[:N_CHARS])


# ---- models and bundles -----------------------------------------------------------------------
def train_briefly(module, ids: np.ndarray, steps: int = 25, T: int = 32, B: int = 8, lr: float = 1e-2, seed: int = 0):
    """A few Adam steps on real text so that the weights are not just their initialisation."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - T, B)
        x = torch.as_tensor(np.stack([ids[s:s + T] for s in starts]).T.copy())
        logits, _ = module(x, module.initial_state(B))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
    return module.eval()


def make_baseline(kind: str, ids: np.ndarray, input: str = "onehot", d: int = 12, seed: int = 0):
    kw = {"input": "embedding", "emb": 5} if input == "embedding" else {}
    torch.manual_seed(seed)
    return train_briefly(BASELINES[kind](27, 27, d, seed=seed, **kw), ids, seed=seed)


def write_baseline_bundle(module, out: Path, hook=onnx_hook) -> Path:
    """As export/checkpoint.py writes a non-ISAN bundle (kind, float32 state dict, model config)."""
    tensors = {k: v.detach().numpy().astype(np.float32) for k, v in module.state_dict().items()}
    return write_bundle(out, tensors, ALPHABET, kind=module.kind, extra={"model": module.config(), "d": module.d},
                        hook=hook)


@pytest.fixture(scope="module")
def isan_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "isan"
    return write_bundle(out, random_params(d=16, seed=3).as_dict(), ALPHABET, kind="isan", hook=onnx_hook)


_baselines: dict = {}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, text_ids):
    """(module, bundle path) per (kind, input), trained briefly and exported once."""

    def get(kind: str, input: str = "onehot"):
        key = (kind, input)
        if key not in _baselines:
            m = make_baseline(kind, text_ids, input)
            _baselines[key] = (m, write_baseline_bundle(m, tmp_path_factory.mktemp("onnx") / f"{kind}-{input}"))
        return _baselines[key]

    yield get
    _baselines.clear()


def torch_bits(module, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-character bits from the torch module (its logits[t] predict x[t]) and the flat final state."""
    with torch.no_grad():
        x = torch.as_tensor(ids).reshape(-1, 1)
        logits, state = module(x, module.initial_state(1))
        lp = torch.log_softmax(logits[:, 0].double(), -1)
        bits = (-lp[torch.arange(len(ids)), x[:, 0]] / np.log(2.0)).numpy()
    flat = torch.cat(state, 1) if isinstance(state, tuple) else state
    return bits, flat[0].double().numpy()


def copy_bundle(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- parameter counts ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("input", ["onehot", "embedding"])
def test_param_count_is_honest(kind, input):
    kw = {"input": "embedding", "emb": 7} if input == "embedding" else {}
    m = BASELINES[kind](27, 27, 10, seed=0, **kw)
    n = sum(p.numel() for p in m.parameters())
    assert n == m.param_count(27, 27, 10, **kw) == baseline_param_count(kind, 27, 27, 10, **kw)
    assert m.config()["kind"] == kind and m.config()["input"] == input
    json.dumps(m.config())


def test_lstm_budget_gives_548_units():
    m = BASELINES["lstm"].for_budget(27, 27, 1.28e6, seed=0)
    assert m.d == 548
    assert sum(p.numel() for p in m.parameters()) <= 1.28e6 < m.param_count(27, 27, 549)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("input", ["onehot", "embedding"])
def test_fused_forward_equals_step_loop(kind, input, text_ids):
    """forward (torch's fused kernels) vs forward_reference (one cell per step), float64 on real
    text with perturbed weights: logits, final state and every parameter gradient within 1e-10."""
    kw = {"input": "embedding", "emb": 6} if input == "embedding" else {}
    m = BASELINES[kind](27, 27, 12, seed=1, **kw).double()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = torch.as_tensor(text_ids[:5 * 40].reshape(40, 5).astype(np.int64))
    outs = []
    for fwd in (m.forward, m.forward_reference):
        logits, state = fwd(x, m.initial_state(5))
        state = state if isinstance(state, tuple) else (state,)
        loss = logits.square().mean() + sum((s ** 3).sum() for s in state)
        outs.append((logits, state, torch.autograd.grad(loss, list(m.parameters()))))
    (l1, s1, g1), (l2, s2, g2) = outs
    assert l1.shape == (40, 5, 27)
    torch.testing.assert_close(l1, l2, rtol=0, atol=1e-10)
    for a, b in zip(s1, s2):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    for (name, _), a, b in zip(m.named_parameters(), g1, g2):
        assert float(b.abs().max()) > 0, name  # every parameter gets a gradient
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=name)


def test_irnn_starts_at_identity():
    m = BASELINES["irnn"](27, 27, 6, seed=0)
    assert torch.equal(m.W_hh.detach(), torch.eye(6))


def test_irnn_init_scale_reaches_the_model(tmp_path):
    from click.testing import CliRunner

    from isan.cli import main
    from isan.train.models import build_model

    m = build_model("irnn", 27, 27, params=8e4, seed=0, init_scale=0.25)
    assert m.d == 256 and torch.equal(m.W_hh.detach(), 0.25 * torch.eye(256))
    with pytest.raises(TypeError):
        build_model("rnn", 27, 27, d=6, init_scale=0.25)
    r = CliRunner().invoke(main, ["train", "rnn", "--out", str(tmp_path / "r"), "--init-scale", "0.5"])
    assert r.exit_code == 2 and "irnn only" in r.output and not (tmp_path / "r").exists()


# ---- three ways on real text ------------------------------------------------------------------
def test_isan_onnx_matches_reference(isan_bundle, text_ids):
    runner = OnnxRunner.load(isan_bundle)
    assert runner.provider == "CPUExecutionProvider"
    p = random_params(d=16, seed=3).astype(np.float64)
    bits_ref, h_ref = score_ref(p, text_ids, p.h0)
    bits, h = runner.score_ids(text_ids, runner.initial_state())
    assert bits.dtype == np.float64 and bits.shape == (len(text_ids),)
    tol, _, _ = f32_tol(isan_bundle, text_ids)
    np.testing.assert_allclose(bits, bits_ref, rtol=0, atol=tol.bits)
    np.testing.assert_allclose(h, h_ref, rtol=0, atol=tol.state)
    assert 1.0 < bits.mean() < 10.0  # a real (random) model, not a constant


@pytest.mark.parametrize("input", ["onehot", "embedding"])
@pytest.mark.parametrize("kind", KINDS)
def test_baseline_three_ways(baseline, text_ids, kind, input):
    module, bundle = baseline(kind, input)
    bits_torch, s_torch = torch_bits(module, text_ids)
    _, p, _ = load_baseline_bundle(bundle)
    bits_np, s_np = baseline_score_ref(p, text_ids, p.initial_state())
    runner = OnnxRunner.load(bundle)
    bits_onnx, s_onnx = runner.score_ids(text_ids, runner.initial_state())
    assert runner.state_size == (2 if kind == "lstm" else 1) * module.d
    tol, _, _ = f32_tol(bundle, text_ids)  # torch and onnxruntime in float32, numpy in float64
    np.testing.assert_allclose(bits_torch, bits_np, rtol=0, atol=tol.bits)
    np.testing.assert_allclose(bits_onnx, bits_np, rtol=0, atol=tol.bits)
    np.testing.assert_allclose(s_onnx, s_np, rtol=0, atol=tol.state)
    np.testing.assert_allclose(s_torch, s_np, rtol=0, atol=tol.state)
    assert bits_onnx.mean() < np.log2(27)  # briefly trained: better than uniform


def test_onnx_graphs_use_torch_gate_order(baseline, text_ids):
    """A permuted-gate export would still be a valid LSTM; check the graphs against torch directly."""
    module, bundle = baseline("lstm")
    sess = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    h0, c0 = (s.detach().numpy().copy() for s in module.initial_state(3))
    tok = text_ids[:3]
    logits, h1, c1 = sess.run(None, {"token": tok, "h": h0, "c": c0})
    with torch.no_grad():
        th, tc = module.cell(module.input_term(torch.as_tensor(tok)), module.initial_state(3))
        tl = th @ module.W_ro.T + module.b_ro
    # one float32 step in each (3 streams): within twice the derived tolerance of one step of each token
    state = max(f32_tol(bundle, tok[i:i + 1])[0].state for i in range(3))
    _, W_ro, b_ro = f32_tol(bundle, tok[:1])
    np.testing.assert_allclose(h1, th.numpy(), rtol=0, atol=2 * state)
    np.testing.assert_allclose(c1, tc.numpy(), rtol=0, atol=2 * state)
    np.testing.assert_allclose(logits, tl.numpy(), rtol=0, atol=2 * readout_tolerance(W_ro, b_ro, h1, state))


# ---- step vs sequence, chunking, batching -------------------------------------------------------
@pytest.mark.parametrize("which", ["isan", "gru", "lstm"])
def test_step_chain_equals_sequence(which, isan_bundle, baseline, text_ids):
    bundle = isan_bundle if which == "isan" else baseline(which)[1]
    runner = OnnxRunner.load(bundle)
    ids = text_ids[:400]
    s = runner.initial_state()[None, :]
    step_logits = []
    for x in ids:
        logits, s = runner.step(np.array([x]), s)
        step_logits.append(logits[0])
    seq_logits, s_seq = runner.sequence(ids[None, :], runner.initial_state()[None, :])
    tol, W_ro, b_ro = f32_tol(bundle, ids)  # two float32 graphs: twice the tolerance
    states = np.asarray(s_seq)[..., :W_ro.shape[1]]
    np.testing.assert_allclose(np.array(step_logits), seq_logits[0], rtol=0,
                               atol=2 * readout_tolerance(W_ro, b_ro, states, tol.state))
    np.testing.assert_allclose(s[0], s_seq[0], rtol=0, atol=tol.twice().state)
    # and the bits of the chained steps equal score_ids (first prediction from the incoming state)
    before = np.vstack([runner.readout(runner.initial_state())[None], np.array(step_logits[:-1])])
    bits_step = -log_softmax(before.astype(np.float64))[np.arange(len(ids)), ids] / np.log(2.0)
    np.testing.assert_allclose(runner.score_ids(ids, runner.initial_state())[0], bits_step, rtol=0,
                               atol=tol.twice().bits)


@pytest.mark.parametrize("which", ["isan", "lstm"])
def test_chunking_and_state_carry_invariance(which, isan_bundle, baseline, text_ids):
    bundle = isan_bundle if which == "isan" else baseline(which)[1]
    ids = text_ids[:1500]
    whole = OnnxRunner.load(bundle)
    bits, s = whole.score_ids(ids, whole.initial_state())
    small = OnnxRunner.load(bundle, chunk=97)
    bits_c, s_c = small.score_ids(ids, small.initial_state())
    tol = f32_tol(bundle, ids)[0].twice()  # two float32 computations
    np.testing.assert_allclose(bits_c, bits, rtol=0, atol=tol.bits)
    np.testing.assert_allclose(s_c, s, rtol=0, atol=tol.state)
    # streaming: carry the state between calls at odd split points
    parts, state = [], whole.initial_state()
    for a, b in [(0, 1), (1, 333), (333, 334), (334, 1500)]:
        bb, state = whole.score_ids(ids[a:b], state)
        parts.append(bb)
    np.testing.assert_allclose(np.concatenate(parts), bits, rtol=0, atol=tol.bits)
    np.testing.assert_allclose(whole.advance_ids(ids, whole.initial_state()), s, rtol=0, atol=tol.state)


@pytest.mark.parametrize("which", ["isan", "lstm"])
def test_score_batch_equals_single_streams(which, isan_bundle, baseline, text_ids):
    bundle = isan_bundle if which == "isan" else baseline(which)[1]
    runner = OnnxRunner.load(bundle, chunk=64)
    texts = [text_ids[0:300], text_ids[500:510], text_ids[1000:1001], text_ids[1200:1450], text_ids[2000:2300]]
    starts = [runner.initial_state(), runner.advance_ids(text_ids[:50], runner.initial_state())] + \
        [runner.initial_state()] * 3
    batch = runner.score_batch(texts, starts)
    for x, s0, (bits, s) in zip(texts, starts, batch):
        bits1, s1 = runner.score_ids(x, s0)
        assert bits.shape == (len(x),)
        tol = f32_tol(bundle, x, s0)[0].twice()  # two float32 computations from the same state
        np.testing.assert_allclose(bits, bits1, rtol=0, atol=tol.bits)
        np.testing.assert_allclose(s, s1, rtol=0, atol=tol.state)


# ---- files, metadata, manifest ---------------------------------------------------------------
@pytest.mark.parametrize("which", ["isan", "rnn", "lstm"])
def test_checker_metadata_and_manifest(which, isan_bundle, baseline):
    bundle = isan_bundle if which == "isan" else baseline(which)[1]
    m = read_manifest(bundle)
    assert m["onnx"]["params_sha256"] == m["params_sha256"]
    assert m["onnx"]["opset"] == 17
    state = ["h", "c"] if which == "lstm" else ["h"]
    assert m["onnx"]["state"] == state
    for which_graph, fname, tok, suffix in (("step", "model.onnx", "token", "next"),
                                            ("sequence", "sequence.onnx", "tokens", "last")):
        sec = m["onnx"][which_graph]
        assert sec["file"] == fname
        assert [i["name"] for i in sec["inputs"]] == [tok] + state
        assert [o["name"] for o in sec["outputs"]] == ["logits"] + [f"{s}_{suffix}" for s in state]
        model = onnx.load(str(bundle / fname))
        onnx.checker.check_model(model, full_check=True)
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta["params_sha256"] == m["params_sha256"]
        assert meta["graph"] == which_graph and meta["kind"] == which and meta["opset"] == "17"
        assert json.loads(meta["inputs"]) == sec["inputs"]
        assert [o.name for o in model.graph.output] == [o["name"] for o in sec["outputs"]]
        assert model.opset_import[0].version == 17


def test_export_isan_onnx_directly(tmp_path):
    p = random_params(d=8, seed=5)
    info = export_isan_onnx(p, tmp_path)
    assert info["params_sha256"] == p.sha256()
    assert {f.name for f in tmp_path.iterdir()} == {"model.onnx", "sequence.onnx"}
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    logits, h1 = sess.run(None, {"token": np.array([4, 0]), "h": np.stack([p.h0, -p.h0])})
    p64 = p.astype(np.float64)
    want_h = np.stack([p64.W[4] @ p64.h0 + p64.b[4], p64.W[0] @ -p64.h0 + p64.b[0]])
    # one float32 step and its readout: Higham's worst case (|h0| = |-h0|), far below the values
    bounds = [isan_worst_case(p64.W, p64.b, p64.W_ro, p64.b_ro, p64.h0, [x]) for x in (4, 0)]
    h_bound, logits_bound = (np.vstack([b[i] for b in bounds]) for i in (0, 1))
    assert (h_bound < 1e-3 * np.abs(want_h).max()).all()
    assert (np.abs(h1 - want_h) <= h_bound).all()
    assert (np.abs(logits - (want_h @ p64.W_ro.T + p64.b_ro)) <= logits_bound).all()  # readout AFTER the token


def test_export_bundle_onnx_adds_graphs_to_a_bundle(tmp_path, baseline, text_ids):
    module, _ = baseline("gru")
    bundle = write_baseline_bundle(module, tmp_path / "gru-plain", hook=None)
    assert "onnx" not in read_manifest(bundle)
    with pytest.raises(BundleFormatError, match=r"has no model\.onnx.*--onnx"):
        OnnxRunner.load(bundle)
    info = export_bundle_onnx(bundle)
    assert read_manifest(bundle)["onnx"] == info
    assert sorted(f.name for f in bundle.iterdir() if f.name.startswith(".")) == []  # no temp leftovers
    runner = OnnxRunner.load(bundle)
    np.testing.assert_allclose(runner.score_ids(text_ids[:200], runner.initial_state())[0],
                               torch_bits(module, text_ids[:200])[0], rtol=0,
                               atol=f32_tol(bundle, text_ids[:200])[0].twice().bits)  # both float32


def test_export_checkpoint_with_onnx_for_a_baseline(tmp_path, baseline, text_ids):
    """A training-run directory of a baseline -> `isan export --onnx` -> the onnx backend."""
    from safetensors.torch import save_file

    from isan.export.checkpoint import export_bundle

    module, _ = baseline("lstm")
    ckpt = tmp_path / "run"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "format": "isan-checkpoint", "format_version": 1, "model": module.config(),
        "n_params": sum(p.numel() for p in module.parameters()), "alphabet": ALPHABET.to_list(),
        "corpus": "test", "train": {}}))
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(ckpt / "best.safetensors"))
    bundle = export_bundle(ckpt, tmp_path / "bundle", onnx=True, table=False, progress_bar=False)
    m = read_manifest(bundle)
    assert m["kind"] == "lstm" and m["d"] == module.d and m["onnx"]["params_sha256"] == m["params_sha256"]
    eng = load_onnx_engine(bundle)
    r = eng.score(ALPHABET.decode(text_ids[:500]), per_char=True)
    np.testing.assert_allclose(r.per_char_bits, torch_bits(module, text_ids[:500])[0], rtol=0,
                               atol=f32_tol(bundle, text_ids[:500])[0].twice().bits)  # both float32
    rebuilt = baseline_from_bundle(bundle)
    for k, v in module.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[k], v)


# ---- engines over runners -------------------------------------------------------------------------
def test_onnx_engine_matches_numpy_engine(isan_bundle, text_ids):
    from isan.engine import Engine

    text = ALPHABET.decode(text_ids[:800])
    ref = Engine.load(isan_bundle, path_mode="reference")
    eng = load_onnx_engine(isan_bundle)
    assert eng.describe()["backend"] == "onnx" and eng.describe()["provider"] == "CPUExecutionProvider"
    r_ref, r = ref.score(text, per_char=True), eng.score(text, per_char=True)
    assert r.chars == r_ref.chars == 800
    tol, W_ro, b_ro = f32_tol(isan_bundle, text_ids[:800])
    np.testing.assert_allclose(r.per_char_bits, r_ref.per_char_bits, rtol=0, atol=tol.bits)
    # streaming with the state carried, and totals
    a = eng.score(text[:300])
    b = eng.score(text[300:], state=a.state)
    assert b.state.chars == 800 and abs(b.state.bits - r.bits) <= tol.twice().total(800)
    logits_tol = readout_tolerance(W_ro, b_ro, r_ref.state.h, tol.state)  # a probability: within 2.01 times it
    np.testing.assert_allclose(eng.distribution(b.state), ref.distribution(r_ref.state), rtol=0, atol=2.01 * logits_tol)
    batch = eng.score_batch([text[:100], text[100:400]])
    assert abs(batch[1].bits - ref.score(text[100:400]).bits) <= f32_tol(isan_bundle, text_ids[100:400])[0].total_bits
    with pytest.raises(IsanError, match="composed"):
        load_onnx_engine(isan_bundle, path_mode="composed")
    with pytest.raises(IsanError, match="attribution"):
        eng.attribute("the")


def test_baseline_numpy_engine_matches_onnx_engine(baseline, text_ids):
    _, bundle = baseline("gru")
    text = ALPHABET.decode(text_ids[:400])
    np_eng, onnx_eng = load_baseline_engine(bundle), load_onnx_engine(bundle)
    r1, r2 = np_eng.score(text, per_char=True), onnx_eng.score(text, per_char=True)
    np.testing.assert_allclose(r2.per_char_bits, r1.per_char_bits, rtol=0, atol=f32_tol(bundle, text_ids[:400])[0].bits)
    assert [t["symbol"] for t in np_eng.top_k(r1.state, 3)] == [t["symbol"] for t in onnx_eng.top_k(r2.state, 3)]
    s = onnx_eng.sample("the ", n=20, seed=1)
    assert len(s.text) == 20 and set(s.text) <= set(ALPHABET.symbols)


# ---- corrupt, missing, mismatched ---------------------------------------------------------------
@pytest.mark.parametrize("fname", ["model.onnx", "sequence.onnx"])
def test_truncated_onnx_is_a_clear_error(isan_bundle, tmp_path, fname):
    bundle = copy_bundle(isan_bundle, tmp_path / "b")
    data = (bundle / fname).read_bytes()
    (bundle / fname).write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleFormatError) as e:
        OnnxRunner.load(bundle)
    msg = str(e.value)
    assert fname in msg and "isan export" in msg and "--onnx" in msg


def reseal(bundle):
    """Record the bundle's current files in its manifest, as if a tool had rewritten it consistently:
    the checks behind the hashes (graph metadata) are then what refuses a swapped graph."""
    from isan.engine.bundle import finalize_manifest

    m = read_manifest(bundle, verify="none")
    m.pop("onnx", None)  # its per-graph hashes describe the original graphs
    finalize_manifest(bundle, m)


def test_garbage_onnx_is_a_clear_error(isan_bundle, tmp_path):
    bundle = copy_bundle(isan_bundle, tmp_path / "b")
    (bundle / "sequence.onnx").write_bytes(b"\x00not an onnx model\xff" * 10)
    with pytest.raises(BundleFormatError, match=r"sequence\.onnx has 190 bytes.*--onnx"):
        OnnxRunner.load(bundle)  # refused by its record before onnxruntime parses it
    reseal(bundle)
    with pytest.raises(BundleFormatError, match=r"sequence\.onnx.*(not a valid ONNX|not an isan ONNX)"):
        OnnxRunner.load(bundle)


def test_onnx_of_other_weights_is_refused(isan_bundle, tmp_path):
    bundle = copy_bundle(isan_bundle, tmp_path / "b")
    export_isan_onnx(random_params(d=16, seed=99), tmp_path / "other")
    shutil.copyfile(tmp_path / "other" / "model.onnx", bundle / "model.onnx")
    with pytest.raises(BundleFormatError, match=r"model\.onnx does not match its sha256.*isan export"):
        OnnxRunner.load(bundle)
    reseal(bundle)
    with pytest.raises(BundleFormatError, match=r"model\.onnx belongs to other weights.*isan export"):
        OnnxRunner.load(bundle)


def test_onnx_of_another_kind_is_refused(isan_bundle, baseline, tmp_path):
    bundle = copy_bundle(isan_bundle, tmp_path / "b")
    shutil.copyfile(baseline("rnn")[1] / "sequence.onnx", bundle / "sequence.onnx")
    with pytest.raises(BundleFormatError, match=r"sequence\.onnx (has|does not match)"):
        OnnxRunner.load(bundle)
    reseal(bundle)
    with pytest.raises(BundleFormatError, match=r"sequence\.onnx holds the 'rnn'"):
        OnnxRunner.load(bundle)


def test_step_graph_in_place_of_sequence_graph_is_refused(isan_bundle, tmp_path):
    bundle = copy_bundle(isan_bundle, tmp_path / "b")
    shutil.copyfile(bundle / "model.onnx", bundle / "sequence.onnx")
    reseal(bundle)
    with pytest.raises(BundleFormatError, match="'step' graph; expected the 'isan' 'sequence'"):
        OnnxRunner.load(bundle)


def test_bit_flips_in_a_graph_are_refused(isan_bundle, tmp_path):
    """One flipped bit anywhere in sequence.onnx used to change the bits silently (or give NaN)."""
    data = (isan_bundle / "sequence.onnx").read_bytes()
    rng = np.random.default_rng(0)
    for k, pos in enumerate(rng.choice(len(data), size=24, replace=False)):
        bundle = copy_bundle(isan_bundle, tmp_path / f"flip{k}")
        b = bytearray(data)
        b[pos] ^= 1 << int(rng.integers(8))
        (bundle / "sequence.onnx").write_bytes(bytes(b))
        with pytest.raises(BundleFormatError, match="does not match its sha256"):
            OnnxRunner.load(bundle)


def test_edited_baseline_weights_are_refused(baseline, tmp_path):
    from isan.params import load_tensors, save_tensors

    bundle = copy_bundle(baseline("rnn")[1], tmp_path / "b")
    t = load_tensors(bundle / "weights.safetensors")
    t["b_ro"] = t["b_ro"] + 1.0
    save_tensors(bundle / "weights.safetensors", t)
    with pytest.raises(BundleFormatError, match="weights.safetensors (has .* bytes|does not match its sha256)"):
        OnnxRunner.load(bundle)  # the manifest's file record refuses the edited weights
    with pytest.raises(BundleFormatError, match="weights.safetensors"):
        load_baseline_engine(bundle)


def test_cuda_unavailable_is_an_error_not_a_fallback(isan_bundle):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("onnxruntime has a CUDA provider here")
    with pytest.raises(BackendUnavailableError, match="cuda"):
        OnnxRunner.load(isan_bundle, device="cuda")
    assert OnnxRunner.load(isan_bundle, device="auto").provider == "CPUExecutionProvider"
    with pytest.raises(IsanError, match="device must be"):
        OnnxRunner.load(isan_bundle, device="tpu")


def test_baseline_params_validation():
    cfg = {"kind": "gru", "K": 27, "V": 27, "d": 4, "input": "onehot"}
    m = BASELINES["gru"](27, 27, 4, seed=0)
    t = m.numpy_params()
    BaselineParams.from_tensors(cfg, t)
    assert baseline_sha256(t) == baseline_sha256(dict(reversed(list(t.items()))))  # order-free
    with pytest.raises(BundleFormatError, match="missing tensors.*b_hn"):
        BaselineParams.from_tensors(cfg, {k: v for k, v in t.items() if k != "b_hn"})
    with pytest.raises(BundleFormatError, match="shape"):
        BaselineParams.from_tensors({**cfg, "d": 5}, t)
    with pytest.raises(BundleFormatError, match="unknown baseline kind"):
        BaselineParams.from_tensors({**cfg, "kind": "transformer"}, t)


def test_export_baseline_onnx_from_module(tmp_path):
    m = BASELINES["irnn"](27, 27, 6, seed=0)
    info = export_baseline_onnx(m, tmp_path)
    assert info["model"] == m.config() and info["state"] == ["h"]
    assert info["params_sha256"] == baseline_sha256(m.numpy_params())


def test_trainer_runs_a_baseline_end_to_end(tmp_path, text_ids, monkeypatch):
    """Trainer (with the baselines merged into MODELS) -> checkpoint -> `isan export --onnx` -> onnx backend."""
    from isan.export.checkpoint import export_bundle
    from isan.train import models
    from isan.train.data import Corpus
    from isan.train.loop import TrainConfig, Trainer

    monkeypatch.setitem(models.MODELS, "lstm", BASELINES["lstm"])
    corpus = Corpus(ALPHABET, text_ids[:2400].copy(), text_ids[2400:].copy(), name="text8_head[:3000]")
    cfg = TrainConfig(model="lstm", d=8, params=None, batch_size=4, bptt=16, lr=1e-2, max_steps=12, eval_every=0.5,
                      valid_streams=2, ckpt_every=5, log_every=5, seed=1)
    p = Trainer(cfg, tmp_path / "run", corpus=corpus, progress_bar=False).run()
    assert p.step == 12 and p.best_valid_bpc is not None
    bundle = export_bundle(tmp_path / "run", tmp_path / "bundle", onnx=True, table=False, progress_bar=False)
    module = baseline_from_bundle(bundle)
    assert module.config() == read_manifest(bundle)["model"]
    runner = OnnxRunner.load(bundle)
    bits, _ = runner.score_ids(text_ids[2400:], runner.initial_state())
    np.testing.assert_allclose(bits, torch_bits(module, text_ids[2400:])[0], rtol=0,
                               atol=f32_tol(bundle, text_ids[2400:])[0].twice().bits)  # both float32


@pytest.fixture(scope="module")
def isan_runner(isan_bundle):
    return OnnxRunner.load(isan_bundle, chunk=50)


def test_any_split_gives_the_same_bits(isan_runner, isan_bundle, text_ids):
    """Chunking invariance (hypothesis): any split of a text, state carried, equals one call."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ids = text_ids[:400]
    whole, s_whole = isan_runner.score_ids(ids, isan_runner.initial_state())
    tol = f32_tol(isan_bundle, ids)[0].twice()  # each split's float32 computation and the whole one's

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=len(ids)), max_size=6))
    def check(cuts):
        bounds = [0] + sorted(cuts) + [len(ids)]
        state, parts = isan_runner.initial_state(), []
        for a, b in zip(bounds[:-1], bounds[1:]):
            bits, state = isan_runner.score_ids(ids[a:b], state)
            parts.append(bits)
        # The first character of each chunk is read out in float64 from the carried state, the
        # rest inside the float32 graph: two computations that round differently.
        np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=tol.bits)
        np.testing.assert_allclose(state, s_whole, rtol=0, atol=tol.state)

    check()
