"""Triton kernels run by IREE as custom dispatches, against IREE's default and cuBLAS, on the
local NVIDIA GPU (issue 12); writes a markdown table.

    python3 benchmarks/custom_kernels.py --out DIR [--shapes 4096x4096x4096xf16xf32]

For each shape (MxNxKxINxOUT, `t` after K for weights stored as nn.Linear does: B is NxK),
every point of a small grid of the family (block M/N/K, warps, stages, launch group) is
compiled to PTX by Triton, wrapped in a `hal.dispatch.extern` module, built by iree-compile
with the dispatch repeated, checked against numpy in the verifier's worker and timed there
(per dispatch). IREE's default kernel for the same problem is timed the same way, and
torch.matmul (cuBLAS) on the same GPU in the same process.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autosched.compile import CompileJob, compile_one  # noqa: E402
from autosched.config import RunConfig  # noqa: E402
from autosched.manifest import KERNEL_FUNCTION, kernel_variant, write_text  # noqa: E402
from autosched.records import problem_from_shape  # noqa: E402
from autosched.targets import make_target  # noqa: E402
from autosched.triton_kernels import KernelParams, compile_ptx, extern_module  # noqa: E402
from autosched.verify import Verifier, make_problem_data  # noqa: E402

GRID = {
    "block_m": [128, 256],
    "block_n": [128, 256],
    "block_k": [64],
    "warps": [4, 8],
    "stages": [3, 4],
    "group_m": [8],
}


def parse_shape(text: str):
    m, n, k, element, out = text.split("x")
    transpose_b = k.endswith("t")
    return problem_from_shape(
        {
            "op": "linalg.matmul",
            "m": int(m),
            "n": int(n),
            "k": int(k.rstrip("t")),
            "batch": 0,
            "lhs_type": element,
            "rhs_type": element,
            "acc_type": out,
            "transpose_a": False,
            "transpose_b": transpose_b,
            "zero_init": True,
        }
    )


def cublas_ms(problem) -> float:
    import torch

    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[problem.lhs_type]
    a = torch.randn(problem.m, problem.k, device="cuda", dtype=dtype)
    b = torch.randn(problem.n, problem.k, device="cuda", dtype=dtype)
    b = b.t() if problem.transpose_b else b.t().contiguous()
    for _ in range(5):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    samples = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 50)
    return statistics.median(samples)


@dataclass
class ShapeBench:
    """One shape's inputs and build flags: builds, checks and times one kernel module."""

    problem: object
    folder: str
    data: object
    repeat: int
    flags: list[str]  # the timed build: the dispatch repeated
    plain: list[str]  # the checked build
    verifier: Verifier

    def measure(self, name: str, source_text: str) -> tuple[float | None, str]:
        source = write_text(os.path.join(self.folder, f"{name}.mlir"), source_text)
        timed = compile_one(CompileJob(source, source[:-5] + ".x.vmfb", self.flags), 300)
        checked = compile_one(CompileJob(source, source[:-5] + ".vmfb", self.plain), 300)
        if timed.status != "ok" or checked.status != "ok":
            return None, (timed.message or checked.message)[:80]
        answer = self.verifier.check(checked.job.output, self.data, self.problem, 120)
        if answer.status != "correct":
            return None, f"{answer.status}: {answer.message[:60]}"
        timing = self.verifier.time(timed.job.output, self.data, self.repeat, 5, 0.05, 120)
        if timing is None or timing.status != "ok":
            return None, "timing failed"
        return timing.median_ms, f"correct (max error {answer.max_error:.2g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="4096x4096x4096xf16xf32,2048x4096x4096txf16xf16")
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    target = make_target(RunConfig(target="cuda", arch="sm_90"))
    verifier = Verifier(target.device)
    lines = [
        f"# Custom Triton kernels in IREE against IREE's default and cuBLAS ({target.describe()})",
        "",
        f"Command: `python3 benchmarks/custom_kernels.py --out DIR --shapes {options.shapes}`",
        "",
        "| shape | kernel | ms per dispatch | TFLOP/s | vs IREE default | of cuBLAS | answer |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for text in options.shapes.split(","):
        problem = parse_shape(text)
        folder = os.path.join(options.out, text)
        data = make_problem_data(problem, os.path.join(folder, "inputs"))
        repeat = target.dispatch_repeat(problem)
        flags = [*target.compile_flags(), f"--iree-hal-benchmark-dispatch-repeat-count={repeat}"]
        plain = target.compile_flags()

        shape = ShapeBench(problem, folder, data, repeat, flags, plain, verifier)
        measure = shape.measure
        default_ms, default_note = measure("iree_default", kernel_variant(problem, target, None))
        reference = cublas_ms(problem)
        rows = [("IREE default", default_ms, default_note)]
        for values in itertools.product(*GRID.values()):
            params = KernelParams(*values)
            try:
                binary = compile_ptx(
                    problem, params, "sm_90", os.path.join(folder, f"{params.name}.ptx")
                )
            except Exception as error:  # noqa: BLE001 - a point Triton refuses is a row
                rows.append((params.name, None, f"triton: {str(error).splitlines()[0][:60]}"))
                continue
            module = extern_module(
                problem, params, binary, target.executable_target(), KERNEL_FUNCTION
            )
            ms, note = measure(params.name, module)
            rows.append((params.name, ms, note))
            print(text, params.name, ms, note, flush=True)
        rows.append(("cuBLAS (torch.matmul)", reference, "-"))
        for name, ms, note in rows:
            if ms is None:
                lines.append(f"| {text} | `{name}` | - | - | - | - | {note} |")
                continue
            lines.append(
                f"| {text} | `{name}` | {ms:.4f} | {problem.flops / (ms * 1e9):.0f} | "
                + (f"{default_ms / ms:.2f}x" if default_ms else "-")
                + f" | {reference / ms:.2f} | {note} |"
            )
    verifier.close()
    with open(os.path.join(options.out, "custom_kernels.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
