"""Re-timing and the verdict, pure over a timer: the top candidates are timed again beside
the default, round by round, and a winner must beat the default in every round by more than
the noise. Nothing here knows a device or a file: `time_one` is any callable."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from autosched.outputs.records import Trial
from autosched.run.problem import BASELINE

RETIME_ROUNDS = 3
DRIFT_WARNING = 0.10  # flag a default that moved more than this between start and end
FAST_FLOOR = 0.95  # fast mode re-times only candidates at least this fast as the default
# ... and, after the fastest, only those within this factor of its first-pass speedup: on
# resnet18 (CPU) a third of the second finalists were 1.8-4x slower than the first.
FAST_GAP = 1.5
# A default that takes over this long a timed call is not timed again beside finalists that
# were all over CLEAR_MARGIN faster on the first pass: no noise turns that around. IREE's
# attention at 197 tokens (ViT-B/16) ran 18.5 ms a dispatch on the H100, 200 dispatches a
# call of the bare kernel's module, and each timing of it took 11 s.
SLOW_DEFAULT_CALL_S = 1.0
CLEAR_MARGIN = 10.0


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


def first_pass_speedup(trial: Trial, baseline: Trial | None) -> float | None:
    """The trial's speedup over the default timed nearest to it, from the search's timing."""
    default_ms = trial.reference_ms or (baseline.median_ms if baseline and baseline.ok else None)
    timed = trial.timed and trial.median_ms
    return default_ms / trial.median_ms if default_ms and timed else None


def finalists(
    trials: list[Trial], baseline: Trial | None, top: int, floor: float = 0.0
) -> tuple[list[Trial], list[Trial]]:
    """The top few by score, and those with the default first: what is re-timed. By score:
    each trial's speedup over the default timed nearest to it (and on its own device), not
    its raw time, which moves with the machine. With a `floor`, a trial whose first-pass
    speedup is below it is not re-timed (fast mode: a clear loser cannot turn into a win
    beyond the noise, and its re-timing costs seconds), nor one over FAST_GAP slower than
    the fastest (it cannot overtake it). A problem whose default did not build (a narrowed
    kernel's bare op IREE cannot distribute) has no speedups: there the floor cannot apply,
    and the fastest by time and those within FAST_GAP of it are re-timed."""
    ranked = sorted((t for t in trials if t.ok), key=lambda t: -t.gflops)
    if floor and not (baseline is not None and baseline.ok):
        fastest = ranked[0].gflops if ranked else 0.0
        ranked = [t for t in ranked if t.gflops * FAST_GAP >= fastest]
    elif floor:
        speedups = [(t, first_pass_speedup(t, baseline) or 0.0) for t in ranked]
        best = max((s for _, s in speedups), default=0.0)
        ranked = [t for t, s in speedups if s >= floor and s * FAST_GAP >= best]
    contenders = ranked[: max(top, 1)]
    with_default = baseline is not None and baseline.ok and contenders
    return contenders, ([baseline] if with_default else []) + contenders


def retimes_default(contenders: list[Trial], baseline: Trial | None, call_s: float) -> bool:
    """Whether the default is timed again beside `contenders` (one call of it: `call_s`)."""
    if call_s <= SLOW_DEFAULT_CALL_S:
        return True
    speedups = [first_pass_speedup(t, baseline) or 0.0 for t in contenders]
    return not speedups or min(speedups) < CLEAR_MARGIN


def timed_rounds(
    names: list[str], time_one: Callable[[str], float | None], rounds: int = RETIME_ROUNDS
) -> list[dict[str, float]]:
    """Per round, name -> ms of every name that timed, each round timing all in turn."""
    found = []
    for _ in range(rounds):
        timed_now = {}
        for name in names:
            ms = time_one(name)
            if ms is not None:
                timed_now[name] = ms
        found.append(timed_now)
    return found


@dataclass
class Retimed:
    """What re-timing found: final medians, the fastest contender and its verdict."""

    final: dict[str, float]  # name -> median over the rounds
    winner: Trial | None  # the fastest re-timed contender
    verdict: PairedVerdict | None  # against the default (None without a default timing)

    @property
    def baseline_ms(self) -> float | None:
        return self.final.get(BASELINE)

    @property
    def beats_default(self) -> bool:
        """A winner stands when it beat the default, or when there is no default to beat."""
        return self.winner is not None and (self.verdict is None or self.verdict.beats_default)


def judge(contenders: list[Trial], rounds: list[dict[str, float]]) -> Retimed:
    """The rounds' medians, the fastest contender, and its paired verdict."""
    samples: dict[str, list[float]] = {}
    for timed_now in rounds:
        for name, ms in timed_now.items():
            samples.setdefault(name, []).append(ms)
    final = {name: statistics.median(values) for name, values in samples.items()}
    timed = [t for t in contenders if t.config in final]
    winner = min(timed, key=lambda t: final[t.config]) if timed else None
    verdict = None
    if winner is not None and BASELINE in final:
        verdict = paired_verdict(rounds, winner.config)
    return Retimed(final, winner, verdict)
