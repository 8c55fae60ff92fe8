"""lm-evaluation-harness's `local-completions` model evaluating isan through isan-serve, offline:
the tasks of tests/evalharness (a loglikelihood task and a rolling-loglikelihood (perplexity) task
over the shared tinyshakespeare text) and the server's tokenizer endpoints (lm-eval's `remote`
backend, detected from GET /tokenizer_info); every document's numbers checked against the library
(`isan score`). Needs the `evalharness` extra (pip install -e ".[evalharness]"); skipped without it.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")  # lm-eval's API models need lm-eval[api]

from isan.engine import default_model_path  # noqa: E402
from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from server_helpers import running  # noqa: E402

TASKS = Path(__file__).parent / "evalharness"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"
LIMIT = 12


def test_lm_eval_local_completions(default_engine, tmp_path):
    if not DATA.exists():
        pytest.skip(f"{DATA} is missing")
    eng = default_engine
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for f in TASKS.glob("*.yaml"):  # the data path made absolute (the YAMLs name it from the repo root)
        (tasks / f.name).write_text(f.read_text().replace("../shared/data/tinyshakespeare/input.txt", str(DATA)))
    app = create_app(eng, config=ServeConfig())
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "OPENAI_API_KEY": "none"}
    with running(app) as addr:
        cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
               f"model={default_model_path().name},base_url=http://{addr}/v1/completions,max_length=1000000",
               "--include_path", str(tasks), "--tasks", "isan_shakespeare_lastword,isan_shakespeare_rolling",
               "--limit", str(LIMIT), "--output_path", str(tmp_path / "out"), "--log_samples"]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Using remote tokenizer backend" in run.stderr + run.stdout
    samples = {p.name.split("_2")[0]: [json.loads(line) for line in p.read_text().splitlines()]
               for p in (tmp_path / "out").rglob("samples_*.jsonl")}
    rolling = samples["samples_isan_shakespeare_rolling"]
    lastword = samples["samples_isan_shakespeare_lastword"]
    assert len(rolling) == len(lastword) == LIMIT
    for s in rolling:  # the log-likelihood of a paragraph is isan score's bits of it
        ll = float(s["filtered_resps"][0])
        assert ll == pytest.approx(-eng.score(s["doc"]["text"]).bits * math.log(2), rel=1e-6)
    greedy = 0
    for s in lastword:  # the continuation's log-likelihood after the context, and whether it is greedy
        ctx, cont = s["arguments"]["gen_args_0"]["arg_0"], s["arguments"]["gen_args_0"]["arg_1"]
        ll, is_greedy = float(s["filtered_resps"][0][0]), s["filtered_resps"][0][1] == "True"
        n_ctx = len(eng.prepare(ctx).ids)
        full = eng.score(ctx + cont, per_char=True)
        assert ll == pytest.approx(-full.per_char_bits[n_ctx:].sum() * math.log(2), rel=1e-6)
        st = eng.advance(ctx)
        want = True
        for ch in full.text[n_ctx:]:
            want = want and eng.top_k(st, 1)[0]["symbol"] == ch
            st = eng.advance(ch, st, normalize="none")
        assert is_greedy == want
        greedy += want
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    assert results["isan_shakespeare_lastword"]["acc,none"] == pytest.approx(greedy / LIMIT)
    chars = sum(len(s["doc"]["text"].encode()) for s in rolling)
    bits = sum(-float(s["filtered_resps"][0]) / math.log(2) for s in rolling)
    assert results["isan_shakespeare_rolling"]["bits_per_byte,none"] == pytest.approx(bits / chars, rel=1e-6)
    print(f"\nlm-eval: bits_per_byte {bits / chars:.4f} over {LIMIT} paragraphs; last-word acc {greedy / LIMIT:.3f}")
