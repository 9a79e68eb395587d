"""`autosched run MODEL` and `autosched apply MODEL --spec SPEC`: the model's path through the
tool, from lowering to the line that says what the spec did to the whole model.

    lower (model.py) -> problems -> campaign (one budget) -> one spec (spec.py)
        -> the spec checked on every dispatch (configured.spec_coverage) -> proof (proof.prove)
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace

import click

from autosched.compile import check_temp_dir
from autosched.config import RunConfig
from autosched.drivers.campaign import (
    CampaignReport,
    ModelProblem,
    budget_for,
    problem_rows,
    run_campaign,
    skipped_summary,
    write_summary,
)
from autosched.drivers.custom_route import (
    beats_iree,
    custom_build_dispatches,
    custom_commands,
    custom_line,
    custom_winner,
    route_of,
    search_custom_kernels,
    write_custom_spec,
)
from autosched.drivers.dispatch_table import dispatch_summary, plot_dispatches
from autosched.errors import UserError
from autosched.measure.worker import memory_problem
from autosched.model.configured import form_of, in_configured_form
from autosched.model.lowering import ModelAnalysis, analyze_model
from autosched.ops.registry import kind_of
from autosched.outputs.paths import RunPaths
from autosched.outputs.spec import check_starter, write_spec
from autosched.run.problem import Progress
from autosched.run.tuning import Tuning, no_winner_line, summary_rows
from autosched.targets.base import has_config

PROOF_ROUNDS = 5


def model_for_target(path: str, target, work_dir: str) -> str:
    """The model as the target needs it: unchanged, or (sm_90, which iree-compile cannot
    name) with the full device target attribute the kernels are tuned for set on it."""
    attributes = target.module_attributes()
    if not attributes:
        return path
    from iree.compiler import ir

    from autosched.model.lowering import prepare_model

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
    """The roots this target can tune, and reason -> count for the rest."""
    problems, not_matmul = [], []
    skipped = {}
    for root in analysis.roots:
        problem = root.as_problem()
        if problem is None:
            not_matmul.append(root)
            continue
        reason = (
            f"{problem.kind} on {target.name} (not tuned there yet)"
            if not target.tunes(problem.kind)
            else target.for_problem(problem).supports(problem) or memory_problem(problem)
        )
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        problems.append(ModelProblem(problem, root))
    counts = skipped_summary(analysis, not_matmul)
    for reason, count in skipped.items():
        counts[reason] = counts.get(reason, 0) + count
    return problems, counts


def typed_flags(target, model_path: str, work: str) -> tuple[list[str], str, bool]:
    """The target's compile flags with what the model's types need (f64 kept as f64), the
    line that names the model's types, and whether a flag was needed."""
    from autosched.model.input_types import model_input_flags

    needed, line = model_input_flags(model_path, target.compile_flags(), work)
    target.use_input_flags(needed)
    return target.compile_flags(), line, bool(needed)


def describe_analysis(path: str, analysis: ModelAnalysis, problems, skipped) -> list[str]:
    lines = [f"{path}: {analysis.dispatches} dispatches; {len(problems)} problem(s) to tune"]
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
    from autosched.drivers.guard import guarded_run
    from autosched.targets import make_target

    path = config.input_file
    target = make_target(config)
    target.check_search_space(config)
    check_starter(config.starter_spec)  # before anything is compiled, dry runs too
    paths = RunPaths.of(config)
    work = os.path.join(config.work_dir, "model")
    model_path = model_for_target(path, target, work)
    flags, types_line, _ = typed_flags(target, model_path, work)
    layout, analysis = laid_out(config, target, model_path, flags, work)
    model_path = layout.source
    problems, skipped = model_problems(analysis, target)
    if not problems:
        reasons = "; ".join(f"{count} {reason}" for reason, count in skipped.items())
        raise UserError(
            f"{path}: no linalg.matmul, batch_matmul or other contraction in the "
            f"{analysis.dispatches} dispatch(es) IREE forms can be tuned for {target.name}"
            + (f" (not tuned: {reasons})" if reasons else "")
        )
    lines = [types_line, layout.describe(), *describe_analysis(path, analysis, problems, skipped)]
    for line in filter(None, lines):
        click.echo(line, err=True)
    budget = config.budget or budget_for(config.mode, config.n_trial, problems)
    if dry_run:
        for entry in problems:
            click.echo(space_line(entry.problem, target, config))
        click.echo(f"budget: {budget} trials ({config.mode} mode); nothing compiled")
        return
    with guarded_run(config, target, paths):
        dispatches = ModelDispatches()
        if config.time_on == "dispatch":
            folder = os.path.join(work, "dispatches")
            dispatches = attach_benchmarks(problems, model_path, flags, folder)
        problems = dispatch_only_roots(problems, skipped)
        if not problems:
            raise UserError(f"{path}: no root of the model can be tuned (see the lines above)")
        tuning = _tune_model(
            config, target, paths, model_path, problems, skipped, budget, resume, progress
        )
        _finish_model(tuning, paths, layout, problems, dispatches)


