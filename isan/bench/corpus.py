"""``isan bench corpus``: the corpus job's speed, local runner vs Ray on a local 2-node cluster vs KenLM.

The corpus is made from the shared data: WikiText-2 (valid, test), Tiny Shakespeare and text8 beyond
offset 10,000,000 (unseen by the model), cut into documents whose lengths are drawn from a
log-normal (median about 2,000 characters, clipped to 100-100,000, like web pages), passing over
the texts again from new random offsets until the corpus holds ``mb`` MB; it is written once as
JSONL shards into the cache (``$ISAN_CACHE_DIR/bench/corpus-...``). Then, in one process:

1. the local executor (``score_corpus(executor="local")``), all cores of this machine;
2. the Ray runner on a cluster this benchmark starts here (``ray start --head`` and a second node
   joined to it, ``cpus_per_node`` CPUs each), checked to write exactly the local runner's files;
   the cluster is stopped afterwards (its processes killed by process group);
3. KenLM's Python module scoring the same documents with our order-8 n-gram exported as ARPA
   (the text8 train split, as ``isan bench engine``), one document a ``Model.score`` call, one thread,
   after the same normalisation (the time includes normalising and joining the characters as words,
   not reading the JSON).

docs/s and chars/s count the characters read; Ray's overhead over local is stated as the ratio of times.

With ``workers`` (``--workers 1,2``), a scaling table (issue 36): the local runner with each number
of worker processes of one kernel thread each, and KenLM with as many processes, each scoring its
share of the documents; chars/s, the speed-up against one worker, isan's ratio to KenLM at the same
count, the share of the wall time the driver was busy (reading, cutting and writing: the serial
part), and the serial fraction s that Amdahl's law gives from the speed-up at N (S = 1 / (s + (1 -
s) / N)), with what that s predicts for 16 cores.

:func:`bench_readers` (``python -m isan.bench.corpus DATA_DIR --readers 1,2,4``) times the reading side
of a one-process (GPU) job alone: the corpus in zstd, read, decompressed, parsed, normalised and mapped
to ids by N reader processes (:mod:`isan.engine.corpus.feed`) feeding a scorer whose device takes no time
(its parts written with zero bits): the most characters a second the readers hand a GPU here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from isan.bench.common import machine, write_json
from isan.bench.sweep import amdahl
from isan.bench.serve_process import free_port


def _sources(data_dir: Path) -> list[tuple[str, str]]:
    out = []
    for name, path in (("wikitext2", data_dir / "wikitext2" / "valid.txt"), ("wikitext2", data_dir / "wikitext2" / "test.txt"),
                       ("tinyshakespeare", data_dir / "tinyshakespeare" / "input.txt")):
        if path.is_file():
            out.append((name, path.read_text(encoding="utf-8")))
    t8 = data_dir / "text8_head" / "text8_head.txt"
    if t8.is_file():
        from isan.data import read_text8_split

        out.append(("text8-unseen", read_text8_split(t8, "unseen")))
    if not out:
        from isan.errors import IsanError

        raise IsanError(f"no shared data under {data_dir} (wikitext2/, tinyshakespeare/, text8_head/)")
    return out


def make_corpus(data_dir: str | Path, mb: float, files: int = 8, seed: int = 0, cache: Path | None = None) -> Path:
    """Write (once) a JSONL corpus of about ``mb`` MB in ``files`` shards; returns its directory."""
    from isan.trie_tables.build import cache_dir

    cache = cache or cache_dir() / "bench"
    d = cache / f"corpus-{mb:g}mb-{files}f-s{seed}"
    if (d / "DONE").is_file():
        return d
    srcs = _sources(Path(data_dir))
    rng = np.random.default_rng(seed)
    tmp = Path(tempfile.mkdtemp(prefix=".corpus-", dir=cache if cache.exists() else None))
    cache.mkdir(parents=True, exist_ok=True)
    target = int(mb * 1_000_000)
    written, n = 0, 0
    fs = [open(tmp / f"docs-{k:02d}.jsonl", "w", encoding="utf-8") for k in range(files)]
    try:
        while written < target:
            name, text = srcs[int(rng.integers(len(srcs)))]
            length = int(np.clip(rng.lognormal(np.log(2000), 1.0), 100, 100_000))
            start = int(rng.integers(0, max(1, len(text) - length)))
            doc = text[start : start + length]
            line = json.dumps({"id": f"{name}-{n}", "source": name, "text": doc}, ensure_ascii=False) + "\n"
            fs[n % files].write(line)
            written += len(line.encode("utf-8"))
            n += 1
    finally:
        for f in fs:
            f.close()
    (tmp / "DONE").write_text(json.dumps({"documents": n, "bytes": written}) + "\n")
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    return d


class LocalCluster:
    """``ray start --head`` plus more nodes on this machine; stopped by killing their process groups.

    Args:
        cpus_per_node, nodes: the cluster's shape.
        object_store_bytes: each node's object store.
        env: more environment for the nodes (RAY_ADDRESS is dropped: the cluster is this one).
        min_nodes: the fewest nodes that make a cluster (default ``nodes``); a later node that fails
            to start below ``nodes`` is tolerated down to it (``self.nodes`` says how many started).
        timeout: seconds for each ``ray start``.
    Raises:
        RuntimeError: the head, or too many of the other nodes, did not start (all are stopped).
    """

    def __init__(self, cpus_per_node: int = 1, nodes: int = 2, object_store_bytes: int = 100_000_000,
                 env: dict | None = None, min_nodes: int | None = None, timeout: float = 180):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.groups: list[int] = []
        self.nodes = 0
        self.timeout = timeout
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", **(env or {})}
        self.env.pop("RAY_ADDRESS", None)
        common = [f"--num-cpus={cpus_per_node}", f"--object-store-memory={object_store_bytes}", "--disable-usage-stats"]
        try:
            self._start(["ray", "start", "--head", f"--port={self.port}", "--include-dashboard=false", *common])
            failed = None
            for _ in range(nodes - 1):
                try:
                    self._start(["ray", "start", f"--address={self.address}", *common])
                except RuntimeError as e:
                    failed = e
            if failed is not None and self.nodes < (nodes if min_nodes is None else min_nodes):
                raise failed
        except BaseException:
            self.stop()
            raise

    def _start(self, cmd):
        p = subprocess.Popen(cmd, env=self.env, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.groups.append(p.pid)
        out, _ = p.communicate(timeout=self.timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])} failed: {out[-400:]}")
        self.nodes += 1

    def _alive(self) -> bool:
        for g in self.groups:
            try:
                os.killpg(g, 0)
                return True
            except (ProcessLookupError, PermissionError):
                pass
        return False

    def stop(self):
        """SIGTERM, then SIGKILL, to every node's process group (up to 2 s each until none is left)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for g in self.groups:
                try:
                    os.killpg(g, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.time() + 2
            while self._alive() and time.time() < deadline:
                time.sleep(0.2)
            if not self._alive():
                break
        cur = Path("/tmp/ray/ray_current_cluster")
        try:
            if cur.read_text().strip().endswith(f":{self.port}"):
                cur.unlink()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _kenlm_model(data_dir: Path, log):
    import hashlib

    import kenlm

    from isan.alphabet import Alphabet
    from isan.data import read_text8_split
    from isan.export.arpa import write_arpa
    from isan.train.ngram import fit
    from isan.trie_tables.build import cache_dir

    a = Alphabet.text8()
    train = read_text8_split(data_dir / "text8_head" / "text8_head.txt", "train")
    key = hashlib.sha256(train.encode()).hexdigest()[:16]
    err = None
    for order in (8, 6):  # KenLM's PyPI build stops at order 6 unless built with MAX_ORDER=8
        path = cache_dir() / "bench" / f"text8-train-{key}-order{order}.arpa"  # shared with `isan bench engine`
        if not path.is_file():
            log(f"  counting the order-{order} n-gram and writing it as ARPA (once; cached)")
            write_arpa(fit(a.encode(train), 27, order), a, path)
        try:
            return kenlm.Model(str(path)), order, err
        except (OSError, RuntimeError) as e:
            err = (f"this KenLM build cannot load order {order} ({str(e).splitlines()[0][:100]}); "
                   "MAX_ORDER=8 pip install --no-cache-dir --force-reinstall kenlm builds one that can")
            log(f"  {err}")
    raise RuntimeError(err)


def bench_corpus(data_dir: str | Path, mb: float = 50.0, files: int = 8, cpus_per_node: int = 1,
                 threads: int | None = None, ray: bool = True, kenlm: bool = True, log=print,
                 work_dir: str | Path | None = None, workers: list[int] | None = None) -> dict:
    from isan.engine.corpus import read_output, score_corpus
    from isan.engine.corpus.job import load_corpus_engine

    data_dir = Path(data_dir)
    t0 = time.perf_counter()
    corpus = make_corpus(data_dir, mb, files)
    meta = json.loads((corpus / "DONE").read_text())
    log(f"corpus: {meta['documents']:,} documents, {meta['bytes'] / 1e6:.1f} MB in {files} JSONL files "
        f"({corpus}; made in {time.perf_counter() - t0:.1f} s)")
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="isan-bench-corpus-"))
    rows, facts = [], {}
    engine = load_corpus_engine(None)
    try:
        out_local = work / "local"
        shutil.rmtree(out_local, ignore_errors=True)
        t = time.perf_counter()
        s = score_corpus([str(corpus / "*.jsonl")], out_local, progress=False, engine=engine, threads=threads)
        dt = time.perf_counter() - t
        rows.append({"name": f"isan, local runner ({s['this_run']['threads']} threads)", "seconds": dt,
                     "documents": s["documents"], "chars": s["chars_read"], "docs_per_s": s["documents"] / dt,
                     "chars_per_s": s["chars_read"] / dt, "bpc": s["bpc"]})
        log(f"  local: {dt:.1f} s, {s['documents'] / dt:,.0f} docs/s, {s['chars_read'] / dt:,.0f} chars/s")
        facts["errors"] = s["errors"]
        if ray:
            try:
                with LocalCluster(cpus_per_node=cpus_per_node, nodes=2) as cl:
                    out_ray = work / "ray"
                    shutil.rmtree(out_ray, ignore_errors=True)
                    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
                    t = time.perf_counter()
                    sr = score_corpus([str(corpus / "*.jsonl")], out_ray, progress=False, executor="ray",
                                      ray_address=cl.address, ray_cpus_per_actor=cpus_per_node)
                    dt_ray = time.perf_counter() - t
                    same = read_output(out_local).equals(read_output(out_ray))
                    rows.append({"name": f"isan, Ray runner ({cl.nodes} nodes x {cpus_per_node} CPU, "
                                         f"{sr['this_run']['actors']} actors)", "seconds": dt_ray,
                                 "documents": sr["documents"], "chars": sr["chars_read"],
                                 "docs_per_s": sr["documents"] / dt_ray, "chars_per_s": sr["chars_read"] / dt_ray,
                                 "bpc": sr["bpc"]})
                    facts["ray_identical_to_local"] = bool(same)
                    facts["ray_over_local_time"] = dt_ray / dt
                    log(f"  ray: {dt_ray:.1f} s, {sr['documents'] / dt_ray:,.0f} docs/s, "
                        f"{sr['chars_read'] / dt_ray:,.0f} chars/s; identical output: {same}")
            except (ImportError, RuntimeError, subprocess.TimeoutExpired) as e:
                facts["ray"] = f"not run: {e}"
                log(f"  ray: not run ({e})")
        if kenlm:
            try:
                rows.append(_bench_kenlm_docs(corpus, engine, data_dir, log))
            except ImportError:
                facts["kenlm"] = "not run: the kenlm module is not installed (MAX_ORDER=8 pip install kenlm)"
            except (OSError, RuntimeError) as e:
                facts["kenlm"] = f"not run: {str(e).splitlines()[0][:200]} (MAX_ORDER=8 pip install --force-reinstall kenlm)"
        if workers:
            facts["scaling"] = _scaling(corpus, work, workers, kenlm and "kenlm" not in facts, data_dir, out_local, log)
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
    from isan.engine.corpus.scoring import corpus_path

    facts["kernel"] = corpus_path(engine)
    return {"benchmark": "corpus", "machine": machine(), "command": " ".join(["isan"] + sys.argv[1:]),
            "corpus": {"path": str(corpus), **meta, "files": files}, "rows": rows, "facts": facts,
            "model": engine.params_sha256}


