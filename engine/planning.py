"""The Engine's kernel planning: the model's layouts for the batched kernels (built on first use),
its certificate's forgetting bound, and the plan of each chunk-parallel batch, asked of the
backend (:meth:`isan.engine.kernels.backends.Backend.plan`), never chosen by its name.

One :class:`Planner` an Engine (``Engine.plan``, ``Engine.jump_table``, ``Engine.stream_model``,
``Engine.min_chunk``, ``Engine.forget_bound_chars``, ``Engine.certificate`` hand off to it).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from isan.engine.forgetting import ProvenForgetting
from isan.engine.kernels.backends import Backend
from isan.engine.kernels.plan import DEFAULT_MARGIN, DEFAULT_RTOL, Kernel, ModelFacts, Plan
from isan.params import ISANParams


class Planner:
    """What chunk-parallel batches of one model need, built on first use and kept.

    Args:
        params32: the parameters by output id in float32 (the kernels' weights).
        params: the same in float64 (the fallback's).
        input_params: the parameters as stored (K inputs; the certificate is checked on them).
        table: the trie table (:class:`~isan.trie_tables.format.TrieTable`) or None.
        backend: the kernels' backend.
        source, manifest: the bundle directory and its manifest (the certificate's files).
    """

    def __init__(self, params32: ISANParams, params: ISANParams, input_params: ISANParams, table, backend: Backend,
                 source: str | None, manifest: dict):
        self.params32, self.params, self.input_params = params32, params, input_params
        self.table, self.backend, self.source, self.manifest = table, backend, source, manifest
        self._stream_model = None
        self._jumps: dict = {}  # the batched kernel's composed tables by dtype (jumps path)
        self._fallback = None
        self._float64_fallback = None
        self._certificate: dict | None = None
        self._certificate_checked = False

    @property
    def has_table(self) -> bool:
        return self.table is not None

    def stream_model(self):
        """The weights in the compiled kernels' layout
        (:class:`~isan.engine.kernels.streams.StreamModel`; built on first use, ~30 ms)."""
        if self._stream_model is None:
            from isan.engine.kernels.streams import StreamModel

            self._stream_model = StreamModel.from_params(self.params32)
        return self._stream_model

    def jump_table(self, dtype: str = "float32"):
        """The trie table as a :class:`~isan.engine.kernels.jumps.JumpTable` for the batched kernel,
        packed on first use from the table's own composed matrices (a float16 table is composed
        again in float64 from its keys, so that the float32 kernel stays exact);
        ``dtype="float16"`` stores the packed matrices in half precision (not exact: measured in
        ``isan bench engine``). Raises AttributeError without a table."""
        if dtype not in self._jumps:
            from isan.engine.kernels.jumps import JumpTable
            from isan.trie_tables.codes import decode_code

            t = self.table
            keys = [()] * t.n_entries
            for code, e in zip(t.sorted_codes.tolist(), t.entry_of_sorted.tolist()):
                keys[e] = decode_code(int(code), self.params.K)
            if t.header.get("dtype", "float32") == "float32":
                self._jumps[dtype] = JumpTable.from_composed(self.stream_model(), keys, t.Ac, t.R, t.offsets, dtype)
            else:
                self._jumps[dtype] = JumpTable.build(self.params32, keys, stream=self.stream_model(), dtype=dtype)
        return self._jumps[dtype]

    def certificate(self) -> dict | None:
        """The model's stability certificate (:func:`isan.engine.certificate.check_certificate`,
        recomputed from the bundle's files on first use and kept); None without one, or when it
        does not hold."""
        if not self._certificate_checked:
            from isan.engine.certificate import check_certificate

            c = None
            if self.source and self.manifest.get("certificate"):
                p = self.input_params
                c = check_certificate(self.source, self.manifest, p.W, p.b, p.h0)
            self._certificate = c if c is not None and c["holds"] else None
            self._certificate_checked = True
        return self._certificate

    def forget_bound_chars(self, rtol: float | None = None, margin: float | None = None) -> int | None:
        """Characters after which any start-state error is within chunk-parallel scoring's stopping
        rule, proven by the certificate: ``cond(P) rho^t (2 state_bound) <= rtol / margin``
        (two states within the bound differ by at most twice it). None without a certificate."""
        c = self.certificate()
        if c is None:
            return None
        rtol, margin = rtol or DEFAULT_RTOL, margin or DEFAULT_MARGIN
        start = c["cond_P"] * 2.0 * max(c["state_bound"], 1.0) * margin / rtol
        return max(1, int(np.ceil(np.log(start) / -np.log(c["rho"]))))

    def min_chunk(self) -> int:
        """The shortest chunk chunk-parallel scoring cuts on the CPU kernels, in characters
        (:func:`~isan.engine.kernels.chunked.certified_min_chunk` of :meth:`forget_bound_chars`)."""
        from isan.engine.kernels.chunked import certified_min_chunk

        return certified_min_chunk(self.forget_bound_chars())

    def fallback(self, lengths: Sequence[int] | None = None, chunks: Sequence[int] | None = None):
        """What chunk-parallel scoring does with a chunk whose correction does not converge: the
        backend's choice (:meth:`Backend.fallback`: :class:`ProvenForgetting` for a certified model
        on the CPU kernels, whose chunks are :meth:`min_chunk` or longer, else
        :class:`~isan.engine.kernels.chunked.Float64Fallback`). Chunk counts a caller gives
        (``lengths`` and ``chunks``) that make chunks shorter than the proof get the float64
        fallback instead."""
        if self._fallback is None:
            from isan.engine.kernels.chunked import Float64Fallback

            self._float64_fallback = Float64Fallback(self.params)
            chosen = self.backend.fallback(self.params, self.forget_bound_chars())
            self._fallback = chosen if isinstance(chosen, ProvenForgetting) else self._float64_fallback
        if isinstance(self._fallback, ProvenForgetting) and chunks is not None:
            n, c = np.asarray(lengths, dtype=np.int64), np.asarray(chunks, dtype=np.int64)
            if ((c > 1) & (n // c < self._fallback.bound)).any():
                return self._float64_fallback  # a caller's chunks shorter than the proof: checked instead
        return self._fallback

    def plan(self, lengths: Sequence[int], threads: int, chunks: "str | Sequence[int]" = "auto",
             kernel: "Kernel | str" = Kernel.AUTO) -> Plan:
        """The whole plan of a batch of texts of these ``lengths``: the backend's
        (:meth:`Backend.plan`: kernel, weights, chunks, runner, stopping rule, buffers) with the
        caller's chunk counts where it gives them and the fallback those chunks need (:meth:`fallback`).

        Args:
            chunks: ``"auto"`` (cut by the backend), ``"none"`` (one row a text) or each text's count.
            kernel: :class:`Kernel` (or its name); the torch backend has one and ignores it.
        Raises:
            IsanError: an unknown kernel, or chunk counts that do not match the texts.
        """
        from isan.errors import IsanError

        cut = isinstance(chunks, str) and chunks == "auto"
        facts = ModelFacts(self.has_table, self.forget_bound_chars(rtol=self.backend.rtol), self.min_chunk())
        planned = self.backend.plan(lengths, threads, facts, cut=cut, kernel=kernel)
        counts = planned.chunks
        if not isinstance(chunks, str):
            counts = np.asarray(chunks, dtype=np.int64).reshape(-1)
            if len(counts) != len(lengths) or (len(counts) and counts.min() < 1):
                raise IsanError(f"give one chunk count of at least 1 for each of the {len(lengths)} texts; "
                                f"got {counts}")
        model = planned.model if planned.model is not None else self.layout(planned.kernel)
        return dataclasses.replace(planned, model=model, chunks=counts, fallback=self.fallback(lengths, counts))

    def layout(self, kernel: Kernel):
        """The model's weights in ``kernel``'s layout: the trie table's composed jumps
        (:meth:`jump_table`; float16 for ``JUMPS_F16``) or the per-symbol layout (:meth:`stream_model`)."""
        if kernel.uses_table:
            return self.jump_table("float16" if kernel is Kernel.JUMPS_F16 else "float32")
        return self.stream_model()

    def report(self, rep) -> dict:
        """A :class:`~isan.engine.kernels.chunked.ChunkedReport` as the scoring report: where it ran
        (backends other than the default), and why no chunk can fall back (a certified model)."""
        out = rep.to_json()
        if self.backend.reports_where:  # say where it ran
            out.update(self.backend.describe())
        if isinstance(self._fallback, ProvenForgetting):  # say why no chunk can fall back
            out["forget_bound_chars"] = self._fallback.bound
        return out
