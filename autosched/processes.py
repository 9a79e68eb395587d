"""Child processes the run can always take down: IREE's tools, each in its own process group.

Every tool (iree-compile, iree-benchmark-module, iree-run-module, device probes) starts in a
new session, so that a timeout or an interrupt kills the tool *and* what it started itself
(iree-compile runs iree-lld, for example). `stop_all` is what Ctrl-C and SIGTERM call: it
kills every live group and refuses new starts, so worker threads return at once instead of
waiting out their compiles.

Tools can be swapped for wrappers through the environment (`AUTOSCHED_IREE_COMPILE`,
`AUTOSCHED_IREE_BENCHMARK_MODULE`, `AUTOSCHED_IREE_RUN_MODULE`): a custom IREE build, or a
fault injected by a test, without editing IREE.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

_lock = threading.Lock()
_live: dict[int, subprocess.Popen] = {}  # pid -> process (each the leader of its own group)
_extra: set[int] = set()  # other children to kill on stop (the verifier's worker)
_stopping = threading.Event()


class Stopped(KeyboardInterrupt):
    """A tool was not started, or was killed, because the run is being interrupted."""


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    output: bytes = b""  # stdout as bytes, kept when the caller asked for binary output


def tool_path(name: str, default: str) -> str:
    """The tool to run: `AUTOSCHED_<NAME>` from the environment when set, else `default`."""
    return os.environ.get("AUTOSCHED_" + name.upper().replace("-", "_")) or default


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    command: list[str],
    timeout: float,
    input_bytes: bytes | None = None,
    binary_output: bool = False,
    niceness: int = 0,
) -> Finished:
    """Runs a tool to its end, or kills its whole process group after `timeout` seconds.

    `niceness` lowers the tool's CPU priority (its whole group): compiles that fill every
    core must not keep a CPU from the measuring worker, whose check waits on it.
    Raises Stopped when the run is being interrupted; a timeout is a result, not an error.
    """
    if _stopping.is_set():
        raise Stopped()
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE if input_bytes is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    with _lock:
        _live[process.pid] = process
    if niceness:
        try:
            lowered = min(os.getpriority(os.PRIO_PROCESS, 0) + niceness, 19)
            os.setpriority(os.PRIO_PGRP, process.pid, lowered)
        except OSError:  # already gone, or not allowed: it runs at normal priority
            pass
    if _stopping.is_set():  # stop_all ran between the check above and the registration
        _kill_group(process)
    timed_out = False
    try:
        stdout, stderr = process.communicate(input_bytes, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        stdout, stderr = process.communicate()
    except BaseException:  # an interrupt while waiting: the tool's whole group goes too
        _kill_group(process)
        raise
    finally:
        with _lock:
            _live.pop(process.pid, None)
    if _stopping.is_set():
        raise Stopped()
    return Finished(
        process.returncode,
        "" if binary_output else stdout.decode("utf-8", "replace"),
        stderr.decode("utf-8", "replace"),
        time.perf_counter() - start,
        timed_out,
        stdout if binary_output else b"",
    )


def track(pid: int) -> None:
    """Kill this child too when the run stops (a helper process that is not a tool).

    One started after the stop (a measuring thread of another device that had not heard
    of it yet) is killed at once: it may have inherited the ignored SIGTERM of the
    clean-up, and would then outlive the run."""
    with _lock:
        _extra.add(pid)
        stopping = _stopping.is_set()
    if stopping:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def untrack(pid: int) -> None:
    with _lock:
        _extra.discard(pid)


def stop_all() -> None:
    """Kills every running tool's process group and every tracked child; no new starts."""
    _stopping.set()
    with _lock:
        processes = list(_live.values())
        extra = list(_extra)
    for process in processes:
        _kill_group(process)
    for pid in extra:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stopping() -> bool:
    return _stopping.is_set()


def reset() -> None:
    """Allows starts again (for a second run in the same process, as tests do)."""
    _stopping.clear()


# Words that mark the line worth showing: plain errors and IREE's status codes.
_TELLING = (
    "error",
    "abort",
    "fault",
    "INTERNAL",
    "UNAVAILABLE",
    "INVALID_ARGUMENT",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "NOT_FOUND",
    "UNIMPLEMENTED",
    "OUT_OF_RANGE",
    "DEADLINE_EXCEEDED",
)


def _telling_line(text: str) -> str:
    """The first line with an error word, else the last non-empty line, else ""."""
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and line not in ("stdout:", "stderr:")]
    for line in lines:
        if any(word in line if word.isupper() else word in line.lower() for word in _TELLING):
            return line[:300]
    return lines[-1][:300] if lines else ""


def describe_failure(finished: Finished, tool: str) -> str:
    """One useful line for a failed tool: what it said on stderr (else stdout), and the
    signal that killed it, if one did."""
    line = _telling_line(finished.stderr) or _telling_line(finished.stdout)
    if finished.returncode < 0:
        try:
            name = signal.Signals(-finished.returncode).name
        except ValueError:
            name = f"signal {-finished.returncode}"
        return f"{tool} was killed by {name}" + (f": {line}" if line else "")
    return line or f"{tool} exited with code {finished.returncode} and no message"
