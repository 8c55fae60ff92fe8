"""The ONNX graphs of a bundle's weights, built from numpy with ``onnx.helper`` (no torch).

The engine builds them into the user cache on first use for a bundle that ships none
(:func:`cached_graphs`, the shipped model's ``--runtime onnx``), and :mod:`isan.export.onnx_export`
writes them into bundles (``isan export --onnx``); onnxruntime runs them in
:mod:`isan.engine.baselines.onnx`. The ``onnx`` package is imported only when a graph is built.

Every model gets two files (onnx#3190: state in, state out):

``model.onnx`` (one step)
    inputs ``token`` int64 [B], ``h`` float32 [B, d] (LSTM also ``c`` [B, d]);
    outputs ``logits`` float32 [B, V], ``h_next`` [B, d] (LSTM also ``c_next``).
``sequence.onnx`` (a whole chunk)
    inputs ``tokens`` int64 [B, T], ``h`` [B, d] (LSTM also ``c``);
    outputs ``logits`` [B, T, V], ``h_last`` [B, d] (LSTM also ``c_last``).

Logits convention (the same for every graph and model): the logits are the readout of the
state *after* consuming a token, so they predict the *next* token. For the ISAN step graph
``h_next = W[token] @ h + b[token]`` and ``logits = W_ro @ h_next + b_ro``; in the sequence
graph ``logits[:, t]`` is the readout after ``tokens[:, t]``. Scoring (``bits_t = -log2
softmax(W_ro h_{t-1} + b_ro)[x_t]``) therefore takes the first prediction from the incoming
state, ``W_ro h + b_ro``, computed outside the graph from ``W_ro``/``b_ro`` of
``weights.safetensors`` (:class:`isan.engine.baselines.onnx.OnnxRunner` does exactly that).

The ISAN is built as Gather/MatMul/Add (the sequence graph a ``Scan``); the baselines with the
standard ONNX ``RNN`` (Tanh or Relu), ``GRU`` (``linear_before_reset=1``) and ``LSTM``
operators, their gates reordered from torch's order (GRU r,z,n -> z,r,h; LSTM i,f,g,o ->
i,o,f,c) and the one-hot input fed as rows of an identity table.

Each file's ``metadata_props`` carry ``format`` (``isan-onnx``), ``format_version``,
``graph`` (step or sequence), ``kind``, ``params_sha256`` (binding the file to its weights),
``opset``, ``inputs``/``outputs`` (JSON: names, dtypes, shapes), ``state`` and ``logits``
(the convention above). :func:`isan.export.onnx_export.onnx_hook` adds the same facts to the
manifest under ``"onnx"``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from isan.atomic import write_bytes_atomic, write_json_atomic
from isan.errors import BundleFormatError
from isan.params import ISAN_TENSORS, ISANParams, load_tensors

log = logging.getLogger(__name__)

ONNX_FORMAT = "isan-onnx"
ONNX_FORMAT_VERSION = 1
DEFAULT_OPSET = 17
STEP_FILE = "model.onnx"
SEQUENCE_FILE = "sequence.onnx"
LOGITS_CONVENTION = (
    "logits are the readout W_ro h + b_ro of the state after consuming each token (they predict the next "
    "token); the first token of a text is predicted from the incoming state h, outside the graph")
BASELINE_KINDS = ("rnn", "irnn", "gru", "lstm")
#: torch gate blocks in ONNX order: GRU (r, z, n) -> (z, r, h); LSTM (i, f, g, o) -> (i, o, f, c)
ONNX_GATE_ORDER = {"rnn": [0], "irnn": [0], "gru": [1, 0, 2], "lstm": [0, 3, 1, 2]}


# ---- interface description ---------------------------------------------------------------
def state_names(kind: str) -> list[str]:
    """["h", "c"] for the LSTM, else ["h"]."""
    return ["h", "c"] if kind == "lstm" else ["h"]


def graph_io(kind: str, d: int, V: int) -> dict:
    """Names, dtypes and shapes of both graphs' inputs and outputs (symbolic dims "B", "T")."""
    st = state_names(kind)
    f = lambda name, shape: {"name": name, "dtype": "float32", "shape": shape}  # noqa: E731
    return {
        "step": {
            "file": STEP_FILE,
            "inputs": [{"name": "token", "dtype": "int64", "shape": ["B"]}] + [f(s, ["B", d]) for s in st],
            "outputs": [f("logits", ["B", V])] + [f(f"{s}_next", ["B", d]) for s in st],
        },
        "sequence": {
            "file": SEQUENCE_FILE,
            "inputs": [{"name": "tokens", "dtype": "int64", "shape": ["B", "T"]}] + [f(s, ["B", d]) for s in st],
            "outputs": [f("logits", ["B", "T", V])] + [f(f"{s}_last", ["B", d]) for s in st],
        },
    }


