"""The engine benchmark's peers: onnxruntime running an LSTM of equal parameters, and KenLM
querying our own n-gram exported as ARPA (where its Python module is installed)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from isan.bench.common import median_time


class PeerUnavailable(Exception):
    """A peer of the benchmark cannot run here (its module is missing or cannot load the model)."""


def bench_onnx_lstm(ids: np.ndarray, repeats: int, log, sz: dict) -> list[dict]:
    """onnxruntime (CPU) running an LSTM of the shipped ISAN's parameter count (548 units, random
    weights: the cost does not depend on them), streaming one text and batching 256 streams."""
    import tempfile

    import torch  # noqa: F401  (the train extra: initialises the LSTM; ImportError when missing)

    from isan.alphabet import Alphabet
    from isan.engine.bundle import write_bundle
    from isan.engine.baselines.onnx import OnnxRunner
    from isan.export.onnx_export import onnx_hook
    from isan.train.baselines import LSTM

    a = Alphabet.text8()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        lstm = LSTM.for_budget(27, 27, 1.28e6, seed=0)
        tensors = {k: v.detach().numpy().astype(np.float32) for k, v in lstm.state_dict().items()}
        lstm_dir = write_bundle(Path(tmp) / "lstm", tensors, a, kind="lstm", extra={"model": lstm.config(), "d": lstm.d},
                                hook=onnx_hook)
        r = OnnxRunner.load(lstm_dir, device="cpu")
        s0 = r.initial_state()
        x = ids[: sz["peer_stream"]]
        med, _ = median_time(lambda: r.score_ids(x, s0), repeats)
        n_params = int(sum(v.size for v in tensors.values()))
        out.append({"name": f"peer: onnxruntime LSTM {lstm.d} units ({n_params:,} params), streaming", "chars": len(x),
                    "chars_per_s": len(x) / med, "provider": r.provider})
        pb, pl = sz["peer_batch"], sz["peer_batch_len"]
        texts = [ids[i * pl : (i + 1) * pl] for i in range(pb)]
        med, _ = median_time(lambda: r.score_batch(texts), repeats)
        out.append({"name": f"peer: onnxruntime LSTM, batched {pb} streams", "chars": pb * pl,
                    "chars_per_s": pb * pl / med, "provider": r.provider})
    for o in out:
        log(f"  {o['name']}: {o['chars_per_s']:,.0f} chars/s")
    return out


def bench_kenlm(data, ids: np.ndarray, repeats: int, log, train_chars: int | None = None) -> list[dict]:
    """KenLM's Python module querying our order-8 n-gram (counted on the train split, or its first
    ``train_chars`` characters for a quick run, exported as ARPA into the cache,
    ``$ISAN_CACHE_DIR/bench``), one character at a time, one thread. Whether this KenLM build loads
    order 8 at all is checked first, on a tiny model, so that nothing is counted in vain."""
    import hashlib

    try:
        import kenlm
    except ImportError:
        raise PeerUnavailable("the kenlm module is not installed (MAX_ORDER=8 pip install --no-cache-dir kenlm)") from None
    from isan.alphabet import Alphabet
    from isan.data import read_text8_split
    from isan.train.ngram import fit
    from isan.export.arpa import symbol_words, write_arpa
    from isan.trie_tables.build import cache_dir

    a = Alphabet.text8()
    probe = cache_dir() / "bench" / "probe-order8.arpa"
    if not probe.is_file():
        write_arpa(fit(a.encode("the quick brown fox jumps over the lazy dog " * 4), 27, 8), a, probe)
    try:
        kenlm.Model(str(probe))
    except (OSError, RuntimeError) as e:
        raise PeerUnavailable(f"this KenLM build cannot load order-8 models ({str(e).splitlines()[0][:120]}); rebuild "
                               "it with MAX_ORDER=8 pip install --no-cache-dir --force-reinstall kenlm") from None
    train = read_text8_split(data, "train")
    if train_chars:
        train = train[:train_chars]
    key = hashlib.sha256(train.encode()).hexdigest()[:16]
    path = cache_dir() / "bench" / f"text8-train-{key}-order8.arpa"
    if not path.is_file():
        log("  counting the order-8 n-gram and writing it as ARPA (once; cached)")
        write_arpa(fit(a.encode(train), 27, 8), a, path)
    try:
        m = kenlm.Model(str(path))
    except (OSError, RuntimeError) as e:
        raise PeerUnavailable(f"KenLM cannot load the order-8 model ({str(e).splitlines()[0][:120]}); rebuild it with "
                               "MAX_ORDER=8 pip install --no-cache-dir --force-reinstall kenlm") from None
    words = np.array(symbol_words(a.symbols), dtype=object)[ids].tolist()
    res = {}

    def query():
        s, s2 = kenlm.State(), kenlm.State()
        m.NullContextWrite(s)
        total = 0.0
        score = m.BaseScore
        for w in words:
            total += score(s, w, s2)
            s, s2 = s2, s
        res["bpc"] = -total * np.log2(10.0) / len(words)

    med, _ = median_time(query, repeats)
    what = "order-8 n-gram" if not train_chars else f"order-8 n-gram of {len(train):,} train characters"
    row = {"name": f"peer: KenLM (Python module) querying our {what}, 1 thread", "chars": len(words),
           "chars_per_s": len(words) / med, "bpc": res["bpc"]}
    log(f"  {row['name']}: {row['chars_per_s']:,.0f} chars/s, {row['bpc']:.4f} bpc")
    return [row]


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out
