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


def test_the_table_budget_measurement_names_the_default_model():
    """The 16 MB default table budget rests on bench_results/budgets.json: it names the model it measured,
    and that is the default (#45 item 9)."""
    from isan.engine import Engine

    assert load("bench_results/budgets.json")["model"]["params_sha256"] == Engine.default().params_sha256


def test_gpu_guide_numbers_are_run5s():
    """The GPU guide's H200 numbers are those of bench_results/gpu_h200/run5/gpu.json, each ratio against the
    CPU row it names (the README's are tied in test_docs_numbers_readme.py)."""
    g = load("bench_results/gpu_h200/run5/gpu.json")
    rows = {r["name"]: r for r in g["rows"]}
    cpu_docs = rows["CPU compiled kernels: 65,536 documents x 512"]["chars_per_s"]
    cpu_long = rows["CPU compiled kernels: long text, 12,549,837 chars"]["chars_per_s"]
    one = rows["cuda float32, step triton: 65,536 documents x 512"]["chars_per_s"]
    over = rows["cuda float32, step triton: 4 such batches, overlapped (score_batches, totals)"]["chars_per_s"]
    long_text = rows["cuda float32, step triton: long text, chunk-parallel"]["chars_per_s"]
    guide = " ".join(text("docs/guide/gpu.md").split())
    assert (f"one call of 65,536 documents with each character's bits runs at {one / 1e6:.0f}M chars/s, "
            f"{one / cpu_docs:.1f} times the same call on the CPU's compiled kernels on the machine's 16 cores") in guide
    assert (f"four such batches overlapped, keeping each document's total only, at {over / 1e6:.0f}M, "
            f"{over / cpu_docs:.1f} times that one CPU call") in guide
    assert f"one long text chunk-parallel at {long_text / 1e6:.0f}M, {long_text / cpu_long:.1f} times the CPU's 16 cores" in guide
    scaling = load("bench_results/gpu_h200/run1/scaling_engine.json")["facts"]["scaling"]
    at16 = sorted(r["speedup"] for r in scaling if r["threads"] == 16)
    assert f"16 threads of the CPU kernels run {at16[0]:.1f} to {at16[-1]:.1f} times one" in guide
    for r in rows.values():
        if r["name"].startswith("cuda") or r["name"].startswith("CPU"):
            assert f"{r['chars_per_s']:,.0f}" in guide, r["name"]


def _within(x: float) -> tuple[str, str]:
    """A bound ``x`` as a page prints it with two significant digits, rounded or rounded up ("7.6e-8")."""
    import math

    e = math.floor(math.log10(x))
    up = math.ceil(x / 10 ** (e - 1)) / 10
    return tuple(f"{m:.1f}e{e}" for m in (round(x / 10 ** e, 1), up))


def test_gpu_guide_exactness_training_and_corpus_are_the_runs_files():
    """The GPU guide's exactness bounds (run 5's gpu.json facts), training rates (runs 1-3's gpu_train.json)
    and corpus run (run 5's summary and check.log)."""
    guide = " ".join(text("docs/guide/gpu.md").split())
    f = load("bench_results/gpu_h200/run5/gpu.json")["facts"]
    f32 = _within(f["docs float32 step triton: max rel vs the float64 reference (256 docs)"])
    f64 = _within(f["docs float64 step triton: max rel vs the float64 reference (256 docs)"])
    totals = _within(max(f[f"docs {t} step triton: totals vs per-character sums (max rel)"] for t in ("float32", "float64")))
    long_text = _within(f["long text float32 step triton: rel vs float64"])
    assert any(f"float32 within {a} relative of the float64 reference per document, float64 within {b}" in guide
               for a in f32 for b in f64)
    assert any(f"float32 within {a} relative of the float64 reference (256 documents), float64 within {b}" in guide
               for a in f32 for b in f64)
    assert any(f"within {t} of the sum of its characters' bits" in guide for t in totals)
    assert all(f[f"docs {t} step triton: overlapped totals vs one call's (max rel)"] == 0 for t in ("float32", "float64"))
    assert any(f"the long text's total in float32 within {t} of float64's" in guide for t in long_text)
    train = [load(f"bench_results/gpu_h200/run{r}/gpu_train.json")["rows"][0]["chars_per_s"] for r in (1, 2, 3)]
    assert guide.count(f"at B = 256 runs {min(train) / 1e6:.2f}M to {max(train) / 1e6:.2f}M chars/s") == 1
    assert guide.count(f"at B = 256 was {min(train) / 1e6:.2f}M to {max(train) / 1e6:.2f}M chars/s") == 1
    readme = " ".join(text("bench_results/gpu_h200/README.md").split())
    assert f"{train[0]:,.0f} chars/s (run 1), {train[1]:,.0f} (run 2), {train[2]:,.0f} (run 3)" in readme
    c = load("bench_results/gpu_h200/run5/corpus_gpu_summary.json")
    wall = re.search(r"isan corpus score --device cuda: ([\d.]+) s wall, ([\d,]+) chars/s",
                     text("bench_results/gpu_h200/run5/check.log"))
    assert round(c["chars_scored"] / float(wall.group(1))) == pytest.approx(int(wall.group(2).replace(",", "")), rel=1e-3)
    assert (f"{c['files']} zstd files, {c['chars_scored'] / 1e6:.0f}M characters scored, `isan corpus score --device cuda` "
            f"with {c['this_run']['readers']} reader processes took {wall.group(1)} s wall, "
            f"{c['chars_scored'] / float(wall.group(1)) / 1e6:.1f}M chars/s") in guide
    assert f"{c['this_run']['scoring_seconds']:.1f} s in the scoring process's calls" in guide
    assert f"{c['this_run']['first_part_seconds']:.1f} s before the first part arrived" in guide
    assert f"{c['this_run']['wait_seconds']:.1f} s waiting for readers" in guide