def _value_info(spec: dict):
    from onnx import TensorProto, helper

    dtype = TensorProto.INT64 if spec["dtype"] == "int64" else TensorProto.FLOAT
    return helper.make_tensor_value_info(spec["name"], dtype, spec["shape"])


def _init(name: str, a: np.ndarray):
    from onnx import numpy_helper

    a = np.asarray(a)
    a = np.ascontiguousarray(a, dtype=np.int64 if a.dtype.kind in "iu" else np.float32)
    return numpy_helper.from_array(a, name)


def _make_model(graph, kind: str, which: str, io: dict, sha: str, opset: int):
    """Wrap a graph into a checked ModelProto with the isan metadata."""
    import onnx
    from onnx import helper

    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="isan",
                              ir_version=helper.find_min_ir_version_for(opsets))
    try:
        from importlib.metadata import version

        model.producer_version = version("isan")
    except Exception:  # not installed as a distribution (a source checkout)
        pass
    model.doc_string = f"isan {kind} {which} graph. {LOGITS_CONVENTION}."
    helper.set_model_props(model, {
        "format": ONNX_FORMAT, "format_version": str(ONNX_FORMAT_VERSION), "graph": which, "kind": kind,
        "params_sha256": sha, "opset": str(opset), "inputs": json.dumps(io[which]["inputs"]),
        "outputs": json.dumps(io[which]["outputs"]), "state": json.dumps(state_names(kind)),
        "logits": LOGITS_CONVENTION,
    })
    onnx.checker.check_model(model, full_check=True)
    return model


def _write(models: dict, out_dir: Path, info: dict) -> None:
    """Write each graph atomically and record its sha256 and size in ``info[graph]``."""
    import hashlib

    out_dir.mkdir(parents=True, exist_ok=True)
    which = {STEP_FILE: "step", SEQUENCE_FILE: "sequence"}
    for name, model in models.items():
        data = model.SerializeToString()
        write_bytes_atomic(out_dir / name, data)
        info[which[name]]["sha256"] = hashlib.sha256(data).hexdigest()
        info[which[name]]["bytes"] = len(data)


def _info(kind: str, io: dict, sha: str, opset: int) -> dict:
    return {"format": ONNX_FORMAT, "format_version": ONNX_FORMAT_VERSION, "opset": opset, "kind": kind,
            "params_sha256": sha, "state": state_names(kind), "logits": LOGITS_CONVENTION,
            "step": io["step"], "sequence": io["sequence"]}


# ---- ISAN ----------------------------------------------------------------------------------
def _isan_update_nodes(tok: str, h: str, out: str, prefix: str) -> list:
    """Nodes of ``out = W[tok] @ h + b[tok]`` for a batch: tok int64 [B], h [B, d] -> out [B, d]."""
    from onnx import helper

    p = prefix
    return [
        helper.make_node("Gather", ["W", tok], [f"{p}Wx"], axis=0),        # (B, d, d)
        helper.make_node("Gather", ["b", tok], [f"{p}bx"], axis=0),        # (B, d)
        helper.make_node("Unsqueeze", [h, "axis_last"], [f"{p}h_col"]),    # (B, d, 1)
        helper.make_node("MatMul", [f"{p}Wx", f"{p}h_col"], [f"{p}Wh_col"]),
        helper.make_node("Squeeze", [f"{p}Wh_col", "axis_last"], [f"{p}Wh"]),
        helper.make_node("Add", [f"{p}Wh", f"{p}bx"], [out]),
    ]


