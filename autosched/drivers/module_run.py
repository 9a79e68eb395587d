"""`autosched run FILE.mlir` on a module of bare matmuls: analysis, the search of every
problem, the winners exported as an annotated module and a tuning spec."""

from __future__ import annotations

import os
import shlex
import time

import click

from autosched.config import RunConfig, with_overrides
from autosched.drivers.guard import exit_interrupted, guarded_run
from autosched.errors import UserError
from autosched.measure.worker import memory_problem
from autosched.model.input_types import problem_input_flags
from autosched.ops.matmul import Analysis, analyze_file
from autosched.ops.matmul_kernel import tuned_input_module, variant_path, write_text
from autosched.ops.registry import kind_of
from autosched.outputs.commands import shell_line, tuned_model_steps
from autosched.outputs.paths import RunPaths
from autosched.outputs.report import MODULE_NOTE, no_winner_line, summary_rows
from autosched.outputs.spec import check_starter, write_spec
from autosched.rewrite.apply import SPEC_FLAG
from autosched.rewrite.spec import write_substitution
from autosched.run.phases import time_lines
from autosched.run.problem import ProblemResult, Progress
from autosched.run.tuning import Tuning, space_tuner
from autosched.search.space import build_space
from autosched.targets import make_target
from autosched.targets.base import check_search_space


def run_module(config: RunConfig, input_file: str | None, resume: bool, dry_run: bool, progress):
    """The module run: checked, dry or measured, under the run guard."""
    check_starter(config.starter_spec)  # before anything is compiled, dry runs too
    config, target, analysis = prepare(config, input_file)
    if dry_run:
        dry_run_report(config, target, analysis)
        return
    paths = RunPaths.of(config)
    with guarded_run(config, target, paths, resume):
        tune_module(config, target, analysis, paths, resume, progress)


def log_analysis(tuning: Tuning, config: RunConfig, analysis: Analysis) -> None:
    log = tuning.log
    log.section("configuration")
    log.write(f"config file: {config.source}")
    for key, value in vars(config).items():
        if key not in ("search_space", "target_search_spaces"):
            log.write(f"  {key} = {value}")
    for key, values in config.knob_space.items():
        log.write(f"  [{config.knob_section(key)}] {key} = {values}")
    log.write(f"target: {tuning.target.describe()}; IREE {tuning.version}")
    log.section("analysis")
    for problem in analysis.problems:
        where = ", ".join(f"@{s.function} ({s.location})" for s in problem.sites)
        log.write(f"{problem.name}: {where}")
    for skipped in analysis.skipped:
        log.write(f"skipped {skipped.site.location} @{skipped.site.function}: {skipped.reason}")


def prepare(config: RunConfig, input_file: str | None):
    path = input_file or config.input_file
    if not path:
        raise UserError("no input file: give FILE.mlir or set [Env] input_file in the cfg")
    config = with_overrides(config, input_file=path)
    target = make_target(config)
    check_search_space(target, config)
    analysis = analyze_file(path)
    for problem in list(analysis.problems):
        reason = target.supports(problem) or memory_problem(problem)
        if reason:
            analysis.problems.remove(problem)
            click.echo(f"skipping {problem.name}: {reason}", err=True)
    if not analysis.problems:
        raise UserError(f"{path}: no matmul in the module can be tuned for target {target.name}")
    target.use_input_flags(problem_input_flags(analysis.problems))
    return config, target, analysis


