"""Trials: made from a candidate's builds and its bench's outcome, recorded the moment they
are done (the database first, then each recorder: the CSV, run.log, any caller's), and read
back to resume a problem or to seed a cost model with other problems' records."""

from __future__ import annotations

import threading
from collections.abc import Callable

from autosched.compile import CompileResult
from autosched.config import RunConfig
from autosched.measure.contract import TIMED, Candidate, Measurement
from autosched.ops.base import Problem
from autosched.outputs.records import UNCHECKED, Trial, TuningDatabase, problem_shape
from autosched.outputs.report import CsvReport, RunLog
from autosched.run.limits import OVER_LIMIT
from autosched.run.problem import ProblemSearch, Progress
from autosched.search import knowledge
from autosched.search.history import database_history
from autosched.search.space import SearchSpace
from autosched.search.tuners import History
from autosched.targets.base import Target


def build_message(failed: CompileResult | None, builds: dict[str, CompileResult]) -> str:
    """Why a build failed; a dispatch build's failure says so."""
    if failed is None:
        return ""
    if failed is builds.get(TIMED) and builds[TIMED].job.output.endswith(".dispatch.vmfb"):
        return f"dispatch: {failed.message}"
    return failed.message


def describe(trial: Trial) -> str:
    if trial.ok:
        return (
            f"{trial.median_ms:.4g} ms (cv {trial.cv:.1%}), {trial.gflops:.4g} GFLOP/s, "
            f"compile {trial.compile_s:.2f} s"
        )
    return f"{trial.status}: {trial.message}"


def _built(search: ProblemSearch, candidate: Candidate, builds, target: Target, version: str):
    """The record of a candidate's builds (its status is the first failed build's)."""
    problem, point = search.problem, candidate.point
    failed = next((r for r in builds.values() if r.status != "ok"), None)
    return Trial(
        problem=problem.name,
        target=target.name,
        arch=target.arch,
        config=candidate.name,
        point=dict(point or {}),
        baseline=point is None,
        status=failed.status if failed else "ok",
        compile_status=failed.status if failed else "ok",
        compile_s=round(sum({r.job.output: r.seconds for r in builds.values()}.values()), 3),
        message=build_message(failed, builds),
        iree_version=version,
        device=search.context.device,
        flags=search.context.flags,
        shape=problem_shape(problem),
        features=target.for_problem(problem).features(problem, point) if point else {},
    )


def make_trial(
    search: ProblemSearch,
    candidate: Candidate,
    builds: dict[str, CompileResult],
    outcome: Measurement | None,
    target: Target,
    version: str,
    primary_device: str,
) -> Trial:
    """The record of one candidate: its builds, then its bench's outcome, if any."""
    trial = _built(search, candidate, builds, target, version)
    if outcome is None:
        return trial
    # The primary bench's records name the run's device (so that a one-device run resumes
    # them), the others their own URI.
    trial.device = search.context.device if outcome.device == primary_device else outcome.device
    trial.verify_s, trial.timing_s = outcome.verify_s, outcome.timing_s
    trial.verify_phases = dict(outcome.verify_phases)
    trial.verification, trial.max_error = outcome.verification, outcome.max_error
    trial.status, trial.message = outcome.status, outcome.message
    if outcome.status == "timeout" and search.limit_s is not None and not trial.baseline:
        trial.message = f"{OVER_LIMIT} ({outcome.message})"  # stopped by its own limit
    if outcome.status not in ("ok", UNCHECKED):
        return trial
    timing = outcome.timing
    trial.median_ms, trial.cv, trial.samples_ms = timing.median_ms, timing.cv, timing.samples_ms
    # The score is the trial's speedup over its own device's latest timing of the default,
    # on the scale of the primary's first default (the tuner compares one scale): a default
    # that drifts between batches moves the candidates with it.
    own_default = search.reference_ms.get(outcome.device)
    primary_default = search.device_default_ms.get(primary_device)
    scale = primary_default / own_default if own_default and primary_default else 1.0
    trial.reference_ms = own_default
    trial.gflops = search.problem.flops / (timing.median_ms * scale * 1e6)
    return trial


