"""The documentation (issue #27): the site builds offline with `mkdocs build --strict`, loads
nothing from the network when read, and every example of the guides runs and prints what it shows.

Sybil finds the examples of docs/**/*.md and README.md (#45 item 4): each ```python block runs as
it is, in a fresh namespace (one that needs a package of an extra that is not installed is skipped,
saying which); a block of ``>>>`` lines is a doctest, its printed outputs compared with doctest's
ELLIPSIS; a ```console block runs each ``$ `` command in bash from the repository root and compares
what it prints (stdout then stderr) with the lines under it, ``...`` matching anything and runs of
whitespace equal. A changed default model or message fails here. A block that talks to
``http://127.0.0.1:8000`` (a running ``isan-serve``) gets the default model served on a free port.
"""

from __future__ import annotations

import doctest
import importlib.util
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SERVER = "http://127.0.0.1:8000"

# Hosts a page must never load from: web fonts, CDNs, analytics.
FORBIDDEN_HOSTS = ("fonts.googleapis.com", "fonts.gstatic.com", "cdn.jsdelivr.net", "cdnjs.cloudflare.com",
                   "unpkg.com", "googletagmanager.com", "google-analytics.com", "use.fontawesome.com",
                   "polyfill.io", "gstatic.com")
# Material's JavaScript bundle names two URLs it fetches only on demand: a ResizeObserver polyfill
# for browsers that lack one (every current browser has it) and mermaid for pages with mermaid
# diagrams (none here; checked below). Nothing else may name a forbidden host.
ON_DEMAND = ("https://unpkg.com/resize-observer-polyfill", "https://unpkg.com/mermaid@")


def _example_files() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_tools" not in p.parts) + [REPO / "README.md"]


#: doctest's comparison for printed outputs: "..." matches anything, runs of whitespace are equal
OUTPUT_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _console(example) -> str | None:
    """Sybil's evaluator of a ```console block: each ``$ `` line runs in bash from the repository root
    (the interpreter's own scripts, ``isan`` among them, first on PATH); the lines under it are what it
    prints. Returns None when every command printed what the block shows, else the difference."""
    commands: list[tuple[str, list[str]]] = []
    for line in str(example.parsed).splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands:
            commands[-1][1].append(line)
    if not commands:
        return "a console block without a '$ ' command"
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    checker = doctest.OutputChecker()
    for command, lines in commands:
        proc = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
        got, want = proc.stdout + proc.stderr, "\n".join(lines).strip() + "\n"
        if not checker.check_output(want, got, OUTPUT_FLAGS):
            return f"$ {command}\n" + checker.output_difference(doctest.Example(command, want), got, OUTPUT_FLAGS)
    return None


SYBIL = Sybil(parsers=[PythonCodeBlockParser(doctest_optionflags=OUTPUT_FLAGS),
                       CodeBlockParser("console", evaluator=_console), SkipParser()])


def _examples() -> list[tuple[str, list]]:
    """(name, Sybil examples) for every block of the guides and the README, in document order: a code
    or console block is one example, a block of ``>>>`` lines one doctest example a statement."""
    out: list[tuple[str, list]] = []
    for path in _example_files():
        text = path.read_text(encoding="utf-8")
        blocks: list[list] = []
        for example in SYBIL.parse(path):
            same_block = (blocks and not isinstance(example.parsed, str) and not isinstance(blocks[-1][-1].parsed, str)
                          and "```" not in text[blocks[-1][-1].end:example.start])
            if same_block:
                blocks[-1].append(example)
            else:
                blocks.append([example])
        out += [(f"{path.relative_to(REPO).as_posix()}#{i + 1}", b) for i, b in enumerate(blocks)]
    return out


