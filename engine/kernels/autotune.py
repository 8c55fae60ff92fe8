"""The register tile of the compiled kernels' GEMM, chosen where they run.

The kernels are compiled in several register tiles (rows x vectors of the grouped GEMM: AVX-512
14x2, 8x3, 6x4, 4x6; AVX2 3x4, 4x3, 6x2; ``_native.variants()``). Which is fastest depends on the
core: 14x2 reaches 85-90% of the FMA peak on an AMD EPYC and about half on a 16-core Xeon. At the
first kernel call of a process (or :func:`isan.engine.kernels.autotune_kernels`), each tile of the best instruction set is
timed on short probes (< 0.3 s in all, :data:`PROBES`): a round of the per-symbol grouped step
(groups of 40 rows, 27 matrices of (d+1) x d, d = 216) with its readout, and a jumps-like round
(groups of 12 rows, 70 matrices of (d+1) x (d + 32), about 16 MiB). The fastest is kept unless it beats the instruction set's default by less
than :data:`MARGIN` (noise), and cached in ``$ISAN_CACHE_DIR/kernels/tile.json`` (default
``~/.cache/isan``), keyed by the CPU model, the instruction set, the kernel build (the compiled module's size,
time and variants) and d; a corrupt or mismatched cache is ignored and rewritten (atomically).

``ISAN_KERNEL_TILE`` forces a choice: ``auto`` (or unset: cached, else timed), ``default`` (the
instruction set's default tile, nothing timed), or a variant (``avx512_6x4``) or instruction set
(``avx2``). :func:`tile_status` (in :func:`isan.engine.kernels.native_status`) says which tile runs
and why. Every tile computes the same sums in the same order along k; the tests hold each to the
numpy twins.

Safe under threads (one lock: the first caller tunes, the others wait) and worker processes (a
file lock beside the cache: one process times, the others read its result).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: a tile replaces the instruction set's default only if it is faster by more than this fraction
MARGIN = 0.05
#: cache file format and version
CACHE_FORMAT, CACHE_VERSION = "isan-kernel-tile", 1
#: the probes: the compiled per-symbol kernel itself (run_streams, one thread, with its readout) on
#: random contracting weights at d = 216 and a random text, (name, symbols, rows, characters a row):
#: a symbol's group then averages rows / symbols, about 28 rows for 27 symbols (as the long text's
#: 1,953 chunk rows on two threads) and 11 for 70 (a jumps-like grouping: the default
#: table's 70 entries, smaller groups, more matrices). A microbenchmark of the GEMM alone ranked
#: the tiles otherwise than the kernel did on an EPYC, so the kernel is what is timed.
PROBES = (("grouped step", 27, 768, 6), ("jumps-like", 70, 768, 4))
ENV = "ISAN_KERNEL_TILE"

_lock = threading.Lock()
_status: dict = {"variant": None, "how": "not yet chosen", "timings": {}}
_done = False


def cpu_model() -> str:
    """The CPU's model string (/proc/cpuinfo's "model name"; else platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_id(nat) -> str:
    """The kernel build: a hash of the compiled module's size, modification time and variants (a
    rebuilt kernel invalidates the cache; cheaper at start-up than hashing the file's 2 MB)."""
    try:
        st = os.stat(nat.__file__)
        key = f"{st.st_size}:{st.st_mtime_ns}:{nat.variants()}"
    except (OSError, AttributeError):
        key = f"unknown:{nat.variants()}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def cache_path() -> Path:
    from isan.trie_tables.build import cache_dir

    return cache_dir() / "kernels" / "tile.json"


def _candidates(nat) -> list[str]:
    """The variants of the best instruction set this CPU runs (its default first)."""
    vs = nat.variants()
    best = max(vs, key=lambda v: ("generic", "avx2", "avx512").index(v[1]) if v[1] in ("generic", "avx2", "avx512") else -1)[1]
    return [v[0] for v in vs if v[1] == best]


