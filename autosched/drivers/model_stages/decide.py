"""The decide stage of a model run: the custom winners written as a substitution spec, the
IREE winners as a tuning spec checked in the model, both proved on the whole model (a spec
that proves slower loses its least winner until it is not; one that is not faster beyond
the rounds' noise is not kept: proof.ModelVerdict), and the summary's rows with the route
each problem's winner took."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, replace

from autosched.config import RunConfig
from autosched.drivers.bucket_proof import bucket_fields, prove_buckets
from autosched.drivers.campaign import ModelProblem, problem_rows
from autosched.drivers.custom_route import (
    CustomSpec,
    beats_iree,
    custom_winner,
    route_of,
    write_custom_substitution,
)
from autosched.drivers.entry_points import function_fields, function_lines, prove_model
from autosched.drivers.in_place import choose_in_place
from autosched.drivers.model_stages import report
from autosched.drivers.model_stages.results import Decided, Prepared, Searched
from autosched.drivers.proof import FASTER, SLOWER
from autosched.measure.contract import fusion_choices, runtime_flag_choices, runtime_flags
from autosched.model.buckets import BucketModel, bucket_spec
from autosched.model.configured import form_of, roots_in, spec_coverage, tuning_spec_flags
from autosched.model.layouts import ModelLayout
from autosched.model.model_build import CONFIGURED, build_cache, model_build
from autosched.outputs.report import RunLog, no_winner_line
from autosched.outputs.spec import write_spec
from autosched.rewrite.placement import (
    CUSTOM_ROUTE,
    IREE_ROUTE,
    NotPlaced,
    check_placed,
    replaced_by_kind,
)
from autosched.targets.base import Target, has_config

PROOF_ROUNDS = 5


def decide(prepared: Prepared, searched: Searched) -> Decided:
    """The specs written, checked and proved; the summary's per-problem rows."""
    config, target, layout, log = prepared.config, prepared.target, prepared.layout, searched.log
    if layout.changed:
        log.write(layout.describe())
    model = (layout.source, os.path.join(config.work_dir, "model"))
    buckets = prepared.buckets
    if buckets is None:  # a kernel for any count of rows has no epilogue to time in place
        with prepared.clock.phase("in_place"):
            chosen = choose_in_place(config, target, prepared.problems, searched.custom, model, log)
        searched.custom.update(chosen)  # the point kept is the run's: the tables after say it
    else:  # the spec is the dynamic model's, read from it (bucket_kernels.py)
        model = (buckets.model, os.path.join(config.work_dir, "model", "dynamic"))
    custom = write_custom_substitution(
        prepared.paths.custom_spec, target, prepared.problems, searched.custom, log, model,
        buckets=buckets,
    )  # fmt: skip
    custom_spec = custom.path
    spec_path, applied, proof = spec_never_slower(prepared, log, custom_spec)
    rows = routed_rows(prepared, searched, applied, custom_spec, spec_path)
    missing = not_placed(custom, applied, proof)
    report.placement(log, missing, placed_by_kind(custom, proof))
    return Decided(spec_path, custom_spec, applied, proof, rows, missing)


def not_placed(custom: CustomSpec, applied: dict[str, bool], proof: dict | None) -> list:
    """Every problem whose winner is not in the built model, with why (NotPlaced): custom
    winners the spec writer refused or no op of the rewritten model runs, IREE winners
    whose configuration the model's dispatches do not carry."""
    missing = list(custom.not_placed)
    verdict = (proof or {}).get("custom")
    if custom.winners and verdict is not None:
        message = verdict.get("message") or ""
        if message.startswith("does not compile"):
            missing += [
                NotPlaced(w.problem, CUSTOM_ROUTE, f"the model with custom kernels {message}")
                for w in custom.winners
            ]
        else:
            missing += check_placed(custom.winners, Counter(verdict.get("placed") or {}))
    missing += [
        NotPlaced(name, IREE_ROUTE, "the model's dispatches do not carry its configuration")
        for name, ok in applied.items()
        if not ok
    ]
    return missing


def placed_by_kind(custom: CustomSpec, proof: dict | None) -> dict[str, int]:
    """Root-op kind -> ops the custom build replaced (none without a custom build)."""
    verdict = (proof or {}).get("custom")
    if not custom.winners or verdict is None:
        return {}
    return replaced_by_kind(custom.winners, Counter(verdict.get("placed") or {}))


def routed_rows(
    prepared: Prepared,
    searched: Searched,
    applied: dict[str, bool],
    custom_spec: str | None,
    spec_path: str | None,
) -> list[dict]:
    """The summary's per-problem rows, each with its custom kernel's time and its route (in
    the spec only where a spec was kept)."""
    target, problems = prepared.target, prepared.problems
    rows = problem_rows(problems, applied)
    for entry, row in zip(problems, rows, strict=True):
        result = custom_winner(entry, searched.custom, target)
        best = entry.result.best
        in_spec = row["in_spec"] and has_config(target, entry.problem, best.point)
        row["in_spec"] = bool(spec_path) and in_spec
        row["custom_ms"] = result.best_ms if result else None
        substituted = custom_spec is not None and result is not None
        row["route"] = route_of(row, substituted and beats_iree(entry, result))
    return rows