def laid_out(config: RunConfig, target, model_path: str, flags, work: str):
    """(layout, analysis): the model every build starts from, with the layout the target
    needs (layouts.py; `layout = strided`: on any target; channels-last where the Triton
    convolution kernels are searched) unless the cfg says `layout = none`, and its roots."""
    from autosched.model.layouts import choose_layout
    from autosched.ops.convolution import STRIDED, ConvolutionProblem

    analysis = in_configured_form(analyze_model(model_path, flags), model_path, flags)
    strided = [
        root
        for root in analysis.roots
        if isinstance(root, ConvolutionProblem) and root.form == STRIDED
    ]
    wanted = config.layout in ("strided", "channels_last") or (
        config.layout == "auto" and target.slices_strided_convolutions
    )
    reductions = sum(root.occurrences for root in strided) if wanted else 0
    convolutions = [root for root in analysis.roots if isinstance(root, ConvolutionProblem)]
    channels_last = bool(convolutions) and (
        config.layout == "channels_last"
        or (config.layout == "auto" and triton_convolutions(config, target, convolutions))
    )
    layout = choose_layout(model_path, flags, work, reductions, channels_last)
    if not layout.changed:
        return layout, analysis
    return layout, in_configured_form(analyze_model(layout.source, flags), layout.source, flags)


def triton_convolutions(config: RunConfig, target, convolutions: list) -> bool:
    """Whether the run searches the Triton convolution kernels (sm_90 with Triton, unless the
    cfg's `conv_kernel` list leaves them out) and they take every one of the model's
    `convolutions`: they read channels-last images, so `layout = auto` turns the model
    channels-last for them. IREE's own NHWC convolutions are slower than its NCHW ones on
    the H200 (resnet50 with the kernels ran 1.03x torch.compile's time in the same call,
    its best NCHW build 1.82x in another call), and IREE's conversion
    leaves a depthwise one NCHW between transposes."""
    from autosched.kernels.igemm_conv.kernel import takes
    from autosched.kernels.registry import family

    if not target.tunes("convolution"):
        return False
    igemm = family("igemm_conv")
    knob, choice = igemm.selector
    allowed = choice in config.knob_space.get(knob, [choice])
    searched = igemm.unavailable(target.for_kind("convolution")) is None and allowed
    return searched and all(takes(problem) for problem in convolutions)


@dataclass
class ModelDispatches:
    """Every dispatch IREE forms that has a benchmark module, and its launches per call."""

    benchmarks: dict = field(default_factory=dict)  # entry point -> DispatchBenchmark
    calls: dict[str, int] = field(default_factory=dict)  # entry point -> launches


def tuned_model_command(path: str, target, spec_path: str | None) -> str:
    """The command that builds the tuned model, as it can be pasted: an ONNX model is
    imported first (iree-compile takes MLIR, not .onnx). Without a spec: a model's layout
    built with IREE's defaults."""
    spec = target.spec_flags(spec_path) if spec_path else []
    flags = " ".join([*target.compile_flags(), *spec])
    if path.endswith(".onnx"):
        imported = os.path.splitext(path)[0] + ".mlir"
        return (
            f"tuned model: iree-import-onnx {path} -o {imported} && iree-compile {imported} {flags}"
        )
    return f"tuned model: iree-compile {path} {flags}"


