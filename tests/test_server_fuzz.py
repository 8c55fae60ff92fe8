"""Fuzzing the server: schemathesis over the OpenAPI schema of the HTTP API, and hypothesis over
WebSocket frames, each answer checked against the library (a differential test).

Bounded for CI (about 20 s on 2 cores): ``FUZZ_EXAMPLES`` examples per HTTP operation and
``WS_EXAMPLES`` streams of up to 8 frames. ``ISAN_FUZZ_EXAMPLES`` raises both for a longer run.
"""

import json
import math
import os
import re

import numpy as np
import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from isan.engine.serve.completions import PATHS as OPENAI_PATHS  # noqa: E402
from isan.errors import IsanError  # noqa: E402
from server_helpers import running  # noqa: E402
from tolerances import engine_ids_tolerance  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("ISAN_FUZZ_EXAMPLES", "120"))
WS_EXAMPLES = int(os.environ.get("ISAN_FUZZ_EXAMPLES", "60"))
CALLS = {"http": 0, "ws_frames": 0}
MESSAGES: dict[str, int] = {}  # every distinct 4xx message (numbers masked) and how often it came
#: words of an instruction: every 4xx message must say what to fix
INSTRUCTION = re.compile(r"\b(must|give|send|use|retry|split|take|allowed|required|choose|connect|continue|lower|"
                         r"resend|reuse|leave out|not both|limit|needs|start|clean|pass|fix)\b", re.I)


def _says_what_to_fix(status: int, msg: str) -> None:
    key = re.sub(r"\d[\d,.]*", "N", msg)[:160]
    MESSAGES[f"{status} {key}"] = MESSAGES.get(f"{status} {key}", 0) + 1
    assert len(msg) >= 12 and INSTRUCTION.search(msg), f"a {status} that does not say what to fix: {msg!r}"

# The schema says what the server accepts: a schema-valid request is never a 400 (a snapshot's
# form, "replacement" with "unknown": "replace", raw text in the alphabet and one temperature are
# in the schema). What no schema can say: a snapshot that has a snapshot's form but not this
# server's signature (403) or is of another model (409), texts over a limit together (413: the
# characters of a batch in all, or a whole kappa), and text the model cannot score (422: nothing
# left after normalisation, a diverging state). schemathesis's default for valid data is 2xx,
# 3xx, 401, 403, 404, 409, 429 and 5xx (the 5xx are failed by our own check below). The
# OpenAI-compatible /v1/completions answers a "model" it does not serve with 404, as OpenAI does.
#
# schemathesis reads an event stream until it ends, `max-stream-events` events have come or
# `request-timeout` seconds have passed, and then closes the connection (`stream_cut_short`): the
# limits are raised so that every stream the fuzz asks for is read to its end, and a stream that is
# still cut (a loaded machine) is checked event by event but not for its last event.
CONFIG = """
max-stream-events = 100000
request-timeout = 120
[checks.negative_data_rejection]
expected-statuses = [400, 403, 404, 409, 413, 415, 422]
[checks.positive_data_acceptance]
expected-statuses = [200, 403, 409, 413, 422]
"""


def _strict_json(text: str):
    """json.loads that refuses NaN and Infinity (JSON has neither)."""
    def bad(c):
        raise ValueError(f"non-JSON constant {c}")

    return json.loads(text, parse_constant=bad)


@pytest.fixture(scope="module")
def fuzz_server(default_engine):
    app = create_app(default_engine, config=ServeConfig(max_chars=3000, max_batch_texts=16, max_sample_chars=200,
                                                        max_attribute_chars=60))
    with running(app) as addr:
        yield addr, default_engine


@pytest.fixture
def api_schema(fuzz_server):
    from schemathesis.config import SchemathesisConfig

    addr, _ = fuzz_server
    return schemathesis.openapi.from_url(f"http://{addr}/openapi.json", config=SchemathesisConfig.from_str(CONFIG))


schema = schemathesis.pytest.from_fixture("api_schema")


