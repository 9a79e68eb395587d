"""The custom-kernel route of a model run: the custom family's points searched on their bare
kernels after the campaign, the winners that beat IREE's best dispatch written as a
substitution spec, and the lines that report the route (the kernel families live in
`kernels/`; the rewrite in `rewrite/`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial

import click

from autosched.config import RunConfig
from autosched.drivers.bucket_kernels import any_length_winners
from autosched.drivers.campaign import ModelProblem, trials_per_problem
from autosched.drivers.dispatch_table import custom_build_lines, time_dispatches
from autosched.kernels.registry import family
from autosched.model.buckets import BucketModel
from autosched.model.dispatch_benchmarks import dump_dispatch_benchmarks
from autosched.model.lowering import dispatch_calls, lower_to_dispatches
from autosched.outputs.commands import TUNED_VMFB, shell_line
from autosched.outputs.report import RunLog
from autosched.rewrite.apply import RESUME_FLAG, rewrite_commands, rewrite_model
from autosched.rewrite.attention_ops import ambiguous, model_attentions
from autosched.rewrite.attention_ops import paired as paired_attention
from autosched.rewrite.attention_sources import winners_absorbed
from autosched.rewrite.conv_padding import winners_paddings
from autosched.rewrite.convolution_ops import model_convolutions
from autosched.rewrite.convolution_ops import paired as paired_convolution
from autosched.rewrite.epilogues import winners_epilogues
from autosched.rewrite.narrow_reshapes import model_reshape_chains
from autosched.rewrite.placement import CUSTOM_ROUTE, IREE_ROUTE, CustomWinner, NotPlaced
from autosched.rewrite.replacements import narrowed, substitutable
from autosched.rewrite.row_norms import winners_norms
from autosched.rewrite.spec import write_substitution
from autosched.run.problem import Progress
from autosched.run.tuning import Tuning
from autosched.search.space import build_space
from autosched.targets.base import Target, has_config


@dataclass(frozen=True)
class RouteView:
    """What the custom route reads of a run to know what it will search: the target, the
    cfg and run.log (a Tuning is one; a dry run makes one without measuring anything)."""

    target: Target
    config: RunConfig
    log: RunLog


def custom_coverage(tuning: Tuning | RouteView, problems: list, model_path: str) -> dict:
    """Campaign problem name -> the problem its custom kernels are searched as, for each
    problem a custom family of the target covers (when the cfg's knob lists name it): a
    matmul timed on its dispatch whose space has custom points (its narrow form where the
    model truncates its result), an attention or a convolution by its op form (`flash_forms`,
    `convolution_forms`). Known before the campaign, so that fast mode leaves these to the
    custom route (campaign.leave_to_custom_route) and no other."""
    target, knobs = tuning.target, tuning.config.knob_space
    covered = {
        entry.problem.name: timed_form(entry)
        for entry in problems
        if entry.benchmark is not None  # timed as a kernel, its campaign searched them already
        and entry.problem.kind == "matmul"
        and any(
            not has_config(target, entry.problem, p)
            for p in build_space(entry.problem, target, knobs).points
        )
        and not substitutable(entry.problem)
    }
    covered |= flash_forms(tuning, problems, model_path)
    covered |= convolution_forms(tuning, problems, model_path)
    # A convolution IREE collapsed into a matmul: only its op form's kernel replaces it.
    return {name: problem for name, problem in covered.items() if problem is not None}


def search_custom_kernels(
    tuning: Tuning,
    covered: dict,
    progress: Progress,
    deadline: float | None = None,
):
    """Problem name -> the custom-kernel search of each problem `covered` names
    (`custom_coverage`): its points only, as many as the mode gives a problem (fast:
    FAST_TRIALS; normal: n_trial), ending at the run's time budget (`deadline`, after each
    search's first batch), each checked against numpy and timed on its bare kernel (a
    custom kernel has no place in IREE's dispatch benchmark; the whole-model proof is what
    judges it). An attention is searched in its op form, under its flow problem's name."""
    if not covered:
        return {}
    # One search per kernel problem: flow problems that share one (two sites of a model's
    # attention) share its result, and two searches of one problem would share its folder.
    unique = list({id(problem): problem for problem in covered.values()}.values())
    trials = trials_per_problem(tuning.config.mode, tuning.config.n_trial)
    click.echo(
        f"custom kernels: searching {len(unique)} problem(s) on their kernels, up to "
        f"{trials} trials each",
        err=True,
    )
    searches = tuning.concurrently(
        [
            partial(
                tuning.search_problem,
                p,
                progress,
                own_bar=False,
                custom_only=True,
                trials=trials,
                deadline=deadline,
            )
            for p in unique
        ]
    )
    results = tuning.finish_all(searches, progress)
    # Keyed by the campaign's problem: an attention's search is of its op form.
    return {name: r for name, p in covered.items() for r in results if r.problem is p}


