"""The search stage of a model run: the IREE route's campaign (one budget over every
problem, each timed on IREE's own dispatch and re-timed at the end) and then the custom
route (the custom families' points on their bare kernels). Ends with the CSV ranked, the
benches stopped and the closing table; an interrupt keeps every measurement and exits."""

from __future__ import annotations

import os
import time
from dataclasses import replace

from autosched.drivers.campaign import run_campaign
from autosched.drivers.custom_route import RouteView, custom_coverage, search_custom_kernels
from autosched.drivers.guard import exit_interrupted
from autosched.drivers.model_stages import report
from autosched.drivers.model_stages.results import Prepared, Searched
from autosched.outputs.report import RunLog
from autosched.run.problem import Progress
from autosched.run.tuning import Tuning


def search(prepared: Prepared, resume: bool, progress: Progress) -> Searched:
    """Both routes searched under the run's budgets; their results on each problem."""
    config, problems = prepared.config, prepared.problems
    clock = prepared.clock
    tuning = Tuning(config, prepared.target, resume=resume, clock=clock)
    log = tuning.log
    log.section(f"model {config.input_file}")
    for entry in problems:
        log.write(f"{entry.problem.name}: runs {entry.occurrences}x")
    for reason, count in prepared.skipped.items():
        log.write(f"not tuned: {count} {reason}")
    time_budget = config.time_budget * 60 if config.time_budget else None
    started = time.perf_counter()
    report.tuning_started(prepared, time_budget)
    progress.start_model(
        f"{os.path.basename(config.input_file):<40}", prepared.budget + len(problems)
    )
    try:
        with clock.phase("search_custom"):  # which problems the custom route searches
            covered = custom_coverage(tuning, problems, prepared.layout.source)
        with clock.phase("search_iree"):
            campaign = run_campaign(
                tuning, problems, progress, prepared.budget, config.mode, time_budget, covered
            )
        with clock.phase("search_custom"):
            deadline = started + time_budget if time_budget is not None else None
            custom = search_custom_kernels(tuning, covered, progress, deadline)
        tuning.log_device_use()
    except KeyboardInterrupt as interrupt:
        tuning.finish()
        exit_interrupted(interrupt, config, log, progress)
    progress.finish()
    results = [entry.result for entry in problems]
    tuning.finish(results, custom.values())
    custom_trials = sum(len(r.trials) - r.resumed for r in custom.values())
    campaign = replace(campaign, skipped=prepared.skipped, custom_trials=custom_trials)
    searched = list({id(r): r for r in custom.values()}.values())  # shared op forms once
    report.results_table(log, results, searched)
    return Searched(log, campaign, custom, measured=tuning.measured)


def dry_coverage(prepared: Prepared) -> dict:
    """What the custom route would search (custom_route.custom_coverage), for a dry run:
    nothing is measured; why a family is not searched goes to run.log."""
    view = RouteView(prepared.target, prepared.config, RunLog(prepared.paths.log))
    return custom_coverage(view, prepared.problems, prepared.layout.source)