def one_error_shape(ctx, response, case):
    """Every answer is strict JSON (or Prometheus text, or Server-Sent Events of strict JSON); every
    4xx/5xx is {"error", "status"} with a message that says what to fix (on the OpenAI-compatible
    paths {"error": {"message", "type", "param", "code"}})."""
    CALLS["http"] += 1
    ctype = response.headers.get("content-type", [""])[0]
    assert "Traceback" not in response.text
    if ctype.startswith("text/plain"):
        return
    cut = response.stream_cut_short  # schemathesis stopped reading (see CONFIG): the events so far
    if case.path in OPENAI_PATHS:
        _openai_shape(response, ctype, cut)
        return
    if ctype.startswith("text/event-stream"):
        events = [b for b in response.text.split("\n\n") if b.strip()]
        assert events and (cut or events[-1].split("\n")[0] in ("event: done", "event: error")), response.text[-300:]
        for block in events:
            event, data = block.split("\n", 1)
            data = _strict_json(data.removeprefix("data: "))
            assert event in ("event: chars", "event: done", "event: error"), block[:200]
            if event == "event: error":  # the generated text diverged: the stream ends with the error
                assert block is events[-1] and 400 <= data["status"] < 500, block[:300]
                _says_what_to_fix(data["status"], data["error"])
        return
    body = _strict_json(response.text)
    if response.status_code >= 400:
        assert isinstance(body.get("error"), str) and body["error"] and body.get("status") == response.status_code
        assert response.status_code < 500, response.text
        _says_what_to_fix(response.status_code, body["error"])


def _openai_shape(response, ctype: str, cut: bool = False) -> None:
    if ctype.startswith("text/event-stream"):  # data: {chunk} ... data: [DONE], or ending with data: {"error"}
        events = [b for b in response.text.split("\n\n") if b.strip()]
        assert events and all(e.startswith("data: ") for e in events), response.text[-300:]
        for e in events[:-1]:
            assert "choices" in _strict_json(e[6:])
        if events[-1] == "data: [DONE]":
            return
        last = _strict_json(events[-1][6:])
        assert cut or "error" in last, f"the stream ended without data: [DONE] or an error: {events[-1][:300]}"
        if "error" in last:
            err = last["error"]
            assert 400 <= err["code"] < 500, events[-1][:300]
            _says_what_to_fix(err["code"], err["message"])
        return
    body = _strict_json(response.text)
    if response.status_code >= 400:
        err = body.get("error")
        assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}, response.text[:300]
        assert err["code"] == response.status_code and isinstance(err["message"], str) and err["message"]
        assert response.status_code < 500, response.text
        _says_what_to_fix(response.status_code, err["message"])


@schema.parametrize()
# derandomize: CI runs the same cases every time; longer random runs: ISAN_FUZZ_EXAMPLES=1500 with
# this line removed.
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_http_api_against_its_schema(case):
    """Generated requests (valid and invalid per the schema): no 5xx, answers conform to the
    documented schemas and statuses, one error shape."""
    case.call_and_validate(additional_checks=[one_error_shape])


# ---- WebSocket frames, checked against the library ------------------------------------------
_TEXT = st.text(alphabet=st.sampled_from(list("abcdefghij klmnopqrstuvwxyzABCZ.,\n19é\x00\t")) | st.characters(),
                max_size=60)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 40) | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                     max_leaves=6)
_OPTIONS = st.fixed_dictionaries({}, optional={
    "per_char": st.booleans() | _JSON,
    "unknown": st.sampled_from(["error", "skip", "replace", "drop"]),
    "replacement": st.sampled_from([" ", "a", "Z", ""]),
    "normalize": st.sampled_from(["auto", "none", "text8", "text8-v1", "bogus"]),
    "top_k": st.integers(-1, 30),
    "return_state": st.booleans(),
})
_FRAME = st.one_of(
    st.builds(lambda t, o: {"text": t, **o}, _TEXT, _OPTIONS),
    st.builds(lambda t, o: {"text": t, **o}, _TEXT, _OPTIONS),  # text frames twice as often
    st.just({"reset": True}),
    st.just({"snapshot": True}),
    st.just("RESTORE"),  # restore a snapshot taken earlier in this stream (or a corrupt one)
    st.dictionaries(st.sampled_from(["text", "reset", "restore", "snapshot", "bogus", "top_k"]), _JSON, max_size=3),
    st.text(max_size=20),  # not JSON, or JSON that is not an object
    st.binary(max_size=20),  # binary frames are refused
    st.builds(lambda t: {"reset": True, "text": t}, _TEXT),  # reset, then the text
    st.integers(100, 3000).map(lambda n: "[" * n + "]" * n),  # nested deeper than the parser takes
    st.integers(100, 3000).map(lambda n: '{"text": ' + '{"a":' * n + "1" + "}" * n + "}"),  # deeply nested
    st.integers(20, 6000).map(lambda n: '{"text": "ab", "top_k": ' + "9" * n + "}"),  # a huge integer
)


def _integer(v) -> bool:
    """An integer as JSON Schema has it (5 and 5.0; not true, not "5")."""
    return type(v) is int or (type(v) is float and v.is_integer())


