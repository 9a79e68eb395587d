"""Search spaces: constraints drop what cannot work, and the counts add up."""

from __future__ import annotations

from conftest import matmul_function

from autosched.config import RunConfig
from autosched.ops.matmul import analyze_file
from autosched.search.space import build_space
from autosched.targets.cpu import CpuTarget


def problem_of(write_module, m=64, n=64, k=64):
    return analyze_file(write_module(matmul_function("f", m, n, k))).problems[0]


def test_constraints_filter_and_counts_add_up(write_module):
    problem = problem_of(write_module, 64, 48, 32)
    target = CpuTarget(RunConfig())
    lists = {
        "tile_m": [16, 24, 32],
        "tile_n": [16, 48],
        "vec_m": [4, 8],
        "vec_n": [16, 32],
        "vec_k": [1, 3, 4],
    }
    space = build_space(problem, target, lists)
    assert space.total == 3 * 2 * 2 * 2 * 3
    assert len(space.points) + sum(space.rejected.values()) == space.total
    assert space.rejected["tile_m does not divide M"] == 1 * 2 * 2 * 2 * 3  # tile_m = 24
    assert space.rejected["vec_k does not divide K"] > 0  # vec_k = 3
    for point in space.points:
        assert 64 % point["tile_m"] == 0 and 48 % point["tile_n"] == 0
        assert point["tile_m"] % point["vec_m"] == 0 and point["tile_n"] % point["vec_n"] == 0
        assert 32 % point["vec_k"] == 0
    assert space.generated == []


def test_left_out_knobs_are_generated_from_the_problem(write_module):
    problem = problem_of(write_module, 48, 64, 64)
    space = build_space(problem, CpuTarget(RunConfig()), {"vec_k": [1]})
    assert "vec_k" not in space.generated and "tile_m" in space.generated
    assert 16 in space.knob_values["tile_m"] and 12 in space.knob_values["tile_m"]  # 12 divides 48
    assert max(space.knob_values["tile_m"]) <= 48
    assert space.points


def test_oversized_vector_tiles_are_rejected(write_module):
    problem = problem_of(write_module)
    lists = {"tile_m": [64], "tile_n": [64], "vec_m": [16], "vec_n": [16, 32], "vec_k": [8, 16]}
    space = build_space(problem, CpuTarget(RunConfig()), lists)
    assert [p["vec_m"] * p["vec_n"] * p["vec_k"] for p in space.points] == [16 * 16 * 8]
    assert sum(space.rejected.values()) == 3


def test_custom_blocks_larger_than_the_problem_have_features(write_module):
    """A custom kernel's block may overhang M (16 rows, blocks of 32 and 64): every point of
    the space still has finite features, so the cost model can be built (a 0-workgroup log
    failed on the H200). A skinny problem gets blocks of 16-64 rows and 32-256 columns; a
    large one 64-256 of each."""
    import math

    from autosched.run.tuning import feature_matrix
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    problem = analyze_file(write_module(matmul_function("f", 16, 4096, 4096, "f16"))).problems[0]
    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    lists = {"pipeline": ["TileAndFuse", "VectorDistribute", "Custom"]}
    space = build_space(problem, target, lists)
    custom = [p for p in space.points if not target.in_spec(p)]
    assert {p["tile_m"] for p in custom} == {16, 32, 64}
    assert {p["tile_n"] for p in custom} == {32, 64, 128, 256}
    big = analyze_file(write_module(matmul_function("b", 4096, 4096, 4096, "f16"))).problems[0]
    big_custom = [p for p in build_space(big, target, lists).points if not target.in_spec(p)]
    assert {p["tile_m"] for p in big_custom} == {p["tile_n"] for p in big_custom} == {64, 128, 256}
    # Split-K for skinny problems, in shares of whole blocks of K (a narrow C's shares add
    # up in an f32 workspace); never for IREE's points.
    assert {p["split_k"] for p in custom} == {1, 2, 4, 8}
    assert {p["split_k"] for p in big_custom} == {1}
    assert all(problem.k % (p["split_k"] * p["tile_k"]) == 0 for p in custom)
    assert {p["split_k"] for p in space.points if target.in_spec(p)} == {0}
    narrow = analyze_file(write_module(matmul_function("h", 16, 4096, 4096, "f16", "f16")))
    narrow_space = build_space(narrow.problems[0], target, lists).points
    assert {p["split_k"] for p in narrow_space if not target.in_spec(p)} == {1, 2, 4, 8}
    assert all(math.isfinite(v) for v in feature_matrix(problem, target, space.points).flat)


