"""One problem's state in a run: its search in progress and its result, and the progress
display every part of the run reports to. Plain data, shared by the run's rooms."""

from __future__ import annotations

from dataclasses import dataclass, field

from autosched.measure.contract import DispatchCheck
from autosched.measure.worker import ProblemData
from autosched.model.dispatch_benchmarks import DispatchBenchmark
from autosched.ops.base import Problem
from autosched.outputs.records import MeasureContext, Trial
from autosched.search.loop import SearchState
from autosched.search.space import SearchSpace

BASELINE = "iree_default"  # the config name of IREE's default in records


@dataclass
class ProblemResult:
    problem: Problem
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
    verdict: object = None  # retime.PairedVerdict of the fastest finalist against the default
    custom_route: bool = False  # fast mode ran no IREE candidate: a custom family covers it

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

    def start(self, problem: Problem, total: int) -> None:
        pass

    def advance(self, trial: Trial) -> None:
        pass

    def finish(self) -> None:
        pass

    def note(self, message: str) -> None:
        """A warning the user should see (it is also in run.log)."""

    def info(self, message: str) -> None:
        """A plain line the user may want (it is also in run.log): no fault."""

    def start_model(self, label: str, total: int) -> None:
        """A model's problems are searched in turns: one display for all of them."""

    def retiming(self, problem: Problem, index: int, total: int) -> None:
        """Problem `index` of `total` is re-timed, after every search has ended."""


@dataclass
class ProblemSearch:
    """One problem's search in progress: its space, tuner, inputs, default and trials.

    Held apart from `Tuning` so that several problems can be searched in turns (a model's
    budget moves between them) with the same loop that tunes one problem to the end.
    """

    problem: Problem
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
    # Seconds a candidate's check or timing may take (limits.candidate_limit), from the
    # default's record; None: the cfg's run_timeout.
    limit_s: float | None = None
    # Seconds a candidate's compile may take (limits.compile_limit), from its default's.
    compile_limit_s: float | None = None
    # Fast mode, a problem the custom route searches: the IREE route times its default
    # alone (no candidate of its own, so no check of one is prepared or probed).
    default_only: bool = False

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
