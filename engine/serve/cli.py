"""``isan-serve``: the command line of the server (click); it only parses options and starts uvicorn."""

from __future__ import annotations

import os
import signal

import click

from isan.click_types import FiniteFloat
from isan.errors import IsanError, install_hint
from isan.engine.serve.config import DEFAULT_MAX_CHARS, MAX_WORKERS, ServeConfig
from isan.engine.loading import RUNTIMES
from isan.engine.serve.malloc import MAX_MMAP_THRESHOLD_KIB

_D = ServeConfig()
#: the longest timeout an option takes, in seconds (a week)
MAX_TIMEOUT_S = 7 * 86_400
#: the largest count or size an option takes (the kernels index texts and rounds with 32-bit ints)
MAX_COUNT = 2**31 - 1
#: the largest --max-pending-mb, in MiB (1 TiB)
MAX_PENDING_MB = 2.0**20
#: the engine's computation paths that ``--path`` takes (those of ``load_engine``)
PATH_CHOICES = ("auto", "composed", "chunked", "jumps", "reference")


def read_key(path: str | None) -> str | None:
    """The API key: ``--api-key-file`` (its text, stripped), else ``$ISAN_API_KEY``, else None (no key)."""
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise click.ClickException(f"cannot read --api-key-file {path}: {e}") from None
    return os.environ.get("ISAN_API_KEY") or None


def read_secret(path: str | None) -> bytes | None:
    """The state-snapshot key: ``--state-secret-file`` (its bytes, stripped), else ``$ISAN_STATE_SECRET`` (set,
    even empty), else None. An empty or short key is refused by :class:`ServeConfig`."""
    if path:
        try:
            with open(path, "rb") as f:
                return f.read().strip()
        except OSError as e:
            raise click.ClickException(f"cannot read --state-secret-file {path}: {e.strerror}") from None
    env = os.environ.get("ISAN_STATE_SECRET")
    return env.encode() if env is not None else None


def bound_name(host: str) -> tuple[str, ...]:
    """``(host,)`` when ``--host`` is a DNS name (the server is reached by it), else ``()`` (an address)."""
    import ipaddress

    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return (host,)
    return ()


def chosen_runtime(runtime: str, deprecated_backend: str | None) -> str:
    """``--runtime``'s value, or that of ``--backend``, its deprecated spelling kept for a release (given,
    one line on stderr names ``--runtime``).

    Raises:
        click.UsageError: both given (exit status 2).
    """
    if deprecated_backend is None:
        return runtime
    from click.core import ParameterSource

    if click.get_current_context().get_parameter_source("runtime") in (ParameterSource.COMMANDLINE,
                                                                       ParameterSource.ENVIRONMENT):
        raise click.UsageError("give --runtime or --backend (its deprecated spelling), not both")
    click.echo(f"warning: --backend is deprecated: use --runtime {deprecated_backend}", err=True)
    return deprecated_backend


#: seconds above 0, at most :data:`MAX_TIMEOUT_S`
SECONDS = FiniteFloat(min=0, min_open=True, max=MAX_TIMEOUT_S)
#: counts and sizes from 1 to :data:`MAX_COUNT`
COUNT = click.IntRange(1, MAX_COUNT)


