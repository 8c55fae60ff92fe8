"""Make the screenshot of isan lens in the docs (``docs/images/lens.png``).

    python -m isan.engine.serve.lens_screenshot [--out docs/images/lens.png] [--model BUNDLE]

Serves the model (default: the shipped one) on a free local port, opens the page in Chromium
(``/usr/bin/chromium``, or ``--chromium``) with Playwright for Python, types the paper's Fig 3
sentence, points at the final 'n' of 'revenue' by words, and saves the page. Needs the ``serve``
extra and ``pip install playwright`` (its own browser download is not used).
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path

TEXT = "the annual revenue of the company was seven million dollars"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/images/lens.png")
    ap.add_argument("--model", default=None)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--theme", choices=["light", "dark"], default="light")
    args = ap.parse_args(argv)

    import uvicorn
    from playwright.sync_api import sync_playwright

    from isan.engine import Engine, load_engine
    from isan.engine.serve import ServeConfig, create_app

    eng = Engine.default() if args.model is None else load_engine(args.model)
    app = create_app(eng, config=ServeConfig())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(app.uvicorn_config("127.0.0.1", port, "warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    while not srv.started:
        time.sleep(0.02)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=args.chromium, args=ARGS, headless=True)
            pg = b.new_page(viewport={"width": 1280, "height": 860}, device_scale_factor=1)
            offset = TEXT.index("revenue") + 4
            # t= (empty): the sentence is typed (a link without a text opens with it already there)
            pg.goto(f"http://127.0.0.1:{port}/#t=&by=word&theme={args.theme}&pos={offset}")
            pg.wait_for_selector("#c0", state="attached", timeout=30_000)
            pg.click("#input")
            pg.keyboard.type(TEXT, delay=2)
            pg.wait_for_function("n => document.body.dataset.scored === String(n)", arg=len(TEXT), timeout=30_000)
            pg.focus("#view")
            pg.click(f"#c{offset}")
            pg.wait_for_function("o => document.body.dataset.explain === 'ready' && "
                                 "document.body.dataset.explainOffset === String(o)", arg=offset, timeout=30_000)
            pg.click("#attr .r[data-source='annual'] button")
            pg.click("#cf-go")
            pg.wait_for_function("() => document.getElementById('cf').dataset.probAfter !== undefined")
            pg.screenshot(path=str(out), full_page=True)
            b.close()
    finally:
        srv.should_exit = True
        th.join(10)
    print(out)
    return out


if __name__ == "__main__":
    main()