def test_gpu_guide_table_rows_are_runs_4_and_5():
    """Each row of the GPU guide's H200 table holds its run 5 float32, run 5 float64 and run 4 float32 rows."""
    run5 = {r["name"]: r["chars_per_s"] for r in load("bench_results/gpu_h200/run5/gpu.json")["rows"]}
    run4 = {r["name"]: r["chars_per_s"] for r in load("bench_results/gpu_h200/run4/gpu.json")["rows"]}
    docs, long_text = "65,536 documents x 512", "long text"
    rows = {  # the row's label: the benchmark row's name after "cuda float32/64, step triton: ", or the CPU's
        "CPU compiled kernels, 16 threads: 65,536 documents x 512": f"CPU compiled kernels: {docs}",
        "one call, each character's bits": docs,
        "one call, each document's total only": "the same, each document's total only (reduced on the device)",
        "four such batches overlapped": "4 such batches, overlapped (score_batches, totals)",
        "one call, the steps only": "the same, steps only (no readout)",
        "the step's kernel alone": "the same, the step's kernel alone (device time)",
        "CPU compiled kernels, 16 threads: the long text": "CPU compiled kernels: long text, 12,549,837 chars",
        "the long text, chunk-parallel": f"{long_text}, chunk-parallel",
        "the long text, the step's kernel alone": f"{long_text}, the step's kernel alone (device time)",
    }
    guide = text("docs/guide/gpu.md").splitlines()
    for label, name in rows.items():
        line = [ln for ln in guide if ln.startswith(f"| {label}")]
        assert len(line) == 1, label
        cells = []
        for runs, dtype in ((run5, "float32"), (run5, "float64"), (run4, "float32")):
            key = name if name.startswith("CPU") else f"cuda {dtype}, step triton: {name}"
            cells.append(f"{runs[key]:,.0f}" if key in runs and not (name.startswith("CPU") and dtype == "float64") else "-")
        assert line[0].endswith(" | " + " | ".join(cells) + " |"), (label, cells)


def test_the_16_core_scaling_table_names_its_model():
    """The speed guide's 16-core table is run 1's scaling_engine.json, which measured text8-d216-stable."""
    res = load("bench_results/gpu_h200/run1/scaling_engine.json")
    stable = json.loads(text("isan/models/text8-d216-stable/manifest.json"))["params_sha256"]
    assert res["model"]["params_sha256"] == stable and res["machine"]["cores"] == 16
    guide = text("docs/guide/tables-and-speed.md")
    assert "run 1, 2026-11-26, of `text8-d216-stable`" in " ".join(guide.split())
    for r in res["facts"]["scaling"]:
        assert f"| {r['what']} | {r['threads']} | {r['chars_per_s']:,.0f} | {r['speedup']:.2f}x |" in guide, r


