"""Records keep enough of a problem to rebuild it: replays and re-timing depend on that."""

from __future__ import annotations

from conftest import BATCH, TRANSPOSED_B, matmul_function

from autosched.ops.matmul import analyze_file
from autosched.outputs.records import problem_from_shape, problem_shape


def test_a_problem_rebuilt_from_its_record_is_the_same_problem(write_module):
    analysis = analyze_file(
        write_module(matmul_function("f", 64, 32, 48, "f16", "f32") + TRANSPOSED_B + BATCH)
    )
    assert len(analysis.problems) == 3
    for problem in analysis.problems:
        rebuilt = problem_from_shape(problem_shape(problem))
        assert rebuilt.name == problem.name
        assert rebuilt.indexing_maps == problem.indexing_maps  # what the kernel module prints
        assert (rebuilt.lhs_shape, rebuilt.rhs_shape) == (problem.lhs_shape, problem.rhs_shape)
