"""Where a whole-model call's time goes, by IREE's own HAL profiler (issue 24).

On the H200 the Llama-3-8B layer's custom build takes 0.2-0.3 ms a call more than its
kernels, in IREE's default build too, while a call of a module that adds 1024 floats takes
35 us (`call_overhead.py`). CUPTI (`model_timeline.py`) saw that time before the first
kernel and after the last, but not what IREE does then. IREE 3.13's HAL profiling records
its own queue operations (alloca, execute, dealloca), their host spans, the dispatches'
device timestamps and the memory events; `iree-profile` reads the bundle.

This runs each build of a run's proof (its vmfb) under iree-benchmark-module with profiling
on, keeps each bundle (`--out`), and prints `iree-profile explain` and the queue operations
of the last calls. A driver that does not produce a family is retried without it.

    python3 benchmarks/model_queue.py MODEL.mlir --proof generated/model/proof \
        --builds custom,default --out DIR [--flags "--device_allocator=caching"]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from model_kernels import calls_command, proof_model, proof_parser  # noqa: E402

from autosched.measure.benchmark_tool import benchmark_tool  # noqa: E402

# Most informative first; each later list drops what a driver may not produce.
FAMILIES = (
    "queue-events,host-execution,device-queue-events,dispatch-events,memory-events",
    "queue-events,device-queue-events,dispatch-events,memory-events",
    "queue-events,dispatch-events",
    "queue-events,host-execution,memory-events",
    "queue-events",
)


def profile_tool() -> str:
    """iree-profile, beside iree-benchmark-module in IREE's runtime package."""
    return os.path.join(os.path.dirname(benchmark_tool()), "iree-profile")


def capture(vmfb: str, function: str, inputs: list[str], flags: list[str], bundle: str, calls):
    """Runs `calls` calls of the build with profiling on; the families that worked, or the
    last failure's message."""
    last = ""
    for families in FAMILIES:
        command = calls_command(vmfb, function, inputs, flags, calls)
        command += [f"--device_profiling_mode={families}", f"--device_profiling_output={bundle}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            return families, done.stdout.strip().splitlines()[-1:]
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    raise RuntimeError(f"no profiling family worked: {last[0]}")


def report(bundle: str, command: str, *extra: str, lines: int = 80) -> list[str]:
    done = subprocess.run(
        [profile_tool(), command, *extra, bundle], capture_output=True, text=True, timeout=300
    )
    text = (done.stdout or done.stderr).splitlines()
    return ["```", f"$ iree-profile {command} {' '.join(extra)}".rstrip(), *text[:lines], "```"]


def main() -> None:
    parser = proof_parser(__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", required=True, help="where the .ireeprof bundles go")
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        entry, inputs = proof_model(options.model, options.arch, work)
        print(f"`{options.model}`, function `{entry.name}`, flags `{options.flags}`\n")
        for build in options.builds.split(","):
            vmfb = os.path.join(options.proof, f"{build}.vmfb")
            bundle = os.path.join(options.out, f"{build}.ireeprof")
            try:
                families, timing = capture(
                    vmfb, entry.name, inputs, options.flags.split(), bundle, options.calls
                )
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                print(f"### {build}\n\n{error}\n", flush=True)
                continue
            lines = [f"### {build}", "", f"families: `{families}`; {' '.join(timing)}", ""]
            lines += report(bundle, "explain")
            lines += report(bundle, "queue", lines=120)
            lines += report(bundle, "memory", lines=40)
            print("\n".join([*lines, ""]), flush=True)


if __name__ == "__main__":
    main()
