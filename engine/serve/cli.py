"""``isan-serve``: the command line of the server (click); it only parses options and starts uvicorn."""

from __future__ import annotations

import os

import click

from isan.errors import IsanError
from isan.engine.serve.config import DEFAULT_MAX_CHARS, ServeConfig

_D = ServeConfig()


def read_secret(path: str | None) -> bytes | None:
    """The state-snapshot key: ``--state-secret-file`` (its bytes, stripped), else ``$ISAN_STATE_SECRET``, else None."""
    if path:
        try:
            with open(path, "rb") as f:
                return f.read().strip()
        except OSError as e:
            raise click.ClickException(f"cannot read --state-secret-file {path}: {e.strerror}") from None
    env = os.environ.get("ISAN_STATE_SECRET")
    return env.encode() if env else None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--path", "path_mode", type=click.Choice(["auto", "composed", "reference"]), default="auto", show_default=True,
              help="The engine's path; used as it is with --no-batching (reference implies it).")
@click.option("--backend", type=click.Choice(["numpy", "onnx"]), default="numpy", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True)
@click.option("--max-chars", default=DEFAULT_MAX_CHARS, show_default=True, type=int, help="Largest text per request or frame.")
@click.option("--max-pending-mb", default=_D.max_pending_mb, show_default=True, type=float,
              help="Memory bound: estimated MiB of request bodies, admitted texts and read-ahead frames held at once "
                   "(beyond it: 503 with Retry-After).")
@click.option("--max-streams", default=_D.max_streams, show_default=True, type=int, help="Open WebSocket streams.")
@click.option("--max-stream-frames", default=_D.max_stream_frames, show_default=True, type=int,
              help="Frames a stream may send ahead of its answers.")
@click.option("--round-chars", default=_D.round_chars, show_default=True, type=int,
              help="Characters scored per scheduler round over all requests and streams.")
@click.option("--request-timeout", default=_D.request_timeout_s, show_default=True, type=float,
              help="Seconds a text may wait and run before it is answered 503 and dropped (and a request body may "
                   "take to arrive: 408).")
@click.option("--stream-idle-timeout", default=_D.stream_idle_timeout_s, show_default=True, type=float,
              help="Seconds a stream may send nothing before it is closed.")
@click.option("--batching/--no-batching", default=True, show_default=True,
              help="Score each round's texts in one batched kernel call, or each alone on the engine's path.")
@click.option("--threads", type=int, default=None,
              help="Threads for the engine's kernels (default: one fewer than the CPUs, at least 1, so that the event "
                   "loop keeps a core).")
@click.option("--state-secret-file", default=None, type=click.Path(dir_okay=False),
              help="Key that signs state snapshots (default: $ISAN_STATE_SECRET, else random per process).")
@click.option("--log-level", default="info", show_default=True)
def main(host, port, model, path_mode, backend, device, max_chars, max_pending_mb, max_streams, max_stream_frames,
         round_chars, request_timeout, stream_idle_timeout, batching, threads, state_secret_file, log_level):
    """Serve scoring over HTTP (POST /v1/score) and WebSocket (/v1/stream) with continuous batching."""
    try:
        config = ServeConfig(max_chars=max_chars, max_pending_mb=max_pending_mb, max_streams=max_streams,
                             max_stream_frames=max_stream_frames, round_chars=round_chars,
                             min_slice_chars=min(_D.min_slice_chars, round_chars), request_timeout_s=request_timeout,
                             stream_idle_timeout_s=stream_idle_timeout, batching=batching, threads=threads,
                             state_secret=read_secret(state_secret_file))
        import uvicorn

        from isan.engine import load_engine
        from isan.engine.serve.app import create_app

        engine = load_engine(model, path=path_mode, backend=backend, device=device)
        app = create_app(engine, config=config)
    except ModuleNotFoundError as e:
        raise click.ClickException(f"isan-serve needs {e.name}: pip install 'isan[serve]'") from None
    except IsanError as e:
        raise click.ClickException(str(e)) from None
    info = engine.describe()
    click.echo(f"isan-serve: model {info.get('source')} ({info.get('path')} path, {info.get('backend')} backend, "
               f"{'batched rounds' if app.state.service.batching else 'no batching'}) on http://{host}:{port}", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, ws_max_size=config.max_body_bytes,
                ws_per_message_deflate=False)