EXAMPLES = _examples()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built by `mkdocs build --strict` (every warning an error) into a temporary folder."""
    for mod in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (pip install '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    print(f"mkdocs build --strict: {time.perf_counter() - t0:.1f} s")
    return out


def test_site_builds_with_every_page(site):
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    for md in DOCS.rglob("*.md"):
        if "_tools" in md.parts:
            continue
        html = md.relative_to(DOCS).with_suffix(".html").as_posix()
        assert html in pages, f"{md.relative_to(REPO)} is not in the built site"
    # the API reference is generated from the docstrings, not empty
    engine = (site / "reference" / "engine.html").read_text(encoding="utf-8")
    for name in ("Engine", "score", "score_batch", "attribute", "top_k"):
        assert name in engine
    assert "isan.engine.bundle.read_manifest" in (site / "reference" / "bundle.html").read_text(encoding="utf-8")
    assert "score_corpus" in (site / "reference" / "corpus.html").read_text(encoding="utf-8")
    assert "header_sha256" in (site / "reference" / "table.html").read_text(encoding="utf-8")


def test_site_loads_nothing_from_the_network(site):
    """No web fonts, CDN scripts or analytics in the built site, at build or view time."""
    checked = 0
    for path in site.rglob("*"):
        if path.suffix not in (".html", ".css", ".js", ".json", ".xml", ".txt"):
            continue  # source maps (.map) are read by a browser's developer tools only
        text = path.read_text(encoding="utf-8", errors="replace")
        checked += 1
        rel = path.relative_to(site).as_posix()
        if path.suffix == ".html":
            # no element that loads a resource may point off the site
            for tag in re.findall(r"<(?:script|link|img|iframe|source|video|audio|embed|object)\b[^>]*>", text, re.I):
                url = re.search(r"\b(?:src|href|data)\s*=\s*[\"']?\s*(?:https?:)?//", tag, re.I)
                assert url is None, f"{rel}: {tag} loads from the network"
            assert 'class="mermaid"' not in text, f"{rel}: a mermaid diagram would load mermaid from a CDN"
        if path.suffix == ".css":
            assert not re.search(r"@import\s+(?:url\()?[\"']?(?:https?:)?//", text), f"{rel}: imports a remote stylesheet"
            assert not re.search(r"url\(\s*[\"']?(?:https?:)?//", text), f"{rel}: loads a remote resource"
        for host in FORBIDDEN_HOSTS:
            for m in re.finditer(re.escape(host), text):
                around = text[max(0, m.start() - 40):m.end() + 40]
                assert path.suffix == ".js" and any(u in around for u in ON_DEMAND), f"{rel} names {host}: {around!r}"
    assert checked > 20


def _load_hook():
    spec = importlib.util.spec_from_file_location("repo_links", DOCS / "_tools" / "repo_links.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_links_to_repository_files_are_checked(caplog):
    """Links from a guide to committed files outside docs/ become their paths on the site; a link to
    a file that does not exist is a warning, which fails the strict build."""
    pytest.importorskip("mkdocs")
    hook = _load_hook()

    class File:
        abs_src_path = str(DOCS / "guide" / "benchmarks.md")
        src_uri = "guide/benchmarks.md"

    class Page:
        file = File()

    config = {"docs_dir": str(DOCS), "config_file_path": str(REPO / "mkdocs.yml")}
    md = ("See [TABLE.md](../../results/table1/TABLE.md), [2.107](../../results/table1/isan-8e4/), "
          "[the engine](../reference/engine.md) and `[not](a/link.md)`.\n```\n[x](../../nowhere.md)\n```\n")
    with caplog.at_level(logging.WARNING):
        out = hook.on_page_markdown(md, Page(), config, None)
    assert "`results/table1/TABLE.md`" in out and "2.107 (`results/table1/isan-8e4/`)" in out
    assert "[the engine](../reference/engine.md)" in out and "`[not](a/link.md)`" in out
    assert "[x](../../nowhere.md)" in out  # code blocks are left alone
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        hook.on_page_markdown("[gone](../../results/no-such-file.json)", Page(), config, None)
    assert any("does not exist" in r.getMessage() for r in caplog.records)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs' toc make it (for the headings used here)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text))


def test_readme_links_resolve():
    """The README links into the docs by relative paths (which work on GitHub and in a checkout):
    each must name a file that exists, and each anchor a heading of that file."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150, "the README stays short: the guides hold the details"
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", readme)
    assert len(links) > 10
    for link in links:
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.exists(), f"README.md links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+\s+(.*)$", target.read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"README.md links to {link}: no such heading"


def test_guides_have_examples():
    names = {name.split("#")[0] for name, _ in EXAMPLES}
    for guide in ("docs/guide/getting-started.md", "docs/guide/scoring.md", "docs/guide/analyses.md",
                  "docs/guide/server.md", "docs/guide/corpora.md", "README.md"):
        assert guide in names, f"{guide} has no Python example"


