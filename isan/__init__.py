"""isan: inference engine and export tool for Input Switched Affine Networks.

An ISAN (Foerster et al., ICML 2017, arXiv:1611.09434) is a character-level RNN
without nonlinearity: ``h_t = W[x_t] h_{t-1} + b[x_t]``, ``logits_t = W_ro h_t + b_ro``.

Subpackages: :mod:`isan.engine` (numpy inference), :mod:`isan.trie_tables`
(composed substring tables), :mod:`isan.export` (checkpoint to bundle, ONNX),
:mod:`isan.train` (PyTorch training; needs the ``train`` extra).
"""

__version__ = "0.1.0"

from pathlib import Path as _Path

# Run from a source checkout without the editable install (say from the repository's root after
# `pip install .`), this folder shadows the installed package; the subpackages live beside it
# (engine/, export/, train/, trie_tables/), so look for them there too. An installed copy has no
# such siblings and is unchanged.
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "engine" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # noqa: F821 (a package's __path__)

from isan.errors import (  # noqa: F401
    AlphabetError,
    BundleFormatError,
    EmptyTextError,
    IsanError,
    TableFormatError,
)

__all__ = ["AlphabetError", "BundleFormatError", "EmptyTextError", "IsanError", "TableFormatError", "__version__"]
