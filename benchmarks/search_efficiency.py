"""How fast each tuner finds the fast corner of a recorded landscape; writes a markdown table.

    python benchmarks/search_efficiency.py tests/data/h200_matmul_4096_landscape.csv

Replays grid, random and xgboost over 20 seeds (no compiler, no device) and writes
benchmarks/results/search_efficiency_<landscape name>.md with the command, the machine and
whether the XGBoost targets hold: it reaches 95% of the best point within 10% of the space
(median over seeds) and needs at most half the trials random search needs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autosched.drivers.simulate import ProblemResult, simulate  # noqa: E402
from autosched.search.landscape import load_landscapes  # noqa: E402

TUNERS = ["grid", "random", "xgboost"]
RESULTS = Path(__file__).resolve().parent / "results"


def targets_hold(result: ProblemResult) -> tuple[bool, bool]:
    """(within 10% of the space, at most half of random's trials) for xgboost."""
    xgb = result.tuners["xgboost"].trials_to_95
    random = result.tuners["random"].trials_to_95
    return xgb <= 0.10 * result.space, xgb <= 0.5 * random


def report(results: list[ProblemResult], args: argparse.Namespace, seconds: float) -> str:
    def yes(flag: bool) -> str:
        return "yes" if flag else "**no**"

    lines = [
        f"# Search efficiency on `{Path(args.landscape).name}`",
        "",
        f"- command: `{' '.join(shlex.quote(a) for a in ['python', *sys.argv])}`",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores; replay took {seconds:.0f} s",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- seeds: {args.seeds}, n_trial: {args.n_trial}, batch size: {args.batch_size}",
        "",
        "Trials to 95%: measurements until one is within 95% of the best recorded point,",
        "median over seeds; a run continues past n_trial until it gets there, and one that",
        "never does counts as space size + 1. Best fraction: best score in the first n_trial",
        "measurements / best recorded score, median over seeds. Trials to 90%: the same at",
        "90%, which one lucky (noisy) measurement of the best point cannot decide alone.",
        "",
        "| problem | space | tuner | trials to 95% | % of space | trials to 90% "
        "| best fraction at N |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for name, s in r.tuners.items():
            lines.append(
                f"| {r.problem} | {r.space} | {name} | {s.trials_to_95:g} | "
                f"{100 * s.trials_to_95 / r.space:.1f}% | {s.trials_to_90:g} | "
                f"{s.best_fraction_at_n:.3f} |"
            )
    lines += [
        "",
        "## Targets for xgboost",
        "",
        "| problem | 95% within 10% of the space | at most half of random's trials |",
        "| --- | --- | --- |",
    ]
    for r in results:
        within, half = targets_hold(r)
        lines.append(f"| {r.problem} | {yes(within)} | {yes(half)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landscape", help="landscape CSV or tuning-database JSON lines")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--n-trial", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    start = time.time()
    landscapes = load_landscapes(args.landscape)
    results = [simulate(ls, TUNERS, args.n_trial, args.seeds, args.batch_size) for ls in landscapes]
    text = report(results, args, time.time() - start)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = Path(args.landscape).name.split(".")[0]
    out = RESULTS / f"search_efficiency_{name}.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out}")
    return 0 if all(all(targets_hold(r)) for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
