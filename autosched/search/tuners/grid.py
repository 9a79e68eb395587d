"""Grid search: `budget` points spread evenly over the space, in order."""

from __future__ import annotations

import numpy as np

from autosched.search.tuners.base import FixedOrderTuner


class GridTuner(FixedOrderTuner):
    def __init__(
        self, n_points: int, seed: int, features=None, budget: int | None = None, history=()
    ):
        super().__init__(n_points, seed, features, history)
        budget = n_points if budget is None else min(budget, n_points)
        # Evenly spaced indices; all of them when the budget covers the space.
        self.order = sorted({int(i) for i in np.linspace(0, n_points - 1, budget).round()})
