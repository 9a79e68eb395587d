"""A whole-model call timed as the proof times it, under each way CUDA lets a host thread
wait for the GPU (issue 24).

The Llama-3-8B layer's custom build spends 0.2-0.3 ms of every call outside its kernels on
the H200, most of it after the last kernel (`model_timeline.py`), while a call of a module
that adds 1024 floats takes 35 us in all (`call_overhead.py`). IREE's CUDA driver waits for
a call's end with cuEventSynchronize in the device's primary context, whose scheduling
flags (spin, yield, blocking sync; auto picks one) say whether the waiting thread spins or
sleeps until the driver wakes it. This times a build of a run's proof with
iree-benchmark-module (median of 5, CV) with those flags set before the tool starts: the C
shim `cuda_wait_shim.c`, built with the system's C compiler unless `--shim` names it, is
preloaded and sets them from AUTOSCHED_CUDA_SCHED.

    python3 benchmarks/wait_scheduling.py MODEL.mlir --proof generated/model/proof \
        --builds custom,default [--flags "--device_allocator=caching"] [--shim SO]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from model_kernels import proof_model, proof_parser, tool_timing  # noqa: E402
from model_timeline import SCHEDULING  # noqa: E402

SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_wait_shim.c")


def build_shim(folder: str) -> str:
    """The shim, compiled into `folder`."""
    path = os.path.join(folder, "cuda_wait_shim.so")
    command = ["cc", "-shared", "-fPIC", "-O2", "-o", path, SHIM_SOURCE, "-ldl"]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return path


def timed(vmfb: str, function: str, inputs: list[str], flags: list[str], env: dict) -> str:
    """One cell: the build's median (CV) with `env` added to the tool's environment."""
    timing = tool_timing(vmfb, function, inputs, flags, env)
    return f"{timing.median_ms:.3f} ({timing.cv:.1%})" if timing.median_ms else timing.message[:60]


def main() -> None:
    parser = proof_parser(__doc__.splitlines()[0])
    parser.add_argument("--shim", help="the shim, built (default: built here with cc)")
    options = parser.parse_args()
    flags = options.flags.split()
    with tempfile.TemporaryDirectory() as work:
        shim = os.path.abspath(options.shim) if options.shim else build_shim(work)
        entry, inputs = proof_model(options.model, options.arch, work)
        names = ["as it is", *sorted(SCHEDULING)]
        print(f"`{options.model}`, function `{entry.name}`, flags `{options.flags or 'none'}`\n")
        print(f"| build | {' | '.join(names)} |\n| --- |" + " --- |" * len(names))
        for build in options.builds.split(","):
            vmfb = os.path.join(options.proof, f"{build}.vmfb")
            cells = [timed(vmfb, entry.name, inputs, flags, {})]
            for name in sorted(SCHEDULING):
                env = {"LD_PRELOAD": shim, "AUTOSCHED_CUDA_SCHED": str(SCHEDULING[name])}
                cells.append(timed(vmfb, entry.name, inputs, flags, env))
            print(f"| {build} | {' | '.join(cells)} |", flush=True)
        print("\nms a call, iree-benchmark-module (median of 5, CV); columns: the primary")
        print("context's scheduling flags, set by the preloaded shim before the tool starts")


if __name__ == "__main__":
    main()
