"""A whole-model call with and without IREE's VM: iree-benchmark-module against a replay of
the HAL calls it made (issue 24).

The Llama-3-8B layer's custom build spends about 0.2 ms a call beside its kernels on the
H200; with the caching allocator the CUDA driver is idle for 89 us of it before each
call's first launch (driver_calls.py, session 27). IREE 3.13 can record every HAL call a
tool makes (`--device_replay_output`): iree-benchmark-module marks each timed call as an
`execute` scope, and iree-benchmark-replay replays the HAL calls and times those scopes
alone, with no VM, no module and no argument checks. This records `--calls` calls of a
build, lists the HAL operations of one call (iree-dump-replay), and times the call both
ways: what the replay saves is what IREE's VM and the module's code cost a call.

    python3 benchmarks/hal_replay.py MODEL.mlir --proof generated/model/proof \
        --builds custom [--flags "--cuda_async_allocations=false ..."] [--calls 20] \
        [--device cuda]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from model_kernels import proof_model, proof_parser  # noqa: E402

from autosched import processes  # noqa: E402
from autosched.measure.benchmark_tool import UNITS_MS, benchmark_tool, time_module  # noqa: E402

SCOPE = "execute"  # iree-benchmark-module's scope around each timed call


def tool(name: str) -> str:
    """One of IREE's runtime tools, beside iree-benchmark-module."""
    return processes.tool_path(name, os.path.join(os.path.dirname(benchmark_tool()), name))


def record(vmfb: str, function: str, inputs: list[str], flags: list[str], calls: int,
           device: str, capture: str) -> None:  # fmt: skip
    """`calls` timed calls of the build, their HAL calls written to `capture`."""
    command = [
        benchmark_tool(), f"--module={vmfb}", f"--function={function}", f"--device={device}",
        *[f"--input={value}" for value in inputs], f"--benchmark_min_time={calls}x",
        "--benchmark_min_warmup_time=0", f"--device_replay_output={capture}", *flags,
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=600)


def operations_per_call(capture: str) -> tuple[int, Counter]:
    """(calls recorded, the HAL operations inside one `execute` scope on average)."""
    dump = subprocess.run(
        [tool("iree-dump-replay"), "--format=jsonl", capture],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    calls, inside, counts = 0, False, Counter()
    for line in dump.stdout.splitlines():
        row = json.loads(line)
        name = (
            (row.get("payload") or {}).get("name")
            if row.get("payload_type") == "replay_scope"
            else None
        )
        if name == SCOPE:
            inside = row["operation"] == "replay.scope_begin"
            calls += inside
        elif inside and row.get("kind") == "operation":
            counts[row["operation"]] += 1
    return calls, Counter({op: n / max(calls, 1) for op, n in counts.items()})


def replay_ms(capture: str, device: str, flags: list[str], calls: int) -> tuple[float, float]:
    """(median ms a call, CV) of the `execute` scopes replayed, 5 repetitions of 10."""
    command = [
        tool("iree-benchmark-replay"), f"--device={device}", f"--replay_scope={SCOPE}",
        "--benchmark_min_time=10x", "--benchmark_repetitions=5", "--benchmark_format=json",
        *flags, capture,
    ]  # fmt: skip
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    rows = [r for r in json.loads(done.stdout)["benchmarks"] if r.get("run_type") == "iteration"]
    samples = [float(r["real_time"]) * UNITS_MS[r["time_unit"]] / calls for r in rows]
    mean = statistics.fmean(samples)
    return statistics.median(samples), statistics.pstdev(samples) / mean


def report(build: str, module: float, replayed: tuple[float, float], calls: int, ops: Counter):
    median, cv = replayed
    lines = [
        f"### {build}\n",
        "| timed | ms a call (cv) |",
        "| --- | --- |",
        f"| iree-benchmark-module (the VM, the module's code and its HAL calls) | {module:.3f} |",
        f"| iree-benchmark-replay, the HAL calls alone ({calls} calls recorded) "
        f"| {median:.3f} ({cv:.1%}) |",
        f"| the VM and the module's code | {module - median:.3f} |",
        "",
        "| HAL operation | a call |",
        "| --- | --- |",
    ]
    lines += [f"| `{op}` | {n:g} |" for op, n in ops.most_common()]
    return lines


def main() -> None:
    parser = proof_parser(__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="calls recorded")
    parser.add_argument("--device", default="cuda")
    options = parser.parse_args()
    flags = options.flags.split()
    with tempfile.TemporaryDirectory() as work:
        entry, inputs = proof_model(options.model, options.arch, work)
        print(f"`{options.model}`, device {options.device}, flags `{options.flags}`\n")
        for build in options.builds.split(","):
            vmfb = os.path.join(options.proof, f"{build}.vmfb")
            capture = os.path.join(work, f"{build}.ireereplay")
            record(vmfb, entry.name, inputs, flags, options.calls, options.device, capture)
            calls, ops = operations_per_call(capture)
            replayed = replay_ms(capture, options.device, flags, calls)
            timing = time_module(vmfb, options.device, inputs, 1, 5, 0.2, 600, entry.name,
                                 tuple(flags))  # fmt: skip
            print("\n".join(report(build, timing.median_ms, replayed, calls, ops)), flush=True)


if __name__ == "__main__":
    main()
