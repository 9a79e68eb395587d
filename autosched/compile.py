"""Runs iree-compile on many variants at once, each with its own timeout."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from iree.compiler.tools.binaries import find_tool

from autosched import processes


@dataclass
class CompileJob:
    source: str  # .mlir
    output: str  # .vmfb
    flags: list[str]
    before: list[str] = field(default_factory=list)  # a command that writes `source` first


@dataclass
class CompileResult:
    job: CompileJob
    status: str  # ok, compile_error, timeout
    seconds: float
    message: str = ""


def first_error_line(stderr: str) -> str:
    """The first `error:` line of iree-compile's diagnostics, else its first line."""
    for line in stderr.splitlines():
        if "error:" in line:
            return line.strip()[:300]
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[0][:300] if lines else "iree-compile failed without a message"


def compiler_path() -> str:
    return processes.tool_path("iree-compile", find_tool("iree-compile"))


def opt_path() -> str:
    return processes.tool_path("iree-opt", find_tool("iree-opt"))


# Compiles run below normal priority: a pool that fills every core must not keep the CPU
# from the measuring worker (on the H200, with 16 compiles beside it, the worker's check
# spent 0.1-0.4 s loading each module: its largest step).
COMPILE_NICENESS = 5


def compile_one(job: CompileJob, timeout: float) -> CompileResult:
    """iree-compile on one variant (after the command that writes it, if it has one)."""
    os.makedirs(os.path.dirname(job.output) or ".", exist_ok=True)
    seconds = 0.0
    if job.before:
        made = processes.run(job.before, timeout, niceness=COMPILE_NICENESS)
        seconds = made.seconds
        if made.timed_out:
            return CompileResult(job, "timeout", seconds, f"writing the module: over {timeout:g} s")
        if made.returncode != 0:
            why = processes.describe_failure(made, "writing the module")
            return CompileResult(job, "compile_error", seconds, why)
    command = [compiler_path(), job.source, "-o", job.output, *job.flags]
    finished = processes.run(command, timeout, niceness=COMPILE_NICENESS)
    finished.seconds += seconds
    if finished.timed_out:
        return CompileResult(job, "timeout", finished.seconds, f"over {timeout:g} s")
    if finished.returncode != 0:
        if finished.returncode < 0:
            message = processes.describe_failure(finished, "iree-compile")
        else:
            message = first_error_line(finished.stderr)
        return CompileResult(job, "compile_error", finished.seconds, message)
    return CompileResult(job, "ok", finished.seconds)


def compile_all(
    jobs: list[CompileJob],
    timeout: float,
    workers: int,
    on_done: Callable[[CompileResult], None] | None = None,
) -> Iterator[CompileResult]:
    """Yields results as they finish; a failure is a result, never an exception.

    When the caller stops early (an interrupt), compiles not yet started are cancelled and
    running ones are killed by `processes.stop_all`, so leaving the pool does not wait.
    """
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = [pool.submit(compile_one, job, timeout) for job in jobs]
        for future in as_completed(futures):
            result = future.result()
            if on_done:
                on_done(result)
            yield result
    finally:
        pool.shutdown(wait=not processes.stopping(), cancel_futures=True)
