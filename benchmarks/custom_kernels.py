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
from dataclasses import dataclass, field, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autosched.compile import CompileJob, compile_one  # noqa: E402
from autosched.config import RunConfig  # noqa: E402
from autosched.kernels.matmul_triton.kernel import (  # noqa: E402
    KernelParams,
    _kernel,
    _strides,
    compile_ptx,
    extern_module,
    grid,
)
from autosched.measure.benchmark_tool import time_module  # noqa: E402
from autosched.measure.worker import Verifier, make_problem_data  # noqa: E402
from autosched.ops.matmul_kernel import KERNEL_FUNCTION, kernel_variant, write_text  # noqa: E402
from autosched.outputs.records import problem_from_shape  # noqa: E402
from autosched.targets import make_target  # noqa: E402

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


TORCH_TYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


def graph_ms(launch, inner: int = 20, repetitions: int = 7) -> float:
    """Milliseconds per launch: `inner` launches captured in a CUDA graph, replayed and timed
    with CUDA events, median of `repetitions` (no Python overhead counted)."""
    import torch

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up (and Triton's compile) off the capture
        for _ in range(3):
            launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            launch()
    samples = []
    for _ in range(repetitions):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / inner)
    return statistics.median(samples)


def operands(problem):
    """A, B (NxK transposed when the problem's B is) and an output, on the GPU."""
    import torch

    dtype = getattr(torch, TORCH_TYPES[problem.lhs_type])
    a = torch.randn(problem.m, problem.k, device="cuda", dtype=dtype)
    b = torch.randn(problem.n, problem.k, device="cuda", dtype=dtype)
    b = b.t() if problem.transpose_b else b.t().contiguous()
    out = torch.empty(
        problem.m, problem.n, device="cuda", dtype=getattr(torch, TORCH_TYPES[problem.acc_type])
    )
    return a, b, out


def ptxas_versions(system: str) -> str:
    """The release line of the ptxas IREE assembles with and of the one Triton bundles."""
    import subprocess

    import triton.backends.nvidia

    bundled = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "ptxas")
    found = []
    for name, path in (("IREE's (--iree-cuda-use-ptxas-from)", system), ("Triton's", bundled)):
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
            found.append(f"{name} {path}: {out.strip().splitlines()[-1]}")
        except (OSError, IndexError):
            found.append(f"{name} {path}: not found")
    return "; ".join(found)


# Launches per CUDA-graph replay in the long-burst rows: about as long as the IREE timings'
# repetitions (tens of ms at 4096^3), where a short burst may still run at boost clocks.
LONG_BURST = 250
GRAPH_FLAG = "--cuda_use_streams=false"  # IREE's CUDA driver records command buffers as graphs


def cublas_ms(problem, inner: int = 20) -> float:
    """torch.matmul; its output is the input type (cuBLAS through torch writes no f32 for
    f16 inputs), so an f32-output problem stores half the bytes here."""
    import torch

    a, b, _ = operands(problem)
    out = torch.empty(problem.m, problem.n, device="cuda", dtype=a.dtype)
    return graph_ms(lambda: torch.matmul(a, b, out=out), inner)


