"""`autosched run MODEL` and `autosched apply MODEL --spec SPEC`: the model's path through the
tool, from lowering to the line that says what the spec did to the whole model, in stages
(`model_stages/`), each handing its typed result to the next:

    prepare (lower, problems, IREE's dispatches) -> search (campaign, custom route)
        -> decide (specs, their check in the model, the proof) -> report (tables, summary)
"""

from __future__ import annotations

import os
import shutil

from autosched.compile import check_temp_dir
from autosched.config import RunConfig
from autosched.drivers.bucket_proof import bucket_fields
from autosched.drivers.entry_points import function_lines
from autosched.drivers.guard import guarded_run
from autosched.drivers.model_stages import report
from autosched.drivers.model_stages.decide import decide, run_proof
from autosched.drivers.model_stages.prepare import (
    laid_out,
    model_buckets,
    model_for_target,
    prepare,
    typed_flags,
    with_dispatches,
)
from autosched.drivers.model_stages.search import dry_coverage, search
from autosched.errors import UserError
from autosched.model.configured import spec_coverage
from autosched.model.fixed_lengths import fixed_length_model
from autosched.rewrite.spec import check_custom_spec
from autosched.run.problem import Progress
from autosched.targets import make_target


def run_model(config: RunConfig, resume: bool, dry_run: bool, progress: Progress) -> None:
    """Tunes a whole model; see the module docstring. A dry run stops after prepare."""
    prepared = prepare(config)
    if dry_run:
        report.dry_run(prepared, dry_coverage(prepared))
        return
    with guarded_run(config, prepared.target, prepared.paths, resume):
        prepared = with_dispatches(prepared)
        searched = search(prepared, resume, progress)
        decided = decide(prepared, searched)
        report.report(prepared, searched, decided)


def apply_spec(config: RunConfig, spec_path: str | None, custom_spec: str | None = None) -> None:
    """`autosched apply`: which dispatches the spec configures, and the whole-model proof."""
    target = make_target(config)
    target.check_device()
    check_temp_dir()  # as a run does: a full one would fail every build with a linker error
    if custom_spec and config.buckets:
        raise UserError(
            f"{custom_spec}: --custom and --bucket: custom kernels are placed in models of "
            "static sizes only (give --spec alone)"
        )
    if custom_spec:
        check_custom_spec(custom_spec)
    # Its own folder: a run (or another apply) in the same work_dir keeps its builds.
    work = os.path.join(config.work_dir, "apply", str(os.getpid()))
    try:
        _apply_in(config, target, spec_path, custom_spec, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _apply_in(config: RunConfig, target, spec_path, custom_spec, work: str) -> None:
    if config.buckets:
        _apply_on_buckets(config, target, spec_path, work)
        return
    fixed, sizes_line = fixed_length_model(
        config.input_file, config.inputs, target.compile_flags(), work
    )
    if sizes_line:
        report.note(sizes_line)
    model_path = model_for_target(fixed, target, work)
    flags, types_line, needed = typed_flags(target, model_path, work)
    if needed:
        report.note(types_line)
    layout, _ = laid_out(config, target, model_path, flags, work)  # as the run tuned it
    if layout.changed:
        report.note(layout.describe())
    if spec_path:
        report.spec_coverage(
            spec_coverage(
                layout.source, target.compile_flags(), spec_path, spec_flag=target.tuning_spec_flag
            )
        )
    proof = run_proof(layout, target, spec_path, config, custom_spec, os.path.join(work, "proof"))
    _said(proof)


def _apply_on_buckets(config: RunConfig, target, spec_path, work: str) -> None:
    """`apply --bucket`: the dynamic model proved on each bucket's inputs with the spec, as
    a run tuned on buckets proves it, and how many of its dispatches of dynamic size the
    spec configures."""
    buckets = model_buckets(config, target, work)
    report.note(buckets.line)
    proof = run_proof(None, target, spec_path, config, None, os.path.join(work, "proof"), buckets)
    fields = bucket_fields(
        buckets, target.compile_flags(), spec_path, target.tuning_spec_flag, work
    )
    report.note(
        f"the spec configures {fields['configured_by_spec']} of the dynamic model's "
        f"{fields['dynamic_dispatches']} dispatches of dynamic size ({buckets.model})"
    )
    _said(proof)


def _said(proof) -> None:
    """The proof's lines (one per function or bucket); exit 1 when the outputs differ."""
    differ = report.applied_proof(proof)
    for line in function_lines(proof):  # a model of several functions: each one's line
        report.say(line)
    if differ:
        raise SystemExit(1)
