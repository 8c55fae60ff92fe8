"""Loading any bundle: :func:`load_engine` reads its kind and hands it to the engine that runs it
(:class:`~isan.engine.core.Engine` for ISAN bundles, the runners of :mod:`isan.engine.baselines` for
the other models, onnxruntime for ``backend="onnx"``)."""

from __future__ import annotations

from pathlib import Path

from isan.errors import IsanError
from isan.engine.core import PATHS, Engine
from isan.engine.paths import default_model_path


def load_engine(model: str | Path | None = None, path: str = "auto", backend: str = "numpy", device: str = "cpu",
                dtype: str = "float32"):
    """Load a bundle (``None``: the default model) with the chosen computation path and backend.

    Args:
        path: ``"auto"`` (ISAN bundles: composed when the bundle has a table, else chunked; other
            models: their runner's own path), ``"composed"`` (long texts and batches chunk-parallel
            by the kernel :meth:`Engine.plan` chooses), ``"chunked"`` (chunk-parallel
            through the compiled per-symbol kernel, ISAN bundles only), ``"jumps"`` (always
            chunk-parallel by composed jumps, ISAN bundles with a table) or ``"reference"``.
        backend: ``"numpy"`` or ``"onnx"`` (onnxruntime over the bundle's ONNX graphs; the
            provider that runs is reported in ``describe()``, never silently swapped).
        device: ``"cpu"``, ``"cuda"`` (``"cuda:N"``) or ``"auto"``. The numpy backend scores ISAN
            bundles on a GPU with the torch backend of the kernels (:meth:`Engine.load`); the onnx
            backend picks onnxruntime's provider. Never ignored: a device no backend can honour is
            an error.
        dtype: ``"float32"`` or ``"float64"`` (ISAN bundles on the torch backend; float64 is the
            exact reference on the device).
    Returns:
        an :class:`Engine` for ISAN bundles on the numpy backend, else an engine with the same
        scoring API (``score``, ``score_batch``, ``advance``, ``top_k``, ``sample``, ``describe``).
    Raises:
        BundleFormatError, TableFormatError, IsanError: with a message that says how to fix it.
    """
    from isan.engine.bundle import read_manifest

    if backend not in ("numpy", "onnx"):
        raise IsanError(f"backend must be numpy or onnx; got {backend!r}")
    if path not in ("auto",) + PATHS:
        raise IsanError(f"path must be auto or one of {', '.join(PATHS)}; got {path!r}")
    src = default_model_path() if model is None else Path(model)
    if backend == "onnx":
        if dtype != "float32":
            raise IsanError(f"the onnx backend computes in float32; dtype {dtype!r} needs the numpy backend")
        from isan.engine.baselines.onnx import load_onnx_engine

        return load_onnx_engine(src, device=device, path_mode=path)
    kind = read_manifest(src, verify="none")["kind"]  # the loader below verifies
    if kind != "isan" and (device != "cpu" or dtype != "float32"):
        raise IsanError(f"device {device!r} and dtype {dtype!r} run ISAN bundles (this is a {kind!r} bundle): "
                        "use device cpu, or --backend onnx for onnxruntime's providers")
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
