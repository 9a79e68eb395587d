"""The tuner interface: propose points, take their scores. No files, no processes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

# Other problems' measurements: (their points' features, in this space's columns; scores).
History = Sequence[tuple[np.ndarray, np.ndarray]]


class Tuner(ABC):
    """Chooses which points of a space to measure next.

    Points are indices into the space's point list. A score is higher-is-better
    (GFLOP/s); None marks a point that failed (compile error, crash, wrong answer).
    """

    def __init__(
        self,
        n_points: int,
        seed: int,
        features: np.ndarray | None = None,
        history: History = (),
    ):
        self.n_points = n_points
        self.seed = seed
        self.features = features
        # What other problems measured (a tuner that learns may start from it).
        self.history = list(history)
        self.measured: dict[int, float | None] = {}

    @abstractmethod
    def next_batch(self, size: int) -> list[int]:
        """Up to `size` unmeasured points; an empty list means the tuner has nothing left."""

    def update(self, results: list[tuple[int, float | None]]) -> None:
        for index, score in results:
            self.measured[index] = score

    def best(self) -> tuple[int, float] | None:
        scored = [(i, s) for i, s in self.measured.items() if s is not None]
        return max(scored, key=lambda item: item[1]) if scored else None

    def has_next(self) -> bool:
        return len(self.measured) < self.n_points


class FixedOrderTuner(Tuner):
    """A tuner whose whole visiting order is known up front (grid, random)."""

    order: list[int]

    def __init__(
        self, n_points: int, seed: int, features: np.ndarray | None = None, history: History = ()
    ):
        super().__init__(n_points, seed, features, history)
        self.cursor = 0

    def next_batch(self, size: int) -> list[int]:
        batch = []
        while len(batch) < size and self.cursor < len(self.order):
            index = self.order[self.cursor]
            self.cursor += 1
            if index not in self.measured:
                batch.append(index)
        return batch
