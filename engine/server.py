"""``isan-serve`` (kept for the entry point ``isan.engine.server:main`` and ``python -m isan.engine.server``).

The server lives in :mod:`isan.engine.serve` (request models, the batching scheduler, the app).
"""

from isan.engine.serve import DEFAULT_MAX_CHARS, ServeConfig, create_app  # noqa: F401
from isan.engine.serve.cli import main  # noqa: F401

if __name__ == "__main__":  # pragma: no cover
    main()
