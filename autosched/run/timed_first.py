"""Fast mode's order of work: time a batch first, then build and check only the candidates
that can still win.

A candidate's answer is checked on a build of its own (the dispatch as a function of
inputs), the same compile again as its timed build: on resnet18 (CPU, 2 cores) half of a
fast search's compile work went into check builds of candidates slower than IREE's
default, which fast mode never re-times. Here a batch's timed builds are compiled and timed
first; a candidate within reach of the default (`reach_ms`) then has its check built and
run, and is recorded with both; the rest are recorded as `unchecked`, with their times
(the tuner learns from them) but never as winners. Executor-neutral: both passes go
through `Executor.run`, local or Ray.
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


def timed_first(
    executor: Executor,
    candidates: list[Candidate],
    prepare: Prepare,
    done: Done,
    reach_ms: float,
) -> None:
    """Times `candidates` (their timed builds only), then checks those at most `reach_ms`;
    `done` hears of each candidate once, with every build it had and one outcome."""
    waiting: dict[str, Timed] = {}
    whole = {c.name: c for c in candidates}  # with both builds: the executor sees one each

    def after_timing(candidate: Candidate, builds, outcome: Measurement | None) -> None:
        if outcome is not None and outcome.status == "ok" and outcome.timing is not None:
            if outcome.timing.median_ms <= reach_ms:
                waiting[candidate.name] = Timed(whole[candidate.name], builds, outcome)
                return
            outcome.status = UNCHECKED
            outcome.message = (
                f"{outcome.timing.median_ms:.4g} ms, out of reach of the default "
                f"(within {reach_ms:.4g} ms is checked): answer not checked"
            )
        done(whole[candidate.name], builds, outcome)

    executor.run([_only(c, TIMED) for c in candidates], prepare, after_timing)

    def after_check(candidate: Candidate, builds, outcome: Measurement | None) -> None:
        timed = waiting[candidate.name]
        done(timed.candidate, {**timed.builds, **builds}, merged(timed.outcome, outcome))

    contenders = [_only(w.candidate, CHECK) for w in waiting.values()]
    if contenders:
        executor.run(contenders, prepare, after_check)
