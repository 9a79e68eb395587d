"""Times one compiled module with iree-benchmark-module: median and spread of repetitions."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from iree.runtime.benchmark import BenchmarkTimeoutError, BenchmarkToolError, benchmark_module

from autosched.manifest import KERNEL_FUNCTION

# Timing the same dispatch R times per call (see DESIGN.md): the reported time is per dispatch.


@dataclass
class Timing:
    status: str  # ok, runtime_error, timeout
    median_ms: float | None = None
    cv: float | None = None  # standard deviation over mean of the repetitions
    samples_ms: list[float] | None = None
    message: str = ""


def _to_ms(value: float, unit: str) -> float:
    return value * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def time_module(
    vmfb: str,
    device: str,
    inputs: list[str],
    dispatch_repeat: int,
    repetitions: int,
    min_time: float,
    timeout: float,
    function: str = KERNEL_FUNCTION,
) -> Timing:
    """Median time of one dispatch; the tool's own warm-up run is not counted."""
    try:
        rows = benchmark_module(
            vmfb,
            entry_function=function,
            inputs=inputs,
            timeout=timeout,
            device=device,
            batch_size=dispatch_repeat,
            benchmark_repetitions=repetitions,
            benchmark_min_time=f"{min_time}s",
            benchmark_min_warmup_time=min_time,
        )
    except BenchmarkTimeoutError:
        return Timing("timeout", message=f"over {timeout:g} s")
    except BenchmarkToolError as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        detail = next(
            (line for line in lines if "error" in line.lower()), lines[-1] if lines else ""
        )
        return Timing("runtime_error", message=detail.strip()[:300])
    samples = [
        _to_ms(row.report["real_time"], row.report["time_unit"])
        for row in rows
        if row.report.get("run_type") == "iteration"
    ]
    if not samples:
        return Timing("runtime_error", message="iree-benchmark-module reported no timings")
    mean = statistics.fmean(samples)
    cv = statistics.pstdev(samples) / mean if mean > 0 else 0.0
    return Timing("ok", statistics.median(samples), cv, samples)
