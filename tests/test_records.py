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


def test_records_and_summaries_are_strict_json_when_numbers_overflow(tmp_path):
    """Issue 27 item 11: a default build that overflows gives inf times and NaN errors;
    the database line and the summary hold null there, never a bare NaN or Infinity."""
    import json

    import pytest

    from autosched.drivers.campaign import CampaignReport, write_summary
    from autosched.outputs.records import Trial, TuningDatabase

    def strict(text: str):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name}"))

    database = TuningDatabase(str(tmp_path / "db.jsonl"))
    trial = Trial("p", "cpu", "", "iree_default", {}, True, "ok", max_error=float("nan"))
    trial.median_ms, trial.samples_ms = float("inf"), [float("inf"), 1.0]
    database.append(trial)
    (line,) = open(tmp_path / "db.jsonl").read().splitlines()
    record = strict(line)
    assert record["max_error"] is None and record["samples_ms"] == [None, 1.0]
    proof = {"speedup": float("nan"), "max_error": float("inf"), "outputs_match": False}
    report = CampaignReport(budget=1, trials=1, mode="normal", search_s=float("inf"))
    path = write_summary(str(tmp_path / "s.json"), proof, report)
    assert strict(open(path).read())["model"]["speedup"] is None
