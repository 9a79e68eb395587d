"""Ctrl-C and SIGTERM while the command starts: its first instruction, before any import.

Until a run installs its own handlers (`interrupts.install`), SIGINT and SIGTERM end the
command at once with one line and 130 or 143. Nothing is being recorded yet, so nothing is
kept or cut short. This module imports nothing of the package and nothing beyond what the
interpreter has loaded before running a line, so that `python -m autosched` and the installed
`autosched` reach it within a millisecond of the interpreter's own start: a handler set
after the command line's imports (IREE, numpy, the package's own modules) left a window in
which a Ctrl-C raised KeyboardInterrupt inside an import (a traceback, exit -2, or a C++
`terminate` in a native library) and a SIGTERM killed the process (-15).
"""

from __future__ import annotations

# The interpreter's own signal module: `signal` builds its enums when imported (a
# millisecond and more on a busy machine, in which a Ctrl-C was a KeyboardInterrupt
# traceback from enum.py).
import _signal
import os
import sys

STARTING_LINE = "stopped before any measurement; nothing to keep"


def _leave_starting(signum, frame) -> None:
    """End the process now with the signal's line and code, every tool started killed
    (`autosched.processes`, where it was imported: before that no tool ran; a signal may
    also come while it is being imported, its `stop_all` not defined yet)."""
    stop_all = getattr(sys.modules.get("autosched.processes"), "stop_all", None)
    if stop_all is not None:
        stop_all()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError, AttributeError):  # closed, cut, or none
            pass
    name = "SIGTERM" if signum == _signal.SIGTERM else "interrupted"
    try:
        os.write(2, f"\n{name}: {STARTING_LINE}\n".encode())
    except OSError:  # stderr closed: the exit code still says it
        pass
    os._exit(128 + signum)


def starting_up() -> None:
    """SIGINT and SIGTERM end the command at once with their line and code (130, 143)
    until a run installs its own handlers."""
    for signum in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(signum, _leave_starting)
