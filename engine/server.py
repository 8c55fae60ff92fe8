"""``isan-serve``: HTTP and WebSocket scoring on FastAPI + uvicorn (the ``serve`` extra).

Endpoints (DESIGN.md section 3):

* ``GET /healthz`` -> ``{"status": "ok", "model": {...}}``
* ``POST /v1/score`` with ``{"text": str, "per_char": bool, "unknown": "error"|"skip"|"replace",
  "replacement": str, "normalize": "auto"|"none"|"text8"|...}`` -> ``{"chars", "bits", "bpc",
  "normalization"}`` (+ ``"per_char_bits"``, ``"per_char_offsets"``), the same numbers as
  ``isan score --json``. The text goes through the model's normaliser unless ``"normalize":
  "none"``; ``normalization`` reports what it changed.
* WebSocket ``/v1/stream``: each client frame is a JSON object ``{"text": chunk}`` (optionally
  ``"per_char": true``, ``"normalize"``, ``"unknown"``, or ``{"reset": true}``); each answer gives
  the chunk's ``chars``, ``bits``, ``bpc``, ``normalization`` (and ``per_char_bits``,
  ``per_char_offsets`` within the chunk) plus the running ``total_chars``, ``total_bits``,
  ``total_bpc``. The state (and the last symbol, which normalisation needs at a chunk boundary)
  is carried across chunks, so chunking never changes the bits. A bad frame gets ``{"error": ...,
  "status": 4xx}`` and leaves the stream's state unchanged.

Errors are JSON ``{"error": message}`` with a 4xx status: 400 bad requests, 413 too large, 422
text the model cannot score (characters outside its alphabet, or a state that diverges:
``StateDivergedError``, with ``"offset"``). No response holds NaN or inf, and no traceback
reaches a client.
"""


import asyncio
import json
import logging

import click

from isan.errors import AlphabetError, IsanError, StateDivergedError

log = logging.getLogger(__name__)

