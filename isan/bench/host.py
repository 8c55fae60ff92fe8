"""What the host sustains on the torch path (``isan bench host``): its side of a call timed with a
device that takes no time, and the same measurements of an older isan in the same run.

On a GPU the device's work of a batch of 65,536 documents x 512 characters takes a fraction of the
host's (its ids joined and staged, the rows' tables made, the results handed back), so the host
bounds the rate. This benchmark measures that side alone: inside :func:`null_device` the torch
path's steps and readout (:class:`~isan.engine.kernels.torch.streams.StepBlock`, run per block, and
the range check ``max_abs``) are replaced by :class:`NullStepBlock` and :func:`null_max_abs`, which
do no arithmetic and report "no row left the range", and so are the pipeline's two other pieces of
device work where the isan measured has them (the state rows filled on the device,
``state_rows``; the rows' stopping steps reduced there, ``first_stops``) and the copy of every
character's bits from the device into the caller's page-locked memory (``copy_to_host``, the
device's copy engine's work): every other part of a call (preparation, copies in, the launches and
bookkeeping between blocks, the results) runs as it does. What an older isan did on the host (its
state rows filled there, a masked copy of the bits a correction pass rewrote) stays counted. The
figures are rates of capacity: characters a second the host could feed a device that took no time.

The null device is a benchmark double and nothing else: the values a call returns under it are not
scores (its states never move, its bits are whatever the buffers held), so it never tests
correctness; the tests check only that it puts back what it replaced.

Rows (medians over ``repeats`` timings after one untimed run each), on the torch backend on
``device`` in float32 (on the CPU device with one torch thread, :data:`CPU_TORCH_THREADS`):

* one call of ``docs`` documents x ``doc_chars`` characters (text8, its ids repeated end to end and
  cut into documents; uint8 ids for both APIs), each document's total only (and, where
  ``score_batches`` takes ``finals``, the final states left on the device): chars/s and ms a batch;
* ``batches`` such batches through :func:`isan.engine.batches.score_batches` (overlapped on a GPU);
* the long text (the whole text8 head, chunk-parallel, ``Engine.score``), given as ids and as a str;
* the corpus scoring process: ``DocScorer(engine).score_prepared`` of the same documents prepared
  (:func:`isan.engine.corpus.prepared.prepare_docs`), in batches of a GPU's size.

Which API the isan being measured has is detected (:func:`packed_api`): with
:mod:`isan.engine.packed`, documents go in as one :class:`~isan.engine.packed.Packed` batch; before
it, as a list of id arrays with their (B, d) start states. ``--before PATH`` runs this same file
by its path in a subprocess with ``PYTHONPATH=PATH`` (an older isan installed there), so it imports
only what both have.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # run by its path: this folder's modules (common, gpu, ...) are not top-level modules

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

#: The sizes of a run: a GPU's batch of 65,536 documents x 512 characters, four such batches.
SIZES = {"docs": 65_536, "doc_chars": 512, "batches": 4, "repeats": 5, "long_chars": None}
#: Small sizes: a check that it runs (the test suite's), not a measurement.
QUICK_SIZES = {"docs": 64, "doc_chars": 200, "batches": 2, "repeats": 1, "long_chars": 40_000}
#: What the host should sustain on a 2-core machine (chars/s of capacity, or times faster than before).
TARGETS = {"docs_one_call": 500e6, "docs_one_call_vs_before": 4.0, "long_vs_before": 4.0, "corpus": 300e6}
#: The row keys, in the order of the table.
ROWS = ("docs_one_call", "docs_batches", "long_prep", "long_ids", "long_str", "corpus")
#: torch's threads during a run on the CPU device: the host's side is one thread's work, and the
#: stand-ins of the device's work there (copies back, fills) do not wait on a second core that another
#: process holds (two threads on a shared 2-core machine stalled a call of 70 ms to 400 ms).
CPU_TORCH_THREADS = 1


# ---- the null device ------------------------------------------------------------------------

class NullStepBlock:
    """A block of steps that takes no time: :class:`~isan.engine.kernels.torch.streams.StepBlock`'s
    constructor's arguments (``n_steps``: the block's steps, default ``blk``), none of its work.

    Benchmark double only (:func:`null_device`): the rows' states are not stepped and nothing is
    read out."""

    def __init__(self, runner, dm, Hall, act, P, ids_d, start_d, length_d, t0, blk, limit, n_steps=None, **_):
        import torch

        self.pairs = bool(P)  # a correction pass: its error rows stop at their first check, writing nothing
        self.A = int(act.numel())
        self.n_steps = int(n_steps) if n_steps is not None else int(blk)
        self.device = Hall.device
        self.kept = torch.zeros((), dtype=torch.int64, device=self.device)

    def run(self, out):
        """(A,) int64 ``n_steps`` each: no row left the range; every character's bits marked
        written, once a call (a real run writes them all, so the results come back in one copy)."""
        import torch

        written = getattr(out, "written", None)
        if written is not None and not self.pairs and not getattr(out, "null_written", False):
            written.fill_(True)
            out.null_written = True
        return torch.full((self.A,), self.n_steps, dtype=torch.int64, device=self.device)


def null_max_abs(x, dim: int):
    """``max_abs``'s stand-in: the last column along ``dim`` (``|x|`` there), read instead of the
    reduction. A whole state row ends in its homogeneous 1 and an error row in 0, so a correction
    pair's error has died out at its first check (a model that forgets at once); a row of ``h``
    alone gives ``|h_{d-1}|`` of a state the null steps never moved: within the range."""
    return x.select(dim, -1).abs()


def null_copy_to_host(t, dst) -> None:
    """``copy_to_host``'s stand-in (``_copy_to_host`` in an older isan): the bits' copy from the
    device into the caller's page-locked memory is the device's (its copy engine), left out;
    ``dst`` keeps what it held."""


def null_state_rows(h_d, B: int):
    """``state_rows``'s stand-in: (B, d + 1) rows allocated, not filled (a fill on the device)."""
    import torch

    return torch.empty((B, h_d.shape[1] + 1), dtype=h_d.dtype, device=h_d.device)


