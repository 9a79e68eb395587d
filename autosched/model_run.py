"""`autosched run MODEL` and `autosched apply MODEL --spec SPEC`: the model's path through the
tool, from lowering to the line that says what the spec did to the whole model.

    lower (model.py) -> problems -> campaign (one budget) -> one spec (spec.py)
        -> the spec checked on every dispatch (apply.spec_coverage) -> proof (apply.prove)
"""

from __future__ import annotations

import os

import click

from autosched.campaign import (
    CampaignReport,
    ModelProblem,
    budget_for,
    problem_rows,
    run_campaign,
    skipped_summary,
    write_summary,
)
from autosched.config import RunConfig
from autosched.errors import UserError
from autosched.model import ModelAnalysis, analyze_model
from autosched.run_paths import RunPaths
from autosched.runner import Progress, Tuning, summary_rows
from autosched.spec import write_spec
from autosched.verify import memory_problem

PROOF_ROUNDS = 5


def model_for_target(path: str, target, work_dir: str) -> str:
    """The model as the target needs it: unchanged, or (sm_90, which iree-compile cannot
    name) with the full device target attribute the kernels are tuned for set on it."""
    attributes = target.module_attributes()
    if not attributes:
        return path
    from iree.compiler import ir

    from autosched.model import prepare_model

    source = prepare_model(path, work_dir)
    context = ir.Context()
    try:
        module = ir.Module.parseFile(source, context)
    except ir.MLIRError as error:
        raise UserError(f"{path}: does not parse: {error}".splitlines()[0]) from None
    for name, text in attributes.items():
        module.operation.attributes[name] = ir.Attribute.parse(text, context)
    os.makedirs(work_dir, exist_ok=True)
    targeted = os.path.join(work_dir, f"model.{target.arch}.mlirbc")
    with open(targeted, "wb") as handle:
        module.operation.write_bytecode(handle)
    return targeted


def model_problems(analysis: ModelAnalysis, target) -> tuple[list[ModelProblem], dict[str, int]]:
    """The contractions this target can tune, and reason -> count for the rest."""
    problems, not_matmul = [], []
    skipped = {}
    for contraction in analysis.contractions:
        problem = contraction.as_matmul_problem()
        if problem is None:
            not_matmul.append(contraction)
            continue
        reason = target.supports(problem) or memory_problem(problem)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        problems.append(ModelProblem(problem, contraction))
    counts = skipped_summary(analysis, not_matmul)
    for reason, count in skipped.items():
        counts[reason] = counts.get(reason, 0) + count
    return problems, counts


def describe_analysis(path: str, analysis: ModelAnalysis, problems, skipped) -> list[str]:
    lines = [
        f"{path}: {analysis.dispatches} dispatches; {len(problems)} contraction problem(s) to tune"
    ]
    for entry in problems:
        fused = sorted({op for s in entry.contraction.sites for op in s.fused_ops})
        lines.append(
            f"  {entry.problem.name}: runs {entry.occurrences}x"
            + (f", fused with {', '.join(fused)}" if fused else "")
        )
    for reason, count in skipped.items():
        lines.append(f"  not tuned: {count} {reason}")
    return lines


def run_model(config: RunConfig, resume: bool, dry_run: bool, progress: Progress) -> None:
    """Tunes a whole model; see the module docstring."""
    from autosched.cli import guarded_run
    from autosched.targets import make_target

    path = config.input_file
    target = make_target(config)
    target.check_search_space(config)
    paths = RunPaths.of(config)
    work = os.path.join(config.work_dir, "model")
    model_path = model_for_target(path, target, work)
    flags = target.compile_flags()
    analysis = analyze_model(model_path, flags)
    problems, skipped = model_problems(analysis, target)
    if not problems:
        reasons = "; ".join(f"{count} {reason}" for reason, count in skipped.items())
        raise UserError(
            f"{path}: no linalg.matmul, batch_matmul or other contraction in the "
            f"{analysis.dispatches} dispatch(es) IREE forms can be tuned for {target.name}"
            + (f" (not tuned: {reasons})" if reasons else "")
        )
    for line in describe_analysis(path, analysis, problems, skipped):
        click.echo(line, err=True)
    budget = config.budget or budget_for(config.mode, config.n_trial, problems)
    if dry_run:
        click.echo(f"budget: {budget} trials ({config.mode} mode); nothing compiled")
        return
    with guarded_run(config, target, paths):
        if config.time_on == "dispatch":
            attach_benchmarks(problems, model_path, flags, os.path.join(work, "dispatches"))
        _tune_model(config, target, paths, model_path, problems, skipped, budget, resume, progress)


