"""A problem's search under the limits the custom route gives it: the mode's trials (fast
mode's 8, not n_trial) and the run's time budget, which ends a search after its first batch.
Real searches on the CPU (iree-compile, local-task), one small matmul each."""

from __future__ import annotations

import time

from autosched.config import RunConfig
from autosched.drivers.campaign import FAST_TRIALS, trials_per_problem
from autosched.ops.matmul import MatmulProblem
from autosched.outputs.records import TuningDatabase
from autosched.run.problem import Progress
from autosched.run.tuning import Tuning
from autosched.targets.cpu import CpuTarget

PROBLEM = MatmulProblem.from_shape(
    {"op": "linalg.matmul", "m": 64, "n": 64, "k": 64, "batch": 0, "lhs_type": "f32",
     "rhs_type": "f32", "acc_type": "f32", "transpose_a": False, "transpose_b": False,
     "zero_init": True}
)  # fmt: skip


def _search(tmp_path, **limits) -> tuple[int, str]:
    """New trials of one search (n_trial 6, batches of 2) and its run.log."""
    config = RunConfig(
        target="cpu", work_dir=str(tmp_path / "work"), jobs=2, tuner="random", batch_size=2,
        n_trial=6, repetitions=2, min_time=0.01, retime_top=1, time_on="kernel",
        starting_points="none",
    )  # fmt: skip
    tuning = Tuning(config, CpuTarget(config), resume=False)
    try:
        tuning.search_problem(PROBLEM, Progress(), **limits)
    finally:
        tuning.close()
    records = TuningDatabase(config.database).records()
    return len([r for r in records if not r.baseline]), open(config.log_file).read()


def test_the_mode_sets_a_searchs_trials():
    assert trials_per_problem("fast", 32) == FAST_TRIALS
    assert trials_per_problem("normal", 32) == 32
    assert trials_per_problem("extreme", 32) > 32


def test_a_search_takes_the_trials_it_is_given(tmp_path):
    measured, _ = _search(tmp_path, trials=3)
    assert measured == 3  # not n_trial's 6


def test_a_past_deadline_ends_a_search_after_its_first_batch(tmp_path):
    measured, log = _search(tmp_path, deadline=time.perf_counter() - 1)
    assert measured == 2  # one batch
    assert "the time budget ended its search" in log