def null_first_stops(stops, stopped, Hall, lens_d, limit):
    """``first_stops``' stand-in: no row left the range (reductions on the device)."""
    import torch

    return torch.full((Hall.shape[0],), -1, dtype=torch.int64, device=Hall.device)


#: The torch path's device work, by module: replaced inside :func:`null_device` where present (an
#: older isan has some of these names only: the rows it fills on the host are the host's work).
NULL_PATCHES = {
    "isan.engine.kernels.torch.streams": {"StepBlock": NullStepBlock, "max_abs": null_max_abs,
                                          "copy_to_host": null_copy_to_host, "_copy_to_host": null_copy_to_host},
    "isan.engine.kernels.torch.pipeline": {"StepBlock": NullStepBlock, "max_abs": null_max_abs,
                                           "state_rows": null_state_rows, "first_stops": null_first_stops},
}


@contextlib.contextmanager
def null_device(patches: dict | None = None):
    """Inside it, the torch path's device work takes no time (:data:`NULL_PATCHES`: each module's
    attribute replaced where the module has it); every attribute is put back on the way out, an
    error or not. A benchmark double: never for correctness (see the module docstring).

    Raises:
        ImportError: torch (or a module of ``patches``) cannot be imported.
    """
    saved = []
    try:
        for mod_name, names in (patches or NULL_PATCHES).items():
            mod = importlib.import_module(mod_name)
            for name, null in names.items():
                if hasattr(mod, name):
                    saved.append((mod, name, getattr(mod, name)))
                    setattr(mod, name, null)
        yield [f"{m.__name__}.{n}" for m, n, _ in saved]
    finally:
        for mod, name, orig in reversed(saved):
            setattr(mod, name, orig)


