"""Knob lists x constraints -> the valid points of one problem on one target."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from autosched.config import Knob
from autosched.ops.base import Problem
from autosched.targets.base import Point, Target


@dataclass
class SearchSpace:
    problem: Problem
    knob_values: dict[str, list[Knob]]  # every knob's candidates, user-given or generated
    generated: list[str]  # knobs whose candidates came from the problem, not the cfg
    points: list[Point]
    rejected: Counter = field(default_factory=Counter)  # reason -> points dropped for it
    raw: int = 0  # points of the families' products before the constraints
    note: str = ""  # what the user should know about it (the cfg's lists emptied it, ...)
    replaced: bool = False  # the cfg's lists fit none of its points: generated ones stand in

    @property
    def total(self) -> int:
        return self.raw


def build_space(problem: Problem, target: Target, user_lists: dict[str, list[Knob]]):
    """Enumerates each family's product knob by knob, applying each constraint as soon as it
    can be; the space is the union of the families' points.

    Pruning early keeps spaces of millions of raw points cheap to build; a pruned prefix
    counts every point under it as rejected for that reason, so the counts add up.
    """
    target = target.for_problem(problem)
    order = list(target.knob_names)
    user_lists = {k: v for k, v in user_lists.items() if k in order}  # another kind's knobs
    generated = [k for k in order if k not in user_lists]
    space = SearchSpace(problem, {}, generated, points=[])
    for family in target.families(problem, user_lists):
        lists = {
            knob: list(
                family.fixed[knob]
                if knob in family.fixed
                else user_lists[knob]
                if knob in user_lists
                else family.candidates.get(knob) or target.candidates(knob, problem)
            )
            for knob in order
        }
        for knob, values in lists.items():
            known = space.knob_values.setdefault(knob, [])
            known += [v for v in values if v not in known]
        space.raw += math.prod(len(v) for v in lists.values())
        _enumerate(space, problem, order, lists, family.constraints)
    return space


def matching_points(points: list[Point], partials: list[Point]) -> list[int]:
    """For each partial point, the index of the first point agreeing on all its knobs (in
    the partials' order, each index once; a partial no point agrees with is skipped)."""
    found: list[int] = []
    for partial in partials:
        index = next(
            (i for i, p in enumerate(points) if all(p.get(k) == v for k, v in partial.items())),
            None,
        )
        if index is not None and index not in found:
            found.append(index)
    return found


def _enumerate(space: SearchSpace, problem, order: list[str], lists, constraints) -> None:
    """Appends the valid points of one product of knob lists to `space`."""
    # A constraint runs at the depth where the last knob it needs gets a value.
    due: dict[int, list] = {}
    for constraint in constraints:
        depth = max(order.index(k) for k in constraint.needs)
        due.setdefault(depth, []).append(constraint)
    remaining = [math.prod(len(lists[k]) for k in order[d + 1 :]) for d in range(len(order))]
    point: Point = {}

    def extend(depth: int) -> None:
        knob = order[depth]
        for value in lists[knob]:
            point[knob] = value
            failed = next((c for c in due.get(depth, []) if not c.test(problem, point)), None)
            if failed is not None:
                space.rejected[failed.reason] += remaining[depth]
                continue
            if depth + 1 == len(order):
                space.points.append(dict(point))
            else:
                extend(depth + 1)
        point.pop(knob, None)

    extend(0)


def empty_space_message(problem: Problem, space: SearchSpace) -> str:
    """Why a problem has nothing to search, and which of the cfg's lists to change."""
    reasons = _reasons(space, 3)
    listed = _listed(space)
    empty = [knob for knob, values in space.knob_values.items() if not values]
    message = f"{problem.name}: no point of its space passes the constraints"
    if reasons:
        message += f" (rejected: {reasons})"
    if empty:
        message += f"; no candidate for {', '.join(empty)}"
    if listed:
        message += (
            f"; the cfg lists {', '.join(listed)}: leave them out of its [SearchSpace] "
            "sections to generate them from the problem"
        )
    return message


def fitted_space(
    problem: Problem, target: Target, user_lists: dict[str, list[Knob]]
) -> tuple[SearchSpace, str]:
    """The problem's space from the cfg's lists; when they leave no point, the space with
    every knob generated from the problem instead. The second value says what happened
    ("" when the cfg's lists stand), for the user to read."""
    space = build_space(problem, target, user_lists)
    if space.points or not user_lists:
        return space, "" if space.points else empty_space_message(problem, space)
    generated = build_space(problem, target, {})
    if not generated.points:
        return space, empty_space_message(problem, space)
    # An ordinary case (the shipped cfg's tile lists and a model's small matmuls), not a fault.
    generated.replaced = True
    return generated, (
        f"{problem.name}: the cfg's lists of {', '.join(_listed(space))} fit none of its sizes "
        f"(rejected: {_reasons(space, 2)}): searched with knobs generated from the problem"
    )


def _reasons(space: SearchSpace, most: int) -> str:
    """The `most` commonest reasons points were rejected, with their counts."""
    return ", ".join(f"{n} {why}" for why, n in space.rejected.most_common(most))


def _listed(space: SearchSpace) -> list[str]:
    """The knobs whose candidates the cfg listed (not generated from the problem)."""
    return [knob for knob in space.knob_values if knob not in space.generated]
