"""The fixed cost of one model call, IREE against torch, on the same GPU (issue 24).

A whole model's time in the proof is iree-benchmark-module's wall time of a synchronous call;
a transformer layer on the H200 took 0.18-0.34 ms more than the sum of its dispatches. This
times a call that does almost nothing (one add of 1024 floats) both ways:

- IREE: the module built for the GPU, timed by iree-benchmark-module (as the proof times a
  model) under each runtime setting given;
- torch: `x + 1` on the same GPU, by CUDA events around the call (how the campaign times
  torch) and by the host's wall time of a synchronous call.

    python3 benchmarks/call_overhead.py --arch sm_90 [--flags "--device_allocator=caching"] \
        [--chains 1024,4096]

Prints a markdown table (medians over 5 repetitions, CV in brackets).

`--chains SIZES`: also modules of 1, 2 and 4 dependent f16 matmuls of each size (SIZE³,
each one dispatch), timed the same way. A call's time is then a line in the chain's length:
its slope is one matmul, its intercept what a call costs beside its kernels when the host
has to wait for them (the one-add call ends before the host waits). On the H200 the
Llama-3-8B layer's builds spent 0.2-0.3 ms a call beside their kernels against this call's
35 us in all (session 26: not the allocator, the wait's scheduling, command buffers or
graphs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from autosched.measure.benchmark_tool import time_module  # noqa: E402

MODULE = """
func.func @main(%x: tensor<1024xf32>) -> tensor<1024xf32> {
  %one = arith.constant dense<1.0> : tensor<1024xf32>
  %y = arith.addf %x, %one : tensor<1024xf32>
  return %y : tensor<1024xf32>
}
"""


CHAIN_LENGTHS = (1, 2, 4)


def chain_module(size: int, length: int) -> str:
    """`length` dependent SIZE³ f16 matmuls (f32 accumulators rounded to f16), each its own
    dispatch: the next one reads the last one's result."""
    square, wide = f"tensor<{size}x{size}xf16>", f"tensor<{size}x{size}xf32>"
    lines = [
        f"func.func @main(%a: {square}, %b: {square}) -> {square} {{",
        "  %zero = arith.constant 0.0 : f32",
        f"  %empty = tensor.empty() : {wide}",
        f"  %init = linalg.fill ins(%zero : f32) outs(%empty : {wide}) -> {wide}",
    ]
    last = "%a"
    for index in range(length):
        lines += [
            f"  %m{index} = linalg.matmul ins({last}, %b : {square}, {square})"
            f" outs(%init : {wide}) -> {wide}",
            f"  %r{index} = arith.truncf %m{index} : {wide} to {square}",
        ]
        last = f"%r{index}"
    return "\n".join([*lines, f"  return {last} : {square}", "}"])


def compiled(target, module: str, path: str) -> str:
    """`module` built for the target's GPU into `path`."""
    from iree import compiler

    attributes = ", ".join(f"{k} = {v}" for k, v in target.module_attributes().items())
    source = f"module attributes {{{attributes}}} {{{module}}}" if attributes else module
    with open(path, "wb") as handle:
        handle.write(compiler.compile_str(source, extra_args=target.compile_flags()))
    return path


def timed_us(vmfb: str, inputs: list[str], setting: str) -> tuple[float | None, str]:
    """(median us or None, the cell) of a call of `vmfb` under the runtime `setting`."""
    timing = time_module(vmfb, "cuda", inputs, 1, 5, 0.2, 120, "main", tuple(setting.split()))
    if not timing.median_ms:
        return None, "-"
    return timing.median_ms * 1e3, f"{timing.median_ms * 1e3:.1f} ({timing.cv:.1%})"


def iree_rows(arch: str, settings: list[str], chains: list[int]) -> list[str]:
    from autosched.config import RunConfig
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch=arch), Machine())
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = compiled(target, MODULE, os.path.join(folder, "call.vmfb"))
        for setting in settings:
            _, cell = timed_us(path, ["1024xf32=0"], setting)
            rows.append(f"| IREE, iree-benchmark-module, `{setting or 'default'}` | {cell} |")
        for size in chains:
            inputs = [f"{size}x{size}xf16=0.001"] * 2
            vmfbs = [
                compiled(target, chain_module(size, n), os.path.join(folder, f"c{size}_{n}.vmfb"))
                for n in CHAIN_LENGTHS
            ]
            for setting in settings:
                rows.append(chain_row(size, setting, [timed_us(v, inputs, setting) for v in vmfbs]))
    return rows


def chain_row(size: int, setting: str, timings: list[tuple[float | None, str]]) -> str:
    """A chain's row: each length's time, then the least-squares line's slope (one matmul)
    and intercept (the call's cost beside its kernels)."""
    cells = [cell for _, cell in timings]
    points = [(n, us) for n, (us, _) in zip(CHAIN_LENGTHS, timings, strict=True) if us]
    fit = "-"
    if len(points) >= 2:
        slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
        fit = f"{slope:.1f} a matmul, **{intercept:.1f} beside**"
    lengths = ", ".join(f"{n}: {cell}" for n, cell in zip(CHAIN_LENGTHS, cells, strict=True))
    return f"| IREE, {size}³ f16 matmuls in a chain, `{setting or 'default'}` ({lengths}) | {fit} |"


def torch_rows() -> list[str]:
    import torch

    x = torch.zeros(1024, device="cuda")
    events, walls = [], []
    for index in range(1000):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began = time.perf_counter()
        start.record()
        x + 1
        end.record()
        torch.cuda.synchronize()
        if index >= 100:
            walls.append((time.perf_counter() - began) * 1e6)
            events.append(start.elapsed_time(end) * 1e3)
    return [
        f"| torch, CUDA events around the call | {statistics.median(events):.1f} |",
        f"| torch, wall time of a synchronous call | {statistics.median(walls):.1f} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--flags", action="append", default=[""], help="a runtime setting")
    parser.add_argument("--chains", default="", help="matmul sizes of chained modules, e.g. 4096")
    options = parser.parse_args()
    chains = [int(size) for size in filter(None, options.chains.split(","))]
    lines = ["| how | us per call |", "| --- | --- |"]
    lines += iree_rows(options.arch, options.flags, chains)
    lines += torch_rows()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
