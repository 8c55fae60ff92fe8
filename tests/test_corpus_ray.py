"""`isan corpus score --runner ray` on a real Ray cluster on this machine: `ray start --head` and a
second node process joined to it, the job sent through `--ray-address`; every document's bits equal
the local runner's (the same files) and the engine's. The cluster is stopped whatever happens (its
processes are killed by their process groups, which these tests started)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("pyarrow")

from isan.corpus import read_output, score_corpus  # noqa: E402
from isan.engine.corpus.job import load_corpus_engine  # noqa: E402
from isan.engine.corpus.scoring import corpus_path  # noqa: E402
from tolerances import default_model_tolerance, float64_sums_tolerance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
WIKI = REPO.parent / "shared" / "data" / "wikitext2" / "wiki.valid.tokens"


def _env() -> dict:
    # a loopback cluster that lives for one test: no token authentication (a real cluster keeps it:
    # the driver then needs the cluster's token, RAY_AUTH_TOKEN or ~/.ray/auth_token)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="module")
def cluster():
    """A head node and a second node (1 CPU each); yields (address, nodes). Skips if the head cannot
    start; a second node that cannot start leaves one."""
    from isan.bench.corpus import LocalCluster

    try:
        cl = LocalCluster(cpus_per_node=1, nodes=2, object_store_bytes=80_000_000, env=_env(), min_nodes=1,
                          timeout=120)
    except RuntimeError as e:
        pytest.skip(str(e))
    with cl:
        yield cl.address, cl.nodes


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    if not SHAKESPEARE.is_file():
        pytest.skip(f"needs {SHAKESPEARE}")
    text = SHAKESPEARE.read_text(encoding="utf-8")
    d = tmp_path_factory.mktemp("raycorpus")
    rng = np.random.default_rng(7)
    texts, pos = {}, 0
    for k in range(4):
        with open(d / f"part{k}.jsonl", "w") as f:
            for i in range(60):
                n = int(rng.integers(80, 4000))
                t = text[pos : pos + n]
                pos = (pos + n) % (len(text) - 5000)
                texts[f"{k}-{i}"] = t
                f.write(json.dumps({"id": f"{k}-{i}", "text": t}) + "\n")
        f = open(d / f"part{k}.jsonl", "a")
        f.write('{"id": "bad-%d", "body": 1}\n' % k)
        f.write('{"id": "big-%d", "text": "x", "n": %s}\n' % (k, "9" * 5000))  # json.loads refuses it (#34 item 2)
        f.close()
    # a .jsonl.zst cut short (#34 item 3): its one frame cannot be checked, so a file error and no document
    zstandard = pytest.importorskip("zstandard")
    raw = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(raw, closefd=False) as w:
        for i in range(400):
            t = text[(i * 997) % 100_000 :][:600]
            texts[f"z-{i}"] = t
            w.write((json.dumps({"id": f"z-{i}", "text": t}) + "\n").encode())
    (d / "part4.jsonl.zst").write_bytes(raw.getvalue()[:-100])
    return d, texts


def test_ray_cluster_equals_local_and_the_engine(cluster, corpus, tmp_path):
    address, nodes = cluster
    d, texts = corpus
    env = _env()
    out_ray = tmp_path / "ray"
    cmd = [sys.executable, "-m", "isan.cli", "corpus", "score", str(d), "--out", str(out_ray), "--ray-address",
           address, "--no-progress", "--json", "--part-docs", "25"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s_ray = json.loads(r.stdout)
    assert s_ray["this_run"]["runner"] == "ray" and s_ray["this_run"]["cluster_nodes"] == nodes
    assert s_ray["documents"] == 4 * 62 and s_ray["errors"] == 8  # the cut frame's 400 documents are withheld
    assert [fe["path"] for fe in s_ray["file_errors"]] == [str(d / "part4.jsonl.zst")]
    assert "withheld" in s_ray["file_errors"][0]["error"]

    engine = load_corpus_engine(None)
    out_local = tmp_path / "local"
    s_local = score_corpus([str(d)], out_local, progress=False, part_docs=25, engine=engine)
    a, b = read_output(out_local), read_output(out_ray)
    assert a.equals(b)  # every column of every document, bit for bit
    for p in sorted((out_local / "shards").glob("*.parquet")):
        assert p.read_bytes() == (out_ray / "shards" / p.name).read_bytes()
    assert s_local["bits"] == s_ray["bits"] and s_local["file_errors"] == s_ray["file_errors"]
    assert "changed_fraction" in b.column_names
    rows = [row for row in b.to_pylist() if row["error"] is None]
    ids = [row["id"] for row in rows]
    # Engine.score (the corpus's chunk-parallel path): a document under 2,048 characters is the same single row
    # (the same float32 bits, their float64 sums within Higham's bound); a longer one is cut differently there
    # (by Engine.score's plan): two float32 computations, within twice the derived tolerance (tests/tolerances.py)
    short, twice = 0, default_model_tolerance().twice().total_bits
    for i, row in zip(ids, rows):
        t = texts[i]
        short += len(t) < 2048
        want = engine.score(t, path=corpus_path(engine))
        tol = float64_sums_tolerance(want.chars, want.bits) if len(t) < 2048 else twice
        assert abs(row["bits"] - want.bits) <= tol, (len(t), row["bits"], want.bits)
    assert short > 50

    # run again: every file is complete, nothing is scored twice
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    again = json.loads(r.stdout)
    assert again["this_run"]["files_skipped"] == 5 and again["this_run"]["documents"] == 0
    assert read_output(out_ray).equals(b)