def _scaling(corpus: Path, work: Path, workers: list[int], with_kenlm: bool, data_dir: Path, reference_out: Path,
             log) -> list[dict]:
    """The scaling table's rows (see the module docstring); each run's files are checked equal to
    ``reference_out``'s (the local runner's)."""
    from isan.engine.corpus import read_output, score_corpus

    docs = _docs(corpus) if with_kenlm else None
    arpa = _kenlm_model(data_dir, log)[0].path if with_kenlm else None
    out, base = [], {}
    for n in workers:
        dst = work / f"workers-{n}"
        shutil.rmtree(dst, ignore_errors=True)
        t = time.perf_counter()
        s = score_corpus([str(corpus / "*.jsonl")], dst, progress=False, workers=n, threads=1)
        dt = time.perf_counter() - t
        run = s["this_run"]
        row = {"workers": n, "threads": 1, "seconds": dt, "chars": s["chars_read"], "chars_per_s": s["chars_read"] / dt,
               "identical": bool(read_output(dst).equals(read_output(reference_out))),
               "driver_busy_share": run.get("driver_busy_seconds", 0.0) / dt if n > 1 else None}
        shutil.rmtree(dst, ignore_errors=True)
        if with_kenlm:
            k = _kenlm_processes(docs, arpa, n)
            row.update(kenlm_seconds=k, kenlm_chars_per_s=s["chars_read"] / k)
            row["isan_over_kenlm"] = row["chars_per_s"] / row["kenlm_chars_per_s"]
        base = base or row
        row["speedup"] = row["chars_per_s"] / base["chars_per_s"]
        row.update(amdahl(n / base["workers"], row["speedup"], 16 / base["workers"]))
        out.append(row)
        log(f"  {n} worker(s): {row['chars_per_s']:,.0f} chars/s ({row['speedup']:.2f}x), identical: {row['identical']}"
            + (f"; KenLM {n} process(es): {row['kenlm_chars_per_s']:,.0f}" if with_kenlm else ""))
    return out


