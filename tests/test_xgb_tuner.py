"""The XGBoost tuner: no repeats, failures, determinism, speed on a large space."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np

from autosched.drivers.simulate import simulate
from autosched.search.landscape import load_landscapes
from autosched.search.tuners import make_tuner
from autosched.search.tuners.xgb import XGBoostTuner

LANDSCAPE = Path(__file__).parent / "data" / "h200_matmul_4096_landscape.csv"


def _grid_features(sizes: list[int]) -> np.ndarray:
    """Every combination of a few knobs, as floats: a small, structured space."""
    return np.array(list(itertools.product(*(range(n) for n in sizes))), dtype=np.float64)


def _drain(tuner, scores: list[float | None], batch_size: int = 8) -> list[int]:
    order: list[int] = []
    while True:
        batch = tuner.next_batch(batch_size)
        if not batch:
            return order
        assert len(batch) <= batch_size
        order += batch
        tuner.update([(i, scores[i]) for i in batch])


def test_never_repeats_and_covers_the_space():
    features = _grid_features([4, 3, 5])
    scores = [float(1 + f.sum()) for f in features]
    tuner = XGBoostTuner(len(features), 0, features)
    order = _drain(tuner, scores)
    assert sorted(order) == list(range(len(features)))
    assert not tuner.has_next()


def test_failed_points_are_handled_and_avoided():
    # Points with knob 0 == 3 always fail; the best point is elsewhere.
    features = _grid_features([4, 6, 6])
    scores: list[float | None] = [
        None if f[0] == 3 else float(100 - (f[1] - 4) ** 2 - (f[2] - 1) ** 2) for f in features
    ]
    tuner = XGBoostTuner(len(features), 1, features)
    order: list[int] = []
    for _ in range(6):
        batch = tuner.next_batch(8)
        order += batch
        tuner.update([(i, scores[i]) for i in batch])
    assert len(set(order)) == len(order) == 48
    best = tuner.best()
    assert best is not None and best[1] >= 99.0
    # After the first (spread-out) batch, the model should mostly stay off the failing knob.
    later = order[16:]
    assert sum(scores[i] is None for i in later) <= len(later) // 4


def test_all_points_failing_still_proposes_new_points():
    features = _grid_features([5, 5])
    tuner = XGBoostTuner(len(features), 0, features)
    order = _drain(tuner, [None] * len(features))
    assert sorted(order) == list(range(len(features)))
    assert tuner.best() is None


def test_same_seed_same_choices():
    features = _grid_features([6, 5, 4])
    scores = [float(np.sin(f).sum() + 3) for f in features]
    runs = []
    for _ in range(2):
        tuner = XGBoostTuner(len(features), 7, features)
        runs.append(_drain(tuner, scores)[:40])
    assert runs[0] == runs[1]


def test_works_without_features():
    tuner = make_tuner("xgboost", 30, 0, None, budget=10)
    order = _drain(tuner, [float(i % 7 + 1) for i in range(30)])
    assert sorted(order) == list(range(30))


def test_batch_of_16_from_50000_points_is_fast():
    rng = np.random.default_rng(0)
    knobs = _grid_features([8, 8, 5, 5, 4, 2, 4, 2])  # 51,200 combinations
    knobs = knobs[np.sort(rng.choice(len(knobs), 50_000, replace=False))]
    # Knob columns plus two derived ones, like the real feature matrices.
    features = np.column_stack([knobs, knobs[:, 0] + knobs[:, 1], knobs[:, 2] * knobs[:, 3]])
    weights = rng.normal(size=features.shape[1])
    scores = features @ weights + rng.normal(scale=0.1, size=len(features))
    scores = scores - scores.min() + 1.0
    tuner = XGBoostTuner(len(features), 0, features)
    seen: set[int] = set()
    slowest = 0.0
    for _ in range(4):
        start = time.perf_counter()
        batch = tuner.next_batch(16)
        slowest = max(slowest, time.perf_counter() - start)
        assert len(batch) == 16 and not seen.intersection(batch)
        seen.update(batch)
        tuner.update([(i, float(scores[i])) for i in batch])
    assert slowest < 5.0, f"a 16-point batch took {slowest:.2f} s"
    # The annealing search should already have found a point in the top 1% of the space.
    best = tuner.best()
    assert best is not None and best[1] >= np.quantile(scores, 0.99)


def test_xgboost_beats_random_on_the_recorded_landscape():
    for landscape in load_landscapes(str(LANDSCAPE)):
        result = simulate(landscape, ["random", "xgboost"], n_trial=64, seeds=10)
        xgb_trials = result.tuners["xgboost"].trials_to_95
        random_trials = result.tuners["random"].trials_to_95
        assert xgb_trials <= 0.6 * random_trials, (landscape.problem, xgb_trials, random_trials)
        assert result.tuners["xgboost"].best_fraction_at_n >= 0.95


def test_a_history_lets_the_model_choose_the_first_batch():
    """Another problem whose points ranked the same way: with it as history the first batch
    is the model's pick and holds the best point; without it the batch is spread out."""
    features = _grid_features([6, 6, 4])
    score = 100.0 - (features[:, 0] - 4) ** 2 - (features[:, 1] - 1) ** 2 - features[:, 2]
    rng = np.random.default_rng(0)
    seen = rng.choice(len(features), 40, replace=False)  # what the other problem measured
    history = [(features[seen] + 0.0, 2.0 * score[seen])]  # its own scale: only order counts
    best = int(np.argmax(score))
    with_history = XGBoostTuner(len(features), 0, features, history=history).next_batch(8)
    plain = XGBoostTuner(len(features), 0, features).next_batch(8)
    assert best in with_history
    assert max(score[with_history]) > max(score[plain])


