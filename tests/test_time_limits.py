"""A candidate's time limit follows its default's time (issue 49): the formula, the in-run
memory of configurations that timed out, and a real run whose candidates hang in
iree-benchmark-module (the wrapper of test_faults.py) stopped within the computed limit."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest
from conftest import matmul_function
from test_faults import HANG_BENCHMARK, Run, assert_clean_stderr, real_benchmark

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.measure.contract import MeasureSettings
from autosched.ops.matmul import MatmulProblem
from autosched.outputs.records import Trial
from autosched.run.limits import (
    COMPILE_FACTOR,
    COMPILE_FLOOR_S,
    LIMIT_FACTOR,
    OVER_LIMIT,
    TimedOut,
    candidate_limit,
    compile_limit,
    run_limit,
    timed_calls,
)
from autosched.targets.cpu import CpuTarget

SETTINGS = MeasureSettings(repetitions=5, min_time=0.05, run_timeout=60.0, timer="worker")


def test_the_calls_a_timing_makes_are_its_warm_up_and_repetitions():
    assert timed_calls(1e-4, 5, 0.05) == 6 * 500  # 0.1 ms calls fill each 50 ms
    assert timed_calls(0.5, 5, 0.05) == 6  # a call longer than min_time: one per repetition
    assert timed_calls(2.0, 5, 0.05) == 2  # a call over a second is a sample of its own
    assert timed_calls(1e-4, 1, 0.0) == 2


def test_a_call_of_a_second_or_more_is_timed_once(monkeypatch):
    """The worker's timing keeps one repetition of a call that long (IREE's attention at 197
    tokens: 3.7 s a call of its module), and every repetition of a shorter one."""
    from autosched.measure import timed_calls as timing

    monkeypatch.setattr(timing, "LONG_CALL_S", 0.03)
    long_calls, short_calls = [], []
    samples = timing.time_calls(lambda: (long_calls.append(1), time.sleep(0.04)), [], 3, 0.0)
    assert len(samples) == 1 and len(long_calls) == 2  # the warm-up and one repetition
    samples = timing.time_calls(lambda: (short_calls.append(1), time.sleep(0.005)), [], 3, 0.0)
    assert len(samples) == 3 and len(short_calls) == 4


def test_the_limit_is_twenty_times_the_defaults_work_with_a_floor_and_a_ceiling():
    # A 0.1 ms default: a timing takes 6 x 50 ms, a candidate may take 20x that.
    assert run_limit(0.1, 1, SETTINGS) == pytest.approx(LIMIT_FACTOR * 0.3)
    # Dispatches per call multiply the call's time (the default's time is per dispatch): a
    # call of a second is timed once after its warm-up.
    assert run_limit(100.0, 10, SETTINGS) == pytest.approx(20 * 2 * 1.0)
    assert run_limit(40.0, 10, SETTINGS) == pytest.approx(min(60.0, 20 * 6 * 0.4))
    quick = MeasureSettings(repetitions=1, min_time=0.0, run_timeout=60.0, timer="tool")
    assert run_limit(0.01, 1, quick) == 1.0  # the floor: loading a module takes its time
    assert run_limit(0.01, 1, quick, floor_s=0.5) == 0.5
    assert run_limit(5000.0, 1, SETTINGS) == 60.0  # never above run_timeout
    # A check that took the default 0.4 s (a whole model's) lets a candidate's take 8 s.
    assert run_limit(0.01, 1, quick, default_step_s=0.4) == pytest.approx(8.0)


def trial(config: str, status: str = "ok", verification: str = "correct", **fields) -> Trial:
    values = dict(
        problem="p",
        target="cpu",
        arch="",
        config=config,
        point={},
        baseline=config == "iree_default",
        status=status,
        verification=verification,
    )
    return Trial(**{**values, **fields})


def test_a_problems_limit_comes_from_its_defaults_record():
    default = trial("iree_default", median_ms=0.1, verify_s=0.05)
    assert candidate_limit(default, 1, SETTINGS) == pytest.approx(6.0)
    assert candidate_limit(trial("iree_default", status="timeout"), 1, SETTINGS) is None
    assert candidate_limit(None, 1, SETTINGS) is None
    slow = trial("iree_default", median_ms=4000.0)  # 20x would pass run_timeout: no limit
    assert candidate_limit(slow, 1, SETTINGS) is None
    # A check in the worker counts its own steps, not the worker's start-up before them.
    started = trial("iree_default", median_ms=0.1, verify_s=5.0, verify_phases={"run": 0.4})
    assert candidate_limit(started, 1, SETTINGS) == pytest.approx(8.0)
    # A timing through iree-benchmark-module that took the default 0.5 s: 10 s.
    tool = trial("iree_default", median_ms=0.1, verify_s=0.05, timing_s=0.5)
    assert candidate_limit(tool, 1, SETTINGS) == pytest.approx(10.0)


def test_a_candidates_compile_limit_follows_its_defaults_compile(tmp_path):
    assert compile_limit(trial("iree_default", compile_s=2.0), 120.0) == COMPILE_FLOOR_S
    assert compile_limit(trial("iree_default", compile_s=5.0), 120.0) == 5.0 * COMPILE_FACTOR
    assert compile_limit(trial("iree_default", compile_s=20.0), 120.0) is None  # the cfg's
    assert compile_limit(trial("iree_default"), 120.0) is None  # no compile timed
    # A job's own limit stops a real iree-compile before the pool's.
    (tmp_path / "mm.mlir").write_text(matmul_function("mm", 512, 512, 512))
    flags = CpuTarget(RunConfig()).compile_flags()
    job = CompileJob(str(tmp_path / "mm.mlir"), str(tmp_path / "mm.vmfb"), flags, timeout=0.01)
    stopped = compile_one(job, 120)
    assert (stopped.status, stopped.message) == ("timeout", "over 0.01 s")
    assert compile_one(replace(job, timeout=None), 120).status == "ok"


MAPS = "[affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (k, n)>, affine_map<(m, n, k) -> (m, n)>]"


def matmul(m: int, n: int, k: int, element: str = "f32") -> MatmulProblem:
    return MatmulProblem(
        "linalg.matmul", m, n, k, 0, element, element, "f32", False, False, True, MAPS
    )


def test_a_timed_out_configuration_is_remembered_for_its_family_only():
    memory = TimedOut()
    first, same_family, other_types = (
        matmul(64, 64, 64),
        matmul(128, 64, 256),
        matmul(64, 64, 64, "f16"),
    )
    memory.remember(first, trial("slow", "timeout", message=OVER_LIMIT))
    memory.remember(first, trial("hung_compile", "timeout", verification=""))  # a compile's
    memory.remember(first, trial("failed_compile", "compile_error", verification=""))
    memory.remember(first, trial("wrong", "wrong_answer"))
    assert memory.earlier(same_family, "slow") == first.name
    assert memory.earlier(first, "slow") is None  # its own problem measured it already
    assert memory.earlier(other_types, "slow") is None
    # IREE 3.13 compiled some sm_90 implicit-GEMM points for ever on every convolution.
    assert memory.earlier(same_family, "hung_compile") == first.name
    assert memory.earlier(same_family, "failed_compile") is None
    assert memory.earlier(same_family, "wrong") is None


TWO_MATMULS = matmul_function("first", 64, 64, 64) + matmul_function("second", 64, 64, 128)


@pytest.mark.slow
def test_a_hung_timing_stops_at_its_limit_and_its_family_does_not_try_it_again(tmp_path):
    """Candidates that hang in iree-benchmark-module are stopped at the limit the run
    computed from the default (not the cfg's 30 s), recorded as timeouts with the reason,
    and the same configurations are not built for the second matmul of the module."""
    run = Run(tmp_path)
    (tmp_path / "mm.mlir").write_text(TWO_MATMULS)
    run.configure(n_trial=2, run_timeout=30)
    run.wrap("AUTOSCHED_IREE_BENCHMARK_MODULE", HANG_BENCHMARK, real_benchmark())
    started = time.time()
    done = run.run()
    took = time.time() - started
    assert done.returncode == 0, done.stderr
    assert_clean_stderr(done.stderr)
    log = run.path("generated/mm/run.log").read_text()
    limits = [float(s) for s in re.findall(r"check or timing stops after ([\d.]+) s", log)]
    assert limits and all(1.0 <= limit < 30 for limit in limits), limits
    records = run.records()
    tuned = [r for r in records if not r["baseline"]]
    assert len({r["problem"] for r in tuned}) == 1, tuned  # the second problem built none
    assert [r["status"] for r in tuned] == ["timeout", "timeout"]
    assert all(r["message"].startswith(OVER_LIMIT) for r in tuned), tuned[0]["message"]
    assert all(r["timing_s"] <= max(limits) + 3 for r in tuned), [r["timing_s"] for r in tuned]
    assert took < 60 + 2 * max(limits)  # two hung timings of 30 s would not fit with the rest
    skipped = re.findall(r"^\S+: (\S+) not tried: it timed out on (\S+) in this run$", log, re.M)
    assert sorted(c for c, _ in skipped) == sorted(r["config"] for r in tuned), log
    rows = [r for r in run.rows() if r["status"] == "timeout"]
    assert len(rows) == 4  # the CSV shows the two not tried beside the two stopped
    assert "where the time went" in done.stdout and "candidates: " in done.stdout
    run.assert_no_leftovers()