def _docs(corpus: Path) -> list[str]:
    docs = []
    for f in sorted(corpus.glob("*.jsonl")):
        for line in open(f, encoding="utf-8"):
            docs.append(json.loads(line)["text"])
    return docs


_KENLM = None


def _kenlm_init(arpa: str) -> None:
    global _KENLM
    import kenlm

    from isan.engine.core import Engine
    from isan.export.arpa import symbol_words

    eng = Engine.default(path_mode="reference")
    _KENLM = (kenlm.Model(arpa), eng, np.array(symbol_words(eng.alphabet.symbols), dtype=object))


def _kenlm_share(docs: list[str]) -> float:
    """Seconds one KenLM process takes to normalise and score its documents (as the 1-thread row)."""
    m, eng, words = _KENLM
    t = time.perf_counter()
    for doc in docs:
        ids = eng.prepare(doc).ids
        if len(ids):
            m.score(" ".join(words[ids]), bos=False, eos=False)
    return time.perf_counter() - t


def _kenlm_processes(docs: list[str], arpa: str, n: int) -> float:
    """KenLM one process a core: ``n`` processes (each loads the model first, not timed), each
    scoring every n-th document; the wall time is the slowest one's."""
    import concurrent.futures as cf
    import multiprocessing

    with cf.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"), initializer=_kenlm_init,
                                initargs=(arpa,)) as ex:
        list(ex.map(_kenlm_share, [[]] * n))  # load the model in every process
        return max(ex.map(_kenlm_share, [docs[k::n] for k in range(n)]))


