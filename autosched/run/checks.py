"""Where a problem timed on IREE's dispatch has its candidates' answers checked: on the
dispatch's own check module against IREE's default build of it, on the whole model for a
kind that may need it, or (without either) on the bare kernel against numpy. One answer of
the default per check module; a model's whole build is compiled once a run."""

from __future__ import annotations

import os
import threading

from autosched.config import RunConfig
from autosched.measure.contract import DispatchCheck, Executor
from autosched.measure.module_io import EntryFunction, RunFailed, TensorSpec, checked_inputs
from autosched.ops.registry import kind_of
from autosched.outputs.report import RunLog
from autosched.run.builds import CandidateBuilds
from autosched.run.problem import BASELINE, ProblemSearch


class AnswerChecks:
    """Chooses and prepares each search's check; shares the whole model's default answer."""

    def __init__(self, config: RunConfig, log: RunLog, executor: Executor, builds: CandidateBuilds):
        self.config, self.log, self.executor, self.builds = config, log, executor, builds
        self.model_checks: dict[str, object] = {}  # check source -> its default's answer
        self.model_check_lock = threading.Lock()

    def choose(self, search: ProblemSearch) -> None:
        """Where a kind that may need the whole model (`model_check`) checks its answers:
        on its dispatch's own module where a one-point spec reaches the root there, since
        each candidate's check then compiles in seconds (resnet50's whole model took 76 s a
        candidate on the H200's host); on the whole model otherwise."""
        benchmark = search.benchmark
        if benchmark.model_check is None:  # (attach_benchmarks: none without a check module)
            return
        verdict = self.builds.probe_check(search)
        if verdict is not None and verdict.ok:  # the whole model stays the fallback
            return
        why = verdict.message if verdict else "no point a spec carries builds it"
        self.log.write(f"answers checked on the whole model: a spec misses the dispatch's ({why})")
        search.benchmark = benchmark.on_whole_model()

    def prepare(self, search: ProblemSearch) -> None:
        """The default build's answer on the dispatch itself, to check candidates against.

        Without it (no check module, or the default fails on it) candidates are checked on
        the bare kernel against numpy.
        """
        benchmark = search.benchmark
        if benchmark is None or not benchmark.check_source:
            return
        entry = EntryFunction(
            benchmark.check_function,
            tuple(TensorSpec(shape, element) for shape, element in benchmark.check_inputs),
            tuple(TensorSpec(shape, element) for shape, element in benchmark.check_outputs),
        )
        if benchmark.checks_model:  # one model, one default answer: its problems share it
            with self.model_check_lock:
                if benchmark.check_source not in self.model_checks:
                    self.model_checks[benchmark.check_source] = self.default_answer(
                        search, entry, "model"
                    )
                check = self.model_checks[benchmark.check_source]
        else:
            check = self.default_answer(search, entry, search.problem.name)
        if isinstance(check, RunFailed):
            self._without_check(search, check)
            return
        search.check = check
        self.log.write(
            f"answers checked on the dispatch against IREE's default ({benchmark.check_source})"
        )

    def _without_check(self, search: ProblemSearch, failed: RunFailed) -> None:
        """Where the dispatch's check could not run: the whole model checks the answers,
        else the bare kernel, else the problem is not searched."""
        problem, benchmark = search.problem, search.benchmark
        if benchmark.model_check is not None:  # IREE's default on resnet50's strided
            # 1x1 convolutions' own modules ran past a minute on the H200 (session 21)
            self.log.write(
                f"the dispatch check could not run ({failed}): answers checked on the whole model"
            )
            search.benchmark = benchmark.on_whole_model()
            self.prepare(search)
            return
        if kind_of(problem).has_kernel(problem):
            self.log.write(
                f"the dispatch check could not run ({failed}): answers checked on the kernel"
            )
            return
        search.result.stopped = (
            f"{problem.name}: the dispatch check could not run ({failed}) and a "
            f"{problem.kind} has no kernel of its own to check answers on: not searched"
        )

    def default_answer(self, search: ProblemSearch, entry: EntryFunction, name: str):
        """IREE's default build of the check module run on inputs under inputs/`name` (the
        user's for the whole model, else seeded ones drawn again where the default gives
        NaN or inf: module_io.checked_inputs): a DispatchCheck, or the RunFailed that says
        why it did not build, run or give a finite answer. A model's whole build is compiled
        once a run (`CandidateBuilds.default_model_check`)."""
        folder = os.path.join(self.config.work_dir, "inputs", name, "dispatch")
        if search.benchmark.checks_model:
            built = self.builds.default_model_check(search)
        else:
            job = self.builds.dispatch_job(search, BASELINE, None, check=True)
            built = self.builds.compile_one(job)
            if built.status == "ok":  # the default's measurement checks on it: not again
                self.builds.built.add(job.output)
        if built.status != "ok":
            return RunFailed(built.message)

        def default_outputs(inputs: list[str]) -> list:
            return self.executor.primary.reference_outputs(
                built.job.output, entry, inputs, folder, self.config.run_timeout
            )

        given = self.config.inputs if search.benchmark.checks_model else ""
        try:
            checked = checked_inputs(entry, folder, self.config.seed, default_outputs, given)
        except RunFailed as error:
            return error
        if checked.unusable:
            return RunFailed(checked.unusable)
        return DispatchCheck(entry, checked.flags, checked.reference, folder)
