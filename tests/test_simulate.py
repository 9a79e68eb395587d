"""Landscape loading (CSV and tuning-database JSON lines) and the `simulate` command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from autosched.drivers.simulate import replay, simulate, simulate_command
from autosched.errors import UserError
from autosched.search.landscape import Landscape, load_landscapes

LANDSCAPE = Path(__file__).parent / "data" / "h200_matmul_4096_landscape.csv"


def _run(*args: str):
    return CliRunner().invoke(simulate_command, list(args))


def test_csv_landscape_has_two_problems_and_baselines():
    landscapes = load_landscapes(str(LANDSCAPE))
    by_name = {ls.problem: ls for ls in landscapes}
    assert set(by_name) == {"matmul_4096x4096x4096_f16", "matmul_4096x4096x4096_f32"}
    f16 = by_name["matmul_4096x4096x4096_f16"]
    assert f16.n_points == 396 and by_name["matmul_4096x4096x4096_f32"].n_points == 252
    assert f16.features.shape == (396, len(f16.feature_names))
    assert np.isfinite(f16.features).all()
    # Baseline: IREE's default took 1.29 ms for 2 * 4096^3 flops.
    assert f16.baseline == pytest.approx(2 * 4096**3 / 1.29e6)
    assert f16.best == pytest.approx(2 * 4096**3 / 0.90318e6)
    assert len(f16.descriptions) == 396 and "wg_m=128" in f16.descriptions[0]


def test_json_output_shape():
    result = _run(str(LANDSCAPE), "--seeds", "3", "--n-trial", "16", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [p["problem"] for p in data["problems"]] == [
        "matmul_4096x4096x4096_f16",
        "matmul_4096x4096x4096_f32",
    ]
    for problem in data["problems"]:
        assert problem["space"] in (396, 252)
        assert set(problem["tuners"]) == {"grid", "random", "xgboost"}
        for summary in problem["tuners"].values():
            assert summary["trials_to_95"] >= 1
            assert 0 < summary["best_fraction_at_n"] <= 1


def test_table_output_and_tuner_choice():
    result = _run(str(LANDSCAPE), "--seeds", "2", "--tuner", "random", "--tuner", "grid")
    assert result.exit_code == 0, result.output
    assert "random" in result.output and "grid" in result.output
    assert "xgboost" not in result.output
    assert "trials to 95%" in result.output.splitlines()[0]


@pytest.mark.parametrize(
    "content",
    [
        None,  # no file at all
        "M,N,K\n1,2,3\n",  # not the landscape columns
        LANDSCAPE.read_text().splitlines()[0] + "\n",  # header only: no problems
        LANDSCAPE.read_text().splitlines()[0] + "\nx,4,4,f16,f32,TileAndFuse-mma" + "," * 9 + "1\n",
        '{not json at all\n{"also": "bad"\n',  # a database with no readable record
    ],
)
def test_bad_inputs_raise_user_error(tmp_path, content):
    path = tmp_path / "landscape.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError) as error:
        load_landscapes(str(path))
    assert "\n" not in str(error.value)
    # Through click: one "Error: ..." line and exit code 2, no traceback.
    result = _run(str(path))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1


def _record(point: dict, gflops: float | None, status: str = "ok", **extra) -> str:
    record = {
        "problem": "matmul_64x64x64_f32",
        "target": "cuda",
        "arch": "sm_90",
        "point": point,
        "config": "_".join(f"{k}{v}" for k, v in point.items()),
        "status": status,
        "median_ms": None if gflops is None else 1.0,
        "gflops": gflops,
        "baseline": False,
    }
    record.update(extra)
    return json.dumps(record)


def test_tuning_database_is_read_tolerantly(tmp_path):
    lines = [
        _record({"tile_m": 16, "tile_n": 32}, 10.0),
        _record({"tile_m": 32, "tile_n": 32}, 20.0, features={"log2_tile_m": 5.0, "x": 1.0}),
        _record({"tile_m": 64, "tile_n": 64}, None, status="compile_error"),
        _record({}, 5.0, baseline=True, config="default"),
        '{"problem": "matmul_64x64x64_f32", "point": {"tile_m": 12',  # killed mid-write
    ]
    path = tmp_path / "tuning.jsonl"
    path.write_text("\n".join(lines))
    [landscape] = load_landscapes(str(path))
    assert landscape.problem == "matmul_64x64x64_f32"
    assert landscape.n_points == 3 and landscape.baseline == 5.0
    assert landscape.scores[0] == 10.0 and math.isnan(landscape.scores[2])
    names = landscape.feature_names
    assert set(names) == {"log2_tile_m", "log2_tile_n", "x"}
    first = dict(zip(names, landscape.features[0], strict=True))
    assert first["log2_tile_m"] == 4.0 and first["log2_tile_n"] == 5.0
    second = dict(zip(names, landscape.features[1], strict=True))
    assert second == {"log2_tile_m": 5.0, "log2_tile_n": 0.0, "x": 1.0}


def test_replay_with_failed_points_never_repeats():
    rng = np.random.default_rng(3)
    features = rng.integers(0, 4, size=(80, 3)).astype(float) + np.arange(80)[:, None] * 1e-3
    scores = features.sum(axis=1) + 1.0
    scores[rng.random(80) < 0.3] = np.nan  # failed points
    landscape = Landscape("toy", features, scores, math.nan, [str(i) for i in range(80)])
    for tuner in ("grid", "random", "xgboost"):
        run = replay(landscape, tuner, seed=0, n_trial=80)
        assert len(run.order) == len(set(run.order))
        assert 1 <= run.trials_to_95 <= 81
        assert run.best_fraction_at_n <= 1.0


def test_a_run_that_never_reaches_95_counts_as_space_plus_one():
    features = np.arange(20, dtype=float).reshape(-1, 1)
    scores = np.ones(20)
    scores[7] = 100.0  # only point 7 is good; a 4-point grid over 20 points misses it
    landscape = Landscape("toy", features, scores, math.nan, [""] * 20)
    result = simulate(landscape, ["grid"], n_trial=4, seeds=1)
    assert result.tuners["grid"].trials_to_95 == 21


def test_noisy_replays_repeat_per_noise_seed_and_differ_between_them():
    """Replays with measurement noise: the same noise seed gives the same run, and the
    tuner sees noisy scores (what benchmarks/repeatability.py measures)."""
    from autosched.drivers.simulate import replay
    from autosched.search.landscape import load_landscapes

    f16 = next(ls for ls in load_landscapes(str(LANDSCAPE)) if "f16" in ls.problem)
    quiet = replay(f16, "xgboost", 0, 24)
    assert quiet.measured == [float(f16.scores[i]) for i in quiet.order]
    first = replay(f16, "xgboost", 0, 24, noise=0.2, noise_seed=1)
    again = replay(f16, "xgboost", 0, 24, noise=0.2, noise_seed=1)
    other = replay(f16, "xgboost", 0, 24, noise=0.2, noise_seed=2)
    assert first.order == again.order and first.measured == again.measured
    assert first.measured != other.measured
    assert 0 < first.chosen_fraction_at_n <= 1


def test_a_csv_landscape_has_the_cuda_targets_own_features():
    """The CSV path's cost-model features are CudaTarget.features of each row's point (one
    feature model, one shared-memory formula), not a second set of its own."""
    import csv

    from autosched.config import RunConfig
    from autosched.ops.matmul import MatmulProblem
    from autosched.search.landscape import _csv_point, load_landscapes
    from autosched.targets.cuda import CudaTarget

    path = "tests/data/h200_matmul_4096_landscape.csv"
    f16 = next(s for s in load_landscapes(path) if s.problem.endswith("f16"))
    row = next(r for r in csv.DictReader(open(path)) if r["dtype"] == "f16")
    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"))
    problem = MatmulProblem(
        op_name="linalg.matmul",
        m=4096,
        n=4096,
        k=4096,
        batch=0,
        lhs_type="f16",
        rhs_type="f16",
        acc_type="f32",
        transpose_a=False,
        transpose_b=False,
        zero_init=True,
        indexing_maps="",
    )
    expected = target.features(problem, _csv_point(row, "f16", "f32"))
    names = [n for n in f16.feature_names if not n.startswith("pipeline=")]
    assert names == list(expected)
    assert list(f16.features[0][: len(names)]) == pytest.approx(list(expected.values()))


def test_starting_points_go_first_and_the_tuner_tops_up_their_batch():
    """The target's known-good points make up the first batch, and no point is measured
    twice, for every tuner: a starting point the tuner also proposes is dropped."""
    rng = np.random.default_rng(5)
    features = rng.random((60, 3))
    scores = features.sum(axis=1) + 1.0
    landscape = Landscape("toy", features, scores, math.nan, [""] * 60, starting=[7, 0, 41])
    for tuner in ("grid", "random", "xgboost"):
        run = replay(landscape, tuner, seed=0, n_trial=60, batch_size=8)
        assert run.order[:3] == [7, 0, 41]
        assert len(run.order) == len(set(run.order)) == 60
        plain = replay(landscape, tuner, seed=0, n_trial=60, batch_size=8, starting=False)
        assert plain.order[:3] != [7, 0, 41]
    # Starting at the best point reaches it on the first trial.
    best = int(np.argmax(scores))
    landscape.starting = [best]
    assert replay(landscape, "grid", seed=0, n_trial=8).trials_to_95 == 1


def test_a_resumed_starting_point_is_not_measured_again():
    from autosched.search.loop import SearchState, step
    from autosched.search.tuners import make_tuner

    state = SearchState(make_tuner("grid", 10, 0), queued=[4, 2])
    state.resume(4, 1.0)
    measured = step(state, 3, lambda batch: [1.0] * len(batch))
    assert measured == [2, 0, 1]
    assert state.order == [4, 2, 0, 1]


def test_a_recorded_landscape_knows_the_targets_starting_points(tmp_path):
    """A CUDA database's custom points: the one Triton's list names first is found."""
    shape = {"m": 4096, "n": 4096, "k": 4096, "batch": 0, "op": "linalg.matmul"}
    shape |= {"lhs_type": "f16", "rhs_type": "f16", "acc_type": "f32", "zero_init": True}
    shape |= {"transpose_a": False, "transpose_b": False}
    neutral = {k: 0 for k in ("block_dim_x", "block_dim_y", "block_dim_z")}
    neutral |= {k: 0 for k in ("subgroup_m", "subgroup_n", "thread_m", "thread_n")}
    lines = []
    for tiles, warps, gflops in (((64, 64, 32), 4, 2.7e5), ((128, 256, 64), 8, 5.6e5)):
        point = dict(zip(("tile_m", "tile_n", "tile_k"), tiles, strict=True), **neutral)
        point |= {"pipeline": "Custom", "mma_kind": "none", "promote_operands": 1}
        point |= {"pipeline_depth": 3, "warps": warps, "group_m": 8}
        record = {"problem": "mm", "target": "cuda", "arch": "sm_90", "shape": shape}
        record |= {"point": point, "config": str(tiles), "gflops": gflops, "status": "ok"}
        lines.append(json.dumps(record))
    path = tmp_path / "tuning.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (landscape,) = load_landscapes(str(path))
    assert landscape.starting == [1]


def test_a_replay_history_is_the_files_other_problems_of_the_same_input_type():
    """`--history others`: each landscape's history is the file's other landscapes of its
    input type, their columns put in its own order by name (0 where one lacks a feature)."""
    from autosched.search.history import landscape_history

    def landscape(name, lhs, names, rows):
        features = np.asarray(rows, dtype=float)
        scores = np.arange(1.0, len(rows) + 1)
        return Landscape(name, features, scores, math.nan, [""] * len(rows), names, lhs_type=lhs)

    target = landscape("t", "f16", ["a", "b"], [[0, 0]] * 4)
    same = landscape("s", "f16", ["b", "c", "a"], [[1, 9, 2], [3, 9, 4], [5, 9, 6], [7, 9, 8]])
    other = landscape("o", "f32", ["a", "b"], [[0, 0]] * 4)
    ((rows, scores),) = landscape_history(target, [target, same, other])
    assert rows.tolist() == [[2, 1], [4, 3], [6, 5], [8, 7]] and scores.tolist() == [1, 2, 3, 4]
    result = CliRunner().invoke(
        simulate_command,
        [str(LANDSCAPE), "--tuner", "xgboost", "--n-trial", "8", "--seeds", "1"]
        + ["--history", "others"],
    )
    assert result.exit_code == 0, result.output