def _bench_kenlm_docs(corpus: Path, engine, data_dir: Path, log) -> dict:
    from isan.export.arpa import symbol_words

    m, order, note = _kenlm_model(data_dir, log)
    docs = _docs(corpus)
    words = np.array(symbol_words(engine.alphabet.symbols), dtype=object)
    t = time.perf_counter()
    total, chars, read = 0.0, 0, 0
    for doc in docs:
        ids = engine.prepare(doc).ids
        if not len(ids):
            continue
        total += m.score(" ".join(words[ids]), bos=False, eos=False)
        chars += len(ids)
        read += len(doc)
    dt = time.perf_counter() - t
    bpc = -total * np.log2(10.0) / chars
    log(f"  KenLM: {dt:.1f} s, {len(docs) / dt:,.0f} docs/s, {read / dt:,.0f} chars/s, {bpc:.4f} bpc")
    return {"name": f"KenLM (Python module), our order-{order} n-gram as ARPA, 1 thread", "seconds": dt,
            "documents": len(docs), "chars": read, "docs_per_s": len(docs) / dt, "chars_per_s": read / dt, "bpc": bpc,
            "note": note}


def markdown(result: dict) -> str:
    m, c = result["machine"], result["corpus"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}",
             f"Command: `{result.get('command', 'isan bench corpus')}`  (one run of each; the kernel: "
             f"{result['facts'].get('kernel', '?')})",
             f"Corpus: {c['documents']:,} documents, {c['bytes'] / 1e6:.1f} MB of JSONL in {c['files']} files", "",
             "| runner | seconds | docs/s | chars/s | bpc |", "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {r['seconds']:.1f} | {r['docs_per_s']:,.0f} | {r['chars_per_s']:,.0f} | "
                     f"{r['bpc']:.4f} |")
    f = result["facts"]
    if "ray_over_local_time" in f:
        lines += ["", f"Ray took {f['ray_over_local_time']:.2f}x the local runner's time on this machine; "
                      f"its output was {'identical' if f['ray_identical_to_local'] else 'NOT identical'} to the local runner's."]
    for k in ("ray", "kenlm"):
        if k in f:
            lines.append(f"{k}: {f[k]}")
    if f.get("scaling"):
        kl = "kenlm_chars_per_s" in f["scaling"][0]
        lines += ["", "Scaling (worker processes of 1 kernel thread each"
                  + ("; KenLM: as many processes, one a share of the documents)" if kl else ")"), "",
                  "| workers | chars/s | speed-up | same files | driver busy | Amdahl serial fraction | "
                  "predicted 16 cores |" + (" KenLM chars/s | isan / KenLM |" if kl else ""),
                  "|---:|---:|---:|---|---:|---:|---:|" + ("---:|---:|" if kl else "")]
        for r in f["scaling"]:
            busy = f"{r['driver_busy_share']:.1%}" if r.get("driver_busy_share") is not None else "-"
            sf = f"{r['amdahl_serial_fraction']:.1%}" if "amdahl_serial_fraction" in r else "-"
            p16 = f"{r['predicted_speedup_16']:.1f}x" if r.get("predicted_speedup_16") else "-"
            lines.append(f"| {r['workers']} | {r['chars_per_s']:,.0f} | {r['speedup']:.2f}x | "
                         f"{'yes' if r['identical'] else 'NO'} | {busy} | {sf} | {p16} |"
                         + (f" {r['kenlm_chars_per_s']:,.0f} | {r['isan_over_kenlm']:.2f} |" if kl else ""))
    return "\n".join(lines)


