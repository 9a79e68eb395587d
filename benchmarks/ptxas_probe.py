"""Does assembling kernels at compile time (ptxas) cut the verify and timing stages?

Compiles 12 random points of the default 4096^3 f32 and f16 spaces with PTX embedded
(ptxas = none) and with the local ptxas, then verifies and times each build on the GPU.

    python benchmarks/ptxas_probe.py
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_suite import module_text  # noqa: E402

from autosched.compile import CompileJob, compile_all  # noqa: E402
from autosched.config import RunConfig, load_config, with_overrides  # noqa: E402
from autosched.measure.benchmark_tool import time_module  # noqa: E402
from autosched.measure.worker import Verifier, make_problem_data  # noqa: E402
from autosched.ops.matmul import analyze_file  # noqa: E402
from autosched.ops.matmul_kernel import kernel_variant, write_text  # noqa: E402
from autosched.search.space import build_space  # noqa: E402
from autosched.targets import make_target  # noqa: E402
from autosched.targets.host import find_ptxas  # noqa: E402


def main() -> None:
    ptxas = find_ptxas(RunConfig())
    print("ptxas:", ptxas or "none found", flush=True)
    work = "generated/ptxas_probe"
    for element in ("f32", "f16"):
        text = module_text(4096, 4096, 4096, element, "f32")
        path = write_text(os.path.join(work, f"m_{element}.mlir"), text)
        base = with_overrides(load_config("configs/cuda_suite.cfg"), input_file=path)
        target = make_target(base)
        problem = analyze_file(path).problems[0]
        space = build_space(problem, target, base.knob_space)
        points = random.Random(0).sample(space.points, 12)
        repeat = target.dispatch_repeat(problem)
        data = make_problem_data(problem, os.path.join(work, "inputs", element))
        verifier = Verifier("cuda")
        for mode in ("none", ptxas) if ptxas else ("none",):
            build_target = make_target(with_overrides(base, ptxas=mode))
            jobs = []
            for i, point in enumerate(points):
                source = write_text(
                    os.path.join(work, "ptxas" if mode != "none" else "ptx", element, f"p{i}.mlir"),
                    kernel_variant(problem, target, point),
                )
                flags = [
                    *build_target.compile_flags(),
                    f"--iree-hal-benchmark-dispatch-repeat-count={repeat}",
                ]
                jobs.append(CompileJob(source, source[:-5] + ".vmfb", flags))
            start = time.perf_counter()
            results = list(compile_all(jobs, 120, 16))
            wall = time.perf_counter() - start
            verify_s, timing_s, medians = [], [], {}
            for r in sorted(results, key=lambda r: r.job.output):
                if r.status != "ok":
                    print(mode, element, r.job.output, r.status, r.message)
                    continue
                t0 = time.perf_counter()
                check = verifier.check(r.job.output, data, problem, 60)
                verify_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                timing = time_module(r.job.output, "cuda", data.inputs, repeat, 3, 0.03, 60)
                timing_s.append(time.perf_counter() - t0)
                medians[os.path.basename(r.job.output)] = (check.status, timing.median_ms)
            one = statistics.median(r.seconds for r in results)
            print(
                f"{element} ptxas={mode}: compile wall {wall:.1f} s (median {one:.2f} s each), "
                f"verify median {statistics.median(verify_s):.3f} s, "
                f"timing median {statistics.median(timing_s):.3f} s",
                flush=True,
            )
            print(
                "   ",
                {k: (s, round(m, 4) if m else m) for k, (s, m) in medians.items()},
                flush=True,
            )
        verifier.close()


if __name__ == "__main__":
    main()
