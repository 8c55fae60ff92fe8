"""The Ray executor: the corpus job's input files as a Ray Dataset, scored by actors, one engine each.

``ray.data.from_items`` lists the input files; ``map_batches`` hands them, one file a batch, to a
pool of :class:`FileScorer` actors (``ActorPoolStrategy(size=n)``, ``num_cpus`` CPUs each); each actor loads the model once and runs the same
:func:`isan.engine.corpus.parts.process_file` as the local executor, so the two write the same files
(atomically, resumable). Actors read the inputs and write the output themselves: on a real cluster
both must be reachable from every node under the same path (a shared file system, or fsspec URLs
such as ``s3://`` for the inputs), and every node needs isan installed.

The documents are read by isan's readers inside the actors rather than by ``ray.data.read_json``
or ``read_parquet``: those fail a whole file on one bad line, where the job records each bad
document and goes on, and their output files could not be the local executor's.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


class FileScorer:
    """A Ray Data actor: loads the model once, then scores whole input files (``path`` column)."""

    def __init__(self, cfg: dict, out: str, threads: int):
        from isan.engine.corpus.parts import JobConfig, load_corpus_engine
        from isan.engine.corpus.scoring import DocScorer

        self.cfg = JobConfig(**cfg)
        engine = load_corpus_engine(self.cfg.model, self.cfg.device, self.cfg.dtype)
        if engine.params_sha256 != self.cfg.params_sha256:
            from isan.errors import IsanError

            raise IsanError(f"the model on this node ({engine.source}, {engine.params_sha256[:12]}) is not the "
                            f"driver's ({self.cfg.params_sha256[:12]}); install the same isan and model on every node")
        from isan.engine.corpus.scoring import corpus_path

        if corpus_path(engine) != self.cfg.kernel:
            from isan.errors import IsanError

            raise IsanError(f"the model on this node ({engine.source}) scores by the {corpus_path(engine)} kernel, the "
                            f"driver's by {self.cfg.kernel} (its trie table is {'missing' if engine.table is None else 'there'}"
                            " here); install the same isan and model, with its table, on every node")
        self.scorer = DocScorer(engine, self.cfg.options(threads))
        self.shards = Path(out) / "shards"

    def __call__(self, batch: dict) -> dict:
        from isan.engine.corpus.parts import process_file

        keys = ("path", "key", "parts", "documents", "chars_read", "chars_scored", "bits", "errors", "file_error",
                "new_documents", "new_chars", "skipped")
        out = {k: [] for k in keys}
        out["node"] = []
        for path in list(batch["path"]):
            rec = process_file(self.scorer, self.cfg, str(path), self.shards)
            for k in keys:
                out[k].append(rec.get(k))
            out["node"].append(_node_id())
        return out


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001
        return ""


def run_ray(paths: list[str], cfg, out: Path, address: str | None, actors: int | None, cpus_per_actor: float,
            on_file: Callable[[dict], None] | None = None) -> tuple[list[dict], dict]:
    """Score ``paths`` on a Ray cluster; returns (one done record per path, in order; facts about the run)."""
    try:
        import ray
    except ImportError:
        from isan.errors import IsanError, install_hint

        raise IsanError(f"the Ray executor needs Ray: {install_hint('ray')}") from None
    from dataclasses import asdict

    started_here = not ray.is_initialized()
    if started_here:
        env = {k: os.environ[k] for k in ("PYTHONPATH", "ISAN_CACHE_DIR") if os.environ.get(k)}
        # no address: start a private local cluster ("local"; never attach to whatever runs here)
        try:
            ray.init(address=address or "local", runtime_env={"env_vars": env} if env else None, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=True,
                     include_dashboard=False if not address else None)
        except (ConnectionError, TimeoutError, ValueError, RuntimeError) as e:
            from isan.errors import IsanError

            where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
            raise IsanError(f"cannot connect to {where} ({str(e).splitlines()[0][:200]}); start one with "
                            "`ray start --head` and give its address (HOST:6379, or ray://HOST:10001)") from None
    try:
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # the dataset's plan and progress: not for users
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        cpus = float(ray.cluster_resources().get("CPU", 1))
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        gpus = 1 if cfg.device.startswith("cuda") else 0  # one actor a GPU
        if gpus:
            have = int(ray.cluster_resources().get("GPU", 0))
            if have < 1:
                from isan.errors import BackendUnavailableError

                raise BackendUnavailableError(f"device {cfg.device!r} was asked for but the Ray cluster has no GPU; "
                                              "start its nodes on GPU machines or use device cpu")
            actors = min(actors or have, have)
        n = max(1, min(len(paths), actors or int(cpus // max(cpus_per_actor, 1e-9)) or 1))
        threads = max(1, int(round(cpus_per_actor)))
        ds = ray.data.from_items([{"path": p} for p in paths], override_num_blocks=max(1, len(paths)))
        scored = ds.map_batches(FileScorer, fn_constructor_kwargs={"cfg": asdict(cfg), "out": str(out),
                                                                   "threads": threads},
                                batch_size=1, compute=ray.data.ActorPoolStrategy(size=n), num_cpus=cpus_per_actor,
                                num_gpus=gpus, batch_format="default")
        by_path: dict[str, dict] = {}
        nodes_used = set()
        for row in scored.iter_rows():
            rec = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            by_path[rec["path"]] = rec
            nodes_used.add(rec.get("node"))
            if on_file:
                on_file(rec)
        missing = [p for p in paths if p not in by_path]
        if missing:
            from isan.errors import IsanError

            raise IsanError(f"the Ray job returned no result for {len(missing)} file(s), e.g. {missing[0]}; "
                            "run it again (complete files are kept)")
        # the summary's key stays "runner" (its JSON is unchanged)
        where = {"runner": "ray", "address": address or "local", "cluster_cpus": cpus, "cluster_nodes": nodes,
                 "actors": n, "cpus_per_actor": cpus_per_actor, "gpus_per_actor": gpus, "nodes_used": len(nodes_used - {""})}
        return [by_path[p] for p in paths], where
    finally:
        if started_here:
            ray.shutdown()
