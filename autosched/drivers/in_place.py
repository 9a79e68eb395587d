"""Custom winners chosen on their kernels as the model runs them, epilogue and all (issue 51).

The custom search times each point on its bare kernel. In the model a matmul winner also
computes the epilogue read around it (a bias, a GELU, a residual add), and that can cost
as much as its main loop: on an H100, ViT-B/16's fc1 (6304x3072x768, bias and erf GELU)
ran its bare winner, a persistent warp-specialized point, in 0.058 ms and in the model in
0.110 ms. Its four MMA warps hold the 128x128 f32 tile and run the epilogue between tiles
(about 34 instructions an element, stack spills beside its 255 registers), while a plain
kernel's next workgroup on the same SM keeps the tensor cores busy through it.

So where a winner's kernel carries an epilogue, the fastest point of each of its family's
epilogue forms (`KernelFamily.epilogue_form`) is built into the model in turn, each round
timed on IREE's dispatch benchmarks of the rewritten model, and each problem keeps the
point fastest in place (its dispatches' time in one model call). Like Inductor's epilogue
fusion benchmarks, the choice is measured, not guessed.
"""

from __future__ import annotations

import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

import click

from autosched.drivers.campaign import ModelProblem
from autosched.drivers.custom_route import (
    EPILOGUE_READING,
    MODEL_READINGS,
    CustomSpec,
    custom_build,
    custom_winner,
    custom_winners,
    iree_ms,
    model_readings,
    write_custom_substitution,
)
from autosched.drivers.dispatch_table import time_dispatches
from autosched.errors import UserError
from autosched.kernels.registry import families_for
from autosched.model.lowering import dispatch_calls
from autosched.outputs.records import Trial
from autosched.rewrite.common import problem_key
from autosched.rewrite.placement import extern_kernels

FORMS = 3  # the winner and the fastest point of each other form (the matmul family's three)


@dataclass(frozen=True)
class Alternative:
    """One point a problem may keep, and its time in place (None: not yet timed)."""

    trial: Trial
    form: str
    in_place_ms: float | None = None


class _Quiet:
    """A log for the rounds' specs: their lines are the final spec's, said once."""

    def write(self, line: str = "") -> None:
        pass


def alternatives(result, forms: int) -> list[Alternative]:
    """The winner, then the fastest correct point of each other epilogue form of its
    family, fastest first, at most `forms`; under IREE's best time where the winner is."""
    winner = result.best
    kinds = [f for f in families_for(result.problem.kind) if f.selects(winner.point)]
    if not kinds:
        return []
    kernels = kinds[0]
    found = {kernels.epilogue_form(winner.point): winner}
    ranked = sorted(
        (t for t in result.trials if t.status == "ok" and t.median_ms and not t.baseline),
        key=lambda t: t.median_ms,
    )
    for trial in ranked:
        if kernels.selects(trial.point):
            found.setdefault(kernels.epilogue_form(trial.point), trial)
    chosen = [Alternative(t, form) for form, t in found.items()]
    return chosen[:forms]


def choose_in_place(
    config, target, problems: list[ModelProblem], custom: dict, model: tuple[str, str], log
) -> dict:
    """`custom` (problem name -> its custom search) with each epilogue-carrying winner's
    point replaced by its alternative fastest in the model; as it was where no winner has
    an epilogue, no other form or the rounds fail to build (said in run.log)."""
    options: dict[str, list[Alternative]] = {}
    for entry in problems:
        result = custom_winner(entry, custom, target)
        if result is not None and result is custom.get(entry.problem.name):
            found = alternatives(result, FORMS) if result.problem.kind == "matmul" else []
            limit = iree_ms(entry)  # an other point must be under it, as the winner is
            found = found[:1] + [a for a in found[1:] if not limit or a.trial.median_ms < limit]
            if len(found) > 1:
                options[entry.problem.name] = found
    if not options:
        return custom
    folder = os.path.join(config.work_dir, "model", "in_place")
    try:
        timed = _rounds(config, target, problems, custom, model, options, folder)
    except (RuntimeError, UserError) as error:
        log.write(f"custom kernels not timed in place: {error}")
        return custom
    if not timed:
        return custom
    chosen = keep_fastest(custom, timed, log)
    moved = sum(chosen[name] is not custom[name] for name in timed)
    measured = sum(found[0].in_place_ms is not None for found in timed.values())
    if measured < len(timed):
        log.write(f"custom kernels in place: {len(timed) - measured} winner(s) did not time")
    click.echo(
        f"custom kernels in place: {measured} of {len(timed)} winner(s) with an epilogue "
        f"timed in the model in each form; {moved} keep another point (run.log says each)",
        err=True,
    )
    return chosen