@pytest.fixture(scope="module")
def served_default():
    """The default model served on a free localhost port, for examples that need isan-serve."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    sys.path.insert(0, str(Path(__file__).parent))
    from server_helpers import running

    from isan.engine import Engine
    from isan.engine.serve import create_app

    with running(create_app(Engine.default())) as addr:
        yield f"http://{addr}"


@pytest.mark.parametrize("name,examples", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_example_runs(name, examples, request):
    namespace = examples[0].namespace  # the document's: each block on its own, whatever ran before it
    namespace.clear()
    namespace["__name__"] = "__docs_example__"
    try:
        for example in examples:
            code = str(example.parsed)
            if isinstance(example.parsed, str) and SERVER in code:  # a code block that needs isan-serve
                pytest.importorskip("openai")
                code = code.replace(SERVER, request.getfixturevalue("served_default"))
                exec(compile(code, name, "exec"), namespace)
            else:
                example.evaluate()
    except ModuleNotFoundError as e:  # an optional extra that is not installed; isan's own modules must import
        if e.name is None or e.name.split(".")[0] == "isan":
            raise
        pytest.skip(f"{name} needs {e.name}, which is not installed")


def test_the_repository_cites_its_own_docs_not_outside_design_notes():
    """No tracked file cites the developers' design notes (a file outside the repository that no
    user or contributor has, issue #34 item 22): code, tests, guides and results cite
    docs/ARCHITECTURE.md, the guides or the paper, and ARCHITECTURE.md holds the model's
    conventions those citations need."""
    this = Path(__file__).resolve().relative_to(REPO).as_posix()
    try:
        proc = subprocess.run(["git", "grep", "-n", "-I", "-i", "-E", r"DESIGN\.md|design notes", "--", ".",
                               f":(exclude){this}"], cwd=REPO, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if proc.returncode not in (0, 1):  # 1: no match
        pytest.skip(f"not a git checkout: {proc.stderr.strip()[:200]}")
    hits = proc.stdout.splitlines()
    assert not hits, f"{len(hits)} lines cite the design notes:\n" + "\n".join(h[:160] for h in hits)

    arch = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert "\n## The model and its conventions\n" in arch
    section = arch.split("\n## The model and its conventions\n", 1)[1].split("\n## ", 1)[0]
    for fact in ("`W` (K, d, d)", "`h_t = W[x_t] @ h_{t-1} + b[x_t]`", "`logits_t = W_ro @ h_t + b_ro`",
                 "`bits_t = -log2 softmax(W_ro h_{t-1} + b_ro)[x_t]`", "`A_s = W[x_k] ... W[x_1]`",
                 "`R_i = W_ro A_{x_1..x_i}`", "`r_i = W_ro c_{x_1..x_i} + b_ro`", "`b[x_0] := h0`",
                 "`logits_t = b_ro + sum_{s=0..t} kappa[t, s]`"):
        assert fact in section, f"ARCHITECTURE.md's model section lacks {fact}"
    speed = (DOCS / "guide" / "tables-and-speed.md").read_text(encoding="utf-8")
    assert "\n## Measured facts the code relies on\n" in speed


def test_every_headline_speed_row_has_its_result_file():
    """Each speed row of the README's headline table (#34 item 21) links the committed result file
    of the current default model, or of the shipped model the row names (a row measured before the
    default changed says which model it measured), and names the machine that file was measured on."""
    import json

    from isan.engine import Engine, default_model_path

    sha = Engine.default().params_sha256
    shipped = {json.loads((b / "manifest.json").read_text())["params_sha256"]: b.name
               for b in default_model_path().parent.iterdir() if (b / "manifest.json").is_file()}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Headline numbers", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("|") and re.search(r"chars/s|requests/s|workers", ln)]
    assert len(rows) >= 5
    for row in rows:
        files = re.findall(r"\]\((bench_results/[^)]+\.json)\)", row)
        assert files, f"a headline row without its result file: {row}"
        for f in files:
            res = json.loads((REPO / f).read_text())
            model = res["model"]
            got = model["params_sha256"] if isinstance(model, dict) else model
            assert got == sha or (got in shipped and f"`{shipped[got]}`" in row), \
                f"{f} is another model's, and the row does not name it"
            cpu = res["machine"]["cpu"]
            named = {"Xeon": "Xeon" in cpu, "EPYC": "EPYC" in cpu}
            assert any(k in row and v for k, v in named.items()), f"{row} does not name {f}'s machine ({cpu})"