class _NoDevice:
    """A scorer whose device takes no time: each part's rows with their counts and zero bits
    (``PreparedDocs.rows_without_bits``), so that a run measures the reading side alone."""

    def __init__(self, engine):
        self.engine = engine

    def score(self, docs: list) -> list[dict]:
        from isan.engine.corpus.prepared import prepare_docs
        return prepare_docs(self.engine, docs).rows_without_bits()

    def score_prepared(self, prepared) -> list[dict]:
        return prepared.rows_without_bits()


def zstd_corpus(corpus: Path) -> Path:
    """The corpus's JSONL files compressed with zstd (level 3), beside it (made once)."""
    import zstandard

    d = corpus.parent / (corpus.name + "-zst")
    if (d / "DONE").is_file():
        return d
    tmp = Path(tempfile.mkdtemp(prefix=".zst-", dir=corpus.parent))
    for f in sorted(corpus.glob("*.jsonl")):
        (tmp / (f.name + ".zst")).write_bytes(zstandard.ZstdCompressor(level=3).compress(f.read_bytes()))
    (tmp / "DONE").write_text("{}\n")
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    return d


def bench_readers(data_dir: str | Path, mb: float = 50.0, files: int = 16, readers: list[int] | None = None,
                  in_process: bool = True, log=print, work_dir: str | Path | None = None, repeats: int = 1,
                  before: str | None = None) -> dict:
    """The reading side of a one-process (GPU) job alone (see the module docstring): for each count
    of readers (0: in this process) the best of ``repeats`` runs (:func:`_readers_run`), each run's
    files checked equal to the first's, and one reader's work (:func:`_reader_alone`); with
    ``before`` (an older isan's ``site-packages``) both isans, each run in a fresh process, in turns
    (``result["before"]``, with the ratios of the rates)."""
    from isan.engine.corpus.parts import JobConfig, load_corpus_engine

    corpus = make_corpus(Path(data_dir), mb, files)
    meta, zst = json.loads((corpus / "DONE").read_text()), zstd_corpus(corpus)
    paths = sorted(str(p) for p in zst.glob("*.zst"))
    zbytes = sum(os.path.getsize(p) for p in paths)
    log(f"corpus: {meta['documents']:,} documents, {meta['bytes'] / 1e6:.1f} MB of JSONL in {files} files, "
        f"{zbytes / 1e6:.1f} MB zstd ({zst})")
    cfg = JobConfig(params_sha256=(engine := load_corpus_engine(None)).params_sha256)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="isan-bench-readers-"))
    site = str(Path(__file__).resolve().parents[2])  # where this isan imports from
    counts, runs, old, alone = ([0] if in_process else []) + list(readers or [1, 2]), [], [], {site: [], before: []}
    try:
        for _ in range(max(1, repeats)):
            for s in ([before] if before else []) + [site]:
                alone[s].append(_reader_alone(s, paths, work))
            if before:  # the two in fresh processes, in turns
                old.append(_bench_process(before, data_dir, mb, files, readers or [1, 2], in_process, work))
                runs += _bench_process(site, data_dir, mb, files, readers or [1, 2], in_process, work)["rows"]
            else:
                runs += [_readers_run(engine, cfg, paths, work, n) for n in counts]
        rows, first = _best(runs), runs[0].get("files")
        for r in rows:
            r["identical"] = r.pop("files") == first if first is not None else r["identical"]
            log(f"  readers {r['readers']}: {r['seconds']:.2f} s, {r['chars_per_s']:,.0f} chars/s")
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
    fastest = {s: min(a, key=lambda x: x["seconds"]) for s, a in alone.items() if a}
    out = {"benchmark": "corpus-readers", "machine": machine(), "command": " ".join(["python -m isan.bench.corpus"]
           + sys.argv[1:]), "corpus": {"path": str(zst), **meta, "files": files, "zstd_bytes": zbytes}, "rows": rows,
           "reader_alone": fastest[site], "repeats": max(1, repeats), "model": engine.params_sha256}
    if old:
        b = _best([r for run in old for r in run["rows"]])
        ratio = {r["readers"]: r["chars_per_s"] / o["chars_per_s"] for r in rows for o in b if o["readers"] == r["readers"]}
        out["before"] = {"site": before, "rows": b, "ratio": ratio, "reader_alone": fastest[before],
                         "reader_alone_ratio": fastest[site]["chars_per_s"] / fastest[before]["chars_per_s"]}
    return out


