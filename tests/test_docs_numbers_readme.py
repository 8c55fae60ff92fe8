"""Each number of the README's introduction and headline table, and of the site's front page
(docs/index.md), is read from the committed file that holds it, formatted as the page prints it, and
looked for in the sentence or table row that quotes it: a changed number, or one moved to another
row, fails. Ratios are computed from the two measurements they compare. Nothing is measured here."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(rel: str) -> dict:
    return json.loads((ROOT / rel).read_text(encoding="utf-8"))


def flat(rel: str) -> str:
    """The page with every run of whitespace made one space (sentences cross lines)."""
    return " ".join((ROOT / rel).read_text(encoding="utf-8").split())


def row(rel: str, label: str) -> str:
    """The one table row of ``rel`` whose first cell starts with ``label``."""
    rows = [ln for ln in (ROOT / rel).read_text(encoding="utf-8").splitlines() if ln.startswith(f"| {label}")]
    assert len(rows) == 1, f"{rel}: {len(rows)} rows start with {label!r}"
    return rows[0]


def by_name(rows: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in rows}


@pytest.fixture(scope="module")
def frontier() -> dict:
    f = load("bench_results/frontier_epyc.json")
    return {"kenlm": f["kenlm"], **by_name(f["rows"])}


@pytest.fixture(scope="module")
def engine() -> dict:
    return by_name(load("bench_results/engine_epyc.json")["rows"])


def test_the_introduction_quotes_the_frontier_run(frontier):
    """The models' bits and speed ratios: one run of `isan bench frontier`, the default beside the others."""
    from isan.engine import Engine

    distil, stable, d320 = (frontier[n] for n in ("text8-d216-distil", "text8-d216-stable", "text8-d320-stable"))
    assert distil["params_sha256"] == Engine.default().params_sha256, "measured on the default"
    page = flat("README.md")
    speed = lambda r: r["chars_per_s"] / distil["chars_per_s"]  # noqa: E731
    assert (f"`text8-d216-distil` (d = 216, certified stable, distilled from `text8-d320-stable`; "
            f"{distil['test_bpc']:.4f} bpc on the text8-10M test split)") in page
    assert (f"`text8-d216-stable` (the previous default, the same width: {stable['test_bpc']:.4f}, "
            f"{speed(stable):.2f} times the default's speed)") in page
    assert (f"`text8-d320-stable` ({d320['test_bpc']:.4f}, {distil['test_bpc'] - d320['test_bpc']:.3f} bits better "
            f"than the default at {speed(d320):.2f} times its speed)") in page


def test_the_introduction_quotes_the_h200_run_like_with_like():
    """The GPU sentence says which call each rate is and what its ratio is against: one CPU call of the same
    documents, each character's bits, on the same machine's cores."""
    g = load("bench_results/gpu_h200/run5/gpu.json")
    rows, docs = by_name(g["rows"]), g["sizes"]["docs"]
    cpu = rows[f"CPU compiled kernels: {docs:,} documents x {g['sizes']['doc_chars']}"]
    one = rows[f"cuda float32, step triton: {docs:,} documents x {g['sizes']['doc_chars']}"]
    over = rows["cuda float32, step triton: 4 such batches, overlapped (score_batches, totals)"]
    assert g["sizes"]["pipeline_batches"] == 4 and g["gpu"]["device_name"] == "NVIDIA H200"
    assert g["cpu_threads"] == g["machine"]["cores"] == 16 and "Xeon" in g["machine"]["cpu"]
    page = flat("README.md")
    assert (f"on an NVIDIA H200, one call of {docs:,} documents with each character's bits ran at "
            f"{one['chars_per_s'] / 1e6:.0f}M chars/s, {one['chars_per_s'] / cpu['chars_per_s']:.1f} times the same "
            f"call on the machine's {g['cpu_threads']} Xeon cores") in page
    assert (f"four such batches overlapped, keeping each document's total only, ran at "
            f"{over['chars_per_s'] / 1e6:.0f}M, {over['chars_per_s'] / cpu['chars_per_s']:.1f} times that CPU call, "
            "which has no overlapped mode") in page