def isan_onnx_models(params: ISANParams, opset: int = DEFAULT_OPSET, sha: str | None = None) -> tuple[dict, dict]:
    """The ISAN's step and sequence ModelProtos (checked) and the manifest ``"onnx"`` section.

    Returns:
        ({"model.onnx": ModelProto, "sequence.onnx": ModelProto}, info dict).
    """
    from onnx import TensorProto, helper

    p = params.astype(np.float32)
    d, V = p.d, p.V
    sha = sha or p.sha256()  # the stored weights' hash (token models: before their inputs are expanded)
    io = graph_io("isan", d, V)
    axes = [_init("axis_last", np.array([2], dtype=np.int64))]
    weights = [_init("W", p.W), _init("b", p.b), _init("W_ro", p.W_ro), _init("b_ro", p.b_ro)]

    step_nodes = _isan_update_nodes("token", "h", "h_next", "") + [
        helper.make_node("Gemm", ["h_next", "W_ro", "b_ro"], ["logits"], transB=1)]
    step = helper.make_graph(step_nodes, "isan_step", [_value_info(s) for s in io["step"]["inputs"]],
                             [_value_info(s) for s in io["step"]["outputs"]], initializer=weights + axes,
                             doc_string="h_next = W[token] @ h + b[token]; logits = W_ro @ h_next + b_ro")

    body = helper.make_graph(
        _isan_update_nodes("tok", "h_in", "h_out", "s_") + [helper.make_node("Identity", ["h_out"], ["h_t"])],
        "isan_scan_body",
        [helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["B", d]),
         helper.make_tensor_value_info("tok", TensorProto.INT64, ["B"])],
        [helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["B", d]),
         helper.make_tensor_value_info("h_t", TensorProto.FLOAT, ["B", d])])
    seq_nodes = [
        helper.make_node("Scan", ["h", "tokens"], ["h_last", "H"], body=body, num_scan_inputs=1,
                         scan_input_axes=[1], scan_output_axes=[1]),  # H (B, T, d): states after each token
        helper.make_node("Transpose", ["W_ro"], ["W_ro_T"], perm=[1, 0]),
        helper.make_node("MatMul", ["H", "W_ro_T"], ["HW"]),
        helper.make_node("Add", ["HW", "b_ro"], ["logits"]),
    ]
    seq = helper.make_graph(seq_nodes, "isan_sequence", [_value_info(s) for s in io["sequence"]["inputs"]],
                            [_value_info(s) for s in io["sequence"]["outputs"]], initializer=weights + axes,
                            doc_string="Scan of h_t = W[x_t] @ h_{t-1} + b[x_t]; logits[:, t] = W_ro @ h_t + b_ro")
    models = {STEP_FILE: _make_model(step, "isan", "step", io, sha, opset),
              SEQUENCE_FILE: _make_model(seq, "isan", "sequence", io, sha, opset)}
    return models, _info("isan", io, sha, opset)


def export_isan_onnx(params: ISANParams, out_dir: str | Path, opset: int = DEFAULT_OPSET, sha: str | None = None) -> dict:
    """Write ``model.onnx`` and ``sequence.onnx`` of an ISAN into ``out_dir`` (each file atomically).

    Args:
        params: the ISAN (numpy; float64 is cast to float32, the bundle dtype).
        out_dir: directory (created if needed); existing files of the same names are replaced.
        opset: ONNX opset of the default domain (>= 14).
    Returns:
        the manifest's ``"onnx"`` section: format, opset, kind, params_sha256, state names,
        logits convention, and for ``step``/``sequence`` the file, its ``sha256`` and ``bytes``,
        inputs and outputs (``[{"name", "dtype", "shape"}]``, symbolic dims "B" and "T").
    Raises:
        onnx.checker.ValidationError: the graph fails ``check_model(full_check=True)`` (a bug).

    Example:
        >>> info = export_isan_onnx(params, "bundle/")
        >>> info["sequence"]["inputs"][0]
        {'name': 'tokens', 'dtype': 'int64', 'shape': ['B', 'T']}
    """
    _check_opset(opset)
    models, info = isan_onnx_models(params, opset, sha)
    _write(models, Path(out_dir), info)
    log.info("wrote ISAN ONNX graphs (d=%d, opset %d) into %s", params.d, opset, out_dir)
    return info


# ---- baselines -----------------------------------------------------------------------------
def _reorder_rows(a: np.ndarray, kind: str, d: int) -> np.ndarray:
    """Rows (or entries) in G blocks of d, from torch's gate order to ONNX's."""
    blocks = [a[g * d:(g + 1) * d] for g in range(len(ONNX_GATE_ORDER[kind]))]
    return np.concatenate([blocks[g] for g in ONNX_GATE_ORDER[kind]], axis=0)