def space_line(problem, target, config: RunConfig) -> str:
    """`problem: N points, V valid` and, for an empty space, why (a dry run's view)."""
    from autosched.search.space import fitted_space

    space, note = fitted_space(problem, target, config.knob_space)
    line = f"  {problem.name}: {space.total} points, {len(space.points)} valid"
    return line + (f"; {note.removeprefix(problem.name + ': ')}" if note else "")


def attach_benchmarks(problems: list[ModelProblem], model_path, flags, folder) -> ModelDispatches:
    """Each problem gets IREE's own dispatch of its first site to be timed on; returns every
    dispatch's benchmark (for the whole model's table)."""
    from autosched.model.dispatch_benchmarks import dispatch_check_modules, dump_dispatch_benchmarks
    from autosched.model.lowering import dispatch_calls, lower_to_dispatches, prepare_model

    click.echo("writing IREE's dispatches as benchmarks ...", err=True)
    source = prepare_model(model_path, folder)  # an ONNX model is imported first
    benchmarks = dump_dispatch_benchmarks(source, flags, folder)
    flow = lower_to_dispatches(source, flags)
    checks = dispatch_check_modules(flow, set(benchmarks), folder, source)
    for entry_point, (check, inputs, outputs) in checks.items():
        benchmarks[entry_point] = replace(
            benchmarks[entry_point], check_source=check, check_inputs=inputs, check_outputs=outputs
        )
    whole_model = None
    for entry in problems:
        found = [benchmarks.get(site.entry_point) for site in entry.contraction.sites]
        entry.benchmark = next((b for b in found if b is not None), None)
        if entry.benchmark is None:
            click.echo(
                f"  {entry.problem.name}: no dispatch benchmark; timed as a kernel", err=True
            )
        elif kind_of(entry.problem).checks_model:
            whole_model = whole_model or model_check(source, flags, folder, model_path)
            entry.benchmark = replace(entry.benchmark, model_check=whole_model)
            if not entry.benchmark.check_source:
                entry.benchmark = entry.benchmark.on_whole_model()
    return ModelDispatches(benchmarks, dispatch_calls(flow))


def model_check(source: str, flags, folder: str, model_path: str) -> dict:
    """A benchmark's check fields for checking answers on the whole model (`checks_model`):
    the model's source, its entry function and the plain tensor types it takes."""
    from autosched.measure.module_io import source_entry_function
    from autosched.model.configured import DEFAULT_TIMEOUT

    entry = source_entry_function(source, flags, None, folder, DEFAULT_TIMEOUT, model_path)
    return {
        "check_source": source,
        "check_inputs": tuple((spec.shape, spec.element) for spec in entry.inputs),
        "check_outputs": tuple((spec.shape, spec.element) for spec in entry.outputs),
        "check_function": entry.name,
        "checks_model": True,
    }


def dispatch_only_roots(problems: list[ModelProblem], skipped: dict[str, int]) -> list:
    """The problems that can be searched: a kind with no kernel of its own (attention) is
    timed and checked only on IREE's dispatch, so without one it is counted as not tuned."""
    kept = []
    for entry in problems:
        bench = entry.benchmark
        if kind_of(entry.problem).needs_dispatch and (bench is None or not bench.check_source):
            reason = f"{entry.problem.kind} without a dispatch benchmark to time it on"
            skipped[reason] = skipped.get(reason, 0) + 1
            click.echo(f"  {entry.problem.name}: not tuned: {reason}", err=True)
            continue
        kept.append(entry)
    return kept


