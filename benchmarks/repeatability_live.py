"""Does the same command give the same result on the real GPU? Three real runs and an
exhaustive sweep of one problem, then every winner re-timed together; writes a markdown table.

    python3 benchmarks/repeatability_live.py --out DIR [--shape 2048x8192x1024xf16]
        [--n-trial 40] [--runs 3] [--timer worker]

Each run is `autosched run` on one matmul (xgboost, seed 0, batch 16, its own work folder and
database, nothing resumed). The sweep measures every valid point of the space (grid tuner).
The three winners, the sweep's three fastest points and IREE's default are then timed
again in interleaved rounds, in one process, so that they are compared on the same footing.
Target (issue 8): the three runs within 5 % of each other and within 5 % of the sweep's best.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.cuda_suite import module_text  # noqa: E402

ROUNDS = 7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="2048x8192x1024xf16")
    parser.add_argument("--n-trial", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timer", choices=["tool", "worker"], default="tool")
    parser.add_argument("--target", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--sweep",
        choices=["yes", "no"],
        default="yes",
        help="no: compare with the best points any run saw, not an exhaustive sweep",
    )
    parser.add_argument("--sweep-devices", default=None, help="[Env] devices for the sweep")
    parser.add_argument(
        "--reference-configs",
        default="",
        help="comma-separated config names timed beside the winners: with --sweep no, the "
        "best points of an earlier sweep (its committed CSV)",
    )
    options = parser.parse_args()

    from autosched.config import load_config, with_overrides
    from autosched.ops.matmul import analyze_file
    from autosched.run.problem import BASELINE, Progress
    from autosched.run.tuning import Tuning
    from autosched.targets import make_target

    m, n, k, element = options.shape.split("x")
    os.makedirs(options.out, exist_ok=True)
    source = os.path.join(options.out, "problem.mlir")
    with open(source, "w") as handle:
        handle.write(module_text(int(m), int(n), int(k), element, "f32"))
    (problem,) = analyze_file(source).problems
    started = time.perf_counter()

    def tuning_for(
        name: str, tuner: str, n_trial: int, devices: str | None = None, batch: int | None = None
    ) -> Tuning:
        work = os.path.join(options.out, name)
        config = with_overrides(
            load_config("configs/cuda_suite.cfg"),
            input_file=source,
            target=options.target,
            tuner=tuner,
            n_trial=n_trial,
            seed=0,
            timer=options.timer,
            devices=devices,
            batch_size=batch,
            work_dir=work,
            output_file=os.path.join(work, "results.csv"),
            log_file=os.path.join(work, "run.log"),
            database=os.path.join(work, "tuning.jsonl"),
        )
        return Tuning(config, make_target(config), resume=False)

    runs = []
    for index in range(options.runs):
        tuning = tuning_for(f"run{index}", "xgboost", options.n_trial)
        result = tuning.tune_problem(problem, Progress())
        runs.append((tuning, result))
        print(f"run {index}: {result.best.config if result.best else BASELINE}", flush=True)
    if options.sweep == "yes":
        # Every point in order: large batches only save the waits between them.
        sweep_tuning = tuning_for("sweep", "grid", 100000, options.sweep_devices, batch=64)
        sweep = sweep_tuning.tune_problem(problem, Progress())
        pool, label = sweep.trials, "sweep top 3"
        swept = (
            f"- sweep: {len(sweep.trials)} points of {len(sweep.space.points)} valid "
            f"({sum(1 for t in sweep.trials if not t.ok)} failed)"
        )
    else:  # the reference is the best any run measured: weaker than a sweep, and says so
        sweep_tuning = runs[0][0]
        pool, label = [t for _, r in runs for t in r.trials], "best 3 any run saw"
        swept = "- no exhaustive sweep: the reference is the best point any run measured"
    ranked = sorted((t for t in pool if t.ok), key=lambda t: t.median_ms)
    fastest: dict[str, object] = {}  # each point once, at its fastest measurement
    for trial in ranked:
        fastest.setdefault(trial.config, trial)
    ranked = list(fastest.values())
    print(f"reference: best {ranked[0].config}", flush=True)

    # Every contender once, by config name: the default, each run's winner, the best 3.
    contenders = {BASELINE: runs[0][1].baseline}
    for _, result in runs:
        if result.best:
            contenders.setdefault(result.best.config, result.best)
    for trial in ranked[:3]:
        contenders.setdefault(trial.config, trial)
    references = [name for name in options.reference_configs.split(",") if name]
    if references:  # points by name, from the space the runs searched
        from types import SimpleNamespace

        target = runs[0][0].target
        by_name = {target.config_name(p): p for p in runs[0][1].space.points}
        unknown = [name for name in references if name not in by_name]
        if unknown:
            raise SystemExit(f"not in the space: {', '.join(unknown)}")
        for name in references:
            contenders.setdefault(
                name, SimpleNamespace(config=name, point=by_name[name], baseline=False)
            )
    from autosched.measure.worker import make_problem_data
    from autosched.run.retiming import time_on

    repeat = sweep_tuning.config.dispatch_repeat or sweep_tuning.target.dispatch_repeat(problem)
    modules = sweep_tuning.builds.modules_for(problem, list(contenders.values()), repeat)
    data = make_problem_data(problem, os.path.join(options.out, "inputs"), seed=0)
    samples: dict[str, list[float]] = {name: [] for name in modules}
    for _ in range(ROUNDS):
        for name, module in modules.items():
            bench, settings = sweep_tuning.executor.primary, sweep_tuning.settings
            timing = time_on(bench, settings, module, data, 3, repeat)
            if timing.status == "ok":
                samples[name].append(timing.median_ms)
    final = {name: statistics.median(v) for name, v in samples.items() if v}
    cv = {name: statistics.pstdev(v) / statistics.fmean(v) for name, v in samples.items() if v}
    best_ms = min(final.values())
    winners = [final.get(r.best.config if r.best else BASELINE) for _, r in runs]
    spread = max(winners) / min(winners) - 1
    worst = best_ms / max(winners)
    met = spread <= 0.05 and worst >= 0.95
    for tuning in {id(t): t for t in [sweep_tuning, *(t for t, _ in runs)]}.values():
        tuning.close()

    lines = [
        f"# Repeatability on the device: {options.shape}, {options.runs} runs of "
        f"{options.n_trial} trials"
        + (" against an exhaustive sweep" if options.sweep == "yes" else ""),
        "",
        f"- target: {sweep_tuning.target.describe()}",
        f"- command: `python3 benchmarks/repeatability_live.py --out DIR --shape {options.shape} "
        f"--n-trial {options.n_trial} --runs {options.runs} --timer {options.timer} "
        f"--target {options.target} --sweep {options.sweep}"
        + (f" --sweep-devices {options.sweep_devices}" if options.sweep_devices else "")
        + (f" --reference-configs {options.reference_configs}" if references else "")
        + "`",
        swept,
        f"- final: every contender timed again in {ROUNDS} interleaved rounds (median; CV "
        "across rounds)",
        f"- wall time: {time.perf_counter() - started:.0f} s",
        "",
        "| who | config | ms | CV | of the best |",
        "| --- | --- | --- | --- | --- |",
    ]
    for index, (_, result) in enumerate(runs):
        name = result.best.config if result.best else BASELINE
        lines.append(
            f"| run {index} | `{name}` | {final[name]:.4f} | {cv[name]:.1%} | "
            f"{best_ms / final[name]:.3f} |"
        )
    for trial in ranked[:3]:
        name = trial.config
        lines.append(
            f"| {label} | `{name}` | {final[name]:.4f} | {cv[name]:.1%} | "
            f"{best_ms / final[name]:.3f} |"
        )
    for name in references:
        if name in final:
            lines.append(
                f"| earlier sweep | `{name}` | {final[name]:.4f} | {cv[name]:.1%} | "
                f"{best_ms / final[name]:.3f} |"
            )
    lines.append(
        f"| IREE default | `{BASELINE}` | {final[BASELINE]:.4f} | {cv[BASELINE]:.1%} | "
        f"{best_ms / final[BASELINE]:.3f} |"
    )
    lines += [
        "",
        f"Spread between the runs' winners: {spread:.1%}; the worst winner reaches "
        f"{worst:.3f} of the best. Targets (both within 5 %): "
        f"{'met' if met else 'not met'}.",
    ]
    with open(os.path.join(options.out, "repeatability_live.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