def test_ingest_counts_the_step_only():
    """A row without a readout is credited with the step's FLOPs, 2 d (d + 1) a character, not the readout's
    2 V (d + 1) too; the speed guide's ingest row is engine_epyc.json's rate at that count."""
    from isan.bench.engine import useful_flops_per_char

    assert useful_flops_per_char(216, 27) == 2 * 217 * 216 + 2 * 217 * 27
    assert useful_flops_per_char(216, 27, readout=False) == 2 * 217 * 216
    assert useful_flops_per_char(1, 5, readout=False) == 4.0
    e = load("bench_results/engine_epyc.json")
    ingest = next(r for r in e["rows"] if r["name"].startswith("ingest"))
    g = ingest["chars_per_s"] * useful_flops_per_char(216, 27, readout=False) / 1e9
    of_peak = g / e["facts"]["fma_peak"]["gflops_all_threads"]
    assert of_peak < 1, "no row does more than the FMA peak"
    assert f"| {ingest['name']} | 2,500,000 | {ingest['chars_per_s']:,.0f} | {ingest['ratio']:.2f}x | {g:.0f} ({of_peak:.0%}) |" \
        in text("docs/guide/tables-and-speed.md")


def test_the_xeon_tile_table_is_its_json():
    """The speed guide's register-tile table: each tile's autotune GFLOP/s and long-text rates on 1 and 16
    threads, with the fraction of the FMA peak of those threads, from bench_results/xeon_tiles/xeon_tiles.json."""
    from isan.bench.engine import useful_flops_per_char

    x = load("bench_results/xeon_tiles/xeon_tiles.json")
    flops, guide = useful_flops_per_char(216, 27), text("docs/guide/tables-and-speed.md")
    assert f"FMA peak {x['peak']['1']:.0f} GFLOP/s on one thread, {x['peak']['16']:,.0f} on 16" in " ".join(guide.split())
    for tile in ("14x2", "8x3", "6x4", "4x6"):
        cells = [f"{x['autotune']['timings'][f'avx512_{tile}']['gflops']:.0f}"]
        for threads, kernel in (("1", "jumps"), ("1", "chunked"), ("16", "jumps"), ("16", "chunked")):
            cps = x["ab"][f"{threads}t {kernel} avx512_{tile}"]
            cells.append(f"{cps / 1e6:.2f}M ({cps * flops / 1e9 / x['peak'][threads]:.0%})")
        assert f"| {tile} | " + " | ".join(cells) + " |" in guide, tile


def test_kenlm_and_d320_speeds_name_their_run():
    """KenLM's speed and d = 320's ratio come from three runs; each page quotes its own run's, with the baseline."""
    speed = text("docs/guide/tables-and-speed.md")
    e = {r["name"]: r["chars_per_s"] for r in load("bench_results/engine_epyc.json")["rows"]}
    kenlm = e["peer: KenLM (Python module) querying our order-8 n-gram, 1 thread"]
    long_text = e["long text (2,500,000 unseen chars, chunk-parallel, default path)"]
    assert f"at {kenlm / 1e6:.2f}M chars/s through its Python module on one thread; the ISAN's long-text path on 2 " \
           f"threads is at {long_text / kenlm:.2f} times that" in " ".join(speed.split())
    old = load("results/frontier/frontier_epyc.json")
    rows = {r["name"]: r for r in old["rows"]}
    base = rows["text8-d216-stable"]["chars_per_s"]
    frontier = text("results/frontier/README.md")
    d320 = f"{rows['text8-d320-stable']['chars_per_s'] / base:.2f}"
    assert f"| {rows['text8-d320-stable']['chars_per_s']:,.0f} | {d320}x |" in frontier
    assert f"| {old['kenlm']['chars_per_s']:,.0f} | {old['kenlm']['chars_per_s'] / base:.2f}x |" in frontier
    new = load("bench_results/frontier_epyc.json")
    nrows = {r["name"]: r for r in new["rows"]}
    d320_new = f"{nrows['text8-d320-stable']['chars_per_s'] / nrows['text8-d216-distil']['chars_per_s']:.2f}"
    assert (f"d = 320 scores at {d320_new} times the default's speed and KenLM at "
            f"{new['kenlm']['chars_per_s'] / 1e6:.2f}M chars/s") in " ".join(frontier.split())
    training = " ".join(text("docs/guide/training.md").split())
    assert (f"{d320_new} times the default's speed in [frontier_epyc.json](../../bench_results/frontier_epyc.json); "
            f"{d320} times `text8-d216-stable`'s in [the frontier]") in training
    card = " ".join(text("isan/models/text8-d320-stable/MODEL_CARD.md").split())
    assert f"at {d320} times its scoring speed (`results/frontier/frontier_epyc.json`)" in card
    assert f"at {d320_new} times the default's speed (`bench_results/frontier_epyc.json`)" in card