def test_headline_bits(frontier):
    r = row("README.md", "the default model")
    assert (f"**{frontier['text8-d216-distil']['test_bpc']:.4f}** bpc (the previous default "
            f"{frontier['text8-d216-stable']['test_bpc']:.4f}; our Kneser-Ney 8-gram through KenLM "
            f"{frontier['kenlm']['test_bpc']:.4f}") in r
    t1 = {m: load(f"results/table1/{m}-1.28e6/score.json")["bpc"] for m in ("isan", "lstm", "irnn")}
    assert f"ISAN {t1['isan']:.3f}, LSTM {t1['lstm']:.3f}, IRNN {t1['irnn']:.3f} bpc" in row("README.md", "Table 1 at 1.28e6")


def test_headline_engine_rows(engine):
    """engine_epyc.json: the long text (default path, one character a step, one thread), its ratio to the
    float64 reference, KenLM's peer row, and streaming through the float32 and float16 tables."""
    e = load("bench_results/engine_epyc.json")
    threads = e["threads"]
    long_text = engine["long text (2,500,000 unseen chars, chunk-parallel, default path)"]["chars_per_s"]
    step = engine["long text (2,500,000 unseen chars, chunk-parallel, one character a step)"]["chars_per_s"]
    one = engine["long text, 1 thread"]["chars_per_s"]
    kenlm = engine["peer: KenLM (Python module) querying our order-8 n-gram, 1 thread"]["chars_per_s"]
    ratio = long_text / engine["reference"]["chars_per_s"]
    assert e["facts"]["long_text"]["scoring"]["path"] == "jumps", "the row says: by composed jumps"
    assert (f"{long_text / 1e6:.2f}M chars/s on {threads} threads by composed jumps, {ratio:.0f}x the float64 reference "
            f"({step / 1e6:.2f}M one character a step; {one / 1e6:.2f}M on one thread; KenLM {kenlm / 1e6:.2f}M on one "
            "thread") in row("README.md", "one long text, chunk-parallel")
    f32 = engine["streaming, 1,000-char chunks, float32 table"]["chars_per_s"]
    f16 = engine["streaming, 1,000-char chunks, float16 table"]["chars_per_s"]
    assert f"{f32 / 1e3:.0f}k chars/s float32, {f16 / 1e3:.0f}k float16" in row("README.md", "streaming 1,000-character")


def test_headline_server_row():
    s = load("bench_results/serve_epyc.json")
    http, stream = s["http"], s["stream"]
    r = row("README.md", "isan-serve")
    assert f"isan-serve, {http['clients']} clients x {http['text_chars'] // 1000} KB" in r
    assert stream["errors"] == 0 and stream["frames_ok"] == stream["streams"] * stream["chunks"], "none refused"
    assert (f"{http['requests_per_s']:.0f} requests/s, p99 {http['latency_s']['p99'] * 1e3:.0f} ms; "
            f"{stream['streams']:,} WebSocket streams at once, none refused") in r


def test_headline_corpus_rows():
    c = load("bench_results/corpus_epyc.json")
    local, _ray, kenlm = c["rows"]
    assert local["name"].startswith("isan, local runner (2 threads)") and kenlm["name"].startswith("KenLM")
    assert c["facts"]["ray_identical_to_local"] is True, "Ray writes identical files"
    r = row("README.md", "a 50 MB corpus")
    assert f"a {c['corpus']['bytes'] / 1e6:.0f} MB corpus" in r
    assert (f"{local['chars_per_s'] / 1e6:.2f}M chars/s on 2 threads in one process (KenLM "
            f"{kenlm['chars_per_s'] / 1e6:.2f}M on one thread") in r
    one, two = c["facts"]["scaling"]
    assert one["workers"] == 1 and two["workers"] == 2 and one["identical"] and two["identical"]
    assert (f"2 workers {two['speedup']:.2f}x one, the same output bytes; isan/KenLM {one['isan_over_kenlm']:.2f} "
            f"and {two['isan_over_kenlm']:.2f} at 1 and 2 processes") in row("README.md", "worker processes")