def _tune_model(config, target, paths, model_path, problems, skipped, budget, resume, progress):
    from autosched.drivers.guard import exit_interrupted

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
        custom = search_custom_kernels(tuning, problems, progress, model_path)
        tuning.log_device_use()
    except KeyboardInterrupt as interrupt:
        tuning.csv.finish(tuning.retimed, set())
        tuning.close()
        exit_interrupted(interrupt, config, tuning.log, progress)
    progress.finish()
    results = [entry.result for entry in problems]
    chosen = {(r.problem.name, r.best.config if r.best else "iree_default") for r in results}
    chosen |= {(r.problem.name, r.best.config) for r in custom.values() if r.best is not None}
    tuning.csv.finish(tuning.retimed, chosen)
    tuning.close()
    report.skipped = skipped
    report.custom_trials = sum(len(r.trials) - r.resumed for r in custom.values())
    summary = summary_rows(results)
    tuning.log.section("result")
    tuning.log.write(summary)
    click.echo(summary)
    tuning.report, tuning.custom = report, custom
    return tuning


def _finish_model(tuning: Tuning, paths, layout, problems, dispatches: ModelDispatches):
    """The spec, its checks and proof, the tables and the summary, after the search."""
    config, target, report, custom = tuning.config, tuning.target, tuning.report, tuning.custom
    model_path = layout.source
    if layout.changed:
        tuning.log.write(layout.describe())
    custom_spec = write_custom_spec(
        paths.custom_spec,
        target,
        problems,
        custom,
        tuning.log,
        (model_path, os.path.join(config.work_dir, "model")),
    )
    spec_path, applied, proof = spec_never_slower(tuning, layout, paths, problems, custom_spec)
    report.problems = problem_rows(problems, applied)
    for entry, row in zip(problems, report.problems, strict=True):
        result = custom_winner(entry, custom, target)
        best = entry.result.best
        row["in_spec"] = row["in_spec"] and has_config(target, entry.problem, best.point)
        row["custom_ms"] = result.best_ms if result else None
        substituted = custom_spec is not None and result is not None
        row["route"] = route_of(row, substituted and beats_iree(entry, result))
    shares = share_table(report.problems)
    tuning.log.write(shares)
    click.echo("\n" + shares)
    rows = whole_model_table(tuning, problems, dispatches, spec_path)
    report.dispatches = dispatch_summary(rows)
    if report.dispatches and layout.changed:
        note = (
            "(every dispatch is of the model's layout: its 'before' is IREE's default for "
            "the layout; IREE's default of the model as given is the model line's)"
        )
        tuning.log.write(note)
        click.echo(note)
    verdict = (proof or {}).get("custom") or {}
    custom_wins = (
        bool(custom_spec) and verdict.get("outputs_match") and (verdict.get("over_spec") or 0) > 1
    )
    custom_rows = None
    if custom_wins and config.dispatch_table != "none":
        custom_rows = custom_build_dispatches(
            config, target, tuning.log, model_path, custom_spec, spec_path
        )
        report.custom_dispatches = dispatch_summary(custom_rows)
    _outside(tuning, proof, rows, custom_rows, spec_path)
    if rows:
        picture = plot_dispatches(rows, paths.picture, custom=custom_rows)
        click.echo(
            f"picture: {picture}" if picture else "a picture of it: pip install 'autosched[plots]'"
        )
    summary_path = write_summary(paths.summary, proof, report)
    click.echo(f"\nCSV: {paths.csv}  log: {paths.log}  summary: {summary_path}")
    proved_layout = layout.changed and not (proof or {}).get("default_only")
    if spec_path or proved_layout:
        built_from = model_path if proved_layout else config.input_file
        click.echo(tuned_model_command(built_from, target, spec_path))
    if custom_spec:
        if custom_wins:
            click.echo(custom_commands(model_path, target, spec_path, custom_spec, config.work_dir))
        else:
            message = (
                f"WARNING: the custom kernels of {custom_spec} did not make the model faster "
                "with the same outputs (see the proof above): build it with the spec alone"
            )
            tuning.log.write(message)
            click.echo(click.style(message, fg="red", bold=True), err=True)
    _log_budget(tuning, report)
    differ = proof and not proof.get("default_only") and proof.get("outputs_match") is False
    if differ:  # as `apply` does: never a silent 0
        tuning.log.write("exit 1: the tuned model's outputs differ from IREE's default")
        raise SystemExit(1)