def timed_form(entry: ModelProblem):
    """The form a matmul's custom kernels are timed in: where a dispatch of it truncates
    the f32 result to the inputs' type, the narrow problem (C in that type), the kernel the
    model's substitution writes there (and, through the reshapes between them, at a
    truncf outside the dispatch too); else the problem itself. The two
    rank points differently: the warp-specialized kernel stores a bf16 block of C by TMA
    but an f32 one from registers, and on the H200 it ran the Llama-3 down projection in
    0.358 ms with an f32 C against the plain kernel's 0.347, and in 0.334 with a bf16 C
    against 0.400 (session 27)."""
    fused = [op for site in entry.contraction.sites for op in site.fused_ops]
    narrow = narrowed(entry.problem) if any("arith.truncf" in op for op in fused) else None
    return narrow or entry.problem


@dataclass(frozen=True)
class OpFormRoute:
    """A custom family that replaces a kind's ops before dispatches are formed."""

    kind: str  # the root-op kind whose op forms it searches
    label: str  # what run.log calls it
    knob: str  # the cfg knob whose list may leave it out
    choice: str  # the family's value of that knob
    family: str  # the kernel family's name (kernels/registry.py)


FLASH_ROUTE = OpFormRoute(
    "attention", "flash-attention kernels", "kernel", "flash", "flash_attention"
)
CONVOLUTION_ROUTE = OpFormRoute(
    "convolution", "Triton convolution kernels", "conv_kernel", "triton", "igemm_conv"
)


def searched_kind(tuning: Tuning, problems: list[ModelProblem], route: OpFormRoute) -> list:
    """The kind's dispatch problems when its family may be searched here; none (and why, in
    run.log) when the target, Triton or the cfg rule it out."""
    found = [e.problem for e in problems if e.problem.kind == route.kind]
    if not found or not tuning.target.tunes(route.kind):
        return []
    view = tuning.target.for_kind(route.kind)
    families = getattr(view, "kernel_families", list)()
    chosen = next((f for f in families if f.name == route.family), None)
    why = f"no {route.label} on this target" if chosen is None else chosen.unavailable(view)
    if route.choice not in tuning.config.knob_space.get(route.knob, [route.choice]):
        why = f"the cfg's `{route.knob}` list leaves them out"
    if why:
        tuning.log.write(f"{route.label} not searched: {why}")
        return []
    return found


def flash_forms(tuning: Tuning, problems: list[ModelProblem], model_path: str) -> dict:
    """Flow attention name -> its op form, for each attention the flash family can replace
    (the model lowered once more, to where the rewrite applies); why not, in run.log."""
    target, log = tuning.target, tuning.log
    attentions = searched_kind(tuning, problems, FLASH_ROUTE)
    if not attentions:
        return {}
    view = target.for_kind("attention")
    folder = os.path.join(tuning.config.work_dir, "model", "attention")
    ops = model_attentions(model_path, target.compile_flags(), folder)
    forms = {}
    for flow in attentions:
        op = paired_attention(flow, ops)
        kernels = family(FLASH_ROUTE.family)
        why = "no attention op at its location" if op is None else kernels.why_not(view, op)
        why = why or ambiguous(op, ops)
        if why:
            log.write(f"{flow.name}: no flash-attention kernel: {why}")
            continue
        log.write(f"{flow.name}: flash-attention kernels searched on its op form {op.name}")
        forms[flow.name] = op
    return forms


