"""Ctrl-C and SIGTERM: stop within a moment, kill every child, keep the records consistent.

On either signal every tool's process group is killed at once (so no compile is waited
out and nothing is orphaned) and the main thread gets `Interrupted`. While a trial is
being recorded (database line, CSV row) the exception waits for the end of that section,
so the database and the CSV never disagree by a row.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from autosched import processes
from autosched.startup_signals import STARTING_LINE, starting_up

__all__ = ["STARTING_LINE", "starting_up"]  # the command's first handlers, used from here


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop by a signal; `signum` says which."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_state = threading.local()
_pending: list[int] = []
_received: list[int] = []  # every signal the run got, in order


def signal_of(interrupt: KeyboardInterrupt) -> int:
    """The signal that stopped the run. An `Interrupted` names it; another interrupt
    (`processes.Stopped`, raised by a tool the signal's clean-up refused to start while
    the signal itself waited at the end of a critical section) is the first signal the
    run got, or a Ctrl-C."""
    signum = getattr(interrupt, "signum", None)
    return signum or (_received[0] if _received else signal.SIGINT)


def exit_code_of(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + signal_of(interrupt)


def _in_critical() -> bool:
    return getattr(_state, "depth", 0) > 0


def _handler(signum, frame) -> None:
    _received.append(signum)
    processes.stop_all()
    if _in_critical():
        _pending.append(signum)
        return
    _quiet()
    raise Interrupted(signum)


def _quiet() -> None:
    """After the first signal, more of them must not cut the clean-up short."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def install() -> None:
    """Routes SIGINT and SIGTERM through `_handler` (call from the main thread)."""
    forget()
    processes.reset()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _handler)


@contextmanager
def kept_handlers() -> Iterator[None]:
    """The handlers of SIGINT and SIGTERM as they were before the section, put back after it.

    A library may install its own: `ray.init` sets a Python handler for SIGTERM that exits
    with status 15, and beneath Python a C++ one that prints its stack and kills the process
    by the signal, so a run could neither keep its records nor leave with 143. Setting the
    saved handlers again (from the main thread, as Python allows) makes them the ones the
    process calls; a handler not set from Python is left alone."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in saved.items():
                if handler is not None:
                    signal.signal(signum, handler)


def forget() -> None:
    """No signal received nor waiting: a process that goes on after a run (tests, the Python
    entry) starts the next one clean."""
    _pending.clear()
    _received.clear()


def restore() -> None:
    """Back to the handlers outside a run (SIGTERM: `_exit_quietly`)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _exit_quietly)


SIGNAL_EXIT_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def _exit_quietly(signum, frame) -> None:
    """SIGTERM outside a run (starting up, or once every record is written): nothing is
    left to keep, so the process ends as an interrupted run does, 143 and no traceback,
    instead of dying by the signal while the interpreter shuts down."""
    processes.stop_all()
    leave_now(128 + signum)


def leave_now(code: int) -> None:
    """Ends the process with `code` at once, after flushing the screen's streams (every
    record and file of the run is closed by then): no interpreter teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # closed, or cut in the middle of a write
            pass
    os._exit(code)


def shutting_down() -> None:
    """After the command's last record and line. The interpreter's shutdown puts Python's
    handlers back to the default, and a SIGTERM then killed the process (-15) although
    nothing was lost; a signal ignored stays ignored through it, and the exit code stands."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


@contextmanager
def critical() -> Iterator[None]:
    """A section a signal must not cut in half; the interrupt is raised at its end."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
    if _pending and not _in_critical():
        signum = _pending.pop()
        _pending.clear()
        _quiet()
        raise Interrupted(signum)
