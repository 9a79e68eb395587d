"""The `autosched` command line: `run` tunes a module, `simulate` replays a landscape."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click

from autosched import interrupts
from autosched.analysis import Analysis, analyze_file
from autosched.config import (
    EXECUTORS,
    MODES,
    TARGETS,
    TUNERS,
    RunConfig,
    load_config,
    with_overrides,
)
from autosched.errors import UserError
from autosched.host import device_problem, measuring_devices
from autosched.model import is_model
from autosched.records import Trial
from autosched.run_paths import RunPaths, check_paths
from autosched.runlock import RunLock, lock_paths
from autosched.runner import ProblemResult, Progress, Tuning, summary_rows
from autosched.verify import memory_problem

EXIT_INTERRUPTED = 130


class BarProgress(Progress):
    """One click progress bar per problem, showing the last measured configuration."""

    def __init__(self):
        self.bar = None

    def start(self, problem, total: int) -> None:
        self.finish()
        self.bar = click.progressbar(
            length=total,
            label=f"{problem.name:<40}",
            item_show_func=lambda text: text,
            file=sys.stderr,
        )

    def advance(self, trial: Trial) -> None:
        if self.bar is not None:
            shown = f"{trial.config}: " + (
                f"{trial.median_ms:.4g} ms" if trial.ok else trial.status
            )
            self.bar.update(1, shown)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.render_finish()
            self.bar = None

    def note(self, message: str) -> None:
        click.echo(click.style(f"\nwarning: {message}", fg="red", bold=True), err=True)

    def retiming(self, problem, index: int, total: int) -> None:
        self.finish()
        click.echo(f"re-timing the finalists of {problem.name} ({index}/{total})", err=True)

    def start_model(self, label: str, total: int) -> None:
        """One bar for a whole model, whose problems are searched in turns."""
        self.finish()
        self.bar = click.progressbar(
            length=total, label=label, item_show_func=lambda text: text, file=sys.stderr
        )


def _log_analysis(tuning: Tuning, config: RunConfig, analysis: Analysis) -> None:
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


def _prepare(config: RunConfig, input_file: str | None):
    from autosched.targets import make_target

    path = input_file or config.input_file
    if not path:
        raise UserError("no input file: give FILE.mlir or set [Env] input_file in the cfg")
    config = with_overrides(config, input_file=path)
    target = make_target(config)
    target.check_search_space(config)
    analysis = analyze_file(path)
    for problem in list(analysis.problems):
        reason = target.supports(problem) or memory_problem(problem)
        if reason:
            analysis.problems.remove(problem)
            click.echo(f"skipping {problem.name}: {reason}", err=True)
    if not analysis.problems:
        raise UserError(f"{path}: no matmul in the module can be tuned for target {target.name}")
    return config, target, analysis


def _dry_run(config: RunConfig, target, analysis: Analysis) -> None:
    """Analysis, spaces and variant files, with no compiler run."""
    from autosched.manifest import kernel_variant, variant_path, write_text
    from autosched.runner import space_tuner
    from autosched.space import build_space

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
            write_text(path, kernel_variant(problem, target, point))
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


def _export_best(paths: RunPaths, target, results: list[ProblemResult]) -> tuple[str, str | None]:
    """The input module with the winners attached, the same winners as a tuning spec, and
    custom-kernel winners (which no lowering configuration can carry) as a preprocessing
    spec that substitutes their kernels."""
    from autosched.manifest import tuned_input_module, write_text
    from autosched.spec import write_spec

    best = [(r.problem, target, r.best.point) for r in results if r.best is not None]
    custom = [(problem, point) for problem, _, point in best if not target.in_spec(point)]
    if custom or os.path.exists(paths.custom_spec):
        from autosched.substitution import SPEC_FLAG, write_substitution

        for why in write_substitution(paths.custom_spec, custom, target):
            click.echo(f"warning: a custom-kernel winner stays out of every spec: {why}", err=True)
        if os.path.exists(paths.custom_spec):
            click.echo(
                f"custom-kernel winners: add {SPEC_FLAG}={paths.custom_spec} to iree-compile "
                "(they replace their ops before IREE forms dispatches)",
                err=True,
            )
    module = write_text(paths.best_module, tuned_input_module(paths.input_file, best))
    return module, write_spec(paths.spec, best, target.config.starter_spec)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="autosched")
def cli() -> None:
    """Auto-scheduler for the matmuls of a model or an MLIR module, built on IREE."""


@cli.command()
@click.argument("input_file", required=False, metavar="FILE.mlir")
@click.option("--config", "config_path", help="cfg file (default: ./auto-scheduler.cfg if present)")
@click.option("--target", type=click.Choice(TARGETS), help="backend to tune for")
@click.option("--arch", help="GPU architecture for --target cuda: sm_80, sm_86, sm_89, sm_90 ...")
@click.option("--device", help="IREE device URI for timing (default: local-task or cuda)")
@click.option("--tuner", type=click.Choice(TUNERS), help="search strategy")
@click.option("--n-trial", type=int, help="candidates to measure per matmul problem")
@click.option("--jobs", type=int, help="parallel compiles (default: all cores)")
@click.option("--output", "output_file", help="CSV report path")
@click.option("--seed", type=int, help="seed for the tuner and the random inputs")
@click.option(
    "--early-stopping", type=int, help="stop a problem after N trials without improvement"
)
@click.option(
    "--resume/--fresh",
    default=True,
    help="skip points the tuning database already holds and seed the tuner with them "
    "(default), or ignore the database",
)
@click.option(
    "--dry-run", is_flag=True, help="analyze, build the space, write variants; compile nothing"
)
@click.option("--starter-spec", help="a tuning spec of yours to merge with the tuned one")
@click.option("--budget", type=int, help="models: total trials over all problems")
@click.option("--time-budget", type=float, help="models: wall-clock minutes for the search")
@click.option("--mode", type=click.Choice(MODES), help="models: fast, normal or extreme budget")
@click.option(
    "--devices", help="measure on several devices: cuda://0,cuda://1 or all (one worker each)"
)
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    help="local: this host's cores and devices (default); ray: a Ray cluster",
)
@click.option("--ray-address", help="the Ray cluster for --executor ray (default: auto)")
@click.option(
    "--parallel-problems",
    type=int,
    help="problems searched at once (default: two per measuring device on a GPU)",
)
def run(input_file, config_path, resume, dry_run, **overrides) -> None:
    """Tune the matmuls of FILE.mlir, or a whole model (.onnx, .mlirbc, torch/linalg MLIR)."""
    config = with_overrides(load_config(config_path), **overrides)
    path = input_file or config.input_file
    if path and os.path.isfile(path) and is_model(path):
        from autosched.model_run import run_model

        run_model(with_overrides(config, input_file=path), resume, dry_run, BarProgress())
        return
    config, target, analysis = _prepare(config, input_file)
    if dry_run:
        _dry_run(config, target, analysis)
        return
    paths = RunPaths.of(config)
    with guarded_run(config, target, paths):
        _tune(config, target, analysis, paths, resume)


@contextmanager
def guarded_run(config: RunConfig, target, paths: RunPaths) -> Iterator[None]:
    """What every measuring run needs around it: its paths checked, the device opened once,
    the work folder locked, signals handled, and OS errors turned into one Error: line."""
    check_paths(paths)
    lock = None
    try:
        if config.executor == "local":  # a Ray cluster's actors open their own devices
            target.check_device()
            for device in measuring_devices(config, target.device, target.machine):
                problem = device_problem(device)
                if problem:
                    raise UserError(f"device {device!r} cannot be opened here: {problem}")
        lock = RunLock(lock_paths(config.work_dir, config.database))
        interrupts.install()
        yield
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        raise UserError(
            f"{where}{error.strerror or error}; every measurement made so far is in "
            f"{config.database}"
        ) from None
    finally:
        interrupts.restore()
        if lock is not None:
            lock.release()


def exit_interrupted(interrupt: KeyboardInterrupt, config: RunConfig, log, progress) -> None:
    """One line, then the exit code of the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    progress.finish()
    name = "SIGTERM" if getattr(interrupt, "signum", 0) == signal.SIGTERM else "interrupted"
    log.write(f"{name}: every trial measured so far is in the CSV and the database")
    click.echo(
        f"\n{name}: measurements kept in {config.output_file} and {config.database}; "
        "run the same command again to resume",
        err=True,
    )
    sys.exit(getattr(interrupt, "exit_code", EXIT_INTERRUPTED))


