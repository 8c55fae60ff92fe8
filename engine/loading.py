"""Loading any bundle: :func:`load_engine` reads its kind and hands it to the engine that runs it
(:class:`~isan.engine.core.Engine` for ISAN bundles, the runners of :mod:`isan.engine.baselines` for
the other models, onnxruntime for ``runtime="onnx"``).

Two words, two things: the *runtime* is what scores (``"numpy"``: isan's own engine and its compiled
kernels; ``"onnx"``: onnxruntime over the bundle's exported graphs); the *kernel backend*
(:mod:`isan.engine.kernels.backends`: native, numpy, torch) is which code advances the state rows of
the numpy runtime, and on which device."""

from __future__ import annotations

import warnings
from pathlib import Path

from isan.errors import IsanError
from isan.engine.core import Engine
from isan.engine.route import check_path
from isan.engine.paths import default_model_path


#: the runtimes that score a bundle (:func:`load_engine`'s ``runtime``)
RUNTIMES = ("numpy", "onnx")


def load_engine(model: str | Path | None = None, path: str = "auto", runtime: str | None = None, device: str = "cpu",
                dtype: str = "float32", *, backend: str | None = None):
    """Load a bundle (``None``: the default model) with the chosen computation path and runtime.

    Args:
        path: ``"auto"`` (ISAN bundles: composed when the bundle has a table, else chunked; other
            models: their runner's own path), ``"composed"`` (long texts and batches chunk-parallel
            by the kernel :meth:`Engine.plan` chooses), ``"chunked"`` (chunk-parallel
            through the compiled per-symbol kernel, ISAN bundles only), ``"jumps"`` (always
            chunk-parallel by composed jumps, ISAN bundles with a table) or ``"reference"``.
        runtime: ``"numpy"`` (the default: isan's engine and its compiled kernels) or ``"onnx"``
            (onnxruntime over the bundle's ONNX graphs; the provider that runs is reported in
            ``describe()``, never silently swapped).
        device: ``"cpu"``, ``"cuda"`` (``"cuda:N"``) or ``"auto"``. The numpy runtime scores ISAN
            bundles on a GPU with the torch kernel backend (:meth:`Engine.load`); the onnx runtime
            picks onnxruntime's provider. Never ignored: a device neither can honour is an error.
        dtype: ``"float32"`` or ``"float64"`` (ISAN bundles on the torch kernel backend; float64 is
            the exact reference on the device).
        backend: deprecated alias of ``runtime``, kept for a release (it warns:
            ``DeprecationWarning``).
    Returns:
        an :class:`Engine` for ISAN bundles on the numpy runtime, else an engine with the same
        scoring API (``score``, ``score_batch``, ``advance``, ``top_k``, ``sample``, ``describe``).
    Raises:
        BundleFormatError, TableFormatError, IsanError: with a message that says how to fix it
            (among them ``runtime`` and ``backend`` both given).
    """
    from isan.engine.bundle import read_manifest
    from isan.engine.kernels.backends import default_backend

    runtime = renamed_keyword("runtime", runtime, "backend", backend, default="numpy")
    if runtime not in RUNTIMES:
        raise IsanError(f"runtime must be numpy or onnx; got {runtime!r}")
    check_path(path, auto=True)
    src = default_model_path() if model is None else Path(model)
    if runtime == "onnx":
        if dtype != "float32":
            raise IsanError(f"the onnx runtime computes in float32; dtype {dtype!r} needs the numpy runtime")
        from isan.engine.baselines.onnx import load_onnx_engine

        return load_onnx_engine(src, device=device, path_mode=path)
    kind = read_manifest(src, verify="none")["kind"]  # the loader below verifies
    if kind != "isan" and default_backend(device, dtype) != "native":  # the other models run on the CPU's float32
        raise IsanError(f"device {device!r} and dtype {dtype!r} run ISAN bundles (this is a {kind!r} bundle): "
                        "use device cpu, or --runtime onnx for onnxruntime's providers")
    if kind != "isan":
        if path in ("composed", "chunked", "jumps"):
            raise IsanError(f"the {path} path runs ISAN bundles only (this is a {kind!r} bundle); "
                            "use --path auto or reference")
        if kind == "ngram":
            from isan.engine.baselines.ngram import load_ngram_engine

            return load_ngram_engine(src)
        if kind in ("linear", "linear_nlro", "isan_nobias"):
            from isan.engine.baselines.linear import load_linear_engine

            return load_linear_engine(src)
        from isan.engine.baselines.occam import OCCAM_KINDS
        from isan.engine.baselines.reservoir import RESERVOIR_KINDS

        if kind in RESERVOIR_KINDS:  # ESN and NPM baselines (Cernansky et al. 2008)
            from isan.engine.baselines.recurrent import RunnerEngine
            from isan.engine.baselines.reservoir import load_reservoir_bundle

            runner = load_reservoir_bundle(src)
            return RunnerEngine(runner, runner.alphabet, runner.manifest, source=str(src), path="reference")
        if kind in OCCAM_KINDS:  # the Occam-gated LSTM (Raiman and Sidor)
            from isan.engine.baselines.recurrent import RunnerEngine, load_params_bundle
            from isan.engine.baselines.occam import NumpyOccamRunner, OccamParams

            m, p, alphabet = load_params_bundle(src, OCCAM_KINDS, OccamParams)
            return RunnerEngine(NumpyOccamRunner(p), alphabet, m, source=str(src), path="reference")
        from isan.engine.baselines.recurrent import load_baseline_engine

        return load_baseline_engine(src)
    return Engine.load(src, path_mode=path, device=device, dtype=dtype)


def renamed_keyword(name: str, value, old_name: str, old_value, default, stacklevel: int = 2):
    """The value of keyword ``name`` where ``old_name`` is its deprecated alias (kept for a release):
    ``value``, else ``old_value`` with a ``DeprecationWarning`` that names the new keyword, else
    ``default``. ``stacklevel`` is the one ``warnings.warn`` would take in the function that calls
    this one (2, the default: the warning points at that function's caller).

    Raises:
        IsanError: both given (even with the same value: one spelling is asked for).
    """
    if old_value is None:
        return default if value is None else value
    if value is not None:
        raise IsanError(f"give {name}= or {old_name}= (its deprecated alias), not both; got {name}={value!r} "
                        f"and {old_name}={old_value!r}")
    warnings.warn(f"{old_name}= is deprecated: use {name}= (the same values)", DeprecationWarning,
                  stacklevel=stacklevel + 1)
    return old_value
