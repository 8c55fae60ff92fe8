"""The numbers the guides and results pages quote agree with the committed output files that back them
(issue #45 item 9): each check reads a committed JSON (or log) and looks for its number, rounded as the
page rounds it, in the page. Nothing is scored or trained here; the commands that write the files are
named in results/scoring/README.md, results/distil/mixture.py and train/studies/token_eval.sh."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def text(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def load(rel: str) -> dict:
    return json.loads(text(rel))


@pytest.mark.parametrize("model, name", [
    ("text8-d216-distil", "text8_test"), ("text8-d216-distil", "tinyshakespeare"),
    ("text8-d216-distil", "wikitext2_test"), ("text8-d216-stable", "text8_test"),
    ("text8-d216-stable", "tinyshakespeare"), ("text8-d216-stable", "wikitext2_test"),
    ("text8-d216-unconstrained", "text8_test"), ("text8-d216-unconstrained", "tinyshakespeare"),
    ("text8-d216-unconstrained", "wikitext2_test"),
])
def test_scoring_guide_quotes_the_score_files(model, name):
    bpc = f"{load(f'results/scoring/{model}.{name}.json')['bpc']:.4f}"
    assert bpc in text("docs/guide/scoring.md")
    assert bpc in text("results/scoring/README.md")


def test_shipped_models_text8_scores_in_the_training_guide():
    guide = text("docs/guide/training.md")
    for model in ("text8-d216-distil", "text8-d216-stable", "text8-d216-unconstrained", "text8-d320-stable"):
        for split in ("valid", "test"):
            assert f"{load(f'results/scoring/{model}.text8_{split}.json')['bpc']:.4f}" in guide, (model, split)


def test_evalharness_number_in_the_server_guide():
    for model, page in (("text8-d216-distil", "bits_per_byte {:.3f}"), ("text8-d216-stable", "text8-d216-stable`, {:.3f}")):
        r = load(f"results/scoring/evalharness.{model}.json")["results"]["isan_shakespeare_rolling"]
        assert page.format(r["bits_per_byte,none"]) in text("docs/guide/server.md"), model


def test_mixture_numbers_in_the_distillation_page():
    m = load("results/distil/mixture.json")
    page = text("results/distil/README.md")
    for mix in m["mixtures"]:
        assert f"{mix['valid_bpc']:.4f}" in page, mix["models"]
    assert f"{m['members']['text8-d320-stable']:.4f}" in page


def test_distilled_run_speed_is_its_logs():
    done = [json.loads(line) for line in text("isan/models/text8-d216-distil/train_log.jsonl").splitlines()][-1]
    assert done["event"] == "done"
    rate = f"{done['train_chars_per_s']:,}"
    assert rate in text("results/distil/README.md")
    assert rate in text("isan/models/text8-d216-distil/MODEL_CARD.md")
    assert f"{round(done['train_chars_per_s'] / 1000)}k" in text("docs/guide/training.md")


def test_token_models_scores_agree():
    results, guide = text("results/tokens/RESULTS.md"), text("docs/guide/scoring.md")
    for run in ("bytes-isan", "bytes-lstm"):
        v = f"{load(f'results/tokens/{run}/score_valid.json')['bits_per_token']:.3f}"
        assert v in results and v in guide, run
    for run in ("pairs-isan", "pairs-lstm"):
        v = f"{load(f'results/tokens/{run}/score_text8_test.json')['bits_per_token']:.3f}"
        assert v in results and v in guide, run


def test_benchmarks_gap_to_the_paper_matches_table1():
    rows = re.findall(r"^\| (RNN|IRNN|GRU|LSTM|ISAN) \| \*\*([\d.]+)\*\* .*?\| ([\d.]+) \| \*\*([\d.]+)\*\* .*?\| ([\d.]+) "
                      r"\| \*\*([\d.]+)\*\* .*?\| ([\d.]+) \|$", text("results/table1/TABLE.md"), re.M)
    assert len(rows) == 5
    gaps = [float(r[i]) - float(r[i + 1]) for r in rows for i in (1, 3, 5)]
    assert f"{min(gaps):.2f}-{max(gaps):.2f} bpc above the paper's" in text("docs/guide/benchmarks.md")


def test_readme_headline_bits_and_speeds_are_the_committed_measurements():
    """The README's first headline row and its introduction quote bench_results/frontier_epyc.json, a
    measurement of the default model beside the others in one process (#45 items 5, 7); the engine
    rows quote engine_epyc.json of the default."""
    from isan.engine import Engine

    readme = text("README.md")
    frontier = load("bench_results/frontier_epyc.json")
    rows = {r["name"]: r for r in frontier["rows"]}
    default = Engine.default()
    assert rows["text8-d216-distil"]["params_sha256"] == default.params_sha256, "measured on the default"
    for name in ("text8-d216-distil", "text8-d216-stable", "text8-d320-stable"):
        assert f"{rows[name]['test_bpc']:.4f}" in readme, name
    assert f"{frontier['kenlm']['test_bpc']:.4f}" in readme
    for name in ("text8-d216-stable", "text8-d320-stable"):  # the speed ratios of the introduction
        ratio = rows[name]["chars_per_s"] / rows["text8-d216-distil"]["chars_per_s"]
        assert f"{ratio:.2f} times" in readme, (name, ratio)
    engine = load("bench_results/engine_epyc.json")
    assert engine["model"]["params_sha256"] == default.params_sha256
    by_name = {r["name"]: r["chars_per_s"] for r in engine["rows"]}
    long_text = next(v for k, v in by_name.items() if k.startswith("long text") and "default path" in k)
    assert f"{long_text / 1e6:.2f}M chars/s" in readme


def test_the_table_budget_measurement_names_the_default_model():
    """The 16 MB default table budget rests on bench_results/budgets.json: it names the model it measured,
    and that is the default (#45 item 9)."""
    from isan.engine import Engine

    assert load("bench_results/budgets.json")["model"]["params_sha256"] == Engine.default().params_sha256


def test_gpu_numbers_are_run5s():
    """The README's and the GPU guide's H200 numbers are those of bench_results/gpu_h200/run5/gpu.json."""
    rows = {r["name"]: r for r in load("bench_results/gpu_h200/run5/gpu.json")["rows"]}
    one = rows["cuda float32, step triton: 65,536 documents x 512"]
    over = rows["cuda float32, step triton: 4 such batches, overlapped (score_batches, totals)"]
    readme, guide = text("README.md"), text("docs/guide/gpu.md")
    for page in (readme, guide):
        assert f"{one['chars_per_s'] / 1e6:.0f}M" in page and f"{over['chars_per_s'] / 1e6:.0f}M" in page
        assert f"{one['ratio']:.1f} " in page and f"{over['ratio']:.1f} times" in page
    for r in rows.values():
        if r["name"].startswith("cuda") or r["name"].startswith("CPU"):
            assert f"{r['chars_per_s']:,.0f}" in guide, r["name"]


def test_structured_probe_numbers_are_its_logs():
    """Issue #48's probe: the bpc the training guide and results/structured quote are the CPU runs' logs."""
    guide, page = text("docs/guide/training.md"), text("results/structured/README.md")
    for name in ("dense216", "dplr384r54", "dplr512r37"):
        done = [json.loads(line) for line in text(f"results/structured/cpu/{name}/train_log.jsonl").splitlines()][-1]
        assert done["event"] == "done" and done["chars_seen"] >= 45_000_000
        bpc = f"{done['best_valid_bpc']:.4f}"
        assert bpc in guide and bpc in page, name
