"""Fast mode's order of work: time a batch first, then build and check only the candidates
that can still win.

A candidate's answer is checked on a build of its own (the dispatch as a function of
inputs), the same compile again as its timed build: on resnet18 (CPU, 2 cores) half of a
fast search's compile work went into check builds of candidates slower than IREE's
default, which fast mode never re-times. Here a batch's timed builds are compiled and timed
first. A candidate within reach (`Reach`: at least 0.95x as fast as the default, and among
the problem's fastest checked candidates, so that it can still be a finalist) then has its
check built and run, and is recorded with both; the rest are recorded as `unchecked`, with
their times (the tuner learns from them) but never as winners. Executor-neutral: both
passes go through `Executor.run`, local or Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autosched.compile import CompileResult
from autosched.measure.contract import CHECK, TIMED, Candidate, Done, Executor, Measurement, Prepare
from autosched.outputs.records import UNCHECKED


@dataclass
class Timed:
    """A candidate timed and within reach, waiting for its check."""

    candidate: Candidate
    builds: dict[str, CompileResult]
    outcome: Measurement


def separate_check(candidate: Candidate) -> bool:
    """Whether the candidate's check is a build of its own (not its timed module)."""
    jobs = candidate.jobs
    return CHECK in jobs and TIMED in jobs and jobs[CHECK].output != jobs[TIMED].output


def _only(candidate: Candidate, role: str) -> Candidate:
    return replace(candidate, jobs={role: candidate.jobs[role]})


def merged(timed: Measurement, checked: Measurement | None) -> Measurement | None:
    """The timing's outcome with the check's verdict (the check's failure wins)."""
    if checked is None:  # the check did not build: its build's failure is the record's
        return None
    outcome = replace(
        timed,
        verification=checked.verification,
        max_error=checked.max_error,
        verify_s=checked.verify_s,
        verify_phases=dict(checked.verify_phases),
    )
    if checked.status != "ok":
        outcome.status, outcome.message = checked.status, checked.message
    return outcome


@dataclass(frozen=True)
class Reach:
    """What a candidate's first-pass time must beat to have its answer checked: the
    default's time over the re-timing's floor, and the problem's `keep` fastest checked
    candidates (a slower one could never be among the finalists re-timed)."""

    limit_ms: float
    kept_ms: tuple[float, ...] = ()  # the problem's checked candidates' first-pass times
    keep: int = 0  # finalists a problem re-times (0: no cut but the limit)

    def cutoff(self, batch_ms: list[float]) -> float:
        """The slowest time checked, given this batch's times within the limit."""
        times = sorted([*self.kept_ms, *batch_ms])
        if self.keep and len(times) >= self.keep:
            return min(self.limit_ms, times[self.keep - 1])
        return self.limit_ms


def _unchecked(outcome: Measurement, why: str) -> Measurement:
    outcome.status = UNCHECKED
    outcome.message = f"{outcome.timing.median_ms:.4g} ms, {why}: answer not checked"
    return outcome


def timed_first(
    executor: Executor,
    candidates: list[Candidate],
    prepare: Prepare,
    done: Done,
    reach: Reach,
) -> None:
    """Times `candidates` (their timed builds only), then checks those within `reach`;
    `done` hears of each candidate once, with every build it had and one outcome."""
    waiting: dict[str, Timed] = {}
    whole = {c.name: c for c in candidates}  # with both builds: the executor sees one each

    def after_timing(candidate: Candidate, builds, outcome: Measurement | None) -> None:
        if outcome is not None and outcome.status == "ok" and outcome.timing is not None:
            if outcome.timing.median_ms <= reach.limit_ms:
                waiting[candidate.name] = Timed(whole[candidate.name], builds, outcome)
                return
            why = f"out of reach of the default (within {reach.limit_ms:.4g} ms is checked)"
            outcome = _unchecked(outcome, why)
        done(whole[candidate.name], builds, outcome)

    executor.run([_only(c, TIMED) for c in candidates], prepare, after_timing)
    _check_within_reach(executor, prepare, done, reach, waiting)


def _check_within_reach(executor, prepare, done, reach: Reach, waiting: dict) -> None:
    """Checks the waiting candidates that can still be finalists, fastest first; where a
    check fails (a wrong answer, a configuration IREE did not apply), the next fastest
    moves up, so that a failed check does not leave a faster-than-default candidate
    unchecked (ViT-B/16's attention on the CPU: its two fastest points were not applied,
    and a 2.5x one was never checked). The rest are recorded unchecked."""
    kept = list(reach.kept_ms)
    pending = sorted(waiting.values(), key=lambda w: w.outcome.timing.median_ms)

    def after_check(candidate: Candidate, builds, outcome: Measurement | None) -> None:
        timed = waiting[candidate.name]
        checked = merged(timed.outcome, outcome)
        if checked is not None and checked.status == "ok":
            kept.append(timed.outcome.timing.median_ms)
        done(timed.candidate, {**timed.builds, **builds}, checked)

    while pending:
        cutoff = replace(reach, kept_ms=tuple(kept)).cutoff(
            [w.outcome.timing.median_ms for w in pending]
        )
        contenders = [w for w in pending if w.outcome.timing.median_ms <= cutoff]
        if not contenders:
            break
        pending = pending[len(contenders) :]
        executor.run([_only(w.candidate, CHECK) for w in contenders], prepare, after_check)
    for timed in pending:
        cutoff = replace(reach, kept_ms=tuple(kept)).cutoff([])
        why = f"slower than the problem's {reach.keep} fastest checked ({cutoff:.4g} ms)"
        done(timed.candidate, timed.builds, _unchecked(timed.outcome, why))
