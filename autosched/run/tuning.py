"""The problem's life in a run and its concurrency: each problem started (space, inputs,
default, resumed trials), searched in batches, re-timed and judged, several at a time.

The rooms it drives: `builds` (compile jobs, one-point specs, the applied check), `trials`
(records and resuming), `defaults` (the default timed between batches), `checks` (where
answers are checked), `retiming` (the finalists timed again; `retime`, the pure verdict),
`concurrency` (the threads). A tuner never sees a file, a target never runs a process.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import TypeVar

import numpy as np

from autosched import processes
from autosched.config import RunConfig
from autosched.interrupts import critical
from autosched.measure.contract import Executor, measure_settings
from autosched.measure.registry import make_executor
from autosched.measure.worker import make_problem_data
from autosched.model.dispatch_benchmarks import DispatchBenchmark
from autosched.ops.matmul import Analysis, MatmulProblem
from autosched.ops.registry import kind_of
from autosched.outputs.records import MeasureContext, Trial, iree_version
from autosched.outputs.report import RunLog
from autosched.run.builds import CandidateBuilds
from autosched.run.checks import AnswerChecks
from autosched.run.concurrency import concurrently, log_executor_events
from autosched.run.defaults import DefaultTimings
from autosched.run.limits import TimedOut, not_tried
from autosched.run.phases import PhaseClock
from autosched.run.problem import BASELINE, ProblemResult, ProblemSearch, Progress
from autosched.run.retiming import Retiming
from autosched.run.timed_first import Reach, separate_check, timed_first
from autosched.run.trials import TrialBook, describe, make_trial, not_tried_trial
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
        clock: PhaseClock | None = None,
    ):
        """`executor` measures the candidates (see measure/contract.py); by default the one
        the cfg asks for: this host's devices, or a Ray cluster. `clock` counts the time of
        the defaults and the re-timing (a model run's stages pass theirs)."""
        self.config, self.target, self.resume = config, target, resume
        self.clock = clock or PhaseClock()
        self.measured: list[Trial] = []  # every candidate this run measured, the defaults too
        self.timed_out = TimedOut()  # configurations not built again for their family
        self.jobs = config.jobs or os.cpu_count() or 1
        self.log = RunLog(config.log_file)
        self.version = iree_version()
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
        self.builds = CandidateBuilds(config, target, self.jobs)
        self.book = TrialBook(config, target, self.log, self.lock)
        self.defaults = DefaultTimings(self.executor, self.builds, self.settings, self.log)
        self.checks = AnswerChecks(config, self.log, self.executor, self.builds)
        self.retiming = Retiming(
            config, self.log, self.executor, self.builds, self.settings, self.lock
        )

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
                self.measured.append(trial)
            self.timed_out.remember(search.problem, trial)
            trials.append(trial)

        candidates = [self.builds.candidate(search, name, point) for name, point in entries]
        candidates = self._not_timed_out(search, candidates, trials, progress)
        settings = self.settings

        def prepare(candidate, built):
            return self.builds.task(search, candidate, built, settings)

        reach = self._reach(search)
        first = [c for c in candidates if reach and c.point and separate_check(c)]
        if first:
            timed_first(self.executor, first, prepare, done, reach)
        rest = [c for c in candidates if c not in first]
        if rest:
            self.executor.run(rest, prepare, done)
        log_executor_events(self.executor, self.log, self.lock)
        order = {name: i for i, (name, _) in enumerate(entries)}
        return sorted(trials, key=lambda t: order[t.config])

    def _reach(self, search: ProblemSearch) -> Reach | None:
        """Fast mode: what a candidate must beat to be checked (run/timed_first.py): the
        default's latest time over the re-timing's floor, and the problem's finalists so
        far; None in the other modes (every candidate is checked)."""
        floor = self.retiming.floor
        default_ms = search.reference_ms.get(self.executor.primary.device)
        if not floor or not default_ms:
            return None
        kept = tuple(t.median_ms for t in search.trials if t.ok and not t.baseline)
        return Reach(default_ms / floor, kept, self.config.finalists)

    def _not_timed_out(
        self, search: ProblemSearch, candidates: list, trials: list[Trial], progress: Progress
    ) -> list:
        """The candidates to build: a configuration that timed out on another problem of
        this one's family in this run is recorded as not tried (in run.log and the CSV,
        not the database) and left out."""
        kept = []
        for candidate in candidates:
            earlier = self.timed_out.earlier(search.problem, candidate.name)
            if earlier is None or candidate.point is None:
                kept.append(candidate)
                continue
            why = not_tried(earlier)
            trial = not_tried_trial(search, candidate, self.target, self.version, why)
            with self.lock:
                self.log.write(f"{search.problem.name}: {candidate.name} {why}")
                self.book.record(search, trial, progress, new=False)
            trials.append(trial)
        return kept

    # ----- one problem ---------------------------------------------------------------

    def start_problem(
        self,
        problem: MatmulProblem,
        progress: Progress,
        own_bar: bool = True,
        benchmark: DispatchBenchmark | None = None,
        resume_all: bool = False,
        custom_only: bool = False,
        search: ProblemSearch | None = None,
    ) -> ProblemSearch:
        """The space, the inputs, the default (measured or resumed) and the resumed trials;
        then a one-point spec probe, before any candidate is built. `search`: the problem's
        search opened already (`open_search`, its opening builds compiled ahead).

        With `own_bar` the progress display starts a bar for this problem alone (a model's
        campaign keeps one bar for all its problems instead). With `resume_all` (a model's
        campaign, whose budget counts new trials) every earlier record is resumed and none
        of them advances the progress; without it, up to n_trial, each advancing it.
        """
        config, log = self.config, self.log
        search = search or self.open_search(problem, benchmark, custom_only)
        space = search.space
        if own_bar:
            progress.start(problem, min(config.n_trial, len(space.points)) + 1)
        log.section(f"problem {problem.name}")
        with self.clock.phase("defaults"):
            earlier = self._start_default(search, progress)
        if earlier is None:
            return search
        baseline = search.result.baseline
        if not baseline.ok:
            log.write("the default configuration failed: speedups are not available")
        if space.note:
            (self.book.inform if space.replaced else self.book.warn)(space.note, progress)
        if not space.points:
            return search
        history = self.book.history(problem, space) if config.history == "database" else []
        search.state = search_state(config, self.target, search, history, log)
        self.book.seed(search)  # the knowledge base's points for its shape class first
        # A model's bar counts this run's trials: its resumed records are not shown on it.
        shown = Progress() if resume_all else progress
        for trial in resumable(search, earlier, None if resume_all else config.n_trial):
            self.book.record(search, trial, shown, new=False)
        if search.result.resumed:
            log.write(f"resumed {search.result.resumed} trials from {config.database}")
        verdict = self.builds.probe(search)
        if verdict is not None and verdict.ok:
            log.write(f"a one-point spec reaches the configured root ({verdict.form})")
        elif verdict is not None:
            self._stop_not_applied(search, progress, verdict.message)
        return search

    def open_search(
        self,
        problem: MatmulProblem,
        benchmark: DispatchBenchmark | None = None,
        custom_only: bool = False,
    ) -> ProblemSearch:
        """A problem's space and search, before anything is built or measured."""
        config = self.config
        space = problem_space(problem, self.target, config.knob_space, benchmark, custom_only)
        return new_search(config, self.target, self.context, problem, space, benchmark)

    def _start_default(self, search: ProblemSearch, progress: Progress) -> list[Trial] | None:
        """The default's check on its dispatch (none where the IREE route times its default
        alone: `default_only`), then its measurement (or its record) and its time on every
        bench; the problem's earlier records, or None when no answer of it
        can be checked."""
        log, benchmark = self.log, search.benchmark
        if benchmark:
            log.write(f"timed on IREE's dispatch {benchmark.entry_point} ({benchmark.source})")
        if benchmark and not search.default_only:
            self.checks.choose(search)
            self.checks.prepare(search)
            if search.result.stopped:  # no answer of it can be checked: not even timed
                self.book.warn(search.result.stopped, progress)
                return None
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
        return earlier

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
            # Each batch after the first is scored against a fresh default; not in fast
            # mode, where a problem has one or two batches and the re-timing judges.
            if search.trials and self.config.mode != "fast":
                with self.clock.phase("defaults"):
                    self.defaults.again(search)
            trials = self.measure(search, [(names[i], points[i]) for i in batch], progress)
            by_name = {t.config: t for t in trials}
            measured = [by_name[names[i]] for i in batch]
            into.extend(measured)
            search.trials.extend(measured)
            if all(t.status == "not_applied" for t in search.trials):
                self._stop_not_applied(search, progress, measured[0].message)
            return [t.gflops if t.timed else None for t in measured]

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

    def finish_all(
        self, searches: list[ProblemSearch], progress: Progress | None = None
    ) -> list[ProblemResult]:
        """Re-times every search's finalists once all searches have ended (`Retiming`)."""
        with self.clock.phase("retiming"):
            return self.retiming.finish_all(searches, self.parallel, progress)

    def tune_problem(
        self,
        problem: MatmulProblem,
        progress: Progress,
        own_bar: bool = True,
        custom_only: bool = False,
    ) -> ProblemResult:
        """One problem to the end: searched, re-timed, its winner named."""
        search = self.search_problem(problem, progress, own_bar, custom_only)
        with self.clock.phase("retiming"):
            return self.retiming.finish_problem(search)

    def search_problem(
        self,
        problem: MatmulProblem,
        progress: Progress,
        own_bar: bool = True,
        custom_only: bool = False,
        trials: int | None = None,
        deadline: float | None = None,
    ) -> ProblemSearch:
        """One problem's search: `trials` points (n_trial by default), or fewer with early
        stopping or once the `deadline` (perf_counter seconds) has passed after its first
        batch (only the points of custom kernels with `custom_only`);
        `Retiming.finish_problem` re-times it."""
        config = self.config
        search = self.start_problem(problem, progress, own_bar, custom_only=custom_only)
        if search.state is not None:
            stopped = run_search(
                search.state,
                self._measure_points(search, progress, []),
                budget=trials or config.n_trial,
                batch_size=config.batch_size,
                early_stopping=config.early_stopping,
                done=None if deadline is None else partial(_past, deadline),
            )
            if stopped == "done":
                self.log.write(f"{problem.name}: the time budget ended its search")
            if stopped == "early_stopping":
                self.log.write(f"early stop: {search.state.since_best} trials without improvement")
        search.result.search_s = time.perf_counter() - search.started
        return search

    def concurrently(self, calls: list[Callable[[], Result]]) -> list[Result]:
        """Runs the calls (each one problem's work) on up to `parallel` threads; results
        in call order (`concurrency.concurrently`)."""
        return concurrently(calls, self.parallel, self.log)

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
            self.finish(self.retiming.finished)

    def finish(
        self, results: Iterable[ProblemResult] = (), custom: Iterable[ProblemResult] = ()
    ) -> None:
        """The run's end: the CSV ranked, with the re-timed medians and the chosen rows (each
        result's winner, or IREE's default where it kept it; a custom-kernel search's winner
        only where it found one), and the benches' worker processes stopped. Nothing chosen
        when the run was interrupted."""
        chosen = {(r.problem.name, r.best.config if r.best else BASELINE) for r in results}
        chosen |= {(r.problem.name, r.best.config) for r in custom if r.best is not None}
        self.book.csv.finish(self.retiming.retimed, chosen)
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


# Why a campaign's space leaves a problem's custom points out: the custom route searches them.
CUSTOM_POINTS_LATER = "custom kernels are searched on the bare kernel, after the campaign"


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
    iree_later = "IREE configurations are searched on the model's dispatches"
    why = iree_later if custom_only else CUSTOM_POINTS_LATER
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


def resumable(search: ProblemSearch, earlier: list[Trial], limit: int | None) -> list[Trial]:
    """The earlier trials of this space, oldest first, told to the tuner and kept.

    A module's problem resumes at most n_trial points (its n_trial counts them); a model's,
    every one (`limit` None): its budget counts new trials, and every recorded point the
    tuner does not hear of could be proposed and measured again, or left out of the CSV.
    """
    index_of = {name: i for i, name in enumerate(search.names)}
    by_name = {t.config: t for t in earlier if not t.baseline}
    resumed = sorted(
        ((index_of[n], t) for n, t in by_name.items() if n in index_of), key=lambda i: i[1].time
    )
    kept = []
    for index, trial in resumed[:limit]:
        search.state.resume(index, trial.gflops if trial.timed else None)
        search.trials.append(trial)
        kept.append(trial)
    search.result.resumed = len(search.trials)
    return kept


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


def _past(deadline: float, state) -> bool:
    """A search's stop once `deadline` has passed: after its first batch, so that its
    known-good points are always measured."""
    return bool(state.order) and time.perf_counter() > deadline