def attach_benchmarks(problems: list[ModelProblem], model_path, flags, folder) -> None:
    """Each problem gets IREE's own dispatch of its first site to be timed on."""
    from dataclasses import replace

    from autosched.dispatch_bench import dispatch_check_modules, dump_dispatch_benchmarks
    from autosched.model import lower_to_dispatches, prepare_model

    click.echo("writing IREE's dispatches as benchmarks ...", err=True)
    source = prepare_model(model_path, folder)  # an ONNX model is imported first
    benchmarks = dump_dispatch_benchmarks(source, flags, folder)
    checks = dispatch_check_modules(lower_to_dispatches(source, flags), set(benchmarks), folder)
    for entry_point, (check, inputs, outputs) in checks.items():
        benchmarks[entry_point] = replace(
            benchmarks[entry_point], check_source=check, check_inputs=inputs, check_outputs=outputs
        )
    for entry in problems:
        found = [benchmarks.get(site.entry_point) for site in entry.contraction.sites]
        entry.benchmark = next((b for b in found if b is not None), None)
        if entry.benchmark is None:
            click.echo(
                f"  {entry.problem.name}: no dispatch benchmark; timed as a kernel", err=True
            )


def _tune_model(config, target, paths, model_path, problems, skipped, budget, resume, progress):
    from autosched.cli import exit_interrupted

    tuning = Tuning(config, target, resume=resume)
    tuning.log.section(f"model {config.input_file}")
    for entry in problems:
        tuning.log.write(f"{entry.problem.name}: runs {entry.occurrences}x")
    for reason, count in skipped.items():
        tuning.log.write(f"not tuned: {count} {reason}")
    time_budget = config.time_budget * 60 if config.time_budget else None
    click.echo(
        f"tuning {len(problems)} problem(s) on {target.describe()}: {budget} trials in all "
        f"({config.mode} mode, {config.tuner} tuner)"
        + (f", at most {config.time_budget:g} min" if time_budget else ""),
        err=True,
    )
    progress.start_model(f"{os.path.basename(config.input_file):<40}", budget + len(problems))
    try:
        report = run_campaign(tuning, problems, progress, budget, config.mode, time_budget)
    except KeyboardInterrupt as interrupt:
        tuning.csv.finish(tuning.retimed, set())
        tuning.close()
        exit_interrupted(interrupt, config, tuning.log, progress)
    progress.finish()
    results = [entry.result for entry in problems]
    chosen = {(r.problem.name, r.best.config if r.best else "iree_default") for r in results}
    tuning.csv.finish(tuning.retimed, chosen)
    tuning.close()
    report.skipped = skipped
    summary = summary_rows(results)
    tuning.log.section("result")
    tuning.log.write(summary)
    click.echo(summary)

    best = [(r.problem, target, r.best.point) for r in results if r.best is not None]
    spec_path = write_spec(paths.spec, best, config.starter_spec)
    applied: dict[str, bool] = {}
    proof = None
    if spec_path:
        applied = check_applied(model_path, target, spec_path, problems)
        missed = [name for name, ok in applied.items() if not ok]
        for name in missed:
            message = f"WARNING: the spec's configuration for {name} is NOT applied in the model"
            tuning.log.write(message)
            click.echo(click.style(message, fg="red", bold=True), err=True)
        proof = _prove(model_path, target, spec_path, config, tuning)
    else:
        click.echo("no tuning spec: nothing beat IREE's default configurations")
    report.problems = problem_rows(problems, applied)
    shares = share_table(report.problems)
    tuning.log.write(shares)
    click.echo("\n" + shares)
    summary_path = write_summary(os.path.splitext(paths.csv)[0] + ".summary.json", proof, report)
    click.echo(f"\nCSV: {paths.csv}  log: {paths.log}  summary: {summary_path}")
    if spec_path:
        click.echo(
            f"tuned model: iree-compile {config.input_file} "
            f"{' '.join([*target.compile_flags(), *target.spec_flags(spec_path)])}"
        )
    _log_budget(tuning, report)


