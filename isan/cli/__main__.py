"""``python -m isan.cli``: the same as the ``isan`` command."""

from isan.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