def _tune(config: RunConfig, target, analysis: Analysis, paths: RunPaths, resume: bool) -> None:
    tuning = Tuning(config, target, resume=resume)
    _log_analysis(tuning, config, analysis)
    for skipped in analysis.skipped:
        click.echo(
            f"skipping {skipped.site.location} @{skipped.site.function}: {skipped.reason}", err=True
        )
    click.echo(
        f"tuning {len(analysis.problems)} matmul problem(s) on {target.describe()} "
        f"with the {config.tuner} tuner, {config.n_trial} trials each",
        err=True,
    )
    start = time.perf_counter()
    progress = BarProgress()
    try:
        results = tuning.run(analysis, progress)
    except KeyboardInterrupt as interrupt:
        exit_interrupted(interrupt, config, tuning.log, progress)
    best_path, spec_path = _export_best(paths, target, results)
    summary = summary_rows(results)
    tuning.log.section("result")
    tuning.log.write(summary)
    tuning.log.write(f"search time: {time.perf_counter() - start:.1f} s")
    tuning.log.write(f"tuned module: {best_path}; tuning spec: {spec_path}")
    click.echo(summary)
    click.echo(f"\nCSV: {config.output_file}  log: {config.log_file}  tuned module: {best_path}")
    if spec_path:
        click.echo(
            f"tuning spec for any model: iree-compile MODEL.mlir "
            f"{' '.join([*target.compile_flags(), *target.spec_flags(spec_path)])}"
        )
        if target.module_attributes():  # sm_90: iree-compile has no flag naming this target
            click.echo(
                f"  (MODEL.mlir must carry the {target.arch} target: copy the module attributes "
                f"of {best_path} onto it, or compile {best_path} itself)"
            )
    elif not os.path.exists(paths.custom_spec):
        click.echo("no tuning spec: nothing beat IREE's default configurations")
    else:
        click.echo("no tuning spec: only custom kernels beat IREE's default configurations")


