"""Where a run's wall time goes: the phases of a model run (lowering, the dispatch dump, the
defaults, each route's search, the re-timing, the spec check, the proof, the dispatch tables)
and the per-candidate split of compile, check and time, from what the records hold.

The stages own one `PhaseClock` and pass it on; nothing here is global. Phases may nest (the
defaults and the re-timing run inside a route's search) and may run on several threads at
once (problems searched at the same time): a phase's time is the wall time during which at
least one of its entries was open, never the sum over threads.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from autosched.outputs.records import Trial

# Every phase a run may name, in the order it happens, with the words the block prints.
PHASES = {
    "lowering": "lowering",
    "dispatch_dump": "dispatch dump",
    "search_iree": "search: IREE configurations",
    "search_custom": "search: custom kernels",
    "defaults": "  default builds and timings",
    "retiming": "  re-timing",
    "in_place": "custom kernels in place",
    "spec_check": "spec check",
    "proof": "proof builds",
    "dispatch_tables": "dispatch tables",
}
INSIDE_SEARCH = ("defaults", "retiming")  # phases that run inside a route's search


@dataclass
class PhaseClock:
    """Wall seconds of each named phase since the clock was made (`phase`)."""

    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=dict)
    # Phase -> (entries open now, when the first of them opened).
    _open: dict[str, tuple[int, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Counts the time inside the block towards `name` (once, however many threads
        are inside it at the same time)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r} (known: {', '.join(PHASES)})")
        now = time.perf_counter()
        with self._lock:
            count, since = self._open.get(name, (0, now))
            self._open[name] = (count + 1, since)
        try:
            yield
        finally:
            now = time.perf_counter()
            with self._lock:
                count, since = self._open.pop(name)
                if count > 1:
                    self._open[name] = (count - 1, since)
                else:
                    self.seconds[name] = self.seconds.get(name, 0.0) + now - since

    def total(self) -> float:
        return time.perf_counter() - self.started

    def summary(self) -> dict[str, float]:
        """The summary's `phases_s`: each phase entered, in PHASES order, and the total."""
        with self._lock:
            found = {name: round(self.seconds[name], 3) for name in PHASES if name in self.seconds}
        return {**found, "total": round(self.total(), 3)}


@dataclass(frozen=True)
class StepTimes:
    """One step of a candidate's measurement over a run's candidates: its median and total."""

    count: int
    median_s: float
    total_s: float

    @classmethod
    def of(cls, values: Iterable[float | None]) -> StepTimes:
        kept = [v for v in values if v is not None]
        median = statistics.median(kept) if kept else 0.0
        return cls(len(kept), round(median, 3), round(sum(kept), 3))


def candidate_split(trials: list[Trial]) -> dict[str, dict]:
    """The summary's `candidates_s`: how many candidates this run measured, and the median
    and total seconds of their compiles, checks and timings (`Trial.compile_s`, `verify_s`,
    `timing_s`)."""
    steps = {
        "compile": StepTimes.of(t.compile_s for t in trials),
        "check": StepTimes.of(t.verify_s for t in trials),
        "time": StepTimes.of(t.timing_s for t in trials),
    }
    split: dict[str, dict] = {"candidates": {"count": len(trials)}}
    for step, times in steps.items():
        split[step] = {"median": times.median_s, "total": times.total_s}
    return split


def split_line(trials: list[Trial]) -> str:
    """`candidates: N measured; compile A s median (B s in all), check ..., time ...`."""
    split = candidate_split(trials)
    parts = [
        f"{step} {split[step]['median']:.2f} s median ({split[step]['total']:.1f} s in all)"
        for step in ("compile", "check", "time")
    ]
    return f"candidates: {split['candidates']['count']} measured; " + ", ".join(parts)


def time_lines(clock: PhaseClock, trials: list[Trial]) -> list[str]:
    """The run's closing block: each phase's seconds and the per-candidate split."""
    phases = clock.summary()
    lines = [f"where the time went ({phases.pop('total'):.1f} s in all):"]
    nested = "search_iree" in phases or "search_custom" in phases  # a model run's
    labels = {name: PHASES[name] if nested else PHASES[name].strip() for name in phases}
    width = max(map(len, labels.values()), default=0)
    for name, seconds in phases.items():
        inside = " (inside the searches)" if nested and name in INSIDE_SEARCH else ""
        lines.append(f"  {labels[name]:<{width}} {seconds:8.1f} s{inside}")
    lines.append(f"  {split_line(trials)}")
    return lines
