"""autosched: an auto-scheduler for the linalg.matmul ops of an MLIR module, built on IREE."""

__version__ = "0.1.0"