def packed_api() -> bool:
    """Whether the isan imported takes batches packed (:mod:`isan.engine.packed`, and
    ``score_batches`` with ``chunks``), else lists of id arrays with their start states."""
    if importlib.util.find_spec("isan.engine.packed") is None:
        return False
    from isan.engine.batches import score_batches

    return "chunks" in inspect.signature(score_batches).parameters


# ---- what is scored ---------------------------------------------------------------------------

@dataclass
class Inputs:
    """What every row scores: the engine (torch backend), the documents (``docs`` id arrays, views
    of ``doc_ids``, and their (B, d) start states ``hs``), the same as a Packed batch where the API
    has one, the long text as ids and as a str, the documents prepared for the corpus scorer."""

    engine: object
    docs: list
    doc_ids: np.ndarray
    hs: np.ndarray
    packed: object
    long_ids: np.ndarray
    long_text: str
    scorer: object
    prepared: object

    @property
    def doc_chars(self) -> int:
        return int(len(self.doc_ids))


def load_inputs(model: str | None, data: str | Path, device: str, sizes: dict, new_api: bool) -> Inputs:
    """The engine on ``device`` (the torch backend in float32, as ``isan bench gpu`` makes it) and
    the inputs of :data:`ROWS` (``sizes``: docs, doc_chars, long_chars)."""
    from isan.engine.core import Engine
    from isan.engine.corpus.readers import Doc
    from isan.engine.corpus.scoring import DocScorer, ScoreOptions
    from isan.engine.kernels.backends import GPU_BATCH_CHARS
    from isan.engine.paths import default_model_path

    eng = Engine.load(model or default_model_path(), progress_bar=False, device=device, dtype="float32",
                      kernels="torch")
    text = Path(data).read_text(encoding="utf-8", errors="replace")
    long_text = text[: sizes["long_chars"]] if sizes.get("long_chars") else text
    long_ids = np.asarray(eng.prepare(long_text).ids)
    D, C = int(sizes["docs"]), int(sizes["doc_chars"])
    narrow = np.uint8 if len(eng.alphabet) <= 256 else np.int32
    doc_ids = np.resize(long_ids, D * C).astype(narrow)  # the text's ids end to end, repeated, cut every C
    docs = [doc_ids[i * C : (i + 1) * C] for i in range(D)]
    hs = np.tile(eng.params.h0, (D, 1))
    packed = None
    if new_api:
        from isan.engine.packed import Packed

        packed = Packed.from_bounds(doc_ids, np.arange(D + 1, dtype=np.int64) * C)
    reps = -(-D * C // len(long_text))
    big = long_text * reps
    scorer = DocScorer(eng, ScoreOptions(batch_chars=GPU_BATCH_CHARS))  # a GPU's batches, on any device
    prepared = scorer.prepare([Doc(i, f"doc-{i}", big[i * C : (i + 1) * C]) for i in range(D)])
    return Inputs(eng, docs, doc_ids, hs, packed, long_ids, long_text, scorer, prepared)


def row_calls(inp: Inputs, n_batches: int, new_api: bool) -> dict:
    """{row key: (characters, the call)} of :data:`ROWS` on this API."""
    from isan.engine.batches import score_batches

    eng = inp.engine
    if new_api:  # each document's total only: the final states left on the device where the API allows
        kw = {"finals": False} if "finals" in inspect.signature(score_batches).parameters else {}
        one = lambda: list(score_batches(eng, [(inp.packed, None)], want="totals", chunks="none", **kw))  # noqa: E731
        many = lambda: list(score_batches(eng, [(inp.packed, None)] * n_batches, want="totals",  # noqa: E731
                                          chunks="none", **kw))
    else:
        one = lambda: eng.score_ids(inp.docs, inp.hs, chunks="none", want_bits="totals")  # noqa: E731
        many = lambda: list(score_batches(eng, [(inp.docs, inp.hs)] * n_batches, want="totals"))  # noqa: E731
    return {"docs_one_call": (inp.doc_chars, one),
            "docs_batches": (n_batches * inp.doc_chars, many),
            "long_prep": (len(inp.long_ids), lambda: long_preparation(eng, inp.long_ids, new_api)),
            "long_ids": (len(inp.long_ids), lambda: eng.score(inp.long_ids)),
            "long_str": (len(inp.long_ids), lambda: eng.score(inp.long_text)),
            "corpus": (inp.prepared.chars, lambda: inp.scorer.score_prepared(inp.prepared))}


def long_preparation(eng, ids: np.ndarray, new_api: bool):
    """What a call on the long text given as ids does on the host before the kernels: the text
    prepared (``Engine.prepare``: checked, and in an older isan decoded back to text) and made the
    batch the kernels read (a :class:`~isan.engine.packed.Packed` of it; before it, the ids joined
    into one int32 array)."""
    prep = eng.prepare(ids)
    if new_api:
        from isan.engine.packed import Packed

        checked = "below" in inspect.signature(Packed.of).parameters  # as Engine.score packs them
        return Packed.of([prep.ids], below=len(eng.alphabet)) if checked else Packed.of([prep.ids])
    from isan.engine.kernels.chunked import concat_ids  # an older isan's join

    return concat_ids([prep.ids])


ROW_NAMES = {
    "docs_one_call": "{docs:,} documents x {doc_chars}, one call (totals)",
    "docs_batches": "{batches} such batches, score_batches (totals)",
    "long_prep": "long text ({long:,} chars) as ids: the host's preparation (Engine.prepare, the batch made)",
    "long_ids": "long text ({long:,} chars) as ids: Engine.score",
    "long_str": "long text ({long:,} chars) as a str: Engine.score",
    "corpus": "corpus scoring process: DocScorer.score_prepared ({docs:,} documents)",
}


def measure(model: str | None, data: str | Path, device: str = "cpu", sizes: dict | None = None,
            profile: bool = False, log=print) -> dict:
    """The rows of :data:`ROWS` on the isan imported, with the null device: medians of
    ``sizes["repeats"]`` timings after one untimed run; ``profile``: cProfile's top functions of
    one more run of each row. On the CPU device torch runs one thread meanwhile
    (:data:`CPU_TORCH_THREADS`). Returns a JSON-ready dict (``rows``: {key: row}).

    Raises:
        BackendUnavailableError: no such device, or no torch.
    """
    import isan
    import torch
    from isan.bench.common import machine
    from isan.engine.paths import default_model_path

    sz = {**SIZES, **(sizes or {})}
    new_api = packed_api()
    inp = load_inputs(model, data, device, sz, new_api)
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(CPU_TORCH_THREADS)
    try:
        # the null device's values are not scores (its bits are whatever the buffers held): sums of them
        # may be anything, and say nothing
        with null_device() as patched, np.errstate(invalid="ignore", over="ignore"):
            rows, profiles = time_rows(inp, sz, new_api, profile, log)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    eng = inp.engine
    out = {"api": "packed" if new_api else "lists", "isan": str(Path(isan.__file__).resolve().parent),
           "revision": revision(Path(isan.__file__).resolve().parent), "machine": machine(),
           "model": {"source": str(model or default_model_path()), "params_sha256": eng.params_sha256, "d": eng.d,
                     "V": len(eng.alphabet)},
           "engine": eng.describe(), "torch": {"version": torch.__version__, "threads": used},
           "null_device": patched, "sizes": sz, "rows": rows}
    if profile:
        out["profiles"] = profiles
    return out


def time_rows(inp: Inputs, sz: dict, new_api: bool, profile: bool, log) -> tuple[dict, dict]:
    """({row key: row}, {row key: cProfile's table} where ``profile``): each row's median of
    ``sz["repeats"]`` timings after one untimed run (first-call costs: the weights to the device)."""
    from isan.bench.common import median_time

    names = {"docs": sz["docs"], "doc_chars": sz["doc_chars"], "batches": sz["batches"], "long": len(inp.long_ids)}
    rows, profiles = {}, {}
    for key, (chars, fn) in row_calls(inp, int(sz["batches"]), new_api).items():
        fn()
        sec, times = median_time(fn, int(sz["repeats"]))
        rows[key] = {"name": ROW_NAMES[key].format(**names), "chars": int(chars), "seconds": sec, "times": times,
                     "chars_per_s": chars / sec}
        log(f"  {rows[key]['name']}: {chars / sec / 1e6:,.1f}M chars/s ({sec * 1e3:,.1f} ms)")
        if profile:
            profiles[key] = host_profile(fn)
    return rows, profiles


def host_profile(fn, rows: int = 25) -> str:
    """cProfile's top ``rows`` functions of one call of ``fn``, by internal time."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(rows)
    return "\n".join(line for line in buf.getvalue().splitlines() if line.strip())[-8000:]


def revision(folder: Path) -> str | None:
    """The git commit of the checkout ``folder`` (an isan package) is in, or was installed from (its
    ``isan-*.dist-info/direct_url.json`` names a local folder), ``+`` where it has changes; else None."""
    for info in sorted(folder.parent.glob("isan-*.dist-info/direct_url.json")):
        try:
            url = json.loads(info.read_text()).get("url", "")
        except (OSError, ValueError):
            continue
        if url.startswith("file://") and Path(url[7:]).is_dir():
            folder = Path(url[7:])
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


# ---- before and after -------------------------------------------------------------------------

def run_before(before: str | Path, model: str | None, data: str | Path, device: str, sizes: dict,
               profile: bool = False, log=print) -> dict:
    """:func:`measure` of the isan installed at ``before`` (a folder holding its ``isan`` package):
    this file run by its path in a subprocess with ``PYTHONPATH=before``.

    Raises:
        IsanError: the subprocess failed (its last lines of output say why).
    """
    from isan.errors import IsanError

    folder = Path(before).resolve()
    if not (folder / "isan").is_dir():
        raise IsanError(f"--before {before}: no isan package there (give the folder that holds it)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "before.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--json", str(out), "--data", str(Path(data).resolve()),
               "--device", device, "--sizes", json.dumps(sizes)] + (["--model", str(model)] if model else []) \
            + (["--profile"] if profile else [])
        env = {**os.environ, "PYTHONPATH": str(folder)}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        for line in proc.stderr.splitlines():
            if line.startswith("  "):
                log(line)
        if proc.returncode or not out.exists():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise IsanError(f"the run of the isan at {folder} failed (exit {proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def compare(before: dict | None, after: dict) -> list[dict]:
    """One line a row: its name, each run's chars/s and seconds, and after/before of chars/s."""
    lines = []
    for key in ROWS:
        a = after["rows"][key]
        b = before["rows"].get(key) if before else None
        lines.append({"key": key, "name": a["name"], "chars": a["chars"], "after_chars_per_s": a["chars_per_s"],
                      "after_seconds": a["seconds"],
                      "before_chars_per_s": b["chars_per_s"] if b else None, "before_seconds": b["seconds"] if b else None,
                      "ratio": a["chars_per_s"] / b["chars_per_s"] if b else None})
    return lines


def targets(lines: list[dict]) -> list[dict]:
    """The targets of :data:`TARGETS` against the measured lines: what, the value, met or not
    (None where the run has no before)."""
    by = {x["key"]: x for x in lines}
    one, corpus = by["docs_one_call"], by["corpus"]
    long_ratio = by["long_prep"]["ratio"] if "long_prep" in by else None
    out = [("documents, one call: chars/s of capacity", one["after_chars_per_s"], TARGETS["docs_one_call"]),
           ("documents, one call: after/before", one["ratio"], TARGETS["docs_one_call_vs_before"]),
           ("long text as ids, the host's preparation: after/before", long_ratio, TARGETS["long_vs_before"]),
           ("corpus scoring process: chars/s", corpus["after_chars_per_s"], TARGETS["corpus"])]
    return [{"what": w, "value": v, "target": t, "met": (v >= t) if v is not None else None} for w, v, t in out]


def bench_host(model: str | None, data: str | Path, device: str = "cpu", sizes: dict | None = None,
               before: str | Path | None = None, profile: bool = False, command: str | None = None, log=print) -> dict:
    """Run the benchmark (the module docstring): the isan at ``before`` first where given (a
    subprocess), then the one imported here. Returns a JSON-ready dict.

    Raises:
        BackendUnavailableError: no such device, or no torch.
        IsanError: the run of ``before`` failed.
    """
    from isan.bench.common import machine
    from isan.engine.kernels.backends import resolve_device

    sz = {**SIZES, **(sizes or {})}
    device = resolve_device(device)
    prior = None
    if before is not None:
        log(f"before: the isan at {before}")
        prior = run_before(before, model, data, device, sz, profile, log)
    log("after: the isan imported here")
    now = measure(model, data, device, sz, profile, log)
    lines = compare(prior, now)
    return {"benchmark": "isan bench host", "machine": machine(), "command": command or " ".join(["isan"] + sys.argv[1:]),
            "model": now["model"], "device": device, "sizes": sz, "lines": lines, "targets": targets(lines),
            "after": now, "before": prior}


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:,.1f}M chars/s"


