"""autosched: an auto-scheduler for the root ops of a model or an MLIR module (matmuls and
other contractions, attention, convolutions), built on IREE.

From Python, `autosched.tune(module, *example_args)` tunes a torch module (autosched/api.py).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`autosched.tune` and `autosched.TunedModule`, loaded on first use: importing any
    part of the package (the command line's first line is signal handling) stays light."""
    if name in ("tune", "TunedModule"):
        from autosched import api  # noqa: PLC0415 - loaded on first use: importing autosched stays light

        return getattr(api, name)
    raise AttributeError(f"module 'autosched' has no attribute {name!r}")
