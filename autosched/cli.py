"""The `autosched` command line: `run` tunes a model or module, `apply` proves a spec on a
model, `compile` builds the tuned model, `simulate` replays a landscape."""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import time
import traceback

import click

from autosched import interrupts
from autosched.config import (
    EXECUTORS,
    MODES,
    TARGETS,
    TUNERS,
    load_config,
    with_overrides,
)
from autosched.drivers.campaign import EXTREME_FACTOR, FAST_TRIALS
from autosched.drivers.guard import signal_name
from autosched.errors import UserError, require_file
from autosched.measure.input_files import input_files
from autosched.model.lowering import is_model
from autosched.outputs.records import Trial
from autosched.outputs.report import RunLog
from autosched.run.problem import Progress


def _joined_inputs(context, parameter, values: tuple[str, ...]) -> str | None:
    """`--inputs` given once or more, as the cfg's `inputs` holds it: one `.npz`, or `.npy`
    files in argument order joined by commas (`module_io.input_files` splits them again).
    A file that is not there is one `Error:` line naming it (exit 2)."""
    files = [name for value in values for name in input_files(value)]
    for name in files:
        require_file(name)
    return ",".join(files) if files else None


def inputs_option(purpose: str):
    """`--inputs`, repeatable: the model's inputs for `purpose`."""
    return click.option(
        "--inputs",
        multiple=True,
        callback=_joined_inputs,
        metavar="FILE",
        help="models: the model's inputs, as one .npz file (np.savez's arr_0, arr_1, ... in "
        "argument order, or named like the arguments) or one .npy file per argument in "
        f"argument order (--inputs a.npy --inputs b.npy, or a.npy,b.npy), {purpose}",
    )


def _joined_buckets(context, parameter, values: tuple[str, ...]) -> str | None:
    """`--bucket` given once or more, comma-joined as the cfg's `buckets` holds them; a file
    that is not there is one `Error:` line naming it (exit 2)."""
    files = [name.strip() for value in values for name in value.split(",") if name.strip()]
    for name in files:
        require_file(name)
    return ",".join(files) if files else None


BUCKET_OPTION = click.option(
    "--bucket",
    "buckets",
    multiple=True,
    callback=_joined_buckets,
    metavar="FILE.npz",
    help="models exported with a dynamic length: the inputs of one length (np.savez, in "
    "argument order); repeat it for each length to tune on. One spec serves the dynamic "
    "model at every length, proved on each bucket's inputs (docs/causal-lm.md)",
)

INPUTS_OPTION = inputs_option(
    "for every whole-model check and timing (default: seeded random inputs)"
)


class BarProgress(Progress):
    """One click progress bar per problem, showing the last measured configuration. When
    stderr is no terminal (CI, `| tee`, nohup) the bar cannot redraw: a line every tenth of
    the work, and at least every LINE_EVERY_S seconds, says how far the run is."""

    LINE_EVERY_S = 5.0

    def __init__(self):
        self.bar = None
        self.lines = not sys.stderr.isatty()
        self.done = self.total = 0
        self.last_line = time.monotonic()

    def _open(self, label: str, total: int) -> None:
        self.finish()
        self.done, self.total, self.last_line = 0, total, time.monotonic()
        self.bar = click.progressbar(
            length=total, label=label, item_show_func=lambda text: text, file=sys.stderr
        )

    def start(self, problem, total: int) -> None:
        self._open(f"{problem.name:<40}", total)

    def advance(self, trial: Trial) -> None:
        if self.bar is None:
            return
        shown = f"{trial.config}: " + (f"{trial.median_ms:.4g} ms" if trial.ok else trial.status)
        self.bar.update(1, shown)
        self.done += 1
        tenth = self.done * 10 // max(self.total, 1) > (self.done - 1) * 10 // max(self.total, 1)
        if self.lines and (tenth or time.monotonic() - self.last_line >= self.LINE_EVERY_S):
            self.last_line = time.monotonic()
            click.echo(f"  {self.done}/{self.total} measured; last {shown}", err=True)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.render_finish()
            self.bar = None

    def note(self, message: str) -> None:
        click.echo(click.style(f"\nwarning: {message}", fg="red", bold=True), err=True)

    def info(self, message: str) -> None:
        click.echo(f"\nnote: {message}", err=True)

    def retiming(self, problem, index: int, total: int) -> None:
        self.finish()
        click.echo(f"re-timing the finalists of {problem.name} ({index}/{total})", err=True)

    def start_model(self, label: str, total: int) -> None:
        """One bar for a whole model, whose problems are searched in turns."""
        self._open(label, total)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="autosched")