def spec_never_slower(prepared: Prepared, log: RunLog, custom_spec: str | None):
    """(spec path or None, applied, proof): the winners' spec, checked in the model and
    proved on it, kept only where the model's verdict is faster (proof.ModelVerdict). While
    the tuned model proves slower than IREE's default, the winner that was to save the
    least model time is left out and the spec proved again; a model not faster beyond the
    rounds' noise keeps no spec. Without any spec the default alone is timed, so the run
    always ends with the model's line."""
    config, target, layout, problems = (
        prepared.config,
        prepared.target,
        prepared.layout,
        prepared.problems,
    )
    starter = config.starter_spec
    while True:
        best = [(e.problem, target, e.result.best.point) for e in problems if e.result.best]
        spec_path, expected = write_run_spec(prepared, best, starter)
        with prepared.clock.phase("spec_check"):
            cache = build_cache(prepared.work)
            applied = check_applied(
                layout.source, target, spec_path, problems, log, cache, expected
            )
        for name in [name for name, ok in applied.items() if not ok]:
            report.warn(
                log, f"WARNING: the spec's configuration for {name} is NOT applied in the model"
            )
        reason = "" if spec_path else no_winner_line([e.result for e in problems])
        if reason and not custom_spec:
            report.say(reason)
        if not spec_path:
            proof = proved_without_spec(prepared, log, custom_spec)
            proof["no_spec"] = proof["no_spec"] or reason  # the summary says why, as the console
            return None, applied, proof
        with prepared.clock.phase("proof"):
            proof = proved(layout, target, spec_path, config, log, custom_spec, prepared.buckets)
        if proof["verdict"] != SLOWER:
            return kept_if_faster(spec_path, applied, proof, log)
        left_out = leave_out_least(problems)
        if left_out is None:
            starter = ""  # the starter spec alone was slower
        report.slower(log, proof, left_out)
        if left_out is None and not best:
            os.remove(spec_path)
            without = proved_without_spec(prepared, log, custom_spec)
            without["no_spec"] = (
                f"no tuning spec: the tuned model was slower ({proof['verdict_text']})"
            )
            return None, {}, without


def write_run_spec(prepared: Prepared, best: list, starter: str):
    """(the spec's path or None, problem name -> the configuration its dispatches must carry,
    or None: each its own winner's). A model tuned on buckets gets the spec that serves its
    dynamic model (model/buckets.py: one entry per dynamic root, its lengths left free)."""
    if prepared.buckets is None:
        return write_spec(prepared.paths.spec, best, starter), None
    entries = bucket_spec(prepared.buckets, prepared.problems, prepared.target)
    header = entries.header(prepared.buckets)
    path = write_spec(prepared.paths.spec, entries.best, starter, entries.free, header)
    return path, entries.expected


def kept_if_faster(spec_path: str, applied: dict, proof: dict, log: RunLog):
    """The spec where the model is faster with it; else its file removed and why said."""
    if proof["verdict"] == FASTER:
        proof["spec_written"] = True
        return spec_path, applied, proof
    os.remove(spec_path)
    proof["no_spec"] = report.no_spec(log, proof)
    return None, {}, proof


def proved_without_spec(prepared: Prepared, log: RunLog, custom_spec: str | None) -> dict:
    """The proof with no spec: of the model's layout where that is not slower than IREE's
    default of the model as given, else of the model as given."""
    config, target, layout = prepared.config, prepared.target, prepared.layout
    with prepared.clock.phase("proof"):
        proof = proved(layout, target, None, config, log, custom_spec, prepared.buckets)
    if not layout.changed or proof["verdict"] != SLOWER:
        return proof
    report.warn(
        log,
        f"WARNING: the model's layout alone is SLOWER than IREE's default "
        f"({proof['verdict_text']}): the model is kept as given",
    )
    kept = replace(layout, source=layout.original)
    with prepared.clock.phase("proof"):
        return proved(kept, target, None, config, log, custom_spec)


def leave_out_least(problems: list[ModelProblem]) -> str | None:
    """Drops the winner expected to save the least model time; its name (None: none left)."""
    winners = [e for e in problems if e.result.best is not None]
    if not winners:
        return None
    least = min(winners, key=lambda e: (e.result.baseline_ms - e.result.best_ms) * e.occurrences)
    least.result.best, least.result.best_ms = None, None
    return least.problem.name