def convolution_forms(tuning: Tuning, problems: list[ModelProblem], model_path: str) -> dict:
    """Dispatch convolution name -> its op form, for each convolution the Triton
    implicit-GEMM family can replace (each op form once); why not, in run.log. A matmul
    dispatch that is a convolution IREE collapsed (a channels-last pointwise one) maps to
    its op form, or to None where that form is not searched for it."""
    target, log = tuning.target, tuning.log
    convolutions = searched_kind(tuning, problems, CONVOLUTION_ROUTE)
    if not convolutions:
        return {}
    view = target.for_kind("convolution")
    folder = os.path.join(tuning.config.work_dir, "model", "convolution")
    try:
        ops = model_convolutions(model_path, target.compile_flags(), folder)
    except RuntimeError as error:  # IREE's elementwise fusion failed on the model
        log.write(f"{CONVOLUTION_ROUTE.label} not searched: {error}")
        return {}
    # IREE collapses a channels-last pointwise convolution into a matmul dispatch: its op
    # form is still a convolution, which only this family's kernel replaces.
    collapsed = [e.problem for e in problems if e.problem.kind == "matmul"]
    forms, taken = {}, set()
    for flow in [*convolutions, *collapsed]:
        op = paired_convolution(flow, ops)
        if op is None and flow.kind == "matmul":
            continue
        kernels = family(CONVOLUTION_ROUTE.family)
        why = "no convolution op at its location" if op is None else kernels.why_not(view, op)
        if why is None and op.key() in taken:
            why = "its op form is searched for another dispatch"
        if why:
            log.write(f"{flow.name}: no Triton convolution kernel: {why}")
            if flow.kind == "matmul":
                forms[flow.name] = None
            continue
        log.write(f"{flow.name}: Triton convolution kernels searched on its op form {op.name}")
        taken.add(op.key())
        forms[flow.name] = op
    return forms


@dataclass
class CustomSpec:
    """The substitution spec a run wrote: its path (None without one), the winners in it,
    and the winners it could not take, with why (rewrite/placement.py)."""

    path: str | None
    winners: list[CustomWinner] = field(default_factory=list)
    not_placed: list[NotPlaced] = field(default_factory=list)


def write_custom_spec(*args, **kwargs) -> str | None:
    """The custom kernels that beat both IREE's default kernel and the campaign's best
    dispatch time, as the spec that replaces their contractions; None when there are none
    (`write_custom_substitution`'s path, with its arguments)."""
    return write_custom_substitution(*args, **kwargs).path


def write_custom_substitution(
    path: str,
    target,
    problems: list[ModelProblem],
    custom: dict,
    log,
    model: tuple[str, str] | None = None,
    readings: list | None = None,
    buckets: BucketModel | None = None,
) -> CustomSpec:
    """The spec of the custom winners (see `write_custom_spec`), the winners in it, and
    those the spec writer refused (each named in run.log and in `not_placed`). `model`
    (its path and the run's model folder) lets the spec take what the kernels can from
    around their ops (`model_readings`): the reshapes before a truncf, the epilogue after it,
    an attention's copied operands, a convolution's zero pad; `readings`, read already for
    the same winners' problems, stand for them. With `buckets` (`model` then the dynamic
    model's) the winners are the dynamic model's (bucket_kernels.any_length_winners)."""
    winners, named = custom_winners(target, problems, custom, log)
    served = {p.name: [named[p.name]] for p, _ in winners}
    refused = []
    if buckets is not None:
        found = any_length_winners(buckets, problems, winners, named)
        winners, served, refused = found.winners, found.served, list(found.left_out)
        for line in found.why:
            log.write(line)
    if winners or os.path.exists(path):  # a spec of an earlier run is replaced or removed
        if readings is None:
            readings = model_readings(model, winners, target, log)
        for why in write_substitution(path, winners, target, *readings):
            log.write(f"not substituted: {why}")
            kernel, _, reason = why.partition(": ")
            refused += [NotPlaced(n, CUSTOM_ROUTE, reason) for n in served.get(kernel, [kernel])]
    taken = {r.problem for r in refused}
    return CustomSpec(
        path if os.path.exists(path) else None,
        [
            CustomWinner(name, p.name, p.kind)
            for p, _ in winners
            for name in served[p.name]
            if name not in taken
        ],
        refused,
    )


def custom_winners(target, problems: list[ModelProblem], custom: dict, log) -> tuple[list, dict]:
    """([(the problem its kernels replace, the point)], that problem's name -> the campaign
    problem's) of the custom winners under IREE's best dispatch time; the others logged."""
    winners, named = [], {}
    for entry in problems:
        result = custom_winner(entry, custom, target)
        if result is None:
            continue
        if not beats_iree(entry, result):
            log.write(
                f"{entry.problem.name}: custom kernel {result.best_ms:.4g} ms, not under IREE's "
                f"{iree_ms(entry):.4g} ms on the dispatch: not substituted"
            )
            continue
        # An attention's or a convolution's op form; a matmul's own problem where its
        # kernels were timed narrow (`timed_form`).
        problem = entry.problem if result.problem.kind == "matmul" else result.problem
        winners.append((problem, result.best.point))
        named[problem.name] = entry.problem.name
    return winners, named


