"""Knob lists x constraints -> the valid points of one problem on one target."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from autosched.analysis import MatmulProblem
from autosched.config import Knob
from autosched.targets.base import Point, Target


@dataclass
class SearchSpace:
    problem: MatmulProblem
    knob_values: dict[str, list[Knob]]  # every knob's candidates, user-given or generated
    generated: list[str]  # knobs whose candidates came from the problem, not the cfg
    points: list[Point]
    rejected: Counter = field(default_factory=Counter)  # reason -> points dropped for it

    @property
    def total(self) -> int:
        return math.prod(len(v) for v in self.knob_values.values())


def build_space(problem: MatmulProblem, target: Target, user_lists: dict[str, list[Knob]]):
    """Enumerates the product knob by knob, applying each constraint as soon as it can be.

    Pruning early keeps spaces of millions of raw points cheap to build; a pruned prefix
    counts every point under it as rejected for that reason, so the counts add up.
    """
    knob_values: dict[str, list[Knob]] = {}
    generated = []
    for knob in target.knob_names:
        if knob in user_lists:
            knob_values[knob] = list(user_lists[knob])
        else:
            knob_values[knob] = list(target.candidates(knob, problem))
            generated.append(knob)
    order = list(knob_values)
    constraints = target.constraints(problem)
    # A constraint runs at the depth where the last knob it needs gets a value.
    due: dict[int, list] = {}
    for constraint in constraints:
        depth = max(order.index(k) for k in constraint.needs)
        due.setdefault(depth, []).append(constraint)
    remaining = [math.prod(len(knob_values[k]) for k in order[d + 1 :]) for d in range(len(order))]

    space = SearchSpace(problem, knob_values, generated, points=[])
    point: Point = {}

    def extend(depth: int) -> None:
        knob = order[depth]
        for value in knob_values[knob]:
            point[knob] = value
            failed = next((c for c in due.get(depth, []) if not c.test(problem, point)), None)
            if failed is not None:
                space.rejected[failed.reason] += remaining[depth]
                continue
            if depth + 1 == len(order):
                space.points.append(dict(point))
            else:
                extend(depth + 1)
        del point[knob]

    extend(0)
    return space