class ServeCommand(click.Command):
    """The ``isan-serve`` command: a bad option or value is one ``Error:`` line naming the option
    (exit status 2), before anything is loaded or bound."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            e.ctx = None  # no usage lines around it: ``isan-serve --help`` lists the options
            raise


def run_to_the_end(server) -> None:
    """``server.run()`` (a ``uvicorn.Server``) that returns normally after a graceful shutdown on
    SIGTERM or SIGINT, so that ``isan-serve`` exits 0 as it does with ``--workers``.

    Once it has shut down, uvicorn raises again the signal that stopped it, for the handler that was
    in place before ``run()``: by default SIGTERM would then end the process with -15, and SIGINT
    raise KeyboardInterrupt (click's ``Aborted!``, status 1). During ``run()`` that handler is one
    that does nothing (the signal has been handled: the shutdown is done); the previous ones come
    back after it.
    """
    def handled(signum, frame) -> None:
        return None

    before = {sig: signal.signal(sig, handled) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@click.command(cls=ServeCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65_535),
              help="TCP port (0: one the system picks).")
@click.option("--model", default=None, help="Bundle directory (default: the shipped text8 model).")
@click.option("--path", "path_mode", type=click.Choice(list(PATH_CHOICES)), default="auto", show_default=True,
              help="The engine's path (auto: composed with a trie table, else chunked; chunked: chunk-parallel, no "
                   "table loaded); used as it is with --no-batching (reference implies it).")
@click.option("--runtime", type=click.Choice(RUNTIMES), default="numpy", show_default=True,
              help="What scores: numpy, isan's engine and its compiled kernels; onnx, onnxruntime over the bundle's "
                   "ONNX graphs.")
@click.option("--backend", "deprecated_backend", type=click.Choice(RUNTIMES), default=None, hidden=True,
              help="The deprecated spelling of --runtime.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True,
              help="cuda: the numpy runtime's rounds run on the GPU with the torch kernel backend (the gpu extra; not "
                   "yet measured to pay for rounds of about a hundred rows), the onnx runtime uses onnxruntime's CUDA "
                   "provider; auto: CUDA when present. /healthz (model.kernels) says which backend and device run.")
@click.option("--max-chars", default=DEFAULT_MAX_CHARS, show_default=True, type=COUNT,
              help="Largest text per request or frame.")
@click.option("--max-pending-mb", default=_D.max_pending_mb, show_default=True,
              type=FiniteFloat(min=0, min_open=True, max=MAX_PENDING_MB),
              help="Memory bound: estimated MiB of request bodies, admitted texts and read-ahead frames held at once "
                   "(beyond it: 503 with Retry-After).")
@click.option("--max-streams", default=_D.max_streams, show_default=True, type=COUNT, help="Open WebSocket streams.")
@click.option("--max-stream-frames", default=_D.max_stream_frames, show_default=True, type=COUNT,
              help="Frames a stream may send ahead of its answers.")
@click.option("--round-chars", default=_D.round_chars, show_default=True, type=COUNT,
              help="Characters scored per scheduler round over all requests and streams.")
@click.option("--request-timeout", default=_D.request_timeout_s, show_default=True, type=SECONDS,
              help="Seconds a text may wait and run before it is answered 503 and its work dropped.")
@click.option("--stream-idle-timeout", default=_D.stream_idle_timeout_s, show_default=True, type=SECONDS,
              help="Seconds a stream may send nothing before it is closed (or read nothing while an answer waits: "
                   "its connection is aborted).")
@click.option("--batching/--no-batching", default=True, show_default=True,
              help="Score each round's texts in one batched kernel call, or each alone on the engine's path.")
@click.option("--threads", type=click.IntRange(1, 4096), default=None,
              help="Threads for the engine's kernels (default: one a CPU).")
@click.option("--read-timeout", default=_D.read_timeout_s, show_default=True, type=SECONDS,
              help="Seconds a request's headers, and then its body, may take to arrive (408 and closed beyond).")
@click.option("--keep-alive-timeout", default=_D.keep_alive_s, show_default=True, type=SECONDS,
              help="Seconds an idle keep-alive connection stays open.")
@click.option("--max-connections", default=_D.max_connections, show_default=True, type=COUNT,
              help="Open HTTP connections (streams are counted by --max-streams). At the cap, connections that "
                   "have waited a second for their client are closed (408) to make room; beyond: 503 and closed.")
@click.option("--max-batch-texts", default=_D.max_batch_texts, show_default=True, type=COUNT,
              help="Texts in one POST /v1/score/batch.")
@click.option("--max-sample-chars", default=_D.max_sample_chars, show_default=True, type=COUNT,
              help="Characters one POST /v1/sample may generate.")
@click.option("--max-attribute-chars", default=_D.max_attribute_chars, show_default=True, type=COUNT,
              help="Characters of one POST /v1/attribute text (memory grows with its square).")
@click.option("--api-key-file", default=None, type=click.Path(dir_okay=False),
              help="Require this API key on /v1 and /metrics (default: $ISAN_API_KEY, else no key).")
@click.option("--docs/--no-docs", default=True, show_default=True,
              help="Serve /docs, the API as an HTML page made by the server (no scripts, no CDN).")
@click.option("--ui/--no-ui", default=True, show_default=True,
              help="Serve isan lens at / (the web page that shows what the model reads, from the package; no CDN).")
@click.option("--state-secret-file", default=None, type=click.Path(dir_okay=False),
              help="Key that signs state snapshots, at least 32 bytes (default: $ISAN_STATE_SECRET, else random per "
                   "process).")
@click.option("--allow-origin", "allow_origin", multiple=True,
              help="A web page origin (like https://app.example.com; * for any) that may open /v1/stream besides the "
                   "server's own and loopback ones; repeat for several.")
@click.option("--allow-host", "allow_host", multiple=True,
              help="A name requests may carry in their Host header (like myhost.lan; * for any) besides localhost, "
                   "loopback addresses and, on connections to another address, IP addresses (the --host name is "
                   "one); others are refused (403) against DNS rebinding. Repeat for several.")
@click.option("--served-model-name", default=None,
              help="The model's name in the OpenAI-compatible API (GET /v1/models; default: the bundle's directory name).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, MAX_WORKERS),
              help="Worker processes on the one port, each with its own scheduler and engine (and the limits above); "
                   "they share the state secret (drawn for the run if none is set) and /metrics. Each loads the "
                   "model before it takes connections; --threads defaults to the CPUs divided among the workers.")
@click.option("--malloc-mmap-threshold-kib", default=_D.malloc_mmap_threshold_kib, show_default=True,
              type=click.IntRange(0, MAX_MMAP_THRESHOLD_KIB),
              help="glibc's mmap threshold, fixed in each process: memory blocks of this many KiB or more (a long "
                   "text's buffers and answers) go back to the system when freed, so resident memory follows what "
                   "the server holds; 0: glibc's own threshold, which rises up to 32 MiB (memory then stays).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug", "trace"]))
def main(host, port, model, path_mode, runtime, deprecated_backend, device, max_chars, max_pending_mb, max_streams,
         max_stream_frames, round_chars, request_timeout, stream_idle_timeout, batching, threads, read_timeout,
         keep_alive_timeout, max_connections, max_batch_texts, max_sample_chars, max_attribute_chars, api_key_file, docs,
         ui, state_secret_file, allow_origin, allow_host, served_model_name, workers, malloc_mmap_threshold_kib,
         log_level):
    """Serve scoring over HTTP (POST /v1/score, /v1/score/batch, /v1/next, /v1/sample, /v1/attribute; the
    OpenAI-compatible POST /v1/completions and GET /v1/models) and WebSocket (/v1/stream) with continuous batching. The server listens at once; GET /healthz says
    "loading" until the model is loaded, then "ready". SIGTERM or SIGINT stops it gracefully: requests in flight are
    answered, and each open stream gets its last state ({"event": "shutdown", "state": snapshot}) and close code 1012."""
    failed: list[str] = []
    runtime = chosen_runtime(runtime, deprecated_backend)
    try:
        config = _serve_config(
            host=host, threads=threads, workers=workers, api_key_file=api_key_file,
            state_secret_file=state_secret_file, allow_origin=allow_origin, allow_host=allow_host,
            served_model_name=served_model_name, max_chars=max_chars, max_pending_mb=max_pending_mb,
            max_streams=max_streams, max_stream_frames=max_stream_frames, round_chars=round_chars,
            request_timeout=request_timeout, stream_idle_timeout=stream_idle_timeout, batching=batching,
            read_timeout=read_timeout, keep_alive_timeout=keep_alive_timeout, max_connections=max_connections,
            max_batch_texts=max_batch_texts, max_sample_chars=max_sample_chars,
            max_attribute_chars=max_attribute_chars, docs=docs, ui=ui,
            malloc_mmap_threshold_kib=malloc_mmap_threshold_kib)
        manifest, src, server, spec = _prepare_server(model, path_mode, runtime, device, config, host, port,
                                                      log_level, failed)
    except ModuleNotFoundError as e:
        raise click.ClickException(f"isan-serve needs {e.name}: {install_hint('serve')}") from None
    except IsanError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"isan-serve: model {manifest.get('kind')} {src} ({path_mode} path, {runtime} runtime, device {device}, "
               f"{'batched rounds' if batching else 'no batching'}) on http://{host}:{port}"
               + (" (API key required)" if config.api_key else "")
               + (f"; isan lens at http://{host}:{port}/" if config.ui else "")
               + (f"; {workers} worker processes" if spec is not None else ""), err=True)
    if spec is not None:
        from isan.engine.serve.workers import serve

        why = serve(spec, host, port, log_level)
        if why is not None:
            raise click.ClickException(why)
    else:
        run_to_the_end(server)
    if failed:
        raise click.ClickException(f"the model could not be loaded: {failed[0]}")


def _serve_config(*, host, threads, workers, api_key_file, state_secret_file, allow_origin, allow_host,
                  served_model_name, max_chars, max_pending_mb, max_streams, max_stream_frames, round_chars,
                  request_timeout, stream_idle_timeout, batching, read_timeout, keep_alive_timeout, max_connections,
                  max_batch_texts, max_sample_chars, max_attribute_chars, docs, ui,
                  malloc_mmap_threshold_kib) -> ServeConfig:
    """The server's config from ``isan-serve``'s options (each named as its option): the key and the
    state secret read (:func:`read_key`, :func:`read_secret`), the ``--host`` name allowed, the kernel
    threads shared among the ``workers`` when not given.

    Raises:
        click.ClickException: a key or secret file that cannot be read.
        IsanError: a value :class:`ServeConfig` refuses.
    """
    if workers > 1 and threads is None:
        from isan.engine.serve.workers import worker_threads

        threads = worker_threads(workers)
    return ServeConfig(max_chars=max_chars, max_pending_mb=max_pending_mb, max_streams=max_streams,
                       max_stream_frames=max_stream_frames, round_chars=round_chars,
                       min_slice_chars=min(_D.min_slice_chars, round_chars), request_timeout_s=request_timeout,
                       stream_idle_timeout_s=stream_idle_timeout, batching=batching, threads=threads,
                       state_secret=read_secret(state_secret_file), read_timeout_s=read_timeout,
                       keep_alive_s=keep_alive_timeout, max_connections=max_connections,
                       max_batch_texts=max_batch_texts, max_sample_chars=max_sample_chars,
                       max_attribute_chars=max_attribute_chars, api_key=read_key(api_key_file), docs=docs, ui=ui,
                       allow_origins=tuple(allow_origin), allow_hosts=tuple(allow_host) + bound_name(host),
                       model_name=served_model_name, workers=workers,
                       malloc_mmap_threshold_kib=malloc_mmap_threshold_kib)


def _prepare_server(model, path_mode, runtime, device, config: ServeConfig, host, port, log_level,
                    failed: list[str]):
    """What serves: ``(manifest, its bundle's path, a uvicorn.Server or None, a WorkerSpec or None)``.
    With ``config.workers`` > 1, the spec from which each worker loads the model and builds its app
    (:mod:`isan.engine.serve.workers`); else the server, whose app loads an ISAN on the numpy runtime
    while it listens (a failure to load is appended to ``failed`` and stops it), any other model
    before. The bundle's manifest is read first: a missing or broken bundle fails before listening.

    Raises:
        IsanError: a missing or broken bundle, or a model that cannot be loaded (before listening).
        ModuleNotFoundError: uvicorn, or another module of the serve extra, missing.
    """
    import uvicorn

    from isan.engine import load_engine
    from isan.engine.bundle import read_manifest
    from isan.engine.paths import default_model_path
    from isan.engine.serve.app import create_app
    from isan.engine.serve.model_info import ModelInfo

    src = default_model_path() if model is None else model
    manifest = read_manifest(src, verify="none")  # a missing or broken bundle is an error before listening

    def load():
        return load_engine(model, path=path_mode, runtime=runtime, device=device)

    server = spec = None

    def stop(msg: str) -> None:
        failed.append(msg)
        if server is not None:
            server.should_exit = True

    if config.workers > 1:  # each worker loads the model and builds its app (engine/serve/workers.py)
        from isan.engine.serve.workers import WorkerSpec

        spec = WorkerSpec(model, path_mode, runtime, device, config)
    elif manifest.get("kind") == "isan" and runtime == "numpy":
        # load while listening: /healthz answers "loading" (composing a table can take seconds)
        app = create_app(loader=load, info=ModelInfo.of_manifest(manifest, str(src)), config=config,
                         on_load_failed=stop)
    else:  # other engines' states have other sizes than the manifest says: load first
        app = create_app(load(), config=config)
    if spec is None:
        from isan.engine.serve.malloc import set_mmap_threshold

        set_mmap_threshold(config.malloc_mmap_threshold_kib)  # each worker sets its own
        server = uvicorn.Server(app.uvicorn_config(host, port, log_level))
    return manifest, src, server, spec
