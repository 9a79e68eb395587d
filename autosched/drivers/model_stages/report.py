"""Everything a model run (and `autosched apply`) prints, and the report stage: the share
table, every dispatch timed before and after, the summary JSON, the commands that build the
tuned model and the budget line. The other stages print only through this module.

Results go to stdout (and run.log where the run has one); progress notes and warnings to
stderr, warnings in red."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import replace

import click

from autosched.config import RunConfig
from autosched.drivers.campaign import CampaignReport, write_summary
from autosched.drivers.custom_route import custom_build_dispatches, custom_commands, custom_line
from autosched.drivers.dispatch_table import (
    DispatchRow,
    dispatch_lines,
    dispatch_summary,
    outside_line,
    plot_dispatches,
    time_dispatches,
)
from autosched.drivers.model_stages.results import Decided, Prepared, Searched
from autosched.drivers.proof import FASTER
from autosched.model.configured import DispatchConfig
from autosched.model.lowering import ModelAnalysis
from autosched.outputs.commands import TUNED_VMFB, shell_line, tuned_model_steps
from autosched.outputs.report import (
    CUSTOM_NOTE,
    RunLog,
    not_tuned_reason,
    rechoose_csv,
    summary_rows,
    table,
)
from autosched.rewrite.placement import replaced_line
from autosched.run.phases import candidate_split, time_lines
from autosched.run.problem import BASELINE, ProblemResult
from autosched.search.space import fitted_space
from autosched.targets.base import Target


def note(line: str) -> None:
    """A progress note or a line about the model, on stderr."""
    click.echo(line, err=True)


def say(line: str) -> None:
    """A result line, on stdout."""
    click.echo(line)


def logged(log: RunLog, line: str, gap: bool = False) -> None:
    """A result line in run.log and on stdout (after an empty line with `gap`)."""
    log.write(line)
    click.echo("\n" + line if gap else line)


def warn(log: RunLog, message: str) -> None:
    """A warning in run.log and, in red, on stderr."""
    log.write(message)
    click.echo(click.style(message, fg="red", bold=True), err=True)


# ----- prepare ------------------------------------------------------------------------


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


def model_found(lines: list[str]) -> None:
    """The model's types, its layout and its problems (empty lines left out)."""
    for line in filter(None, lines):
        note(line)


def space_line(problem, target: Target, config: RunConfig) -> str:
    """`problem: N points, V valid` and, for an empty space, why (a dry run's view)."""
    space, why = fitted_space(problem, target, config.knob_space)
    line = f"  {problem.name}: {space.total} points, {len(space.points)} valid"
    return line + (f"; {why.removeprefix(problem.name + ': ')}" if why else "")


def dry_run(prepared: Prepared, covered: dict) -> None:
    """Each problem's space, the custom kernels that will search it (`covered`:
    custom_route.custom_coverage) and the budget; no candidate is compiled."""
    config, target = prepared.config, prepared.target
    for entry in prepared.problems:
        line = space_line(entry.problem, target, config)
        families = custom_families(target, covered.get(entry.problem.name) or entry.problem)
        say(line + (f"; custom kernels: {', '.join(families)}" if families else ""))
    say(f"budget: {prepared.budget} trials ({config.mode} mode); nothing compiled")


def custom_families(target: Target, problem) -> list[str]:
    """The custom families that will search `problem` (an attention's or a convolution's
    op form, where the custom route takes one), by name."""
    view = target.for_problem(problem)
    families = getattr(view, "kernel_families", list)()
    return [f.name for f in families if f.why_not(view, problem) is None]


# ----- search -------------------------------------------------------------------------


def tuning_started(prepared: Prepared, time_budget_s: float | None) -> None:
    config = prepared.config
    note(
        f"tuning {len(prepared.problems)} problem(s) on {prepared.target.describe()}: "
        f"{prepared.budget} trials in all ({config.mode} mode, {config.tuner} tuner)"
        + (f", at most {config.time_budget:g} min" if time_budget_s else "")
    )


