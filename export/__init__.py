"""isan.export: trained checkpoint to runtime bundle (weights, trie table, ONNX)."""

from isan.export.checkpoint import export_bundle, export_checkpoint, read_checkpoint  # noqa: F401

__all__ = ["export_bundle", "export_checkpoint", "read_checkpoint"]
