"""Measuring candidates behind one seam: compiled modules in, checks and timings out.

A `Bench` is one device's measuring station: its verifier worker keeps the device and the
problem's inputs open, and it checks and times what it is given. An executor turns a batch
of candidates into measurements: it compiles them (a pool of local processes, or Ray tasks)
and hands each compiled candidate to a free bench. `LocalExecutor` runs one bench per listed
device of this host; `ray.RayExecutor` runs benches as Ray actors. The search loop
(`run.tuning.Tuning`) neither knows nor cares which one it drives.
"""

from __future__ import annotations

import functools
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable

import numpy as np

from autosched import processes
from autosched.compile import CompileJob, CompileResult, compile_all
from autosched.measure.benchmark_tool import Timing, time_module
from autosched.measure.contract import (
    CHECK,
    TIMED,
    Candidate,
    Done,
    Measurement,
    MeasureSettings,
    MeasureTask,
    PendingBuilds,
    Prepare,
    builds_of,
    runtime_flags,
)
from autosched.measure.module_io import RunFailed, compare_outputs, run_outputs
from autosched.measure.worker import ProblemData, Verification, Verifier
from autosched.ops.matmul_kernel import KERNEL_FUNCTION
from autosched.targets.host import measuring_devices


def _holding_device(method):
    """The bench method runs holding the device (one measurement at a time), and the time
    held counts as busy once, however the calls nest (run times through time)."""

    @functools.wraps(method)
    def held(self, *args, **kwargs):
        with self.lock:
            if self._held:
                return method(self, *args, **kwargs)
            self._held, started = True, time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                self._held = False
                self.busy_s += time.perf_counter() - started

    return held


class Bench:
    """One device's measuring station, alive for the whole run."""

    def __init__(self, device: str, runtime_flags: tuple[str, ...] = ()):
        self.device = device
        self.runtime_flags = runtime_flags  # IREE runtime flags of every run here
        self.verifier = Verifier(device, runtime_flags)
        # One measurement at a time on the device: problems searched at the same time
        # share it, and a timing must never overlap another candidate's run.
        self.lock = threading.RLock()
        self.busy_s = 0.0  # seconds spent checking and timing: the rest, the device waited
        self._held = False  # a holding call is running (read and written under the lock)

    @_holding_device
    def time(
        self,
        module: str,
        data: ProblemData,
        repeat: int,
        settings: MeasureSettings,
        repetitions: int | None = None,
        benchmark_function: str | None = None,
        slow_ms: float | None = None,
    ) -> Timing:
        """Time per dispatch: of the kernel on the problem's inputs, or of IREE's own
        dispatch (its benchmark function takes the repeat count, and no inputs).

        With `timer = worker` either is timed in the verifier's worker, which keeps the
        device and the inputs open; iree-benchmark-module stays the fallback.
        """
        repetitions = repetitions or settings.repetitions
        if settings.timer == "worker":
            timing = self.verifier.time(
                module,
                data,
                repeat,
                repetitions,
                settings.min_time,
                settings.run_timeout,
                benchmark_function,
                slow_ms,
            )
            if timing is not None:
                return timing
        return time_module(
            module,
            self.device,
            [] if benchmark_function else data.inputs,
            repeat,
            repetitions,
            settings.min_time,
            settings.run_timeout,
            function=benchmark_function or KERNEL_FUNCTION,
            runtime_flags=self.runtime_flags,
        )

    @_holding_device
    def reference_outputs(
        self, module: str, entry: object, inputs: list[str], folder: str, timeout: float
    ) -> list[np.ndarray]:
        """The module's outputs on this device (see `contract.BenchContract`)."""
        return run_outputs(module, self.device, entry, inputs, folder, timeout)

    def check(self, task: MeasureTask) -> Verification:
        """The candidate's answer: on the dispatch against IREE's default, or on the bare
        kernel against numpy."""
        if task.check is None:
            return self.verifier.check(
                task.check_module, task.data, task.problem, task.settings.run_timeout
            )
        check = task.check
        # This call's own folder for the outputs: benches check candidates of one problem
        # at the same time, and would otherwise write (and read back) the same files.
        os.makedirs(check.folder, exist_ok=True)
        folder = tempfile.mkdtemp(prefix="outputs-", dir=check.folder)
        try:
            outputs = run_outputs(
                task.check_module,
                self.device,
                check.entry,
                check.inputs,
                folder,
                task.settings.run_timeout,
            )
        except RunFailed as error:
            status = "timeout" if "took over" in str(error) else "runtime_error"
            return Verification(status, message=str(error))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        match, error, message = compare_outputs(outputs, check.reference, check.entry)
        return Verification("correct" if match else "wrong_answer", error, message[:300])

    @_holding_device
    def run(self, task: MeasureTask) -> Measurement:
        """Check, then time (the task's steps); a failure at either step is the outcome."""
        outcome = Measurement(self.device)
        if CHECK in task.steps:
            started = time.perf_counter()
            verdict = self.check(task)
            outcome.verify_s = round(time.perf_counter() - started, 3)
            outcome.verification, outcome.max_error = verdict.status, verdict.max_error
            outcome.verify_phases = verdict.phases
            if verdict.status != "correct":
                outcome.status, outcome.message = verdict.status, verdict.message
                return outcome
        if TIMED not in task.steps:
            return outcome
        started = time.perf_counter()
        timing = self.time(
            task.timed_module,
            task.data,
            task.repeat,
            task.settings,
            benchmark_function=task.benchmark_function,
            slow_ms=task.slow_ms,
        )
        outcome.timing_s = round(time.perf_counter() - started, 3)
        outcome.timing = timing
        if timing.status != "ok":
            outcome.status, outcome.message = timing.status, timing.message
        return outcome

    def close(self) -> None:
        self.verifier.close()


