"""Applying a substitution spec: to a hand-written module at preprocessing (SPEC_FLAG), or to
a model lowered to REWRITE_PHASE with iree-opt, which iree-compile then compiles the rest of
the way (RESUME_FLAG).
"""

from __future__ import annotations

from collections.abc import Sequence

from iree.compiler import ir

from autosched import processes
from autosched.compile import compiler_path, opt_path
from autosched.ir_walk import walk_ops
from autosched.rewrite.common import REWRITE_PHASE

SPEC_FLAG = "--iree-preprocessing-transform-spec-filename"
RESUME_FLAG = f"--compile-from={REWRITE_PHASE}"  # compiles a rewritten model the rest of the way


def rewrite_commands(
    source: str, spec: str, flags: Sequence[str], out: str
) -> list[tuple[str, list[str]]]:
    """(tool, command) to lower the model to global optimization and apply the spec there;
    `out` gets the rewritten module, to compile on with `flags` and RESUME_FLAG."""
    lowered = _lowered(out)
    pipeline = (
        f"builtin.module(iree-preprocessing-transform-interpreter{{transform-spec-path={spec}}})"
    )
    return [
        (
            "iree-compile",
            [compiler_path(), source, *flags, f"--compile-to={REWRITE_PHASE}", "-o", lowered],
        ),
        ("iree-opt", [opt_path(), lowered, f"--pass-pipeline={pipeline}", "-o", out]),
    ]


def rewrite_model(
    source: str, spec: str, flags: Sequence[str], out: str, timeout: float
) -> tuple[str, int]:
    """The model at global optimization with the spec's kernels in place of their ops, and how
    many ops were replaced. A failing tool is a RuntimeError with its one telling line."""
    for tool, command in rewrite_commands(source, spec, flags, out):
        finished = processes.run(command, timeout)
        if finished.timed_out or finished.returncode != 0:
            why = (
                f"over {timeout:g} s"
                if finished.timed_out
                else processes.describe_failure(finished, tool)
            )
            raise RuntimeError(f"{tool}: {why}")
    return out, count_externs(out) - count_externs(_lowered(out))


def _lowered(out: str) -> str:
    """Where the model lowered to global optimization is kept, beside the rewritten one."""
    return out.removesuffix(".mlir") + ".global.mlir"


def count_externs(path: str) -> int:
    """Custom dispatches (`hal.dispatch.extern`) in a module, read with the bindings: the
    rewrite adds one for each contraction that now runs a custom kernel."""
    module = ir.Module.parseFile(path, ir.Context())
    return sum(1 for op in walk_ops(module.operation) if op.name == "hal.dispatch.extern")
