"""The modules one candidate is built into: compile jobs (what is compiled, with which flags,
and which configuration each build must carry), their compiles, and the check that each
build carries its configuration before it is timed.

Every job dumps the configurations IREE chose (`configured.dump_flag`), so that a build whose
configuration did not reach the root op is caught before it is timed.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace

from autosched.compile import CONFIGS_FLAG, CompileJob, CompileResult, compile_all, compile_one
from autosched.config import RunConfig
from autosched.measure.contract import (
    CHECK,
    TIMED,
    Candidate,
    MeasureSettings,
    MeasureTask,
)
from autosched.model.configured import (
    CONFIG_PHASE,
    Applied,
    check_build,
    check_roots,
    dump_flag,
    roots_in,
)
from autosched.model.dispatch_benchmarks import DispatchBenchmark
from autosched.ops.base import Problem
from autosched.ops.matmul_kernel import variant_path, write_text
from autosched.ops.registry import kind_of
from autosched.outputs.records import Trial
from autosched.outputs.spec import tuning_spec
from autosched.run.problem import BASELINE, ProblemSearch
from autosched.targets.base import Point, Target


def expected_config(problem: Problem, target: Target, point: Point | None) -> str | None:
    """The compilation_info a build of `point` must carry; None for IREE's default and for
    points no configuration carries (custom kernels)."""
    target = target.for_problem(problem)
    if point is None or not target.in_spec(point):
        return None
    return target.lowering_config(problem, point)


def expected_configs(
    problem: Problem, target: Target, point: Point | None
) -> tuple[str, ...] | None:
    """`expected_config` for each form IREE may configure the problem in (its own, then its
    folded forms: `RootOpKind.folded_forms`), of which a build carries one; None as there."""
    own = expected_config(problem, target, point)
    if own is None:
        return None
    target = target.for_problem(problem)
    folded = kind_of(problem).folded_forms(problem)
    return (own, *(target.lowering_config(form, point) for form in folded))


def kernel_job(
    problem: Problem, target: Target, point: Point | None, source: str, repeat: int
) -> CompileJob:
    """The contraction rebuilt as a bare kernel with `point` attached (`source` is written
    here; a custom kernel's module is written by its own compiler, in the compile pool)."""
    target = target.for_problem(problem)
    output = source.removesuffix(".mlir") + ".vmfb"
    before = target.source_command(problem, point, source) if point else []
    if not before:
        write_text(source, kind_of(problem).kernel_module(problem, target, point))
    flags = list(target.compile_flags())
    if repeat > 1:
        flags.append(f"--iree-hal-benchmark-dispatch-repeat-count={repeat}")
        output = output.removesuffix(".vmfb") + f".x{repeat}.vmfb"
    return CompileJob(source, output, [*flags, dump_flag(output)], before)


def dispatch_job(
    benchmark: DispatchBenchmark,
    problem: Problem,
    target: Target,
    point: Point | None,
    stem: str,
    check: bool = False,
) -> CompileJob:
    """IREE's own dispatch built with this one point as a spec (or as IREE would): its
    benchmark module, to time, or (`check`) the module that runs it on given inputs."""
    flags = list(target.compile_flags())
    if point is not None:
        spec = write_text(stem + ".spec.mlir", tuning_spec([(problem, target, point)]))
        flags += target.spec_flags(spec)
    if check:
        output = stem + ".check.vmfb"
        return CompileJob(benchmark.check_source, output, [*flags, dump_flag(output)])
    output = stem + ".dispatch.vmfb"
    return CompileJob(benchmark.source, output, [*flags, *benchmark.flags, dump_flag(output)])


# A candidate over this many times the default's first time is timed with one repetition
# in the worker: it cannot win, and its rank among losers needs no second sample.
SLOW_FACTOR = 2.0
SPEC_PROBE = "spec_probe"  # the build that checks, before a search, that a spec applies


class CandidateBuilds:
    """A run's candidate builds: files, compile jobs and one-point specs, the check that
    each build carries its configuration, and the modules this run built."""

    def __init__(self, config: RunConfig, target: Target, jobs: int):
        self.config, self.target, self.jobs = config, target, jobs
        self.built: set[str] = set()  # modules compiled by this run (not left by another)
        self.shared: dict[str, CompileResult] = {}  # builds every problem of a model shares
        self.shared_lock = threading.Lock()
        # Builds compiled ahead, all cores at once (`prebuild`), by what was compiled.
        self.compiled: dict[tuple, CompileResult] = {}

    def compile_one(self, job: CompileJob) -> CompileResult:
        """`job`'s build: the one compiled ahead, or compiled now."""
        done = self.compiled.get(_job_key(job))
        if done is not None:
            return replace(done, job=job)
        return compile_one(job, self.config.compile_timeout)

    def reused(self, job: CompileJob) -> CompileJob:
        """`job`, marked built when it was compiled ahead (the pool then skips it)."""
        done = self.compiled.get(_job_key(job))
        if done is None or done.status != "ok" or job.built:
            return job
        return replace(job, built=True, built_s=done.seconds)

    def prebuild(self, searches: list[ProblemSearch]) -> None:
        """Compiles, on every core at once, what each search's start builds one after
        another: its default's modules and its one-point spec probes. On resnet18 (12
        problems, 2 cores) these were four compiles a problem in a row, most of the 22 s
        the defaults took."""
        jobs = [job for search in searches if search.benchmark for job in self._opening(search)]
        self.compile_ahead(jobs)

    def compile_ahead(self, jobs: list[CompileJob]) -> None:
        """Compiles `jobs` on every core at once, for `compile_one` and `reused` to find."""
        unique = list({_job_key(job): job for job in jobs if not job.built}.values())
        for result in compile_all(unique, self.config.compile_timeout, self.jobs):
            self.compiled[_job_key(result.job)] = result
            if result.status == "ok":
                self.built.add(result.job.output)

    def _opening(self, search: ProblemSearch) -> list[CompileJob]:
        """The compiles a search's start makes (`Tuning.start_problem`)."""
        jobs = [self.dispatch_job(search, BASELINE, None)]
        if search.default_only:
            return jobs
        if not search.benchmark.checks_model and search.benchmark.check_source:
            jobs.append(self.dispatch_job(search, BASELINE, None, check=True))
        point = self._probe_point(search)
        if point is not None:
            if self.probes_timed_module:
                jobs.append(_configured_job(self.dispatch_job(search, SPEC_PROBE, point)))
            if search.benchmark.model_check is not None:
                jobs.append(
                    _configured_job(self.dispatch_job(search, SPEC_PROBE, point, check=True))
                )
        return jobs

    def source(self, problem: Problem, name: str) -> str:
        """Where a candidate's module (and, beside it, its builds) are written."""
        return os.path.abspath(variant_path(self.config.work_dir, problem, name))

    def kernel_job(
        self, problem: Problem, name: str, point: Point | None, repeat: int
    ) -> CompileJob:
        return kernel_job(problem, self.target, point, self.source(problem, name), repeat)

    def dispatch_job(
        self, search: ProblemSearch, name: str, point: Point | None, check: bool = False
    ) -> CompileJob:
        stem = self.source(search.problem, name).removesuffix(".mlir")
        return dispatch_job(search.benchmark, search.problem, self.target, point, stem, check)

    def default_model_check(self, search: ProblemSearch) -> CompileResult:
        """IREE's default build of the whole model that a convolution's candidates are
        checked on (`checks_model`). It is the same build for every problem of the model,
        so it is compiled once a run: on the H200's host one took 25 s for mobilenet_v3,
        and every problem compiled it twice before its first candidate."""
        source = search.benchmark.check_source
        stem = os.path.splitext(os.path.basename(source))[0]
        output = os.path.join(self.config.work_dir, "model", "check", f"{stem}.{BASELINE}.vmfb")
        with self.shared_lock:
            if output not in self.shared:
                flags = [*self.target.compile_flags(), dump_flag(output)]
                built = compile_one(CompileJob(source, output, flags), self.config.compile_timeout)
                if built.status == "ok":
                    built = replace(built, job=replace(built.job, built=True))
                self.shared[output] = built
            return self.shared[output]

    def candidate(self, search: ProblemSearch, name: str, point: Point | None) -> Candidate:
        """The modules one point needs: the one its answer is checked on, the one timed.

        The timed kernel repeats its dispatch; a kernel that accumulates into its input
        writes in place, so R repeats add the product R times: such problems are checked on
        a build without repeats. A model's problem is timed on IREE's dispatch and checked
        on the dispatch's check module (or, without one, on the bare kernel).
        """
        problem = search.problem
        if search.benchmark:
            timed = self.reused(self.dispatch_job(search, name, point))
            if search.default_only:  # timed alone: no IREE candidate is checked against it
                return Candidate(name, point, {TIMED: timed})
            shared = point is None and search.check is not None and search.benchmark.checks_model
            default = self.default_model_check(search) if shared else None
            if default is not None and default.status == "ok":
                check = default.job  # the default's whole model, built already
            elif search.check is not None:
                check = self.reused(self.dispatch_job(search, name, point, check=True))
                if point is None and check.output in self.built:  # for the default's answer
                    check = replace(check, built=True)
            else:
                check = self.kernel_job(problem, name, point, repeat=1)
        else:
            timed = self.kernel_job(problem, name, point, search.repeat)
            in_place = search.repeat > 1 and not problem.zero_init
            check = self.kernel_job(problem, name, point, repeat=1) if in_place else timed
        if point is not None and search.compile_limit_s is not None:
            limit = search.compile_limit_s
            timed, check = replace(timed, timeout=limit), replace(check, timeout=limit)
        return Candidate(name, point, {CHECK: check, TIMED: timed})

    def task(
        self,
        search: ProblemSearch,
        candidate: Candidate,
        builds: dict[str, CompileResult],
        settings: MeasureSettings,
    ) -> MeasureTask | None:
        """What a bench measures for a compiled candidate; None when a build failed. The
        bench checks what has a check build and times what has a timed one.

        A build that does not carry the point's configuration becomes a `not_applied`
        result in `builds`, so that the candidate is recorded as such and never timed.
        """
        self.built.update(r.job.output for r in builds.values() if r.status == "ok")
        if all(result.status == "ok" for result in builds.values()):
            self._check_applied(search, candidate, builds)
        if any(result.status != "ok" for result in builds.values()):
            return None
        if search.limit_s is not None and candidate.point is not None:
            settings = replace(settings, run_timeout=search.limit_s)
        return MeasureTask(
            problem=search.problem,
            check_module=builds[CHECK].job.output if CHECK in builds else "",
            timed_module=builds[TIMED].job.output if TIMED in builds else "",
            data=search.data,
            repeat=search.repeat,
            settings=settings,
            check=search.check,
            benchmark_function=search.benchmark.function if search.benchmark else None,
            slow_ms=SLOW_FACTOR * search.baseline_ms if search.baseline_ms else None,
            steps=tuple(role for role in (CHECK, TIMED) if role in builds),
        )

    def _check_applied(
        self, search: ProblemSearch, candidate: Candidate, builds: dict[str, CompileResult]
    ) -> None:
        """Marks each build that does not carry the candidate's configuration `not_applied`;
        the default's timed build names the form IREE configured (what is timed)."""
        point = candidate.point
        expected = expected_configs(search.problem, self.target, point)
        bench = search.benchmark
        for role, result in builds.items():
            # A whole model checked: its own roots, not every dispatch's.
            only = search.problem.name if role == CHECK and bench and bench.checks_model else ""
            verdict = check_build(result.job.output, expected, only)
            if not verdict.ok:
                message = f"{role} module: {verdict.message}"
                builds[role] = replace(result, status="not_applied", message=message)
            elif point is None and role == TIMED:
                search.result.timed_form = verdict.form

    @property
    def probes_timed_module(self) -> bool:
        """Whether a search probes its timed module before its first batch: not in fast
        mode, whose first batch (two or three known points) tells as much, since a batch
        none of whose builds carries its configuration stops the search the same way. These
        probes were 12 of resnet18's ~90 CPU compiles. (The check module's probe stays: it
        chooses where answers are checked, `AnswerChecks.choose`.)"""
        return self.config.mode != "fast"

    def probe(self, search: ProblemSearch) -> Applied | None:
        """Does a one-point spec reach the root op IREE configures in the module that is
        timed? One compile to `executable-configurations`; None when it cannot tell (no
        point a spec carries, the probe's point does not build, or fast mode)."""
        point = self._probe_point(search)
        if point is None or search.exhausted or not self.probes_timed_module:
            return None
        job = self.candidate(search, SPEC_PROBE, point).jobs[TIMED]
        verdict = self._configured(job, expected_configs(search.problem, self.target, point))
        if verdict is not None:
            # The probe builds the default's source with the default's flags: its root's
            # form is the one timed (a resumed default was not built by this run).
            search.result.timed_form = search.result.timed_form or verdict.form
        return verdict

    def probe_check(self, search: ProblemSearch) -> Applied | None:
        """Does a one-point spec reach the root in the dispatch's own check module? Built
        from `flow`, a convolution's may have another form (a strided 1x1's stride becomes
        a slice outside the root); None when it cannot tell."""
        point = self._probe_point(search)
        if point is None:
            return None
        job = self.dispatch_job(search, SPEC_PROBE, point, check=True)
        return self._configured(job, expected_configs(search.problem, self.target, point))

    def _probe_point(self, search: ProblemSearch) -> Point | None:
        target = self.target.for_problem(search.problem)
        return next((p for p in search.space.points if target.in_spec(p)), None)

    def _configured(self, job: CompileJob, expected: tuple[str, ...] | None) -> Applied | None:
        """Whether `job`, built to `executable-configurations` only, carries `expected` on
        its roots; None when it does not build (each candidate is checked on its own)."""
        built = self.compile_one(_configured_job(job))
        if built.status != "ok":
            return None
        return check_roots(roots_in(built.job.output), expected)

    def modules_for(
        self,
        problem: Problem,
        trials: list[Trial],
        repeat: int,
        search: ProblemSearch | None = None,
    ) -> dict[str, str]:
        """Each trial's timed module by config name, built by this run (the dispatch build
        when `search` times on IREE's dispatch).

        Resumed trials are compiled again: a module left on disk may come from another arch
        or other flags under the same name.
        """

        def job(trial: Trial) -> CompileJob:
            point = None if trial.baseline else trial.point
            if search is not None and search.benchmark:
                return self.dispatch_job(search, trial.config, point)
            return self.kernel_job(problem, trial.config, point, repeat)

        jobs = {t.config: job(t) for t in trials}
        missing = [job for job in jobs.values() if job.output not in self.built]
        for result in compile_all(missing, self.config.compile_timeout, self.jobs):
            if result.status == "ok":
                self.built.add(result.job.output)
        return {name: job.output for name, job in jobs.items() if job.output in self.built}


def _job_key(job: CompileJob) -> tuple:
    return (job.source, job.output, tuple(job.flags), tuple(job.before))


def _configured_job(job: CompileJob) -> CompileJob:
    """`job` built to `executable-configurations` only, the configured form beside it."""
    output = job.output.removesuffix(".vmfb") + ".configured.mlir"
    flags = [f for f in job.flags if not f.startswith(CONFIGS_FLAG)]
    return replace(job, output=output, flags=[*flags, f"--compile-to={CONFIG_PHASE}"])