def _outside(tuning: Tuning, proof, rows, custom_rows, spec_path) -> None:
    """The line saying what the reported build's calls spend beside their dispatches."""
    from autosched.drivers.dispatch_table import outside_line

    proof = proof or {}
    if custom_rows:
        line = outside_line("custom", (proof.get("custom") or {}).get("ms"), custom_rows)
    elif spec_path:
        line = outside_line("tuned", proof.get("tuned_ms"), rows or [])
    else:
        line = outside_line("default", proof.get("default_ms"), rows or [])
    if line:
        tuning.log.write(line)
        click.echo(line)


def whole_model_table(tuning: Tuning, problems, dispatches, spec_path) -> list:
    """Every dispatch of the model timed before and after the spec: a table in run.log and
    on the screen; its rows (none where the cfg turns the table off)."""
    from autosched.drivers.dispatch_table import dispatch_lines, time_dispatches

    if tuning.config.dispatch_table == "none" or not dispatches.benchmarks:
        return []
    click.echo("timing every dispatch of the model, before and after ...", err=True)
    tuned = {s.entry_point: e.problem.name for e in problems for s in e.contraction.sites}
    rows = time_dispatches(
        dispatches.benchmarks, dispatches.calls, tuning.target, spec_path, tuning.config, tuned
    )
    text = dispatch_lines(rows)
    tuning.log.section("every dispatch")
    tuning.log.write(text)
    click.echo("\n" + text)
    return rows


def share_table(rows: list[dict]) -> str:
    """Each problem's share of the tuned contractions' time, before and after."""
    from autosched.outputs.report import table

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


def _warn(tuning: Tuning, message: str) -> None:
    tuning.log.write(message)
    click.echo(click.style(message, fg="red", bold=True), err=True)


def spec_never_slower(tuning: Tuning, layout, paths, problems, custom_spec):
    """(spec path or None, applied, proof): the winners' spec, checked in the model and
    proved on it. While the tuned model proves slower than IREE's default, the winner that
    was to save the least model time is left out and the spec proved again; with none left,
    no spec is written. Without any spec the default alone is timed, so the run always ends
    with the model's line."""
    config, target, starter = tuning.config, tuning.target, tuning.config.starter_spec
    model_path = layout.source
    while True:
        best = [(e.problem, target, e.result.best.point) for e in problems if e.result.best]
        spec_path = write_spec(paths.spec, best, starter)
        applied = check_applied(model_path, target, spec_path, problems, tuning.log)
        for name in [name for name, ok in applied.items() if not ok]:
            message = f"WARNING: the spec's configuration for {name} is NOT applied in the model"
            _warn(tuning, message)
        if not spec_path and not custom_spec:
            click.echo(no_winner_line([e.result for e in problems]))
        if spec_path:
            proof = _prove(layout, target, spec_path, config, tuning, custom_spec)
        else:
            proof = _prove_without_spec(tuning, layout, custom_spec)
        if not spec_path or (proof["speedup"] or 1.0) >= 1.0:
            return spec_path, applied, proof
        left_out = _leave_out_least(problems)
        if left_out is None:
            starter = ""  # the starter spec alone was slower
        _warn(
            tuning,
            f"WARNING: the tuned model is SLOWER than IREE's default ({proof['speedup']:.2f}x): "
            + (f"{left_out} left out of the spec" if left_out else "no spec is written"),
        )
        if left_out is None and not best:
            os.remove(spec_path)
            return None, {}, _prove_without_spec(tuning, layout, custom_spec)


def _prove_without_spec(tuning: Tuning, layout, custom_spec) -> dict:
    """The proof with no spec: of the model's layout where that is not slower than IREE's
    default of the model as given, else of the model as given."""
    config, target = tuning.config, tuning.target
    proof = _prove(layout, target, None, config, tuning, custom_spec)
    if not layout.changed or (proof["speedup"] or 1.0) >= 1.0:
        return proof
    _warn(
        tuning,
        f"WARNING: the model's layout alone is SLOWER than IREE's default "
        f"({proof['speedup']:.2f}x): the model is kept as given",
    )
    kept = replace(layout, source=layout.original)
    return _prove(kept, target, None, config, tuning, custom_spec)


