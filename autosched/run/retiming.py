"""The end of each problem's search: its top candidates timed again beside IREE's default,
each device re-timing one problem at a time, and the winner named only where it beats the
default by more than the noise (the verdict itself is `retime`'s, pure). Keeps the final
medians the CSV reports and the problems finished, in order."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from autosched.config import RunConfig
from autosched.measure.contract import BenchContract, Executor, MeasureSettings
from autosched.model.dispatch_benchmarks import DispatchBenchmark
from autosched.outputs.records import Trial
from autosched.outputs.report import RunLog
from autosched.run import retime
from autosched.run.builds import CandidateBuilds
from autosched.run.concurrency import concurrently, log_executor_events
from autosched.run.problem import ProblemResult, ProblemSearch, Progress


def time_on(
    bench: BenchContract,
    settings: MeasureSettings,
    vmfb: str,
    data,
    repetitions: int,
    repeat: int,
    benchmark: DispatchBenchmark | None = None,
):
    """Time per dispatch of a built module on `bench`."""
    function = benchmark.function if benchmark else None
    return bench.time(vmfb, data, repeat, settings, repetitions, function)


class Retiming:
    """Finishes searches: re-times their finalists and names their winners."""

    def __init__(
        self,
        config: RunConfig,
        log: RunLog,
        executor: Executor,
        builds: CandidateBuilds,
        settings: MeasureSettings,
        lock: threading.RLock,
    ):
        self.config, self.log, self.executor = config, log, executor
        self.builds, self.lock = builds, lock
        self.settings = replace(settings, min_time=config.retime_repetition_s)
        self.retimed: dict[tuple[str, str], float] = {}  # (problem, config) -> final median ms
        self.finished: list[ProblemResult] = []  # problems searched to the end, in that order
        # Fast mode leaves clear losers out of the re-timing (minutes count there).
        self.floor = retime.FAST_FLOOR if config.mode == "fast" else 0.0

    def finish_problem(
        self,
        search: ProblemSearch,
        bench: BenchContract | None = None,
        modules: dict | None = None,
    ) -> ProblemResult:
        """Re-times the top candidates beside the default (on `bench`, the primary unless
        told; `modules` when `finish_all` built them first) and names the winner."""
        if not search.result.search_s:
            search.result.search_s = time.perf_counter() - search.started
        if search.state is None:  # nothing searched (not even timed: `AnswerChecks.prepare`)
            baseline = search.result.baseline
            search.result.baseline_ms = baseline.median_ms if baseline else None
        else:
            self._retime(search, bench or self.executor.primary, modules)
        with self.lock:
            self.finished.append(search.result)
        return search.result

    def reopen(self, search: ProblemSearch) -> None:
        """Takes back a finish whose verdict did not end the search (fast mode's paired
        check of a first-pass win): the problem is searched on and re-timed at its end."""
        result = search.result
        with self.lock:
            self.finished[:] = [r for r in self.finished if r is not result]
            for key in [k for k in self.retimed if k[0] == search.problem.name]:
                del self.retimed[key]
        result.best = result.best_ms = result.verdict = result.baseline_ms = None
        result.search_s = 0.0

    def finish_all(
        self, searches: list[ProblemSearch], parallel: int, progress: Progress | None = None
    ) -> list[ProblemResult]:
        """Finishes the searches once all of them have ended, so that no compile or search
        runs beside a re-timing. On the H200 IREE's default at 512^3 and 1024^3 f16
        re-timed 44-63 % slower while another problem's kernels compiled, and the paired
        verdict then could not tell a 1.3x gain from the noise.

        The finalists' modules are built first, then each device re-times one problem at a
        time, its default and finalists on that device alone: on two H200s, with every
        problem re-timed on the primary, the other was busy 55 % of the suite's run (69 %
        now), and the run took 75 s against 65."""
        modules = [self.finalist_modules(search) for search in searches]
        waiting: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(searches)):
            waiting.put(index)
        results: list[ProblemResult | None] = [None] * len(searches)
        announce = threading.Lock()
        started = itertools.count(1)

        def serve(bench: BenchContract) -> None:
            """Re-times problems on `bench` until none is left."""
            while True:
                try:
                    index = waiting.get_nowait()
                except queue.Empty:
                    return
                if progress is not None and len(searches) > 1:
                    with announce:
                        progress.retiming(searches[index].problem, next(started), len(searches))
                results[index] = self.finish_problem(searches[index], bench, modules[index])

        calls: list[Callable[[], None]] = [partial(serve, b) for b in self.executor.benches]
        concurrently(calls, parallel, self.log)
        return [result for result in results if result is not None]

    def finalist_modules(self, search: ProblemSearch) -> dict[str, str]:
        """The timed module of each finalist and the default (compiled again if resumed)."""
        if search.state is None:
            return {}
        result = search.result
        _, entries = retime.finalists(
            result.trials, result.baseline, self.config.finalists, self.floor
        )
        if not entries:
            return {}
        return self.builds.modules_for(search.problem, entries, search.repeat, search)

    def _retime(
        self, search: ProblemSearch, bench: BenchContract, modules: dict[str, str] | None = None
    ) -> None:
        """Times the top few again on `bench`, interleaved with the default, and names the
        winner only when it beats the default by more than the noise."""
        log, problem, result = self.log, search.problem, search.result
        contenders, entries = retime.finalists(
            result.trials, result.baseline, self.config.finalists, self.floor
        )
        if not contenders:
            best = max(filter(None, (retime.first_pass_speedup(t, result.baseline)
                                     for t in result.trials)), default=None)  # fmt: skip
            tried = any(not t.baseline for t in result.trials)
            log.write(
                "no candidate was run"
                if not tried
                else "no candidate compiled, ran and gave the right answer"
                if best is None
                else f"not re-timed: the best candidate was {best:.2f}x IREE's default on "
                f"the first pass (fast mode re-times those from {retime.FAST_FLOOR:g}x)"
            )
            baseline = result.baseline  # the table's default time: its search's own timing
            result.baseline_ms = baseline.median_ms if baseline and baseline.ok else None
            return
        # The bare kernel's module repeats the default's dispatch `repeat` times a call (a
        # dispatch benchmark fits its count to the time a call may take).
        baseline = result.baseline
        call_s = baseline.median_ms * search.repeat / 1e3 if baseline and baseline.ok else 0.0
        if not search.benchmark and not retime.retimes_default(contenders, baseline, call_s):
            entries = contenders
        beside = " beside the default" if len(entries) > len(contenders) else ""
        log.write(
            f"{problem.name}: the top {len(contenders)} re-timed{beside}"
            + (f" on {bench.device}" if len(self.executor.benches) > 1 else "")
        )
        if modules is None:
            modules = self.builds.modules_for(problem, entries, search.repeat, search)
        repetitions = max(1, self.config.repetitions // 2)

        def time_one(name: str) -> float | None:
            if name not in modules:
                return None
            timing = time_on(
                bench,
                self.settings,
                modules[name],
                search.data,
                repetitions,
                search.repeat,
                search.benchmark,
            )
            return timing.median_ms if timing.status == "ok" else None

        rounds = retime.timed_rounds([t.config for t in entries], time_one)
        # A round lost with its actor was timed again: say so.
        log_executor_events(self.executor, log, self.lock)
        found = retime.judge(contenders, rounds)
        self.retimed.update(keep_verdict(log, search, contenders, found, bool(beside)))


def keep_verdict(
    log: RunLog,
    search: ProblemSearch,
    contenders: list[Trial],
    found: retime.Retimed,
    with_default: bool = True,
) -> dict[tuple[str, str], float]:
    """Logs and keeps what re-timing found (the default's drift, the winner); the final
    medians by (problem, config). `with_default`: the default was timed in the rounds."""
    result = search.result
    final = {(search.problem.name, n): ms for n, ms in found.final.items()}
    result.baseline_ms = found.baseline_ms
    if result.baseline.ok and result.baseline_ms:
        log.write(drift_line(result))
    elif result.baseline.ok and not with_default:  # its first timing (retimes_default)
        result.baseline_ms = result.baseline.median_ms
        log.write(
            f"IREE default not re-timed ({result.baseline_ms:.4g} ms): every finalist was over "
            f"{retime.CLEAR_MARGIN:g}x faster on the first pass"
        )
    if len(result.default_ms) > 1:
        log.write(
            f"IREE default over the search: {len(result.default_ms)} timings, "
            f"{min(result.default_ms):.4g}-{max(result.default_ms):.4g} ms, "
            f"drift up to {result.drift:.1%} (candidates scored against the latest)"
        )
    if found.winner is None:
        return {}
    for trial in contenders:
        if trial.config in found.final:
            log.write(f"re-timed {trial.config}: {found.final[trial.config]:.4g} ms")
    result.verdict = found.verdict
    if found.verdict is not None:
        log.write(f"{found.winner.config} against the default: {found.verdict.describe()}")
    if found.beats_default:
        result.best, result.best_ms = found.winner, found.final[found.winner.config]
    else:
        log.write("no candidate beat IREE's default by more than the noise: the default stays")
    return final


def drift_line(result: ProblemResult) -> str:
    drift = result.baseline_ms / result.baseline.median_ms - 1
    note = (
        "  (drift over 10 %: treat small speedups with care)"
        if abs(drift) > retime.DRIFT_WARNING
        else ""
    )
    return (
        f"IREE default re-timed: {result.baseline_ms:.4g} ms "
        f"(first {result.baseline.median_ms:.4g} ms, {drift:+.1%}){note}"
    )
