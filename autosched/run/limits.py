"""A candidate's time limit that follows the work, and the run's memory of the configurations
that ran over it.

A candidate used to hold the device for the cfg's whole `run_timeout` (60 s) although its
problem's default ran in 0.1 ms (issue 49: two implicit-GEMM candidates of an EfficientNet
each held the H200 for a minute). Its check and its timing now stop at LIMIT_FACTOR times the
default's own work, with a floor for the fixed costs (loading the module, a tool's start),
never above `run_timeout`; and a configuration stopped so is not built again for the other
problems of its kind and element types in the run.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from autosched.measure.contract import MeasureSettings
from autosched.measure.timed_calls import LONG_CALL_S
from autosched.ops.base import Problem
from autosched.outputs.records import Trial

LIMIT_FACTOR = 20.0  # a candidate may take this many times the default's time
LIMIT_FLOOR_S = 1.0  # ... and at least this long, whatever the default's time
OVER_LIMIT = f"ran over {LIMIT_FACTOR:g}x the default's time"  # a stopped candidate's reason
# A candidate's compile may take this many times its default's, and at least this long (a
# loaded machine compiles slower; the cfg's compile_timeout stays the ceiling): on the H200's
# host, IREE 3.13 compiled resnet18's convolutions in 1-3 s, and some implicit-GEMM points
# for sm_90 for more than 600 s, each holding a compile slot for the whole compile_timeout.
COMPILE_FACTOR = 10.0
COMPILE_FLOOR_S = 30.0


def timed_calls(call_s: float, repetitions: int, min_time: float) -> int:
    """The calls one timing makes at `call_s` a call: a warm-up of at least `min_time`, then
    `repetitions` of at least `min_time` each, every one at least one call, or one of a call
    of LONG_CALL_S or more (the worker's `timed_calls.time_calls`; iree-benchmark-module
    warms up and repeats alike, a long call too, which the limit's factor covers)."""
    if call_s >= LONG_CALL_S:  # one such call is a sample: one repetition after the warm-up
        return 2
    per_repetition = max(1, math.ceil(min_time / call_s)) if call_s > 0 else 1
    return (1 + repetitions) * per_repetition


def run_limit(
    default_ms: float,
    dispatches_per_call: int,
    settings: MeasureSettings,
    default_step_s: float | None = None,
    factor: float = LIMIT_FACTOR,
    floor_s: float = LIMIT_FLOOR_S,
) -> float:
    """Seconds a candidate's check or timing may run: max(floor, factor x the default's time
    per call x the calls the timing makes), never above the cfg's `run_timeout`. Where the
    default's own check or timing took longer (`default_step_s`: a check loads the module
    and compares the answer, iree-benchmark-module starts a process), factor x that.
    `default_ms` is per dispatch, as records hold it."""
    call_s = default_ms * dispatches_per_call / 1e3
    work_s = call_s * timed_calls(call_s, settings.repetitions, settings.min_time)
    work_s = max(work_s, default_step_s or 0.0)
    return min(settings.run_timeout, max(floor_s, factor * work_s))


def candidate_limit(baseline: Trial | None, repeat: int, settings: MeasureSettings) -> float | None:
    """The limit of a problem's candidates from its default's record; None (the cfg's
    `run_timeout`) when the default did not run or the limit would not be shorter."""
    if baseline is None or not baseline.ok or not baseline.median_ms:
        return None
    # The check's own steps where the worker ran it: its `verify_s` also holds the worker's
    # start (importing IREE, opening the device), which a candidate's limit never waits for.
    phases = baseline.verify_phases
    check_s = sum(phases.values()) if phases else baseline.verify_s
    step_s = max(check_s or 0.0, baseline.timing_s or 0.0)
    limit = run_limit(baseline.median_ms, repeat, settings, step_s)
    return limit if limit < settings.run_timeout else None


def compile_limit(baseline: Trial | None, compile_timeout: float) -> float | None:
    """Seconds a problem's candidate may compile: COMPILE_FACTOR x its default's compile,
    at least COMPILE_FLOOR_S; None (the cfg's compile_timeout) without a timed compile of
    the default, or where that would not be shorter."""
    if baseline is None or not baseline.compile_s:
        return None
    limit = max(COMPILE_FLOOR_S, COMPILE_FACTOR * baseline.compile_s)
    return limit if limit < compile_timeout else None


def family_key(problem: Problem) -> tuple:
    """What a configuration's timeout carries over to: problems of the same kind and element
    types (the config name, which holds the point's tiles, is the rest of the key)."""
    shape = problem.record_shape()
    types = tuple(sorted((k, v) for k, v in shape.items() if k.endswith("_type")))
    return (problem.kind, types)


@dataclass
class TimedOut:
    """The configurations whose check or timing timed out in this run, by family: none is
    built again for the other problems of its family (`family_key`); run.log says so."""

    where: dict[tuple, str] = field(default_factory=dict)  # (config, family) -> problem name
    lock: threading.Lock = field(default_factory=threading.Lock)

    def remember(self, problem: Problem, trial: Trial) -> None:
        """Notes a candidate whose compile, check or timing timed out: a configuration
        that IREE compiles for ever on one convolution did on the others of its kind."""
        if trial.baseline or trial.status != "timeout":
            return
        with self.lock:
            self.where.setdefault((trial.config, family_key(problem)), problem.name)

    def earlier(self, problem: Problem, config: str) -> str | None:
        """The problem on which `config` timed out in this run (None: none did)."""
        with self.lock:
            found = self.where.get((config, family_key(problem)))
        return found if found != problem.name else None


def not_tried(earlier: str) -> str:
    """Why a configuration is not tried: it timed out on `earlier`, a problem of its family."""
    return f"not tried: it timed out on {earlier} in this run"