def triton_direct_ms(problem, params: KernelParams, inner: int = 20) -> float:
    """The same kernel launched by Triton itself (its own launcher and its bundled ptxas),
    to tell the kernel's speed from what running it inside IREE adds."""
    a, b, c = operands(problem)
    kernel = _kernel(None, params)
    even = problem.m % params.block_m == 0 and problem.n % params.block_n == 0
    even = even and problem.k % params.block_k == 0
    constants = {"M": problem.m, "N": problem.n, "K": problem.k, **_strides(problem)}
    constants |= {"BM": params.block_m, "BN": params.block_n, "BK": params.block_k}
    constants |= {"G": params.group_m, "EVEN": even}
    # K whole: no split-K shares, so no locks nor workspace
    constants |= {"SPLIT": 1, "K_PART": problem.k, "WORK": False, "locks": None, "w": None}
    blocks = grid(problem, params)[:2]
    return graph_ms(
        lambda: kernel[blocks](
            a, b, c, **constants, num_warps=params.warps, num_stages=params.stages
        ),
        inner,
    )


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

    graphs: Verifier | None = None  # times the timed build again with graph command buffers
    graph_ms: dict = field(default_factory=dict)  # name -> that time

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
        if timing is None:  # bf16 inputs: the worker cannot hold them, IREE's tool can
            flags = self.verifier.runtime_flags
            timing = time_module(
                timed.job.output,
                "cuda",
                self.data.inputs,
                self.repeat,
                5,
                0.05,
                120,
                runtime_flags=flags,
            )
        if timing.status != "ok":
            return None, "timing failed"
        if self.graphs is not None:
            graph = self.graphs.time(timed.job.output, self.data, self.repeat, 5, 0.05, 120)
            ok = graph is not None and graph.status == "ok"
            self.graph_ms[name] = graph.median_ms if ok else None
        return timing.median_ms, f"correct (max error {answer.max_error:.2g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="4096x4096x4096xf16xf32,2048x4096x4096txf16xf16")
    parser.add_argument(
        "--points",
        default="",
        help="points instead of the grid, as BMxBNxBKxWARPSxSTAGESxGROUP[xSPLITxPERSISTENT] "
        "(comma-separated)",
    )
    parser.add_argument(
        "--routes",
        action="store_true",
        help="also time each point built without ptxas (the driver compiles the PTX at load), "
        "with its dispatch repeated 8 times as often per call (a cost paid once per call, "
        "such as allocating the output, then weighs 8 times less per dispatch), with the "
        "largest shared-memory carveout, and launched by Triton itself, outside IREE, in "
        "short and long bursts (clocks); cuBLAS in a long burst too",
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="also time each IREE row with the CUDA driver's graph command buffers "
        f"({GRAPH_FLAG}): a dispatch then costs no host launch of its own",
    )
    options = parser.parse_args()
    points = [KernelParams(*map(int, p.split("x"))) for p in options.points.split(",") if p]
    points = points or [KernelParams(*values) for values in itertools.product(*GRID.values())]
    os.makedirs(options.out, exist_ok=True)
    target = make_target(RunConfig(target="cuda", arch="sm_90"))
    verifier = Verifier(target.device)
    graphs = Verifier(target.device, (GRAPH_FLAG,)) if options.graphs else None
    lines = [
        f"# Custom Triton kernels in IREE against IREE's default and cuBLAS ({target.describe()})",
        "",
        "Command: `python3 benchmarks/custom_kernels.py --out DIR --shapes "
        + options.shapes
        + (f" --points {options.points}" if options.points else "")
        + (" --routes" if options.routes else "")
        + (" --graphs" if options.graphs else "")
        + "`",
        "",
        f"ptxas: {ptxas_versions(target.ptxas)}",
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

        shape = ShapeBench(problem, folder, data, repeat, flags, plain, verifier, graphs)
        measure = shape.measure
        unassembled = [f for f in flags if not f.startswith("--iree-cuda-use-ptxas")]
        jit = ShapeBench(problem, folder, data, repeat, unassembled, unassembled[:-1], verifier)
        longer = [*flags[:-1], f"--iree-hal-benchmark-dispatch-repeat-count={8 * repeat}"]
        per_call = ShapeBench(problem, folder, data, 8 * repeat, longer, plain, verifier)
        default_ms, default_note = measure("iree_default", kernel_variant(problem, target, None))
        reference = cublas_ms(problem)
        print(text, "iree_default", default_ms, "cublas", reference, flush=True)
        rows = [("IREE default", default_ms, default_note)]
        if graphs is not None:
            rows.append(
                ("IREE default (graph command buffers)", shape.graph_ms.get("iree_default"), "-")
            )
        if options.routes:
            ms, note = per_call.measure("iree_default_x8", kernel_variant(problem, target, None))
            rows.append((f"IREE default ({8 * repeat} dispatches a call)", ms, note))
        for params in points:
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
            if graphs is not None:
                graph = shape.graph_ms.get(params.name)
                rows.append((f"{params.name} (graph command buffers)", graph, "-"))
            print(text, params.name, ms, note, flush=True)
            if options.routes:
                ms, note = jit.measure(params.name + "_jit", module)
                rows.append((f"{params.name} (PTX compiled by the driver at load)", ms, note))
                ms, note = per_call.measure(params.name + "_x8", module)
                rows.append((f"{params.name} ({8 * repeat} dispatches a call)", ms, note))
                # IREE asks the driver for the kernel's own shared memory; Triton's launcher
                # prefers shared memory over L1 (the largest carveout). Asking for the arch's
                # largest amount gives the largest carveout inside IREE too.
                widest = replace(binary, shared_bytes=target.shared_memory_bytes)
                wide = extern_module(
                    problem, params, widest, target.executable_target(), KERNEL_FUNCTION
                )
                ms, note = measure(params.name + "_widest", wide)
                rows.append(
                    (f"{params.name} (all {widest.shared_bytes} B of shared memory)", ms, note)
                )
                ms = triton_direct_ms(problem, params)
                rows.append((f"{params.name} (launched by Triton, outside IREE)", ms, "-"))
                ms = triton_direct_ms(problem, params, LONG_BURST)
                rows.append((f"{params.name} (launched by Triton, {LONG_BURST} in a row)", ms, "-"))
                print(text, params.name, "routes", rows[-5:], flush=True)
        rows.append(("cuBLAS (torch.matmul)", reference, "-"))
        if options.routes:
            long_burst = cublas_ms(problem, LONG_BURST)
            rows.append((f"cuBLAS (torch.matmul, {LONG_BURST} in a row)", long_burst, "-"))
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
    if graphs is not None:
        graphs.close()
    with open(os.path.join(options.out, "custom_kernels.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
