"""Replays tuners against a recorded landscape: no compiler, no device, seconds per run.

Each (problem, tuner, seed) run asks the tuner for batches and answers with the recorded
scores, exactly as the real loop would with measurements. Two numbers summarise a run:

* trials to 95%: how many measurements until one is within 95% of the best recorded point.
  A run keeps going past `n_trial` until it gets there or the tuner has nothing left, so
  slow tuners are not all cut to the same number. A run that never gets there (grid with a
  budget smaller than the space can miss the fast corner) counts as space size + 1:
  worse than measuring everything.
* best fraction at N: the best score among the first `n_trial` measurements / the best
  recorded score.

Both are summarised by their median over seeds.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field

import click
import numpy as np

from autosched.config import STARTING_POINTS
from autosched.errors import UserError
from autosched.search.history import landscape_history
from autosched.search.landscape import Landscape, load_landscapes
from autosched.search.loop import SearchState, search
from autosched.search.tuners import TUNER_NAMES, History, make_tuner

TARGET_FRACTION = 0.95
LOOSE_FRACTION = 0.90


@dataclass
class Replay:
    """One tuner run with one seed."""

    trials_to_95: int  # space size + 1 when never reached
    best_fraction_at_n: float
    order: list[int]  # the points in the order they were measured
    trials_to_90: int = 0  # the same at 90 %: less at the mercy of one lucky measurement
    # The true score of the point that measured best within n_trial, over the best score:
    # what a run would name as its winner when its measurements carry `noise`.
    chosen_fraction_at_n: float = 0.0
    measured: list[float] = field(default_factory=list)  # what the tuner saw, in `order`


@dataclass
class TunerSummary:
    trials_to_95: float  # median over seeds
    best_fraction_at_n: float  # median over seeds
    reached_share: float  # share of seeds that reached 95% within n_trial trials
    trials_to_95_per_seed: list[int] = field(default_factory=list)
    trials_to_90: float = 0.0  # median over seeds


@dataclass
class ProblemResult:
    problem: str
    space: int
    best_gflops: float
    baseline_gflops: float | None
    tuners: dict[str, TunerSummary]


def replay(
    landscape: Landscape,
    tuner_name: str,
    seed: int,
    n_trial: int,
    batch_size: int = 8,
    noise: float = 0.0,
    noise_seed: int = 0,
    starting: bool = True,
    history: History = (),
) -> Replay:
    """Runs one tuner over the landscape; see the module docstring for the stopping rule.

    With `noise` (a coefficient of variation), every score the tuner sees is the recorded one
    times a log-normal factor drawn from `noise_seed`: runs that differ only by measurement
    noise, as two runs of the same command on a real machine do.
    """
    scores = landscape.scores
    jitter = np.random.default_rng(noise_seed)
    best = landscape.best
    tuner = make_tuner(tuner_name, landscape.n_points, seed, landscape.features, n_trial, history)
    state = SearchState(tuner, queued=list(landscape.starting) if starting else [])
    seen: list[float] = []

    def look_up(batch: list[int]) -> list[float | None]:
        """The landscape as the measurer: the recorded score, with noise if asked."""
        measured: list[float | None] = []
        for index in batch:
            if index in tuner.measured or index in state.order:
                raise RuntimeError(f"{tuner_name} proposed point {index} twice")
            score = float(scores[index])
            ok = np.isfinite(score)
            value = score * math.exp(jitter.normal(0.0, noise)) if noise and ok else score
            measured.append(value if ok else None)
            seen.append(value if ok else math.nan)
        return measured

    def reached(at: float) -> int | None:
        """The trial (1-based) at which a point of at least `at` x best was first measured."""
        return next(
            (i for i, index in enumerate(state.order, 1) if scores[index] >= at * best), None
        )

    # Past n_trial the run goes on until it reaches 95 % of the best (see the docstring).
    search(
        state,
        look_up,
        budget=landscape.n_points,
        batch_size=batch_size,
        done=lambda s: len(s.order) >= n_trial and reached(TARGET_FRACTION) is not None,
    )
    order = state.order
    reached_at = reached(TARGET_FRACTION)
    first = [
        (measured, index)
        for measured, index in zip(seen[:n_trial], order[:n_trial], strict=True)
        if math.isfinite(measured)
    ]
    chosen = max(first)[1] if first else None
    best_at_n = max(
        (float(scores[i]) for i in order[:n_trial] if np.isfinite(scores[i])), default=0.0
    )
    near = [i for i, index in enumerate(order, 1) if scores[index] >= LOOSE_FRACTION * best]
    return Replay(
        trials_to_95=reached_at if reached_at is not None else landscape.n_points + 1,
        best_fraction_at_n=best_at_n / best,
        order=order,
        trials_to_90=near[0] if near else landscape.n_points + 1,
        chosen_fraction_at_n=float(scores[chosen]) / best if chosen is not None else 0.0,
        measured=seen,
    )


def simulate(
    landscape: Landscape,
    tuner_names: list[str],
    n_trial: int,
    seeds: int,
    batch_size: int = 8,
    starting: bool = True,
    history: History = (),
) -> ProblemResult:
    """Replays every tuner with seeds 0..seeds-1 and takes medians."""
    if not np.isfinite(landscape.best):
        raise UserError(f"problem {landscape.problem}: every recorded point failed")
    summaries = {}
    for name in tuner_names:
        runs = [
            replay(landscape, name, seed, n_trial, batch_size, starting=starting, history=history)
            for seed in range(seeds)
        ]
        trials = [r.trials_to_95 for r in runs]
        summaries[name] = TunerSummary(
            trials_to_95=float(statistics.median(trials)),
            best_fraction_at_n=float(statistics.median(r.best_fraction_at_n for r in runs)),
            reached_share=sum(t <= n_trial for t in trials) / len(trials),
            trials_to_95_per_seed=trials,
            trials_to_90=float(statistics.median(r.trials_to_90 for r in runs)),
        )
    baseline = landscape.baseline if np.isfinite(landscape.baseline) else None
    return ProblemResult(landscape.problem, landscape.n_points, landscape.best, baseline, summaries)


def format_table(results: list[ProblemResult], n_trial: int) -> str:
    """An aligned plain-text table, one row per problem and tuner."""
    header = [
        "problem",
        "space",
        "tuner",
        "trials to 95%",
        "% of space",
        "trials to 90%",
        f"best frac @{n_trial}",
    ]
    rows = [header]
    for result in results:
        for name, s in result.tuners.items():
            rows.append(
                [
                    result.problem,
                    str(result.space),
                    name,
                    f"{s.trials_to_95:g}",
                    f"{100 * s.trials_to_95 / result.space:.1f}",
                    f"{s.trials_to_90:g}",
                    f"{s.best_fraction_at_n:.3f}",
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def results_json(results: list[ProblemResult]) -> dict:
    return {"problems": [asdict(r) for r in results]}


@click.command("simulate")
@click.argument("landscape", type=click.Path(dir_okay=False))
@click.option(
    "--tuner",
    "tuners",
    multiple=True,
    type=click.Choice(TUNER_NAMES),
    help="Tuner to replay; repeatable. Default: all of them.",
)
@click.option("--n-trial", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--seeds", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--starting-points",
    default="target",
    show_default=True,
    type=click.Choice(STARTING_POINTS),
    help="target: the target's known-good points are measured first, as in a run; none: not.",
)
@click.option(
    "--history",
    "history_from",
    default="none",
    show_default=True,
    type=click.Choice(["none", "others"]),
    help="others: each problem's tuner starts from the file's other problems of the same "
    "input element type, as a run starts from its database's (history = database).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def simulate_command(
    landscape: str,
    tuners: tuple[str, ...],
    n_trial: int,
    seeds: int,
    batch_size: int,
    starting_points: str,
    history_from: str,
    as_json: bool,
) -> None:
    """Replay tuners against a recorded LANDSCAPE (CSV or tuning-database JSON lines)."""
    names = list(tuners) or list(TUNER_NAMES)
    landscapes = load_landscapes(landscape)
    starting = starting_points == "target"
    results = [
        simulate(
            ls,
            names,
            n_trial,
            seeds,
            batch_size,
            starting,
            landscape_history(ls, landscapes) if history_from == "others" else (),
        )
        for ls in landscapes
    ]
    if as_json:
        click.echo(json.dumps(results_json(results)))
    else:
        click.echo(format_table(results, n_trial))
