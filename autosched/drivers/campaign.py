"""A model as one tuning job: the contractions of the dispatches IREE forms, one budget
spread over them by their share of model time, one spec, and the proof on the whole model.

The budget moves between problems like MetaSchedule's gradient task scheduler: each problem's
default is measured first (its time x how often the model runs it is its share), then every
batch goes to the problem expected to cut the most model time per trial, judged by how fast
its best time has been falling. A problem not yet searched is assumed to have a lot to give,
so every problem gets tried before the budget concentrates on the ones still improving.
Where the devices allow, each round searches the best few problems at once, a batch each.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from functools import partial

from autosched.measure.contract import TIMED
from autosched.model.dispatch_benchmarks import DispatchBenchmark
from autosched.model.lowering import ModelAnalysis
from autosched.ops.contraction import Contraction
from autosched.ops.matmul import MatmulProblem
from autosched.outputs.records import json_text
from autosched.run import retime
from autosched.run.problem import ProblemResult, ProblemSearch, Progress
from autosched.run.tuning import Tuning
from autosched.search import knowledge
from autosched.search.knowledge import ShapeClass

FAST_TRIALS = 8  # trials per problem in fast mode
EXTREME_FACTOR = 4  # extreme mode: this many times n_trial per problem
CLEAR_WIN = 1.10  # fast mode: a first-pass speedup this large ends a problem's search ...
CLASS_NOISE = 0.10  # ... when within this of the best speedup its siblings reached
MINOR_SHARE = 0.02  # fast mode: a problem under this share of the tuned time gets one batch
OPTIMISM = 0.2  # share of its time a problem not yet searched is assumed able to lose
WINDOW = 2  # batches over which a problem's recent improvement is measured
# Siblings: problems of one shape class whose sizes are this close (sum of |log2| ratios:
# 4 is a batch or an image side 16x apart, or one stage of a CNN to the next).
SIBLING_DISTANCE = 4.0
SIBLING_WINNERS = 2  # a problem's best points each sibling measures first


@dataclass
class ModelProblem:
    """One tunable contraction of the model and its search."""

    problem: MatmulProblem
    contraction: Contraction
    search: ProblemSearch | None = None
    result: ProblemResult | None = None
    benchmark: DispatchBenchmark | None = None  # IREE's own dispatch, to time candidates on
    history: list[float] = field(default_factory=list)  # best first-pass ms after each batch
    done: bool = False  # searched to the end: space exhausted or a clear win in fast mode
    shape_class: ShapeClass | None = None  # its class on the run's target (siblings share)
    new_trials: int = 0  # trials this run measured for it
    known_first: bool = False  # its first batch was known points (knowledge base, siblings)
    confirmed: bool = False  # fast mode: its win re-timed, paired, and its search finished

    @property
    def occurrences(self) -> int:
        return self.contraction.occurrences

    @property
    def default_ms(self) -> float | None:
        baseline = self.search.result.baseline if self.search else None
        return baseline.median_ms if baseline is not None and baseline.ok else None


def trials_per_problem(mode: str, n_trial: int) -> int:
    """The trials a mode gives each problem (the custom route's per kernel search too)."""
    return {"fast": FAST_TRIALS, "normal": n_trial, "extreme": EXTREME_FACTOR * n_trial}[mode]


def budget_for(mode: str, n_trial: int, problems: list[ModelProblem]) -> int:
    """The total trials a mode gives a model when --budget is not given."""
    return trials_per_problem(mode, n_trial) * len(problems)


def expected_gain(entry: ModelProblem) -> float:
    """Model time (ms per inference) one more trial is expected to save on this problem."""
    if entry.done or not entry.history:
        return 0.0
    best = entry.history[-1]
    if len(entry.history) <= WINDOW:
        rate = OPTIMISM * best  # not yet searched: assume much to gain
    else:
        rate = max(entry.history[-1 - WINDOW] - best, 0.0) / WINDOW + 0.01 * best
    return rate * entry.occurrences


def pick_next(problems: list[ModelProblem]) -> ModelProblem | None:
    """The problem whose next batch is expected to save the most model time (pure).

    Problems not searched yet come first, the largest share of model time first, so that
    a small budget is not spent on one problem before the others were tried.
    """
    open_problems = [p for p in problems if not p.done and p.history]
    if not open_problems:
        return None
    untried = [p for p in open_problems if len(p.history) == 1]
    if untried:
        return max(untried, key=lambda p: p.history[-1] * p.occurrences)
    return max(open_problems, key=lambda p: (expected_gain(p), p.history[-1] * p.occurrences))


def opening_history(search: ProblemSearch) -> list[float]:
    """A problem's history as its search starts: its best time, and again for a problem
    whose trials were resumed (its first batch ran in an earlier run), so that `pick_next`
    counts it as tried. Without that, a resumed campaign gave its first batches to the
    problems already searched, largest share first, and the untried ones waited again
    (mobilenet_v3_large on the H200, session 24: 28 of 46 untried before and after)."""
    best = search.best_ms or math.inf
    return [best, best] if search.trials else [best]


def pick_round(problems: list[ModelProblem], count: int) -> list[ModelProblem]:
    """Up to `count` distinct problems to search at the same time, in `pick_next`'s order."""
    chosen: list[ModelProblem] = []
    while len(chosen) < count:
        entry = pick_next([p for p in problems if p not in chosen])
        if entry is None:
            break
        chosen.append(entry)
    return chosen


def untried(problems: list[ModelProblem]) -> list[str]:
    """Problems that had candidates to try and ran none (the budget ended first), the
    largest share of model time first."""
    left = [p for p in problems if not p.done and p.history and not p.search.trials]
    left.sort(key=lambda p: -p.history[0] * p.occurrences)
    return [p.problem.name for p in left]


def first_batch(budget: int, problems: int, batch_size: int) -> int:
    """Trials of a problem's first batch: a batch, or a fair part of a smaller budget."""
    return max(1, min(batch_size, budget // max(problems, 1)))


def shares(times: dict[str, float], problems: list[ModelProblem]) -> dict[str, float]:
    """Each problem's share of the tuned contractions' time (its ms x occurrences)."""
    weighted = {p.problem.name: times[p.problem.name] * p.occurrences for p in problems}
    total = sum(weighted.values()) or 1.0
    return {name: value / total for name, value in weighted.items()}


def seeded(entry: ModelProblem) -> int:
    """Points queued before the tuner's own picks (known-good, a sibling's winners)."""
    state = entry.search.state if entry.search else None
    return len(state.queued) if state is not None else 0


def siblings(entry: ModelProblem, problems: list[ModelProblem]) -> list[ModelProblem]:
    """Open problems of `entry`'s shape class within SIBLING_DISTANCE, nearest first."""
    near = []
    for other in problems:
        if other is entry or other.done or other.search is None or other.search.state is None:
            continue
        distance = _distance(entry, other) if entry.shape_class else math.inf
        if distance <= SIBLING_DISTANCE:
            near.append((distance, other))
    return [other for _, other in sorted(near, key=lambda item: item[0])]


def first_pass_speedup(entry: ModelProblem) -> float:
    """The problem's best first-pass time against its default's (1.0 when none)."""
    if entry.search is None or not entry.default_ms or not entry.search.best_ms:
        return 1.0
    return entry.default_ms / entry.search.best_ms


def class_speedup(entry: ModelProblem) -> float:
    """What the problem showed its class: its paired verdict's median once that confirmed
    its win, else its best first-pass speedup."""
    verdict = entry.search.result.verdict if entry.confirmed and entry.search else None
    return verdict.median if verdict is not None else first_pass_speedup(entry)


def class_best(entry: ModelProblem, problems: list[ModelProblem], own: float) -> float:
    """The best speedup seen in the problem's class: its siblings' (open or done), or `own`."""
    near = [p for p in problems if p is not entry and p.shape_class and entry.shape_class]
    near = [p for p in near if _distance(entry, p) <= SIBLING_DISTANCE]
    return max((class_speedup(p) for p in near), default=own)


def clear_win(entry: ModelProblem, problems: list[ModelProblem]) -> bool:
    """A first-pass speedup of CLEAR_WIN over the default that is also within CLASS_NOISE
    of the best speedup seen in its class: a sibling's winner that helps a little is not
    where a sibling's search stops. Fast mode then checks it paired (`confirmed_win`)."""
    speedup = first_pass_speedup(entry)
    best = class_best(entry, problems, speedup)
    return speedup >= CLEAR_WIN and speedup >= (1 - CLASS_NOISE) * best


def confirmed_win(entry: ModelProblem, problems: list[ModelProblem], tuning: Tuning) -> bool:
    """Whether a clear win of the first pass ends the problem's search: it is re-timed at
    once beside the default (the re-timing every search ends with, between rounds, when
    nothing else runs), and the search ends only where that paired verdict beats the
    default and stays within the larger of its noise and CLASS_NOISE of the best its class
    showed. Else the finish is taken back and the search goes on. On resnet18 (CPU) a
    3x3 convolution's 2.81x first pass was 1.41x paired, and normal mode found 2.51x."""
    name, first = entry.problem.name, first_pass_speedup(entry)
    with tuning.clock.phase("retiming"):
        result = tuning.retiming.finish_problem(entry.search)
    verdict = result.verdict if result.best is not None else None
    paired = verdict.median if verdict is not None else 0.0
    best = class_best(entry, problems, paired)
    if verdict is not None and paired >= (1 - max(CLASS_NOISE, verdict.noise)) * best:
        entry.confirmed = True
        tuning.log.write(
            f"{name}: fast mode ends its search: a clear win ({first:.2f}x on the first pass, "
            f"{paired:.2f}x paired with the default)"
        )
        return True
    tuning.retiming.reopen(entry.search)
    why = (
        f"{paired:.2f}x, under the {best:.2f}x its class reached"
        if verdict is not None
        else "no candidate beat the default beyond the noise"
    )
    tuning.log.write(
        f"{name}: the first pass's {first:.2f}x is not confirmed paired with the default "
        f"({why}): the search goes on"
    )
    return False


def minor(entry: ModelProblem, problems: list[ModelProblem]) -> bool:
    """Whether the problem's default takes under MINOR_SHARE of the tuned problems' time:
    fast mode gives it its first batch (its known points) and no more. On resnet18 (CPU) a
    0.1 % classifier matmul took as many trials as the 27 % convolution."""
    timed = [p for p in problems if p.default_ms]
    if entry.default_ms is None or not timed:
        return False
    return (
        shares({p.problem.name: p.default_ms for p in timed}, timed)[entry.problem.name]
        < MINOR_SHARE
    )


def best_candidate_speedup(entry: ModelProblem) -> float | None:
    """The fastest first-pass speedup of the problem's candidates over the default timed
    nearest to each (the default itself left out); None before any candidate timed."""
    search = entry.search
    baseline = search.result.baseline if search else None
    speedups = [retime.first_pass_speedup(t, baseline) for t in (search.trials if search else [])]
    return max(filter(None, speedups), default=None)


def known_points_lose(entry: ModelProblem) -> bool:
    """Whether the problem's first batch, known points only (the knowledge base's, its
    siblings'), left every candidate out of reach of its default (under FAST_FLOOR, where
    fast mode does not even re-time them). The points around them rarely do better: on
    resnet18 (CPU) the three strided 3x3 convolutions' 18 neighbours of their known points
    ran 0.26-0.76x, and normal mode's 72 trials on them found nothing faster either."""
    if not entry.known_first or len(entry.history) != 2:
        return False
    best = best_candidate_speedup(entry)
    return best is not None and best < retime.FAST_FLOOR


def leave_to_custom_route(tuning: Tuning, problems: list[ModelProblem], covered) -> None:
    """Fast mode: a problem the custom route searches (`covered`, its names:
    custom_route.custom_coverage) runs no IREE candidate (its default is timed; the custom
    route searches it next). On sm_90 the custom kernels of every Llama matmul ran about 3x
    faster than the best IREE configuration found, and the model took the custom kernel
    each time, yet the IREE search of those problems (a first batch of known points, then
    its re-timing) took 34 of the Llama-3-8B layer's 139 s. A problem the route does not
    search after all (a collapsed convolution whose op form no family takes) keeps its IREE
    search. Where a custom winner does not reach the model, IREE's default stays for its
    op, and the run says so (`not_placed`)."""
    for entry in problems:
        if not entry.done and entry.problem.name in covered:
            entry.done = entry.search.result.custom_route = True
            tuning.log.write(
                f"{entry.problem.name}: fast mode leaves it to the custom route (a custom "
                "kernel family covers it): no IREE candidate"
            )


def fast_stop(entry: ModelProblem, problems: list[ModelProblem], tuning: Tuning) -> bool:
    """Whether fast mode ends the problem's search after this batch (run.log says why)."""
    if clear_win(entry, problems) and confirmed_win(entry, problems, tuning):
        return True
    if known_points_lose(entry):
        why = (
            f"its known points are out of reach of IREE's default (at best "
            f"{best_candidate_speedup(entry):.2f}x on the first pass): the default stays"
        )
    elif minor(entry, problems):
        why = f"under {MINOR_SHARE:.0%} of the tuned problems' time"
    else:
        return False
    tuning.log.write(f"{entry.problem.name}: fast mode ends its search: {why}")
    return True


def _distance(entry: ModelProblem, other: ModelProblem) -> float:
    distance = entry.shape_class.distance(other.shape_class)
    return math.inf if distance is None else distance


def share_winners(entry: ModelProblem, problems: list[ModelProblem], tuning: Tuning) -> None:
    """`entry`'s best points that beat its default beyond the noise go first in each
    sibling's next batch (as the nearest point of the sibling's space), so that problems
    that differ in batch or image size are not each searched from scratch."""
    search = entry.search
    default = search.result.baseline if search else None
    if default is None:
        return
    wins = [t for t in search.trials if knowledge.beats_default(t, default) and t.point]
    wins = sorted(wins, key=lambda t: t.median_ms)[:SIBLING_WINNERS]
    for other in siblings(entry, problems) if wins else []:
        state = other.search.state
        points = other.search.space.points
        seeds = knowledge.seed_indices([t.point for t in wins], points, skip=state.order)
        if not seeds or state.queued[: len(seeds)] == seeds:
            continue
        state.queued = seeds + [i for i in state.queued if i not in seeds]
        names = ", ".join(other.search.names[i] for i in seeds)
        tuning.log.write(
            f"{other.problem.name}: measured first: {names} "
            f"(the winners of its sibling {entry.problem.name})"
        )


def queue_neighbours(entry: ModelProblem, tuning: Tuning) -> None:
    """Fast mode: the problem's next batch goes one step around its fastest point (after
    any sibling's winners) rather than to the cost model's first spread over the whole
    space. On resnet18 (CPU) that spread was the tuner's corners: 45 trials, none within
    reach of the known points' times, some 10-100x slower than IREE's default."""
    search = entry.search
    timed = [t for t in search.trials if t.timed and t.point and t.median_ms]
    if search.state is None or not timed:
        return
    best = min(timed, key=lambda t: t.median_ms)
    state = search.state
    skip = [*state.order, *state.queued]
    around = knowledge.neighbours(best.point, search.space.points, skip, tuning.config.seed)
    if around:
        state.queued = [*state.queued, *around]
        tuning.log.write(f"{entry.problem.name}: next, the points around {best.config}")


@dataclass
class CampaignReport:
    """What the summary JSON holds besides the whole-model proof."""

    budget: int  # new trials this run may measure
    trials: int  # new trials this run measured
    mode: str
    search_s: float
    phases_s: dict[str, float] = field(default_factory=dict)  # run/phases.py: wall s by phase
    candidates_s: dict[str, dict] = field(default_factory=dict)  # compile/check/time split
    problems: list[dict] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    custom_trials: int = 0  # custom kernels searched on their bare kernels after the campaign
    dispatches: list[dict] = field(default_factory=list)  # every dispatch, before and after
    # Every dispatch of the model built with its custom kernels (when they won).
    custom_dispatches: list[dict] = field(default_factory=list)
    # {"problem", "route", "reason"} of each winner not in the built model (empty: all placed).
    not_placed: list[dict] = field(default_factory=list)
    resumed: int = 0  # earlier trials resumed from the database (not counted in the budget)


def start_searches(
    tuning: Tuning,
    problems: list[ModelProblem],
    progress: Progress,
    default_only: Collection[str] = (),
) -> None:
    """Every problem's search started (its default, its resumed records, its known points),
    several at once, and its shape class for its siblings. What the starts compile is
    compiled first, on every core at once. A problem `default_only` names has its default
    timed alone: no check module, no spec probe (on resnet50 at batch 32 the checks of
    IREE's default on six convolutions' own modules each ran past a minute, and fast mode
    then ran out of its call before any kernel was searched)."""
    opened = [tuning.open_search(entry.problem, entry.benchmark) for entry in problems]
    for entry, search in zip(problems, opened, strict=True):
        search.default_only = entry.problem.name in default_only
    with tuning.clock.phase("defaults"):
        tuning.builds.prebuild(opened)
    searches = tuning.concurrently(
        [
            partial(
                tuning.start_problem,
                entry.problem,
                progress,
                own_bar=False,
                benchmark=entry.benchmark,
                resume_all=True,
                search=search,
            )
            for entry, search in zip(problems, opened, strict=True)
        ]
    )
    for entry, search in zip(problems, searches, strict=True):
        entry.search = search
        target = tuning.target.for_problem(entry.problem)
        entry.shape_class = ShapeClass.of(target.name, target.arch, entry.problem.record_shape())
        entry.history.extend(opening_history(search))
        entry.done = search.exhausted or entry.default_ms is None


def compile_first_batches(tuning: Tuning, problems: list[ModelProblem], size: int) -> None:
    """Fast mode: every problem's first batch (its queued known points, at most `size`)
    has its timed builds compiled at once, on every core, before the first round. A batch
    at a time, the two or three compiles of each left a core idle for part of it (resnet18
    on 2 cores: 12 such batches)."""
    jobs = []
    for entry in problems:
        search = entry.search
        if entry.done or search is None or search.state is None or not search.benchmark:
            continue
        for index in search.state.queued[:size]:  # (a resumed point left the queue)
            name, point = search.names[index], search.space.points[index]
            jobs.append(tuning.builds.candidate(search, name, point).jobs[TIMED])
    if jobs:
        tuning.log.write(f"the first batches' {len(jobs)} timed builds compiled on every core")
        tuning.builds.compile_ahead(jobs)


def run_campaign(
    tuning: Tuning,
    problems: list[ModelProblem],
    progress: Progress,
    budget: int,
    mode: str,
    time_budget_s: float | None = None,
    custom_route: Collection[str] = (),
) -> CampaignReport:
    """Searches the model's problems under one budget of trials and of wall time; in fast
    mode, none of those the custom route searches (`custom_route`, their names)."""
    started = time.perf_counter()
    config = tuning.config
    start_searches(tuning, problems, progress, custom_route if mode == "fast" else ())
    # The budget is this run's new trials: every resumed record is told to the tuner and
    # kept in the CSV, and counted apart.
    resumed = sum(p.search.result.resumed for p in problems)
    used = 0
    first = first_batch(budget - used, len(problems), config.batch_size)
    # Fast mode: no problem takes more than its share, so that the trials a problem ended
    # early (a clear win of known points) saves are not spent on the others.
    share = math.ceil(budget / max(len(problems), 1)) if mode == "fast" else budget
    if mode == "fast":
        leave_to_custom_route(tuning, problems, custom_route)
        compile_first_batches(tuning, problems, min(first, share))
    ended = f"the budget of {budget} trial{'s' * (budget != 1)} was used"
    while used < budget:
        if time_budget_s is not None and time.perf_counter() - started > time_budget_s:
            ended = f"the time budget of {time_budget_s / 60:g} min was reached"
            tuning.log.write(ended)
            break
        batches = []  # (problem, trials) for this round, one batch per problem
        for entry in pick_round(problems, tuning.parallel):
            size = config.batch_size if len(entry.history) > 1 else first
            if mode == "fast" and len(entry.history) == 1:
                entry.known_first = seeded(entry) > 0
                size = min(size, seeded(entry) or size)  # known points alone, then judged
            size = min(size, budget - used - sum(n for _, n in batches))
            size = min(size, share - entry.new_trials)
            if size > 0:
                batches.append((entry, size))
        if not batches:
            break
        measured = tuning.concurrently(
            [partial(tuning.step, entry.search, size, progress) for entry, size in batches]
        )
        for (entry, _), trials in zip(batches, measured, strict=True):
            used += len(trials)
            entry.new_trials += len(trials)
            entry.history.append(entry.search.best_ms or math.inf)
            if config.knowledge != "none":
                share_winners(entry, problems, tuning)
            if not trials:
                entry.done = True
            elif mode == "fast":
                entry.done = fast_stop(entry, problems, tuning)
            entry.done = entry.done or entry.new_trials >= share
            if mode == "fast" and not entry.done:
                queue_neighbours(entry, tuning)
    left = untried(problems)
    if left:
        names = ", ".join(left[:3]) + (", ..." if len(left) > 3 else "")
        tuning.book.warn(
            f"{ended} before {len(left)} of {len(problems)} problems ran a trial ({names}): "
            "IREE's default stays for them; a larger budget resumes from the database",
            progress,
        )
    finish(tuning, problems, progress)
    return CampaignReport(
        budget=budget,
        trials=used,
        mode=mode,
        search_s=time.perf_counter() - started,
        resumed=resumed,
    )


def finish(tuning: Tuning, problems: list[ModelProblem], progress: Progress) -> None:
    """Every problem's result: the searches re-timed once all have ended, except those
    fast mode finished already (a clear win confirmed paired: `confirmed_win`)."""
    unfinished = [p for p in problems if not p.confirmed]
    results = tuning.finish_all([p.search for p in unfinished], progress)
    for entry, result in zip(unfinished, results, strict=True):
        entry.result = result
    for entry in problems:
        if entry.confirmed:
            entry.result = entry.search.result


def problem_rows(problems: list[ModelProblem], applied: dict[str, bool]) -> list[dict]:
    """The summary's per-problem rows: share of model time before and after, and the spec."""
    before = {p.problem.name: p.result.baseline_ms or p.default_ms or 0.0 for p in problems}
    after = {
        p.problem.name: (p.result.best_ms if p.result.best else before[p.problem.name])
        for p in problems
    }
    share_before, share_after = shares(before, problems), shares(after, problems)
    rows = []
    for p in problems:
        name = p.problem.name
        rows.append(
            {
                "problem": name,
                "kind": p.problem.kind,
                "dispatches": sorted({s.entry_point for s in p.contraction.sites}),
                "occurrences": p.occurrences,
                "fuses": sorted({op for s in p.contraction.sites for op in s.fused_ops}),
                "share": round(share_before[name], 4),
                "share_after": round(share_after[name], 4),
                "default_ms": before[name],
                "best_ms": after[name],
                "speedup": p.result.speedup,
                "trials": len(p.result.trials),
                "timed_on": p.benchmark.entry_point if p.benchmark else "kernel",
                "timed_form": p.result.timed_form,
                "not_applied": p.result.not_applied,
                "default_drift": p.result.drift,
                "default_timings_ms": p.result.default_ms,
                "stopped": p.result.stopped,
                "in_spec": p.result.best is not None,
                "applied_in_model": applied.get(name, False),
            }
        )
    return rows


def write_summary(path: str, proof: dict | None, report: CampaignReport) -> str:
    """`<output>.summary.json`: the model line's numbers and one row per problem."""
    data = {"model": proof, **asdict(report)}
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(json_text(data, indent=2, default=str) + "\n")
    os.replace(temporary, path)
    return path


def skipped_summary(analysis: ModelAnalysis, not_matmul: list[Contraction]) -> dict[str, int]:
    """Reason -> count of the model's dispatch roots that are not tuned."""
    counts = dict(analysis.skipped_counts())
    if not_matmul:
        counts["contraction without a matmul form"] = len(not_matmul)
    return counts