def _leave_out_least(problems) -> str | None:
    """Drops the winner expected to save the least model time; its name (None: none left)."""
    winners = [e for e in problems if e.result.best is not None]
    if not winners:
        return None
    least = min(winners, key=lambda e: (e.result.baseline_ms - e.result.best_ms) * e.occurrences)
    least.result.best, least.result.best_ms = None, None
    return least.problem.name


def check_applied(model_path, target, spec_path, problems, log) -> dict[str, bool]:
    """Problem name -> every dispatch of its contraction carries the tuned configuration,
    on a root of the form its candidates were timed on."""
    if not spec_path:
        return {}
    from autosched.model.configured import spec_coverage

    configs = spec_coverage(
        model_path, target.compile_flags(), spec_path, spec_flag=target.tuning_spec_flag
    )
    applied = {}
    for entry in problems:
        best = entry.result.best if entry.result else None
        if best is None or not has_config(target, entry.problem, best.point):
            continue  # a custom kernel: not in the spec
        expected = target.for_problem(entry.problem).lowering_config(entry.problem, best.point)
        # By dispatch, not by the root's name: GPU codegen turns a named batch_matmul into
        # a linalg.generic before it configures it.
        dispatches = {site.entry_point for site in entry.contraction.sites}
        mine = [c for c in configs if c.entry_point in dispatches]
        timed = entry.result.timed_form
        other = [form_of(c) for c in mine if timed and form_of(c) != timed]
        if other:
            log.write(f"{entry.problem.name}: timed on {timed}, the model configures {other[0]}")
        ok = bool(mine) and not other and all(c.carries(expected) for c in mine)
        applied[entry.problem.name] = ok
    return applied


def run_proof(layout, target, spec_path, config: RunConfig, custom_spec=None, work=None):
    """proof.prove with the run's target, device, seed and timing settings (its builds in
    `work`, by default the run's model/proof folder): IREE's default of the model as given
    against the tuned builds of its layout."""
    from autosched.drivers.proof import prove
    from autosched.measure.contract import runtime_flag_choices, runtime_flags

    what = "proving the spec on" if spec_path or custom_spec else "timing"
    click.echo(f"{what} the whole model ...", err=True)
    return prove(
        layout.source,
        target.compile_flags(),
        spec_path,
        target.device,
        seed=config.seed,
        rounds=PROOF_ROUNDS,
        spec_flag=target.tuning_spec_flag,
        repetitions=config.repetitions,
        min_time=config.min_time,
        work_dir=work or os.path.join(config.work_dir, "model", "proof"),
        custom_spec=custom_spec,
        default_model=layout.original if layout.changed else None,
        runtime_flags=runtime_flags(config),
        runtime_choices=runtime_flag_choices(config),
    )


def _prove(layout, target, spec_path, config: RunConfig, tuning: Tuning, custom_spec) -> dict:
    """The whole model with and without the spec: one line and the summary's numbers."""
    from dataclasses import asdict

    proof = run_proof(layout, target, spec_path, config, custom_spec)
    lines = [model_line(proof), *([custom_line(proof.custom)] if proof.custom else [])]
    for line in [*lines, *runtime_line(proof)]:
        tuning.log.write(line)
        click.echo(line)
    return {
        "custom": asdict(proof.custom) if proof.custom else None,
        "function": proof.function,
        "default_ms": proof.default_ms,
        "tuned_ms": proof.tuned_ms,
        "default_cv": proof.default_cv,
        "tuned_cv": proof.tuned_cv,
        "speedup": proof.speedup,
        "outputs_match": proof.outputs_match,
        "max_error": proof.max_error,
        "message": proof.message,
        "default_only": proof.default_only,
        "runtime_flags": proof.runtime_flags,
        "runtime_choices": [asdict(c) for c in proof.runtime_choices],
    }