def test_structured_probe_numbers_are_its_logs():
    """Issue #48's probe: the bpc the training guide and results/structured quote are the CPU runs' logs."""
    guide, page = text("docs/guide/training.md"), text("results/structured/README.md")
    for name in ("dense216", "dplr384r54", "dplr512r37"):
        done = [json.loads(line) for line in text(f"results/structured/cpu/{name}/train_log.jsonl").splitlines()][-1]
        assert done["event"] == "done" and done["chars_seen"] >= 45_000_000
        bpc = f"{done['best_valid_bpc']:.4f}"
        assert bpc in guide and bpc in page, name


def test_structured_outcome_says_what_it_rests_on():
    """The results page and the CHANGELOG give the gap at every evaluation as its range, CPU and GPU, from the
    logs; the parameters and the dense engine's cost of the shapes are computed here."""
    def valid(path):
        return {e["chars_seen"]: e["valid_bpc"] for e in map(json.loads, text(path).splitlines()) if e["event"] == "valid"}

    names = ("dense216", "dplr384r54", "dplr512r37")
    page = " ".join(text("results/structured/README.md").split())
    changelog = " ".join(text("CHANGELOG.md").split())
    for where, path in (("CPU", "results/structured/cpu/{}/train_log.jsonl"),
                        ("H200", "bench_results/gpu_h200/run5/probe_{}.jsonl")):
        v = {n: valid(path.format(n)) for n in names}
        common = sorted(set.intersection(*(set(x) for x in v.values())))
        gaps = [v[n][c] - v["dense216"][c] for c in common for n in names[1:]]
        assert min(gaps) > 0, "worse at every evaluation"
        quoted = f"by {min(gaps):.3f} to {max(gaps):.3f} bpc on valid on the CPU" if where == "CPU" else \
            f"by {min(gaps):.3f} to {max(gaps):.3f} on the H200 (to {common[-1] / 1e6:.1f}M characters)"
        assert quoted in page, where
        assert f"{min(gaps):.3f} to {max(gaps):.3f}" in changelog, where
    starts = {n: json.loads(text(f"results/structured/cpu/{n}/train_log.jsonl").splitlines()[0]) for n in names}
    for n in names:  # one recipe and one seed, the dense model's
        cfg = starts[n]["config"]
        assert (cfg["lr"], cfg["weight_decay"], cfg["seed"]) == (0.002, 0.1, 0), n
    assert "learning rate (2e-3) and weight decay (0.1) and one seed (0)" in page
    params = {n: starts[n]["n_params"] for n in names}
    fewer = [1 - params[n] / params["dense216"] for n in names[1:]]
    assert f"the DPLR shapes have {fewer[0]:.0%} and {fewer[1]:.0%} fewer parameters" in page
    dense_cost = 216 * 216 + 27 * 216  # the default's multiply-adds a character, step and readout
    engine_cost = [d * d + 27 * d for d in (384, 512)]
    assert (f"({engine_cost[0]:,} at d = 384, {engine_cost[1]:,} at d = 512: {engine_cost[0] / dense_cost:.1f} and "
            f"{engine_cost[1] / dense_cost:.1f} times the default's {dense_cost:,})") in page



def test_training_guide_onnx_table_is_the_committed_run():
    """The training guide's ONNX table is `markdown_onnx` of bench_results/onnx.json, its ratio range and
    onnxruntime version those of the file."""
    from isan.bench.engine import markdown_onnx

    run = load("bench_results/onnx.json")
    guide = text("docs/guide/training.md")
    assert markdown_onnx(run) in guide
    ratios = [row["ratio"] for row in run["rows"]]
    assert f"{min(ratios):.1f}-{max(ratios):.1f} times as fast" in guide
    assert f"onnxruntime\n{run['onnxruntime']}" in guide or f"onnxruntime {run['onnxruntime']}" in guide


def test_ingest_rows_are_credited_with_the_steps_flops_only():
    """A committed `isan bench engine` run's ingest row (no readout) counts 2 d (d + 1) FLOPs a character."""
    from isan.bench.engine import useful_flops_per_char

    run = load("bench_results/engine_epyc.json")
    d, V = run["model"]["d"], len(run["model"]["alphabet"])
    (row,) = [r for r in run["rows"] if "no readout" in r["name"]]
    assert row["useful_gflops"] == pytest.approx(row["chars_per_s"] * useful_flops_per_char(d, V, readout=False) / 1e9)
    assert row["of_peak"] == pytest.approx(row["useful_gflops"] / run["facts"]["fma_peak"]["gflops_all_threads"])
    assert row["of_peak"] < 1.0
