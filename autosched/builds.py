"""The modules one candidate is built into, as compile jobs: what is compiled, with which
flags, and which configuration each build must carry. Nothing here runs a process.

Every job dumps the configurations IREE chose (`applied.dump_flag`), so that a build whose
configuration did not reach the root op is caught before it is timed.
"""

from __future__ import annotations

from autosched.analysis import MatmulProblem
from autosched.applied import dump_flag
from autosched.compile import CompileJob
from autosched.dispatch_bench import DispatchBenchmark
from autosched.manifest import kernel_variant, write_text
from autosched.spec import tuning_spec
from autosched.targets.base import Point, Target


def expected_config(problem: MatmulProblem, target: Target, point: Point | None) -> str | None:
    """The compilation_info a build of `point` must carry; None for IREE's default and for
    points no configuration carries (custom kernels)."""
    if point is None or not target.in_spec(point):
        return None
    return target.lowering_config(problem, point)


def kernel_job(
    problem: MatmulProblem, target: Target, point: Point | None, source: str, repeat: int
) -> CompileJob:
    """The contraction rebuilt as a bare kernel with `point` attached (`source` is written
    here; a custom kernel's module is written by its own compiler, in the compile pool)."""
    output = source.removesuffix(".mlir") + ".vmfb"
    before = target.source_command(problem, point, source) if point else []
    if not before:
        write_text(source, kernel_variant(problem, target, point))
    flags = list(target.compile_flags())
    if repeat > 1:
        flags.append(f"--iree-hal-benchmark-dispatch-repeat-count={repeat}")
        output = output.removesuffix(".vmfb") + f".x{repeat}.vmfb"
    return CompileJob(source, output, [*flags, dump_flag(output)], before)


def dispatch_job(
    benchmark: DispatchBenchmark,
    problem: MatmulProblem,
    target: Target,
    point: Point | None,
    stem: str,
    check: bool = False,
) -> CompileJob:
    """IREE's own dispatch built with this one point as a spec (or as IREE would): its
    benchmark module, to time, or (`check`) the module that runs it on given inputs."""
    flags = list(target.compile_flags())
    if point is not None:
        spec = write_text(stem + ".spec.mlir", tuning_spec([(problem, target, point)]))
        flags += target.spec_flags(spec)
    if check:
        output = stem + ".check.vmfb"
        return CompileJob(benchmark.check_source, output, [*flags, dump_flag(output)])
    output = stem + ".dispatch.vmfb"
    return CompileJob(benchmark.source, output, [*flags, *benchmark.flags, dump_flag(output)])