def runtime_line(proof) -> list[str]:
    """Which runtime flags the proof chose and what the others gave (none without a
    choice)."""
    if len(proof.runtime_choices) < 2:
        return []
    named = [
        f"`{c.flags or 'none'}` {f'{c.ms:.4g} ms' if c.ms is not None else 'did not run'}"
        for c in proof.runtime_choices
    ]
    chosen = proof.runtime_flags or "none"
    return [f"runtime flags: `{chosen}`, the fastest for this model ({'; '.join(named)})"]


def model_line(proof) -> str:
    """`model: A ms -> B ms (X×), outputs match (max error E)`, or the default's time alone."""
    if proof.default_only:
        return f"model: {proof.default_ms:.4g} ms (IREE default; nothing faster)"
    tuned = f"{proof.tuned_ms:.4g} ms" if proof.tuned_ms else "no time"
    speedup = f" ({proof.speedup:.2f}x)" if proof.speedup else ""
    noise = proof.noise
    if proof.speedup and noise is not None:
        within = abs(proof.speedup - 1) <= noise
        speedup = (
            f" (no change: {proof.speedup:.2f}x within the rounds' noise of {noise:.1%})"
            if within
            else f" ({proof.speedup:.2f}x, rounds' noise {noise:.1%})"
        )
    if proof.outputs_match:
        answer = f"outputs match (max error {proof.max_error or 0:.2g})"
    else:
        answer = f"OUTPUTS DIFFER: {proof.message}"
    return f"model: {proof.default_ms:.4g} ms -> {tuned}{speedup}, {answer}"


def _log_budget(tuning: Tuning, report: CampaignReport) -> None:
    custom = f", and {report.custom_trials} of custom kernels" if report.custom_trials else ""
    line = (
        f"budget: {report.trials} of {report.budget} trials used ({report.mode} mode){custom}, "
        f"search {report.search_s:.1f} s"
    )
    tuning.log.write(line)
    click.echo(line)


def apply_spec(config: RunConfig, spec_path: str | None, custom_spec: str | None = None) -> None:
    """`autosched apply`: which dispatches the spec configures, and the whole-model proof."""
    from autosched.targets import make_target

    target = make_target(config)
    target.check_device()
    check_temp_dir()  # as a run does: a full one would fail every build with a linker error
    if custom_spec:
        from autosched.model.substitution import check_custom_spec

        check_custom_spec(custom_spec)
    # Its own folder: a run (or another apply) in the same work_dir keeps its builds.
    work = os.path.join(config.work_dir, "apply", str(os.getpid()))
    try:
        _apply_in(config, target, spec_path, custom_spec, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _apply_in(config: RunConfig, target, spec_path, custom_spec, work: str) -> None:
    from autosched.model.configured import spec_coverage

    path = config.input_file
    model_path = model_for_target(path, target, work)
    flags, types_line, needed = typed_flags(target, model_path, work)
    if needed:
        click.echo(types_line, err=True)
    layout, _ = laid_out(config, target, model_path, flags, work)  # as the run tuned it
    model_path = layout.source
    if layout.changed:
        click.echo(layout.describe(), err=True)
    if spec_path:
        configs = spec_coverage(
            model_path, target.compile_flags(), spec_path, spec_flag=target.tuning_spec_flag
        )
        changed = [c for c in configs if c.changed]
        click.echo(
            f"{len(changed)} of {len(configs)} contraction dispatch(es) configured by the spec"
        )
        for c in configs:
            state = "spec" if c.changed else "IREE default"
            click.echo(f"  {c.entry_point}: {c.contraction} ({state})")
    proof = run_proof(layout, target, spec_path, config, custom_spec, os.path.join(work, "proof"))
    click.echo(model_line(proof))
    if proof.custom:
        click.echo(custom_line(proof.custom))
    if not proof.outputs_match or (proof.custom and not proof.custom.outputs_match):
        raise SystemExit(1)