def cli() -> None:
    """Auto-scheduler for the root ops of a model or an MLIR module (matmuls and other
    contractions, attention, convolutions), built on IREE."""


@cli.command()
@click.argument("input_file", required=False, metavar="[FILE]")
@click.option("--config", "config_path", help="cfg file (default: ./auto-scheduler.cfg if present)")
@click.option("--target", type=click.Choice(TARGETS), help="backend to tune for")
@click.option("--arch", help="GPU architecture for --target cuda: sm_80, sm_86, sm_89, sm_90 ...")
@click.option("--device", help="IREE device URI for timing (default: local-task or cuda)")
@click.option(
    "--tuner",
    type=click.Choice(TUNERS),
    help="search strategy (default: xgboost, a cost model that picks what to measure next)",
)
@click.option(
    "--n-trial",
    type=int,
    help="candidates to measure per problem, a problem being one op shape to tune (default: "
    "the cfg's n_trial, 32)",
)
@click.option("--jobs", type=int, help="parallel compiles (default: all cores)")
@click.option(
    "--output",
    "output_file",
    help="CSV report path; the spec and summary go beside it (default: results.csv in "
    "generated/<FILE's stem>/, the run's work folder)",
)
@click.option("--seed", type=int, help="seed for the tuner and the random inputs")
@INPUTS_OPTION
@BUCKET_OPTION
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
    "--dry-run",
    is_flag=True,
    help="list the problems found and the size of each one's search space; compile nothing",
)
@click.option("--starter-spec", help="a tuning spec of yours to merge with the tuned one")
@click.option(
    "--budget",
    type=int,
    help="models: total trials over all problems (default: from --mode, n_trial per problem "
    "in normal mode)",
)
@click.option("--time-budget", type=float, help="models: wall-clock minutes for the search")
@click.option(
    "--mode",
    type=click.Choice(MODES),
    help=f"models, without --budget: fast ({FAST_TRIALS} trials a problem, each ending at its "
    f"first 10% win), normal (n_trial a problem; the default) or extreme ({EXTREME_FACTOR} x "
    "n_trial a problem)",
)
@click.option(
    "--devices", help="measure on several devices: cuda://0,cuda://1 or all (one worker each)"
)
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    help="local: this host's cores and devices (default); ray: a Ray cluster",
)
@click.option(
    "--ray-address",
    help="the Ray cluster for --executor ray: local (a private one of this host, on the "
    "loopback alone), HOST:PORT (a cluster you started), or auto (the default: Ray's lookup, "
    "RAY_ADDRESS, else the cluster `ray start` last started here). A Ray cluster runs any "
    "code from anyone who reaches its ports, with no authentication unless Ray's token is "
    "on: keep it on a private network, with Ray's own token authentication and TLS (README)",
)
@click.option(
    "--parallel-problems",
    type=int,
    help="problems searched at once (default: two per measuring device on a GPU)",
)
def run(input_file, config_path, resume, dry_run, **overrides) -> None:
    """Tune the heavy ops of FILE, the op each of IREE's dispatches is built around (its
    root op: matmuls and other contractions, attention, convolutions): a whole model (.onnx,
    .mlirbc, torch or linalg MLIR) or a module of bare matmuls (.mlir); without FILE, the
    cfg's [Env] input_file. Its files go to generated/<FILE's stem>/ unless --output or the
    cfg name them."""
    config = with_overrides(load_config(config_path), **overrides)
    path = input_file or config.input_file
    if path and os.path.isfile(path) and is_model(path):
        from autosched.drivers.model_run import run_model  # noqa: PLC0415 - imported after the signal handlers are set

        run_model(with_overrides(config, input_file=path), resume, dry_run, BarProgress())
        return
    from autosched.drivers.module_run import run_module  # noqa: PLC0415 - imported after the signal handlers are set

    run_module(config, input_file, resume, dry_run, BarProgress())


