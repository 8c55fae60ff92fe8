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


class AttributionCheckError(IsanError, ArithmeticError):
    """``b_ro + sum_s kappa[t, s]`` did not reproduce the logits within tolerance."""
