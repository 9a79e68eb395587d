"""Re-times every point of a recorded landscape in interleaved rounds: a noise-aware landscape.

On a noisy machine one first measurement per point lets a lucky outlier become "the best
point", which no tuner can find on purpose. This takes a tuning database, times every
correct point (and the default) again in `--rounds` rounds, each round over all points in
a fresh random order so that drift and bursts of load spread over all of them (each round
is `run/retime.timed_rounds`, the loop a run re-times its finalists with), and writes
a new database whose `median_ms` is the median of the rounds (the first pass is kept as
`first_median_ms`). Replay it with `autosched simulate` or benchmarks/search_efficiency.py.

    python tools/remeasure_landscape.py LANDSCAPE.jsonl --out NEW.jsonl [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autosched.compile import CompileJob, compile_all  # noqa: E402
from autosched.config import load_config, with_overrides  # noqa: E402
from autosched.measure.contract import measure_settings, runtime_flags  # noqa: E402
from autosched.measure.local import Bench  # noqa: E402
from autosched.measure.worker import make_problem_data  # noqa: E402
from autosched.ops.matmul_kernel import kernel_variant, variant_path, write_text  # noqa: E402
from autosched.outputs.records import problem_from_shape  # noqa: E402
from autosched.run.retime import timed_rounds  # noqa: E402
from autosched.targets import make_target  # noqa: E402


def build(problem, target, records: list[dict], repeat: int, work_dir: str, jobs: int):
    """Each correct record's kernel, compiled with the dispatch repeated: config -> module."""
    wanted = {}
    for record in records:
        point = None if record["baseline"] else record["point"]
        source = write_text(
            variant_path(work_dir, problem, record["config"]),
            kernel_variant(problem, target, point),
        )
        flags = [*target.compile_flags(), f"--iree-hal-benchmark-dispatch-repeat-count={repeat}"]
        wanted[record["config"]] = CompileJob(source, source[:-5] + f".x{repeat}.vmfb", flags)
    built = compile_all(list(wanted.values()), 300, jobs)
    ok = {result.job.output for result in built if result.status == "ok"}
    return {name: job.output for name, job in wanted.items() if job.output in ok}


def time_module(bench: Bench, modules: dict[str, str], data, repeat: int, settings, name: str):
    """One config's module timed on the bench: its median ms, or None when it failed."""
    timing = bench.time(modules[name], data, repeat, settings)
    return timing.median_ms if timing.status == "ok" else None


def retimed_samples(
    time_one: Callable[[str], float | None], names: list[str], rounds: int, order: random.Random
) -> dict[str, list[float]]:
    """Each name's times over `rounds` rounds of `run/retime.timed_rounds`, every round in a
    fresh random order, so that drift and bursts of load spread over all points."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shuffled = list(names)
        order.shuffle(shuffled)
        for timed_now in timed_rounds(shuffled, time_one, rounds=1):
            for name, ms in timed_now.items():
                samples[name].append(ms)
        print(f"  round {round_index + 1}/{rounds} done", flush=True)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landscape", help="a tuning database (JSON lines) of a full space")
    parser.add_argument("--out", required=True, help="the re-timed database to write")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", default="auto-scheduler.cfg", help="timing settings")
    parser.add_argument("--work-dir", default="generated/remeasure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with open(args.landscape, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    by_problem: dict[str, dict[str, dict]] = {}
    for record in records:  # the newest record of a config wins, as in the loader
        by_problem.setdefault(record["problem"], {})[record["config"]] = record
    order = random.Random(args.seed)
    if os.path.exists(args.out):
        os.remove(args.out)
    for name, by_config in by_problem.items():
        first = next(iter(by_config.values()))
        config = with_overrides(
            load_config(args.config),
            target=first["target"],
            arch=first.get("arch") or None,
            work_dir=args.work_dir,
        )
        problem = problem_from_shape(first["shape"])
        target = make_target(config)
        repeat = config.dispatch_repeat or target.dispatch_repeat(problem)
        data = make_problem_data(problem, os.path.join(args.work_dir, "inputs", name), config.seed)
        ok = [r for r in by_config.values() if r["status"] == "ok"]
        started = time.perf_counter()
        modules = build(problem, target, ok, repeat, args.work_dir, os.cpu_count() or 1)
        print(f"{name}: {len(modules)} modules ready in {time.perf_counter() - started:.0f} s")
        # Timed like a run times them, on one bench, without a run's CSV, log or database.
        bench = Bench(target.device, runtime_flags(config))
        settings = measure_settings(config, target)
        names = [r["config"] for r in ok if r["config"] in modules]
        time_one = functools.partial(time_module, bench, modules, data, repeat, settings)
        samples = retimed_samples(time_one, names, args.rounds, order)
        bench.close()
        with open(args.out, "a", encoding="utf-8") as handle:
            for config_name, record in by_config.items():
                record = dict(record)
                record.pop("features", None)  # replays compute them from the point
                times = samples.get(config_name)
                if times:
                    record["first_median_ms"] = record["median_ms"]
                    record["median_ms"] = statistics.median(times)
                    record["cv"] = statistics.pstdev(times) / statistics.fmean(times)
                    record["samples_ms"] = [float(f"{t:.4g}") for t in times]
                    record["gflops"] = problem.flops / (record["median_ms"] * 1e6)
                handle.write(json.dumps(record, sort_keys=True) + "\n")
        print(f"{name}: written to {args.out}")


if __name__ == "__main__":
    main()