def test_the_targets_known_good_points_are_found_in_the_space(write_module):
    """CUDA's starting points: Triton's tuned list for the custom family first, each matching
    one custom point, then IREE's mma configurations; none where the space lacks them (an
    f32 problem has no mma points)."""
    from autosched.kernels.matmul_triton.space import CUSTOM_STARTING, SKINNY_STARTING
    from autosched.search.space import matching_points
    from autosched.targets.cuda import IREE_MMA_STARTING, CudaTarget
    from autosched.targets.host import Machine

    problem = analyze_file(write_module(matmul_function("f", 4096, 4096, 4096, "f16"))).problems[0]
    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    with_custom = build_space(problem, target, {"pipeline": ["TileAndFuse", "Custom"]})
    found = matching_points(with_custom.points, target.starting_points(problem))
    custom = found[: len(CUSTOM_STARTING)]
    blocks = [
        tuple(with_custom.points[i][k] for k in ("tile_m", "tile_n", "tile_k")) for i in custom
    ]
    assert blocks == [values[:3] for values in CUSTOM_STARTING]
    assert all(not target.in_spec(with_custom.points[i]) for i in custom)
    # Only the TileAndFuse entry of IREE's list is in a space without VectorDistribute.
    assert [with_custom.points[i]["pipeline"] for i in found[len(CUSTOM_STARTING) :]] == [
        "TileAndFuse"
    ]
    iree_only = build_space(problem, target, {"pipeline": ["TileAndFuse", "VectorDistribute"]})
    found = matching_points(iree_only.points, target.starting_points(problem))
    shapes = [
        tuple(iree_only.points[i][k] for k in ("pipeline", "tile_m", "tile_n", "tile_k"))
        for i in found
    ]
    # The skinny entry's 16-row tile is generated for problems of few rows only.
    assert shapes == [values[:4] for values in IREE_MMA_STARTING[:-1]]
    skinny = analyze_file(write_module(matmul_function("s", 16, 4096, 4096, "f16"))).problems[0]
    space = build_space(skinny, target, {"pipeline": ["TileAndFuse", "VectorDistribute"]})
    found = matching_points(space.points, target.starting_points(skinny))
    assert (space.points[found[0]]["tile_m"], space.points[found[0]]["tile_n"]) == (16, 32)
    # A skinny problem's custom points start from the skinny list, which a large one lacks.
    lists = {"pipeline": ["TileAndFuse", "Custom"]}
    space = build_space(skinny, target, lists)
    found = matching_points(space.points, target.starting_points(skinny))
    knobs = ("tile_m", "tile_n", "tile_k", "warps", "pipeline_depth", "split_k")
    points = [tuple(space.points[i][k] for k in knobs) for i in found]
    assert points[: len(SKINNY_STARTING)] == list(SKINNY_STARTING)
    f32 = analyze_file(write_module(matmul_function("g", 512, 512, 512, "f32"))).problems[0]
    simt = build_space(f32, target, {"pipeline": ["TileAndFuse", "VectorDistribute"]})
    assert matching_points(simt.points, target.starting_points(f32)) == []


def test_cpu_tiles_fit_dimensions_under_eight():
    """ONNX's Gemm and MatMul node tests have M or N under 8: the CPU target proposes tiles
    that fit them, instead of none (issue 26)."""
    from autosched.config import RunConfig
    from autosched.ops.matmul import MatmulProblem
    from autosched.targets.cpu import CpuTarget

    problem = MatmulProblem(
        "linalg.matmul",
        3,
        4,
        5,
        0,
        "f32",
        "f32",
        "f32",
        False,
        False,
        True,
        "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, "
        "affine_map<(d0, d1, d2) -> (d0, d1)>]",
    )
    space = build_space(problem, CpuTarget(RunConfig()), {})
    assert space.points
    assert {p["tile_m"] for p in space.points} == {3} and 4 in {p["tile_n"] for p in space.points}


def test_the_shipped_example_measures_the_cpus_known_good_points_first():
    """Issue 26 item 1: the quick start's first candidates are the CPU target's known-good
    points (1.4-1.55x IREE's default on the recorded landscapes), in the shipped cfg's space
    for the shipped example, so a newcomer's first run finds a win that stands clear of a
    small machine's noise without luck."""
    import os

    from autosched.config import load_config
    from autosched.search.space import matching_points

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = load_config(os.path.join(root, "auto-scheduler.cfg"))
    (problem,) = analyze_file(os.path.join(root, config.input_file)).problems
    assert (problem.m, problem.n, problem.k) == (256, 1024, 512)
    target = CpuTarget(config)
    space = build_space(problem, target, config.knob_space)
    found = matching_points(space.points, target.starting_points(problem))
    assert len(found) == len(target.starting_points(problem)) == 2