def test_a_history_in_other_columns_is_refused():
    features = _grid_features([3, 3])
    try:
        XGBoostTuner(len(features), 0, features, history=[(np.zeros((5, 3)), np.ones(5))])
    except ValueError as error:
        assert "history of shape (5, 3) for 2 features" in str(error)
    else:
        raise AssertionError("a history with 3 columns for 2 features was accepted")


def test_the_database_history_holds_other_problems_of_the_same_input_type(write_module):
    """Newest problem first, each point's newest record, in the space's feature columns;
    the problem itself, baselines, other input types and problems with too few successful
    points are left out."""
    import math

    from conftest import matmul_function

    from autosched.config import RunConfig
    from autosched.ops.matmul import analyze_file
    from autosched.outputs.records import Trial, problem_shape
    from autosched.run.tuning import feature_matrix
    from autosched.search.history import MIN_POINTS, database_history
    from autosched.search.space import build_space
    from autosched.targets.cpu import CpuTarget

    target = CpuTarget(RunConfig())

    def problem(name, m, n, k, element="f32"):
        return analyze_file(write_module(matmul_function(name, m, n, k, element))).problems[0]

    def trials(p, count, failed=0, start=0.0):
        points = build_space(p, target, {}).points[:count]
        return [
            Trial(
                p.name,
                target.name,
                target.arch,
                f"c{i}",
                point,
                False,
                "ok" if i >= failed else "runtime_error",
                gflops=float(10 + i) if i >= failed else None,
                shape=problem_shape(p),
                time=start + i,
            )
            for i, point in enumerate(points)
        ]

    own, older, newer = (
        problem("own", 64, 64, 64),
        problem("a", 32, 64, 64),
        problem("b", 64, 32, 64),
    )
    few, other_type = problem("c", 32, 32, 64), problem("d", 64, 64, 32, "f16")
    records = trials(older, 6) + trials(own, 5) + trials(newer, 7, failed=2)
    records += trials(few, MIN_POINTS, failed=1) + trials(other_type, 6)
    records.append(
        Trial(newer.name, target.name, target.arch, "default", {}, True, "ok", gflops=1.0)
    )
    records += trials(older, 1)  # a newer record of older's first point: older is now newest
    space = build_space(own, target, {})
    columns = list(target.features(own, space.points[0]))
    history = database_history(records, target, own, columns)
    assert [len(scores) for _, scores in history] == [6, 7]
    rows, scores = history[1]
    assert rows.shape == (7, feature_matrix(own, target, space.points).shape[1])
    assert sum(math.isnan(s) for s in scores) == 2