def test_front_page_headline_rows(frontier, engine):
    """docs/index.md's table quotes the same files at full precision."""
    page = "docs/index.md"
    assert (f"**{frontier['text8-d216-distil']['test_bpc']:.4f}** bpc (valid "
            f"{load('results/scoring/text8-d216-distil.text8_valid.json')['bpc']:.4f}; the previous default, "
            f"`text8-d216-stable`, {frontier['text8-d216-stable']['test_bpc']:.4f}); our Kneser-Ney 8-gram through "
            f"KenLM {frontier['kenlm']['test_bpc']:.4f}") in row(page, "the default model")
    t1 = {m: load(f"results/table1/{m}-1.28e6/score.json")["bpc"] for m in ("isan", "lstm", "irnn")}
    assert f"ISAN {t1['isan']:.3f}, LSTM {t1['lstm']:.3f}, IRNN {t1['irnn']:.3f} test bpc" in row(page, "Table 1")
    cps = {k: v["chars_per_s"] for k, v in engine.items()}
    long_text = cps["long text (2,500,000 unseen chars, chunk-parallel, default path)"]
    lstm = cps["peer: onnxruntime LSTM 548 units (1,276,319 params), streaming"]
    assert (f"{long_text:,.0f} chars/s by composed jumps, {long_text / cps['reference']:.2f}x the float64 reference "
            f"({cps['long text (2,500,000 unseen chars, chunk-parallel, one character a step)']:,.0f} one character a "
            f"step; {cps['long text, 1 thread']:,.0f} on one thread); KenLM "
            f"{cps['peer: KenLM (Python module) querying our order-8 n-gram, 1 thread']:,.0f} on one thread; "
            f"{long_text / lstm:.0f} times onnxruntime's LSTM") in row(page, "one long text")
    assert (f"{cps['streaming, 1,000-char chunks, float32 table']:,.0f} chars/s float32, "
            f"{cps['streaming, 1,000-char chunks, float16 table']:,.0f} float16") in row(page, "streaming 1,000")
    s = load("bench_results/serve_epyc.json")
    assert (f"{s['http']['requests_per_s']:.0f} requests/s, p99 {s['http']['latency_s']['p99'] * 1e3:.0f} ms; "
            f"{s['stream']['streams']:,} WebSocket streams at once, {s['stream']['frames_per_s']:,.0f} frames/s, "
            "none refused") in row(page, "isan-serve")
    c = load("bench_results/corpus_epyc.json")
    local, _ray, kenlm = c["rows"]
    assert (f"{local['chars_per_s']:,.0f} chars/s (local runner in one process, 2 threads, composed jumps), Ray "
            f"{c['facts']['ray_over_local_time']:.2f} times its time, identical files; KenLM {kenlm['chars_per_s']:,.0f} "
            "on one thread") in row(page, "scoring a 50 MB corpus")
    one, two = c["facts"]["scaling"]
    assert (f"2 workers {two['speedup']:.2f}x one, the same output bytes; isan / KenLM {one['isan_over_kenlm']:.2f} "
            f"and {two['isan_over_kenlm']:.2f} at 1 and 2 processes") in row(page, "worker processes")


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_inference_dependencies_are_the_packages(page):
    """The page names every package the install requires (pyproject.toml's dependencies), and no other."""
    import re
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    names = {re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in deps}
    quoted = re.search(r"Inference needs only (.+?), plus isan's own C", flat(page))
    assert quoted, f"{page} does not list the inference dependencies"
    assert set(re.split(r", | and ", quoted.group(1))) == names