def results_table(
    log: RunLog, results: list[ProblemResult], custom: list[ProblemResult] = ()
) -> None:
    """The closing table of every problem's search, then the custom route's (fast mode
    runs no IREE candidate of a problem a custom family covers: its row of the first
    table is IREE's default, its kernel is in the second)."""
    summary = summary_rows(results)
    log.section("result")
    logged(log, summary)
    if custom:
        logged(log, summary_rows(custom, CUSTOM_NOTE))


# ----- decide -------------------------------------------------------------------------


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
    whose = "each function" if "; " in chosen else "this model"
    return [f"runtime flags: `{chosen}`, the fastest for {whose} ({'; '.join(named)})"]


def build_flags_line(proof) -> list[str]:
    """Which compile flags the reported build took (`dispatch_fusion`) and each choice's
    time of it (none without a choice)."""
    if len(proof.build_choices) < 2:
        return []
    named = [
        f"`{c.flags or 'IREE default formation'}` "
        + (f"{c.ms:.4g} ms" if c.ms is not None else "did not build or agree")
        for c in proof.build_choices
    ]
    chosen = proof.build_flags or "IREE's default formation"
    return [f"dispatch fusion: `{chosen}`, the faster for this model ({'; '.join(named)})"]


def model_line(proof) -> str:
    """`model: A ms -> B ms (S x: faster (5 paired rounds, L x-H x)), outputs match (max error
    E)`, or the default's time alone: the verdict of proof.ModelVerdict, the one every
    decision and file of the run follows."""
    if proof.default_only:
        return f"model: {proof.default_ms:.4g} ms (IREE default; nothing faster)"
    tuned = f"{proof.tuned_ms:.4g} ms" if proof.tuned_ms else "no time"
    verdict = f" ({proof.verdict.describe()})" if proof.tuned_rounds_ms else ""
    if not proof.outputs_compared:
        answer = f"outputs could not be compared: {proof.message}"
    elif proof.outputs_match:
        answer = f"outputs match (max error {proof.max_error or 0:.2g})"
    else:
        answer = f"OUTPUTS DIFFER: {proof.message}"
    return f"model: {proof.default_ms:.4g} ms -> {tuned}{verdict}, {answer}"


def slower(log: RunLog, proof: dict, left_out: str | None) -> None:
    """The warning of a spec whose model proved slower, and what happens to it."""
    warn(
        log,
        f"WARNING: the tuned model is SLOWER than IREE's default ({proof['verdict_text']}): "
        + (f"{left_out} left out of the spec" if left_out else "no spec is written"),
    )


def no_spec(log: RunLog, proof: dict) -> str:
    """The line (and the summary's reason) for a spec not kept: the model is not faster
    beyond the rounds' noise."""
    line = (
        f"no tuning spec: the tuned model is not faster beyond the rounds' noise "
        f"({proof['verdict_text']}); IREE's default stays. A quieter machine or a larger "
        "budget may tell"
    )
    logged(log, line)
    return line


def proof_lines(log: RunLog, proof) -> None:
    """The whole model's line, the custom kernels' and the runtime flags'."""
    lines = [model_line(proof), *([custom_line(proof.custom)] if proof.custom else [])]
    for line in [*lines, *build_flags_line(proof), *runtime_line(proof)]:
        logged(log, line)


def placement(log: RunLog, not_placed: list, replaced: dict[str, int]) -> None:
    """The custom build's replaced ops per kind, and a warning for each problem whose
    winner is not in the built model (rewrite/placement.py)."""
    if replaced:
        logged(log, replaced_line(replaced))
    for missing in not_placed:
        warn(log, missing.line())


def proving(with_spec: bool) -> None:
    note(f"{'proving the spec on' if with_spec else 'timing'} the whole model ...")


def outputs_differ(proof: dict | None) -> bool:
    """Whether the tuned build's outputs were compared with the default's and differ."""
    if not proof or proof.get("default_only") or not proof.get("outputs_compared", True):
        return False
    return proof.get("outputs_match") is False


