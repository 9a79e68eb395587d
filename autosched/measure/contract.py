"""The measuring seam, written down: what the search loop hands an executor (candidates and
their compile jobs, tasks), what comes back (measurements), and what every executor and every
bench provides, whether it runs here (`local`) or on a Ray cluster (`ray`)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from autosched.compile import CompileJob, CompileResult
from autosched.errors import UserError
from autosched.measure.benchmark_tool import Timing
from autosched.measure.worker import ProblemData
from autosched.ops.base import Problem
from autosched.targets.base import Point

CHECK, TIMED = "check", "timed"  # a candidate's builds: the one checked, the one timed


@dataclass
class DispatchCheck:
    """IREE's default answer on one dispatch, for seeded inputs: what candidates must give."""

    entry: object  # module_io.EntryFunction of the check module
    inputs: list[str]  # --input values
    reference: list[np.ndarray]  # the default build's outputs
    folder: str  # where inputs and outputs live


@dataclass(frozen=True)
class MeasureSettings:
    """How long and how often to time, from the cfg's [Benchmark] and [Env]."""

    repetitions: int
    min_time: float
    run_timeout: float
    timer: str  # tool | worker


@dataclass
class Candidate:
    """One point to measure and the modules it needs: `jobs[CHECK]` and `jobs[TIMED]`
    (the same job when the checked module is the timed one)."""

    name: str
    point: Point | None
    jobs: dict[str, CompileJob]


@dataclass
class MeasureTask:
    """What a bench needs to check and time one compiled candidate (picklable, so that it
    can travel to a Ray actor)."""

    problem: Problem
    check_module: str
    timed_module: str
    data: ProblemData
    repeat: int  # dispatches per timed call
    settings: MeasureSettings
    check: DispatchCheck | None = None  # check on IREE's dispatch, not the bare kernel
    benchmark_function: str | None = None  # time IREE's dispatch benchmark, not the kernel
    # A dispatch slower than this (ms) cannot win: the worker times it once, not
    # `repetitions` times (None: every candidate gets every repetition).
    slow_ms: float | None = None
    # What the bench does, in order: check then time; or one of them (fast mode times
    # first and checks only a candidate that can still win: run/timed_first.py).
    steps: tuple[str, ...] = (CHECK, TIMED)


@dataclass
class Measurement:
    """A bench's outcome for one task; `status` is ok or the first failure."""

    device: str
    status: str = "ok"
    message: str = ""
    verification: str = ""
    max_error: float | None = None
    verify_s: float | None = None
    verify_phases: dict[str, float] = field(default_factory=dict)  # Verification.phases
    timing: Timing | None = None
    timing_s: float | None = None


class BenchContract(Protocol):
    """One device's measuring station, local (`local.Bench`) or an actor's (`ray.RemoteBench`).

    Whatever runs a module runs it here, on the bench's own device: the driver may not see
    that device at all (a Ray actor's `ray:cuda#0` is no IREE device of the driver's host).
    """

    device: str  # the name its records carry

    def run(self, task: MeasureTask) -> Measurement:
        """Checks, then times, one compiled candidate."""

    def reference_outputs(
        self, module: str, entry: object, inputs: list[str], folder: str, timeout: float
    ) -> list[np.ndarray]:
        """The outputs of `module`'s `entry` (a module_io.EntryFunction) on `inputs` (--input
        values), run on this bench's device: IREE's default answer on a dispatch, which
        candidates are then checked against (`DispatchCheck`). Outputs are written under
        `folder`. Raises module_io.RunFailed when the module cannot run."""

    def time(
        self,
        module: str,
        data: ProblemData,
        repeat: int,
        settings: MeasureSettings,
        repetitions: int | None = None,
        benchmark_function: str | None = None,
        slow_ms: float | None = None,
    ) -> Timing:
        """Time per dispatch of a module (the default's, a finalist's)."""


# The executor's two callbacks: what a compiled candidate becomes (a task, or None when a
# build failed), and what to do with each finished candidate (in the calling thread).
Prepare = Callable[[Candidate, dict[str, CompileResult]], "MeasureTask | None"]
Done = Callable[[Candidate, dict[str, CompileResult], "Measurement | None"], None]


class Executor(Protocol):
    """What the search loop needs from an executor (LocalExecutor, ray.RayExecutor)."""

    events: list[str]  # notes for the run log (an actor lost, ...), drained by the caller
    benches: list  # one per device, the primary first: each re-times problems alone

    @property
    def primary(self) -> BenchContract:
        """Measures each problem's default first and re-times the finalists."""

    @property
    def devices(self) -> list[str]:
        """The names of the benches, the primary first (what records name)."""

    def run(self, candidates: list[Candidate], prepare: Prepare, done: Done) -> None:
        """Compiles and measures a batch; `done` is called once per candidate, here."""

    def time_others(
        self,
        module: str,
        data: ProblemData,
        repeat: int,
        settings: MeasureSettings,
        benchmark_function: str | None,
    ) -> dict[str, Timing]:
        """The module timed on every bench but the primary (each device's own default)."""

    def busy(self) -> dict[str, float]:
        """Seconds each bench spent checking and timing so far (the rest, it waited)."""

    def close(self) -> None:
        """Stops the benches."""


def builds_of(candidates: Iterable[Candidate]) -> list[CompileJob]:
    """Every distinct compile job of a batch, once."""
    return list({job.output: job for c in candidates for job in c.jobs.values()}.values())