def model_readings(model: tuple[str, str] | None, winners: list, target, log) -> list:
    """What the spec writer reads from the model around the winners' ops (MODEL_READINGS,
    in `write_substitution`'s order); of their problems only, not their points."""
    return [read(model, winners, target, log) for read in MODEL_READINGS]


def _chains(model: tuple[str, str] | None, winners: list, target, log) -> dict | None:
    """The reshape chains between the narrow matmul winners' contractions and their truncfs
    in the model (rewrite/narrow_reshapes.py); None without any."""
    if model is None or not any(narrowed_matmul(p) for p, _ in winners):
        return None

    return model_reshape_chains(model[0], target.compile_flags(), os.path.join(model[1], "narrow"))


def _read_fused(model: tuple[str, str] | None, problems: list, reader, target, log, what: str):
    """`reader` (model path, flags, folder, problems) on the model lowered and fused in the
    run's model folder, where the convolution op forms were read; None without problems,
    or (logged) where the model cannot be read so: the kernels then replace their ops
    alone."""
    if model is None or not problems:
        return None
    folder = os.path.join(model[1], "convolution")
    try:
        return reader(model[0], target.compile_flags(), folder, problems)
    except RuntimeError as error:
        log.write(f"{what} not read: {error}")
        return None


def _epilogues(model: tuple[str, str] | None, winners: list, target, log) -> dict | None:
    """The element-wise ops after the convolution and narrow matmul winners that their
    kernels compute (rewrite/epilogues.py), by `problem_key`; None without any."""
    fusing = [p for p, _ in winners if p.kind == "convolution" or narrowed_matmul(p)]
    epilogues = _read_fused(model, fusing, winners_epilogues, target, log, "epilogues")
    if epilogues is not None:
        log.write(f"epilogues kept in their kernels: {sum(len(e) for e in epilogues.values())}")
    return epilogues


def _absorbed(model: tuple[str, str] | None, winners: list, target, log) -> dict | None:
    """The attention winners' forms over their copied operands' sources (GQA's repeat, V's
    transpose and the result's transpose absorbed: rewrite/attention_sources.py), by name;
    None without any."""
    attentions = [p for p, _ in winners if p.kind == "attention"]
    found = _read_fused(model, attentions, winners_absorbed, target, log, "attention operands")
    for name, forms in (found or {}).items():
        copies = ", ".join("QKV"[s.operand] for s in forms[-1].inputs)
        parts = [f"reads {copies} as the model holds them"] if copies else []
        if forms[0].output:
            parts.append("writes its result where the copy after it would")
        log.write(f"{name}: the kernel {' and '.join(parts)}")
    return found


def _paddings(model: tuple[str, str] | None, winners: list, target, log) -> dict | None:
    """The convolution winners' zero paddings their kernels apply themselves, reading each
    image before its pad (rewrite/conv_padding.py), by `key()`; None without any."""
    convolutions = [p for p, _ in winners if p.kind == "convolution"]
    found = _read_fused(model, convolutions, winners_paddings, target, log, "paddings")
    if found is not None:
        log.write(f"convolutions whose kernel pads the image itself: {len(found)}")
    return found


def _norms(model: tuple[str, str] | None, winners: list, target, log) -> dict | None:
    """The RMSNorms that make the matmul winners' A, which their kernels compute
    (rewrite/row_norms.py), by `problem_key`; None without any."""
    matmuls = [p for p, _ in winners if p.kind == "matmul" and not p.any_rows]
    found = _read_fused(model, matmuls, winners_norms, target, log, "norms")
    if found is not None:
        log.write(f"norms read before their matmuls: {sum(len(n) for n in found.values())}")
    return found


# What the spec writer reads from the model, in write_substitution's order.
MODEL_READINGS = (_chains, _epilogues, _absorbed, _paddings, _norms)
EPILOGUE_READING = _epilogues  # its readings: {problem_key: [Epilogue]} (or None)


def narrowed_matmul(problem) -> bool:
    """A matmul winner whose kernel may store the narrow type (and keep an epilogue)."""
    return problem.kind == "matmul" and narrowed(problem) is not None


