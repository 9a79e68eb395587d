"""Random search: a seeded permutation of the space, no repeats."""

from __future__ import annotations

import numpy as np

from autosched.search.tuners.base import FixedOrderTuner


class RandomTuner(FixedOrderTuner):
    def __init__(
        self, n_points: int, seed: int, features=None, budget: int | None = None, history=()
    ):
        super().__init__(n_points, seed, features, history)
        self.order = np.random.default_rng(seed).permutation(n_points).tolist()