def _options_valid(frame: dict) -> bool:
    """Whether the frame's options are ones the server accepts (then it answers as the library)."""
    return (isinstance(frame.get("per_char", False), bool) and isinstance(frame.get("return_state", False), bool)
            and isinstance(frame.get("snapshot", False), bool) and frame.get("unknown", "error") in ("error", "skip", "replace")
            and frame.get("normalize", "auto") in ("auto", "none", "text8", "text8-v1")
            and frame.get("replacement") in (None, " ") + tuple("abcdefghijklmnopqrstuvwxyz")
            and _integer(frame.get("top_k", 0)) and 0 <= frame.get("top_k", 0) <= 27
            and isinstance(frame.get("restore", ""), str) and not (frame.get("reset") is True and "restore" in frame)
            and not set(frame) - {"text", "per_char", "unknown", "replacement", "normalize", "top_k", "return_state",
                                  "reset", "restore", "snapshot"})


@settings(max_examples=WS_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(_FRAME, min_size=1, max_size=8), corrupt=st.booleans())
def test_stream_frames_match_the_library(fuzz_server, frames, corrupt):
    """Any sequence of frames: each gets one strict-JSON answer, in order; an error frame leaves the
    state as it was; a scored frame has the bits of ``Engine.score`` from the same state (two float32
    computations: within twice the tolerance derived on the ids the stream scored, tests/tolerances.py),
    the same normalisation report, and running totals that add up; text the library
    refuses is refused with the library's status."""
    from isan.engine.serve.errors import status_of

    addr, eng = fuzz_server
    state, hist = eng.initial_state(), np.zeros(0, np.int64)  # hist: the ids scored since h0
    tokens = {}
    with connect(f"ws://{addr}/v1/stream", max_size=None) as ws:
        for frame in frames:
            if frame == "RESTORE":
                if not tokens:
                    continue
                tok = list(tokens)[-1]
                frame = {"restore": tok[:-3] + "AAA" if corrupt else tok}
            ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
            ans = _strict_json(ws.recv(timeout=60))
            CALLS["ws_frames"] += 1
            assert isinstance(ans, dict)
            # what the library says, from the state the frame starts from
            base, base_hist, lib, lib_error = state, hist, None, None
            # a lone surrogate (\ud800) is no Unicode character: the server's JSON parser refuses it (400)
            lone = isinstance(frame, dict) and any(0xD800 <= ord(c) <= 0xDFFF
                                                   for c in json.dumps(frame, ensure_ascii=False))
            valid = isinstance(frame, dict) and _options_valid(frame) and not lone
            if valid and frame.get("reset") is True:
                base, base_hist = eng.initial_state(), np.zeros(0, np.int64)
            if valid and "restore" in frame:
                base, base_hist = tokens.get(frame["restore"], (None, None))
            if valid and base is not None and isinstance(frame.get("text"), str):
                try:
                    opts = dict(unknown=frame.get("unknown", "error"), replacement=frame.get("replacement"),
                                normalize=frame.get("normalize", "auto"))
                    lib = eng.score(frame["text"], state=base, per_char=True, **opts)
                    base_hist = np.concatenate([base_hist, eng.prepare(frame["text"], state=base, **opts).ids])
                except IsanError as e:
                    lib_error = e
            if "error" in ans:
                assert isinstance(ans["error"], str) and 400 <= ans["status"] < 500, ans
                _says_what_to_fix(ans["status"], ans["error"])
                if lib_error is not None and not (frame.get("unknown") == "replace" and frame.get("replacement") is None):
                    assert ans["status"] == status_of(lib_error), (frame, ans, lib_error)
                continue  # the state is unchanged (the next scored frame checks it)
            assert isinstance(frame, dict) and lib_error is None, (frame, ans, lib_error)
            assert base is not None, (frame, ans)
            state, hist = base, base_hist
            tol = engine_ids_tolerance(eng, hist).twice()  # the server's float32 and the library's
            if "text" in frame:
                assert lib is not None, (frame, ans)
                assert ans["chars"] == lib.chars and ans["normalization"] == lib.normalization
                assert abs(ans["bits"] - lib.bits) <= 2 * tol.total_bits  # a difference of two totals
                assert ans["bpc"] is None if lib.chars == 0 else math.isfinite(ans["bpc"])
                state = lib.state
            assert ans["total_chars"] == state.chars
            assert abs(ans["total_bits"] - state.bits) <= tol.total_bits
            if "state" in ans:
                tokens[ans["state"]] = (state, hist)


def test_fuzz_counts():
    """Records how much the fuzzers above ran, and every distinct 4xx message (printed with -s; the
    README quotes the counts)."""
    print(f"\nfuzz: {CALLS['http']} HTTP calls checked by schemathesis, {CALLS['ws_frames']} WebSocket frames, "
          f"{len(MESSAGES)} distinct 4xx messages:")
    for msg, n in sorted(MESSAGES.items(), key=lambda kv: -kv[1]):
        print(f"  {n:6d}  {msg}")
    assert CALLS["http"] + CALLS["ws_frames"] > 0
