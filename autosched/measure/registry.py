"""Executors by name, as the cfg's `executor` says; importing this imports none of them."""

from __future__ import annotations

from importlib import import_module

# name -> (module, factory(config, target, jobs)): like the tuners' and targets' registries.
EXECUTORS = {
    "local": ("autosched.measure.local", "local_executor"),
    "ray": ("autosched.measure.ray", "RayExecutor"),
}


def make_executor(config, target, jobs: int):
    """The executor the cfg asks for (see `contract.Executor`)."""
    module, factory = EXECUTORS[config.executor]
    return getattr(import_module(module), factory)(config, target, jobs)
