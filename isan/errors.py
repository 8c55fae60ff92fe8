"""Typed errors. Every message says what to do about the problem."""


class IsanError(Exception):
    """Base class of every error isan raises on bad input or bad files."""


class AlphabetError(IsanError, ValueError):
    """A character is not in the model's alphabet (or an alphabet is malformed)."""

    def __init__(self, message: str, char: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.char = char
        self.offset = offset


class EmptyTextError(IsanError, ValueError):
    """The text to score, attribute or sample from is empty."""


class TextTooLongError(IsanError, ValueError):
    """The text exceeds a stated limit (server payloads, attribution)."""


class BundleFormatError(IsanError, ValueError):
    """A bundle directory is missing, incomplete, corrupt or of another version."""


class TableFormatError(IsanError, ValueError):
    """A trie table is missing, truncated, corrupt, of another version or another model."""


class CheckpointError(IsanError, ValueError):
    """A training checkpoint directory is missing, incomplete or inconsistent."""


class BudgetError(IsanError, ValueError):
    """A size budget (a model's parameters, a table's bytes) cannot hold what it must."""


class AttributionCheckError(IsanError, ArithmeticError):
    """``b_ro + sum_s kappa[t, s]`` did not reproduce the logits within tolerance."""


class BackendUnavailableError(IsanError, RuntimeError):
    """The requested backend or device cannot run here (onnxruntime or torch missing, no CUDA
    provider or GPU). The message says what to install or which device to use instead."""


class StateDivergedError(IsanError, ArithmeticError):
    """The recurrent state left the range where scoring means anything (it overflows, or the bits
    are not finite). Some letters' matrices have spectral radius above 1 (text8 model: 'z' 2.17),
    so long repeats of them make the state grow without bound.

    Attributes:
        offset: index (in the scored text, after normalisation) of the first character whose
            state is out of range, or None when it could not be located.
        cause: a short phrase, e.g. ``"state overflow (|h| > 1e+04)"`` or ``"non-finite bits"``.
    """

    def __init__(self, message: str, offset: int | None = None, cause: str | None = None):
        super().__init__(message)
        self.offset = offset
        self.cause = cause


def install_hint(extra: str) -> str:
    """The command that installs one of isan's optional extras, in the form that works.

    isan is installed from its repository (it is not on a package index), so ``pip install
    'isan[plot]'`` finds nothing. From the repository folder the working form is ``pip install -c
    requirements/ci.txt '.[plot]'`` (the lock file pins the versions the tests ran with). Where the
    package was installed editable, the repository folder is known and is named in full.

    Args:
        extra: the extra's name in pyproject.toml (``"plot"``, ``"corpus"``, ``"serve"``, ...).

    Returns:
        A command line, e.g. ``pip install -c requirements/ci.txt '.[plot]' (in the isan repository folder)``.
        The paths of an editable install are quoted for a POSIX shell, so a folder named ``isan`` or one
        with a space in its path gives a command that runs as printed.
    """
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if (root / "requirements" / "ci.txt").is_file() and (root / "pyproject.toml").is_file():
        return f"pip install -c {shlex.quote(str(root / 'requirements' / 'ci.txt'))} {shlex.quote(f'{root}[{extra}]')}"
    return f"pip install -c requirements/ci.txt '.[{extra}]' (in the isan repository folder)"
