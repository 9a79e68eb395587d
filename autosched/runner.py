"""The tuning loop of one run: problem by problem, tuner -> manifest -> compile -> verify/time.

This is the only module that puts the pieces together; each piece stays ignorant of the
others (a tuner never sees a file, a target never runs a process).
"""

from __future__ import annotations

import itertools
import os
import queue
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TypeVar

import numpy as np

from autosched import processes
from autosched.analysis import Analysis, MatmulProblem
from autosched.applied import CONFIGS_FLAG, check_build, check_roots, roots_in
from autosched.builds import dispatch_job, expected_config, kernel_job
from autosched.compile import CompileJob, CompileResult, compile_all, compile_one
from autosched.config import RunConfig
from autosched.dispatch_bench import CHECK_FUNCTION, DispatchBenchmark
from autosched.history import database_history
from autosched.interrupts import critical
from autosched.manifest import variant_path
from autosched.measure import (
    CHECK,
    TIMED,
    Bench,
    Candidate,
    DispatchCheck,
    Executor,
    Measurement,
    MeasureTask,
    make_executor,
    measure_settings,
)
from autosched.records import (
    MeasureContext,
    Trial,
    TuningDatabase,
    iree_version,
    problem_shape,
)
from autosched.report import CsvReport, RunLog, table
from autosched.search import SearchState
from autosched.search import search as run_search
from autosched.search import step as search_step
from autosched.space import SearchSpace, build_space, matching_points
from autosched.spec import match_contraction
from autosched.targets.base import Point, Target
from autosched.tuners import History, make_tuner
from autosched.verify import ProblemData, make_problem_data

BASELINE = "iree_default"
SPEC_PROBE = "spec_probe"  # the build that checks, before a search, that a spec applies
CONFIG_PHASE = "executable-configurations"
# Marks the flags of records timed on IREE's dispatch, compiled from executable sources
# (records timed on the dispatch compiled from the input phase timed IREE's default on CUDA
# unit-batch matmuls: they are measured again, not resumed).
DISPATCH_FLAG = " [timed on the dispatch from executable sources]"
DRIFT_WARNING = 0.10  # flag a baseline that moved more than this between start and end
RETIME_ROUNDS = 3
# A candidate over this many times the default's first time is timed with one repetition
# in the worker: it cannot win, and its rank among losers needs no second sample.
SLOW_FACTOR = 2.0
Result = TypeVar("Result")


@dataclass
class ProblemResult:
    problem: MatmulProblem
    space: SearchSpace
    trials: list[Trial] = field(default_factory=list)
    baseline: Trial | None = None
    baseline_ms: float | None = None  # re-timed at the end, beside the top candidates
    best: Trial | None = None  # None when nothing correct beat the default
    best_ms: float | None = None
    search_s: float = 0.0
    resumed: int = 0
    timed_form: str = ""  # the root op as IREE configured it in the timed module
    default_ms: list[float] = field(default_factory=list)  # the default's timings in the search
    stopped: str = ""  # why the search stopped before its budget, when that is a warning

    @property
    def speedup(self) -> float | None:
        if self.best_ms and self.baseline_ms:
            return self.baseline_ms / self.best_ms
        return None

    @property
    def not_applied(self) -> int:
        """Candidates whose built module did not carry their configuration."""
        return sum(1 for t in self.trials if t.status == "not_applied")

    @property
    def drift(self) -> float | None:
        """The default's largest relative move from its first timing during the search."""
        first, *later = self.default_ms or [0.0]
        return max((abs(ms / first - 1) for ms in later), default=0.0) if first else None


class Progress:
    """Told about each problem and each finished trial; the CLI draws a bar from it."""

    def start(self, problem: MatmulProblem, total: int) -> None:
        pass

    def advance(self, trial: Trial) -> None:
        pass

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        """A warning the user should see (it is also in run.log)."""

    def start_model(self, label: str, total: int) -> None:
        """A model's problems are searched in turns: one display for all of them."""

    def retiming(self, problem: MatmulProblem, index: int, total: int) -> None:
        """Problem `index` of `total` is re-timed, after every search has ended."""


@dataclass
class ProblemSearch:
    """One problem's search in progress: its space, tuner, inputs, default and trials.

    Held apart from `Tuning` so that several problems can be searched in turns (a model's
    budget moves between them) with the same loop that tunes one problem to the end.
    """

    problem: MatmulProblem
    space: SearchSpace
    result: ProblemResult
    data: ProblemData
    repeat: int  # dispatches per timed call
    started: float
    state: SearchState | None = None  # the tuner's search; None: no valid point
    names: list[str] = field(default_factory=list)
    baseline_ms: float | None = None  # the default's first-pass time, for the CSV
    benchmark: DispatchBenchmark | None = None  # time on IREE's own dispatch, not the kernel
    check: DispatchCheck | None = None  # check answers on that dispatch, not the kernel
    context: MeasureContext | None = None  # what this problem's records depend on
    device_default_ms: dict[str, float] = field(default_factory=dict)  # each bench's default
    # Each bench's latest timing of the default: candidates are scored against it.
    reference_ms: dict[str, float] = field(default_factory=dict)

    @property
    def trials(self) -> list[Trial]:
        return self.result.trials

    @property
    def exhausted(self) -> bool:
        """Nothing left to propose (or no valid point at all)."""
        return self.state is None or self.state.exhausted

    @property
    def best_ms(self) -> float | None:
        """The fastest correct first-pass time so far, the default included."""
        times = [t.median_ms for t in [self.result.baseline, *self.trials] if t and t.ok]
        return min(times) if times else None


