"""The paper's analyses run on the shipped default model beside the paper's model (issue #45 item 6: the
second model was text8-d216-stable, a name kept apart from :data:`isan.engine.paths.DEFAULT_MODEL`), and the
lens's Fig 3 claim holds on the default: in "the annual reve", 'n' is the most likely next character, and
without "annual" the 'r' of "reverse" overtakes it (README, docs/guide/lens.md). Each figure heads a model's panels
with its test bpc from its committed score file beside the paper's 1.58 (ICML Sec 3.1), Fig 4 names the reading of
its panel (b) we adopt, and Fig 9 names its model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from isan.cli import main
from isan.engine import Engine
from isan.engine.paths import DEFAULT_MODEL, default_model_path, paper_model_path

REPO = Path(__file__).resolve().parents[1]


def _installed(path):
    if not (path / "manifest.json").exists():
        pytest.skip(f"{path} is not installed")
    return path


def test_every_study_shows_the_default_model_beside_the_papers(tmp_path):
    """`isan analyze all` (two quick studies of it here) and a single study compare with the default."""
    _installed(paper_model_path())
    _installed(default_model_path())
    runner = CliRunner()
    studies = ["stack", "contributions", "decay", "words", "words_paper", "word_embedding", "basis", "ngram", "pca",
               "samples", "attribution", "parentheses", "naive_bayes"]
    skip = [a for s in studies if s not in ("contributions", "samples") for a in ("--skip", s)]
    r = runner.invoke(main, ["analyze", "all", "--out", str(tmp_path), *skip])
    assert r.exit_code == 0, r.output
    paper = json.loads((tmp_path / "paper.json").read_text())
    assert paper["model"]["path"] == str(paper_model_path())
    assert list(paper["compare"]) == [DEFAULT_MODEL]
    assert paper["compare"][DEFAULT_MODEL]["path"] == str(default_model_path())
    for name in ("contributions", "samples"):
        study = json.loads((tmp_path / f"{name}.json").read_text())
        assert study["label"] == paper_model_path().name and list(study["compare"]) == [DEFAULT_MODEL], name
    r = runner.invoke(main, ["analyze", "stack", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert list(json.loads(r.output)["compare"]) == [DEFAULT_MODEL]
    r = runner.invoke(main, ["analyze", "stack", "--help"])
    assert f"isan/models/{DEFAULT_MODEL}, the shipped default" in " ".join(r.output.split())


def test_fig3_counterfactual_holds_on_the_default_model():
    """The paper's Fig 3 counterfactual (the kappa of ' annual' removed from the logits, `isan analyze
    contributions`) on the default: 'n' on top with "annual", 'r' on top without it, decoding "reverse"."""
    import numpy as np

    from isan.engine.analysis import studies
    from isan.engine.bundle import load_isan_bundle

    _, p, alphabet = load_isan_bundle(_installed(default_model_path()))
    cf = studies.study_contributions(p, tuple(alphabet.symbols))
    full, without = cf["full"], cf["without"]
    assert full["top"] == "n" and full["probs"]["n"] > full["probs"]["r"]
    assert without["top"] == "r" and without["probs"]["r"] > without["probs"]["n"]
    assert without["greedy"].startswith("rse") and full["greedy"].startswith("nue")
    assert cf["word_contribution"]["n"] > 0 > cf["word_contribution"]["r"]  # 'annual' pushes 'n' up, 'r' down


@pytest.mark.parametrize("removed", ["the  reve", "the reve"])
def test_the_lens_counterfactual_holds_on_the_default_model(removed):
    """The lens removes the word from the text and predicts again (two POST /v1/next): with "annual" the
    'n' of "revenue" is the most likely, without it the 'r' of "reverse" overtakes it."""
    engine = Engine.load(_installed(default_model_path()))

    def probs(text):
        top = engine.top_k(engine.score(text).state, len(engine.alphabet))
        return top[0]["symbol"], {d["symbol"]: d["prob"] for d in top}

    top, p = probs("the annual reve")
    assert top == "n" and p["n"] > p["r"]
    top, p = probs(removed)
    assert top == "r" and p["r"] > p["n"]


def test_naive_bayes_cites_the_section_it_quotes():
    """The Naive Bayes sentence is in ICML Sec 3.1 ("ISAN performance on Text8 prediction"); Sec 3.2 is the
    Billion Word Benchmark (issue #34 item 18)."""
    from isan.cli.analyze import naive_bayes_study

    r = naive_bayes_study("ab ab ab ba", "ab ba", tuple(" ab"), max_window=2)
    assert r["paper"].startswith("ICML Sec 3.1") and "3.2" not in r["paper"]


def test_finite_json():
    import numpy as np

    from isan.engine.analysis import studies

    assert studies.finite({"a": np.float32(np.nan), "b": [np.inf, 1], "c": np.arange(2)}) == {"a": None, "b": [None, 1], "c": [0, 1]}


# ------------------------------------------------------------------ the figures' headings: each model's test bpc
def _committed_bpc(name: str) -> float:
    """The test bpc of a model as its committed score file gives it (results/scoring, results/paper/models)."""
    from isan.engine.analysis import quality

    for pattern in quality.SCORE_FILES:
        path = REPO / pattern.format(name=name)
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))["bpc"]
    pytest.skip(f"no committed test score for {name}")


def _keep_figure(monkeypatch):
    """Make the figure functions return the matplotlib figure instead of writing it."""
    pytest.importorskip("matplotlib")
    from isan.engine.analysis import figures

    monkeypatch.setattr(figures, "_save", lambda fig, out: fig)
    return figures


def test_the_papers_number_is_cited_where_the_paper_states_it(monkeypatch):
    """1.58 bpc is the paper's analysed model, "All analyses use ISAN trained with 1.28e6 maximum parameters
    (1.58 bpc cross entropy)" (ICML Sec 3.1); the headings take it from the one cited constant."""
    from isan.engine.analysis import quality

    assert quality.PAPER_TEST_BPC == 1.58 and quality.PAPER_TEST_BPC_CITED == "ICML Sec 3.1"
    assert quality.paper_bpc_note() in quality.model_title("anything")
    monkeypatch.setattr(quality, "PAPER_TEST_BPC", 9.87)
    assert "the paper's model: 9.87 bpc (ICML Sec 3.1)" in quality.model_title("anything")


@pytest.mark.parametrize("name", ["text8-d216-unconstrained", "text8-d216-distil"])
def test_every_per_model_heading_gives_the_committed_test_bpc(monkeypatch, name):
    """Figs 2-8 head each model's block with its name, its test bpc read from results/scoring (never typed in)
    and the paper's model's; a figure of one model too."""
    figures = _keep_figure(monkeypatch)
    other = "text8-d216-distil" if name != "text8-d216-distil" else "text8-d216-unconstrained"
    for blocks in ([(name, None)], [(name, None), (other, None)]):
        fig = figures._per_model(blocks, 4, 2, lambda sf, data, label: None)
        heads = [fig.get_suptitle()] if len(blocks) == 1 else [sf.get_suptitle() for sf in fig.subfigs]
        for (label, _), head in zip(blocks, heads):
            assert head.startswith(f"model: {label}\n")
            assert f"{_committed_bpc(label):.3f} bpc on text8-10M's test split" in head
            assert "the paper's model: 1.58 bpc (ICML Sec 3.1)" in head


def test_the_heading_reads_the_score_file_and_says_when_it_is_broken(tmp_path):
    from isan.engine.analysis import quality
    from isan.errors import IsanError

    scores = tmp_path / "results" / "scoring"
    scores.mkdir(parents=True)
    assert "bpc on" not in quality.model_title("mine", root=tmp_path)  # no committed score: the paper's only
    (scores / "mine.text8_test.json").write_text(json.dumps({"bpc": 1.23456}))
    assert "model: mine\n1.235 bpc on text8-10M's test split; the paper's" in quality.model_title("mine", root=tmp_path)
    (scores / "mine.text8_test.json").write_text(json.dumps({"bpc": None}))
    with pytest.raises(IsanError, match="mine.text8_test.json has no finite 'bpc'"):
        quality.model_title("mine", root=tmp_path)


def test_fig1b_legend_gives_each_models_test_bpc(monkeypatch):
    """Fig 1b: the ISANs' scores from results/scoring, the baselines' from results/paper/models."""
    figures = _keep_figure(monkeypatch)
    spectra = {name: {"ratio": [0.5, 0.3, 0.2], "dims_for": {"0.9": 3}}
               for name in ("isan (text8-d216-unconstrained)", "gru-3.2e5", "mine")}
    fig = figures.fig1b_pca(spectra, None)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert f"; test {_committed_bpc('text8-d216-unconstrained'):.3f} bpc)" in legend[0]
    assert f"; test {_committed_bpc('gru-3.2e5'):.3f} bpc)" in legend[1]
    assert legend[2] == "mine (d=3, 3 comps for 90%)"
    assert "the paper's model: 1.58 bpc (ICML Sec 3.1)" in fig.axes[0].get_title()


def test_fig4_names_our_reading_plainly_and_the_other_as_the_other(monkeypatch):
    """Fig 4b: panel (b) is the reading we adopt, every space's kappa; (b') the other, the last space's."""
    import numpy as np

    from conftest import random_params
    from isan.engine.analysis import decay

    figures = _keep_figure(monkeypatch)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 27, size=3000)
    ids[rng.random(3000) < 0.2] = 0
    st = decay.window_statistics(random_params(d=8, seed=1).astype(np.float64), ids, window=10, segments=1,
                                 dtype=np.float64)
    fig = figures.fig4_decay([("text8-d216-distil", (st, decay.fit_two_rates(st.kappa_norm_mean)))], None, min_count=1)
    (b, b_other) = fig.axes[1:3]
    assert b.get_title().startswith("(b) our reading: the kappa of every space read so far")
    assert any("every space's kappa" in t.get_text() for t in b.get_legend().get_texts())
    assert b_other.get_title().startswith("(b') the other reading: only the last space's kappa")
    assert any("the last space's kappa" in t.get_text() for t in b_other.get_legend().get_texts())


def test_fig9_names_its_model(monkeypatch, tmp_path):
    """Fig 9's heading names the parentheses ISAN, where it lies, its width and size, and why it has no bpc."""
    import numpy as np

    from conftest import random_params
    from isan.engine.analysis import figures, studies
    from isan.train.tasks.parentheses import ParenthesesTask

    seen = {}
    monkeypatch.setattr(figures, "fig9_parentheses", lambda *a, **k: seen.update(k) or tmp_path / "fig9.png")
    task = ParenthesesTask()
    ids = task.sample(300, 0)
    counts = task.counts(ids)
    target = np.zeros_like(counts)
    target[1:] = counts[:-1]
    p = random_params(K=5, V=12, d=35, seed=11)
    studies.study_parentheses(p, task.alphabet.symbols, ids, target, counts, 2, 6, hold=4, out_dir=tmp_path,
                              model="runs/parens")
    assert seen["title"] == (f"model: the parentheses ISAN of Sec 4 (runs/parens), d = 35, {p.n_params():,} parameters; "
                             "trained on the counting task with an L2 loss (no bpc)")


def test_the_gallerys_run_time_is_its_logs():
    """results/paper/README.md and the guide quote the run of `isan analyze all` from its committed log."""
    import re

    log = (REPO / "results/paper/analyze_all.log").read_text(encoding="utf-8")
    m, s = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\d+):(\d+)", log).groups()
    cpu = sum(float(re.search(rf"{k} time \(seconds\): ([\d.]+)", log).group(1)) for k in ("User", "System"))
    studies = {k: round(float(v)) for k, v in re.findall(r"^(\w+): ([\d.]+) s$", log, re.M)}
    readme = " ".join((REPO / "results/paper/README.md").read_text(encoding="utf-8").split())
    guide = " ".join((REPO / "docs/guide/analyses.md").read_text(encoding="utf-8").split())
    took = f"{int(m)} min {int(s)} s"
    assert f"It took {took}" in readme and f"{took} with one thread" in guide
    cpu_time = f"{int(cpu // 60)} min {round(cpu % 60)} s of CPU time"
    assert cpu_time in readme and cpu_time in guide
    share = re.search(r"Percent of CPU this job got: (\d+)%", log).group(1)
    assert f"command got {share}% of one on average" in readme
    assert f"both models, {studies['decay']} s" in readme and f"ICLR Fig 6, {studies['word_embedding']} s" in readme