def _rounds(config, target, problems, custom, model, options, folder) -> dict:
    """Each problem's alternatives with their times in place, for the problems whose
    kernels take an epilogue from the model: round r builds every such problem's r-th
    alternative (its last where it has fewer) into the model. The rounds' specs are written
    one after another (Triton compiles in this process), their models built side by side
    (iree-compile's work), then each round is timed in turn."""
    # What the spec writer reads around the winners' ops depends on their problems alone,
    # the same in every round: read once, in the run's model folder.
    winners, named = custom_winners(target, problems, custom, _Quiet())
    readings = model_readings(model, winners, target, _Quiet())
    epilogues = readings[MODEL_READINGS.index(EPILOGUE_READING)] or {}
    taking = {named[p.name] for p, _ in winners if epilogues.get(problem_key(p))}
    options = {name: found for name, found in options.items() if name in taking}
    if not options:
        return {}
    click.echo("timing the custom winners with an epilogue in the model, each form ...", err=True)
    rounds = max(len(found) for found in options.values())
    specs = []
    for index in range(rounds):
        trying = {
            name: replace(custom[name], best=a.trial, best_ms=a.trial.median_ms)
            for name, found in options.items()
            for a in [found[min(index, len(found) - 1)]]
        }
        path = os.path.join(folder, str(index), "custom.mlir")
        built = {**custom, **trying}
        spec = write_custom_substitution(path, target, problems, built, _Quiet(), model, readings)
        if spec.path is None:
            raise RuntimeError("a round wrote no substitution spec")
        specs.append(spec)
    with ThreadPoolExecutor(rounds) as pool:
        builds = list(pool.map(partial(_build, config, target, model[0], set(options)), specs))
    for index, built in enumerate(builds):
        times = _timed(built, config, target)
        for name, found in options.items():
            if index < len(found) and name in times:
                found[index] = replace(found[index], in_place_ms=times[name])
    return options


@dataclass
class _Build:
    """One round's model, built: the custom dispatch benchmarks of the problems it times,
    their launches per model call, and whose kernel each runs."""

    benchmarks: dict
    calls: dict[str, int]
    problem_of: dict[str, str]  # dispatch -> the problem whose kernel it runs
    folder: str


def _build(config, target, model_path: str, names: set, spec: CustomSpec) -> _Build:
    """The model with `spec`'s kernels in place, beside the spec: the dispatch benchmarks
    of the kernels of the problems in `names`."""
    folder = os.path.dirname(spec.path)
    lowered, benchmarks = custom_build(model_path, spec.path, target, folder, config)
    winner_of = {w.kernel: w.problem for w in spec.winners if w.problem in names}
    problem_of = {
        entry: winner_of[kernel.split(".")[0]]
        for entry, kernel in extern_kernels(lowered).items()  # kernel: "{winner}.{form}"
        if kernel.split(".")[0] in winner_of
    }
    timed = {entry: b for entry, b in benchmarks.items() if entry in problem_of}
    return _Build(timed, dispatch_calls(lowered), problem_of, folder)


def _timed(built: _Build, config, target) -> dict[str, float]:
    """Problem -> its kernels' time in one call of the round's model (a problem with a
    dispatch whose build or timing failed has none)."""
    rows = time_dispatches(built.benchmarks, built.calls, target, None, config, {}, built.folder)
    times: dict[str, float] = defaultdict(float)
    failed = set()
    for row in rows:
        problem = built.problem_of[row.entry_point]
        if row.default_ms is None:
            failed.add(problem)
        else:
            times[problem] += row.default_total
    return {name: ms for name, ms in times.items() if name not in failed}


def keep_fastest(custom: dict, timed: dict[str, list[Alternative]], log) -> dict:
    """`custom` with each timed problem's fastest alternative in place as its best."""
    chosen = dict(custom)
    for name, found in timed.items():
        measured = [a for a in found if a.in_place_ms is not None]
        if found[0].in_place_ms is None:  # the winner's own time in place is the yardstick
            continue
        best = min(measured, key=lambda a: a.in_place_ms)
        times = ", ".join(f"{a.trial.config} ({a.form}) {a.in_place_ms:.4g} ms" for a in measured)
        log.write(f"{name}: its custom kernels in the model, epilogue and all: {times}")
        if best.trial is not custom[name].best:
            log.write(f"{name}: keeps {best.trial.config}, the fastest in place")
            chosen[name] = replace(custom[name], best=best.trial, best_ms=best.trial.median_ms)
    return chosen