def share_table(rows: list[dict]) -> str:
    """Each problem's share of the tuned contractions' time, before and after."""
    from autosched.report import table

    headers = ["problem", "runs", "share before", "share after", "in spec", "applied in model"]
    cells = [
        [
            row["problem"],
            str(row["occurrences"]),
            f"{row['share']:.1%}",
            f"{row['share_after']:.1%}",
            "yes" if row["in_spec"] else "no",
            "yes" if row["applied_in_model"] else ("no" if row["in_spec"] else "-"),
        ]
        for row in rows
    ]
    return table(headers, cells)


def check_applied(model_path, target, spec_path, problems) -> dict[str, bool]:
    """Problem name -> every dispatch of its contraction carries the tuned configuration."""
    from autosched.apply import spec_coverage

    configs = spec_coverage(
        model_path, target.compile_flags(), spec_path, spec_flag=target.tuning_spec_flag
    )
    applied = {}
    for entry in problems:
        best = entry.result.best if entry.result else None
        if best is None:
            continue
        expected = target.lowering_config(entry.problem, best.point)
        # By dispatch, not by the root's name: GPU codegen turns a named batch_matmul into
        # a linalg.generic before it configures it.
        dispatches = {site.entry_point for site in entry.contraction.sites}
        mine = [c for c in configs if c.entry_point in dispatches]
        applied[entry.problem.name] = bool(mine) and all(c.carries(expected) for c in mine)
    return applied


def run_proof(model_path, target, spec_path, config: RunConfig):
    """apply.prove with the run's target, device, seed and timing settings."""
    from autosched.apply import prove

    click.echo("proving the spec on the whole model ...", err=True)
    return prove(
        model_path,
        target.compile_flags(),
        spec_path,
        target.device,
        seed=config.seed,
        rounds=PROOF_ROUNDS,
        spec_flag=target.tuning_spec_flag,
        repetitions=config.repetitions,
        min_time=config.min_time,
        work_dir=os.path.join(config.work_dir, "model", "proof"),
    )


def _prove(model_path, target, spec_path, config: RunConfig, tuning: Tuning) -> dict:
    """The whole model with and without the spec: one line and the summary's numbers."""
    proof = run_proof(model_path, target, spec_path, config)
    line = model_line(proof)
    tuning.log.write(line)
    click.echo(line)
    return {
        "function": proof.function,
        "default_ms": proof.default_ms,
        "tuned_ms": proof.tuned_ms,
        "default_cv": proof.default_cv,
        "tuned_cv": proof.tuned_cv,
        "speedup": proof.speedup,
        "outputs_match": proof.outputs_match,
        "max_error": proof.max_error,
        "message": proof.message,
    }


def model_line(proof) -> str:
    """`model: A ms -> B ms (X×), outputs match (max error E)`."""
    tuned = f"{proof.tuned_ms:.4g} ms" if proof.tuned_ms else "no time"
    speedup = f" ({proof.speedup:.2f}x)" if proof.speedup else ""
    if proof.outputs_match:
        answer = f"outputs match (max error {proof.max_error or 0:.2g})"
    else:
        answer = f"OUTPUTS DIFFER: {proof.message}"
    return f"model: {proof.default_ms:.4g} ms -> {tuned}{speedup}, {answer}"


def _log_budget(tuning: Tuning, report: CampaignReport) -> None:
    tuning.log.write(
        f"budget: {report.trials} of {report.budget} trials used ({report.mode} mode), "
        f"search {report.search_s:.1f} s"
    )


def apply_spec(config: RunConfig, spec_path: str) -> None:
    """`autosched apply`: which dispatches the spec configures, and the whole-model proof."""
    from autosched.apply import spec_coverage
    from autosched.targets import make_target

    target = make_target(config)
    target.check_device()
    path = config.input_file
    work = os.path.join(config.work_dir, "model")
    model_path = model_for_target(path, target, work)
    configs = spec_coverage(
        model_path, target.compile_flags(), spec_path, spec_flag=target.tuning_spec_flag
    )
    changed = [c for c in configs if c.changed]
    click.echo(f"{len(changed)} of {len(configs)} contraction dispatch(es) configured by the spec")
    for c in configs:
        state = "spec" if c.changed else "IREE default"
        click.echo(f"  {c.entry_point}: {c.contraction} ({state})")
    proof = run_proof(model_path, target, spec_path, config)
    click.echo(model_line(proof))
    if not proof.outputs_match:
        raise SystemExit(1)