def markdown(result: dict) -> str:
    """The result as a markdown table: machine and command, then one line a row."""
    m = result["machine"]
    prior, now = result.get("before"), result["after"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores; torch on `{result['device']}` with a device that takes no time",
             f"Command: `{result['command']}` (median of {result['sizes']['repeats']} runs)",
             f"After: {now['api']} batches ({now.get('revision') or now['isan']})"
             + (f"; before: {prior['api']} batches ({prior.get('revision') or prior['isan']})" if prior else ""), "",
             "| row | before | after | after/before |", "|---|---:|---:|---:|"]
    for x in result["lines"]:
        n = result["sizes"]["batches"] if x["key"] == "docs_batches" else 1
        ms = lambda s: "" if s is None else f" ({s * 1e3 / n:,.1f} ms{' a batch' if n > 1 else ''})"  # noqa: E731
        ratio = "-" if x["ratio"] is None else f"{x['ratio']:.2f}x"
        lines.append(f"| {x['name']} | {_rate(x['before_chars_per_s'])}{ms(x['before_seconds'])} | "
                     f"{_rate(x['after_chars_per_s'])}{ms(x['after_seconds'])} | {ratio} |")
    lines += ["", "| target | measured | wanted | met |", "|---|---:|---:|---|"]
    for t in result["targets"]:
        fmt = (lambda v: _rate(v)) if t["target"] > 1000 else (lambda v: "-" if v is None else f"{v:.2f}x")
        met = "-" if t["met"] is None else ("yes" if t["met"] else "no")
        lines.append(f"| {t['what']} | {fmt(t['value'])} | {fmt(t['target'])} | {met} |")
    for tag, run in (("before", prior), ("after", now)):
        for key, table in ((run or {}).get("profiles") or {}).items():
            lines += ["", f"Where the host's time goes ({tag}, {run['rows'][key]['name']}; cProfile, one run):", "",
                      "```", table, "```"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run by its path (how ``--before`` runs an older isan): :func:`measure`, its JSON to ``--json``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="write the measurements here")
    p.add_argument("--data", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--sizes", default="{}", help="a JSON object over SIZES")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    result = measure(a.model, a.data, a.device, json.loads(a.sizes), a.profile,
                     log=lambda m: print(m, file=sys.stderr, flush=True))
    Path(a.json).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