class Tuning:
    """One `autosched run`: shared state for all problems of the module."""

    def __init__(
        self,
        config: RunConfig,
        target: Target,
        resume: bool = True,
        executor: Executor | None = None,
    ):
        """`executor` measures the candidates (see measure.py); by default the one the cfg
        asks for: this host's devices, or a Ray cluster."""
        self.config = config
        self.target = target
        self.resume = resume
        self.jobs = config.jobs or os.cpu_count() or 1
        self.log = RunLog(config.log_file)
        self.database = TuningDatabase(config.database)
        self.csv = CsvReport(config.output_file, target.knob_names)
        self.version = iree_version()
        self.retimed: dict[tuple[str, str], float] = {}  # (problem, config) -> final median ms
        self.built: set[str] = set()  # modules compiled by this run (not left by another)
        self.settings = measure_settings(config, target)
        self.executor = executor or make_executor(config, target, self.jobs)
        self.devices = self.executor.devices
        self.context = MeasureContext(
            self.version,
            target.device,
            " ".join(target.compile_flags()),
            tuple(self.devices[1:]),
        )
        self.warned_unreadable = False
        # Problems searched at once: while one waits for its compiles and its tuner, another
        # keeps the devices measuring (two per device: at one per device plus one, two H200s
        # sat idle 25 % and 41 % of the time once a candidate took 0.3 s to measure). On the
        # CPU, compiles and timings share the cores.
        self.parallel = config.parallel_problems or (
            2 * len(self.devices) if target.timing_overlaps_compile else 1
        )
        self.lock = threading.RLock()  # records, the database and the executor's notes
        self.started = time.perf_counter()  # for the devices' busy share
        self.finished: list[ProblemResult] = []  # problems searched to the end, in that order
        # Told of every trial, new or resumed, after the database: the CSV and run.log (a
        # caller may add its own).
        self.recorders: list[Callable[[ProblemSearch, Trial], None]] = [
            self._to_csv,
            self._to_log,
        ]

    # ----- one candidate -------------------------------------------------------------

    def _source(self, problem: MatmulProblem, name: str) -> str:
        """Where a candidate's module (and, beside it, its builds) are written."""
        return os.path.abspath(variant_path(self.config.work_dir, problem, name))

    def _compile_job(
        self, problem: MatmulProblem, name: str, point: Point | None, repeat: int
    ) -> CompileJob:
        return kernel_job(problem, self.target, point, self._source(problem, name), repeat)

    @property
    def primary(self) -> Bench:
        """The bench that measures the default first and re-times the finalists."""
        return self.executor.primary

    def time_candidate(
        self,
        vmfb: str,
        data: ProblemData,
        repetitions: int,
        repeat: int,
        benchmark: DispatchBenchmark | None = None,
        bench: Bench | None = None,
    ):
        """Time per dispatch on `bench`, the primary device unless told (see `Bench.time`)."""
        return (bench or self.primary).time(
            vmfb,
            data,
            repeat,
            self.settings,
            repetitions,
            benchmark.function if benchmark else None,
        )

    def _dispatch_job(
        self, search: ProblemSearch, name: str, point: Point | None, check: bool = False
    ) -> CompileJob:
        stem = self._source(search.problem, name).removesuffix(".mlir")
        return dispatch_job(search.benchmark, search.problem, self.target, point, stem, check)

    def _prepare_check(self, search: ProblemSearch) -> None:
        """The default build's answer on the dispatch itself, to check candidates against.

        Without it (no check module, or the default fails on it) candidates are checked on
        the bare kernel against numpy.
        """
        from autosched.apply import EntryFunction, RunFailed, TensorSpec, make_inputs, run_outputs

        benchmark = search.benchmark
        if benchmark is None or not benchmark.check_source:
            return
        entry = EntryFunction(
            CHECK_FUNCTION,
            tuple(TensorSpec(shape, element) for shape, element in benchmark.check_inputs),
            tuple(TensorSpec(shape, element) for shape, element in benchmark.check_outputs),
        )
        folder = os.path.join(self.config.work_dir, "inputs", search.problem.name, "dispatch")
        inputs = make_inputs(entry, folder, seed=self.config.seed)
        built = compile_one(
            self._dispatch_job(search, BASELINE, None, check=True), self.config.compile_timeout
        )
        try:
            if built.status != "ok":
                raise RunFailed(built.message)
            reference = run_outputs(
                built.job.output,
                self.primary.device,
                entry,
                inputs,
                folder,
                self.config.run_timeout,
            )
        except RunFailed as error:
            self.log.write(
                f"the dispatch check could not run ({error}): answers checked on the kernel"
            )
            return
        search.check = DispatchCheck(entry, inputs, reference, folder)
        self.log.write(
            f"answers checked on the dispatch against IREE's default ({benchmark.check_source})"
        )

    def _candidate(self, search: ProblemSearch, name: str, point: Point | None) -> Candidate:
        """The modules one point needs: the one its answer is checked on, the one timed.

        The timed kernel repeats its dispatch; a kernel that accumulates into its input
        writes in place, so R repeats add the product R times: such problems are checked on
        a build without repeats. A model's problem is timed on IREE's dispatch and checked
        on the dispatch's check module (or, without one, on the bare kernel).
        """
        problem = search.problem
        if search.benchmark:
            timed = self._dispatch_job(search, name, point)
            if search.check is not None:
                check = self._dispatch_job(search, name, point, check=True)
            else:
                check = self._compile_job(problem, name, point, repeat=1)
        else:
            timed = self._compile_job(problem, name, point, search.repeat)
            in_place = search.repeat > 1 and not problem.zero_init
            check = self._compile_job(problem, name, point, repeat=1) if in_place else timed
        return Candidate(name, point, {CHECK: check, TIMED: timed})

    def _task(
        self, search: ProblemSearch, candidate: Candidate, builds: dict[str, CompileResult]
    ) -> MeasureTask | None:
        """What a bench measures for a compiled candidate; None when a build failed.

        A build that does not carry the point's configuration becomes a `not_applied`
        result in `builds`, so that the candidate is recorded as such and never timed.
        """
        for result in builds.values():
            if result.status == "ok":
                self.built.add(result.job.output)
        if any(result.status != "ok" for result in builds.values()):
            return None
        self._check_applied(search, candidate, builds)
        if any(result.status != "ok" for result in builds.values()):
            return None
        return MeasureTask(
            problem=search.problem,
            check_module=builds[CHECK].job.output,
            timed_module=builds[TIMED].job.output,
            data=search.data,
            repeat=search.repeat,
            settings=self.settings,
            check=search.check,
            benchmark_function=search.benchmark.function if search.benchmark else None,
            slow_ms=SLOW_FACTOR * search.baseline_ms if search.baseline_ms else None,
        )

    def _check_applied(
        self, search: ProblemSearch, candidate: Candidate, builds: dict[str, CompileResult]
    ) -> None:
        """Marks each build that does not carry the candidate's configuration `not_applied`;
        the default's timed build names the form IREE configured (what is timed)."""
        point = candidate.point
        expected = expected_config(search.problem, self.target, point)
        for role, result in builds.items():
            verdict = check_build(result.job.output, expected)
            if not verdict.ok:
                message = f"{role} module: {verdict.message}"
                builds[role] = replace(result, status="not_applied", message=message)
            elif point is None and role == TIMED:
                search.result.timed_form = verdict.form

    def _trial(
        self,
        search: ProblemSearch,
        candidate: Candidate,
        builds: dict[str, CompileResult],
        outcome: Measurement | None,
    ) -> Trial:
        """The record of one candidate: its builds, then its bench's outcome, if any."""
        problem, point = search.problem, candidate.point
        failed = next((r for r in builds.values() if r.status != "ok"), None)
        trial = Trial(
            problem=problem.name,
            target=self.target.name,
            arch=self.target.arch,
            config=candidate.name,
            point=dict(point or {}),
            baseline=point is None,
            status=failed.status if failed else "ok",
            compile_status=failed.status if failed else "ok",
            compile_s=round(sum({r.job.output: r.seconds for r in builds.values()}.values()), 3),
            message=_build_message(failed, builds),
            iree_version=self.version,
            device=self.context.device,
            flags=search.context.flags,
            shape=problem_shape(problem),
            features=self.target.features(problem, point) if point else {},
        )
        if outcome is None:
            return trial
        trial.device = self._record_device(outcome.device)
        trial.verify_s, trial.timing_s = outcome.verify_s, outcome.timing_s
        trial.verify_phases = dict(outcome.verify_phases)
        trial.verification, trial.max_error = outcome.verification, outcome.max_error
        trial.status, trial.message = outcome.status, outcome.message
        if outcome.status != "ok":
            return trial
        timing = outcome.timing
        trial.median_ms, trial.cv, trial.samples_ms = timing.median_ms, timing.cv, timing.samples_ms
        # The score is the trial's speedup over its own device's latest timing of the
        # default, on the scale of the primary's first default (the tuner compares one
        # scale): a default that drifts between batches moves the candidates with it.
        own_default = search.reference_ms.get(outcome.device)
        primary_default = search.device_default_ms.get(self.primary.device)
        scale = primary_default / own_default if own_default and primary_default else 1.0
        trial.reference_ms = own_default
        trial.gflops = problem.flops / (timing.median_ms * scale * 1e6)
        return trial

    def _record_device(self, device: str) -> str:
        """The device a record names: the run's device for the primary bench (so that a
        one-device run resumes it), the bench's own URI for the others."""
        return self.context.device if device == self.primary.device else device

    def measure(
        self, search: ProblemSearch, entries: list[tuple[str, Point | None]], progress: Progress
    ) -> list[Trial]:
        """Compiles a batch and measures it with the executor; each trial is recorded the
        moment it is done (database first, then the CSV, the log and the display)."""
        trials = []

        def done(candidate, builds, outcome) -> None:
            trial = self._trial(search, candidate, builds, outcome)
            with self.lock:
                if processes.stopping():  # its worker may have been killed by the stop
                    raise processes.Stopped()
                with critical():  # an interrupt waits until the database and the CSV agree
                    self._record(search, trial, progress)
            trials.append(trial)

        candidates = [self._candidate(search, name, point) for name, point in entries]
        self.executor.run(
            candidates, lambda candidate, builds: self._task(search, candidate, builds), done
        )
        with self.lock:
            events, self.executor.events[:] = list(self.executor.events), []
        for event in events:
            self.log.write(f"executor: {event}")
        order = {name: i for i, (name, _) in enumerate(entries)}
        return sorted(trials, key=lambda t: order[t.config])

    # ----- one problem ---------------------------------------------------------------

    def start_problem(
        self,
        problem: MatmulProblem,
        progress: Progress,
        own_bar: bool = True,
        benchmark: DispatchBenchmark | None = None,
        resume_at_most: int | None = None,
        custom_only: bool = False,
    ) -> ProblemSearch:
        """The space, the inputs, the default (measured or resumed) and the resumed trials.

        With `own_bar` the progress display starts a bar for this problem alone (a model's
        campaign keeps one bar for all its problems instead).
        """
        log, config, target = self.log, self.config, self.target
        space = build_space(problem, target, config.knob_space)
        if benchmark is not None or custom_only:
            # IREE's dispatch takes a spec, not a custom kernel: a model's custom kernels are
            # searched on their bare kernel, in a pass of their own (`custom_only`).
            kept = [p for p in space.points if target.in_spec(p) != custom_only]
            why = (
                "IREE configurations are searched on the model's dispatches"
                if custom_only
                else "custom kernels are searched on the bare kernel, after the campaign"
            )
            if len(kept) < len(space.points):
                space.rejected[why] += len(space.points) - len(kept)
                space.points = kept
        if own_bar:
            progress.start(problem, min(config.n_trial, len(space.points)) + 1)
        search = ProblemSearch(
            problem=problem,
            space=space,
            result=ProblemResult(problem, space),
            data=make_problem_data(
                problem, os.path.join(config.work_dir, "inputs", problem.name), seed=config.seed
            ),
            repeat=config.dispatch_repeat or target.dispatch_repeat(problem),
            started=time.perf_counter(),
            benchmark=benchmark,
            # Times of the dispatch and of the bare kernel differ: records of one are not
            # resumed as the other.
            context=replace(self.context, flags=self.context.flags + DISPATCH_FLAG)
            if benchmark
            else self.context,
        )
        log.section(f"problem {problem.name}")
        if benchmark:
            log.write(f"timed on IREE's dispatch {benchmark.entry_point} ({benchmark.source})")
            self._prepare_check(search)
        for site in problem.sites:
            log.write(f"op at {site.location} in @{site.function} (matmul #{site.index})")
        log.write(f"space: {space.total} raw points, {len(space.points)} valid")
        log.write(f"timing: {search.repeat} dispatch(es) per call, time per dispatch reported")
        if space.generated:
            log.write(f"knobs generated from the problem: {', '.join(space.generated)}")
        for knob, values in space.knob_values.items():
            log.write(f"  {knob} = {values}")
        for reason, count in space.rejected.most_common():
            log.write(f"  rejected {count}: {reason}")

        earlier = self._earlier(search, progress) if self.resume else []
        baseline = next((t for t in earlier if t.baseline and t.ok), None)
        if baseline is None:
            (baseline,) = self.measure(search, [(BASELINE, None)], progress)
        else:
            self._record(search, baseline, progress, new=False)
        search.result.baseline = baseline
        log.write(f"IREE default: {_describe(baseline)}")
        self._device_defaults(search)
        if not baseline.ok:
            log.write("the default configuration failed: speedups are not available")
        if not space.points:
            log.write("no point of the space passes the constraints (see the rejections above)")
            return search
        search.names = [target.config_name(p) for p in space.points]
        starting = []
        if config.starting_points == "target":
            starting = matching_points(space.points, target.starting_points(problem))
        history = self._history(problem, space) if config.history == "database" else []
        search.state = SearchState(
            space_tuner(config, target, space, history), queued=list(starting)
        )
        if history:
            log.write(
                f"the cost model starts from {len(history)} other problem(s) of "
                f"{config.database} (history = none leaves them out)"
            )
        if starting:
            log.write(
                f"measured first: {', '.join(search.names[i] for i in starting)} "
                "(the target's known-good points; starting_points = none leaves them out)"
            )
        index_of = {name: i for i, name in enumerate(search.names)}
        earlier_by_name = {t.config: t for t in earlier if not t.baseline}
        resumed = [(index_of[n], t) for n, t in earlier_by_name.items() if n in index_of]
        resumed.sort(key=lambda item: item[1].time)
        # A module's problem resumes at most n_trial points; a model's, as many as its budget
        # (every recorded point the tuner does not hear of could be proposed and measured again).
        for index, trial in resumed[: resume_at_most or config.n_trial]:
            search.state.resume(index, trial.gflops if trial.ok else None)
            search.trials.append(trial)
            self._record(search, trial, progress, new=False)
        search.result.resumed = len(search.trials)
        if search.result.resumed:
            log.write(f"resumed {search.result.resumed} trials from {config.database}")
        self._probe_spec(search, progress)
        return search

    def _probe_spec(self, search: ProblemSearch, progress: Progress) -> None:
        """Before the search: does a one-point spec reach the root op IREE configures in
        the module that is timed? One compile to `executable-configurations`; when it does
        not, the search stops loudly instead of timing IREE's default for every point."""
        point = next((p for p in search.space.points if self.target.in_spec(p)), None)
        if point is None or search.exhausted:
            return
        job = self._candidate(search, SPEC_PROBE, point).jobs[TIMED]
        output = job.output.removesuffix(".vmfb") + ".configured.mlir"
        flags = [f for f in job.flags if not f.startswith(CONFIGS_FLAG)]
        flags.append(f"--compile-to={CONFIG_PHASE}")
        built = compile_one(replace(job, output=output, flags=flags), self.config.compile_timeout)
        if built.status != "ok":
            return  # the probe's point does not build: each candidate is checked on its own
        verdict = check_roots(roots_in(output), expected_config(search.problem, self.target, point))
        # The probe builds the default's source with the default's flags: its root's form is
        # the one timed (a resumed default was not built by this run).
        search.result.timed_form = search.result.timed_form or verdict.form
        if verdict.ok:
            self.log.write(f"a one-point spec reaches the configured root ({verdict.form})")
        else:
            self._stop_not_applied(search, progress, verdict.message)

    def _stop_not_applied(self, search: ProblemSearch, progress: Progress, why: str) -> None:
        """Ends a search whose configurations do not reach the root, with a loud warning
        that names the root's form and the spec's matcher."""
        problem = search.problem
        matcher = "; ".join(line.strip() for line in match_contraction(problem).splitlines())
        message = (
            f"{problem.name}: the spec does not reach the root op IREE configures, so every "
            f"candidate would time IREE's default: {why}; the spec's matcher: {matcher}. "
            "Search stopped."
        )
        search.result.stopped = message
        if search.state is not None:
            search.state.exhausted = True
        self._warn(message, progress)

    def _device_defaults(self, search: ProblemSearch) -> None:
        """Each bench's own time of IREE's default: a candidate measured on a device is
        scored by its speedup over that device's default."""
        baseline = search.result.baseline
        if not baseline.ok:
            return
        search.device_default_ms[self.primary.device] = baseline.median_ms
        search.reference_ms[self.primary.device] = baseline.median_ms
        search.result.default_ms = [baseline.median_ms]
        if len(self.devices) == 1:
            return
        for device, timing in self._time_default_elsewhere(search).items():
            if timing.status == "ok":
                search.device_default_ms[device] = timing.median_ms
                search.reference_ms[device] = timing.median_ms
                self.log.write(f"IREE default on {device}: {timing.median_ms:.4g} ms")
            else:
                self.log.write(f"IREE default on {device}: {timing.status} {timing.message}")

    def _time_default_elsewhere(self, search: ProblemSearch):
        """The default timed on every bench but the primary."""
        module = self.modules_for(search.problem, [search.result.baseline], search.repeat, search)
        return self.executor.time_others(
            module[BASELINE],
            search.data,
            search.repeat,
            self.settings,
            search.benchmark.function if search.benchmark else None,
        )

    def _retime_default(self, search: ProblemSearch) -> None:
        """The default timed again on every bench before a batch, so that the batch is
        scored against it: on the H200 identical builds of one dispatch timed 19 % apart
        across a search while each timing's own CV was 0.1-2 %."""
        baseline = search.result.baseline
        if baseline is None or not baseline.ok:
            return
        module = self.modules_for(search.problem, [baseline], search.repeat, search)[BASELINE]
        repetitions, repeat = self.settings.repetitions, search.repeat
        primary = self.time_candidate(module, search.data, repetitions, repeat, search.benchmark)
        timings = {self.primary.device: primary}
        if len(self.devices) > 1:
            timings.update(self._time_default_elsewhere(search))
        for device, timing in timings.items():
            if timing.status == "ok":
                search.reference_ms[device] = timing.median_ms
        if primary.status == "ok":
            search.result.default_ms.append(primary.median_ms)
            drift = primary.median_ms / search.result.default_ms[0] - 1
            self.log.write(
                f"{search.problem.name}: IREE default re-timed {primary.median_ms:.4g} ms "
                f"(cv {primary.cv:.1%}, {drift:+.1%} from its first timing)"
            )

    def _measure_points(self, search: ProblemSearch, progress: Progress, into: list[Trial]):
        """The search loop's measurer for this problem: points in, scores out; the trials
        are recorded as they finish and kept in `into`."""
        names, points = search.names, search.space.points

        def measure(batch: list[int]) -> list[float | None]:
            if search.trials:  # each batch after the first is scored against a fresh default
                self._retime_default(search)
            trials = self.measure(search, [(names[i], points[i]) for i in batch], progress)
            by_name = {t.config: t for t in trials}
            measured = [by_name[names[i]] for i in batch]
            into.extend(measured)
            search.trials.extend(measured)
            if all(t.status == "not_applied" for t in search.trials):
                self._stop_not_applied(search, progress, measured[0].message)
            return [t.gflops if t.ok else None for t in measured]

        return measure

    def step(self, search: ProblemSearch, count: int, progress: Progress) -> list[Trial]:
        """Measures up to `count` more points the tuner proposes; [] when it has none left."""
        if search.state is None:
            return []
        # A model's batches move between problems (several at once): name each one's problem.
        self.log.write(f"{search.problem.name}: a batch of up to {count}")
        trials: list[Trial] = []
        search_step(search.state, count, self._measure_points(search, progress, trials))
        return trials

    def finish_problem(
        self, search: ProblemSearch, bench: Bench | None = None, modules: dict | None = None
    ) -> ProblemResult:
        """Re-times the top candidates beside the default (on `bench`, the primary unless
        told; `modules` when `finish_all` built them first) and names the winner."""
        if not search.result.search_s:
            search.result.search_s = time.perf_counter() - search.started
        if search.state is None:
            search.result.baseline_ms = search.result.baseline.median_ms
        else:
            self._retime(search, bench or self.primary, modules)
        with self.lock:
            self.finished.append(search.result)
        return search.result

    def finish_all(
        self, searches: list[ProblemSearch], progress: Progress | None = None
    ) -> list[ProblemResult]:
        """Finishes the searches once all of them have ended, so that no compile or search
        runs beside a re-timing. On the H200 IREE's default at 512^3 and 1024^3 f16
        re-timed 44-63 % slower while another problem's kernels compiled, and the paired
        verdict then could not tell a 1.3x gain from the noise.

        The finalists' modules are built first, then each device re-times one problem at a
        time, its default and finalists on that device alone: on two H200s, with every
        problem re-timed on the primary, the other was busy 55 % of the suite's run (69 %
        now), and the run took 75 s against 65."""
        modules = [self._finalist_modules(search) for search in searches]
        waiting: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(searches)):
            waiting.put(index)
        results: list[ProblemResult | None] = [None] * len(searches)
        announce = threading.Lock()
        started = itertools.count(1)

        def serve(bench: Bench) -> None:
            """Re-times problems on `bench` until none is left."""
            while True:
                try:
                    index = waiting.get_nowait()
                except queue.Empty:
                    return
                if progress is not None and len(searches) > 1:
                    with announce:
                        progress.retiming(searches[index].problem, next(started), len(searches))
                results[index] = self.finish_problem(searches[index], bench, modules[index])

        self.concurrently([partial(serve, bench) for bench in self.executor.benches])
        return [result for result in results if result is not None]

    def tune_problem(
        self,
        problem: MatmulProblem,
        progress: Progress,
        own_bar: bool = True,
        custom_only: bool = False,
    ) -> ProblemResult:
        """One problem to the end: searched, re-timed, its winner named."""
        return self.finish_problem(self.search_problem(problem, progress, own_bar, custom_only))

    def search_problem(
        self,
        problem: MatmulProblem,
        progress: Progress,
        own_bar: bool = True,
        custom_only: bool = False,
    ) -> ProblemSearch:
        """One problem's search: n_trial points, or fewer with early stopping (only the
        points of custom kernels with `custom_only`); `finish_problem` re-times it."""
        config = self.config
        search = self.start_problem(problem, progress, own_bar, custom_only=custom_only)
        if search.state is not None:
            stopped = run_search(
                search.state,
                self._measure_points(search, progress, []),
                budget=config.n_trial,
                batch_size=config.batch_size,
                early_stopping=config.early_stopping,
            )
            if stopped == "early_stopping":
                self.log.write(f"early stop: {search.state.since_best} trials without improvement")
        search.result.search_s = time.perf_counter() - search.started
        return search

    def _history(self, problem: MatmulProblem, space: SearchSpace) -> History:
        """Other problems' records in the database, in this space's feature columns."""
        if not space.points:
            return []
        with self.lock:  # not while another problem's thread appends
            trials = self.database.records()
        columns = list(self.target.features(problem, space.points[0]))
        return database_history(trials, self.target, problem, columns)

    def _earlier(self, search: ProblemSearch, progress: Progress) -> list[Trial]:
        """This problem's records that can be resumed; unreadable lines are a warning."""
        problem = search.problem
        with self.lock:  # not while another problem's thread appends
            earlier = self.database.load(problem.name, self.target.name, self.target.arch)
        if self.database.skipped and not self.warned_unreadable:
            self.warned_unreadable = True  # the same lines, read again for every problem
            reasons = ", ".join(f"{n} {r}" for r, n in self.database.skipped.most_common(3))
            self._warn(
                f"skipped {self.database.skipped.total()} unreadable line(s) of "
                f"{self.config.database} ({reasons})",
                progress,
            )
        kept = [t for t in earlier if search.context.resumes(t)]
        if len(kept) < len(earlier):
            self.log.write(
                f"{len(earlier) - len(kept)} earlier record(s) of {problem.name} were made with "
                "another IREE version, device or flags (or failed before records named their "
                "device): measured again"
            )
        return kept

    def _warn(self, message: str, progress: Progress) -> None:
        self.log.write(f"warning: {message}")
        progress.note(message)

    def _record(
        self, search: ProblemSearch, trial: Trial, progress: Progress, new: bool = True
    ) -> None:
        """Hands one trial to the recorders, in order: the database (a new measurement,
        not a resumed one), then each of `self.recorders`, then the progress display.
        One trial at a time, whichever problem's thread it comes from."""
        with self.lock:
            if new:
                self.database.append(trial)
            if trial.baseline and trial.ok:
                search.baseline_ms = trial.median_ms
            for recorder in self.recorders:
                recorder(search, trial)
            progress.advance(trial)

    def _to_csv(self, search: ProblemSearch, trial: Trial) -> None:
        # A speedup is over the default of the device the trial ran on.
        own_default = search.device_default_ms.get(trial.device, search.baseline_ms)
        self.csv.add(search.problem, trial, own_default)

    def _to_log(self, search: ProblemSearch, trial: Trial) -> None:
        if not trial.baseline:
            self.log.write(f"  {trial.config}: {_describe(trial)}")

    def _finalists(self, search: ProblemSearch) -> tuple[list[Trial], list[Trial]]:
        """The top few of a search, and those with the default: what is re-timed."""
        result = search.result
        # By score: each trial's speedup over the default timed nearest to it (and on its
        # own device), not its raw time, which moves with the machine.
        ranked = sorted((t for t in result.trials if t.ok), key=lambda t: -t.gflops)
        contenders = ranked[: max(self.config.retime_top, 1)]
        entries = ([result.baseline] if result.baseline.ok and contenders else []) + contenders
        return contenders, entries

    def _finalist_modules(self, search: ProblemSearch) -> dict[str, str]:
        """The timed module of each finalist and the default (compiled again if resumed)."""
        if search.state is None:
            return {}
        _, entries = self._finalists(search)
        return self.modules_for(search.problem, entries, search.repeat, search) if entries else {}

    def _retime(
        self, search: ProblemSearch, bench: Bench, modules: dict[str, str] | None = None
    ) -> None:
        """Times the top few again on `bench`, interleaved with the default, before naming a
        winner."""
        log, problem, result = self.log, search.problem, search.result
        contenders, entries = self._finalists(search)
        if not contenders:
            log.write("no candidate compiled, ran and gave the right answer")
            return
        log.write(
            f"{problem.name}: the top {len(contenders)} re-timed beside the default"
            + (f" on {bench.device}" if len(self.executor.benches) > 1 else "")
        )
        if modules is None:
            modules = self.modules_for(problem, entries, search.repeat, search)
        rounds: list[dict[str, float]] = []  # per round: config -> ms, timed back to back
        for _ in range(RETIME_ROUNDS):
            timed_now = {}
            for trial in entries:
                if trial.config not in modules:
                    continue
                timing = self.time_candidate(
                    modules[trial.config],
                    search.data,
                    max(1, self.config.repetitions // 2),
                    search.repeat,
                    search.benchmark,
                    bench,
                )
                if timing.status == "ok":
                    timed_now[trial.config] = timing.median_ms
            rounds.append(timed_now)
        samples = {t.config: [r[t.config] for r in rounds if t.config in r] for t in entries}
        final = {name: statistics.median(v) for name, v in samples.items() if v}
        result.baseline_ms = final.get(BASELINE)
        if result.baseline.ok and result.baseline_ms:
            drift = result.baseline_ms / result.baseline.median_ms - 1
            note = (
                "  (drift over 10 %: treat small speedups with care)"
                if abs(drift) > DRIFT_WARNING
                else ""
            )
            log.write(
                f"IREE default re-timed: {result.baseline_ms:.4g} ms "
                f"(first {result.baseline.median_ms:.4g} ms, {drift:+.1%}){note}"
            )
        if len(result.default_ms) > 1:
            log.write(
                f"IREE default over the search: {len(result.default_ms)} timings, "
                f"{min(result.default_ms):.4g}-{max(result.default_ms):.4g} ms, "
                f"drift up to {result.drift:.1%} (candidates scored against the latest)"
            )
        timed = [t for t in contenders if t.config in final]
        if not timed:
            return
        winner = min(timed, key=lambda t: final[t.config])
        for trial in timed:
            log.write(f"re-timed {trial.config}: {final[trial.config]:.4g} ms")
        self.retimed.update({(problem.name, name): ms for name, ms in final.items()})
        if result.baseline_ms is None:
            result.best, result.best_ms = winner, final[winner.config]
            return
        verdict = paired_verdict(rounds, winner.config)
        log.write(f"{winner.config} against the default: {verdict.describe()}")
        if verdict.beats_default:
            result.best, result.best_ms = winner, final[winner.config]
        else:
            log.write("no candidate beat IREE's default by more than the noise: the default stays")

    def modules_for(
        self,
        problem: MatmulProblem,
        trials: list[Trial],
        repeat: int,
        search: ProblemSearch | None = None,
    ) -> dict[str, str]:
        """Each trial's timed module by config name, built by this run (the dispatch build
        when `search` times on IREE's dispatch).

        Resumed trials are compiled again: a module left on disk may come from another arch
        or other flags under the same name.
        """
        if search is not None and search.benchmark:
            jobs = {
                t.config: self._dispatch_job(search, t.config, None if t.baseline else t.point)
                for t in trials
            }
        else:
            jobs = {
                t.config: self._compile_job(
                    problem, t.config, None if t.baseline else t.point, repeat
                )
                for t in trials
            }
        missing = [job for job in jobs.values() if job.output not in self.built]
        for result in compile_all(missing, self.config.compile_timeout, self.jobs):
            if result.status == "ok":
                self.built.add(result.job.output)
        return {name: job.output for name, job in jobs.items() if job.output in self.built}

    def concurrently(self, calls: list[Callable[[], Result]]) -> list[Result]:
        """Runs the calls (each one problem's work, or one device's re-timings) on up to
        `parallel` threads, so that one problem's compiles and tuner overlap another's
        measuring; results in call order.

        Each call's run-log lines are written together when it ends. Records are made in
        the calls' threads, one at a time (`self.lock`); on an interrupt every thread
        stops at its next tool or record, and this returns only when all have.
        """
        if self.parallel <= 1 or len(calls) <= 1:
            return [call() for call in calls]

        def logged(call: Callable[[], Result]) -> Result:
            with self.log.buffered():
                return call()

        pool = ThreadPoolExecutor(min(self.parallel, len(calls)), thread_name_prefix="problem")
        futures = [pool.submit(logged, call) for call in calls]
        try:
            return [future.result() for future in futures]
        except BaseException:
            processes.stop_all()  # an error in one problem stops the others (a signal has)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def tune_all(self, problems: list[MatmulProblem], progress: Progress) -> list[ProblemResult]:
        """Every problem to the end, `parallel` at a time (one progress bar for all then)."""
        if self.parallel <= 1 or len(problems) <= 1:
            results = []
            for problem in problems:
                results.append(self.tune_problem(problem, progress))
                progress.finish()
            return results
        space = self.config.knob_space
        total = sum(
            min(self.config.n_trial, len(build_space(p, self.target, space).points)) + 1
            for p in problems
        )
        progress.start_model(f"{len(problems)} problems, {self.parallel} at a time", total)
        searches = self.concurrently(
            [partial(self.search_problem, problem, progress, own_bar=False) for problem in problems]
        )
        progress.finish()
        return self.finish_all(searches, progress)

    def device_use(self) -> dict[str, float]:
        """Each measuring device's busy share since the run began (checking and timing);
        the rest it waited for compiles, the tuner or the run's own bookkeeping."""
        wall = time.perf_counter() - self.started
        return {device: busy / wall for device, busy in self.executor.busy().items()}

    def log_device_use(self) -> None:
        shares = ", ".join(f"{d} {share:.0%}" for d, share in self.device_use().items())
        self.log.write(f"devices busy measuring: {shares}")

    def run(self, analysis: Analysis, progress: Progress) -> list[ProblemResult]:
        """Tunes every problem; the CSV gets its ranks even when the run is interrupted."""
        try:
            results = self.tune_all(analysis.problems, progress)
            self.log_device_use()
            return results
        finally:
            chosen = {
                (r.problem.name, r.best.config if r.best else BASELINE) for r in self.finished
            }
            self.csv.finish(self.retimed, chosen)
            self.close()

    def close(self) -> None:
        """Stops the benches' worker processes."""
        self.executor.close()


@dataclass
class PairedVerdict:
    """A candidate against the default, timed back to back in each re-timing round."""

    speedups: list[float]  # default ms / candidate ms, one per round
    noise: float  # the larger CV across rounds of the two (how much either moves alone)

    @property
    def median(self) -> float:
        return statistics.median(self.speedups) if self.speedups else 0.0

    @property
    def beats_default(self) -> bool:
        """Faster in every round, and by more than the noise of the measurements."""
        return bool(self.speedups) and min(self.speedups) > 1 and self.median > 1 + self.noise

    def describe(self) -> str:
        rounds = ", ".join(f"{s:.3f}x" for s in self.speedups)
        return f"paired speedups {rounds} (median {self.median:.3f}x), noise {self.noise:.1%}"


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values) if values else 0.0
    return statistics.pstdev(values) / mean if len(values) > 1 and mean > 0 else 0.0


