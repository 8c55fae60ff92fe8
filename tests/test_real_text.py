"""Real text in, through the CLI and the server: a sentence with a capital, punctuation and a newline,
Tiny Shakespeare and WikiText-2 test (``../shared/data``) score with the shipped model's text8
normaliser, report what it changed, and give the same numbers whole, streamed and over HTTP."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA, need
from tolerances import default_model_tolerance

SHAKESPEARE = DATA / "tinyshakespeare" / "input.txt"
WIKITEXT_TEST = DATA / "wikitext2" / "test.txt"


def isan(*args, input=None):
    r = subprocess.run([sys.executable, "-m", "isan.cli", *map(str, args)], input=input, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r


def test_a_sentence_from_stdin():
    out = json.loads(isan("score", "--json", "-", input="The cat sat on the mat.\n").stdout)
    assert out["chars"] == 23 and np.isfinite(out["bits"])
    n = out["normalization"]
    assert (n["normalizer"], n["chars_read"], n["chars_scored"], n["changed"], n["dropped"]) == \
        ("text8-v1", 24, 23, 2, 1)
    per = json.loads(isan("score", "--json", "--per-char", "-", input="The cat.\n").stdout)
    assert per["per_char_offsets"] == list(range(8)) and len(per["per_char_bits"]) == 8
    raw = subprocess.run([sys.executable, "-m", "isan.cli", "score", "--normalize", "none", "-"],
                         input="The cat.\n", capture_output=True, text=True, timeout=300)
    assert raw.returncode == 2 and "'T'" in raw.stderr and "offset 0" in raw.stderr
    txt = isan("score", "--per-char", "-", input="A 1.").stdout
    assert "normalized  text8-v1: read 4, scored 6, changed 2, dropped 1" in txt  # "a one "
    assert "2\t'1'\t'o'" in txt  # the digit's characters map back to its offset
    assert json.loads(isan("sample", "--prompt", "The Cat", "-n", 5, "--seed", 1, "--json").stdout)[
        "prompt_normalized"] == "the cat"


@pytest.fixture(scope="module")
def client(default_engine):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # starlette's notice about httpx
        from fastapi.testclient import TestClient
    from isan.engine.serve import create_app

    return TestClient(create_app(default_engine, max_chars=2_000_000))


@pytest.mark.parametrize("path, bpc_range", [(SHAKESPEARE, (2.3, 2.7)), (WIKITEXT_TEST, (1.7, 2.1))])
def test_real_corpora_through_the_cli_and_the_server(path, bpc_range, client):
    need(path)
    text = path.read_text(encoding="utf-8")
    cli = json.loads(isan("score", "--json", path).stdout)
    n = cli["normalization"]
    assert n["normalizer"] == "text8-v1" and n["chars_read"] == len(text)
    assert n["changed"] > 0 and n["dropped"] > 0 and n["chars_scored"] == cli["chars"]
    assert bpc_range[0] < cli["bpc"] < bpc_range[1]
    r = client.post("/v1/score", json={"text": text})
    assert r.status_code == 200 and "NaN" not in r.text
    http = r.json()
    # both exact, but not always the same kernel: the CLI scores this 1M-character file in one block
    # by composed jumps, the server in rounds of slices one character a step; two float32 computations,
    # within twice the tolerance derived from the computation (tests/tolerances.py; English, as text8)
    tol = default_model_tolerance().for_chars(cli["chars"]).twice()
    assert http["chars"] == cli["chars"] and abs(http["bits"] - cli["bits"]) <= tol.total_bits
    assert http["normalization"] == n


def test_streaming_raw_text_equals_scoring_it_whole(client, default_engine):
    """Chunks cut anywhere (inside runs of spaces and newlines) give the bits of the whole text."""
    text = need(SHAKESPEARE).read_text(encoding="utf-8")[:60_000]
    whole = default_engine.score(text)
    rng = np.random.default_rng(0)
    cuts = sorted(set(rng.integers(1, len(text), 40).tolist()) | {text.index("\n\n") + 1})
    with client.websocket_connect("/v1/stream") as ws:
        for a, b in zip([0] + cuts, cuts + [len(text)]):
            ws.send_text(json.dumps({"text": text[a:b]}))
            msg = json.loads(ws.receive_text())
            assert "error" not in msg
    tol = default_model_tolerance().for_chars(whole.chars).twice()  # two float32 computations (tests/tolerances.py)
    assert msg["total_chars"] == whole.chars and abs(msg["total_bits"] - whole.bits) <= tol.total_bits
