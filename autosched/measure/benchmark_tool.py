"""Times one compiled module with iree-benchmark-module: median and spread of repetitions."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass

from iree.runtime.benchmark import benchmark_exe

from autosched import processes
from autosched.ops.matmul_kernel import KERNEL_FUNCTION

# Timing the same dispatch R times per call (see DESIGN.md): the reported time is per dispatch.


@dataclass
class Timing:
    status: str  # ok, runtime_error, timeout
    median_ms: float | None = None
    cv: float | None = None  # standard deviation over mean of the repetitions
    samples_ms: list[float] | None = None
    message: str = ""


UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def benchmark_tool() -> str:
    return processes.tool_path("iree-benchmark-module", os.path.normpath(benchmark_exe()))


def read_samples(report: str) -> list[float]:
    """Per-repetition times in ms from a Google Benchmark JSON report.

    Raises ValueError for a report that is cut short, malformed, or flags an error.
    """
    try:
        rows = json.loads(report)["benchmarks"]
        samples = []
        for row in rows:
            if row.get("error_occurred"):
                raise ValueError(f"{row.get('name', '?')}: {row.get('error_message', 'error')}")
            if row.get("run_type") == "iteration":
                samples.append(float(row["real_time"]) * UNITS_MS[row["time_unit"]])
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"unreadable report ({type(error).__name__}: {error})") from None
    return samples


def time_module(
    vmfb: str,
    device: str,
    inputs: list[str],
    dispatch_repeat: int,
    repetitions: int,
    min_time: float,
    timeout: float,
    function: str = KERNEL_FUNCTION,
    runtime_flags: tuple[str, ...] = (),
) -> Timing:
    """Median time of one dispatch; the tool's own warm-up run is not counted.
    `runtime_flags` are IREE runtime flags, such as the CUDA driver's --cuda_use_streams."""
    with tempfile.TemporaryDirectory(prefix="autosched-bench-") as folder:
        report_path = os.path.join(folder, "report.json")
        command = [
            benchmark_tool(),
            f"--module={vmfb}",
            f"--function={function}",
            f"--device={device}",
            *[f"--input={value}" for value in inputs],
            f"--batch_size={dispatch_repeat}",
            f"--benchmark_repetitions={repetitions}",
            f"--benchmark_min_time={min_time}s",
            f"--benchmark_min_warmup_time={min_time}",
            f"--benchmark_out={report_path}",
            "--benchmark_out_format=json",
            *runtime_flags,
        ]
        finished = processes.run(command, timeout)
        if finished.timed_out:
            return Timing("timeout", message=f"over {timeout:g} s")
        if finished.returncode != 0:
            return Timing(
                "runtime_error",
                message=processes.describe_failure(finished, "iree-benchmark-module"),
            )
        try:
            with open(report_path, encoding="utf-8", errors="replace") as handle:
                samples = read_samples(handle.read())
        except FileNotFoundError:
            return Timing("runtime_error", message="iree-benchmark-module wrote no report")
        except ValueError as error:
            return Timing("runtime_error", message=f"iree-benchmark-module: {error}"[:300])
    if not samples:
        return Timing("runtime_error", message="iree-benchmark-module reported no timings")
    return summarize(samples)


def summarize(samples: list[float]) -> Timing:
    """Median and coefficient of variation of per-dispatch samples (ms)."""
    mean = statistics.fmean(samples)
    cv = statistics.pstdev(samples) / mean if mean > 0 else 0.0
    return Timing("ok", statistics.median(samples), cv, samples)
