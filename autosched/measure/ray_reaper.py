"""A watchdog tied to a run that starts a private Ray cluster (`--ray-address local`).

Ray stops a local cluster when its driver calls `ray.shutdown()`, and its head processes share
the driver's fate; but a driver killed with SIGKILL leaves the raylet's agents
(`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) orphaned for 30-60 s, and a compile or
worker started by the run as well. The watchdog is a separate process, in a session of its
own so a signal to the run's process group does not reach it: while the run lives it notes
every descendant of the run (with its start time, so a reused pid is never mistaken for
one); once the run is gone it kills those still alive, and theirs.

    python -m autosched.measure.ray_reaper RUN_PID
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2  # how often the run's process tree is read while it lives
GRACE_S = 1.0  # after the run ends: the time its own shutdown gets to stop the cluster


def start_watchdog(run_pid: int | None = None) -> subprocess.Popen:
    """The watchdog for `run_pid` (this process by default), started detached."""
    return subprocess.Popen(
        [sys.executable, "-m", "autosched.measure.ray_reaper", str(run_pid or os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process; None when it is gone or
    already a zombie (a zombie is dead: only its parent's wait is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every live process."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            found[int(name)] = stat
    return found


def descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> dict[int, int]:
    """pid -> start time of every live descendant of `roots` in `table`."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = {}, list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found[child] = table[child][1]
                stack.append(child)
    return found


def watch(run_pid: int) -> dict[int, int]:
    """Every process the run started while it lived (pid -> start time), once it is gone."""
    seen: dict[int, int] = {}
    while _stat(run_pid) is not None:
        table = _processes()
        # The run's tree now, and whatever an earlier child left behind (reparented).
        seen.update(descendants({run_pid, *seen}, table))
        seen.pop(os.getpid(), None)  # the watchdog is the run's child too
        time.sleep(POLL_S)
    return seen


def reap(seen: dict[int, int]) -> list[int]:
    """SIGKILL to every process in `seen` still alive (same start time) and to its
    descendants; the pids killed."""
    table = _processes()
    alive = {pid for pid, started in seen.items() if table.get(pid, (0, -1))[1] == started}
    doomed = alive | set(descendants(alive, table))
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return sorted(doomed)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's Ctrl-C is the run's
    seen = watch(int(argv[0]))
    time.sleep(GRACE_S)
    reap(seen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
