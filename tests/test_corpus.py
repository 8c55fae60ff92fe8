"""`isan corpus score` with the local runner (the Ray runner: tests/test_corpus_ray.py): formats,
bits equal to the engine's, bad input recorded and never fatal, resumption after a kill, the CLI,
and the datatrove block under datatrove's local executor."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from isan.corpus import read_output, score_corpus  # noqa: E402
from isan.engine.corpus.job import load_corpus_engine  # noqa: E402
from isan.engine.corpus.scoring import corpus_path  # noqa: E402
from isan.errors import IsanError  # noqa: E402
from tolerances import default_model_tolerance, float64_sums_tolerance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
WIKI = REPO.parent / "shared" / "data" / "wikitext2"


def docs_from(text: str, n: int, seed: int = 0, lo: int = 50, hi: int = 3000) -> list[str]:
    """n documents of realistic, varied lengths cut from real text."""
    rng = np.random.default_rng(seed)
    out, pos = [], 0
    for _ in range(n):
        k = int(rng.integers(lo, hi))
        if pos + k > len(text):
            pos = 0
        out.append(text[pos : pos + k])
        pos += k
    return out


@pytest.fixture(scope="module")
def text() -> str:
    if not SHAKESPEARE.is_file():
        pytest.skip(f"needs {SHAKESPEARE}")
    return SHAKESPEARE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def engine():
    return load_corpus_engine(None)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, text):
    """A small corpus in every format: JSONL, .jsonl.gz, .jsonl.zst (where zstandard is there),
    Parquet, text files (one document a file) and a text file read one document a line."""
    d = tmp_path_factory.mktemp("corpus")
    docs = docs_from(text, 240, seed=1)
    with open(d / "a.jsonl", "w") as f:
        for i, t in enumerate(docs[:80]):
            f.write(json.dumps({"id": f"a-{i}", "text": t}) + "\n")
    with gzip.open(d / "b.jsonl.gz", "wt") as f:
        for i, t in enumerate(docs[80:120]):
            f.write(json.dumps({"id": i, "text": t, "meta": {"x": 1}}) + "\n")
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(80)], "text": docs[120:200]}), d / "c.parquet")
    try:
        import zstandard

        with open(d / "e.jsonl.zst", "wb") as raw:
            with zstandard.ZstdCompressor().stream_writer(raw) as f:
                for i, t in enumerate(docs[200:220]):
                    f.write((json.dumps({"text": t}) + "\n").encode())
    except ImportError:
        pass
    (d / "texts").mkdir()
    for i, t in enumerate(docs[220:230]):
        (d / "texts" / f"t{i}.txt").write_text(t)
    (d / "lines.txt").write_text("\n".join(t.replace("\n", " ") for t in docs[230:240]) + "\n\n")
    return d


def expected_bits(engine, texts: list[str]) -> list[float]:
    """Each document scored alone by Engine.score on the corpus's chunk-parallel path."""
    return [engine.score(t, path=corpus_path(engine)).bits for t in texts]


def engine_bits_tolerance(text: str, chars: int, bits: float) -> float:
    """How far a document's bits in a job may be from Engine.score(path=corpus_path(engine))'s (``chars``
    characters scored, ``bits``). Under 2,048 characters it is one row of the chunk-parallel kernel
    (composed jumps: the shipped model has a table) in both: the same float32 per-character bits, their
    float64 sums apart by Higham's bound at most. A longer one is cut by its own length in the job and
    by Engine.score's plan (over its threads) there: two float32 computations, within twice the
    tolerance derived from the computation (tests/tolerances.py; English, as text8, up to 60,000
    characters)."""
    if len(text) < 2048:
        return float64_sums_tolerance(chars, bits)
    return default_model_tolerance().twice().total_bits


def assert_engine_bits(engine, texts: list[str], got) -> None:
    """Each document's bits against Engine.score's on the corpus's path (:func:`engine_bits_tolerance`)."""
    assert corpus_path(engine) == "jumps" and engine.path == "jumps"
    for t, g in zip(texts, got):
        r = engine.score(t, path=corpus_path(engine))
        assert abs(g - r.bits) <= engine_bits_tolerance(t, r.chars, r.bits), (len(t), g, r.bits)


