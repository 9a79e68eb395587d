"""The prepare stage of a model run: the model as the target needs it (its types, its
layout), the roots IREE forms that can be tuned here, and, inside the run's guard, IREE's
own dispatches dumped as benchmarks to time each problem's candidates on."""

from __future__ import annotations

import os
from dataclasses import replace

from iree.compiler import ir

from autosched.config import RunConfig
from autosched.drivers.campaign import ModelProblem, budget_for, skipped_summary
from autosched.drivers.model_stages import report
from autosched.drivers.model_stages.results import ModelDispatches, Prepared
from autosched.errors import UserError
from autosched.kernels.igemm_conv.kernel import takes
from autosched.kernels.registry import family
from autosched.measure.module_io import source_entry_function
from autosched.measure.worker import memory_problem
from autosched.model.buckets import BucketModel, bucket_model, dynamic_patterns
from autosched.model.configured import DEFAULT_TIMEOUT
from autosched.model.dispatch_benchmarks import dispatch_check_modules, strip_benchmarks
from autosched.model.fixed_lengths import SIZE_HINT, fixed_length_model
from autosched.model.input_types import model_input_flags
from autosched.model.layouts import ModelLayout, choose_layout
from autosched.model.lowering import (
    ModelAnalysis,
    dispatch_callers,
    dispatch_calls,
    parse_prepared,
)
from autosched.model.model_build import (
    FLOW,
    ModelBuild,
    analyze_build,
    build_cache,
    model_build,
)
from autosched.ops.contraction import Contraction
from autosched.ops.convolution import STRIDED, ConvolutionProblem
from autosched.ops.registry import kind_of
from autosched.outputs.paths import RunPaths
from autosched.outputs.spec import check_starter
from autosched.run.phases import PhaseClock
from autosched.targets import make_target
from autosched.targets.base import Target, check_search_space


def prepare(config: RunConfig) -> Prepared:
    """The model lowered and its problems found (said on stderr); a UserError when none
    can be tuned. Nothing is measured yet."""
    path, clock = config.input_file, PhaseClock()
    target = make_target(config)
    check_search_space(target, config)
    check_starter(config.starter_spec)  # before anything is compiled, dry runs too
    paths = RunPaths.of(config)
    work = os.path.join(config.work_dir, "model")
    buckets = None
    with clock.phase("lowering"):
        if config.buckets:
            buckets = model_buckets(config, target, work)
            fixed, sizes_line = buckets.path, buckets.line
        else:
            fixed, sizes_line = fixed_length_model(
                path, config.inputs, target.compile_flags(), work
            )
        model_path = model_for_target(fixed, target, work)
        flags, types_line, _ = typed_flags(target, model_path, work)
        layout, analysis = laid_out(config, target, model_path, flags, work)
    problems, skipped = model_problems(analysis, target)
    if buckets is not None:
        problems = bucket_kinds_only(problems, skipped)
    if not problems:
        reasons = "; ".join(f"{count} {reason}" for reason, count in skipped.items())
        raise UserError(
            f"{path}: no linalg.matmul, batch_matmul or other contraction in the "
            f"{analysis.dispatches} dispatch(es) IREE forms can be tuned for {target.name}"
            + (f" (not tuned: {reasons})" if reasons else "")
            + (f"; {SIZE_HINT}" if sizes_line and not config.inputs else "")
        )
    described = report.describe_analysis(path, analysis, problems, skipped)
    report.model_found([types_line, sizes_line, layout.describe(), *described])
    budget = config.budget or budget_for(config.mode, config.n_trial, problems)
    return Prepared(
        config,
        target,
        paths,
        work,
        layout,
        flags,
        problems,
        skipped,
        budget,
        clock=clock,
        buckets=buckets,
    )


def model_buckets(config: RunConfig, target: Target, work: str) -> BucketModel:
    """The buckets' module (model/buckets.py) and the dynamic model's contraction roots."""
    if config.inputs:
        raise UserError(
            f"{config.inputs}: --inputs and --bucket both given: each bucket's file holds the "
            "inputs of its length (give --bucket alone)"
        )
    files = [name for name in config.buckets.split(",") if name]
    buckets = bucket_model(config.input_file, files, target.compile_flags(), work)
    buckets.patterns = dynamic_patterns(buckets, target.compile_flags(), work)
    return buckets


BUCKET_KINDS = ("matmul", "attention")  # kinds whose matchers can leave a length free


def bucket_kinds_only(problems: list[ModelProblem], skipped: dict[str, int]) -> list:
    """The contractions and attention: a spec serves a dynamic model's roots of these kinds
    at any length; the other kinds' matchers are of one size, so they are counted as not
    tuned."""
    kept = []
    for entry in problems:
        if entry.problem.kind in BUCKET_KINDS:
            kept.append(entry)
            continue
        reason = f"{entry.problem.kind} (buckets tune contractions and attention only)"
        skipped[reason] = skipped.get(reason, 0) + 1
    return kept


def with_dispatches(prepared: Prepared) -> Prepared:
    """The problems with IREE's own dispatch to time them on (where the cfg times on the
    dispatch), less those that cannot be searched without one; a UserError when none is
    left."""
    config = prepared.config
    dispatches = ModelDispatches()
    if config.time_on == "dispatch":
        folder = os.path.join(prepared.work, "dispatches")
        with prepared.clock.phase("dispatch_dump"):
            build = model_build(prepared.layout.source, prepared.flags, build_cache(prepared.work))
            dispatches = attach_benchmarks(prepared.problems, build, prepared.flags, folder)
    problems = dispatch_only_roots(prepared.problems, prepared.skipped)
    if not problems:
        raise UserError(
            f"{config.input_file}: no root of the model can be tuned (see the lines above)"
        )
    return replace(prepared, problems=problems, dispatches=dispatches)


