"""The certificate's promise to chunk-parallel scoring: a certified model forgets any start-state
error within a proven number of characters (:meth:`isan.engine.core.Engine.forget_bound_chars`), so
a chunk at least that long never needs the float64 fallback."""

from __future__ import annotations


class ProvenForgetting:
    """The fallback of chunk-parallel scoring for a certified model: never needed, because every
    start-state error provably dies within ``bound`` characters, fewer than a chunk has. Called
    anyway, it raises (a bug, not a property of the text)."""

    def __init__(self, bound: int):
        self.bound = bound

    def __call__(self, ids, h):
        raise RuntimeError(f"a certified model's chunk did not forget its start within {self.bound} characters; "
                           "please report this as a bug of isan")