def _best(rows: list[dict]) -> list[dict]:
    """The fastest row of each count of readers, in the order the counts first came."""
    best: dict[int, dict] = {}
    for r in rows:
        best[r["readers"]] = min(best.get(r["readers"], r), r, key=lambda x: x["seconds"])
    return list(best.values())


def _readers_run(engine, cfg, paths: list[str], work: Path, n: int) -> dict:
    """One run of the reading side with ``n`` readers (0: in this process): its row, with its files."""
    from isan.engine.corpus.feed import run_readers
    from isan.engine.corpus.parts import process_file

    shutil.rmtree((shards := work / f"readers-{n}" / "shards").parent, ignore_errors=True)
    shards.mkdir(parents=True)
    t = time.perf_counter()
    recs, facts = (([process_file(_NoDevice(engine), cfg, p, shards) for p in paths], {}) if n == 0
                   else run_readers(paths, cfg, shards, _NoDevice(engine), n))
    dt, chars, received = time.perf_counter() - t, sum(r["chars_read"] for r in recs), facts.get("unpickling_seconds")
    return {"readers": n, "seconds": dt, "chars": chars, "chars_per_s": chars / dt, "chars_per_s_per_reader":
            chars / dt / max(n, 1), "first_part_seconds": facts.get("first_part_seconds"), "scorer_wait_seconds":
            facts.get("wait_seconds"), "parts": facts.get("parts"), "receiving_seconds": received,
            "receiving_chars_per_s": chars / received if received else None, "scoring_seconds":
            facts.get("scoring_seconds"), "writing_seconds": facts.get("writing_seconds"),
            "files": {q.name: q.read_bytes() for q in sorted(shards.iterdir())}}


