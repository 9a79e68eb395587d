"""IREE's own dispatches as standalone benchmarks, to time a model's candidates on.

A contraction rebuilt as a bare kernel is not what the model runs: IREE fuses the bias add,
SiLU or `truncf` into the matmul's dispatch, and on the H200 per-problem speedups of
1.11-3.30x on bare kernels became 1.41x on the whole decoder layer. IREE can write each
dispatch of a compiled model as a module of its own
(`--iree-hal-dump-executable-benchmarks-to`): the dispatch exactly as formed, with a
function that runs it `--batch_size` times on scratch buffers. With IREE's chosen
configuration stripped (`--iree-codegen-strip-compilation-info`), compiling that module
alone gives IREE's default again, and compiling it with a one-candidate spec gives the
candidate, fused consumers and all. Its buffers hold no chosen data, so answers are still
checked on the bare kernel, against numpy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from iree.compiler import ir

from autosched import processes
from autosched.compile import compiler_path
from autosched.errors import UserError
from autosched.model import walk_ops

DUMP_TIMEOUT = 1800.0  # one full compile of the model


@dataclass(frozen=True)
class DispatchBenchmark:
    """One dispatch of the model as a benchmark module with no configuration."""

    entry_point: str  # the dispatch function, as model.analyze_model names its sites
    source: str  # the stripped benchmark module (.mlir)
    function: str  # its entry, which runs the dispatch --batch_size times


def _opt_tool() -> str:
    from iree.compiler.tools.binaries import find_tool

    return processes.tool_path("iree-opt", find_tool("iree-opt"))


def _entries(path: str) -> tuple[str, str] | None:
    """(dispatch entry point, benchmark function) of one dumped module, read with the bindings."""
    module = ir.Module.parseFile(path, ir.Context())
    function = entry = None
    for op in module.body.operations:
        op = op.operation
        if op.name == "util.func" and "iree.reflection" in op.attributes:
            if "iree.benchmark" in str(op.attributes["iree.reflection"]):
                function = ir.StringAttr(op.attributes["sym_name"]).value
        if op.name == "hal.executable":
            for inner in walk_ops(op):
                if inner.name == "hal.executable.export":
                    entry = ir.StringAttr(inner.attributes["sym_name"]).value
    return (entry, function) if entry and function else None


def dump_dispatch_benchmarks(
    model_path: str, flags: Sequence[str], folder: str
) -> dict[str, DispatchBenchmark]:
    """Entry point -> benchmark, for every dispatch IREE could write one for.

    Dispatches with dynamic shapes get none (IREE writes no benchmark for them); their
    problems are timed on the bare kernel.
    """
    raw = os.path.join(folder, "raw")
    os.makedirs(raw, exist_ok=True)
    command = [
        compiler_path(),
        model_path,
        *flags,
        f"--iree-hal-dump-executable-benchmarks-to={raw}",
        "-o",
        os.devnull,
    ]
    finished = processes.run(command, DUMP_TIMEOUT)
    if finished.timed_out or finished.returncode != 0:
        reason = processes.describe_failure(finished, "iree-compile")
        raise UserError(f"{model_path}: writing the dispatch benchmarks failed: {reason}")
    found = {}
    for name in sorted(os.listdir(raw)):
        entries = _entries(os.path.join(raw, name))
        if entries is None:
            continue
        entry, function = entries
        stripped = os.path.join(folder, name)
        done = processes.run(
            [
                _opt_tool(),
                os.path.join(raw, name),
                "--iree-codegen-strip-compilation-info",
                "-o",
                stripped,
            ],
            DUMP_TIMEOUT,
        )
        if done.returncode == 0 and not done.timed_out:
            found[entry] = DispatchBenchmark(entry, stripped, function)
    return found
