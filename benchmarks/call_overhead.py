"""The fixed cost of one model call, IREE against torch, on the same GPU (issue 24).

A whole model's time in the proof is iree-benchmark-module's wall time of a synchronous call;
a transformer layer on the H200 took 0.18-0.34 ms more than the sum of its dispatches. This
times a call that does almost nothing (one add of 1024 floats) both ways:

- IREE: the module built for the GPU, timed by iree-benchmark-module (as the proof times a
  model) under each runtime setting given;
- torch: `x + 1` on the same GPU, by CUDA events around the call (how the campaign times
  torch) and by the host's wall time of a synchronous call.

    python3 benchmarks/call_overhead.py --arch sm_90 [--flags "--device_allocator=caching"]

Prints a markdown table (medians over 5 repetitions, CV in brackets).
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


def iree_rows(arch: str, settings: list[str]) -> list[str]:
    from iree import compiler

    from autosched.config import RunConfig
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch=arch), Machine())
    attributes = ", ".join(f"{k} = {v}" for k, v in target.module_attributes().items())
    source = f"module attributes {{{attributes}}} {{{MODULE}}}" if attributes else MODULE
    vmfb = compiler.compile_str(source, extra_args=target.compile_flags())
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "call.vmfb")
        with open(path, "wb") as handle:
            handle.write(vmfb)
        for setting in settings:
            timing = time_module(
                path, "cuda", ["1024xf32=0"], 1, 5, 0.2, 120, "main", tuple(setting.split())
            )
            cell = f"{timing.median_ms * 1e3:.1f} ({timing.cv:.1%})" if timing.median_ms else "-"
            rows.append(f"| IREE, iree-benchmark-module, `{setting or 'default'}` | {cell} |")
    return rows


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
    options = parser.parse_args()
    lines = ["| how | us per call |", "| --- | --- |"]
    lines += iree_rows(options.arch, options.flags)
    lines += torch_rows()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
