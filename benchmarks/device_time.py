"""A whole-model call's device time, as IREE's own HAL profiling counts it (issue 24).

torch's first number for a model is CUDA events around a call: the GPU stream's time, which
leaves out the host's work before the first launch and after the last. The proof times
IREE's builds as the host's wall time of a synchronous call, which counts that work. IREE
3.13's tools can count the device's side too: `--print_device_statistics` runs a light HAL
profiling session and prints, per queue operation, the device's time from its start to its
end. This runs `--calls` calls of each build with it and reports the wall time of a call
beside the device time of its queue operations (the like of torch's events), and with
`--dispatches` each dispatch's device time inside the model (`--dispatch_statistics`).

    python3 benchmarks/device_time.py MODEL.mlir --proof generated/model/proof \
        --builds custom,default [--flags "--cuda_async_allocations=false ..."] [--calls 50] \
        [--device cuda] [--dispatches]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(__file__))

from model_kernels import calls_command, proof_model, proof_parser  # noqa: E402

STATISTICS = "IREE HAL device statistics:"
UNITS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}  # to ms


@dataclass
class QueueRow:
    """One line of the statistics: `device_queue p=0 q=0 execute count=20 total=… avg=…`."""

    clock: str  # host_queue, device_queue, host_execute, ...
    operation: str  # execute, alloca, dealloca, a dispatch function
    count: int
    total_ms: float


def milliseconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * UNITS[unit]


def statistics_rows(stdout: str) -> tuple[dict[str, float], list[QueueRow]]:
    """The totals (`device_queue_total=… ms`) and the per-operation rows of the tool's
    statistics block (its own text format: `key=value` fields, times with units)."""
    block = stdout.split(STATISTICS, 1)[1].split("\n\n", 1)[0] if STATISTICS in stdout else ""
    totals, rows = {}, []
    for line in block.strip().splitlines():
        key, _, value = line.strip().partition("=")
        if key.endswith("_total") and " " not in key:
            totals[key] = milliseconds(value)
        elif " count=" in line and " total=" in line:
            head, _, tail = line.strip().partition(" count=")
            names = [word for word in head.split() if "=" not in word]
            total = " ".join(tail.split(" total=", 1)[1].split()[:2])
            rows.append(QueueRow(names[0], names[-1], int(tail.split()[0]), milliseconds(total)))
    return totals, rows


def run_tool(command: list[str]) -> str:
    """The tool's output: its benchmark rows (stdout), then its statistics (stderr)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"iree-benchmark-module failed: {done.stderr[-800:]}")
    return done.stdout + done.stderr


def wall_ms(stdout: str) -> float:
    """The tool's `real_time` row: the mean ms a call."""
    words = next(x for x in stdout.splitlines() if "/real_time" in x).split()
    return milliseconds(f"{words[1]} {words[2]}")


@dataclass
class Profiled:
    """What `calls` calls of a build took, from the tool's output."""

    calls: int
    stdout: str

    def wall_total(self) -> float:
        return wall_ms(self.stdout) * self.calls

    def totals(self) -> dict[str, float]:
        return statistics_rows(self.stdout)[0]

    def rows(self) -> dict[tuple[str, str], float]:
        return {(r.clock, r.operation): r.total_ms for r in statistics_rows(self.stdout)[1]}


def steady(short: Profiled, long: Profiled, what: str) -> dict:
    """ms a steady call: what the longer run took past the shorter one (each begins with the
    same first call, which allocates and warms up), per call."""
    calls = long.calls - short.calls
    before, after = getattr(short, what)(), getattr(long, what)()
    return {key: (after[key] - before.get(key, 0.0)) / calls for key in after}


def report(build: str, short: Profiled, long: Profiled) -> list[str]:
    wall = (long.wall_total() - short.wall_total()) / (long.calls - short.calls)
    lines = [f"### {build}", "", "| timed | ms a call |", "| --- | --- |"]
    lines.append(f"| wall of a synchronous call (iree-benchmark-module) | {wall:.3f} |")
    lines += [f"| `{name}` | {ms:.3f} |" for name, ms in steady(short, long, "totals").items()]
    lines += ["", "| clock | operation | ms a call |", "| --- | --- | --- |"]
    rows = steady(short, long, "rows").items()
    lines += [f"| {clock} | `{op[:80]}` | {ms:.4f} |" for (clock, op), ms in rows if ms > 0]
    block = long.stdout.split(STATISTICS, 1)[-1].split("\n\n", 1)[0].strip()
    raw = ["<details><summary>the tool's statistics, the longer run</summary>", "", "```"]
    return [*lines, "", *raw, block, "```", "</details>", ""]


def main() -> None:
    parser = proof_parser(__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls profiled past the first")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dispatches", action="store_true", help="each dispatch in the model")
    options = parser.parse_args()
    flags = options.flags.split()
    with tempfile.TemporaryDirectory() as work:
        entry, inputs = proof_model(options.model, options.arch, work)
        print(
            f"`{options.model}`, device {options.device}, flags `{options.flags}`; each "
            f"build run for 1 and {options.calls + 1} calls, the difference per call\n"
        )
        for build in options.builds.split(","):
            vmfb = os.path.join(options.proof, f"{build}.vmfb")
            runs = []
            for calls in (1, options.calls + 1):
                command = calls_command(vmfb, entry.name, inputs, flags, calls, options.device)
                runs.append(Profiled(calls, run_tool([*command, "--print_device_statistics"])))
            print("\n".join(report(build, *runs)), flush=True)
            if options.dispatches:
                command = calls_command(vmfb, entry.name, inputs, flags, 20, options.device)
                dispatches = run_tool([*command, "--dispatch_statistics"]).strip()
                print("```", dispatches, "```", "", sep="\n", flush=True)


if __name__ == "__main__":
    main()
