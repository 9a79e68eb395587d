"""Tunes a suite of matmuls on the local NVIDIA GPU and compares with IREE's default and cuBLAS.

Runs the real pipeline (the same `Tuning` that `autosched run` drives) problem by problem
with a fixed trial budget, then times torch.matmul (cuBLAS; TF32 off for f32) on the same GPU
in the same process, and writes a markdown table with the exact command.

    python benchmarks/cuda_suite.py --out benchmarks/results/h200.md [--n-trial 48] [--only 4096]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

SUITE = [
    # (m, n, k, input type, accumulator type)
    (128, 128, 128, "f32", "f32"),
    (512, 512, 512, "f32", "f32"),
    (1024, 1024, 1024, "f32", "f32"),
    (4096, 4096, 4096, "f32", "f32"),
    (128, 128, 128, "f16", "f32"),
    (512, 512, 512, "f16", "f32"),
    (1024, 1024, 1024, "f16", "f32"),
    (4096, 4096, 4096, "f16", "f32"),
    (16, 4096, 4096, "f16", "f32"),
    (4096, 11008, 4096, "f16", "f32"),
]


def module_text(m: int, n: int, k: int, element: str, acc: str) -> str:
    return (
        f"func.func @mm_{m}x{n}x{k}_{element}(%a: tensor<{m}x{k}x{element}>, "
        f"%b: tensor<{k}x{n}x{element}>) -> tensor<{m}x{n}x{acc}> {{\n"
        f"  %zero = arith.constant 0.0 : {acc}\n"
        f"  %empty = tensor.empty() : tensor<{m}x{n}x{acc}>\n"
        f"  %fill = linalg.fill ins(%zero : {acc}) outs(%empty : tensor<{m}x{n}x{acc}>)"
        f" -> tensor<{m}x{n}x{acc}>\n"
        f"  %r = linalg.matmul ins(%a, %b : tensor<{m}x{k}x{element}>, tensor<{k}x{n}x{element}>)"
        f" outs(%fill : tensor<{m}x{n}x{acc}>) -> tensor<{m}x{n}x{acc}>\n"
        f"  return %r : tensor<{m}x{n}x{acc}>\n}}\n"
    )


@dataclass
class CublasTiming:
    """torch.matmul's median ms per product timed as autosched times a candidate, its CV, and
    the median of short bursts from idle (how cuBLAS is often quoted)."""

    ms: float
    cv: float
    short_ms: float


def time_cublas(
    m: int, n: int, k: int, element: str, inner: int, repetitions: int, min_time: float
) -> CublasTiming:
    """cuBLAS under the load a candidate's timing puts on the GPU.

    The products are replayed from a CUDA graph of `inner` of them (the candidates' dispatches
    per call), so that Python's launch overhead does not count against cuBLAS on small
    problems. Like a candidate's, each repetition keeps the GPU busy for `min_time` after a
    warm-up of as long. That matters: under a sustained f16 load the H200 lowers its SM clock
    from 1980 MHz to about 1500, and a 4096^3 product then takes 0.213 ms against 0.180 ms in
    a 20-product burst from idle (custom_kernels_h200.md); both figures are reported.
    """
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float16 if element == "f16" else torch.float32
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up on a side stream, as graph capture requires
        for _ in range(3):
            torch.matmul(a, b, out=out)
    torch.cuda.synchronize()

    def replayed(count: int):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(count):
                torch.matmul(a, b, out=out)
        graph.replay()
        torch.cuda.synchronize()
        return graph

    def per_product(graph, count: int, replays: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / (count * replays)

    short = replayed(20)
    short_ms = statistics.median(per_product(short, 20, 1) for _ in range(7))
    graph = replayed(inner)
    call_s = per_product(graph, inner, 1) * inner / 1e3
    replays = max(1, math.ceil(min_time / call_s))
    per_product(graph, inner, replays)  # the warm-up
    samples = [per_product(graph, inner, replays) for _ in range(repetitions)]
    mean = statistics.fmean(samples)
    return CublasTiming(statistics.median(samples), statistics.pstdev(samples) / mean, short_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="markdown table to write")
    parser.add_argument("--n-trial", type=int, default=48)
    parser.add_argument("--tuner", default="xgboost")
    parser.add_argument("--work-dir", default="generated/cuda_suite")
    parser.add_argument("--only", default="", help="comma-separated substrings of problem names")
    parser.add_argument("--arch", default="")
    parser.add_argument(
        "--timer", choices=["tool", "worker"], default=None, help="[Benchmark] timer override"
    )
    parser.add_argument("--devices", default=None, help="e.g. all, or cuda://0,cuda://1")
    parser.add_argument("--executor", choices=["local", "ray"], default=None)
    parser.add_argument("--ray-address", default=None)
    parser.add_argument(
        "--custom",
        action="store_true",
        help="search the custom kernel family too (pipeline = TileAndFuse, VectorDistribute, "
        "Custom; sm_90 with Triton)",
    )
    parser.add_argument(
        "--parallel-problems", type=int, default=None, help="[Env] parallel_problems (0: auto)"
    )
    parser.add_argument(
        "--history",
        choices=["none", "database"],
        default=None,
        help="[SearchStrategy] history: database lets later problems start from earlier ones",
    )
    args = parser.parse_args()

    from autosched.config import load_config, with_overrides
    from autosched.ops.matmul import analyze_file
    from autosched.run.problem import Progress
    from autosched.run.tuning import Tuning
    from autosched.targets import make_target

    os.makedirs(args.work_dir, exist_ok=True)
    suite = SUITE
    if args.only:  # in the order given; names are x-joined, e.g. 4096x4096x4096xf16xf32
        wanted = args.only.split(",")
        suite = [p for w in wanted for p in SUITE if w in "x".join(map(str, p))]
        suite = list(dict.fromkeys(suite))
    path = os.path.join(args.work_dir, "suite.mlir")
    with open(path, "w") as handle:
        handle.write("".join(module_text(*p) for p in suite))
    config = with_overrides(
        load_config("configs/cuda_suite.cfg"),
        input_file=path,
        target="cuda",
        arch=args.arch or None,
        tuner=args.tuner,
        timer=args.timer,
        devices=args.devices,
        executor=args.executor,
        ray_address=args.ray_address,
        parallel_problems=args.parallel_problems,
        history=args.history,
        n_trial=args.n_trial,
        work_dir=args.work_dir,
        output_file=os.path.join(args.work_dir, "results.csv"),
        log_file=os.path.join(args.work_dir, "run.log"),
        database=os.path.join(args.work_dir, "tuning.jsonl"),
    )
    if "pipeline" not in config.target_search_spaces.get("cuda", {}):
        from dataclasses import replace

        # The custom family is searched by default where it runs: without --custom, the
        # suite measures IREE's own pipelines alone.
        spaces = dict(config.target_search_spaces)
        pipelines = ["TileAndFuse", "VectorDistribute"] + (["Custom"] if args.custom else [])
        spaces["cuda"] = {**spaces.get("cuda", {}), "pipeline": pipelines}
        config = replace(config, target_search_spaces=spaces)
    target = make_target(config)
    analysis = analyze_file(path)
    tuning = Tuning(config, target, resume=False)
    args.timer = tuning.settings.timer  # `timer = auto` resolved, for the table

    class Printer(Progress):
        def start(self, problem, total):
            print(f"== {problem.name}: {total} trials", flush=True)

    rows = []
    print(f"measuring on {', '.join(tuning.devices)}, {tuning.parallel} problem(s) at a time")
    start = time.perf_counter()
    results = tuning.tune_all(analysis.problems, Printer())
    total_wall = time.perf_counter() - start
    busy = tuning.device_use()
    for problem, result in zip(analysis.problems, results, strict=True):
        wall = result.search_s  # from its start to its final re-timing
        m, n, k = problem.m, problem.n, problem.k
        cublas = time_cublas(
            m,
            n,
            k,
            problem.lhs_type,
            config.dispatch_repeat or target.dispatch_repeat(problem),
            config.repetitions,
            config.min_time,
        )
        cublas_ms = cublas.ms

        def tflops(ms, flops=problem.flops):
            return flops / (ms * 1e9) if ms else None

        best_ms = result.best_ms or result.baseline_ms  # the default stays when nothing beat it
        failed = sum(1 for t in result.trials if not t.ok)
        row = {
            "problem": f"{m}x{n}x{k} {problem.lhs_type}->{problem.acc_type}",
            "default_ms": result.baseline_ms,
            "default_tflops": tflops(result.baseline_ms),
            "tuned_ms": best_ms,
            "tuned_tflops": tflops(best_ms),
            "speedup": (result.baseline_ms / best_ms) if best_ms and result.baseline_ms else None,
            "cublas_ms": cublas_ms,
            "cublas_cv": cublas.cv,
            "cublas_tflops": tflops(cublas_ms),
            "cublas_short_ms": cublas.short_ms,
            "cublas_short_tflops": tflops(cublas.short_ms),
            "of_cublas": cublas_ms / best_ms if best_ms else None,
            "best_cv": result.best.cv if result.best else result.baseline.cv,
            "trials": len(result.trials),
            "failed": failed,
            "space": len(result.space.points),
            "wall_s": wall,
            "per_trial_s": wall / max(1, len(result.trials)),
            "stage_s": stage_medians(result.trials),
            "check_phases": check_phases(result.trials),
            "config": result.best.config if result.best else "(IREE default)",
            "route": route(target, result.best),
        }
        rows.append(row)
        print(row, flush=True)
    write_table(args, rows, target, tuning.devices, tuning.parallel, total_wall, busy)
    tuning.finish()
    with open(args.out) as handle:
        print(handle.read())


def route(target, best) -> str:
    """Which route the winner took: IREE's own codegen with a configuration, or a custom
    kernel run as an IREE custom dispatch."""
    if best is None:
        return "IREE default"
    return "IREE configuration" if target.in_spec(best.point) else "custom kernel"


def stage_medians(trials) -> str:
    """Median seconds per trial of compiling (in parallel), verifying and timing (on the GPU)."""

    def median(values):
        values = [v for v in values if v is not None]
        return f"{statistics.median(values):.2f}" if values else "-"

    return " / ".join(
        median([getattr(t, stage) for t in trials])
        for stage in ("compile_s", "verify_s", "timing_s")
    )


def check_phases(trials) -> dict[str, float]:
    """Median seconds of each step of a check in the measuring worker (load, run, to_host,
    compare), over the trials that report them."""
    from autosched.measure.worker import CHECK_PHASES

    timed = [t.verify_phases for t in trials if t.verify_phases]
    return {phase: statistics.median(p[phase] for p in timed) for phase in CHECK_PHASES if timed}


def write_table(
    args,
    rows: list[dict],
    target,
    devices: list[str],
    parallel: int,
    wall: float,
    busy: dict[str, float],
) -> None:
    from autosched.outputs.records import iree_version

    def f(value, digits=3):
        return "-" if value is None else f"{value:.{digits}g}"

    speedups = [r["speedup"] for r in rows if r["speedup"]]
    geomean = statistics.geometric_mean(speedups) if speedups else None
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    lines = [
        f"# CUDA suite on {gpu or 'an NVIDIA GPU'}",
        "",
        f"- date: {datetime.date.today().isoformat()}; host: {platform.node()}, "
        f"{os.cpu_count()} cores",
        f"- target: {target.describe()}; IREE {iree_version()}",
        f"- command: `python {' '.join(shlex.quote(a) for a in sys.argv)}`",
        f"- tuner {args.tuner}, budget {args.n_trial} trials per problem, timer "
        f"{args.timer}; times are per "
        "dispatch, median of repetitions; the default and the tuned point are the final "
        "interleaved re-timing.",
        "- compile / verify / time: median seconds per trial of each stage; compiles run "
        f"{os.cpu_count()} at a time while the GPU verifies and times, so the wall time per "
        "trial is less than their sum. check: the verify stage's steps in the measuring "
        "worker (loading the module, one call, copying the output to the host, comparing it "
        "with numpy's), median seconds.",
        "- cuBLAS: torch.matmul (TF32 off) replayed from a CUDA graph of as many products as a "
        "candidate's timed call has dispatches, timed with CUDA events as long and as often as "
        "a candidate (the GPU's clock falls under a sustained load); `of cuBLAS` compares "
        "with that. cuBLAS short: the median of 7 bursts of 20 products, the figure usually "
        "quoted.",
        "",
        "| problem | IREE default TFLOP/s | tuned TFLOP/s | speedup | cuBLAS TFLOP/s | of cuBLAS "
        "| cuBLAS short TFLOP/s "
        "| tuned CV | trials (failed) / space | search s | s per trial "
        "| compile / verify / time s | check: load / run / to host / compare s "
        "| route | best config |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- |",
    ]
    for r in rows:
        phases = " / ".join(f"{v:.3f}" for v in r["check_phases"].values()) or "-"
        lines.append(
            f"| {r['problem']} | {f(r['default_tflops'])} | {f(r['tuned_tflops'])} | "
            f"{f(r['speedup'])}x | {f(r['cublas_tflops'])} | {f(r['of_cublas'], 2)} | "
            f"{f(r['cublas_short_tflops'])} | {f(r['best_cv'], 2)} | "
            f"{r['trials']} ({r['failed']}) / {r['space']} | "
            f"{r['wall_s']:.0f} | {r['per_trial_s']:.2f} | {r['stage_s']} | {phases} | "
            f"{r['route']} | `{r['config']}` |"
        )
    trials = sum(r["trials"] for r in rows)
    lines += [
        "",
        f"Geometric-mean speedup over IREE's default: {f(geomean)}x",
        "",
        f"Measured on {len(devices)} device(s) ({', '.join(devices)}), {parallel} problem(s) "
        f"searched at a time: {trials} trials in {wall:.0f} s of tuning (defaults, search and "
        f"re-timing of every problem), {trials / wall:.2f} candidates per second, "
        f"{wall / trials:.2f} s per candidate. Share of that time each device spent "
        "checking and timing (the rest it waited for compiles and the tuner): "
        + ", ".join(f"{d} {share:.0%}" for d, share in busy.items())
        + ".",
        "",
    ]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as handle:
        handle.write("\n".join(lines))
    summary = {
        "devices": devices,
        "executor": args.executor or "local",
        "trials": trials,
        "parallel_problems": parallel,
        "wall_s": wall,
        "busy": busy,
        "geomean": geomean,
        "rows": [{k: v for k, v in r.items()} for r in rows],
    }
    with open(os.path.splitext(args.out)[0] + ".json", "w") as handle:
        json.dump(summary, handle, indent=1)


if __name__ == "__main__":
    main()