@cli.command()
@click.argument("model_file", metavar="MODEL")
@click.option("--spec", "spec_path", help="tuning spec to apply (a .mlir file)")
@click.option("--config", "config_path", help="cfg file (default: ./auto-scheduler.cfg if present)")
@click.option("--target", type=click.Choice(TARGETS), help="backend")
@click.option("--arch", help="GPU architecture for --target cuda")
@click.option("--device", help="IREE device URI for the runs")
@click.option("--seed", type=int, help="seed for the random inputs")
@INPUTS_OPTION
@BUCKET_OPTION
@click.option(
    "--custom",
    "custom_spec",
    help="custom-kernel spec of a model run (results.custom.mlir): a third build, with the "
    "kernels in place of their contractions",
)
def apply(model_file, spec_path, config_path, custom_spec, **overrides) -> None:
    """Prove SPEC on MODEL: which dispatches it configures, outputs compared, latency before and
    after (exit 1 when the outputs differ)."""
    from autosched.drivers.model_run import apply_spec  # noqa: PLC0415 - imported after the signal handlers are set

    config = with_overrides(load_config(config_path), input_file=model_file, **overrides)
    require_file(model_file)
    if not spec_path and not custom_spec:
        raise UserError("give a tuning spec (--spec), a custom-kernel spec (--custom), or both")
    for path, what in ((spec_path, "tuning spec"), (custom_spec, "custom-kernel spec")):
        if path and not os.path.isfile(path):
            raise UserError(f"{path}: no such {what}")
    interrupts.install()
    try:
        apply_spec(config, spec_path, custom_spec)
    except KeyboardInterrupt as interrupt:
        click.echo(signal_name(interrupt), err=True)
        sys.exit(interrupts.exit_code_of(interrupt))
    finally:
        interrupts.restore()


@cli.command("compile")
@click.argument("model_file", metavar="MODEL")
@click.option(
    "--spec", "spec_path", help="tuning spec (default: MODEL's run's, in its work folder)"
)
@click.option(
    "--custom",
    "custom_spec",
    help="custom-kernel spec (default: MODEL's run's results.custom.mlir, when it wrote one)",
)
@click.option(
    "-o",
    "--output",
    "out_path",
    help="the module to write (default: model.vmfb in MODEL's work folder)",
)
@click.option("--config", "config_path", help="cfg file (default: ./auto-scheduler.cfg if present)")
@click.option("--target", type=click.Choice(TARGETS), help="backend")
@click.option("--arch", help="GPU architecture for --target cuda")
@inputs_option("on which the module's outputs are compared with IREE's default build's")
def compile_(model_file, spec_path, custom_spec, out_path, config_path, **overrides) -> None:
    """Build the tuned MODEL for the target: IREE's build with the spec, and the custom
    kernels in place of their contractions, as the run's whole-model proof built it."""
    from autosched.drivers.compile_model import compile_command  # noqa: PLC0415 - imported after the signal handlers are set

    require_file(model_file)
    config = with_overrides(load_config(config_path), input_file=model_file, **overrides)
    compile_command(config, spec_path, custom_spec, out_path)


try:
    from autosched.drivers.simulate import simulate_command

    cli.add_command(simulate_command)
except ImportError:  # pragma: no cover - simulate lands with the xgboost tuner
    pass


def main() -> None:
    """The installed command: any error that escapes is still one line, never a traceback.

    A native crash (a library's abort or fault) prints every thread's Python stack
    (faulthandler), so that it can be traced. An interrupted command leaves without the
    interpreter's teardown: its records, CSV and lock are done with by then, and CI once saw
    the teardown turn a Ctrl-C's 130 into an abort (-6)."""
    interrupts.starting_up()  # first: `python -m autosched` set them already, a script not
    faulthandler.enable()
    try:
        _run_command()
    except SystemExit as done:
        if done.code in interrupts.SIGNAL_EXIT_CODES:
            interrupts.leave_now(done.code)
        raise
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
    except (click.Abort, KeyboardInterrupt) as interrupt:
        click.echo(f"{signal_name(interrupt)}: stopped; every record made so far is kept", err=True)
        sys.exit(interrupts.exit_code_of(interrupt))
    except OSError as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(2)
    except Exception as error:  # noqa: BLE001 - the last line of defence against tracebacks
        told = traceback_kept(traceback.format_exc())
        click.echo(
            f"Error: internal error ({type(error).__name__}: {error}); please report it "
            f"with its traceback ({told}). Measurements already made are kept in the "
            "tuning database.",
            err=True,
        )
        sys.exit(1)


def traceback_kept(text: str) -> str:
    """Where an internal error's traceback was written: the end of the run's log, else a
    file of its own in the temporary folder (the user sees one line, the report has it)."""
    path = RunLog.latest
    if path is None or not os.path.exists(path):
        handle, path = tempfile.mkstemp(prefix="autosched-error-", suffix=".txt")
        os.close(handle)
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"\ninternal error:\n{text}")
    return f"at the end of {path}"
