"""isan.export: trained checkpoint to runtime bundle (weights, trie table, ONNX, stability certificate)."""

from isan.export.checkpoint import (  # noqa: F401
    CERT_FILE, certificate, export_bundle, export_checkpoint, read_checkpoint, write_certificate,
)

__all__ = ["CERT_FILE", "certificate", "export_bundle", "export_checkpoint", "read_checkpoint", "write_certificate"]
