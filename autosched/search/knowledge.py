"""Known-good points by shape class: what earlier tuning found, transferred to new problems.

A search that starts blank spends its first batch finding the region a similar problem
already showed. The knowledge base keeps, for each tuned problem of each target and arch,
the points that beat IREE's default beyond the noise, under the problem's *shape class*:
its kind, op, element types, layout and loops (which must be equal) and its sizes (which
may differ; problems are near when their sizes are, on a log2 scale). A new problem's
first batch takes the winners of the nearest class, each as the point of its own space
nearest to it (`project`). The shipped base (`knowledge.json`, package data) is built
from the committed tuning databases by `tools/build_knowledge.py`; a run adds its own
database's winners, and a model run hands each problem's winners to its siblings
(`drivers/campaign.py`). Seeded points are ordinary trials: recorded, resumed and counted
in the budget like the tuner's own picks.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from autosched.errors import UserError
from autosched.outputs.records import Trial
from autosched.targets.base import Point

SHIPPED = os.path.join(os.path.dirname(__file__), "knowledge.json")
FORMAT = 1  # the JSON file's version
# Record fields that are sizes (any kind's): compared on a log2 scale. Every other field of
# a record's shape (kind, op, types, transposes, loops, strides) must be equal.
SIZE_FIELDS = ("m", "n", "k", "batch", "loop_sizes")
NOISE = 0.03  # a winner beats its default by more than this, and more than both CVs
WINNERS = 3  # points kept per problem
SEEDS = 3  # points a new problem's first batch takes from the knowledge base
FARTHEST = 8.0  # classes farther than this (sum of |log2| size ratios) teach nothing
PROJECTION = 2.0  # a point moves at most this far (sum of |log2| knob ratios) into a space


def _log_sizes(shape: dict) -> list[float]:
    sizes: list[float] = []
    for name in SIZE_FIELDS:
        value = shape.get(name)
        values = value if isinstance(value, list) else [] if value is None else [value]
        sizes += [math.log2(1 + max(int(v), 0)) for v in values]
    return sizes


@dataclass(frozen=True)
class ShapeClass:
    """A problem's class on a target: what must match (`signature`) and its log2 sizes."""

    target: str
    arch: str
    signature: str  # the shape's other fields as sorted JSON
    sizes: tuple[float, ...]

    @classmethod
    def of(cls, target: str, arch: str, shape: dict) -> ShapeClass:
        rest = {k: v for k, v in shape.items() if k not in SIZE_FIELDS}
        rest.setdefault("kind", "matmul")  # records written before kinds had no kind field
        signature = json.dumps(rest, sort_keys=True, default=str)
        return cls(target, arch, signature, tuple(_log_sizes(shape)))

    def distance(self, other: ShapeClass) -> float | None:
        """Sum of |log2| size ratios; None for another target, arch or signature."""
        mine, theirs = (
            (self.target, self.arch, self.signature),
            (other.target, other.arch, other.signature),
        )
        if mine != theirs or len(self.sizes) != len(other.sizes):
            return None
        return sum(abs(a - b) for a, b in zip(self.sizes, other.sizes, strict=True))


class Seed(NamedTuple):
    """A known point for a problem: where it won, and how far that problem's class is."""

    point: Point
    problem: str
    distance: float


@dataclass
class Winner:
    point: Point
    speedup: float  # over the default measured beside it


@dataclass
class KnownProblem:
    """One tuned problem's winners, fastest first."""

    problem: str
    target: str
    arch: str
    shape: dict
    winners: list[Winner] = field(default_factory=list)

    @property
    def shape_class(self) -> ShapeClass:
        return ShapeClass.of(self.target, self.arch, self.shape)


@dataclass
class Knowledge:
    problems: list[KnownProblem] = field(default_factory=list)

    def merged(self, other: Knowledge) -> Knowledge:
        """Both bases; where both know a problem, its winners from both, fastest first."""
        by_key = {(p.target, p.arch, p.problem): p for p in self.problems}
        for known in other.problems:
            key = (known.target, known.arch, known.problem)
            if key in by_key:
                by_key[key] = _with_winners(by_key[key], [*by_key[key].winners, *known.winners])
            else:
                by_key[key] = known
        return Knowledge(list(by_key.values()))

    def nearest(self, shape_class: ShapeClass, limit: int = SEEDS) -> list[Seed]:
        """Up to `limit` points of the nearest classes, the nearest problem's winners
        first, each with the problem it won on and that problem's distance."""
        ranked = []
        for known in self.problems:
            distance = known.shape_class.distance(shape_class)
            if distance is not None and distance <= FARTHEST and known.winners:
                ranked.append((distance, -known.winners[0].speedup, known.problem, known))
        ranked.sort(key=lambda item: item[:3])
        found: list[Seed] = []
        for distance, _, _, known in ranked:
            for winner in known.winners:
                if len(found) < limit and all(winner.point != s.point for s in found):
                    found.append(Seed(winner.point, known.problem, distance))
        return found

    def to_json(self) -> str:
        """One problem a line, so that a rebuilt base diffs line by line."""
        lines = [json.dumps(asdict(p), sort_keys=True) for p in self.problems]
        return f'{{"format": {FORMAT}, "problems": [\n' + ",\n".join(lines) + "\n]}\n"

    @classmethod
    def from_json(cls, text: str) -> Knowledge:
        data = json.loads(text)
        problems = []
        for raw in data.get("problems", []):
            winners = [Winner(dict(w["point"]), float(w["speedup"])) for w in raw["winners"]]
            problems.append(
                KnownProblem(raw["problem"], raw["target"], raw["arch"], raw["shape"], winners)
            )
        return cls(problems)