def test_formats_and_bits_equal_the_engine(corpus, tmp_path, engine):
    out = tmp_path / "out"
    s = score_corpus([str(corpus / "*.jsonl*"), str(corpus / "c.parquet"), str(corpus / "texts")], out,
                     progress=False, part_docs=25, batch_chars=20_000, engine=engine)
    t = read_output(out).to_pandas()
    assert s["errors"] == 0 and not s["file_errors"]
    assert s["documents"] == len(t) == 80 + 40 + 80 + 10 + (20 if (corpus / "e.jsonl.zst").exists() else 0)
    assert set(t["source"]) >= {str(corpus / "a.jsonl"), str(corpus / "b.jsonl.gz"), str(corpus / "c.parquet")}
    texts = {}
    for line in open(corpus / "a.jsonl"):
        o = json.loads(line)
        texts[o["id"]] = o["text"]
    for i, p in enumerate(pq.read_table(corpus / "c.parquet").to_pylist()):
        texts[p["id"]] = p["text"]
    for f in sorted((corpus / "texts").iterdir()):
        texts[str(f)] = f.read_text()
    sub = t[t["id"].isin(list(texts))]
    assert len(sub) == 80 + 80 + 10
    assert_engine_bits(engine, [texts[i] for i in sub["id"]], sub["bits"].to_numpy())
    assert (sub["id"].map(lambda i: len(texts[i])) < 2048).sum() > 50  # enough documents compared exactly
    tol = default_model_tolerance()  # the job's float32 against the float64 reference (tests/tolerances.py)
    for i, bits in list(zip(sub["id"], sub["bits"]))[:: len(sub) // 12]:
        assert abs(bits - engine.with_path("reference").score(texts[i]).bits) <= tol.total_bits
    row = sub.iloc[0]
    r = engine.score(texts[row["id"]])
    assert row["chars_read"] == r.normalization["chars_read"] and row["chars_scored"] == r.chars
    assert row["changed"] == r.normalization["changed"] and row["dropped"] == r.normalization["dropped"]
    assert row["bpc"] == pytest.approx(row["bits"] / row["chars_scored"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["params_sha256"] == engine.params_sha256
    assert summary["bits"] == pytest.approx(float(t["bits"].sum()), rel=1e-12)
    assert summary["this_run"]["chars_per_s"] > 0


def test_per_line_text_and_per_char_bits(corpus, tmp_path, engine):
    out = tmp_path / "out"
    score_corpus([str(corpus / "lines.txt")], out, fmt="text", per_line=True, per_char_max=1500, progress=False,
                 engine=engine)
    t = read_output(out).to_pandas()
    lines = [x for x in (corpus / "lines.txt").read_text().split("\n") if x.strip()]
    assert len(t) == len(lines) == 10
    for line, (_, row) in zip(lines, t.iterrows()):
        r = engine.score(line, path=corpus_path(engine), per_char=True)
        assert abs(row["bits"] - r.bits) <= engine_bits_tolerance(line, r.chars, r.bits)
        if r.chars <= 1500:  # one row: the same bits; cut differently: two float32 computations
            atol = 0 if len(line) < 2048 else default_model_tolerance().twice().bits
            np.testing.assert_allclose(np.asarray(row["per_char_bits"]), r.per_char_bits, rtol=0, atol=atol)
        else:
            assert row["per_char_bits"] is None


def test_bad_input_is_recorded_and_the_job_goes_on(tmp_path, text, engine):
    d = tmp_path / "in"
    d.mkdir()
    good = docs_from(text, 5, seed=3)
    with open(d / "1-mixed.jsonl", "wb") as f:
        f.write(json.dumps({"id": "ok0", "text": good[0]}).encode() + b"\n")
        f.write(b'{"id": "latin1", "text": "caf\xe9"}\n')                # not UTF-8
        f.write(json.dumps({"id": "nofield", "body": "x"}).encode() + b"\n")  # no text field
        f.write(json.dumps({"id": "empty", "text": ""}).encode() + b"\n")     # empty
        f.write(json.dumps({"id": "bom", "text": "\ufeff"}).encode() + b"\n")  # empty after normalisation
        f.write(b"{not json\n")
        f.write(json.dumps({"id": "num", "text": 12}).encode() + b"\n")
        f.write(json.dumps({"id": "ok1", "text": good[1]}).encode() + b"\n")
    (d / "2-bad.parquet").write_bytes(b"PAR1 this is not parquet at all")
    raw = gzip.compress(b"".join(json.dumps({"id": f"g{i}", "text": t}).encode() + b"\n" for i, t in enumerate(good)))
    (d / "3-truncated.jsonl.gz").write_bytes(raw[: len(raw) * 2 // 3])
    (d / "4-notutf8.txt").write_bytes(b"fine text then \xff\xfe bytes")
    (d / "5-big.txt").write_text("." * 100_000_000)  # a 100 MB document (it normalises to one space)
    (d / "6-after.jsonl").write_text(json.dumps({"id": "last", "text": good[2]}) + "\n")
    missing = str(tmp_path / "nope.jsonl")
    out = tmp_path / "out"
    s = score_corpus([str(d), missing], out, progress=False, engine=engine)
    rows = read_output(out).to_pylist()
    t = {r["id"]: r for r in rows}
    err = {r["id"]: r["error"] for r in rows if r["error"]}
    assert "line 2 is not UTF-8" in err["1-mixed.jsonl:2"]
    assert "no field 'text'" in err["nofield"] and "--text-field" in err["nofield"]
    assert "empty" in err["empty"] and "empty after normalisation" in err["bom"]
    assert "not a string" in err["num"]
    assert any("is not JSON" in e for e in err.values())
    assert "not UTF-8" in err[str(d / "4-notutf8.txt")]
    assert_engine_bits(engine, [good[0]], [t["ok0"]["bits"]])
    assert t["ok1"]["error"] is None and t["last"]["error"] is None
    big = t[str(d / "5-big.txt")]
    assert big["error"] is None and big["chars_read"] == 100_000_000 and big["chars_scored"] == 1
    files = {fe["path"]: fe["error"] for fe in s["file_errors"]}
    assert "not a readable Parquet file" in files[str(d / "2-bad.parquet")]
    assert "damaged or truncated" in files[str(d / "3-truncated.jsonl.gz")]
    assert "no such file" in files[missing]
    # the truncated file's one gzip member cannot be checked: its documents are withheld, and counted
    assert not any(str(i).startswith("g") for i in t if i) and "withheld" in files[str(d / "3-truncated.jsonl.gz")]
    assert s["errors"] == sum(1 for r in rows if r["error"] and r["index"] >= 0)


def _run_job_cmd(inputs, out, extra=()):
    return [sys.executable, "-m", "isan.cli", "corpus", "score", *inputs, "--out", str(out), "--no-progress",
            "--part-docs", "15", "--batch-chars", "8000", *extra]


def test_killed_and_rerun_gives_the_same_output(tmp_path, text):
    d = tmp_path / "in"
    d.mkdir()
    for k in range(3):
        with open(d / f"f{k}.jsonl", "w") as f:
            for i, t in enumerate(docs_from(text, 60, seed=10 + k)):
                f.write(json.dumps({"id": f"{k}-{i}", "text": t}) + "\n")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ref = tmp_path / "ref"
    subprocess.run(_run_job_cmd([str(d)], ref), env=env, check=True, capture_output=True, timeout=300)
    out = tmp_path / "out"
    kills = 0
    for delay_parts in (2, 5):  # kill after some parts exist, twice, then finish
        p = subprocess.Popen(_run_job_cmd([str(d)], out), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        t0 = time.time()
        while p.poll() is None and time.time() - t0 < 120:
            if len(list((out / "shards").glob("*.part-*.parquet"))) >= delay_parts:
                break
            time.sleep(0.02)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            kills += 1
        p.wait(timeout=30)
    r = subprocess.run(_run_job_cmd([str(d)], out, ["--json"]), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert kills >= 1
    a, b = read_output(ref), read_output(out)
    assert a.equals(b)
    names = sorted(p.name for p in (ref / "shards").iterdir())
    assert names == sorted(p.name for p in (out / "shards").iterdir())  # no temporary file left behind
    for n in names:
        if n.endswith(".parquet"):
            assert (ref / "shards" / n).read_bytes() == (out / "shards" / n).read_bytes()
    s = json.loads(r.stdout)
    assert s["documents"] == 180 and s["bits"] == pytest.approx(json.loads((ref / "summary.json").read_text())["bits"], rel=1e-12)


def test_the_kernel_is_the_models_not_the_batchs(corpus, tmp_path, engine):
    """With a trie table every row goes by composed jumps, without one by one character a step,
    whatever the batch: the same documents in batches of 3,000 and of 200,000 characters give the
    same bits to the last bit, and the table-less engine's bits equal the jumps' within twice the derived
    float32 tolerance (tests/tolerances.py: two float32 computations); the job
    records its kernel, so a re-run into its directory with the other kernel is refused."""
    from isan.engine.core import Engine

    src = [str(corpus / "a.jsonl")]
    small, big = tmp_path / "small", tmp_path / "big"
    score_corpus(src, small, progress=False, batch_chars=3_000, engine=engine)
    score_corpus(src, big, progress=False, batch_chars=200_000, engine=engine)
    a, b = read_output(small).to_pandas(), read_output(big).to_pandas()
    assert len(a) == 80 and np.array_equal(a.sort_values("id")["bits"].to_numpy(), b.sort_values("id")["bits"].to_numpy())
    plain = Engine(engine.input_params, engine.alphabet, engine.manifest, engine.source, None, path="chunked")
    assert corpus_path(engine) == "jumps" and corpus_path(plain) == "chunked"
    with pytest.raises(IsanError, match="differs in: kernel"):  # a job's parts never mix the kernels
        score_corpus(src, small, progress=False, engine=plain)
    out = tmp_path / "plain"
    score_corpus(src, out, progress=False, engine=plain)
    job = json.loads((out / "job.json").read_text())
    assert job.pop("kernel") == "chunked"
    (out / "job.json").write_text(json.dumps(job))  # as a job of an earlier isan wrote it: per symbol, unrecorded
    assert score_corpus(src, out, progress=False, engine=plain)["documents"] == 80
    with pytest.raises(IsanError, match="scored by the chunked kernel, this run's by jumps"):
        score_corpus(src, out, progress=False, engine=engine)
    c = read_output(out).to_pandas()
    np.testing.assert_allclose(c.sort_values("id")["bits"].to_numpy(), a.sort_values("id")["bits"].to_numpy(),
                               rtol=0, atol=default_model_tolerance().twice().total_bits)


def test_another_job_in_the_same_directory_is_refused(tmp_path, corpus, engine):
    out = tmp_path / "out"
    score_corpus([str(corpus / "texts")], out, progress=False, engine=engine)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "isan.cli", "corpus", "score", str(corpus / "texts"), "--out", str(out),
                        "--normalize", "none", "--no-progress"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "another job" in r.stderr and "normalize" in r.stderr
    r = subprocess.run([sys.executable, "-m", "isan.cli", "corpus", "score", str(corpus / "texts"), "--out", str(out),
                        "--no-progress"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "10 files were complete already" in r.stdout


def test_datatrove_block(tmp_path, corpus, engine):
    pytest.importorskip("datatrove")
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    from isan.engine.corpus.datatrove import IsanScoreFilter

    texts = {json.loads(x)["id"]: json.loads(x)["text"] for x in open(corpus / "a.jsonl")}
    want = dict(zip(texts, expected_bits(engine, list(texts.values()))))
    bpcs = sorted(b / engine.score(t).chars for b, t in zip(want.values(), texts.values()))
    cut = bpcs[len(bpcs) // 2]
    LocalPipelineExecutor(pipeline=[JsonlReader(str(corpus), glob_pattern="a.jsonl"),
                                    IsanScoreFilter(max_bpc=cut, batch_size=32),
                                    JsonlWriter(str(tmp_path / "kept"))],
                          tasks=1, workers=1, logging_dir=str(tmp_path / "logs")).run()
    kept = [json.loads(x) for f in (tmp_path / "kept").iterdir() for x in gzip.open(f, "rt")]
    assert 0 < len(kept) < len(texts)
    for doc in kept:
        m = doc["metadata"]
        t = texts[doc["id"]]
        assert abs(m["isan_bits"] - want[doc["id"]]) <= engine_bits_tolerance(t, m["isan_chars"], want[doc["id"]])
        assert m["isan_bpc"] <= cut and m["isan_chars"] > 0
    assert len(kept) == sum(1 for b in bpcs if b <= cut)


def test_bench_corpus_quick_run_records_its_command_and_kernel(tmp_path):
    """`isan bench corpus` on a small corpus, local runner only: the JSON holds the command, the
    kernel the job took (jumps: the shipped model has a table), and one row that scored every
    document without an error."""
    data = REPO.parent / "shared" / "data"
    if not data.exists():
        pytest.skip("the shared data is not beside the repo")
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "isan.cli", "bench", "corpus", "--data-dir", str(data), "--mb", "0.2",
                        "--files", "2", "--no-ray", "--no-kenlm", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["command"].startswith("isan bench corpus") and "--mb 0.2" in res["command"]
    assert res["facts"]["kernel"] == "jumps" and res["facts"]["errors"] == 0
    (row,) = res["rows"]
    assert row["documents"] == res["corpus"]["documents"] > 0 and row["chars_per_s"] > 0 and 1.0 < row["bpc"] < 3.0
    assert "Command: `isan bench corpus" in r.stdout