# ----- apply --------------------------------------------------------------------------


def spec_coverage(configs: list[DispatchConfig]) -> None:
    """Which contraction dispatches the spec configures (`autosched apply`)."""
    changed = [c for c in configs if c.changed]
    say(f"{len(changed)} of {len(configs)} contraction dispatch(es) configured by the spec")
    for c in configs:
        state = "spec" if c.changed else "IREE default"
        say(f"  {c.entry_point}: {c.contraction} ({state})")


def applied_proof(proof) -> bool:
    """`autosched apply`'s whole-model line (and the custom kernels'), with the verdict a run
    acts on (a run keeps a spec only where it says faster); whether outputs were compared
    and differ (its exit 1)."""
    say(model_line(proof))
    if proof.custom:
        say(custom_line(proof.custom))
    custom_differs = proof.custom is not None and not proof.custom.outputs_match
    return proof.outputs_compared and (not proof.outputs_match or custom_differs)


# ----- report -------------------------------------------------------------------------


def share_table(rows: list[dict]) -> str:
    """Each problem's share before and after and where those numbers come from: the
    problem's own dispatches inside the model (the dispatch table) where that ran, else
    each problem's dispatch benchmark timed alone, as the footnote says."""
    in_model = any(row.get("model_share") is not None for row in rows)
    if in_model:
        headers = ["problem", "runs", "model share before", "after", "speedup in model"]
        note = "(shares and speedups: the problem's own dispatches in the model's dispatch table)"
    else:
        headers = ["problem", "runs", "share before", "share after"]
        note = (
            "(shares: of the tuned problems' time, each problem's dispatch timed alone as "
            "IREE's dispatch benchmark, not inside the model)"
        )
    cells = []
    for row in rows:
        if in_model:
            speedup = row.get("model_speedup")
            numbers = [
                _percent(row.get("model_share")),
                _percent(row.get("model_share_after")),
                f"{speedup:.2f}x" if speedup else "-",
            ]
        else:
            numbers = [f"{row['share']:.1%}", f"{row['share_after']:.1%}"]
        applied = "yes" if row["applied_in_model"] else ("no" if row["in_spec"] else "-")
        in_spec = "yes" if row["in_spec"] else "no"
        cells.append([row["problem"], str(row["occurrences"]), *numbers, in_spec, applied])
    return table([*headers, "in spec", "applied in model"], cells) + "\n" + note