def dry_run_report(config: RunConfig, target, analysis: Analysis) -> None:
    """Analysis, spaces and variant files, with no compiler run."""
    for problem in analysis.problems:
        space = build_space(problem, target, config.knob_space)
        tuner = space_tuner(config, target, space)
        chosen = tuner.next_batch(config.n_trial) if space.points else []
        written = 0
        for index in chosen:
            point = space.points[index]
            path = variant_path(config.work_dir, problem, target.config_name(point))
            if not target.in_spec(point):
                continue  # a custom kernel: Triton writes its module, and none runs here
            write_text(path, kind_of(problem).kernel_module(problem, target, point))
            written += 1
        rejected = ", ".join(f"{n} {r}" for r, n in space.rejected.most_common()) or "none"
        compiled = len(chosen) - written
        click.echo(
            f"{problem.name}: {space.total} points, {len(space.points)} valid, "
            f"{written} variants written"
            + (
                f" ({compiled} custom kernels not: Triton writes them when compiling)"
                if compiled
                else ""
            )
            + f"; rejected: {rejected}"
        )
    click.echo(f"variants under {os.path.join(config.work_dir, 'linalg')}")


def export_best(paths: RunPaths, target, results: list[ProblemResult]) -> tuple[str, str | None]:
    """The input module with the winners attached, the same winners as a tuning spec, and
    custom-kernel winners (which no lowering configuration can carry) as a preprocessing
    spec that substitutes their kernels."""
    best = [(r.problem, target, r.best.point) for r in results if r.best is not None]
    custom = [(problem, point) for problem, _, point in best if not target.in_spec(point)]
    if custom or os.path.exists(paths.custom_spec):
        for why in write_substitution(paths.custom_spec, custom, target):
            click.echo(f"warning: a custom-kernel winner stays out of every spec: {why}", err=True)
        if os.path.exists(paths.custom_spec):
            click.echo(
                f"custom-kernel winners: add {shlex.quote(f'{SPEC_FLAG}={paths.custom_spec}')} "
                "to iree-compile "
                "(they replace their ops before IREE forms dispatches)",
                err=True,
            )
    module = write_text(paths.best_module, tuned_input_module(paths.input_file, best))
    return module, write_spec(paths.spec, best, target.config.starter_spec)


def tune_module(
    config: RunConfig, target, analysis: Analysis, paths: RunPaths, resume: bool, progress: Progress
) -> None:
    tuning = Tuning(config, target, resume=resume)
    log_analysis(tuning, config, analysis)
    for skipped in analysis.skipped:
        click.echo(
            f"skipping {skipped.site.location} @{skipped.site.function}: {skipped.reason}", err=True
        )
    click.echo(
        f"tuning {len(analysis.problems)} matmul problem(s) on {target.describe()} "
        f"with the {config.tuner} tuner, {config.n_trial} trials each (after timing IREE's "
        "default, which the progress counts too)",
        err=True,
    )
    start = time.perf_counter()
    try:
        results = tuning.run(analysis, progress)
    except KeyboardInterrupt as interrupt:
        exit_interrupted(interrupt, config, tuning.log, progress)
    best_path, spec_path = export_best(paths, target, results)
    summary = summary_rows(results, MODULE_NOTE)
    tuning.log.section("result")
    tuning.log.write(summary)
    tuning.log.write(f"search time: {time.perf_counter() - start:.1f} s")
    tuning.log.write(f"tuned module: {best_path}; tuning spec: {spec_path or 'none'}")
    click.echo(summary)
    for line in time_lines(tuning.clock, tuning.measured):
        tuning.log.write(line)
        click.echo(line)
    # The tuned module is the input itself when nothing won: named only when it is not.
    tuned = f"  tuned module: {best_path}" if spec_path else ""
    click.echo(f"\nCSV: {config.output_file}  log: {config.log_file}{tuned}")
    if spec_path:
        steps = tuned_model_steps("MODEL.mlir", target, spec_path, "MODEL.vmfb")
        click.echo(f"tuning spec for any model: {shell_line(steps)}")
        if target.module_attributes():  # sm_90: iree-compile has no flag naming this target
            click.echo(
                f"  (MODEL.mlir must carry the {target.arch} target: copy the module attributes "
                f"of {best_path} onto it, or compile {best_path} itself)"
            )
    elif not os.path.exists(paths.custom_spec):
        click.echo(no_winner_line(results))
    else:
        click.echo("no tuning spec: only custom kernels beat IREE's default configurations")