@cli.command()
@click.argument("model_file", metavar="MODEL")
@click.option("--spec", "spec_path", help="tuning spec to apply (a .mlir file)")
@click.option("--config", "config_path", help="cfg file (default: ./auto-scheduler.cfg if present)")
@click.option("--target", type=click.Choice(TARGETS), help="backend")
@click.option("--arch", help="GPU architecture for --target cuda")
@click.option("--device", help="IREE device URI for the runs")
@click.option("--seed", type=int, help="seed for the random inputs")
@click.option(
    "--custom",
    "custom_spec",
    help="custom-kernel spec of a model run (results.custom.mlir): a third build, with the "
    "kernels in place of their contractions",
)
def apply(model_file, spec_path, config_path, custom_spec, **overrides) -> None:
    """Prove SPEC on MODEL: which dispatches it configures, outputs compared, latency before and
    after (exit 1 when the outputs differ)."""
    from autosched.model_run import apply_spec

    config = with_overrides(load_config(config_path), input_file=model_file, **overrides)
    if not os.path.isfile(model_file):
        raise UserError(f"{model_file}: no such file")
    if not spec_path and not custom_spec:
        raise UserError("give a tuning spec (--spec), a custom-kernel spec (--custom), or both")
    for path, what in ((spec_path, "tuning spec"), (custom_spec, "custom-kernel spec")):
        if path and not os.path.isfile(path):
            raise UserError(f"{path}: no such {what}")
    interrupts.install()
    try:
        apply_spec(config, spec_path, custom_spec)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        interrupts.restore()


try:
    from autosched.simulate import simulate_command

    cli.add_command(simulate_command)
except ImportError:  # pragma: no cover - simulate lands with the xgboost tuner
    pass


def main() -> None:
    """The installed command: any error that escapes is still one line, never a traceback."""
    interrupts.outside_runs()
    try:
        _run_command()
    finally:
        interrupts.shutting_down()


def _run_command() -> None:
    """The command line, with every error turned into its line and exit code."""
    try:
        cli(prog_name="autosched", standalone_mode=False)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except OSError as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(2)
    except Exception as error:  # noqa: BLE001 - the last line of defence against tracebacks
        click.echo(
            f"Error: internal error ({type(error).__name__}: {error}); please report it. "
            "Measurements already made are kept in the tuning database.",
            err=True,
        )
        sys.exit(1)