def _percent(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "-"


def with_model_numbers(rows: list[dict], dispatches: list[dict]) -> None:
    """Each problem's row gets its share of the model's dispatch time before and after the
    spec and its speedup inside the model, from its own rows of the dispatch table (None
    where the table did not run or holds none of its dispatches)."""
    before = sum(d["default_total_ms"] for d in dispatches)
    after = sum(d["tuned_total_ms"] for d in dispatches)
    for row in rows:
        mine = [d for d in dispatches if d["tuned"] == row["problem"]]
        own_before = sum(d["default_total_ms"] for d in mine)
        own_after = sum(d["tuned_total_ms"] for d in mine)
        known = bool(mine) and before > 0 and after > 0
        row["model_share"] = round(own_before / before, 4) if known else None
        row["model_share_after"] = round(own_after / after, 4) if known else None
        row["model_speedup"] = own_before / own_after if known and own_after else None


def not_tuned(log: RunLog, problems, rows: list[dict]) -> dict[str, int]:
    """The problems no candidate could be checked or timed on, each warned of with its
    reason and its share of the model; the summary's `skipped` entries for them."""
    skipped = {}
    for entry, row in zip(problems, rows, strict=True):
        reason = not_tuned_reason(entry.result)
        if not reason:
            continue
        share = row.get("model_share")
        share_text = f"{share:.1%} of the model" if share is not None else "share unknown"
        warn(log, f"not tuned: {entry.problem.name} ({share_text}): {reason}")
        skipped[f"not tuned: {entry.problem.name} ({share_text}): {reason}"] = 1
    return skipped


def chosen_configs(problems, searched: Searched, decided: Decided) -> set[tuple[str, str]]:
    """(problem, config) of what the run finally keeps: a winner in the spec written, a
    custom kernel where they won, else IREE's default."""
    chosen = set()
    for entry, row in zip(problems, decided.rows, strict=True):
        custom = searched.custom.get(entry.problem.name)
        if decided.custom_wins and row["route"] == "custom kernel" and custom and custom.best:
            chosen.add((entry.problem.name, custom.best.config))
        elif row["in_spec"] and entry.result.best:
            chosen.add((entry.problem.name, entry.result.best.config))
        else:
            chosen.add((entry.problem.name, BASELINE))
    return chosen


def whole_model_table(
    prepared: Prepared, log: RunLog, spec_path: str | None, in_spec: frozenset[str] = frozenset()
) -> list[DispatchRow]:
    """Every dispatch of the model timed before and after the spec: a table in run.log and
    on the screen; its rows (none where the cfg turns the table off), those of the problems
    `in_spec` marked as the spec's."""
    config, dispatches = prepared.config, prepared.dispatches
    if not config.times_dispatches or not dispatches.benchmarks:
        return []
    note("timing every dispatch of the model, before and after ...")
    tuned = {s.entry_point: e.problem.name for e in prepared.problems for s in e.contraction.sites}
    changed = frozenset(
        s.entry_point for e in prepared.problems if e.problem.name in in_spec
        for s in e.contraction.sites
    )  # fmt: skip
    rows = time_dispatches(
        dispatches.benchmarks, dispatches.calls, prepared.target, spec_path, config, tuned,
        changed=changed,
    )  # fmt: skip
    text = dispatch_lines(rows)
    log.section("every dispatch")
    logged(log, text, gap=True)
    return rows


def outside(log: RunLog, decided: Decided, rows, custom_rows) -> None:
    """The line saying what the reported build's calls spend beside their dispatches."""
    proof = decided.proof or {}
    if custom_rows:
        line = outside_line("custom", (proof.get("custom") or {}).get("ms"), custom_rows)
    elif decided.spec_path:
        line = outside_line("tuned", proof.get("tuned_ms"), rows or [])
    else:
        line = outside_line("default", proof.get("default_ms"), rows or [])
    if line:
        logged(log, line)


def tuned_model_command(
    path: str, target: Target, spec_path: str | None, extra: Sequence[str] = ()
) -> str:
    """The command that builds the tuned model into the work folder's model.vmfb, as it can
    be pasted (outputs/commands.py), with the compile flags the proof chose (`extra`).
    Without a spec: a model's layout built with IREE's defaults."""
    out = os.path.join(target.config.work_dir, TUNED_VMFB)
    steps = tuned_model_steps(path, target, spec_path, out, extra)
    return "tuned model: " + shell_line(steps)


def budget_line(log: RunLog, campaign: CampaignReport) -> None:
    """The budget counts this run's new trials; the records resumed from the database are
    said apart (a smaller budget on the same folder resumes more than it allows)."""
    custom = f", and {campaign.custom_trials} of custom kernels" if campaign.custom_trials else ""
    resumed = f"; {campaign.resumed} resumed from the database" if campaign.resumed else ""
    logged(
        log,
        f"budget: {campaign.trials} of {campaign.budget} new trials used{resumed} "
        f"({campaign.mode} mode){custom}, search {campaign.search_s:.1f} s",
    )


def dispatch_tables(
    prepared: Prepared, log: RunLog, decided: Decided
) -> tuple[list[dict], list[dict]]:
    """The whole model's dispatches before and after (and with the custom kernels, where
    they won), with what the calls spend beside them and a picture; both tables' rows as
    the summary holds them."""
    config, layout = prepared.config, prepared.layout
    in_spec = frozenset(
        e.problem.name for e, row in zip(prepared.problems, decided.rows, strict=True)
        if row["in_spec"]
    )  # fmt: skip
    rows = whole_model_table(prepared, log, decided.spec_path, in_spec)
    dispatches = dispatch_summary(rows)
    if dispatches and layout.changed:
        logged(
            log,
            "(every dispatch is of the model's layout: its 'before' is IREE's default for "
            "the layout; IREE's default of the model as given is the model line's)",
        )
    custom_rows, custom_dispatches = None, []
    if decided.custom_wins and config.times_dispatches:
        custom_rows = custom_build_dispatches(
            config, prepared.target, log, layout.source, decided.custom_spec, decided.spec_path
        )
        custom_dispatches = dispatch_summary(custom_rows)
    outside(log, decided, rows, custom_rows)
    if rows:
        picture = plot_dispatches(rows, prepared.paths.picture, custom=custom_rows)
        say(f"picture: {picture}" if picture else "a picture of it: pip install '.[plots]'")
    return dispatches, custom_dispatches


def build_commands(prepared: Prepared, log: RunLog, decided: Decided) -> None:
    """The commands that build the tuned model (with its custom kernels where they won),
    only where the model's verdict is faster; or the warning that the custom kernels did
    not win."""
    config, target, layout = prepared.config, prepared.target, prepared.layout
    spec_path, custom_spec = decided.spec_path, decided.custom_spec
    proof = decided.proof or {}
    faster = proof.get("verdict") == FASTER
    proved_layout = layout.changed and not proof.get("default_only")
    chosen = shlex.split(proof.get("build_flags") or "")  # the reported build's

    def extra(build: str) -> list[str]:
        return chosen if proof.get("build_flags_of") == build else []

    if faster and (spec_path or proved_layout):
        built_from = layout.source if proved_layout else config.input_file
        say(tuned_model_command(built_from, target, spec_path, extra("tuned")))
    if not custom_spec:
        return
    if decided.custom_wins:
        work, custom = config.work_dir, extra("custom")
        say(custom_commands(layout.source, target, spec_path, custom_spec, work, custom))
    else:
        warn(
            log,
            f"WARNING: the custom kernels of {custom_spec} did not make the model faster "
            "with the same outputs (see the proof above): build it with the spec alone",
        )


def report(prepared: Prepared, searched: Searched, decided: Decided) -> None:
    """The report stage: the tables, the summary JSON, the commands, the budget line; exit
    1 when the tuned model's outputs differ from IREE's default (as `apply` does: never a
    silent 0), not when they could not be compared (IREE's default gave NaN or inf)."""
    log, paths, proof = searched.log, prepared.paths, decided.proof
    with prepared.clock.phase("dispatch_tables"):
        dispatches, custom_dispatches = dispatch_tables(prepared, log, decided)
    with_model_numbers(decided.rows, dispatches)
    logged(log, share_table(decided.rows), gap=True)
    skipped = not_tuned(log, prepared.problems, decided.rows)
    rechoose_csv(paths.csv, chosen_configs(prepared.problems, searched, decided))
    campaign = replace(
        searched.campaign,
        problems=decided.rows,
        dispatches=dispatches,
        custom_dispatches=custom_dispatches,
        phases_s=prepared.clock.summary(),
        candidates_s=candidate_split(searched.measured),
        not_placed=[missing.row() for missing in decided.not_placed],
        skipped={**searched.campaign.skipped, **skipped},
    )
    summary_path = write_summary(paths.summary, proof, campaign)
    say(f"\nCSV: {paths.csv}  log: {paths.log}  summary: {summary_path}")
    build_commands(prepared, log, decided)
    budget_line(log, campaign)
    for line in time_lines(prepared.clock, searched.measured):
        logged(log, line)
    if outputs_differ(proof):
        log.write("exit 1: the tuned model's outputs differ from IREE's default")
        raise SystemExit(1)