def not_tried_trial(
    search: ProblemSearch, candidate: Candidate, target: Target, version: str, why: str
) -> Trial:
    """The record of a candidate that is not built (`limits.TimedOut`): a timeout, with why."""
    trial = _built(search, candidate, {}, target, version)
    trial.status, trial.compile_status, trial.compile_s, trial.message = "timeout", "", None, why
    return trial


class TrialBook:
    """A run's records: one trial at a time, whichever problem's thread it comes from."""

    def __init__(self, config: RunConfig, target: Target, log: RunLog, lock: threading.RLock):
        self.config, self.target, self.log, self.lock = config, target, log, lock
        self.database = TuningDatabase(config.database)
        self.csv = CsvReport(config.output_file, tuple(k.name for k in target.all_knobs()))
        self.warned_unreadable = False
        # The knowledge base, read once and up front: a user's file that cannot be read
        # is one error before anything is measured.
        source = config.knowledge
        self.known = knowledge.load(source) if source != "none" else knowledge.Knowledge()
        # Told of every trial, new or resumed, after the database: the CSV and run.log (a
        # caller may add its own).
        self.recorders: list[Callable[[ProblemSearch, Trial], None]] = [
            self._to_csv,
            self._to_log,
        ]

    def record(
        self, search: ProblemSearch, trial: Trial, progress: Progress, new: bool = True
    ) -> None:
        """Hands one trial to the recorders, in order: the database (a new measurement,
        not a resumed one), then each recorder, then the progress display."""
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
            self.log.write(f"  {trial.config}: {describe(trial)}")

    def warn(self, message: str, progress: Progress) -> None:
        self.log.write(f"warning: {message}")
        progress.note(message)

    def inform(self, message: str, progress: Progress) -> None:
        self.log.write(f"note: {message}")
        progress.info(message)

    def earlier(self, search: ProblemSearch, progress: Progress) -> list[Trial]:
        """This problem's records that can be resumed; unreadable lines are a warning."""
        problem, database = search.problem, self.database
        with self.lock:  # not while another problem's thread appends
            earlier = database.load(problem.name, self.target.name, self.target.arch)
        if database.skipped and not self.warned_unreadable:
            self.warned_unreadable = True  # the same lines, read again for every problem
            reasons = ", ".join(f"{n} {r}" for r, n in database.skipped.most_common(3))
            self.warn(
                f"skipped {database.skipped.total()} unreadable line(s) of "
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

    def history(self, problem: Problem, space: SearchSpace) -> History:
        """Other problems' records in the database, in this space's feature columns."""
        if not space.points:
            return []
        with self.lock:  # not while another problem's thread appends
            trials = self.database.records()
        columns = list(self.target.for_problem(problem).features(problem, space.points[0]))
        return database_history(trials, self.target, problem, columns)

    def seed(self, search: ProblemSearch) -> list[int]:
        """Puts the knowledge base's points for this problem's shape class (the shipped or
        the cfg's base, and this run's database) in its first batch, as points of its own
        space (`knowledge.first_points`: its own class's before the target's starting
        points, near classes' after them); returns their indices. Call before resuming: a seed
        already measured is then resumed, not measured again."""
        state, source = search.state, self.config.knowledge
        if state is None or source == "none":
            return []
        with self.lock:  # not while another problem's thread appends
            own = knowledge.from_trials(self.database.records())
        target = self.target.for_problem(search.problem)
        shape = knowledge.ShapeClass.of(target.name, target.arch, problem_shape(search.problem))
        found = self.known.merged(own).nearest(shape)
        queued = knowledge.first_points(found, search.space.points, state.queued)
        seeds = [i for i in queued if i not in state.queued]
        if not seeds:
            return []
        state.queued = queued
        sources = ", ".join(sorted({s.problem for s in found}))
        names = ", ".join(search.names[i] for i in seeds)
        self.log.write(
            f"measured first: {names} (known-good points of {sources}; knowledge = none "
            "leaves them out)"
        )
        return seeds