def paired_verdict(rounds: list[dict[str, float]], name: str) -> PairedVerdict:
    """Compares `name` with the default round by round, where both were timed together."""
    both = [r for r in rounds if BASELINE in r and name in r]
    speedups = [r[BASELINE] / r[name] for r in both]
    noise = max(_cv([r[BASELINE] for r in both]), _cv([r[name] for r in both]))
    return PairedVerdict(speedups, noise)


def _build_message(failed: CompileResult | None, builds: dict[str, CompileResult]) -> str:
    """Why a build failed; a dispatch build's failure says so."""
    if failed is None:
        return ""
    if failed is builds.get(TIMED) and builds[TIMED].job.output.endswith(".dispatch.vmfb"):
        return f"dispatch: {failed.message}"
    return failed.message


def _describe(trial: Trial) -> str:
    if trial.ok:
        return (
            f"{trial.median_ms:.4g} ms (cv {trial.cv:.1%}), {trial.gflops:.4g} GFLOP/s, "
            f"compile {trial.compile_s:.2f} s"
        )
    return f"{trial.status}: {trial.message}"


def space_tuner(config: RunConfig, target: Target, space: SearchSpace, history: History = ()):
    """The cfg's tuner over one problem's space, with the target's features of its points
    (and other problems' measurements in the same columns, `history`)."""
    features = feature_matrix(space.problem, target, space.points)
    return make_tuner(
        config.tuner, len(space.points), config.seed, features, config.n_trial, history
    )


