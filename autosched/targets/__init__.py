"""Backends, one module each; `make_target` is the only place that lists them."""

from __future__ import annotations

from autosched.config import RunConfig
from autosched.targets.base import Target


def make_target(config: RunConfig) -> Target:
    if config.target == "cpu":
        from autosched.targets.cpu import CpuTarget

        return CpuTarget(config)
    if config.target == "cuda":
        from autosched.targets.cuda import CudaTarget

        return CudaTarget(config)
    raise ValueError(f"unknown target {config.target!r}")