def _probe_args(d: int, nsym: int, rows: int, length: int, seed: int = 0):
    """The arguments of ``nat.run_streams`` for a probe (see :data:`PROBES`): weights whose state
    stays bounded (spectral norm about 0.5), symbols drawn with a skewed (Zipf-like) frequency."""
    import numpy as np

    rng = np.random.default_rng(seed)
    V = 27
    dp, Vp = (d + 1 + 15) // 16 * 16, (V + 15) // 16 * 16
    WT = np.zeros((nsym, d + 1, dp), dtype=np.float32)
    WT[:, :d, :d] = rng.standard_normal((nsym, d, d), dtype=np.float32) * np.float32(0.25 / np.sqrt(d))
    WT[:, d, :d] = rng.standard_normal((nsym, d), dtype=np.float32) * np.float32(0.1)
    WT[:, d, d] = 1.0
    RoT = np.zeros((d + 1, Vp), dtype=np.float32)
    RoT[:, :V] = rng.standard_normal((d + 1, V), dtype=np.float32) * np.float32(0.1)

    def panels(B):  # (..., kd, n) -> (..., n / 16, kd, 16), the kernels' layout
        *lead, kd, n = B.shape
        return np.ascontiguousarray(B.reshape(*lead, kd, n // 16, 16).swapaxes(-3, -2), dtype=np.float32)

    p = 1.0 / np.arange(1, nsym + 1)
    ids = rng.choice(nsym, size=rows * length, p=p / p.sum()).astype(np.int32)
    start = np.arange(rows, dtype=np.int64) * length
    ln = np.full(rows, length, dtype=np.int64)
    H = np.zeros((rows, dp), dtype=np.float32)
    H[:, d] = 1.0
    return dict(WT=panels(WT), RoT=panels(RoT), nsym=nsym, V=V, Vp=Vp, d=d, dp=dp, ids=ids, start=start, len=ln,
                H=H, bits=np.zeros(rows * length, dtype=np.float64), P=rows)


def _run_probe(nat, a: dict) -> float:
    """Seconds of one run of the probe ``a`` (one thread, every row every round)."""
    import numpy as np

    P = a["P"]
    H = a["H"].copy()
    Hb = H.copy()
    steps, res, div = np.zeros(P, dtype=np.int64), np.zeros(P, dtype=np.float32), np.zeros(P, dtype=np.int64)
    t0 = time.perf_counter()
    nat.run_streams(WT=a["WT"], split_cols=False, RoT=a["RoT"], nsym=a["nsym"], V=a["V"], Vp=a["Vp"], d=a["d"],
                    dp=a["dp"], ids=a["ids"], start=a["start"], length=a["len"], H=H, Hb=Hb, bits=a["bits"], P=P,
                    pairs=False, stop_ratio=0.0, limit=1e6, check_every=16, steps_done=steps, residual=res,
                    diverged=div, threads=1, want_bits=True, frac=1.0)
    return time.perf_counter() - t0


def time_variants(nat, variants: list[str], d: int = 216, repeats: int = 6) -> dict:
    """{variant: {"seconds": s, "halves": [s1, s2], "gflops": g, "gflops_<probe>": g, ...}}: each
    variant's best time over ``repeats`` runs of every probe (:data:`PROBES`), the variants in
    alternation each repeat (a slow spell falls on all alike; the best time ignores it);
    "seconds" is the sum over the probes of the best times (the score), "halves" the same score
    from the first and from the second half of the repeats (:func:`pick` asks both to agree),
    GFLOP/s the useful work (the step and the readout) over it. Leaves the variant that ran
    before in place."""
    before = nat.variant()
    half = max(1, repeats // 2)
    best = {v: {} for v in variants}  # {variant: {probe: [best of the first half, of the second]}}
    flops = {}
    try:
        for name, nsym, rows, length in PROBES:
            a = _probe_args(d, nsym, rows, length)
            flops[name] = 2.0 * (d + 1) * (d + a["V"]) * rows * length
            nat.set_isa(variants[0])  # untimed: pages, caches and the vector unit's clock
            _run_probe(nat, a)
            for r in range(max(2, repeats)):
                for v in variants:
                    nat.set_isa(v)
                    secs = _run_probe(nat, a)
                    h = best[v].setdefault(name, [float("inf"), float("inf")])
                    h[min(1, r // half)] = min(h[min(1, r // half)], secs)
    finally:
        nat.set_isa(before)
    out = {}
    for v, probes in best.items():
        halves = [sum(h[i] for h in probes.values()) for i in (0, 1)]
        secs = sum(min(h) for h in probes.values())
        out[v] = {"seconds": secs, "halves": halves, "gflops": sum(flops.values()) / secs / 1e9,
                  **{f"gflops_{p.replace(' ', '_').replace('-', '_')}": flops[p] / min(h) / 1e9
                     for p, h in probes.items()}}
    return out


def pick(timings: dict, default: str, margin: float = MARGIN) -> str:
    """The fastest variant, unless it beats ``default`` by no more than ``margin`` (then the default),
    or (where the timings have "halves") unless it does so in both halves of the repeats: on a
    busy machine the two halves disagree and the default stays.

    >>> pick({"a_14x2": {"seconds": 1.0}, "a_6x4": {"seconds": 0.99}}, "a_14x2")
    'a_14x2'
    >>> pick({"a_14x2": {"seconds": 1.0}, "a_6x4": {"seconds": 0.8}}, "a_14x2")
    'a_6x4'
    >>> pick({"a_14x2": {"seconds": 1.0, "halves": [1.0, 1.0]}, "a_6x4": {"seconds": 0.8, "halves": [0.8, 1.1]}}, "a_14x2")
    'a_14x2'
    """
    fastest = min(timings, key=lambda v: timings[v]["seconds"])
    if default not in timings or fastest == default:
        return fastest
    f, d0 = timings[fastest], timings[default]
    pairs = list(zip(f["halves"], d0["halves"])) if "halves" in f and "halves" in d0 else []
    if all(a < b * (1 - margin) for a, b in [(f["seconds"], d0["seconds"]), *pairs]):
        return fastest
    return default


def _key(nat, isa: str, d: int) -> str:
    return f"{cpu_model()}|{isa}|{build_id(nat)}|d={d}"


def _read_cache(path: Path, key: str, variants: list[str]) -> dict | None:
    """The cached entry for key, or None (missing, corrupt, another format or a variant unknown here)."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        if obj.get("format") != CACHE_FORMAT or obj.get("version") != CACHE_VERSION:
            return None
        e = obj["entries"][key]
        if not isinstance(e, dict) or e.get("variant") not in variants:
            return None
        return e
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_cache(path: Path, key: str, entry: dict) -> None:
    from isan.atomic import write_json_atomic

    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        entries = obj["entries"] if obj.get("format") == CACHE_FORMAT and obj.get("version") == CACHE_VERSION else {}
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        entries = {}  # corrupt or absent: rewritten
    entries[key] = entry
    while len(entries) > 32:  # the oldest go first (insertion order)
        entries.pop(next(iter(entries)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"format": CACHE_FORMAT, "version": CACHE_VERSION, "entries": entries})
    except OSError as e:
        log.warning("could not cache the kernels' tile in %s (%s); it will be timed again next time", path, e)


class _FileLock:
    """An advisory lock beside the cache (fcntl; a no-op where there is none), waited on up to
    ``timeout`` seconds, then done without."""

    def __init__(self, path: Path, timeout: float = 10.0):
        self.path, self.timeout, self.f = path, timeout, None

    def __enter__(self):
        try:
            import fcntl

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.f = open(self.path, "a+b")
            t0 = time.monotonic()
            while True:
                try:
                    fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return self
                except OSError:
                    if time.monotonic() - t0 > self.timeout:
                        return self
                    time.sleep(0.02)
        except (ImportError, OSError):
            return self

    def __exit__(self, *exc):
        if self.f is not None:
            self.f.close()  # releases the lock
        return False


def autotune(nat, force: bool = False, d: int = 216) -> dict:
    """Choose the register tile of the compiled module ``nat`` now (see the module's docstring) and
    return :func:`tile_status`. ``force`` times the tiles again even where a choice or a cache
    exists (``ISAN_KERNEL_TILE`` still wins over it)."""
    global _done
    with _lock:
        if not _done or force:
            _choose(nat, force, d)
            _done = True
    return tile_status(nat)


def ensure(nat) -> None:
    """Choose the tile once a process (the first kernel call); cheap after."""
    global _done
    if not _done:
        try:
            autotune(nat)
        except Exception as e:  # the kernels run with their default tile whatever goes wrong here
            log.warning("choosing the kernels' register tile failed (%s); running the default tile", e)
            _done = True
            variant = getattr(nat, "variant", None)  # a module built before the tiles has none
            _status.update(variant=variant() if variant else None, how="default (the autotune failed)", timings={})


def _choose(nat, force: bool, d: int) -> None:
    want = os.environ.get(ENV, "").strip()
    cands = _candidates(nat)
    default = cands[0]
    if want and want not in ("auto", "default"):
        try:
            nat.set_isa(want)
            _status.update(variant=nat.variant(), how=f"forced ({ENV}={want})", timings={})
            return
        except ValueError:
            log.warning("%s=%s: no such kernel variant on this CPU (it runs %s); using the default tile",
                        ENV, want, ", ".join(v[0] for v in nat.variants()))
            want = "default"
    if want == "default" or len(cands) == 1:
        nat.set_isa(default)
        _status.update(variant=default, how="default" + (f" ({ENV}=default)" if want == "default" else
                                                         " (one tile for this instruction set)"), timings={})
        return
    path = cache_path()
    key = _key(nat, default.split("_")[0], d)
    with _FileLock(path.with_suffix(".lock")):
        entry = None if force else _read_cache(path, key, cands)
        if entry is not None:
            nat.set_isa(entry["variant"])
            _status.update(variant=entry["variant"], how=f"cached ({path})", timings=entry.get("timings", {}))
            return
        t0 = time.perf_counter()
        timings = time_variants(nat, cands, d)
        chosen = pick(timings, default)
        nat.set_isa(chosen)
        took = time.perf_counter() - t0
        _write_cache(path, key, {"variant": chosen, "default": default, "timings": timings, "seconds": took,
                                 "cpu": cpu_model(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    _status.update(variant=chosen, how=f"autotuned in {took:.2f} s", timings=timings)
    log.info("kernels' register tile: %s (%s)", chosen,
             ", ".join(f"{v} {t['gflops']:.0f} GFLOP/s" for v, t in timings.items()))


def tile_status(nat) -> dict:
    """{"variant": the tile that runs (e.g. "avx512_14x2") or None, "how": why (autotuned, cached,
    forced, default, not yet chosen), "timings": {variant: {"seconds", "gflops", ...}} of the
    autotune (empty when nothing was timed)}."""
    out = dict(_status)
    out["timings"] = {k: dict(v) for k, v in (out.get("timings") or {}).items()}
    if nat is not None and out["variant"] is not None and hasattr(nat, "variant") and nat.variant() != out["variant"]:
        out.update(variant=nat.variant(), how="set by set_isa")  # the tests, or a caller, chose another
    return out
