"""The search loop: a tuner, a budget, batches and early stopping, over any measurer.

`autosched run` measures a batch by compiling, checking and timing it (runner.Tuning);
`autosched simulate` looks the batch up in a recorded landscape. Both drive the same loop,
so a replay follows the same proposals, budgets and stopping rules as a run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autosched.search.tuners.base import Tuner

# Measures the points of a batch (indices into the space); a score per point, higher is
# better, None for a point that failed.
Measure = Callable[[list[int]], list["float | None"]]


@dataclass
class SearchState:
    """One problem's search so far."""

    tuner: Tuner
    order: list[int] = field(default_factory=list)  # points in the order they were measured
    scores: list[float | None] = field(default_factory=list)  # what the tuner was told
    best: float = 0.0  # best score so far
    since_best: int = 0  # trials since the best improved
    exhausted: bool = False  # the tuner has nothing left to propose
    # Points measured before the tuner's own picks (the knowledge base's and the target's
    # known-good points, a sibling problem's winners): they make up the next batch, which
    # the tuner tops up. Anyone may add to it between batches; the tuner is told as usual.
    queued: list[int] = field(default_factory=list)

    def resume(self, index: int, score: float | None) -> None:
        """A point measured earlier (a resumed record): the tuner hears of it, no trial."""
        if index in self.queued:
            self.queued.remove(index)
        self.tuner.update([(index, score)])
        self.order.append(index)
        self.scores.append(score)
        if score is not None and score > self.best:
            self.best = score


def step(state: SearchState, count: int, measure: Measure) -> list[int]:
    """Measures up to `count` more points the tuner proposes; [] when it has none left."""
    if state.exhausted or count <= 0:
        return []
    measured = set(state.order)
    queued = [i for i in dict.fromkeys(state.queued) if i not in measured]
    batch, state.queued = queued[:count], queued[count:]
    if len(batch) < count:
        # The tuner does not know of the queued points yet: one it proposes too is dropped
        # (from this batch, or from the queue, so that no point is measured twice).
        batch += [i for i in state.tuner.next_batch(count - len(batch)) if i not in batch]
        state.queued = [i for i in state.queued if i not in batch]
    if not batch:
        state.exhausted = True
        return []
    scores = measure(batch)
    state.tuner.update(list(zip(batch, scores, strict=True)))
    for index, score in zip(batch, scores, strict=True):
        state.order.append(index)
        state.scores.append(score)
        if score is not None and score > state.best:
            state.best, state.since_best = score, 0
        else:
            state.since_best += 1
    return batch


def search(
    state: SearchState,
    measure: Measure,
    budget: int,
    batch_size: int,
    early_stopping: int = 0,
    done: Callable[[SearchState], bool] | None = None,
) -> str:
    """Batches until `budget` points are measured, the tuner runs dry, `early_stopping`
    trials pass without improvement, or `done` says so; returns why it stopped."""
    while len(state.order) < budget:
        if done is not None and done(state):
            return "done"
        if not step(state, min(batch_size, budget - len(state.order)), measure):
            return "exhausted"
        if early_stopping and state.since_best >= early_stopping:
            return "early_stopping"
    return "budget"