def _reader_alone(site: str, paths: list[str], work: Path) -> dict:
    """One reader's work on ``paths`` (:func:`~isan.engine.corpus.reader_timing.time_reader`, its file
    run by path) by the isan that ``site`` holds, in a fresh process."""
    from isan.engine.corpus import reader_timing

    got = subprocess.run([sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')",
                          reader_timing.__file__, json.dumps(paths), str(work)], cwd=work, check=True,
                         env={**os.environ, "PYTHONPATH": site}, capture_output=True, text=True)
    return json.loads(got.stdout.splitlines()[-1])


def _bench_process(site: str, data_dir, mb: float, files: int, readers: list[int], in_process: bool, work: Path) -> dict:
    """The JSON of this benchmark run by the isan that ``site`` holds, in a fresh process, from an empty folder."""
    (cwd := work / "elsewhere").mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "isan.bench.corpus", str(Path(data_dir).resolve()), "--readers",
                    ",".join(map(str, readers)), "--mb", f"{mb:g}", "--files", str(files), "--out", "run.json"]
                   + ([] if in_process else ["--no-in-process"]), cwd=cwd, env={**os.environ, "PYTHONPATH": site},
                   check=True, capture_output=True, text=True)
    return json.loads((cwd / "run.json").read_text())


def readers_markdown(result: dict) -> str:
    m, c, a = result["machine"], result["corpus"], result["reader_alone"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}",
             f"Command: `{result['command']}`  (the best of {result.get('repeats', 1)} run(s) of each; the device "
             "takes no time: the reading side alone)",
             f"Corpus: {c['documents']:,} documents, {c['bytes'] / 1e6:.1f} MB of JSONL in {c['files']} zstd files "
             f"({c['zstd_bytes'] / 1e6:.1f} MB)", "",
             "| readers | seconds | chars/s | chars/s a reader | first part after | scorer waited after it | "
             "scorer received at | same files |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        fp, w, rc = r["first_part_seconds"], r["scorer_wait_seconds"], r.get("receiving_chars_per_s")
        lines.append(f"| {r['readers'] or '0 (in process)'} | {r['seconds']:.2f} | {r['chars_per_s']:,.0f} | "
                     f"{r['chars_per_s_per_reader']:,.0f} | {'-' if fp is None else f'{fp:.2f} s'} | "
                     f"{'-' if w is None else f'{w:.2f} s'} | {f'{rc:,.0f} chars/s' if rc else '-'} | "
                     f"{'yes' if r['identical'] else 'NO'} |")
    lines += ["", f"One reader's work in one process (read, decompress, parse, prepare, hand over): "
                  f"{a['chars_per_s']:,.0f} chars/s ({a['seconds']:.2f} s)"]
    if b := result.get("before"):
        lines += ["", f"The older isan ({b['site']}), the same command:", "",
                  f"- one reader's work: {b['reader_alone']['chars_per_s']:,.0f} chars/s; this one "
                  f"{b['reader_alone_ratio']:.2f}x"] + [
            f"- readers {r['readers']}: {r['chars_per_s']:,.0f} chars/s ({r['seconds']:.2f} s); this one "
            f"{b['ratio'][r['readers']]:.2f}x" for r in b["rows"] if r["readers"] in b["ratio"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python -m isan.bench.corpus DATA_DIR --readers 1,2,4 [--mb 50] [--files 16] [--repeats N]
    [--before SITE] [--out JSON]``: :func:`bench_readers`, its table on stdout."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m isan.bench.corpus", description=bench_readers.__doc__)
    ap.add_argument("data_dir", help="the shared data (wikitext2/, tinyshakespeare/, text8_head/)")
    ap.add_argument("--readers", default="1,2", help="reader counts, comma-separated (default 1,2)")
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--no-in-process", dest="in_process", action="store_false", help="no run in this process")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each count; the fastest is kept (default 1)")
    ap.add_argument("--before", default=None, metavar="SITE",
                    help="also run an older isan installed in SITE (its site-packages), in turns with this one")
    ap.add_argument("--out", default=None, help="also write the result as JSON here")
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.readers.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        ap.error("--readers takes counts of at least 1, e.g. 1,2,4")
    r = bench_readers(a.data_dir, mb=a.mb, files=a.files, readers=counts, in_process=a.in_process,
                      log=lambda m: print(m, file=sys.stderr), repeats=a.repeats, before=a.before)
    if a.out:
        write_json(r, a.out)
    print(readers_markdown(r))


if __name__ == "__main__":
    main()