def feature_matrix(problem: MatmulProblem, target: Target, points: list[Point]) -> np.ndarray:
    if not points:
        return np.zeros((0, 0))
    rows = [target.features(problem, p) for p in points]
    keys = list(rows[0])
    return np.array([[row[k] for k in keys] for row in rows], dtype=float)


def summary_rows(results: list[ProblemResult]) -> str:
    rows = []
    for r in results:
        failed = sum(1 for t in r.trials if not t.ok)
        best = r.best
        rows.append(
            [
                r.problem.name,
                f"{len(r.space.points)}",
                f"{len(r.trials)}" + (f" ({r.resumed} resumed)" if r.resumed else ""),
                f"{failed}" + (f" ({r.not_applied} not applied)" if r.not_applied else ""),
                f"{r.baseline_ms:.4g}" if r.baseline_ms else "-",
                f"{r.best_ms:.4g}" if r.best_ms else "-",
                f"{r.problem.flops / (r.best_ms * 1e6):.4g}" if r.best_ms else "-",
                f"{r.speedup:.2f}x" if r.speedup else "none faster",
                best.config if best else "(IREE default)",
            ]
        )
    headers = [
        "problem",
        "space",
        "trials",
        "failed",
        "default ms",
        "best ms",
        "GFLOP/s",
        "speedup",
        "best config",
    ]
    return table(headers, rows)
