"""What every command shares: the ``isan`` group, errors (one ``Error:`` line, exit status 2, no
traceback), JSON output (never NaN or inf), the options of many commands, engine loading and input.

Every command takes ``--help``. Errors in the input (unknown characters, missing or corrupt files,
empty text, a diverging model state) print one ``Error:`` line and exit with status 2.
"""

from __future__ import annotations

import functools
import json
import logging
import shlex
import sys
from pathlib import Path

import click

from isan.click_types import FiniteFloat, WholeNumber
from isan.engine.loading import RUNTIMES
from isan.errors import IsanError, StateDivergedError, install_hint

DEFAULT_TEXT8 = "../shared/data/text8_head/text8_head.txt"


class UserError(click.ClickException):
    exit_code = 2


class ByteSize(click.ParamType):
    """A size in bytes above 0: ``16MB``, ``512KB``, ``1.5GB`` (binary units), or a whole number of bytes.
    NaN, infinities, 0, negative sizes and words are usage errors (exit 2); the value is passed on as given."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        from isan.trie_tables.mining import parse_bytes

        try:
            size = parse_bytes(value)
        except (ValueError, OverflowError):
            self.fail(f"{value!r} is not a size (e.g. 16MB, 512KB, 1GB, or a number of bytes).", param, ctx)
        if size < 1:
            self.fail(f"{value!r} is not a size above 0 bytes.", param, ctx)
        return value


class CommaList(click.ParamType):
    """Comma-separated values (``1,2,4``, ``8MB,16MB``), each converted by ``item`` (a click type): a tuple.
    An empty list, or an item that ``item`` refuses, is a usage error (exit 2)."""

    name = "A,B,..."

    def __init__(self, item: click.ParamType):
        self.item = item

    def convert(self, value, param, ctx):
        if isinstance(value, (tuple, list)):
            return tuple(value)
        items = [w.strip() for w in str(value).split(",") if w.strip()]
        if not items:
            self.fail("give at least one value.", param, ctx)
        return tuple(self.item.convert(w, param, ctx) for w in items)


class IntList(CommaList):
    """Comma-separated whole numbers (``1,2,4``), each at least ``min``: a tuple of ints."""

    name = "N,N,..."

    def __init__(self, min: int = 1):
        super().__init__(click.IntRange(min=min))
        self.min = min


#: whole numbers from 1 (counts, sizes, repeats, threads)
POSITIVE_INT = click.IntRange(min=1)
#: whole numbers from 0
NON_NEGATIVE_INT = click.IntRange(min=0)
#: a random seed: 0 to 2**53 - 1 (exact in every JSON reader, as the seeds isan draws itself)
SEED = click.IntRange(0, 2**53 - 1)
#: finite numbers above 0
POSITIVE_FLOAT = FiniteFloat(min=0, min_open=True)
#: finite numbers from 0
NON_NEGATIVE_FLOAT = FiniteFloat(min=0)


def with_model_option(message: str, model: str | None) -> str:
    """``message`` with the `isan model check` it suggests given ``--model MODEL`` (quoted for a shell)
    when the command was run on a bundle other than the default; else ``message`` unchanged."""
    from isan.engine.guard import MODEL_CHECK

    if not model:
        return message
    return message.replace(f"`{MODEL_CHECK}`", f"`{MODEL_CHECK} --model {shlex.quote(str(model))}`")


def friendly(fn):
    """Turn library errors into one-line CLI errors (exit 2) instead of tracebacks. A diverging state's
    message names the ``--model`` the command was given (``model``) in the check it suggests."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except StateDivergedError as e:
            raise UserError(with_model_option(str(e), kwargs.get("model"))) from None
        except (IsanError, FileExistsError, FileNotFoundError) as e:
            raise UserError(str(e)) from None
        except PermissionError as e:
            raise UserError(f"permission denied: {e.filename or e}") from None
        except ModuleNotFoundError as e:
            extra = {"torch": "train", "onnx": "onnx", "onnxruntime": "onnx", "fastapi": "serve",
                     "uvicorn": "serve", "matplotlib": "plot"}.get((e.name or "").split(".")[0])
            if extra:
                raise UserError(f"this command needs {e.name}: {install_hint(extra)}") from None
            raise

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log progress messages to stderr.")
@click.version_option(package_name="isan")
def main(verbose: bool) -> None:
    """isan: score, sample, attribute, export and train Input Switched Affine Networks."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def model_options(fn):
    fn = click.option("--model", "model", default=None, help="Bundle directory (default: the shipped text8 model).")(fn)
    fn = click.option("--path", "path_mode", type=click.Choice(["auto", "composed", "chunked", "jumps", "reference"]),
                      default="auto", show_default=True,
                      help="composed: trie-table jumps (texts of 10,000+ characters go chunk-parallel, by "
                           "composed jumps where they make 512 chunks a thread, else one character a step); "
                           "chunked: chunk-parallel in the compiled kernel, one character a step; jumps: always "
                           "by the table's composed jumps (exact; slower on short texts and small batches: see "
                           "the speed guide); reference: per-character float64 numpy.")(fn)
    fn = click.option("--threads", type=POSITIVE_INT, default=None,
                      help="Threads for the compiled kernels (default: the CPUs this process may use; ISAN_NUM_THREADS).")(fn)
    fn = click.option("--runtime", type=click.Choice(RUNTIMES), default="numpy", show_default=True,
                      help="What scores: numpy, isan's engine and its compiled kernels; onnx, onnxruntime over the "
                           "bundle's ONNX graphs (isan export --onnx).")(fn)
    fn = deprecated_option("--backend", "--runtime", "runtime", type=click.Choice(RUNTIMES))(fn)
    fn = click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True,
                      help="cuda: the numpy runtime scores ISAN models on the GPU with the torch kernel backend (the "
                           "gpu extra), the onnx runtime uses onnxruntime's CUDA provider; auto: CUDA when present. "
                           "What ran is in the JSON's scoring field.")(fn)
    fn = click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True,
                      help="float64: the exact float64 reference on the torch kernel backend (any device; slower).")(fn)
    return fn


def deprecated_option(old: str, new: str, new_param: str, **option):
    """A decorator for a command: ``old``, a hidden option kept for a release as the deprecated
    spelling of the option ``new`` (whose parameter is ``new_param``), with click's ``option``
    keywords (its type). Given, ``old`` prints one line on stderr that names ``new`` and its value
    becomes ``new_param``'s, so the command sees only ``new_param``. Both given: a usage error
    (exit status 2)."""
    from click.core import ParameterSource

    old_param = "deprecated_" + old.lstrip("-").replace("-", "_")

    def decorate(fn):
        @functools.wraps(fn)
        def command(*args, **kwargs):
            value = kwargs.pop(old_param, None)
            if value is not None:
                source = click.get_current_context().get_parameter_source(new_param)
                if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
                    raise click.UsageError(f"give {new} or {old} (its deprecated spelling), not both")
                click.echo(f"warning: {old} is deprecated: use {new} {value}", err=True)
                kwargs[new_param] = value
            return fn(*args, **kwargs)

        return click.option(old, old_param, hidden=True, default=None, **option)(command)

    return decorate


def emit_json(obj) -> None:
    """Print one JSON document; NaN or inf would be a bug, so it raises instead of printing them."""
    click.echo(json.dumps(obj, allow_nan=False))


#: ``isan score`` warns on stderr when the normaliser dropped more than this share of the characters read
MOSTLY_DROPPED = 0.5


def warn_if_mostly_dropped(report: dict | None, what: str = "text", done: str = "scored") -> None:
    """One warning line on stderr when the normaliser dropped more than half (:data:`MOSTLY_DROPPED`)
    of the characters read: a text the model cannot read (another script, say) would otherwise be
    scored as the few spaces left of it without a word. Stdout and the exit status are unchanged.
    ``what`` names the text (``isan sample``: "prompt") and ``done`` what the model did with what is left."""
    read, dropped = (report or {}).get("chars_read", 0), (report or {}).get("dropped", 0)
    if not read or dropped <= MOSTLY_DROPPED * read:
        return
    most = ", ".join(f"{m['char']!r} {m['count']:,}" for m in report.get("most_dropped", []))
    scored = report.get("chars_scored", 0)
    click.echo(f"warning: the {report['normalizer']} normaliser dropped {dropped:,} of the {read:,} characters read "
               f"(most dropped: {most}; {report.get('changed', 0):,} more changed), so the model {done} "
               f"{scored:,} character{'s' if scored != 1 else ''}: is the {what} in an alphabet the model reads?",
               err=True)


def normalize_option(fn):
    from isan.engine.normalize import choices

    return click.option("--normalize", "normalize", type=click.Choice(choices()), default="auto", show_default=True,
                        help="Text normalisation: auto (the model's declared normaliser; text8 models: "
                             "lower-case, digits spelled out, other characters to spaces), none (raw text), "
                             "or a named normaliser.")(fn)


def unknown_options(fn):
    fn = click.option("--unknown", type=click.Choice(["error", "skip", "replace"]), default="error", show_default=True,
                      help="What to do with characters outside the model's alphabet.")(fn)
    fn = click.option("--replacement", default=None, help="Symbol used with --unknown replace.")(fn)
    return fn


def load_engine(model, path_mode="auto", runtime="numpy", device="cpu", threads=None, dtype="float32"):
    """The engine of a command (:func:`isan.engine.load_engine`), ``threads`` kernel threads where it has
    them; what was loaded is logged (``isan -v``)."""
    from isan.engine import load_engine as _load

    if threads is not None and threads < 1:
        raise UserError(f"--threads must be at least 1; got {threads}")
    engine = _load(model, path=path_mode, runtime=runtime, device=device, dtype=dtype)
    if threads is not None and hasattr(engine, "threads"):
        engine.threads = threads
    logging.getLogger("isan").info("engine: %s", engine.describe())
    return engine


def input_file(file) -> Path:
    """The path of an input file, or a UserError that says what is wrong with it."""
    p = Path(file)
    if p.is_dir():
        raise UserError(f"{file} is a directory; give a text file (or '-' for standard input)")
    if not p.exists():
        raise UserError(f"{file} does not exist")
    if not p.is_file():
        raise UserError(f"{file} is not a regular file")
    return p


def read_input(file, text8_split):
    if text8_split:
        from isan.data import read_text8_split

        if file in (None, "-"):
            raise UserError("--text8-split needs the path of text8, text8.zip or text8_head.txt")
        return read_text8_split(file, text8_split)
    if file in (None, "-"):
        return sys.stdin.read()
    p = input_file(file)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{file} is not UTF-8 text ({e})") from None


def table_options(fn):
    fn = click.option("--table-budget", type=ByteSize(), default="16MB", show_default=True, help="Memory budget of the trie table (e.g. 8MB, 128MB); see `isan bench budgets`.")(fn)
    fn = click.option("--table-max-len", type=click.IntRange(1, 63), default=12, show_default=True, help="Longest substring in the table.")(fn)
    fn = click.option("--table-dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True)(fn)
    fn = click.option("--table-corpus", default=None, help="Text to mine (default: the model's training data, train split).")(fn)
    fn = click.option("--table-dataset", type=click.Choice(["text8", "text"]), default=None, help="How to split --table-corpus.")(fn)
    return fn
