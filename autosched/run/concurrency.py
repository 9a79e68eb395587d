"""The run's threads: several problems' work at once (or one device's re-timings each), and
what the executor noted meanwhile. Kept apart from `Tuning` so that the re-timing can run
its devices side by side without knowing the rest of the run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from autosched import processes
from autosched.measure.contract import Executor
from autosched.outputs.report import RunLog

Result = TypeVar("Result")


def concurrently(calls: list[Callable[[], Result]], parallel: int, log: RunLog) -> list[Result]:
    """Runs the calls on up to `parallel` threads, so that one problem's compiles and tuner
    overlap another's measuring; results in call order.

    Each call's run-log lines are written together when it ends. Records are made in the
    calls' threads, one at a time (the run's lock); on an interrupt every thread stops at
    its next tool or record, and this returns only when all have.
    """
    if parallel <= 1 or len(calls) <= 1:
        return [call() for call in calls]

    def logged(call: Callable[[], Result]) -> Result:
        with log.buffered():
            return call()

    pool = ThreadPoolExecutor(min(parallel, len(calls)), thread_name_prefix="problem")
    futures = [pool.submit(logged, call) for call in calls]
    try:
        return [future.result() for future in futures]
    except BaseException:
        processes.stop_all()  # an error in one problem stops the others (a signal has)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def log_executor_events(executor: Executor, log: RunLog, lock: threading.RLock) -> None:
    """What the executor noted since (an actor lost and its call queued again, ...)."""
    with lock:
        events, executor.events[:] = list(executor.events), []
    for event in events:
        log.write(f"executor: {event}")