@dataclass
class PendingBuilds:
    """Builds of candidates whose jobs are not all finished yet."""

    by_output: dict[str, list[Candidate]] = field(default_factory=dict)
    builds: dict[str, dict[str, CompileResult]] = field(default_factory=dict)

    def add(self, candidates: list[Candidate]) -> None:
        for candidate in candidates:
            for job in set(j.output for j in candidate.jobs.values()):
                self.by_output.setdefault(job, []).append(candidate)

    def finished(self, result: CompileResult) -> list[tuple[Candidate, dict[str, CompileResult]]]:
        """The candidates this build completes, with all their builds by role."""
        ready = []
        for candidate in self.by_output.pop(result.job.output, []):
            got = self.builds.setdefault(candidate.name, {})
            for role, job in candidate.jobs.items():
                if job.output == result.job.output:
                    got[role] = result
            if len(got) == len(candidate.jobs):
                ready.append((candidate, self.builds.pop(candidate.name)))
        return ready


def measure_settings(config, target) -> MeasureSettings:
    """How long and how often to time, with `timer = auto` resolved (`auto_timer`)."""
    timer = auto_timer(config.mode, target) if config.timer == "auto" else config.timer
    repetitions = config.first_pass_repetitions
    return MeasureSettings(repetitions, config.repetition_s, config.run_timeout, timer)


def auto_timer(mode: str, target) -> str:
    """`timer = auto`: the worker in fast mode, else the target's choice. On the CPU the
    worker costs about half the tool's wall time a timing (no process, module load and
    warm-up per candidate: resnet18's fast run 65 s -> 56 s), and fast mode's first pass only
    screens; the paired re-timing, in the same timer, names the winner."""
    return "worker" if mode == "fast" else target.default_timer


# `runtime_flags = auto`: each target's. On CUDA, IREE's caching allocator: by default its
# driver allocates a call's transients from a stream-ordered pool that gives its memory back
# at every wait; through the caching device allocator they are kept, as torch's caching
# allocator keeps them and a server would run the model (a call that adds 1024 floats: 147
# us -> 35 us on the H200, benchmarks/results/h200_models/call_overhead.md).
TARGET_RUNTIME_FLAGS = {"cuda": "--cuda_async_allocations=false --device_allocator=caching"}


# `runtime_flags = auto`: the flag sets the whole-model proof tries on the build it reports,
# keeping the fastest for every build (proof.py). On CUDA the caching allocator took a call
# that adds 1024 floats from 147 to 35 us, but the Llama-3-8B layer's custom build spent
# 0.35 ms less of each call in IREE's runtime with IREE's own defaults (through its Python
# runtime, benchmarks/results/h200_models/transformers_session25.md). A call of hundreds of
# small dispatches (a causal LM's decode step: about 300) may launch faster as one CUDA
# graph (`--cuda_use_streams=false`) than stream launch by launch.
TARGET_RUNTIME_CHOICES = {
    "cuda": (
        TARGET_RUNTIME_FLAGS["cuda"],
        "",
        f"{TARGET_RUNTIME_FLAGS['cuda']} --cuda_use_streams=false",
    )
}


def runtime_flag_choices(config) -> tuple[tuple[str, ...], ...]:
    """The flag sets the proof chooses from (none unless `runtime_flags = auto` and the
    target has several)."""
    if config.runtime_flags.strip() != "auto":
        return ()
    return tuple(tuple(shlex.split(t)) for t in TARGET_RUNTIME_CHOICES.get(config.target, ()))


# IREE's fusion of more producers and consumers into one dispatch: a layer norm's two
# reductions (and the residual add before them) become one dispatch where they are two.
AGGRESSIVE_FUSION = "--iree-dispatch-creation-enable-aggressive-fusion=true"
FUSION_CHOICES = {"default": ((),), "aggressive": ((AGGRESSIVE_FUSION,),)}
FUSION_CHOICES["choose"] = (*FUSION_CHOICES["default"], *FUSION_CHOICES["aggressive"])
TARGET_FUSION = {"cuda": "choose"}  # `dispatch_fusion = auto`: the target's; else default


def fusion_choices(config) -> tuple[tuple[str, ...], ...]:
    """The compile flag sets the proof builds its reported build with (`dispatch_fusion`):
    one is applied; of two, the faster is kept."""
    setting = config.dispatch_fusion
    if setting == "auto":
        setting = TARGET_FUSION.get(config.target, "default")
    return FUSION_CHOICES[setting]


def runtime_flags_text(config) -> str:
    """The runtime flags a run uses, as the cfg would spell them (`auto` resolved)."""
    if config.runtime_flags.strip() == "auto":
        return TARGET_RUNTIME_FLAGS.get(config.target, "")
    return config.runtime_flags


def runtime_flags(config) -> tuple[str, ...]:
    """The cfg's `runtime_flags` (`auto`: the target's). A flag IREE's runtime does not know
    is the user's error, found by parsing them in a throwaway interpreter (flags are global
    to a process)."""
    text = runtime_flags_text(config)
    if not text:
        return ()
    try:
        flags = tuple(shlex.split(text))
    except ValueError as error:
        raise UserError(f"runtime_flags = {text}: {error}") from None
    check = "import sys, iree.runtime as r\nr.flags.parse_flags(*sys.argv[1:])"
    finished = subprocess.run(
        [sys.executable, "-c", check, *flags], capture_output=True, text=True, timeout=120
    )
    if finished.returncode != 0:
        reason = (finished.stderr.strip().splitlines() or ["not accepted"])[-1]
        raise UserError(f"runtime_flags = {text}: {reason[:200]}")
    return flags
