"""isan lens in a real browser (Chromium from the system, driven by Playwright for Python).

The page is loaded from a real isan-serve app; the test types, waits for the colouring, points at
characters and checks what the page shows (exact numbers in ``data-`` attributes) against the API:
``/v1/score`` (bits), ``/v1/next`` (the distribution) and ``/v1/attribute`` (kappa) to 1e-6 where the page
shows the same computation's numbers, within the float32 tolerance derived from the computation
(tests/tolerances.py) where it shows another's (bits streamed a character a frame), the sum checks, the
counterfactual, sampling, the keyboard paths, the permalink and themes, a byte bundle,
and no console errors. It measures the update after a keystroke on a 2,000-character text and the
attribution view of a 500-character text, and saves screenshots to a temporary directory.

Without Chromium, test_chromium_is_installed fails saying how to get it (the tests that drive it
skip); the whole module is skipped only when Playwright for Python (the ``dev`` extra) is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = os.environ.get("ISAN_CHROMIUM", "/usr/bin/chromium")
HAVE_CHROMIUM = bool(Path(CHROMIUM).exists() or shutil.which(CHROMIUM))
#: a machine without Chromium fails (the README's test command runs these tests) with how to get it
NO_CHROMIUM = (f"the browser tests of isan lens need Chromium, and there is none at {CHROMIUM}: install it "
               "(apt-get install -y chromium; .ci/run does) or set ISAN_CHROMIUM to the path of a Chromium binary")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright for Python is not installed (pip install playwright)")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from server_helpers import running  # noqa: E402
from tolerances import default_model_tolerance, isan_float32_tolerance  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TEXT = "the annual revenue of the company was seven million dollars"
#: the final 'n' of 'revenue' (paper Fig 3): the prediction after 'the annual reve'
FIG3 = TEXT.index("revenue") + 4
TOL = 1e-6


def model_tolerance(params, alphabet, text: str):
    """The float32 tolerance derived from the computation (tests/tolerances.py) of ``text`` on a token model."""
    p = params.astype(np.float64)
    y = alphabet.encode(text)
    x = y if alphabet.input_map is None else alphabet.input_map[y]
    return isan_float32_tolerance(p.W, p.b, p.W_ro, p.b_ro, p.h0, y, samples=4, inputs=x)


def launch(p):
    return p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)


@pytest.fixture(scope="module")
def server(default_engine):
    app = create_app(default_engine, config=ServeConfig(state_secret=b"lens" * 8))
    with running(app) as addr:
        yield f"http://{addr}"


def test_chromium_is_installed():
    """The browser tests run wherever the README's test command runs: without Chromium, a failure
    that says how to get it."""
    if not HAVE_CHROMIUM:
        pytest.fail(NO_CHROMIUM, pytrace=False)


def test_without_chromium_the_tests_fail_saying_how_to_get_it(tmp_path):
    """The README's test command on a machine without Chromium: a failure that names the fix, not a
    skip counted among the others."""
    env = {**os.environ, "ISAN_CHROMIUM": str(tmp_path / "no-chromium")}
    test = f"{__file__}::test_chromium_is_installed"  # this test only: the run must not start itself again
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], env=env,
                       cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout + r.stderr
    assert "apt-get install -y chromium" in r.stdout and "ISAN_CHROMIUM" in r.stdout, r.stdout


@pytest.fixture(scope="module")
def browser():
    if not HAVE_CHROMIUM:
        pytest.skip(f"no Chromium at {CHROMIUM} (test_chromium_is_installed fails, saying how to get it)")
    with sync_api.sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, server, tmp_path):
    ctx = browser.new_context(viewport={"width": 1366, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    pg.errors = errors
    pg.shots = tmp_path
    yield pg
    ctx.close()
    assert not errors, errors


@contextmanager
def lens_page(browser, eng, secret: bytes):
    """A page of the lens on a server of ``eng``: yields (page, address, console errors and
    warnings); the page closes before the server stops (it would try to reconnect)."""
    ctx = browser.new_context()
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    with running(create_app(eng, config=ServeConfig(state_secret=secret))) as addr:
        try:
            pg.goto(f"http://{addr}/#t=")  # an empty text (a link without one opens with an example)
            pg.wait_for_selector("#c0", state="attached", timeout=20_000)
            yield pg, addr, errors
        finally:
            ctx.close()


def api(server, path, body):
    r = httpx.post(server + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def set_text(pg, text: str) -> None:
    """Replace the text as a paste would (one input event), then wait until it is coloured."""
    pg.evaluate("t => { const i = document.getElementById('input'); i.value = t; "
                "i.dispatchEvent(new Event('input', {bubbles: true})); }", text)
    wait_scored(pg, text)


def wait_scored(pg, text: str) -> None:
    pg.wait_for_function("n => document.body.dataset.state === 'ready' && document.body.dataset.scored === String(n)",
                         arg=len(text), timeout=20_000)


def point(pg, offset: int, hover: bool = True) -> dict:
    """Point at the character at ``offset`` and wait for its explanation; the numbers the page shows."""
    if hover:
        pg.hover(f"#c{offset}")
    pg.wait_for_function("o => document.body.dataset.explain === 'ready' && document.body.dataset.explainOffset === "
                         "String(o)", arg=offset, timeout=20_000)
    return shown(pg)


def shown(pg) -> dict:
    return pg.evaluate("""() => {
        const d = (id) => document.getElementById(id).dataset;
        return {next: [...document.querySelectorAll('#next .r[data-symbol]')].map(r => ({
                    symbol: r.dataset.symbol, prob: +r.dataset.prob, bits: +r.dataset.bits,
                    actual: r.classList.contains('actual')})),
                contributions: JSON.parse(d('attr').contributions), sources: JSON.parse(d('attr').sources),
                value: +d('check').value, base: +d('check').base, sum: +d('check').sum, logit: +d('check').logit,
                history: JSON.parse(d('history').bits), full: +d('history').full,
                ms: +document.body.dataset.explainMs};
    }""")


def test_colouring_prediction_and_attribution_match_the_api(page, server):
    pg = page
    pg.goto(server + "/#t=")  # an empty text (a link without one opens with an example)
    # a function, not an expression: Playwright evaluates expressions with eval, which the page's CSP refuses
    pg.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=20_000)
    pg.click("#input")
    pg.keyboard.type(TEXT, delay=5)  # typed: one frame per keystroke, only the new characters
    wait_scored(pg, TEXT)
    bits = pg.evaluate("() => [...document.querySelectorAll('#view span[data-off]:not(.end)')].map(s => +s.dataset.bits)")
    ref = api(server, "/v1/score", {"text": TEXT, "per_char": True})
    assert len(bits) == len(TEXT) == len(ref["per_char_bits"])
    # the stream scored one character a frame, /v1/score the whole text: two float32 computations
    tol = default_model_tolerance()
    np.testing.assert_allclose(bits, ref["per_char_bits"], rtol=0, atol=tol.twice().bits)
    bpc = float(pg.get_attribute("#bpc", "data-bpc"))
    assert abs(bpc - ref["bpc"]) <= tol.twice().total_bits / len(TEXT)
    pg.screenshot(path=str(pg.shots / "typed.png"))

    # point at the 'n' of 'revenue' (paper Fig 3): the distribution is /v1/next's after 'the annual reve'
    got = point(pg, FIG3)
    nxt = {x["symbol"]: x for x in api(server, "/v1/next", {"text": TEXT[:FIG3], "k": 27})["next"]}
    assert got["next"] and [r for r in got["next"] if r["actual"]][0]["symbol"] == "n"
    for r in got["next"]:
        assert abs(r["prob"] - nxt[r["symbol"]]["prob"]) <= TOL and abs(r["bits"] - nxt[r["symbol"]]["bits"]) <= TOL
    # the attribution of the logit of 'n' is /v1/attribute's kappa of the next character there
    att = api(server, "/v1/attribute", {"text": TEXT[:FIG3 + 1]})
    row = att["next_char_kappa"][FIG3 - 1]
    assert att["targets"][FIG3 - 1] == "n" and len(got["contributions"]) == FIG3 + 1 and row[-1] == 0.0
    np.testing.assert_allclose(got["contributions"], row[:-1], atol=TOL)
    assert got["sources"][0] == "<h0>" and "".join(got["sources"][1:]) == TEXT[:FIG3]
    assert abs(got["base"] + sum(got["contributions"]) - got["value"]) <= TOL and got["value"] == got["logit"]
    assert abs(got["sum"] - got["value"]) <= TOL
    # Fig 4c: n = 0 keeps b_ro only; keeping every symbol leaves only h0 out
    assert len(got["history"]) == FIG3 + 1 and all(np.isfinite(got["history"]))
    # the explanation in float64, /v1/next on the float32 path
    assert abs(got["history"][-1] - got["full"]) < 1.0 and abs(got["full"] - nxt["n"]["bits"]) <= tol.bits
    pg.screenshot(path=str(pg.shots / "explained.png"))

    # by word: the words of /v1/attribute by word (its last word is cut at the prediction)
    pg.select_option("#by", "word")
    pg.wait_for_function("() => JSON.parse(document.getElementById('attr').dataset.sources).includes('annual')")
    got = shown(pg)
    att = api(server, "/v1/attribute", {"text": TEXT[:FIG3 + 1], "by": "word"})
    assert got["sources"][:-1] == att["sources"][:-1] and att["sources"][-1] == got["sources"][-1] + "n"
    np.testing.assert_allclose(got["contributions"], att["next_char_kappa"][FIG3 - 1], atol=TOL)
    assert abs(got["base"] + sum(got["contributions"]) - got["value"]) <= TOL
    # the colours of the second view: the attribution at the cursor over the text
    pg.select_option("#colour", "attr")
    pg.wait_for_timeout(50)
    assert pg.get_attribute(f"#c{TEXT.index('annual')}", "style")

    # log-probability and the difference of two logits: exact sums
    pg.select_option("#target", "logprob")
    pg.wait_for_function("() => document.getElementById('check').textContent.startsWith('log p')")
    pg.wait_for_function("() => document.body.dataset.explain === 'ready'")
    got = shown(pg)
    assert abs(got["value"] - np.log(nxt["n"]["prob"])) <= np.log(2.0) * tol.bits  # nats: ln 2 times the bits'
    assert abs(got["base"] + sum(got["contributions"]) - got["value"]) <= TOL
    pg.select_option("#target", "logit_diff")
    pg.select_option("#other", "r")
    pg.wait_for_function("() => document.getElementById('check').textContent.includes('\"r\"')")
    pg.wait_for_function("() => document.body.dataset.explain === 'ready'")
    got = shown(pg)
    ex = api(server, "/v1/explain", {"text": TEXT, "offset": FIG3, "by": "word", "target": "logit_diff", "other": "r"})
    np.testing.assert_allclose(got["contributions"], ex["contributions"], atol=TOL)
    assert got["value"] == pytest.approx(ex["value"], abs=TOL) and got["value"] > 0  # 'annual' tips 'n' over 'r'
    annual = got["contributions"][got["sources"].index("annual")]
    assert annual > 0  # the paper's Fig 3c: the contribution of 'annual' favours 'n' over 'r'

    # counterfactual (Fig 3): remove 'annual' and predict again
    pg.select_option("#target", "logit")
    pg.wait_for_function("() => document.body.dataset.explain === 'ready'")
    pg.click("#attr .r[data-source='annual'] button")
    pg.click("#cf-go")
    pg.wait_for_function("() => document.getElementById('cf').dataset.probAfter !== undefined")
    cf = pg.evaluate("() => ({...document.getElementById('cf').dataset})")
    a = TEXT.index("annual")
    after = TEXT[:a] + TEXT[a + len("annual"):FIG3]
    assert cf["text"] == after
    ref_after = {x["symbol"]: x for x in api(server, "/v1/next", {"text": after, "k": 27})["next"]}
    assert abs(float(cf["probAfter"]) - ref_after["n"]["prob"]) <= TOL
    assert abs(float(cf["probBefore"]) - nxt["n"]["prob"]) <= TOL
    pg.fill("#cf-repl", "yearly")
    pg.click("#cf-go")
    pg.wait_for_function("() => document.getElementById('cf').dataset.text.includes('yearly')")
    pg.screenshot(path=str(pg.shots / "counterfactual.png"), full_page=True)


def test_keyboard_sampling_permalink_and_themes(page, server):
    pg = page
    pg.goto(server + "/#t=")
    pg.wait_for_selector("#c0", state="attached", timeout=20_000)
    set_text(pg, TEXT)
    # keyboard: the view takes arrows (Ctrl: by word), Home and End
    pg.focus("#view")
    pg.keyboard.press("Home")
    point(pg, 0, hover=False)
    pg.keyboard.press("ArrowRight")
    pg.keyboard.press("ArrowRight")
    got = point(pg, 2, hover=False)
    assert [r for r in got["next"] if r["actual"]][0]["symbol"] == "e"
    pg.keyboard.press("Control+ArrowRight")
    point(pg, 4, hover=False)
    pg.keyboard.press("End")
    got = point(pg, len(TEXT), hover=False)
    assert not any(r["actual"] for r in got["next"])  # after the whole text: nothing follows
    assert pg.get_attribute("#view", "aria-activedescendant") == f"c{len(TEXT)}"
    # the caret in the text box moves the cursor too
    pg.focus("#input")
    pg.evaluate("o => { const i = document.getElementById('input'); i.setSelectionRange(o, o); }", FIG3)
    pg.keyboard.press("ArrowLeft")
    point(pg, FIG3 - 1, hover=False)
    # every control has a name
    unnamed = pg.evaluate("""() => [...document.querySelectorAll('button, select, input, textarea')].filter(e =>
        !(e.getAttribute('aria-label') || (e.labels && e.labels.length) || e.textContent.trim())).map(e => e.id)""")
    assert not unnamed

    # sampling from the cursor at an inverse temperature, streamed: the server's sample for that seed
    pg.focus("#view")
    pg.keyboard.press("End")
    point(pg, len(TEXT), hover=False)
    pg.fill("#beta", "1.5")
    pg.fill("#n", "40")
    pg.fill("#seed", "7")
    pg.click("#sample")
    pg.wait_for_function("() => document.getElementById('sample-out').dataset.state === 'done'", timeout=20_000)
    out = pg.evaluate("() => ({...document.getElementById('sample-out').dataset})")
    ref = api(server, "/v1/sample", {"prompt": TEXT, "n": 40, "inverse_temperature": 1.5, "seed": 7, "stream": False})
    assert out["text"] == ref["text"] and int(out["events"]) >= 2
    pg.click("#insert")
    wait_scored(pg, TEXT + ref["text"])

    # permalink: text, settings and the cursor's offset in the fragment; themes and scales
    pg.select_option("#by", "word")
    pg.select_option("#palette", "cividis")
    pg.click("#theme")
    assert pg.evaluate("document.documentElement.dataset.theme") == "dark"
    pg.click(f"#c{FIG3}")  # choose an offset (pinned), then copy the link at once
    point(pg, FIG3, hover=False)
    pg.click("#permalink")
    pg.wait_for_timeout(300)
    url = pg.url
    assert "#t=" in url and "by=word" in url and "theme=dark" in url and f"pos={FIG3}" in url
    pg2 = pg.context.new_page()
    pg2.on("console", lambda m: pg.errors.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    pg2.goto(url)
    wait_scored(pg2, TEXT + ref["text"])
    assert pg2.input_value("#input") == TEXT + ref["text"] and pg2.input_value("#by") == "word"
    assert pg2.evaluate("document.documentElement.dataset.theme") == "dark"
    got = point(pg2, FIG3, hover=False)  # the link explains the offset it was copied at
    assert [r for r in got["next"] if r["actual"]][0]["symbol"] == "n" and "annual" in got["sources"]
    assert pg2.get_attribute("#view", "aria-activedescendant") == f"c{FIG3}"
    pg2.screenshot(path=str(pg.shots / "dark.png"))
    pg2.close()
    # a phone: one column, nothing wider than the screen
    pg.set_viewport_size({"width": 390, "height": 844})
    assert pg.evaluate("document.documentElement.scrollWidth") <= 392
    pg.screenshot(path=str(pg.shots / "phone.png"), full_page=True)


def test_fresh_visit_opens_with_an_example(page, server):
    """A visit with no text in the link opens with the paper's Fig 3 sentence, the cursor on the final
    'n' of 'revenue', so every panel shows something; no outline strays where no character is (the
    end of the text is outlined as a character's box); the truncated-history label is not drawn over
    its dashed line."""
    pg = page
    pg.goto(server + "/")
    got = point(pg, FIG3, hover=False)
    assert pg.input_value("#input") == TEXT
    assert pg.text_content("#where").startswith('Prediction of "n" (offset 15')
    assert [r for r in got["next"] if r["actual"]][0]["symbol"] == "n" and len(got["next"]) == 10
    assert got["sources"][0] == "<h0>" and len(got["contributions"]) == FIG3 + 1
    assert pg.locator("#attr .r[data-source]").count() == FIG3 + 1
    assert len(got["history"]) == FIG3 + 1 and pg.locator("#history svg polyline").count() == 1
    outlined = """() => [...document.querySelectorAll('#view span')].filter(s =>
        getComputedStyle(s).outlineStyle !== 'none').map(s => s.id)"""
    assert pg.evaluate(outlined) == [f"c{FIG3}"]
    pg.screenshot(path=str(pg.shots / "fresh.png"), full_page=True)
    # the cursor at the end of the text outlines a box as tall as a character's, not a flat line
    point(pg, len(TEXT))
    end, char = (pg.locator(f"#c{o}").bounding_box() for o in (len(TEXT), 0))
    assert end["height"] == pytest.approx(char["height"], abs=1) and end["width"] >= char["width"] / 2, (end, char)

    # the label of the dashed line (the full model) is off the line where the line is highest too
    def height(o):
        h = api(server, "/v1/explain", {"text": TEXT, "offset": o})["history"]
        return h["full_bits"] / max(1, *h["bits"], h["full_bits"])

    for o in (FIG3, max(range(len(TEXT) + 1), key=height)):
        point(pg, o)
        box = pg.evaluate("""() => {
            const svg = document.querySelector('#history svg'), r = (e) => e.getBoundingClientRect();
            const label = [...svg.querySelectorAll('text')].find(t => t.textContent.startsWith('dashed'));
            const a = r(label), b = r(svg.querySelector('line.full'));
            return {label: [a.top, a.bottom], line: [b.top, b.bottom], scale: r(svg).width / svg.viewBox.baseVal.width};
        }""")
        (top, bottom), (y0, y1), stroke = box["label"], box["line"], box["scale"]  # the line's stroke is 1 unit
        assert bottom < y0 - stroke / 2 or top > y1 + stroke / 2, (o, box)

    # a link with an empty text: nothing to point at, and no outline
    pg.goto("about:blank")
    pg.goto(server + "/#t=")
    pg.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=20_000)
    assert pg.input_value("#input") == "" and pg.evaluate(outlined) == []


def test_latency_keystroke_2000_and_attribution_500(page, server, text8_test):
    """The update after a keystroke on a 2,000-character text, and the attribution view of a
    500-character text, as the page measures them (performance.now(), in the browser)."""
    pg = page
    pg.goto(server + "/#t=")
    pg.wait_for_selector("#c0", state="attached", timeout=20_000)
    text = text8_test[:2000]
    set_text(pg, text)
    pg.focus("#input")
    pg.evaluate("() => { const i = document.getElementById('input'); i.setSelectionRange(i.value.length, i.value.length); }")
    pg.evaluate("() => { window.lensStats.updates.length = 0; }")
    typed = "and the"
    for k, ch in enumerate(typed):
        pg.keyboard.type(ch)
        wait_scored(pg, text + typed[:k + 1])
    end_ms = pg.evaluate("() => window.lensStats.updates.slice()")
    # an edit in the middle rescores from the snapshot before it
    pg.evaluate("() => { window.lensStats.updates.length = 0; }")
    new = text + typed
    for k in range(5):
        new = new[:1000 + k] + "x" + new[1000 + k:]
        pg.evaluate("t => { const i = document.getElementById('input'); i.value = t; "
                    "i.dispatchEvent(new Event('input', {bubbles: true})); }", new)
        wait_scored(pg, new)
    mid_ms = pg.evaluate("() => window.lensStats.updates.slice()")
    bits = pg.evaluate("() => [...document.querySelectorAll('#view span[data-off]:not(.end)')].map(s => +s.dataset.bits)")
    ref = api(server, "/v1/score", {"text": new, "per_char": True})
    np.testing.assert_allclose(bits, ref["per_char_bits"], rtol=0, atol=default_model_tolerance().twice().bits)

    set_text(pg, text[:500])
    explain_ms = []
    for o in (499, 250, 498, 100, 497):
        pg.hover(f"#c{o}")
        got = point(pg, o, hover=False)
        explain_ms.append(got["ms"])
    keystroke, middle, attribution = statistics.median(end_ms), statistics.median(mid_ms), statistics.median(explain_ms)
    report = {"keystroke_2000_ms": end_ms, "middle_edit_2000_ms": mid_ms, "attribution_500_ms": explain_ms,
              "median": {"keystroke": keystroke, "middle_edit": middle, "attribution": attribution}}
    (pg.shots / "latency.json").write_text(json.dumps(report, indent=1))
    print("\nisan lens latency (ms):", json.dumps(report["median"]))
    # the targets are 50 ms and 300 ms on this kind of machine; shared CI cores get slack
    slack = float(os.environ.get("ISAN_LENS_SLACK", "3"))
    assert keystroke <= 50 * slack, report
    assert middle <= 1000, report  # no target in the issue: reported
    assert attribution <= 300 * slack, report


def test_any_bundle_bytes(browser, tmp_path):
    """A byte bundle: a character of two UTF-8 bytes is read as two symbols, shown as one character."""
    from conftest import random_params
    from isan.engine import Engine
    from isan.engine.bundle import write_bundle
    from isan.tokens import ByteAlphabet

    alpha = ByteAlphabet.from_data("the world of words, the wörld " * 20, K=12)
    params = random_params(K=alpha.K, V=256, d=8, seed=3)
    write_bundle(tmp_path / "bytes", params.as_dict(), alpha, kind="isan")
    eng = Engine.load(tmp_path / "bytes")
    with lens_page(browser, eng, b"b" * 32) as (pg, addr, errors):
        text = "the wörld"
        set_text(pg, text)
        spans = pg.evaluate("() => [...document.querySelectorAll('#view span[data-off]:not(.end)')].map(s => "
                            "[s.textContent, +s.dataset.tokens, +s.dataset.bits])")
        assert [s[0] for s in spans] == list(text) and spans[text.index("ö")][1] == 2
        ref = httpx.post(f"http://{addr}/v1/score", json={"text": text, "per_char": True}, timeout=30).json()
        assert abs(sum(s[2] for s in spans) - ref["bits"]) <= model_tolerance(params, alpha, text).twice().total_bits
        got = point(pg, text.index("r"))
        assert got["sources"][0] == "<h0>" and abs(got["base"] + sum(got["contributions"]) - got["value"]) <= TOL
        assert pg.text_content("#legend-unit").startswith("bits per byte")
        pg.screenshot(path=str(tmp_path / "bytes.png"))
    assert not errors, errors


@pytest.mark.parametrize("kind", ["pairs", "words"])
def test_any_bundle_pairs_and_words_typed(browser, tmp_path, kind):
    """Pairs and words are read whole: typed a character at a time, the page shows the bits of the
    whole text (not of a pair padded or a word cut at each keystroke), and a word model's words are
    its sources."""
    from conftest import random_params
    from isan.alphabet import Alphabet
    from isan.engine import Engine
    from isan.engine.bundle import write_bundle
    from isan.tokens import PairAlphabet, WordAlphabet

    alpha = PairAlphabet(Alphabet.text8()) if kind == "pairs" else WordAlphabet.from_text("the cat sat on mat a dog")
    params = random_params(K=len(alpha), V=len(alpha), d=8, seed=3)
    write_bundle(tmp_path / kind, params.as_dict(), alpha, kind="isan")
    eng = Engine.load(tmp_path / kind)
    with lens_page(browser, eng, b"p" * 32) as (pg, addr, errors):
        text = "the cat sat on the mat a dog"
        pg.click("#input")
        pg.keyboard.type(text, delay=5)
        wait_scored(pg, text)
        ref = httpx.post(f"http://{addr}/v1/score", json={"text": text, "per_char": True}, timeout=30).json()
        spans = pg.evaluate("() => [...document.querySelectorAll('#view span[data-off]:not(.end)')].map(s => "
                            "s.dataset.bits === '' ? 0 : +s.dataset.bits)")
        tol = model_tolerance(params, alpha, text).twice().total_bits  # streamed and whole: two float32 computations
        assert abs(sum(spans) - ref["bits"]) <= tol
        assert abs(float(pg.get_attribute("#bpc", "data-bits")) - ref["bits"]) <= tol
        if kind == "words":
            pg.select_option("#by", "word")
            got = point(pg, text.index("dog"))
            assert got["sources"] == ["<h0>", "the", "cat", "sat", "on", "the", "mat", "a"]
            assert abs(got["base"] + sum(got["contributions"]) - got["value"]) <= TOL
    assert not errors, errors


def test_no_ui_and_static_files(default_engine):
    with running(create_app(default_engine, config=ServeConfig(ui=False))) as addr:
        r = httpx.get(f"http://{addr}/", timeout=10)
        assert r.status_code == 404 and r.json()["status"] == 404 and "there is no GET /" in r.json()["error"]
        assert "lens page" not in r.json()["error"]  # the list of endpoints does not offer the page it turned off
        assert httpx.get(f"http://{addr}/lens/lens.js", timeout=10).status_code == 404
    with running(create_app(default_engine)) as addr:
        r = httpx.get(f"http://{addr}/", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        for name, kind in (("lens.js", "text/javascript"), ("lens.css", "text/css"), ("favicon.svg", "image/svg+xml")):
            r = httpx.get(f"http://{addr}/lens/{name}", timeout=10)
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        r = httpx.get(f"http://{addr}/lens/../app.py", timeout=10)
        assert r.status_code == 404
        r = httpx.get(f"http://{addr}/lens/app.py", timeout=10)
        assert r.status_code == 404 and r.json()["status"] == 404
        assert "GET / (the lens page)" in httpx.get(f"http://{addr}/nowhere", timeout=10).json()["error"]
        # nothing from elsewhere: no http(s) URL in the page's files
        from isan.engine.serve.lens import STATIC

        for f in STATIC.iterdir():
            body = f.read_text().replace("http://www.w3.org/2000/svg", "")
            assert "http://" not in body and "https://" not in body, f.name
