"""What every measuring run needs around it, whichever driver runs it: its paths checked,
the devices opened once, the work folder locked, signals handled, OS errors as one line,
and one line and the signal's exit code when interrupted."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from autosched import interrupts
from autosched.compile import check_temp_dir
from autosched.config import RunConfig
from autosched.drivers.runlock import RunLock, lock_paths
from autosched.errors import UserError
from autosched.measure.contract import runtime_flags
from autosched.outputs.paths import RunPaths, check_paths, start_lines
from autosched.outputs.records import TuningDatabase
from autosched.targets.host import device_problem, measuring_devices


@contextmanager
def guarded_run(config: RunConfig, target, paths: RunPaths, resume: bool) -> Iterator[None]:
    """What every measuring run needs around it: its paths checked (the temporary folder
    too: a full one fails every compile with a misleading linker error), the device opened
    once, the work folder locked, signals handled, and OS errors turned into one Error:
    line. Its first lines once locked say where it writes and what it resumes from."""
    check_paths(paths)
    check_temp_dir()
    lock = None
    try:
        if config.executor == "local":  # a Ray cluster's actors open their own devices
            target.check_device()
            for device in measuring_devices(config, target.device, target.machine):
                problem = device_problem(device)
                if problem:
                    raise UserError(f"device {device!r} cannot be opened here: {problem}")
        runtime_flags(config)  # one that IREE does not know: an Error line, not a start
        lock = RunLock(lock_paths(config.work_dir, config.database, config.output_file))
        torn = TuningDatabase(config.database).compact()
        if torn:
            click.echo(f"removed {torn} torn line(s) from {config.database}", err=True)
        for line in start_lines(paths, resume):
            click.echo(line, err=True)
        interrupts.install()
        yield
    except KeyboardInterrupt as interrupt:  # in a phase outside the search's own handler
        exit_interrupted(interrupt, config)
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


def signal_name(interrupt: KeyboardInterrupt) -> str:
    return "SIGTERM" if interrupts.signal_of(interrupt) == signal.SIGTERM else "interrupted"


def exit_interrupted(
    interrupt: KeyboardInterrupt, config: RunConfig, log=None, progress=None
) -> None:
    """One line, then the exit code of the signal (130 for Ctrl-C, 143 for SIGTERM), in any
    phase of a run (the search's, with its log and progress display, or the later ones)."""
    if progress is not None:
        progress.finish()
    name = signal_name(interrupt)
    if log is not None:
        log.write(f"{name}: every trial measured so far is in the CSV and the database")
    click.echo(
        f"\n{name}: measurements kept in {config.output_file} and {config.database}; "
        "run the same command again to resume",
        err=True,
    )
    sys.exit(interrupts.exit_code_of(interrupt))
