"""Tuners behind one interface; `make_tuner` is the only place that lists them."""

from __future__ import annotations

import numpy as np

from autosched.tuners.base import Tuner

TUNER_NAMES = ("grid", "random", "xgboost")


def make_tuner(
    name: str,
    n_points: int,
    seed: int,
    features: np.ndarray | None = None,
    budget: int | None = None,
) -> Tuner:
    if name == "grid":
        from autosched.tuners.grid import GridTuner

        return GridTuner(n_points, seed, features, budget=budget)
    if name == "random":
        from autosched.tuners.random_search import RandomTuner

        return RandomTuner(n_points, seed, features, budget=budget)
    if name == "xgboost":
        from autosched.tuners.xgb import XGBoostTuner

        return XGBoostTuner(n_points, seed, features, budget=budget)
    raise ValueError(f"unknown tuner {name!r}")