class LocalExecutor:
    """Compiles on this host's cores and measures on this host's devices.

    With one bench a candidate is measured in the calling thread as soon as it is compiled
    (today's behaviour: on a GPU, timing overlaps the other compiles). With several, each
    bench has a thread that takes the next compiled candidate when it is free; the results
    come back to the calling thread, which alone records them.
    """

    def __init__(
        self,
        benches: list[Bench],
        jobs: int,
        compile_timeout: float,
        overlap: bool = True,
    ):
        self.benches = benches
        self.jobs = jobs
        self.compile_timeout = compile_timeout
        self.overlap = overlap  # False: finish the compiles before measuring (CPU targets)
        self.events: list[str] = []  # what the run log should say (none so far here)

    @property
    def primary(self) -> Bench:
        """The bench that measures defaults first and re-times the finalists."""
        return self.benches[0]

    @property
    def devices(self) -> list[str]:
        return [bench.device for bench in self.benches]

    def time_others(
        self,
        module: str,
        data: ProblemData,
        repeat: int,
        settings: MeasureSettings,
        benchmark_function: str | None,
    ) -> dict[str, Timing]:
        """The module timed on every device but the primary (each device's default)."""
        return {
            bench.device: bench.time(
                module, data, repeat, settings, benchmark_function=benchmark_function
            )
            for bench in self.benches[1:]
        }

    def busy(self) -> dict[str, float]:
        return {bench.device: bench.busy_s for bench in self.benches}

    def compile(self, jobs: list[CompileJob]) -> Iterable[CompileResult]:
        results = compile_all(jobs, self.compile_timeout, self.jobs)
        return results if self.overlap else list(results)

    def run(self, candidates: list[Candidate], prepare: Prepare, done: Done) -> None:
        pending = PendingBuilds()
        pending.add(candidates)
        if len(self.benches) == 1:
            for result in self.compile(builds_of(candidates)):
                for candidate, builds in pending.finished(result):
                    task = prepare(candidate, builds)
                    done(candidate, builds, self.primary.run(task) if task else None)
            return
        self._run_parallel(candidates, pending, prepare, done)

    def _run_parallel(
        self, candidates: list[Candidate], pending: PendingBuilds, prepare: Prepare, done: Done
    ) -> None:
        tasks: queue.Queue = queue.Queue()
        results: queue.Queue = queue.Queue()

        def serve(bench: Bench) -> None:
            while (item := tasks.get()) is not None:
                candidate, builds, task = item
                try:
                    results.put((candidate, builds, bench.run(task)))
                except processes.Stopped:
                    return  # the run is being interrupted: the main thread records nothing more
                except Exception as error:  # noqa: BLE001 - a bench fault is the outcome
                    failed = Measurement(bench.device, "runtime_error", str(error)[:300])
                    results.put((candidate, builds, failed))

        threads = [
            threading.Thread(target=serve, args=(bench,), daemon=True) for bench in self.benches
        ]
        for thread in threads:
            thread.start()
        outstanding = 0
        try:
            for result in self.compile(builds_of(candidates)):
                for candidate, builds in pending.finished(result):
                    task = prepare(candidate, builds)
                    if task is None:
                        done(candidate, builds, None)
                    else:
                        tasks.put((candidate, builds, task))
                        outstanding += 1
                outstanding -= _drain(results, done, block=False)
            while outstanding:
                if processes.stopping():  # the bench threads record nothing more
                    raise processes.Stopped()
                outstanding -= _drain(results, done, block=True)
        finally:
            for _ in threads:
                tasks.put(None)

    def close(self) -> None:
        for bench in self.benches:
            bench.close()


def _drain(results: queue.Queue, done: Done, block: bool) -> int:
    """Hands finished measurements to `done`; how many it handed."""
    count = 0
    while True:
        try:
            item = results.get(timeout=0.5) if block and not count else results.get_nowait()
        except queue.Empty:
            return count
        done(*item)
        count += 1


def describe_devices(devices: list[str]) -> str:
    return ", ".join(devices) if len(devices) > 1 else devices[0]


def local_executor(config, target, jobs: int) -> LocalExecutor:
    """This host's devices (`devices`), one bench each."""
    devices = measuring_devices(config, target.device, target.machine)
    flags = runtime_flags(config)
    return LocalExecutor(
        [Bench(device, flags) for device in devices],
        jobs,
        config.compile_timeout,
        target.timing_overlaps_compile,
    )
