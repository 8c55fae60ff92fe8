"""The ``isan`` command line (click): one module per command group, and :mod:`isan.cli.helpers`
for what they share. No command module imports another; this package imports them all so that
each registers its commands on :data:`main` (the ``isan`` entry point)."""

from isan.cli import analyze, bench, corpus, export, model, score, studies, train  # noqa: F401  (they register)
from isan.cli.helpers import main

main.add_command(analyze.analyze)
main.add_command(studies.study)

__all__ = ["main"]