def model_for_target(path: str, target: Target, work_dir: str) -> str:
    """The model as the target needs it: unchanged, or (sm_90, which iree-compile cannot
    name) with the full device target attribute the kernels are tuned for set on it."""
    attributes = target.module_attributes()
    if not attributes:
        return path
    context = ir.Context()
    module = parse_prepared(path, work_dir, context)
    for name, text in attributes.items():
        module.operation.attributes[name] = ir.Attribute.parse(text, context)
    os.makedirs(work_dir, exist_ok=True)
    targeted = os.path.join(work_dir, f"model.{target.arch}.mlirbc")
    with open(targeted, "wb") as handle:
        module.operation.write_bytecode(handle)
    return targeted


def typed_flags(target: Target, model_path: str, work: str) -> tuple[list[str], str, bool]:
    """The target's compile flags with what the model's types need (f64 kept as f64), the
    line that names the model's types, and whether a flag was needed."""
    config = target.config
    needed, line = model_input_flags(
        model_path, target.compile_flags(), work, config.inputs, config.input_file
    )
    target.use_input_flags(needed)
    return target.compile_flags(), line, bool(needed)


def model_problems(analysis: ModelAnalysis, target: Target) -> tuple[list[ModelProblem], dict]:
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


def laid_out(
    config: RunConfig, target: Target, model_path: str, flags, work: str
) -> tuple[ModelLayout, ModelAnalysis]:
    """(layout, analysis): the model every build starts from, with the layout the target
    needs (layouts.py; `layout = strided`: on any target; channels-last where the Triton
    convolution kernels are searched) unless the cfg says `layout = none`, and its roots.
    Each model is compiled once (model_build.py, kept in `work`'s build cache): its
    dispatches, their configured form, its dispatch benchmarks and IREE's default module
    all come from that one compile."""
    cache = build_cache(work)
    analysis = analyze_build(model_build(model_path, flags, cache), flags)
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
    generalized = config.layout == "generalized"
    rows = config.layout == "rows" or (
        config.layout == "auto" and target.generalizes_single_rows and has_single_rows(analysis)
    )
    layout = choose_layout(model_path, flags, work, reductions, channels_last, generalized, rows)
    if not layout.changed:
        return layout, analysis
    return layout, analyze_build(model_build(layout.source, flags, cache), flags)


def has_single_rows(analysis: ModelAnalysis) -> bool:
    """Whether one of the model's contractions has one row (a decode step's projection)."""
    return any(isinstance(root, Contraction) and root.m == 1 for root in analysis.roots)


def triton_convolutions(config: RunConfig, target: Target, convolutions: list) -> bool:
    """Whether the run searches the Triton convolution kernels (sm_90 with Triton, unless the
    cfg's `conv_kernel` list leaves them out) and they take every one of the model's
    `convolutions`: they read channels-last images, so `layout = auto` turns the model
    channels-last for them. IREE's own NHWC convolutions are slower than its NCHW ones on
    the H200 (resnet50 with the kernels ran 1.03x torch.compile's time in the same call,
    its best NCHW build 1.82x in another call), and IREE's conversion
    leaves a depthwise one NCHW between transposes."""
    if not target.tunes("convolution"):
        return False
    igemm = family("igemm_conv")
    knob, choice = igemm.selector
    allowed = choice in config.knob_space.get(knob, [choice])
    searched = igemm.unavailable(target.for_kind("convolution")) is None and allowed
    return searched and all(takes(problem) for problem in convolutions)


def attach_benchmarks(
    problems: list[ModelProblem], build: ModelBuild, flags, folder
) -> ModelDispatches:
    """Each problem gets IREE's own dispatch of its first site to be timed on (from the
    benchmarks and the `flow` phase the model's build wrote); returns every dispatch's
    benchmark (for the whole model's table)."""
    report.note("writing IREE's dispatches as benchmarks ...")
    source = build.source
    benchmarks = strip_benchmarks(build.benchmarks, folder, source)
    flow = build.parse(FLOW)
    checks = dispatch_check_modules(flow, set(benchmarks), folder, source)
    for entry_point, (check, inputs, outputs) in checks.items():
        benchmarks[entry_point] = replace(
            benchmarks[entry_point], check_source=check, check_inputs=inputs, check_outputs=outputs
        )
    whole_model: dict[str | None, dict] = {}  # per function of the model (several: by name)
    callers = dispatch_callers(flow)
    names = set(callers.values())
    for entry in problems:
        found = [benchmarks.get(site.entry_point) for site in entry.contraction.sites]
        entry.benchmark = next((b for b in found if b is not None), None)
        if entry.benchmark is None:
            report.note(f"  {entry.problem.name}: no dispatch benchmark; timed as a kernel")
        elif kind_of(entry.problem).checks_model:
            caller = callers.get(entry.benchmark.entry_point) if len(names) > 1 else None
            if caller not in whole_model:
                whole_model[caller] = model_check(source, flags, folder, source, caller)
            entry.benchmark = replace(entry.benchmark, model_check=whole_model[caller])
            if not entry.benchmark.check_source:
                entry.benchmark = entry.benchmark.on_whole_model()
    return ModelDispatches(benchmarks, dispatch_calls(flow))


def model_check(
    source: str, flags, folder: str, model_path: str, function: str | None = None
) -> dict:
    """A benchmark's check fields for checking answers on the whole model (`checks_model`):
    the model's source, its entry function (`function`, of a model of several) and the
    plain tensor types it takes."""
    entry = source_entry_function(source, flags, function, folder, DEFAULT_TIMEOUT, model_path)
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
            report.note(f"  {entry.problem.name}: not tuned: {reason}")
            continue
        kept.append(entry)
    return kept
