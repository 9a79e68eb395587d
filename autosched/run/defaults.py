"""IREE's default, timed on every bench: first, to score candidates against, and again
before every batch after the first, so that each batch is scored against a default timed
next to it (on the H200 identical builds of one dispatch timed 19 % apart across a search
while each timing's own CV was 0.1-2 %)."""

from __future__ import annotations

from autosched.measure.benchmark_tool import Timing
from autosched.measure.contract import Executor, MeasureSettings
from autosched.outputs.report import RunLog
from autosched.run.builds import CandidateBuilds
from autosched.run.limits import (
    COMPILE_FACTOR,
    COMPILE_FLOOR_S,
    LIMIT_FACTOR,
    candidate_limit,
    compile_limit,
)
from autosched.run.problem import BASELINE, ProblemSearch


class DefaultTimings:
    """Times a problem's default build on the executor's benches and keeps the latest."""

    def __init__(
        self, executor: Executor, builds: CandidateBuilds, settings: MeasureSettings, log: RunLog
    ):
        self.executor, self.builds, self.settings, self.log = executor, builds, settings, log

    def first(self, search: ProblemSearch) -> None:
        """Each bench's own time of the default: a candidate measured on a device is scored
        by its speedup over that device's default."""
        baseline = search.result.baseline
        if not baseline.ok:
            return
        primary = self.executor.primary.device
        search.device_default_ms[primary] = search.reference_ms[primary] = baseline.median_ms
        search.result.default_ms = [baseline.median_ms]
        search.limit_s = candidate_limit(baseline, search.repeat, self.settings)
        search.compile_limit_s = compile_limit(baseline, self.builds.config.compile_timeout)
        if search.compile_limit_s is not None:
            self.log.write(
                f"a candidate's compile stops after {search.compile_limit_s:.3g} s "
                f"({COMPILE_FACTOR:g}x the default's {baseline.compile_s:.3g} s, at least "
                f"{COMPILE_FLOOR_S:g} s)"
            )
        if search.limit_s is not None:
            self.log.write(
                f"a candidate's check or timing stops after {search.limit_s:.3g} s "
                f"({LIMIT_FACTOR:g}x the default's time; run_timeout "
                f"{self.settings.run_timeout:g} s)"
            )
        if len(self.executor.devices) == 1:
            return
        for device, timing in self._elsewhere(search).items():
            if timing.status == "ok":
                search.device_default_ms[device] = timing.median_ms
                search.reference_ms[device] = timing.median_ms
                self.log.write(f"IREE default on {device}: {timing.median_ms:.4g} ms")
            else:
                self.log.write(f"IREE default on {device}: {timing.status} {timing.message}")

    def again(self, search: ProblemSearch) -> None:
        """The default timed again on every bench, before a batch is measured."""
        baseline = search.result.baseline
        if baseline is None or not baseline.ok:
            return
        primary = self.executor.primary
        timings = {primary.device: self._time(primary, self._module(search), search)}
        if len(self.executor.devices) > 1:
            timings.update(self._elsewhere(search))
        for device, timing in timings.items():
            if timing.status == "ok":
                search.reference_ms[device] = timing.median_ms
        own = timings[primary.device]
        if own.status == "ok":
            search.result.default_ms.append(own.median_ms)
            drift = own.median_ms / search.result.default_ms[0] - 1
            self.log.write(
                f"{search.problem.name}: IREE default re-timed {own.median_ms:.4g} ms "
                f"(cv {own.cv:.1%}, {drift:+.1%} from its first timing)"
            )

    def _module(self, search: ProblemSearch) -> str:
        modules = self.builds.modules_for(
            search.problem, [search.result.baseline], search.repeat, search
        )
        return modules[BASELINE]

    def _time(self, bench, module: str, search: ProblemSearch) -> Timing:
        function = search.benchmark.function if search.benchmark else None
        return bench.time(module, search.data, search.repeat, self.settings, None, function)

    def _elsewhere(self, search: ProblemSearch) -> dict[str, Timing]:
        """The default timed on every bench but the primary."""
        return self.executor.time_others(
            self._module(search),
            search.data,
            search.repeat,
            self.settings,
            search.benchmark.function if search.benchmark else None,
        )
