"""Deprecated: moved to :mod:`isan.engine.baselines.ngram` (issue #46); this alias goes after one release."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("isan.engine.baselines.ngram")
