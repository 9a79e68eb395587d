"""The problem's life in a run and its concurrency: each problem started (space, inputs,
default, resumed trials), searched in batches, re-timed and judged, several at a time.

The rooms it drives: `builds` (compile jobs, one-point specs, the applied check), `trials`
(records and resuming), `defaults` (the default timed between batches), `retime` (the pure
verdict). A tuner never sees a file, a target never runs a process.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import TypeVar

import numpy as np

from autosched import processes
from autosched.compile import compile_one
from autosched.config import RunConfig
from autosched.interrupts import critical
from autosched.measure.contract import (
    BenchContract,
    DispatchCheck,
    Executor,
    measure_settings,
)
from autosched.measure.registry import make_executor
from autosched.measure.worker import make_problem_data
from autosched.model.dispatch_benchmarks import DispatchBenchmark
from autosched.ops.matmul import Analysis, MatmulProblem
from autosched.ops.registry import kind_of
from autosched.outputs.records import MeasureContext, Trial, iree_version
from autosched.outputs.report import RunLog, table
from autosched.run import retime
from autosched.run.builds import CandidateBuilds
from autosched.run.defaults import DefaultTimings
from autosched.run.problem import BASELINE, ProblemResult, ProblemSearch, Progress
from autosched.run.trials import TrialBook, describe, make_trial
from autosched.search.loop import SearchState
from autosched.search.loop import search as run_search
from autosched.search.loop import step as search_step
from autosched.search.space import SearchSpace, build_space, fitted_space, matching_points
from autosched.search.tuners import History, make_tuner
from autosched.targets.base import Point, Target

# Marks the flags of records timed on IREE's dispatch, compiled from executable sources
# (records timed on the dispatch compiled from the input phase timed IREE's default on CUDA
# unit-batch matmuls: they are measured again, not resumed).
DISPATCH_FLAG = " [timed on the dispatch from executable sources]"
Result = TypeVar("Result")


class Tuning:
    """One `autosched run`: shared state for all problems of the module."""

    def __init__(
        self,
        config: RunConfig,
        target: Target,
        resume: bool = True,
        executor: Executor | None = None,
    ):
        """`executor` measures the candidates (see measure/contract.py); by default the one
        the cfg asks for: this host's devices, or a Ray cluster."""
        self.config, self.target, self.resume = config, target, resume
        self.jobs = config.jobs or os.cpu_count() or 1
        self.log = RunLog(config.log_file)
        self.version = iree_version()
        self.retimed: dict[tuple[str, str], float] = {}  # (problem, config) -> final median ms
        self.settings = measure_settings(config, target)
        self.executor = executor or make_executor(config, target, self.jobs)
        self.devices = self.executor.devices
        self.context = MeasureContext(
            self.version, target.device, " ".join(target.compile_flags()), tuple(self.devices[1:])
        )
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
        self.builds = CandidateBuilds(config, target, self.jobs)
        self.book = TrialBook(config, target, self.log, self.lock)
        self.csv, self.recorders = self.book.csv, self.book.recorders
        self.defaults = DefaultTimings(self.executor, self.builds, self.settings, self.log)
        self.model_checks: dict[str, object] = {}  # check source -> its default's answer
        self.model_check_lock = threading.Lock()

    def time_candidate(
        self,
        vmfb: str,
        data,
        repetitions: int,
        repeat: int,
        benchmark: DispatchBenchmark | None = None,
        bench: BenchContract | None = None,
    ):
        """Time per dispatch on `bench`, the primary device unless told."""
        function = benchmark.function if benchmark else None
        bench = bench or self.executor.primary
        return bench.time(vmfb, data, repeat, self.settings, repetitions, function)

    def modules_for(
        self,
        problem: MatmulProblem,
        trials: list[Trial],
        repeat: int,
        search: ProblemSearch | None = None,
    ) -> dict[str, str]:
        """Each trial's timed module by config name (see `CandidateBuilds.modules_for`)."""
        return self.builds.modules_for(problem, trials, repeat, search)

    def measure(
        self, search: ProblemSearch, entries: list[tuple[str, Point | None]], progress: Progress
    ) -> list[Trial]:
        """Compiles a batch and measures it with the executor; each trial is recorded the
        moment it is done (database first, then the CSV, the log and the display)."""
        trials, primary = [], self.executor.primary.device

        def done(candidate, builds, outcome) -> None:
            trial = make_trial(
                search, candidate, builds, outcome, self.target, self.version, primary
            )
            with self.lock:
                if processes.stopping():  # its worker may have been killed by the stop
                    raise processes.Stopped()
                with critical():  # an interrupt waits until the database and the CSV agree
                    self.book.record(search, trial, progress)
            trials.append(trial)

        candidates = [self.builds.candidate(search, name, point) for name, point in entries]
        settings = self.settings
        self.executor.run(
            candidates, lambda cand, built: self.builds.task(search, cand, built, settings), done
        )
        self.log_executor_events()
        order = {name: i for i, (name, _) in enumerate(entries)}
        return sorted(trials, key=lambda t: order[t.config])

    def log_executor_events(self) -> None:
        """What the executor noted since (an actor lost and its call queued again, ...)."""
        with self.lock:
            events, self.executor.events[:] = list(self.executor.events), []
        for event in events:
            self.log.write(f"executor: {event}")

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
        """The space, the inputs, the default (measured or resumed) and the resumed trials;
        then a one-point spec probe, before any candidate is built.

        With `own_bar` the progress display starts a bar for this problem alone (a model's
        campaign keeps one bar for all its problems instead).
        """
        config, log = self.config, self.log
        space = problem_space(problem, self.target, config.knob_space, benchmark, custom_only)
        if own_bar:
            progress.start(problem, min(config.n_trial, len(space.points)) + 1)
        search = new_search(config, self.target, self.context, problem, space, benchmark)
        log.section(f"problem {problem.name}")
        if benchmark:
            log.write(f"timed on IREE's dispatch {benchmark.entry_point} ({benchmark.source})")
            self._choose_check(search)
            self._prepare_check(search)
            if search.result.stopped:  # no answer of it can be checked: not even timed
                self.book.warn(search.result.stopped, progress)
                return search
        log_problem(log, search)
        earlier = self.book.earlier(search, progress) if self.resume else []
        baseline = next((t for t in earlier if t.baseline and t.ok), None)
        if baseline is None:
            (baseline,) = self.measure(search, [(BASELINE, None)], progress)
        else:
            self.book.record(search, baseline, progress, new=False)
        search.result.baseline = baseline
        log.write(f"IREE default: {describe(baseline)}")
        self.defaults.first(search)
        if not baseline.ok:
            log.write("the default configuration failed: speedups are not available")
        if space.note:
            self.book.warn(space.note, progress)
        if not space.points:
            return search
        history = self.book.history(problem, space) if config.history == "database" else []
        search.state = search_state(config, self.target, search, history, log)
        for trial in resumable(search, earlier, resume_at_most or config.n_trial):
            self.book.record(search, trial, progress, new=False)
        if search.result.resumed:
            log.write(f"resumed {search.result.resumed} trials from {config.database}")
        verdict = self.builds.probe(search)
        if verdict is not None and verdict.ok:
            log.write(f"a one-point spec reaches the configured root ({verdict.form})")
        elif verdict is not None:
            self._stop_not_applied(search, progress, verdict.message)
        return search

    def _choose_check(self, search: ProblemSearch) -> None:
        """Where a kind that may need the whole model (`model_check`) checks its answers:
        on its dispatch's own module where a one-point spec reaches the root there, since
        each candidate's check then compiles in seconds (resnet50's whole model took 76 s a
        candidate on the H200's host); on the whole model otherwise."""
        benchmark = search.benchmark
        if benchmark.model_check is None:  # (attach_benchmarks: none without a check module)
            return
        verdict = self.builds.probe_check(search)
        if verdict is not None and verdict.ok:  # the whole model stays the fallback
            return
        why = verdict.message if verdict else "no point a spec carries builds it"
        self.log.write(f"answers checked on the whole model: a spec misses the dispatch's ({why})")
        search.benchmark = benchmark.on_whole_model()

    def _prepare_check(self, search: ProblemSearch) -> None:
        """The default build's answer on the dispatch itself, to check candidates against.

        Without it (no check module, or the default fails on it) candidates are checked on
        the bare kernel against numpy.
        """
        from autosched.measure.module_io import EntryFunction, RunFailed, TensorSpec

        benchmark = search.benchmark
        if benchmark is None or not benchmark.check_source:
            return
        entry = EntryFunction(
            benchmark.check_function,
            tuple(TensorSpec(shape, element) for shape, element in benchmark.check_inputs),
            tuple(TensorSpec(shape, element) for shape, element in benchmark.check_outputs),
        )
        if benchmark.checks_model:  # one model, one default answer: its problems share it
            with self.model_check_lock:
                if benchmark.check_source not in self.model_checks:
                    self.model_checks[benchmark.check_source] = self._default_answer(
                        search, entry, "model"
                    )
                check = self.model_checks[benchmark.check_source]
        else:
            check = self._default_answer(search, entry, search.problem.name)
        if isinstance(check, RunFailed):
            problem = search.problem
            if benchmark.model_check is not None:  # IREE's default on resnet50's strided
                # 1x1 convolutions' own modules ran past a minute on the H200 (session 21)
                self.log.write(
                    f"the dispatch check could not run ({check}): answers checked on the "
                    "whole model"
                )
                search.benchmark = benchmark.on_whole_model()
                self._prepare_check(search)
                return
            if kind_of(problem).has_kernel(problem):
                self.log.write(
                    f"the dispatch check could not run ({check}): answers checked on the kernel"
                )
                return
            search.result.stopped = (
                f"{problem.name}: the dispatch check could not run ({check}) and a "
                f"{problem.kind} has no kernel of its own to check answers on: not searched"
            )
            return
        search.check = check
        self.log.write(
            f"answers checked on the dispatch against IREE's default ({benchmark.check_source})"
        )

    def _default_answer(self, search: ProblemSearch, entry, name: str):
        """IREE's default build of the check module run on seeded inputs (under
        inputs/`name`): a DispatchCheck, or the RunFailed that says why it did not build
        or run. A model's whole build is compiled once a run
        (`CandidateBuilds.default_model_check`)."""
        from autosched.measure.module_io import RunFailed, make_inputs

        folder = os.path.join(self.config.work_dir, "inputs", name, "dispatch")
        inputs = make_inputs(entry, folder, seed=self.config.seed)
        if search.benchmark.checks_model:
            built = self.builds.default_model_check(search)
        else:
            job = self.builds.dispatch_job(search, BASELINE, None, check=True)
            built = compile_one(job, self.config.compile_timeout)
        if built.status != "ok":
            return RunFailed(built.message)
        try:
            reference = self.executor.primary.reference_outputs(
                built.job.output, entry, inputs, folder, self.config.run_timeout
            )
        except RunFailed as error:
            return error
        return DispatchCheck(entry, inputs, reference, folder)

    def _stop_not_applied(self, search: ProblemSearch, progress: Progress, why: str) -> None:
        """Ends a search whose configurations do not reach the root, with a loud warning
        that names the root's form and the spec's matcher."""
        problem = search.problem
        lines = kind_of(problem).spec_matcher(problem).splitlines()
        matcher = "; ".join(line.strip() for line in lines)
        message = (
            f"{problem.name}: the spec does not reach the root op IREE configures, so every "
            f"candidate would time IREE's default: {why}; the spec's matcher: {matcher}. "
            "Search stopped."
        )
        search.result.stopped = message
        if search.state is not None:
            search.state.exhausted = True
        self.book.warn(message, progress)

    def _measure_points(self, search: ProblemSearch, progress: Progress, into: list[Trial]):
        """The search loop's measurer for this problem: points in, scores out; the trials
        are recorded as they finish and kept in `into`."""
        names, points = search.names, search.space.points

        def measure(batch: list[int]) -> list[float | None]:
            if search.trials:  # each batch after the first is scored against a fresh default
                self.defaults.again(search)
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
        self,
        search: ProblemSearch,
        bench: BenchContract | None = None,
        modules: dict | None = None,
    ) -> ProblemResult:
        """Re-times the top candidates beside the default (on `bench`, the primary unless
        told; `modules` when `finish_all` built them first) and names the winner."""
        if not search.result.search_s:
            search.result.search_s = time.perf_counter() - search.started
        if search.state is None:  # nothing searched (not even timed: `_prepare_check`)
            baseline = search.result.baseline
            search.result.baseline_ms = baseline.median_ms if baseline else None
        else:
            self._retime(search, bench or self.executor.primary, modules)
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
        modules = [finalist_modules(self, search) for search in searches]
        waiting: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(searches)):
            waiting.put(index)
        results: list[ProblemResult | None] = [None] * len(searches)
        announce = threading.Lock()
        started = itertools.count(1)

        def serve(bench: BenchContract) -> None:
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

    def _retime(
        self, search: ProblemSearch, bench: BenchContract, modules: dict[str, str] | None = None
    ) -> None:
        """Times the top few again on `bench`, interleaved with the default, and names the
        winner only when it beats the default by more than the noise."""
        log, problem, result = self.log, search.problem, search.result
        contenders, entries = retime.finalists(
            result.trials, result.baseline, self.config.retime_top
        )
        if not contenders:
            log.write("no candidate compiled, ran and gave the right answer")
            return
        log.write(
            f"{problem.name}: the top {len(contenders)} re-timed beside the default"
            + (f" on {bench.device}" if len(self.executor.benches) > 1 else "")
        )
        if modules is None:
            modules = self.modules_for(problem, entries, search.repeat, search)
        repetitions = max(1, self.config.repetitions // 2)

        def time_one(name: str) -> float | None:
            if name not in modules:
                return None
            timing = self.time_candidate(
                modules[name], search.data, repetitions, search.repeat, search.benchmark, bench
            )
            return timing.median_ms if timing.status == "ok" else None

        rounds = retime.timed_rounds([t.config for t in entries], time_one)
        self.log_executor_events()  # a round lost with its actor was timed again
        found = retime.judge(contenders, rounds)
        self.retimed.update(keep_verdict(log, search, contenders, found))

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


def new_search(
    config: RunConfig,
    target: Target,
    context: MeasureContext,
    problem: MatmulProblem,
    space: SearchSpace,
    benchmark: DispatchBenchmark | None,
) -> ProblemSearch:
    """A problem's search before its default is measured."""
    return ProblemSearch(
        problem=problem,
        space=space,
        result=ProblemResult(problem, space),
        data=make_problem_data(
            problem, os.path.join(config.work_dir, "inputs", problem.name), seed=config.seed
        ),
        repeat=config.dispatch_repeat or target.for_problem(problem).dispatch_repeat(problem),
        started=time.perf_counter(),
        benchmark=benchmark,
        # Times of the dispatch and of the bare kernel differ: records of one are not
        # resumed as the other.
        context=replace(context, flags=context.flags + DISPATCH_FLAG) if benchmark else context,
    )


def finalist_modules(tuning: Tuning, search: ProblemSearch) -> dict[str, str]:
    """The timed module of each finalist and the default (compiled again if resumed)."""
    if search.state is None:
        return {}
    result = search.result
    _, entries = retime.finalists(result.trials, result.baseline, tuning.config.retime_top)
    return tuning.modules_for(search.problem, entries, search.repeat, search) if entries else {}


def keep_verdict(
    log: RunLog, search: ProblemSearch, contenders: list[Trial], found: retime.Retimed
) -> dict[tuple[str, str], float]:
    """Logs and keeps what re-timing found (the default's drift, the winner); the final
    medians by (problem, config)."""
    result = search.result
    final = {(search.problem.name, n): ms for n, ms in found.final.items()}
    result.baseline_ms = found.baseline_ms
    if result.baseline.ok and result.baseline_ms:
        log.write(drift_line(result))
    if len(result.default_ms) > 1:
        log.write(
            f"IREE default over the search: {len(result.default_ms)} timings, "
            f"{min(result.default_ms):.4g}-{max(result.default_ms):.4g} ms, "
            f"drift up to {result.drift:.1%} (candidates scored against the latest)"
        )
    if found.winner is None:
        return {}
    for trial in contenders:
        if trial.config in found.final:
            log.write(f"re-timed {trial.config}: {found.final[trial.config]:.4g} ms")
    result.verdict = found.verdict
    if found.verdict is not None:
        log.write(f"{found.winner.config} against the default: {found.verdict.describe()}")
    if found.beats_default:
        result.best, result.best_ms = found.winner, found.final[found.winner.config]
    else:
        log.write("no candidate beat IREE's default by more than the noise: the default stays")
    return final


def no_winner_line(results: list[ProblemResult]) -> str:
    """Why no spec came out, in a newcomer's words: nothing was faster, or something was but
    the timings moved too much between rounds to name it, and what to do then."""
    noisy = [r for r in results if r.verdict is not None and r.verdict.median > 1 and not r.best]
    if not noisy:
        return "no tuning spec: nothing beat IREE's default configurations"
    worst = max(noisy, key=lambda r: r.verdict.noise)
    return (
        f"no tuning spec: too noisy to name a winner: {worst.problem.name}'s best candidate "
        f"was {worst.verdict.median:.2f}x IREE's default, but its timings moved "
        f"{worst.verdict.noise:.1%} between rounds. Run again on a quieter machine, or raise "
        "[Benchmark] repetitions and min_time"
    )


def problem_space(
    problem: MatmulProblem,
    target: Target,
    knob_space: dict,
    benchmark: DispatchBenchmark | None,
    custom_only: bool,
) -> SearchSpace:
    """The problem's space; on IREE's dispatch, only points a spec carries (a model's custom
    kernels are searched on their bare kernel, in a pass of their own: `custom_only`)."""
    space, space.note = fitted_space(problem, target, knob_space)
    if benchmark is None and not custom_only:
        return space
    target = target.for_problem(problem)
    kept = [p for p in space.points if target.in_spec(p) != custom_only]
    why = (
        "IREE configurations are searched on the model's dispatches"
        if custom_only
        else "custom kernels are searched on the bare kernel, after the campaign"
    )
    if len(kept) < len(space.points):
        space.rejected[why] += len(space.points) - len(kept)
        space.points = kept
    return space


def log_problem(log: RunLog, search: ProblemSearch) -> None:
    """The problem's sites, its space and its rejections, and how it is timed."""
    problem, space = search.problem, search.space
    for site in problem.sites:
        index = f" (matmul #{site.index})" if hasattr(site, "index") else ""
        log.write(f"op at {site.location} in @{site.function}{index}")
    log.write(f"space: {space.total} raw points, {len(space.points)} valid")
    log.write(f"timing: {search.repeat} dispatch(es) per call, time per dispatch reported")
    if space.generated:
        log.write(f"knobs generated from the problem: {', '.join(space.generated)}")
    for knob, values in space.knob_values.items():
        log.write(f"  {knob} = {values}")
    for reason, count in space.rejected.most_common():
        log.write(f"  rejected {count}: {reason}")


def search_state(
    config: RunConfig, target: Target, search: ProblemSearch, history: History, log: RunLog
) -> SearchState:
    """The tuner's search over the problem's space, the target's known-good points first."""
    problem, space = search.problem, search.space
    target = target.for_problem(problem)
    search.names = [target.config_name(p) for p in space.points]
    starting = []
    if config.starting_points == "target":
        starting = matching_points(space.points, target.starting_points(problem))
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
    return SearchState(space_tuner(config, target, space, history), queued=list(starting))


def resumable(search: ProblemSearch, earlier: list[Trial], limit: int) -> list[Trial]:
    """The earlier trials of this space, oldest first, told to the tuner and kept.

    A module's problem resumes at most n_trial points; a model's, as many as its budget
    (every recorded point the tuner does not hear of could be proposed and measured again).
    """
    index_of = {name: i for i, name in enumerate(search.names)}
    by_name = {t.config: t for t in earlier if not t.baseline}
    resumed = sorted(
        ((index_of[n], t) for n, t in by_name.items() if n in index_of), key=lambda i: i[1].time
    )
    kept = []
    for index, trial in resumed[:limit]:
        search.state.resume(index, trial.gflops if trial.ok else None)
        search.trials.append(trial)
        kept.append(trial)
    search.result.resumed = len(search.trials)
    return kept


def drift_line(result: ProblemResult) -> str:
    drift = result.baseline_ms / result.baseline.median_ms - 1
    note = (
        "  (drift over 10 %: treat small speedups with care)"
        if abs(drift) > retime.DRIFT_WARNING
        else ""
    )
    return (
        f"IREE default re-timed: {result.baseline_ms:.4g} ms "
        f"(first {result.baseline.median_ms:.4g} ms, {drift:+.1%}){note}"
    )


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
    rows = [target.for_problem(problem).features(problem, p) for p in points]
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
