"""Tuners behind one interface; `registry.TUNERS` is the only place that lists them."""

from __future__ import annotations

from importlib import import_module

import numpy as np

from autosched.search.tuners.base import History, Tuner
from autosched.search.tuners.registry import TUNER_NAMES, TUNERS

__all__ = ["TUNER_NAMES", "History", "Tuner", "make_tuner"]


def make_tuner(
    name: str,
    n_points: int,
    seed: int,
    features: np.ndarray | None = None,
    budget: int | None = None,
    history: History = (),
) -> Tuner:
    if name not in TUNERS:
        raise ValueError(f"unknown tuner {name!r}")
    module, cls = TUNERS[name]
    tuner = getattr(import_module(module), cls)
    return tuner(n_points, seed, features, budget=budget, history=history)
