"""``python -m isan.engine.serve``: the same as the ``isan-serve`` command."""

from isan.engine.serve.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