def check_applied(
    model_path: str,
    target: Target,
    spec_path,
    problems: list[ModelProblem],
    log: RunLog,
    cache: str = "",
    expected_configs: dict[str, str] | None = None,
) -> dict[str, bool]:
    """Problem name -> every dispatch of its contraction carries the tuned configuration
    (its winner's, or the one `expected_configs` names), on a root of the form its
    candidates were timed on. With a build `cache` the model is built whole with the spec
    (the proof's tuned build, kept there) and both configurations are read from the
    builds' phases (model_build.py)."""
    if not spec_path:
        return {}
    flags, known = target.compile_flags(), {}
    if cache:
        spec = tuning_spec_flags(spec_path, target.tuning_spec_flag)
        known = {
            "default": roots_in(model_build(model_path, flags, cache).phase(CONFIGURED)),
            "tuned": roots_in(model_build(model_path, [*flags, *spec], cache).phase(CONFIGURED)),
        }
    configs = spec_coverage(
        model_path, flags, spec_path, spec_flag=target.tuning_spec_flag, **known
    )
    applied = {}
    for entry in problems:
        best = entry.result.best if entry.result else None
        if best is None or not has_config(target, entry.problem, best.point):
            continue  # a custom kernel: not in the spec
        expected = (expected_configs or {}).get(entry.problem.name) or target.for_problem(
            entry.problem
        ).lowering_config(entry.problem, best.point)
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


def run_proof(
    layout: ModelLayout | None,
    target: Target,
    spec_path: str | None,
    config: RunConfig,
    custom_spec: str | None = None,
    work: str | None = None,
    buckets: BucketModel | None = None,
):
    """proof.prove with the run's target, device, seed and timing settings (its builds in
    `work`, by default the run's model/proof folder): IREE's default of the model as given
    against the tuned builds of its layout; each function of a model of several
    (entry_points.prove_model); with `buckets`, the dynamic model on each bucket's inputs
    (bucket_proof.py; no `layout` needed). The whole-model builds come from the build cache
    of the folder above `work` (the run's model folder: prepare's builds)."""
    report.proving(bool(spec_path or custom_spec))
    work = work or os.path.join(config.work_dir, "model", "proof")
    if buckets is not None:
        return prove_buckets(
            buckets,
            target.compile_flags(),
            spec_path,
            target.device,
            custom_spec=custom_spec,
            work_dir=work,
            spec_flag=target.tuning_spec_flag,
            seed=config.seed,
            rounds=PROOF_ROUNDS,
            repetitions=config.repetitions,
            min_time=config.min_time,
            runtime_flags=runtime_flags(config),
            runtime_choices=runtime_flag_choices(config),
        )
    return prove_model(
        layout.source,
        target.compile_flags(),
        spec_path,
        target.device,
        seed=config.seed,
        rounds=PROOF_ROUNDS,
        spec_flag=target.tuning_spec_flag,
        repetitions=config.repetitions,
        min_time=config.min_time,
        work_dir=work,
        custom_spec=custom_spec,
        default_model=layout.original if layout.changed else None,
        runtime_flags=runtime_flags(config),
        runtime_choices=runtime_flag_choices(config),
        inputs=config.inputs,
        build_cache=build_cache(os.path.dirname(os.path.abspath(work))),
        build_choices=fusion_choices(config),
        tokens_from=config.input_file,
    )


def proved(
    layout: ModelLayout,
    target: Target,
    spec_path: str | None,
    config: RunConfig,
    log: RunLog,
    custom_spec: str | None,
    buckets: BucketModel | None = None,
) -> dict:
    """The whole model with and without the spec: its lines, and the summary's numbers
    (with `buckets`: the dynamic model on each bucket's inputs, and `buckets`)."""
    proof = run_proof(layout, target, spec_path, config, custom_spec, buckets=buckets)
    report.proof_lines(log, proof)
    for line in function_lines(proof):  # a model of several functions: each one's line
        report.logged(log, line)
    verdict = proof.verdict
    return {
        "verdict": verdict.verdict if not proof.default_only else None,
        "verdict_text": verdict.describe(),
        "ratio_rounds": list(verdict.ratios),
        "ratio_median": verdict.median,
        "spec_written": False,
        "no_spec": "",
        "inputs": config.inputs or config.buckets or "random",
        "outputs_compared": proof.outputs_compared,
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
        "build_flags": proof.build_flags,
        "build_flags_of": proof.build_flags_of,
        "build_choices": [asdict(c) for c in proof.build_choices],
        **function_fields(proof),
        **bucket_summary(buckets, target, spec_path, config),
    }


def bucket_summary(buckets: BucketModel | None, target: Target, spec_path, config) -> dict:
    """The summary's `buckets` (bucket_proof.bucket_fields); empty without buckets."""
    if buckets is None:
        return {}
    work = os.path.join(config.work_dir, "model")
    flags, spec_flag = target.compile_flags(), target.tuning_spec_flag
    return {"buckets": bucket_fields(buckets, flags, spec_path, spec_flag, work)}