DEFAULT_MAX_CHARS = 1_000_000


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _parse_request(raw: bytes | str, max_chars: int) -> dict:
    """Validate a score request body; returns keyword arguments for Engine.score."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not valid JSON ({e}); send {{\"text\": \"...\"}}") from None
    if not isinstance(body, dict):
        raise RequestError(400, 'the body must be a JSON object like {"text": "..."}')
    unknown_keys = set(body) - {"text", "per_char", "unknown", "replacement", "reset", "normalize"}
    if unknown_keys:
        raise RequestError(400, f"unknown fields {sorted(unknown_keys)}; allowed: text, per_char, unknown, replacement, "
                                "normalize")
    text = body.get("text")
    if not isinstance(text, str):
        raise RequestError(400, 'the field "text" is required and must be a string')
    if len(text) > max_chars:
        raise RequestError(413, f"the text has {len(text):,} characters; the limit is {max_chars:,} (split it, or use /v1/stream)")
    per_char = body.get("per_char", False)
    if not isinstance(per_char, bool):
        raise RequestError(400, '"per_char" must be true or false')
    unknown = body.get("unknown", "error")
    if unknown not in ("error", "skip", "replace"):
        raise RequestError(400, '"unknown" must be "error", "skip" or "replace"')
    replacement = body.get("replacement")
    if replacement is not None and not isinstance(replacement, str):
        raise RequestError(400, '"replacement" must be a one-character string')
    from isan.engine.normalize import choices

    normalize = body.get("normalize", "auto")
    if normalize not in choices():
        raise RequestError(400, f'"normalize" must be one of {", ".join(choices())}')
    return {"text": text, "per_char": per_char, "unknown": unknown, "replacement": replacement, "normalize": normalize}


def _status(e: IsanError) -> int:
    """422 for text the model cannot score (characters outside its alphabet, a diverging state), 400 otherwise."""
    return 422 if isinstance(e, (AlphabetError, StateDivergedError)) else 400


def _error_body(e: IsanError) -> dict:
    body = {"error": str(e)}
    if isinstance(e, StateDivergedError):
        body.update({"offset": getattr(e, "input_offset", e.offset), "cause": e.cause})
    return body


def _dumps(obj) -> str:
    """JSON without NaN or inf (ValueError if a bug tried to send one)."""
    return json.dumps(obj, allow_nan=False)


def create_app(engine, max_chars: int = DEFAULT_MAX_CHARS):
    """The ASGI app serving ``engine`` (an :class:`isan.engine.Engine`)."""
    from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    from fastapi.responses import Response

    app = FastAPI(title="isan-serve", version="1", docs_url="/docs")
    max_body = 4 * max_chars + 4096  # UTF-8 is at most 4 bytes a character, plus the JSON around it

    def error(status: int, message: str, extra: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": message, **(extra or {})}, status_code=status)

    def ok(obj: dict) -> Response:
        return Response(_dumps(obj), media_type="application/json")

    def score(req: dict, state=None):
        return engine.score(req["text"], state=state, per_char=req["per_char"], unknown=req["unknown"],
                            replacement=req["replacement"], normalize=req["normalize"])

    @app.exception_handler(Exception)
    async def _unhandled(request, exc):  # pragma: no cover - last line of defence
        log.exception("unhandled error")
        return error(500, "internal error; the server log has the details")

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "model": engine.describe()}

    @app.post("/v1/score")
    async def v1_score(request: Request):
        try:
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_body:
                raise RequestError(413, f"the body has {int(declared):,} bytes; the limit is {max_body:,}")
            raw = b""
            async for part in request.stream():
                raw += part
                if len(raw) > max_body:
                    raise RequestError(413, f"the body exceeds {max_body:,} bytes")
            req = _parse_request(raw, max_chars)
            result = await run_in_threadpool(score, req)
        except RequestError as e:
            return error(e.status, e.message)
        except IsanError as e:
            b = _error_body(e)
            return error(_status(e), b.pop("error"), b)
        return ok(result.to_json(req["per_char"]))

    @app.websocket("/v1/stream")
    async def v1_stream(ws: WebSocket):
        await ws.accept()
        state = engine.initial_state()
        try:
            while True:
                raw = await ws.receive_text()
                try:
                    if len(raw) > max_body:
                        raise RequestError(413, f"the frame exceeds {max_body:,} bytes; send smaller chunks")
                    msg = json.loads(raw) if raw.strip().startswith("{") else None
                    if isinstance(msg, dict) and msg.get("reset") is True and "text" not in msg:
                        state = engine.initial_state()
                        await ws.send_text(_dumps({"reset": True, "total_chars": 0, "total_bits": 0.0,
                                                   "total_bpc": None}))
                        continue
                    if msg is None:
                        raise RequestError(400, 'each frame must be a JSON object like {"text": "..."}')
                    req = _parse_request(raw, max_chars)
                    result = await asyncio.to_thread(score, req, state)
                except RequestError as e:
                    await ws.send_json({"error": e.message, "status": e.status})
                    continue
                except json.JSONDecodeError as e:
                    await ws.send_json({"error": f"the frame is not valid JSON ({e})", "status": 400})
                    continue
                except IsanError as e:
                    await ws.send_text(_dumps({**_error_body(e), "status": _status(e)}))
                    continue
                state = result.state
                out = result.to_json(req["per_char"])
                out.update({"total_chars": state.chars, "total_bits": state.bits,
                            "total_bpc": state.bits / state.chars if state.chars else None})
                await ws.send_text(_dumps(out))
        except WebSocketDisconnect:
            return

    return app


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--path", "path_mode", type=click.Choice(["auto", "composed", "reference"]), default="auto", show_default=True)
@click.option("--backend", type=click.Choice(["numpy", "onnx"]), default="numpy", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True)
@click.option("--max-chars", default=DEFAULT_MAX_CHARS, show_default=True, type=int, help="Largest text per request or frame.")
@click.option("--log-level", default="info", show_default=True)
def main(host, port, model, path_mode, backend, device, max_chars, log_level):
    """Serve scoring over HTTP (POST /v1/score) and WebSocket (/v1/stream)."""
    try:
        import uvicorn

        from isan.engine import load_engine

        engine = load_engine(model, path=path_mode, backend=backend, device=device)
        app = create_app(engine, max_chars=max_chars)
    except ModuleNotFoundError as e:
        raise click.ClickException(f"isan-serve needs {e.name}: pip install 'isan[serve]'") from None
    except IsanError as e:
        raise click.ClickException(str(e)) from None
    info = engine.describe()
    click.echo(f"isan-serve: model {info.get('source')} ({info.get('path')} path, {info.get('backend')} backend) "
               f"on http://{host}:{port}", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, ws_max_size=4 * max_chars + 4096)


if __name__ == "__main__":  # pragma: no cover
    main()
