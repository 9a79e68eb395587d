"""Runs iree-compile on many variants at once, each with its own timeout."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from iree.compiler.tools.binaries import find_tool


@dataclass
class CompileJob:
    source: str  # .mlir
    output: str  # .vmfb
    flags: list[str]


@dataclass
class CompileResult:
    job: CompileJob
    status: str  # ok, compile_error, timeout
    seconds: float
    message: str = ""


def _first_error_line(stderr: str) -> str:
    for line in stderr.splitlines():
        if "error:" in line:
            return line.strip()[:300]
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[0][:300] if lines else "iree-compile failed without a message"


def compile_one(job: CompileJob, timeout: float) -> CompileResult:
    command = [find_tool("iree-compile"), job.source, "-o", job.output, *job.flags]
    os.makedirs(os.path.dirname(job.output) or ".", exist_ok=True)
    start = time.perf_counter()
    try:
        finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return CompileResult(job, "timeout", time.perf_counter() - start, f"over {timeout:g} s")
    seconds = time.perf_counter() - start
    if finished.returncode != 0:
        return CompileResult(job, "compile_error", seconds, _first_error_line(finished.stderr))
    return CompileResult(job, "ok", seconds)


def compile_all(
    jobs: list[CompileJob],
    timeout: float,
    workers: int,
    on_done: Callable[[CompileResult], None] | None = None,
) -> Iterator[CompileResult]:
    """Yields results as they finish; a failure is a result, never an exception."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(compile_one, job, timeout) for job in jobs]
        for future in as_completed(futures):
            result = future.result()
            if on_done:
                on_done(result)
            yield result