def _with_winners(known: KnownProblem, winners: list[Winner]) -> KnownProblem:
    """`known` with the fastest `WINNERS` distinct points of `winners`."""
    kept: list[Winner] = []
    for winner in sorted(winners, key=lambda w: -w.speedup):
        if len(kept) < WINNERS and all(winner.point != w.point for w in kept):
            kept.append(winner)
    return KnownProblem(known.problem, known.target, known.arch, known.shape, kept)


def beats_default(trial: Trial, default: Trial) -> float | None:
    """The trial's speedup over the default, when beyond the noise: over the faster of the
    default's first timing and the one beside the trial's batch. A default timed slow once
    (the machine busy for a moment) otherwise made losers winners: on a loaded 2-core host
    resnet18's strided convolution re-timed its default at 11.8 ms against 3.8 ms first,
    and a point 1.2x slower than the default entered the shipped base as 2.6x faster."""
    if not (trial.ok and default.ok and trial.median_ms and default.median_ms):
        return None
    speedup = min(trial.reference_ms or math.inf, default.median_ms) / trial.median_ms
    noise = max(NOISE, trial.cv or 0.0, default.cv or 0.0)
    return speedup if speedup > 1 + noise else None


def from_trials(trials: Iterable[Trial]) -> Knowledge:
    """Each problem's winners in a database's records (its newest default, its newest
    record of each point); problems with no winner are left out."""
    defaults: dict[tuple, Trial] = {}
    points: dict[tuple, dict[str, Trial]] = {}
    for trial in trials:
        key = (trial.target, trial.arch, trial.problem)
        if trial.baseline:
            if trial.ok:
                defaults[key] = trial
        elif trial.point and trial.shape:
            points.setdefault(key, {})[trial.config] = trial
    problems = []
    for key, by_config in points.items():
        default = defaults.get(key)
        if default is None:
            continue
        winners = []
        for trial in by_config.values():
            speedup = beats_default(trial, default)
            if speedup is not None:
                winners.append(Winner(dict(trial.point), round(speedup, 4)))
        if winners:
            shape = next(iter(by_config.values())).shape
            target, arch, name = key
            known = KnownProblem(name, target, arch, dict(shape))
            problems.append(_with_winners(known, winners))
    return Knowledge(problems)


def load(path: str = "") -> Knowledge:
    """The knowledge base at `path` (the shipped one for ""); a user's file that cannot
    be read is one error naming it."""
    try:
        with open(path or SHIPPED, encoding="utf-8") as handle:
            return Knowledge.from_json(handle.read())
    except (OSError, ValueError, KeyError, TypeError) as error:
        if not path:
            return Knowledge()  # an install without the data file: nothing known
        raise UserError(f"{path}: not a knowledge base ({error})") from error


def _knob_distance(point: Point, candidate: Point) -> float | None:
    """Sum of |log2| ratios of the integer knobs; None where a named knob differs."""
    total = 0.0
    for knob, value in point.items():
        other = candidate.get(knob)
        if isinstance(value, int) and isinstance(other, int) and value > 0 and other > 0:
            total += abs(math.log2(value) - math.log2(other))
        elif value != other:
            return None
    return total


def project(point: Point, points: list[Point]) -> int | None:
    """The index of the point of `points` nearest to `point` (itself when there), or None
    when none is within `PROJECTION`."""
    best, best_distance = None, math.inf
    for index, candidate in enumerate(points):
        distance = _knob_distance(point, candidate)
        if distance == 0:
            return index
        if distance is not None and distance < best_distance:
            best, best_distance = index, distance
    return best if best_distance <= PROJECTION else None


def neighbours(point: Point, space: list[Point], skip: Iterable[int], seed: int) -> list[int]:
    """The points of `space` one step from `point` (one integer knob doubled or halved, the
    rest equal), none of `skip`, in an order drawn from `seed`: where a search goes next
    once its known points showed the region (fast mode's second batch)."""
    skipped = set(skip)
    found = [
        index
        for index, candidate in enumerate(space)
        if index not in skipped and _knob_distance(point, candidate) == 1.0
    ]
    random.Random(seed).shuffle(found)
    return found


def seed_indices(points: list[Point], space: list[Point], skip: Iterable[int] = ()) -> list[int]:
    """`points` projected into `space`, in order, each index once and none of `skip`."""
    found: list[int] = []
    skipped = set(skip)
    for point in points:
        index = project(point, space)
        if index is not None and index not in found and index not in skipped:
            found.append(index)
    return found


def first_points(found: list[Seed], space: list[Point], starting: list[int]) -> list[int]:
    """A problem's first points: the winners of its own class (the same sizes: the same
    problem tuned before) first, then `starting` (the target's hand-picked points), then
    the winners of near classes, each once."""
    exact = seed_indices([s.point for s in found if s.distance == 0], space)
    near = seed_indices([s.point for s in found if s.distance > 0], space)
    return list(dict.fromkeys([*exact, *starting, *near]))