def _baseline_op_weights(config: dict, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Initializers of the ONNX RNN/GRU/LSTM operator: X_table (K, in), W (1, G d, in),
    R (1, G d, d), B (1, 2 G d), plus W_ro, b_ro."""
    kind, K, d = config["kind"], int(config["K"]), int(config["d"])
    G = len(ONNX_GATE_ORDER[kind])
    t = {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}
    if config.get("input", "onehot") == "onehot":
        X_table = np.eye(K, dtype=np.float32)   # one-hot rows: W = E^T gives a = E[x]
        W_in, b_in = t["E"].T, np.zeros(G * d, np.float32)
    else:
        X_table = t["emb"]
        W_in, b_in = t["W_ih"], t["b_ih"]
    b_rec = np.zeros(G * d, np.float32)
    if kind == "gru":
        b_rec[2 * d:] = t["b_hn"]  # Rbh, inside the reset gate (linear_before_reset=1)
    return {
        "X_table": X_table,
        "W": _reorder_rows(W_in, kind, d)[None],
        "R": _reorder_rows(t["W_hh"], kind, d)[None],
        "B": np.concatenate([_reorder_rows(b_in, kind, d), _reorder_rows(b_rec, kind, d)])[None],
        "W_ro": t["W_ro"], "b_ro": t["b_ro"],
    }


def _baseline_op_node(kind: str, d: int, inputs: list[str], outputs: list[str]):
    from onnx import helper

    if kind in ("rnn", "irnn"):
        return helper.make_node("RNN", inputs, outputs, hidden_size=d,
                                activations=["Tanh" if kind == "rnn" else "Relu"])
    if kind == "gru":
        return helper.make_node("GRU", inputs, outputs, hidden_size=d, linear_before_reset=1)
    return helper.make_node("LSTM", inputs, outputs, hidden_size=d)


def baseline_onnx_models(config: dict, tensors: dict[str, np.ndarray], opset: int = DEFAULT_OPSET,
                         params_sha256: str | None = None) -> tuple[dict, dict]:
    """The step and sequence ModelProtos (checked) of a baseline and the manifest ``"onnx"`` section.

    Args:
        config: the architecture, as :meth:`isan.train.baselines.RecurrentBaseline.config`
            (the bundle manifest's ``"model"``).
        tensors: the state dict as numpy arrays (the bundle's ``weights.safetensors``).
        params_sha256: defaults to the bundle hash of ``tensors`` (sorted names, float32).
    Raises:
        BundleFormatError: tensors that do not fit the config.
    """
    from onnx import helper

    from isan.engine.baselines.recurrent import BaselineParams, baseline_sha256

    BaselineParams.from_tensors(config, tensors, dtype=np.float32)  # validates names and shapes
    kind, d, V = config["kind"], int(config["d"]), int(config["V"])
    sha = params_sha256 or baseline_sha256(tensors)
    io = graph_io(kind, d, V)
    w = _baseline_op_weights(config, tensors)
    inits = [_init(k, v) for k, v in w.items()] + [
        _init("axis0", np.array([0], np.int64)), _init("axis1", np.array([1], np.int64))]
    st = state_names(kind)
    lstm = kind == "lstm"

    def op_inputs(X):  # X, W, R, B, sequence_lens, initial_h[, initial_c]
        return [X, "W", "R", "B", ""] + [f"{s}_init" for s in st]

    init_nodes = [helper.make_node("Unsqueeze", [s, "axis0"], [f"{s}_init"]) for s in st]  # (1, B, d)

    # one step: token (B,) -> X (1, B, in)
    step_nodes = [helper.make_node("Unsqueeze", ["token", "axis0"], ["token_1B"]),
                  helper.make_node("Gather", ["X_table", "token_1B"], ["X"], axis=0)] + init_nodes + [
        _baseline_op_node(kind, d, op_inputs("X"), ["", "Y_h"] + (["Y_c"] if lstm else [])),
        helper.make_node("Squeeze", ["Y_h", "axis0"], ["h_next"]),
    ] + ([helper.make_node("Squeeze", ["Y_c", "axis0"], ["c_next"])] if lstm else []) + [
        helper.make_node("Gemm", ["h_next", "W_ro", "b_ro"], ["logits"], transB=1)]
    step = helper.make_graph(step_nodes, f"{kind}_step", [_value_info(s) for s in io["step"]["inputs"]],
                             [_value_info(s) for s in io["step"]["outputs"]], initializer=inits,
                             doc_string=f"one {kind} step; logits = W_ro @ h_next + b_ro")

    # a chunk: tokens (B, T) -> X (T, B, in); Y (T, 1, B, d) -> H (B, T, d)
    seq_nodes = [helper.make_node("Transpose", ["tokens"], ["tokens_TB"], perm=[1, 0]),
                 helper.make_node("Gather", ["X_table", "tokens_TB"], ["X"], axis=0)] + init_nodes + [
        _baseline_op_node(kind, d, op_inputs("X"), ["Y", "Y_h"] + (["Y_c"] if lstm else [])),
        helper.make_node("Squeeze", ["Y_h", "axis0"], ["h_last"]),
    ] + ([helper.make_node("Squeeze", ["Y_c", "axis0"], ["c_last"])] if lstm else []) + [
        helper.make_node("Squeeze", ["Y", "axis1"], ["Y_TBd"]),
        helper.make_node("Transpose", ["Y_TBd"], ["H"], perm=[1, 0, 2]),
        helper.make_node("Transpose", ["W_ro"], ["W_ro_T"], perm=[1, 0]),
        helper.make_node("MatMul", ["H", "W_ro_T"], ["HW"]),
        helper.make_node("Add", ["HW", "b_ro"], ["logits"]),
    ]
    seq = helper.make_graph(seq_nodes, f"{kind}_sequence", [_value_info(s) for s in io["sequence"]["inputs"]],
                            [_value_info(s) for s in io["sequence"]["outputs"]], initializer=inits,
                            doc_string=f"{kind} over a chunk; logits[:, t] = W_ro @ h_t + b_ro after tokens[:, t]")
    models = {STEP_FILE: _make_model(step, kind, "step", io, sha, opset),
              SEQUENCE_FILE: _make_model(seq, kind, "sequence", io, sha, opset)}
    info = _info(kind, io, sha, opset)
    info["model"] = dict(config)
    return models, info


def export_baseline_onnx_tensors(config: dict, tensors: dict[str, np.ndarray], out_dir: str | Path,
                                 opset: int = DEFAULT_OPSET, params_sha256: str | None = None) -> dict:
    """As :func:`isan.export.onnx_export.export_baseline_onnx`, from the architecture config and numpy
    weights (no torch)."""
    _check_opset(opset)
    models, info = baseline_onnx_models(config, tensors, opset, params_sha256)
    _write(models, Path(out_dir), info)
    log.info("wrote %s ONNX graphs (d=%s, opset %d) into %s", config["kind"], config["d"], opset, out_dir)
    return info


def _check_opset(opset: int) -> None:
    if not isinstance(opset, int) or opset < 14:
        raise ValueError(f"opset must be an integer >= 14 (RNN/GRU/LSTM-14, Squeeze-13); got {opset!r}")


# ---- a bundle's graphs, and the cache of them ----------------------------------------------
def export_for_manifest(directory: Path, manifest: dict, opset: int, out_dir: Path | None = None) -> dict:
    """Export the graphs of the weights in ``directory`` (kind and config from ``manifest``) into
    ``out_dir`` (default ``directory``). Returns the manifest's ``"onnx"`` section.

    Raises:
        BundleFormatError: unknown kind, missing tensors or config, weights that do not match
            the manifest's ``params_sha256``.
    """
    from isan.engine.baselines.recurrent import baseline_sha256

    kind = manifest["kind"]
    tensors = load_tensors(directory / "weights.safetensors")
    if kind == "isan":
        missing = [n for n in ISAN_TENSORS if n not in tensors]
        if missing:
            raise BundleFormatError(f"{directory}/weights.safetensors lacks ISAN tensors {missing}; re-run `isan export`")
        params = ISANParams(**{n: tensors[n] for n in ISAN_TENSORS})
        sha = params.sha256()
    elif kind in BASELINE_KINDS:
        if not isinstance(manifest.get("model"), dict):
            raise BundleFormatError(f"the {kind} bundle's manifest lacks its 'model' config; re-run `isan export`")
        sha = baseline_sha256(tensors)
    else:
        raise BundleFormatError(f"no ONNX export for model kind {kind!r}")
    if manifest.get("params_sha256") not in (None, sha):
        raise BundleFormatError(f"{directory}: weights do not match the manifest's params_sha256; re-run `isan export`")
    out_dir = directory if out_dir is None else out_dir
    from isan.engine.bundle import manifest_alphabet

    alphabet = manifest_alphabet(manifest)
    config = manifest.get("model")
    if alphabet.input_map is not None:
        # a token alphabet with fewer inputs than outputs (bytes): the graphs read output ids, each
        # gathering its input's weights (the same expansion as the numpy engine's)
        m = np.asarray(alphabet.input_map, dtype=np.int64)
        if kind == "isan":
            from isan.params import expand_inputs

            params = expand_inputs(params, m)
        else:
            key = "E" if "E" in tensors else "emb"
            tensors = {**tensors, key: np.ascontiguousarray(np.asarray(tensors[key])[m])}
            config = {**config, "K": len(m)}
    if kind == "isan":
        return export_isan_onnx(params, out_dir, opset, sha)
    return export_baseline_onnx_tensors(config, tensors, out_dir, opset, sha)


def onnx_cache_path(manifest: dict, opset: int = DEFAULT_OPSET) -> Path:
    """Where :func:`cached_graphs` keeps the graphs of a bundle: ``<cache>/onnx/<key>``."""
    import hashlib

    from isan.trie_tables.build import cache_dir

    key = f"{manifest['params_sha256']}:{manifest['kind']}:{opset}:{ONNX_FORMAT_VERSION}"
    return cache_dir() / "onnx" / hashlib.sha256(key.encode()).hexdigest()[:20]


def check_cached_graphs(path: Path, params_sha256: str) -> str | None:
    """None if the cached graphs in ``path`` match their record (``graphs.json``), else the problem."""
    from isan.jsonfile import file_sha256, read_json

    try:
        rec = read_json(path / "graphs.json", BundleFormatError, "it is rebuilt on the next use",
                        what="ONNX cache record")
    except BundleFormatError as e:
        return str(e)
    if not isinstance(rec, dict) or rec.get("params_sha256") != params_sha256 or not isinstance(rec.get("files"), dict):
        return f"{path / 'graphs.json'} does not describe these weights"
    for n in (STEP_FILE, SEQUENCE_FILE):
        want = rec["files"].get(n)
        if not isinstance(want, str) or not (path / n).is_file() or file_sha256(path / n) != want:
            return f"{path / n} is missing or does not match its sha256 in graphs.json"
    return None


def cached_graphs(bundle_dir: str | Path, manifest: dict, opset: int = DEFAULT_OPSET) -> Path:
    """The ONNX graphs of a bundle that ships none (the default model), built on first use into
    the user cache (``$ISAN_CACHE_DIR`` or ``~/.cache/isan``, ``onnx/<key>/``) and verified by
    sha256 on every later use; a damaged cache is rebuilt. Returns the directory of the graphs.

    Raises:
        BundleFormatError: the bundle's weights do not match its manifest.
        ModuleNotFoundError: the ``onnx`` package is missing (the ``onnx`` extra, which
            ``isan.errors.install_hint("onnx")`` says how to install).
    """
    from isan.atomic import atomic_directory
    from isan.jsonfile import file_sha256

    sha = manifest["params_sha256"]
    path = onnx_cache_path(manifest, opset)
    if (path / "graphs.json").is_file():
        problem = check_cached_graphs(path, sha)
        if problem is None:
            return path
        log.warning("cached ONNX graphs are unusable (%s); rebuilding them", problem)
    import onnx  # noqa: F401  (a clear ModuleNotFoundError before any work)

    log.info("building the ONNX graphs of %s into %s", bundle_dir, path)
    with atomic_directory(path, overwrite=True) as tmp:
        info = export_for_manifest(Path(bundle_dir), manifest, opset, out_dir=tmp)
        write_json_atomic(tmp / "graphs.json", {
            "format": "isan-onnx-cache", "params_sha256": sha, "kind": manifest["kind"], "opset": opset,
            "bundle": str(bundle_dir), "files": {n: file_sha256(tmp / n) for n in (STEP_FILE, SEQUENCE_FILE)},
            "onnx": info})
    return path
