"""Compiled kernels of the engine and, beside each, its numpy twin with the same signature.

* :mod:`~isan.engine.kernels.streams`: many state rows advanced together, grouped by symbol
  (batches of texts; chunk-parallel scoring of one long text), ``run_streams`` /
  ``run_streams_ref``.
* :mod:`~isan.engine.kernels.jumps`: many rows advanced by composed jumps of a trie table's keys,
  grouped by key, ``run_jumps`` / ``run_jumps_ref``.
* :mod:`~isan.engine.kernels.sequential`: one stream through a composed trie table,
  ``seq_composed`` / ``seq_composed_ref``.
* :mod:`~isan.engine.kernels.chunked`: exact chunk-parallel scoring of long texts on any runner
  (the :class:`~isan.engine.kernels.chunked.Runner` contract).
* :mod:`~isan.engine.kernels.backends`: the registry of backends (native, numpy, torch) by device
  and dtype; :mod:`isan.engine.kernels.torch` (imported only when asked for) is the torch
  backend's runner, for GPUs.

The compiled module ``_native`` is a C extension built by the package install (setup.py). Where
it is missing or cannot load (:func:`native_error` says why), the backend chosen by default on the
CPU is ``numpy`` (:func:`~isan.engine.kernels.backends.default_backend`, whose ``describe()`` says
why), every kernel runs its numpy twin, and the engine logs that once; the ``native`` backend asked
for by name is then an error.

``ISAN_KERNELS`` names the backend that runs by default on the CPU in float32 (a name of the
registry, :data:`~isan.engine.kernels.backends.NAMES`); it is read in one place,
:func:`kernels_override`, and an unknown name is an error there. ``ISAN_KERNELS=numpy`` also makes
every kernel run its numpy twin (:func:`native` returns None), the sequential composed path's
included.
"""

from __future__ import annotations

import logging
import os

from isan.errors import IsanError

log = logging.getLogger(__name__)

try:  # the C extension is optional: the install succeeds without a compiler
    from isan.engine.kernels import _native  # type: ignore[attr-defined]

    _NATIVE_ERROR: str | None = None
except ImportError as e:  # pragma: no cover - depends on the install
    _native = None
    _NATIVE_ERROR = f"{e}"

_warned = False

from isan.engine.kernels import autotune as _autotune  # noqa: E402  (after _native: it imports nothing of ours at load)


#: The kernel backends' names, the keys of :data:`~isan.engine.kernels.backends.BACKENDS` (here, where
#: ``ISAN_KERNELS`` is read, so that this package imports none of its modules to check it).
NAMES = ("native", "numpy", "torch")


def kernels_override() -> str | None:
    """The backend ``ISAN_KERNELS`` names (``"native"``, ``"numpy"`` or ``"torch"``: a key of the
    registry, :data:`~isan.engine.kernels.backends.NAMES`), or None where it is unset or empty: the
    one place the variable is read (looked up on each call, so that a test or a caller may change it).

    Raises:
        IsanError: a value that names no backend (the message lists the choices).
    """
    value = os.environ.get("ISAN_KERNELS", "").strip()
    if not value:
        return None
    if value not in NAMES:
        raise IsanError(f"ISAN_KERNELS must name a kernel backend, one of {', '.join(NAMES)} (or be unset); "
                        f"got {value!r}")
    return value


def native_error() -> str | None:
    """None where the compiled module is loaded, else why it is not (the import's error)."""
    if _native is not None:
        return None
    return _NATIVE_ERROR or "the compiled module isan.engine.kernels._native is not loaded"


def native():
    """The compiled module, or None: then the numpy twins run (it is missing, or
    ``ISAN_KERNELS=numpy``: :func:`kernels_override`). Logs once why it is missing. The first call
    of a process chooses the kernels' register tile (:mod:`~isan.engine.kernels.autotune`: cached,
    or timed in under 0.3 s).

    Raises:
        IsanError: ``ISAN_KERNELS`` names no backend.
    """
    global _warned
    if kernels_override() == "numpy":
        return None
    if _native is None:
        if not _warned:
            _warned = True
            log.warning("isan's compiled kernels are not available (%s); running the numpy kernels, which are "
                        "several times slower. Reinstall with a C compiler present (pip install --force-reinstall .) "
                        "to build them.", native_error())
        return None
    _autotune.ensure(_native)  # chooses the tile once a process; cheap after
    return _native


def native_status() -> dict:
    """{"available": bool, "isa": "avx512"|"avx2"|"generic"|None, "error": str|None, "threads": int,
    "tile": the register tile that runs ("avx512_14x2") or None, "tile_how": why (autotuned, cached,
    forced, default; "not yet chosen" before the first kernel call), "tile_timings": the autotune's
    {variant: {"gflops", ...}} (empty unless timed or cached), "pinning": where a team that covers
    every core puts its threads ({"cpus": [...], "physical_cores": n}; empty unless
    ``ISAN_PIN_THREADS=1``: opt-in)}."""
    mod = _native
    tile = _autotune.tile_status(mod) if mod is not None else {"variant": None, "how": None, "timings": {}}
    return {"available": mod is not None and kernels_override() != "numpy",
            "isa": mod.isa() if mod is not None else None,
            "error": native_error(),
            "threads": default_threads(),
            "tile": tile["variant"] or (mod.variant() if hasattr(mod, "variant") else None),
            "tile_how": tile["how"], "tile_timings": tile["timings"],
            "pinning": dict(zip(("cpus", "physical_cores"), mod.pin_plan())) if hasattr(mod, "pin_plan") else {}}


def autotune_kernels(force: bool = False, d: int = 216) -> dict:
    """Choose the compiled kernels' register tile now rather than at the first kernel call (see
    :mod:`~isan.engine.kernels.autotune`); ``force`` times the tiles again, ignoring the cache.
    Returns {"variant", "how", "timings"}; {} without the compiled kernels."""
    if _native is None:
        return {}
    return _autotune.autotune(_native, force=force, d=d)


def default_threads() -> int:
    """Threads for the kernels: ``$ISAN_NUM_THREADS``, else the CPUs this process may run on."""
    env = os.environ.get("ISAN_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            log.warning("ISAN_NUM_THREADS=%r is not an integer; ignoring it", env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)