def iree_ms(entry: ModelProblem) -> float | None:
    """IREE's best time for the problem on its dispatch (the campaign's, else its default)."""
    return entry.result.best_ms if entry.result.best else entry.result.baseline_ms


def beats_iree(entry: ModelProblem, result) -> bool:
    """Whether a custom search's best is under IREE's best dispatch time (the campaign's
    own best, when it is the custom kernel, is so by its choice)."""
    best = iree_ms(entry)
    return result is entry.result or not best or result.best_ms < best


def custom_winner(entry: ModelProblem, custom: dict, target):
    """The search whose best is a custom kernel for this problem: the custom pass's, or the
    campaign's own when it timed kernels (`time_on = kernel` searches custom points with
    IREE's); None when neither found one."""
    campaign = entry.result
    if campaign.best is not None and not has_config(target, entry.problem, campaign.best.point):
        return campaign
    result = custom.get(entry.problem.name)
    return result if result is not None and result.best is not None else None


def custom_build_dispatches(config, target, log, model_path: str, custom_spec: str, spec_path):
    """Every dispatch of the model as built with its custom kernels (and the spec for the
    rest), timed on IREE's own dispatch benchmarks: where the time goes after the custom
    route. A table in run.log (`log`) and on the screen; its rows."""
    click.echo("timing every dispatch of the model with its custom kernels ...", err=True)
    folder = os.path.join(config.work_dir, "model", "custom_dispatches")
    os.makedirs(folder, exist_ok=True)
    lowered, benchmarks = custom_build(model_path, custom_spec, target, folder, config)
    calls = dispatch_calls(lowered)
    rows = time_dispatches(
        benchmarks, calls, target, spec_path, config, {}, os.path.join(folder, "timed")
    )
    if not spec_path:  # nothing to apply: the default build is the custom build
        for row in rows:
            row.tuned_ms = row.default_ms
    text = custom_build_lines(rows)
    log.section("every dispatch, with the custom kernels")
    log.write(text)
    click.echo("\n" + text)
    return rows


def custom_build(model_path: str, custom_spec: str, target, folder: str, config) -> tuple:
    """(the model with the spec's kernels in place, lowered to flow; its dispatch
    benchmarks), both written in `folder`."""
    out = os.path.join(folder, "model.custom.mlir")
    flags = target.compile_flags()
    rewritten, _ = rewrite_model(model_path, custom_spec, flags, out, config.compile_timeout)
    flags = [*flags, RESUME_FLAG]
    benchmarks = dump_dispatch_benchmarks(rewritten, flags, folder)
    return lower_to_dispatches(rewritten, flags), benchmarks


def route_of(row: dict, substituted: bool) -> str:
    """Which route a problem's winner took, for the summary (the honest name of it)."""
    if substituted and row.get("custom_ms") is not None:
        return CUSTOM_ROUTE
    return IREE_ROUTE if row["in_spec"] else "IREE default"


def custom_commands(model_path, target, spec_path, custom_spec, work_dir, extra=()) -> str:
    """The exact commands that build the model with its custom kernels (and the compile
    flags `extra` the proof chose) into the work folder's model.vmfb, quoted to be
    pasted."""
    flags = target.compile_flags()
    out = os.path.join(work_dir, "model", "model.custom.mlir")
    steps = [command for _, command in rewrite_commands(model_path, custom_spec, flags, out)]
    spec = target.spec_flags(spec_path) if spec_path else []
    vmfb = os.path.join(work_dir, TUNED_VMFB)
    steps.append(["iree-compile", out, *flags, *spec, RESUME_FLAG, *extra, "-o", vmfb])
    named = [[os.path.basename(step[0]), *step[1:]] for step in steps]
    return "tuned model with custom kernels:\n  " + shell_line(named, " &&\n  ")


def custom_line(custom) -> str:
    """`with custom kernels (N replaced): C ms (X× over the default, Y× over the spec alone),
    outputs match`."""
    if custom.ms is None:
        return f"with custom kernels: no time ({custom.message})"
    over = f", {custom.over_spec:.2f}x over the spec alone" if custom.over_spec else ""
    answer = (
        f"outputs match (max error {custom.max_error or 0:.2g})"
        if custom.outputs_match
        else f"OUTPUTS DIFFER: {custom.message}"
    )
    return (
        f"with custom kernels ({custom.replaced} op(s) replaced): {custom.ms:.4g} ms "
        f"({custom.speedup:.2f}x over the default{over}), {answer}"
    )
