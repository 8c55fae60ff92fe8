"""``isan-serve --workers N``: N processes serving one port, each its own scheduler and engine.

One process's Python request handling, not the kernels, bounds what ``isan-serve`` answers (the
server guide, 'Measured'); N worker processes use N cores for it. The mechanism is uvicorn's own
multi-worker mode (``uvicorn --workers``: :class:`uvicorn.supervisors.Multiprocess`): this process
binds the socket and starts N workers (spawned) that accept connections on it; the kernel gives
each new connection to one of them. The supervisor replaces a worker that dies, and on SIGTERM or
SIGINT closes its own copy of the listening socket (:class:`Supervisor`), asks each worker to stop
(SIGTERM: each closes its copy, then drains) and waits for them all: once every copy is closed, a
new connection is refused (a balancer tries another replica) rather than accepted by the kernel for
nobody to serve.

Each worker builds its app with uvicorn's app factory (:func:`worker_app`, from the picklable
:class:`WorkerSpec`): it loads the model before it takes connections (so every answer comes from
a ready worker), with the server's connection limits (:class:`WorkerConfig`). A model that cannot
be loaded ends the worker with uvicorn's startup-failure code, and the supervisor stops the rest.

What the workers share:

* the port (one listening socket);
* the state secret: a snapshot made by one worker must restore on another, so without
  ``--state-secret-file`` or ``ISAN_STATE_SECRET`` this process draws one secret for the run and
  hands it to each (:func:`serve`);
* the metrics: prometheus_client's multiprocess mode, in a temporary folder
  (``PROMETHEUS_MULTIPROC_DIR``) removed when the server stops, so ``/metrics`` gives all workers'
  (:mod:`isan.engine.serve.metrics`). When a worker dies the supervisor drops its live gauges at
  once (open streams, pending bytes and jobs: ``mark_process_dead``), and logs the worker that
  takes its place; each worker logs how long it took to load the model and serve.

Workers die with their parent: each has the kernel send it SIGTERM when the parent ends, even by
SIGKILL, and a run folder left by a killed parent is removed by the next ``isan-serve --workers``
(:mod:`isan.engine.serve.orphans`).

Everything else is per worker: the limits of :class:`~isan.engine.serve.config.ServeConfig`
(connections, streams, the memory budget), the kernel threads (by default the CPUs divided among
the workers: :func:`worker_threads`), the scheduler's rounds and ``/healthz`` (which names the
worker that answered: ``{"worker": {"pid", "workers"}}``). A graceful shutdown of a worker finishes
every HTTP request it holds and hands back every open stream (its last state in a shutdown frame,
then close 1012: :mod:`isan.engine.serve.websocket`).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from isan.engine.serve.config import ServeConfig
from isan.engine.serve.metrics import MULTIPROC_ENV
from isan.engine.serve.orphans import die_with_parent, remove_stale_run_dirs, run_dir_prefix

log = logging.getLogger(__name__)
#: the supervisor's and the workers' lines about workers, in uvicorn's log (as its own "Child process" lines)
events = logging.getLogger("uvicorn.error")
#: when this module was imported: in a worker, right after its process started (it unpickles its config)
_STARTED = time.time()

#: seconds a worker has to answer the supervisor's health check (uvicorn's default is 5; a worker
#: loading a model on a busy machine may take longer to be scheduled)
HEALTHCHECK_S = 30
#: the file in the run folder where a worker that could not load the model writes why
FAILED = "load_failed.txt"


def worker_threads(workers: int) -> int:
    """Kernel threads of each of ``workers`` workers when ``--threads`` is not given: the CPUs
    (:func:`isan.engine.kernels.default_threads`) divided among them, at least one (as the corpus
    job's workers take them), so the workers' kernels do not take more cores than there are."""
    from isan.engine.kernels import default_threads

    return max(1, default_threads() // workers)


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its app (pickled to each worker).

    Attributes:
        model, path, runtime, device: as ``isan-serve`` takes them (:func:`isan.engine.load_engine`).
        config: the limits of each worker (``config.workers``: how many there are).
        run_dir: the folder of this run (metrics files, a load failure's message).
    """

    model: str | None
    path: str
    runtime: str
    device: str
    config: ServeConfig
    run_dir: str = ""

    def load_engine(self):
        from isan.engine import load_engine

        return load_engine(self.model, path=self.path, runtime=self.runtime, device=self.device)


def worker_app(spec: WorkerSpec):
    """The app of one worker (uvicorn's app factory, called in the worker): the model loaded first.

    A model that cannot be loaded is logged (one line, no traceback), its message written to the
    run folder, and the worker ends with uvicorn's startup-failure code (the supervisor then stops).
    The worker is sent SIGTERM when its parent ends (:func:`~isan.engine.serve.orphans.die_with_parent`),
    and fixes its allocator's mmap threshold (:func:`~isan.engine.serve.malloc.set_mmap_threshold`).
    """
    from isan.engine.serve.app import create_app
    from isan.engine.serve.malloc import set_mmap_threshold

    set_mmap_threshold(spec.config.malloc_mmap_threshold_kib)
    parent = multiprocessing.parent_process()
    if parent is not None:
        die_with_parent(parent.pid)
    t0 = time.time()
    try:
        engine = spec.load_engine()
    except Exception as e:  # noqa: BLE001 - reported to isan-serve, which exits with it
        msg = str(e) or type(e).__name__
        log.error("worker %d: the model could not be loaded: %s", os.getpid(), msg)
        try:
            (Path(spec.run_dir) / FAILED).write_text(msg + "\n", encoding="utf-8")
        except OSError:  # pragma: no cover - the run folder is gone: the parent is stopping
            pass
        raise SystemExit(STARTUP_FAILURE) from None
    app = create_app(engine, config=spec.config)
    events.info("Worker [%d] loaded the model in %.1f s and serves, %.1f s after its process started", os.getpid(),
                time.time() - t0, time.time() - _STARTED)
    return app


class Supervisor(Multiprocess):
    """uvicorn's :class:`~uvicorn.supervisors.Multiprocess` that closes the parent's listening sockets
    before it stops the workers: the parent's copy would keep the port open while they drain (up to
    :data:`~isan.engine.serve.connections.HAND_BACK_GRACE_S` for a stream, as long as it takes for a
    request begun), the kernel accepting connections that nobody serves. A worker that dies has its
    live gauges dropped as soon as it is seen dead (before the one in its place has loaded the
    model), and its replacement is logged.

    Args:
        metrics_dir: the workers' metrics folder (``PROMETHEUS_MULTIPROC_DIR``).
    """

    def __init__(self, config, sockets, metrics_dir: str):
        super().__init__(config, sockets)
        self.metrics_dir = metrics_dir

    def forget(self, pid: int) -> None:
        """The worker ``pid`` has ended: its open streams, pending bytes and jobs no longer count."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self.metrics_dir)

    def keep_subprocess_alive(self) -> None:
        before = list(self.processes)
        for p in before:  # seen dead without waiting for the health checks of the others
            if p.pid is not None and not p.process.is_alive():
                self.forget(p.pid)
        super().keep_subprocess_alive()
        for old, new in zip(before, self.processes):
            if new is not old:
                self.forget(old.pid)
                events.warning("Worker [%s] ended (exit code %s); worker [%s] started in its place at %s", old.pid,
                               old.exitcode, new.pid, time.strftime("%H:%M:%S"))

    def terminate_all(self) -> None:
        for sock in self.sockets:
            sock.close()
        super().terminate_all()


class WorkerConfig(uvicorn.Config):
    """uvicorn's Config of the workers: the app is :func:`worker_app` (an app factory, built in
    each worker), the protocols carry the server's connection limits
    (:func:`isan.engine.serve.connections.uvicorn_options`). Picklable: the supervisor sends it to
    every worker it starts."""

    def __init__(self, spec: WorkerSpec, host: str, port: int, log_level: str):
        from isan.engine.serve.connections import uvicorn_options

        self.spec = spec
        options = {k: v for k, v in uvicorn_options(spec.config).items() if k not in ("http", "ws")}
        super().__init__(functools.partial(worker_app, spec), factory=True, host=host, port=port,
                         log_level=log_level, workers=spec.config.workers, timeout_worker_healthcheck=HEALTHCHECK_S,
                         **options)

    def load(self) -> None:
        from isan.engine.serve.connections import uvicorn_options

        # the protocol classes are made here, in the worker (classes made at run time do not pickle)
        options = uvicorn_options(self.spec.config)
        self.http = options.get("http", self.http)
        self.ws = options.get("ws", self.ws)
        super().load()


def serve(spec: WorkerSpec, host: str, port: int, log_level: str = "info") -> str | None:
    """Serve with ``spec.config.workers`` worker processes until SIGTERM or SIGINT (then each worker
    shuts down gracefully and this returns once all have ended).

    Without a configured state secret, one is drawn here for all workers. The run folder (metrics)
    is made here and removed at the end, whatever signal ends the run; those of servers killed
    before they could remove theirs are removed first
    (:func:`~isan.engine.serve.orphans.remove_stale_run_dirs`).

    Returns:
        None, or why the workers could not start (a model that could not be loaded: its message).
    """
    from isan.engine.serve.snapshot import new_secret

    if spec.config.state_secret is None:
        spec = replace(spec, config=replace(spec.config, state_secret=new_secret(), state_secret_drawn=True))
    run_dir = tempfile.mkdtemp(prefix=run_dir_prefix())
    metrics_dir = os.path.join(run_dir, "metrics")
    os.mkdir(metrics_dir)
    before = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = metrics_dir  # read by prometheus_client when a worker imports it
    try:
        config = WorkerConfig(replace(spec, run_dir=run_dir), host, port, log_level)  # it sets up uvicorn's log
        remove_stale_run_dirs()
        sock = config.bind_socket()
        supervisor = Supervisor(config, sockets=[sock], metrics_dir=metrics_dir)
        supervisor.run()
        sock.close()
        failed = Path(run_dir) / FAILED
        if failed.exists():
            return f"the model could not be loaded: {failed.read_text(encoding='utf-8').strip()}"
        if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
            return "a worker could not start (its log says why)"
        return None
    finally:
        if before is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = before
        shutil.rmtree(run_dir, ignore_errors=True)
