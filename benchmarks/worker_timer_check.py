"""Worker timing against iree-benchmark-module: the same modules, both timers, interleaved.

    python3 benchmarks/worker_timer_check.py --target cuda --out DIR [--sizes 1024,4096]

For each size and element type, IREE's default kernel is compiled (with the target's
dispatch repeat count), then timed in alternating rounds by the verifier's worker
(`timer = worker`) and by iree-benchmark-module (`timer = tool`). The table gives both
medians, their difference and the wall time each timer took: the worker should agree within
2 % and cost a fraction of the tool's time (issue 9). Run it on the GPU machine before
making `worker` the default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autosched.compile import CompileJob, compile_one  # noqa: E402
from autosched.config import RunConfig  # noqa: E402
from autosched.measure.benchmark_tool import time_module  # noqa: E402
from autosched.measure.worker import Verifier, make_problem_data  # noqa: E402
from autosched.ops.matmul import analyze_file  # noqa: E402
from autosched.ops.matmul_kernel import kernel_variant  # noqa: E402
from autosched.targets import make_target  # noqa: E402

MODULE = """
func.func @mm(%a: tensor<{n}x{n}x{t}>, %b: tensor<{n}x{n}x{t}>) -> tensor<{n}x{n}xf32> {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{n}x{n}xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
  %r = linalg.matmul ins(%a, %b : tensor<{n}x{n}x{t}>, tensor<{n}x{n}x{t}>)
                     outs(%f : tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
  return %r : tensor<{n}x{n}xf32>
}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--sizes", default="1024,2048,4096")
    parser.add_argument("--types", default="f32,f16")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    config = RunConfig(target=options.target)
    target = make_target(config)
    verifier = Verifier(target.device)
    lines = [
        f"# Worker timing against iree-benchmark-module ({target.describe()})",
        "",
        f"Command: `python3 benchmarks/worker_timer_check.py --target {options.target} "
        f"--out DIR --sizes {options.sizes} --types {options.types} --rounds {options.rounds}`",
        "",
        "| problem | worker ms (cv) | tool ms (cv) | difference | worker s | tool s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for size in (int(s) for s in options.sizes.split(",")):
        for element in options.types.split(","):
            folder = os.path.join(options.out, f"{size}_{element}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, "mm.mlir")
            with open(path, "w") as handle:
                handle.write(MODULE.format(n=size, t=element))
            (problem,) = analyze_file(path).problems
            repeat = target.dispatch_repeat(problem)
            source = os.path.join(folder, "kernel.mlir")
            with open(source, "w") as handle:
                handle.write(kernel_variant(problem, target, None))
            flags = [*target.compile_flags()]
            if repeat > 1:
                flags.append(f"--iree-hal-benchmark-dispatch-repeat-count={repeat}")
            built = compile_one(CompileJob(source, source + ".vmfb", flags), 600)
            if built.status != "ok":
                lines.append(f"| {problem.name} | compile failed: {built.message} | | | | |")
                continue
            data = make_problem_data(problem, os.path.join(folder, "inputs"))
            worker, tool, worker_s, tool_s = [], [], 0.0, 0.0
            for _ in range(options.rounds):
                began = time.perf_counter()
                timing = verifier.time(built.job.output, data, repeat, 3, 0.03, 120)
                worker_s += time.perf_counter() - began
                worker.append(timing.median_ms)
                began = time.perf_counter()
                timing = time_module(
                    built.job.output, target.device, data.inputs, repeat, 3, 0.03, 120
                )
                tool_s += time.perf_counter() - began
                tool.append(timing.median_ms)
            w, t = statistics.median(worker), statistics.median(tool)
            cv = lambda v: statistics.pstdev(v) / statistics.fmean(v)  # noqa: E731
            seconds = f"{worker_s / options.rounds:.2f} | {tool_s / options.rounds:.2f}"
            lines.append(
                f"| {problem.name} | {w:.4f} ({cv(worker):.1%}) | {t:.4f} ({cv(tool):.1%}) "
                f"| {w / t - 1:+.1%} | {seconds} |"
            )
    verifier.close()
    report = "\n".join(lines) + "\n"
    with open(os.path.join(options.out, "worker_timer_check.md"), "w") as handle:
        handle.write(report)
    print(report)


if __name__ == "__main__":
    main()
