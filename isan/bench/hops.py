"""The route of a request, counted: which of isan's functions one ``POST /v1/score`` and one corpus
job pass through on their way to the compiled kernel (docs/ARCHITECTURE.md, 'The route of a
request, hop by hop').

Run: ``python -m isan.bench.hops`` (needs the serve and corpus extras and the compiled kernels). For
each request it prints the isan frames on the stack when the kernel is entered, the module hops
from ``Engine.score_ids`` to the kernel (a hop: the next call is in another module; how many go
back into a module already passed), and every call on the way. Both requests are made once first,
so that what is built on first use (layouts, the certificate) is not counted.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from pathlib import Path

import isan

ROOT = str(Path(isan.__file__).parent.parent)
KERNELS = ("run_streams", "run_jumps", "seq_composed")
SKIP = ("<genexpr>", "<listcomp>", "<lambda>", "<dictcomp>")


def where(frame) -> str | None:
    """``module path:qualified name`` of an isan frame (not this module's), else None."""
    f = frame.f_code.co_filename
    if not f.startswith(ROOT) or f == __file__:
        return None
    return f"{os.path.relpath(f, ROOT)}:{frame.f_code.co_qualname}"


class Trace:
    """Every isan call of every thread while it is on, and the stack and calls when a compiled
    kernel is first entered."""

    def __init__(self):
        self.calls: dict[int, list[str]] = {}
        self.stack: list[str] | None = None
        self.route: list[str] = []

    def __call__(self, frame, event, arg):
        if self.stack is not None:
            return
        if event == "call" and (w := where(frame)) is not None:
            self.calls.setdefault(threading.get_ident(), []).append(w)
        elif event == "c_call" and getattr(arg, "__name__", "") in KERNELS and \
                "_native" in repr(getattr(arg, "__self__", "")):
            self.stack = [w for f in self.frames(frame) if (w := where(f)) is not None]
            evs = self.calls.get(threading.get_ident(), [])
            start = max((j for j, e in enumerate(evs) if e.endswith("Engine.score_ids")), default=0)
            self.route = evs[start:]

    @staticmethod
    def frames(frame) -> list:
        """The stack from its bottom to ``frame``."""
        out = []
        while frame is not None:
            out.append(frame)
            frame = frame.f_back
        return out[::-1]

    def reset(self) -> None:
        """Forget what was traced so far."""
        self.calls.clear()
        self.stack, self.route = None, []

    def run(self, fn) -> None:
        """``fn()`` traced (in this thread and the threads it starts)."""
        threading.setprofile(self)
        sys.setprofile(self)
        try:
            fn()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)


def report(name: str, t: Trace) -> list[str]:
    """The lines printed for one request."""
    calls = [e for e in t.route if not any(s in e for s in SKIP)]
    calls = [e for i, e in enumerate(calls) if i == 0 or e != calls[i - 1]]
    mods = [e.split(":")[0] for e in calls]
    seq = [m for i, m in enumerate(mods) if i == 0 or m != mods[i - 1]]
    back = sum(1 for i, m in enumerate(seq) if m in seq[:i])
    return [f"## {name}: {len(t.stack or [])} isan frames on the stack at the kernel",
            *(f"    {s}" for s in t.stack or []),
            f"   from Engine.score_ids to the kernel: {len(seq) - 1} module hops ({back} back into a module "
            f"already passed), {len(set(seq))} modules, {len(calls)} calls",
            "   " + " -> ".join(m.replace(".py", "") for m in seq)]


def server_request(engine, text: str) -> Trace:
    """One ``POST /v1/score`` of ``text`` (after one untraced)."""
    from fastapi.testclient import TestClient

    from isan.engine.serve.app import create_app

    t = Trace()
    threading.setprofile(t)  # the server's threads start inside the client
    try:
        with TestClient(create_app(engine)) as client:
            client.post("/v1/score", json={"text": text})
            t.reset()
            t.run(lambda: client.post("/v1/score", json={"text": text}).raise_for_status())
    finally:
        threading.setprofile(None)
    return t


def corpus_job(engine, text: str) -> Trace:
    """One corpus job of 40 documents (after one untraced)."""
    from isan.engine.corpus import score_corpus

    def job():
        d = Path(tempfile.mkdtemp())
        (d / "in.jsonl").write_text("\n".join(json.dumps({"text": text[: 100 + 37 * i]}) for i in range(40)))
        score_corpus([str(d / "in.jsonl")], d / "out", engine=engine, readers=0, progress=False)

    job()
    t = Trace()
    t.run(job)
    return t


def main() -> None:
    from isan.engine import Engine

    engine = Engine.default()
    text = "the quick brown fox jumps over the lazy dog " * 50
    engine.score(text)
    for name, t in (("POST /v1/score", server_request(engine, text)), ("corpus job", corpus_job(engine, text))):
        print("\n".join(report(name, t)))


if __name__ == "__main__":
    main()
