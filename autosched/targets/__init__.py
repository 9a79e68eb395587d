"""Backends, one module each; `registry.TARGETS` is the only place that lists them.

Nothing is imported at package level: `config` reads `registry`, and the targets read
`config`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from autosched.targets.registry import TARGETS

if TYPE_CHECKING:
    from autosched.config import RunConfig
    from autosched.targets.base import Target
    from autosched.targets.host import Machine


def make_target(config: RunConfig, machine: Machine | None = None) -> Target:
    """The configured backend, told what this host has (discovered here when not given)."""
    from autosched.targets.host import discover  # noqa: PLC0415 - host reads the cfg, which reads this package

    if config.target not in TARGETS:
        raise ValueError(f"unknown target {config.target!r}")
    module, cls = TARGETS[config.target]
    return getattr(import_module(module), cls)(config, machine or discover(config))
