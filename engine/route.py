"""How a text or a batch is scored, chosen once: an Engine resolves its computation path into
:class:`Routes` when it is made, and every call (``score``, ``advance``, ``score_batch``, the
server's rounds, a corpus job) asks it for the :class:`Route` of its text or batch instead of
translating path, group and kernel names again.

A route is one of four ways (:class:`Way`) and, for the chunk-parallel way, a kernel
(:class:`~isan.engine.kernels.plan.Kernel`) and whether long texts are cut into chunks:

==================  ===========================================================================
way                 what runs
==================  ===========================================================================
``COMPOSED``        one stream through the trie table's composed (W, b) (:mod:`isan.engine.composed`)
``CHUNK_PARALLEL``  rows of a batched kernel, by the backend's :class:`~isan.engine.kernels.plan.Plan`
                    (:mod:`isan.engine.kernels.chunked`)
``ENTRY``           numpy: a batch's streams grouped by the table entry each needs next
``REFERENCE``       float64 numpy, one character at a time (:class:`~isan.engine.exact.ReferencePath`)
==================  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from isan.engine.kernels.plan import Kernel
from isan.errors import IsanError, TableFormatError

#: Computation paths a user names: ``composed`` (trie-table jumps, sequential; long texts
#: chunk-parallel by the kernel the plan chooses), ``chunked`` (chunk-parallel through the compiled
#: kernels, one character a step), ``jumps`` (the same, rows advanced by composed jumps of the trie
#: table's keys) and ``reference`` (float64 numpy, one character at a time).
PATHS = ("composed", "chunked", "jumps", "reference")
#: How :meth:`Engine.score_batch` may group a batch (its ``group`` argument).
GROUPS = ("auto", "chunked", "symbol", "jumps", "entry")
#: On the composed path, texts of at least this many characters are scored chunk-parallel
#: (measured: chunk-parallel overtakes one stream through the table between 5,000 and 10,000).
CHUNKED_MIN_CHARS = 10_000


class Way(str, Enum):
    """The four ways a text is scored (the module's table)."""

    COMPOSED = "composed"
    CHUNK_PARALLEL = "chunk-parallel"
    ENTRY = "entry"
    REFERENCE = "reference"


@dataclass(frozen=True)
class Route:
    """One way to score, with the chunk-parallel way's kernel and whether it cuts long texts."""

    way: Way
    kernel: Kernel = Kernel.AUTO
    cut: bool = True

    @property
    def needs_table(self) -> bool:
        """Whether it runs on the trie table (the composed and entry ways, the jumps kernels)."""
        return self.way in (Way.COMPOSED, Way.ENTRY) or self.kernel.uses_table

    @property
    def chunks(self) -> str:
        """The chunk rule of :meth:`Engine.score_ids`: ``"auto"`` (cut by the plan) or ``"none"``."""
        return "auto" if self.cut else "none"


#: The route of a text on each path, and of a batch for each group.
PATH_ROUTES = {"composed": Route(Way.COMPOSED), "chunked": Route(Way.CHUNK_PARALLEL, Kernel.CHUNKED),
               "jumps": Route(Way.CHUNK_PARALLEL, Kernel.JUMPS), "reference": Route(Way.REFERENCE)}
GROUP_ROUTES = {"auto": Route(Way.CHUNK_PARALLEL), "chunked": Route(Way.CHUNK_PARALLEL, Kernel.CHUNKED),
                "symbol": Route(Way.CHUNK_PARALLEL, Kernel.CHUNKED, cut=False),
                "jumps": Route(Way.CHUNK_PARALLEL, Kernel.JUMPS), "entry": Route(Way.ENTRY)}
#: The group a batch takes by default on each path (score_batch, the server's rounds).
PATH_GROUPS = {"composed": "auto", "jumps": "jumps", "chunked": "chunked", "reference": "chunked"}


def check_path(path: str, auto: bool = False) -> str:
    """``path`` if it names a path (or ``"auto"`` where ``auto``), else IsanError naming the choices."""
    if path not in PATHS and not (auto and path == "auto"):
        raise IsanError(f"path must be {'auto or ' if auto else ''}one of {', '.join(PATHS)}; got {path!r}")
    return path


@dataclass(frozen=True)
class Routes:
    """One engine's routes, resolved once from its path, its table and its backend (:meth:`resolve`).

    Attributes:
        path: the engine's path (one of :data:`PATHS`), as resolved.
        text: the route of a text.
        long_text: the route of a text of at least ``long_after`` characters.
        long_after: characters from which a text takes ``long_text`` (None: never).
        batch: the route of a batch (``score_batch``'s default group, the server's rounds).
        has_table: whether the engine has a trie table.
    """

    path: str
    text: Route
    long_text: Route
    long_after: int | None
    batch: Route
    has_table: bool

    @classmethod
    def resolve(cls, path: str | None, has_table: bool, runs_tables: bool, where: str = "this model",
                device: str = "cpu", dtype: str = "float32") -> "Routes":
        """The routes of an engine on ``path`` (None: composed with a table, else chunked).

        Args:
            runs_tables: whether the backend runs the table's paths and the float64 reference beside
                it (the CPU's kernels, :attr:`Backend.runs_tables`); elsewhere every text goes
                chunk-parallel through the backend's runner.
            where: the model, as errors name it; device, dtype: the backend's, as errors name them.
        Raises:
            IsanError: an unknown path, or the reference path on a device.
            TableFormatError: the composed or jumps path without a table.
        """
        asked = path
        path = check_path(path or ("composed" if has_table else "chunked"))
        if not runs_tables:  # every text and batch goes chunk-parallel through the backend's runner
            if asked == "reference":
                raise IsanError(f"the reference path is numpy's float64 on the CPU, not device {device!r} ({dtype}): "
                                "use path auto or chunked there (dtype float64 is the float64 reference on the "
                                "device), or device cpu for the reference path")
            if asked in ("composed", "jumps"):
                raise IsanError(f"the {asked} path runs on the CPU's kernels; on the torch backend (device {device}, "
                                f"{dtype}) texts go chunk-parallel by its runner: use path auto or chunked")
            path = "chunked"
        elif PATH_ROUTES[path].needs_table and not has_table:
            raise TableFormatError(f"{where} has no trie table for the {path} path; build one with "
                                   "`isan export CHECKPOINT_DIR BUNDLE` (tables are on by default)")
        text = PATH_ROUTES[path]
        long_after = CHUNKED_MIN_CHARS if path == "composed" else None
        long_text = GROUP_ROUTES["auto"] if long_after is not None else text
        return cls(path, text, long_text, long_after, GROUP_ROUTES[PATH_GROUPS[path]], has_table)

    def for_text(self, n: int, path: str | None = None) -> Route:
        """The route of a text of ``n`` characters: a call's ``path`` as asked (no switch for long
        texts), else the engine's. Raises IsanError (unknown path) or TableFormatError (no table)."""
        if path is None:
            return self.long_text if self.long_after is not None and n >= self.long_after else self.text
        return self.checked(PATH_ROUTES[check_path(path)], f"this engine has no trie table for the {path} path; "
                                                           "use path='chunked'")

    def for_batch(self, group: str | None = None) -> Route:
        """The route of a batch grouped as ``group`` (:data:`GROUPS`; None: the engine's default).
        Raises IsanError (unknown group) or TableFormatError (no table)."""
        if group is None:
            return self.batch
        if group not in GROUP_ROUTES:
            raise IsanError(f"group must be one of {', '.join(GROUPS)}; got {group!r}")
        return self.checked(GROUP_ROUTES[group], f"group='{group}' needs a trie table; use group='chunked'")

    def checked(self, route: Route, error: str) -> Route:
        """``route``, if the engine can run it (else TableFormatError saying ``error``: it needs a
        table the engine lacks)."""
        if route.needs_table and not self.has_table:
            raise TableFormatError(error)
        return route
