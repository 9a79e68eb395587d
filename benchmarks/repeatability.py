"""Does the same command give the same result? Three runs that differ only by measurement
noise, replayed over recorded landscapes; writes a markdown table.

    python benchmarks/repeatability.py --out benchmarks/results/repeatability.md

Each run is the tool's own search (xgboost, seed 0, batch 8, as `autosched run` does) over a
recorded landscape, with every measurement it sees multiplied by a log-normal factor of the
landscape's measured noise (its CV), drawn from a different noise seed per run. As the tool
does, a run then re-times its top 3 points 3 times each (noisy again) and names the one with
the best median; its result is that point's true (recorded) score as a fraction of the
landscape's best point: the best of an exhaustive sweep. Target (issue 8):
three runs within 5 % of each other and within 5 % of the exhaustive best.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import math  # noqa: E402
import statistics  # noqa: E402

import numpy as np  # noqa: E402

from autosched.drivers.simulate import replay  # noqa: E402
from autosched.search.landscape import load_landscapes  # noqa: E402

RETIME_TOP, RETIME_ROUNDS = 3, 3  # as runner.py: retime_top = 3 in the shipped cfgs


def run_winner(landscape, budget: int, noise: float, seed: int) -> float:
    """The true score of the point one noisy run names, over the landscape's best."""
    run = replay(landscape, "xgboost", 0, budget, 8, noise, seed)
    first = [
        (measured, index)
        for measured, index in zip(run.measured[:budget], run.order[:budget], strict=True)
        if math.isfinite(measured)
    ]
    top = [index for _, index in sorted(first, reverse=True)[:RETIME_TOP]]
    jitter = np.random.default_rng(1000 + seed)
    retimed = {
        index: statistics.median(
            landscape.scores[index] * math.exp(jitter.normal(0.0, noise))
            for _ in range(RETIME_ROUNDS)
        )
        for index in top
    }
    winner = max(retimed, key=retimed.get)
    return float(landscape.scores[winner] / landscape.best)


# Landscape, the noise each measurement carried where it was recorded (CV), and where that
# CV comes from.
LANDSCAPES = [
    ("tests/data/h200_matmul_4096_landscape.csv", 0.01, "H200 timings: CV under 1 %"),
    (
        "benchmarks/results/cpu_512/cpu_512_landscape_retimed.jsonl",
        0.12,
        "this VM: median CV 12-13 % across re-timing rounds",
    ),
    (
        "benchmarks/results/cpu_256x1024x512/cpu_256x1024x512_landscape_retimed.jsonl",
        0.12,
        "this VM: median CV 12-13 % across re-timing rounds",
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budgets", default="40,64")
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    started = time.perf_counter()
    lines = [
        "# Repeatability: three runs that differ only by measurement noise",
        "",
        "Command: `python benchmarks/repeatability.py --out "
        f"{options.out} --budgets {options.budgets} --runs {options.runs}` "
        "(replay: no compiler, no device; xgboost, seed 0, batch 8)",
        "",
        "| landscape | problem | space | noise CV | trials | each run's winner / best | "
        "spread between runs | worst / best | targets met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path, noise, why in LANDSCAPES:
        for landscape in load_landscapes(path):
            for budget in (int(b) for b in options.budgets.split(",")):
                fractions = [
                    run_winner(landscape, budget, noise, seed) for seed in range(options.runs)
                ]
                spread = max(fractions) / min(fractions) - 1
                met = spread <= 0.05 and min(fractions) >= 0.95
                lines.append(
                    f"| `{os.path.basename(path)}` | {landscape.problem} | {landscape.n_points} "
                    f"| {noise:.0%} | {budget} | "
                    + ", ".join(f"{f:.3f}" for f in fractions)
                    + f" | {spread:.1%} | {min(fractions):.3f} | {'yes' if met else 'no'} |"
                )
        lines.append(f"\nNoise of `{os.path.basename(path)}`: {why}.")
    lines.append(f"\n{time.perf_counter() - started:.0f} s on the CPU.")
    with open(options.out, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
