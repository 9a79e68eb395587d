"""Other problems' measurements as a tuner's history (transfer learning, as AutoTVM's).

A cost model that has seen how the points of other problems ranked can rank a new space
before measuring anything in it, instead of spreading its first batch blindly. Each other
problem is one group of (features, scores) rows in the new space's feature columns; the
xgboost tuner ranks within groups only, so one problem's speed is never compared with
another's. In replay over the H200's recorded 2048x8192x1024 f16 sweep, with the ten-problem
suite's records as history, the median trials to come within 5 % of the best fell from 34 to
18 (the worst seed from 81 to 26); on two CPU landscapes one problem gained and the other lost
(benchmarks/results/history_replay.md), so a run uses it only when asked (`history`).
"""

from __future__ import annotations

import math

import numpy as np

from autosched.ops.base import Problem
from autosched.ops.registry import BASE_KIND
from autosched.outputs.records import Trial, problem_from_shape
from autosched.search.landscape import Landscape
from autosched.search.tuners import History
from autosched.targets.base import Target, recorded_point

MAX_PROBLEMS = 8  # the newest problems a history holds
MIN_POINTS = 4  # successful points a problem needs to teach a ranking


def database_history(
    trials: list[Trial], target: Target, problem: Problem, columns: list[str]
) -> History:
    """The database's other problems on this target and arch with the same input element
    type, newest first: each one's points (its newest record of each) as feature rows in
    `columns`, the space's feature names, and their GFLOP/s (NaN where a point failed)."""
    target = target.for_problem(problem)
    input_type = problem.record_shape().get("lhs_type")  # None for a kind with no such field
    by_problem: dict[str, dict[str, Trial]] = {}
    for trial in trials:
        if trial.baseline or trial.problem == problem.name or not trial.point:
            continue
        if (trial.target, trial.arch) != (target.name, target.arch):
            continue
        if (trial.shape or {}).get("kind", BASE_KIND) != problem.kind:
            continue  # another root-op kind: other knobs
        if (trial.shape or {}).get("lhs_type") != input_type:
            continue
        points = by_problem.pop(trial.problem, {})  # re-inserted: the newest problem last
        points[trial.config] = trial
        by_problem[trial.problem] = points
    history = []
    for points in reversed(by_problem.values()):
        try:
            other = problem_from_shape(next(iter(points.values())).shape)
        except (KeyError, TypeError, ValueError):
            continue
        rows, scores = [], []
        for trial in points.values():
            try:
                features = target.features(other, recorded_point(target, trial.point))
                rows.append([float(features[c]) for c in columns])
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                continue  # a point today's target cannot describe
            ok = trial.timed and trial.gflops is not None and trial.gflops > 0
            scores.append(float(trial.gflops) if ok else math.nan)
        if sum(np.isfinite(scores)) >= MIN_POINTS:
            history.append((np.array(rows, dtype=np.float64), np.array(scores)))
        if len(history) == MAX_PROBLEMS:
            break
    return history


def landscape_history(landscape: Landscape, others: list[Landscape]) -> History:
    """For a replay: the other landscapes of the same input element type, their features
    put in this landscape's columns (a feature one lacks is 0)."""
    history = []
    for other in others:
        if other is landscape or not other.lhs_type or other.lhs_type != landscape.lhs_type:
            continue
        index = {name: i for i, name in enumerate(other.feature_names)}
        zeros = np.zeros(other.n_points)
        rows = np.stack(
            [other.features[:, index[n]] if n in index else zeros for n in landscape.feature_names],
            axis=1,
        )
        if np.isfinite(other.scores).sum() >= MIN_POINTS:
            history.append((rows, other.scores))
    return history[:MAX_PROBLEMS]
