"""Does a history (other problems' records) shorten the search? Replays the xgboost tuner
over recorded landscapes with and without one, and writes a markdown table.

    python3 benchmarks/history_replay.py --targets L1.jsonl,L2.csv --history DB.jsonl \
        --out benchmarks/results/history_replay.md [--seeds 20 --n-trial 40 --batch-size 16]

Each target landscape is replayed as `autosched simulate` does (same loop, same stopping
rule); its history is every problem of the history files with the same input element type
and a different shape (the records a run would find in its database), put in the target's
feature columns by `history.landscape_history`.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autosched.drivers.simulate import simulate  # noqa: E402
from autosched.search.history import landscape_history  # noqa: E402
from autosched.search.landscape import load_landscapes  # noqa: E402


def shape_of(name: str) -> str:
    """matmul_2048x8192x1024_f16_f16_f32 -> 2048x8192x1024"""
    return name.split("_")[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", required=True, help="landscape files, comma-separated")
    parser.add_argument("--history", required=True, help="database files, comma-separated")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--n-trial", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    options = parser.parse_args()
    pool = [ls for path in options.history.split(",") for ls in load_landscapes(path)]
    lines = [
        "| target landscape | points | history (problems) | median trials to 95 % | worst seed "
        f"| seeds within 95 % by {options.n_trial} | median best fraction at {options.n_trial} |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in options.targets.split(","):
        for target in load_landscapes(path):
            others = [ls for ls in pool if shape_of(ls.problem) != shape_of(target.problem)]
            for history in ((), landscape_history(target, others)):
                result = simulate(
                    target,
                    ["xgboost"],
                    options.n_trial,
                    options.seeds,
                    options.batch_size,
                    history=history,
                ).tuners["xgboost"]
                trials = result.trials_to_95_per_seed
                lines.append(
                    f"| {target.problem} ({os.path.basename(path)}) | {target.n_points} | "
                    f"{len(history) or 'none'} | {result.trials_to_95:g} | {max(trials)} | "
                    f"{sum(t <= options.n_trial for t in trials)} / {len(trials)} | "
                    f"{result.best_fraction_at_n:.3f} |"
                )
                print(lines[-1], flush=True)
    command = " ".join(["python3", "benchmarks/history_replay.py", *sys.argv[1:]])
    text = f"Command: `{command}`\n\n" + "\n".join(lines) + "\n"
    with open(options.out, "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
