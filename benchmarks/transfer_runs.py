"""Fast mode with and without the knowledge base and the siblings' winners, against normal
mode: the trials and wall time each run spends, and how near each problem comes to the
best normal mode found (autosched/search/knowledge.py, drivers/campaign.py).

Each variant is one real `autosched run MODEL` in its own work folder (no database shared):

    normal     --mode normal, knowledge = none       (the reference: each problem's best)
    fast       --mode fast,   knowledge = none       (the tuner and the target's points alone)
    fast+kb    --mode fast,   knowledge = ""         (the shipped base, the siblings' winners)

    python3 benchmarks/transfer_runs.py MODEL --out RESULT.md [--work DIR] [--n-trial N]
        [--variants normal,fast,fast+kb] [--run fast+kb]

`--run` runs only the variants it names and reads the others' work folders from an
earlier call. A problem
"reaches" normal's best when a first-pass time within 3 % of normal's best first-pass time
is measured; the table counts the run's trials (all problems, in the order measured) up to
the moment its last problem reached it (or says how many never did).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

from autosched.outputs.records import Trial, TuningDatabase

VARIANTS = {
    "normal": ("normal", "none"),
    "fast": ("fast", "none"),
    "fast+kb": ("fast", ""),
}
WITHIN = 0.03  # "reaches normal's best": a first-pass time within 3 % of it
CFG = """[Env]
target = cpu
work_dir = {work}
[SearchStrategy]
n_trial = {n_trial}
knowledge = {knowledge}
"""


def run_variant(model: str, work: str, name: str, n_trial: int) -> float:
    """One `autosched run` of the model; its wall seconds."""
    mode, knowledge = VARIANTS[name]
    shutil.rmtree(work, ignore_errors=True)  # no earlier database: it would teach the run
    os.makedirs(work)
    cfg = os.path.join(work, "run.cfg")
    with open(cfg, "w", encoding="utf-8") as handle:
        handle.write(CFG.format(work=work, n_trial=n_trial, knowledge=knowledge))
    command = [sys.executable, "-m", "autosched", "run", model, "--config", cfg, "--mode", mode]
    load = load_average()
    started = time.perf_counter()
    with open(os.path.join(work, "output.txt"), "w", encoding="utf-8") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall = time.perf_counter() - started
    with open(os.path.join(work, "wall_s.txt"), "w", encoding="utf-8") as handle:
        handle.write(f"{wall:.1f}\n{load} -> {load_average()}\n")
    return wall


def best_first_pass(trials: list[Trial]) -> dict[str, float]:
    """Each problem's fastest correct first-pass time among its candidates."""
    best: dict[str, float] = {}
    for t in trials:
        if t.ok and not t.baseline and t.median_ms:
            best[t.problem] = min(best.get(t.problem, t.median_ms), t.median_ms)
    return best


def reached(trials: list[Trial], target: dict[str, float]) -> tuple[int | None, int]:
    """The trial count (in the order measured) at which every problem had come within
    WITHIN of `target` (None if some never did), and how many problems did."""
    candidates = sorted((t for t in trials if not t.baseline), key=lambda t: t.time)
    done: set[str] = set()
    at = None
    for count, t in enumerate(candidates, 1):
        goal = target.get(t.problem)
        if t.ok and goal and t.median_ms <= goal * (1 + WITHIN) and t.problem not in done:
            done.add(t.problem)
            at = count
    return (at if done >= set(target) else None), len(done & set(target))


def summary(work: str) -> dict:
    path = os.path.join(work, "results.summary.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def retimed_best(data: dict) -> dict[str, float]:
    """Each problem's time after the run (its re-timed winner, or its default)."""
    return {p["problem"]: p["best_ms"] for p in data.get("problems", []) if p.get("best_ms")}


def near_normal(data: dict, normal: dict) -> str:
    """Problems whose re-timed best is within WITHIN of normal's (or faster)."""
    mine, theirs = retimed_best(data), retimed_best(normal)
    near = sum(1 for p, ms in theirs.items() if p in mine and mine[p] <= ms * (1 + WITHIN))
    return f"{near} of {len(theirs)}"


def row(name: str, work: str, reference: dict[str, float], normal: dict) -> str:
    trials = TuningDatabase(os.path.join(work, "tuning.jsonl")).records()
    data = summary(work)
    with open(os.path.join(work, "wall_s.txt"), encoding="utf-8") as handle:
        wall_line, *load = handle.read().splitlines()
    wall = float(wall_line)
    at, count = reached(trials, reference)
    model = data.get("model") or {}
    speedups = [p.get("speedup") or 1.0 for p in data.get("problems", [])]
    wins = sum(1 for s in speedups if s > 1.0)
    reach = f"{at}" if at is not None else f"never ({count} of {len(reference)})"
    candidates = sum(1 for t in trials if not t.baseline)
    return (
        f"| {name} | {candidates} | {reach} | {near_normal(data, normal)} | "
        f"{data.get('search_s', 0):.0f} | {wall:.0f} | "
        f"{wins} | {model.get('default_ms', 0):.3f} | {model.get('tuned_ms') or 0:.3f} | "
        f"{model.get('speedup') or 1.0:.2f}x | {load[0] if load else ''} |"
    )


def load_average() -> str:
    try:
        with open("/proc/loadavg", encoding="utf-8") as handle:
            return " ".join(handle.read().split()[:3])
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default="generated/transfer_runs")
    parser.add_argument("--n-trial", type=int, default=16)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--run", default=None, help="the variants to run (default: all); the others are read"
    )
    args = parser.parse_args()
    names = args.variants.split(",")
    folder = {n: os.path.abspath(os.path.join(args.work, n.replace("+", "_"))) for n in names}
    for name in names if args.run is None else [n for n in args.run.split(",") if n]:
        run_variant(os.path.abspath(args.model), folder[name], name, args.n_trial)
    normal = TuningDatabase(os.path.join(folder["normal"], "tuning.jsonl")).records()
    reference = best_first_pass(normal)
    lines = [
        f"# Fast mode, the knowledge base and siblings' winners: {os.path.basename(args.model)}",
        "",
        f"Machine: {platform.node()} ({os.cpu_count()} cores, {platform.machine()}), shared "
        "with other work: the load column is its load average (1, 5, 15 min) before -> after "
        "each run.",
        "",
        f"    python3 benchmarks/transfer_runs.py {args.model} --out {args.out} "
        f"--n-trial {args.n_trial} --variants {args.variants}",
        "",
        "*reach*: trials (new candidates, in the order measured over all problems) until every "
        f"problem had a first-pass time within {WITHIN:.0%} of normal mode's best for it; "
        f"*at normal's best*: problems whose re-timed time after the run (winner or default) "
        f"is within {WITHIN:.0%} of normal's.",
        "",
        "| run | candidates | reach | at normal's best | search s | wall s | problems won "
        "| model default ms | tuned ms | model speedup | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [row(name, folder[name], reference, summary(folder["normal"])) for name in names]
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
