"""The whole-model proof: does a tuning spec keep the model's answers, and does it help?

The model is compiled with and without the spec (and, with a custom-kernel spec, a third
time with custom kernels in place of contractions), each build's outputs are compared with
the default's on the user's inputs or seeded random ones, and one call of the entry function
is timed with each, interleaved over several rounds, so that drift of the machine touches
every build alike. The verdict is one paired statistic: the ratio tuned/default of each
round, its median, and the interval from the smallest to the largest round ratio (with 5
rounds, the median's 94 % interval: `ModelVerdict`). Every tool runs with the real
iree-compile and the real runtime.
"""

from __future__ import annotations

import dataclasses
import filecmp
import os
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from autosched.errors import UserError
from autosched.measure.benchmark_tool import time_module
from autosched.measure.module_io import (
    EntryFunction,
    RunFailed,
    argument_names,
    checked_inputs,
    compare_outputs,
    run_outputs,
    source_entry_function,
)
from autosched.model.configured import DEFAULT_TIMEOUT, iree_compile, tuning_spec_flags
from autosched.model.lowering import prepare_model
from autosched.model.model_build import compiled_once, linked, model_build
from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
from autosched.rewrite.placement import placed_kernels
from autosched.targets.base import Target

FASTER, SLOWER, NO_CHANGE = "faster", "slower", "no change"
VERDICT_ROUNDS = 3  # paired rounds a verdict other than "no change" needs at least
# A change smaller than this share of the model's time is no change: the interval must
# clear 1 by it (identical builds, each round as likely faster as slower, then show all 5
# rounds beyond it far less often than the 1 in 32 of clearing 1 itself).
NOISE_FLOOR = 0.02
CUSTOM = "custom"  # the build with custom kernels, by the name its vmfb is kept under


@dataclass(frozen=True)
class ModelVerdict:
    """The one statistic every whole-model decision uses: the ratio tuned ms / default ms of
    each round (both builds timed in the same round, so drift touches both), its median and
    the interval from the smallest to the largest round ratio. For n independent rounds
    that interval holds the true median ratio with probability 1 - 2**(1 - n) (94 % for 5
    rounds, the sign test's interval). Faster only when the whole interval is below
    1 - NOISE_FLOOR, slower only when it is above 1 + NOISE_FLOOR, else no change within
    noise."""

    ratios: tuple[float, ...]  # tuned / default, one per paired round
    # The tuned module is IREE's default byte for byte: no change, whatever the rounds say.
    identical: bool = False

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def speedup(self) -> float | None:
        """Default over tuned: the inverse of the median ratio."""
        median = self.median
        return 1.0 / median if median else None

    @property
    def verdict(self) -> str:
        if self.identical or len(self.ratios) < VERDICT_ROUNDS:
            return NO_CHANGE
        if max(self.ratios) < 1.0 - NOISE_FLOOR:
            return FASTER
        if min(self.ratios) > 1.0 + NOISE_FLOOR:
            return SLOWER
        return NO_CHANGE

    def describe(self) -> str:
        """`1.23x: faster (5 paired rounds, 1.10x-1.31x)`, in speedups (default/tuned)."""
        if self.identical:
            return "1.00x: no change, the tuned build is IREE's default byte for byte"
        if not self.ratios:
            return "no paired rounds"
        low, high = 1.0 / max(self.ratios), 1.0 / min(self.ratios)
        words = {NO_CHANGE: "no change within noise"}.get(self.verdict, self.verdict)
        rounds = f"{len(self.ratios)} paired round{'s' * (len(self.ratios) != 1)}"
        return f"{self.speedup:.2f}x: {words} ({rounds}, {low:.2f}x-{high:.2f}x)"


def model_verdict(
    default_rounds: Sequence[float], tuned_rounds: Sequence[float], identical: bool = False
) -> ModelVerdict:
    """The ModelVerdict of rounds timed in pairs (a cut run pairs what it has)."""
    pairs = zip(default_rounds, tuned_rounds, strict=False)
    return ModelVerdict(tuple(t / d for d, t in pairs if d and t), identical)


@dataclass
class CustomProof:
    """The model with custom kernels in place of contractions (and the spec for the rest),
    against the same default and spec-only builds of the same proof."""

    replaced: int  # contractions that run a custom kernel
    # Winner (its kernels' problem name) -> the ops that run its kernel (rewrite/placement.py).
    placed: dict[str, int] = dataclasses.field(default_factory=dict)
    ms: float | None = None
    cv: float | None = None
    speedup: float | None = None  # default over this build
    over_spec: float | None = None  # the spec-only build over this one
    outputs_match: bool = False
    max_error: float | None = None
    rounds_ms: list[float] = dataclasses.field(default_factory=list)
    message: str = ""


@dataclass
class RuntimeChoice:
    """One set of IREE runtime flags the proof timed the reported build with."""

    flags: str  # as the cfg would spell them ("" for IREE's defaults)
    ms: float | None  # the reported build's time with them (None: it did not run)


@dataclass
class ModelProof:
    """The model compiled without and with the spec: answers compared, calls timed.

    Times are one call of `function` in ms: the median of the rounds' medians, and the
    coefficient of variation of those round medians. `speedup` is default over tuned, from
    the paired rounds (`verdict`).
    """

    function: str
    default_ms: float
    tuned_ms: float | None
    default_cv: float
    tuned_cv: float | None
    speedup: float | None
    outputs_match: bool
    max_error: float | None  # largest output error relative to its largest magnitude
    outputs: int = 0
    default_rounds_ms: list[float] = dataclasses.field(default_factory=list)
    tuned_rounds_ms: list[float] = dataclasses.field(default_factory=list)
    message: str = ""  # why the outputs differ, or why the tuned module could not be timed
    # False where IREE's default gives NaN or inf on the inputs: nothing could be compared.
    outputs_compared: bool = True
    custom: CustomProof | None = None  # with `custom_spec`: the build with custom kernels
    default_only: bool = False  # no spec and no custom spec: the default alone was timed
    runtime_flags: str = ""  # IREE runtime flags every build was timed with
    # With several candidates (`runtime_flags = auto` on CUDA): each one's time of the
    # reported build; the fastest became `runtime_flags`.
    runtime_choices: list[RuntimeChoice] = dataclasses.field(default_factory=list)
    # Compile flags the reported build (custom, else tuned) took from `build_choices`, and
    # each choice's time of it (RuntimeChoice: the flags, the ms).
    build_flags: str = ""
    build_flags_of: str = ""  # the build that took them: custom or tuned
    build_choices: list[RuntimeChoice] = dataclasses.field(default_factory=list)
    # The tuned module is the default's byte for byte (the spec configures none of its
    # dispatches): timed once a round, its rounds are the default's.
    identical: bool = False
    vmfbs: dict[str, str] = dataclasses.field(default_factory=dict)  # each build as timed

    @property
    def verdict(self) -> ModelVerdict:
        """The paired statistic of the default's and the tuned build's rounds."""
        return model_verdict(self.default_rounds_ms, self.tuned_rounds_ms, self.identical)


def _summary(rounds: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(rounds)
    cv = statistics.pstdev(rounds) / mean if mean else 0.0
    return statistics.median(rounds), cv


@dataclass
class _Build:
    """One build of the model in a proof: its answers against the default's, its times."""

    name: str
    vmfb: str | None
    runs: bool = True
    match: bool = True
    max_error: float | None = None
    message: str = ""
    compared: bool = True  # False: the default's answer has NaN or inf
    rounds: list[float] = dataclasses.field(default_factory=list)
    placed: dict[str, int] = dataclasses.field(default_factory=dict)  # custom: winner -> ops
    # The default's module byte for byte: two timings of one module differ by noise alone
    # (a 2-core machine once saw one such pair 1.03x-1.28x apart over all 5 rounds).
    identical: bool = False
    recipe: tuple[str, tuple[str, ...]] | None = None  # what it is compiled from, and how


@dataclass
class _Run:
    """What every build of one proof runs with: its device, inputs and timing settings."""

    model_path: str
    device: str
    timeout: float
    work: str  # keeps the vmfbs, inputs and outputs
    repetitions: int
    min_time: float
    runtime_flags: tuple[str, ...] = ()  # IREE runtime flags of every timing (the cfg's)
    entry: EntryFunction | None = None
    inputs: list[str] = dataclasses.field(default_factory=list)
    given_inputs: str = ""  # the user's .npz file ("": seeded random inputs)
    seed: int = 0
    default_model: str = ""  # the model IREE's default is built from (its argument names)
    build_cache: str = ""  # where the whole-model builds are kept (model_build.py); "": none
    reference: list = dataclasses.field(default_factory=list)  # the default's outputs
    unusable: str = ""  # why the default's outputs cannot be compared ("": they can)
    build_flags: tuple[str, ...] = ()  # compile flags the reported build took (a choice)
    build_flags_of: str = ""  # that build's name: custom or tuned


@dataclass
class _Builds:
    """The proof's builds: the default, the spec's, and the custom kernels' (with the number
    of contractions they replace); `compiled` are those that take part, the default first."""

    default: _Build
    tuned: _Build
    custom: tuple[_Build, int] | None = None
    compiled: list[_Build] = dataclasses.field(default_factory=list)


def prove(
    model_path: str,
    flags: Sequence[str],
    spec_path: str | None,
    device: str,
    seed: int = 0,
    rounds: int = 5,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    spec_flag: str = Target.tuning_spec_flag,
    function: str | None = None,
    repetitions: int = 3,
    min_time: float = 0.05,
    tolerance: float | None = None,
    work_dir: str | None = None,
    custom_spec: str | None = None,
    default_model: str | None = None,
    runtime_flags: Sequence[str] = (),
    runtime_choices: Sequence[Sequence[str]] = (),
    inputs: str = "",
    build_cache: str = "",
    build_choices: Sequence[Sequence[str]] = (),
) -> ModelProof:
    """Compiles the model without and with the spec, compares outputs, times both.

    Inputs are the user's `inputs` (.npz), else random with `seed`, drawn again in a saner
    range where IREE's default gives NaN or inf on them (module_io.checked_inputs); outputs
    are compared per element type (verify.TOLERANCE, integers exactly) unless `tolerance`
    is given. Timing: `rounds` rounds, each timing every build with iree-benchmark-module
    (`repetitions` x `min_time`), in an order that turns each round. A compile failure, or
    a default module that fails to run, is a UserError; a tuned module that fails to run or
    be timed is a proof with `outputs_match` False or no tuned time, the reason in `message`.
    `work_dir` keeps the vmfbs, inputs and outputs.
    With `custom_spec` (substitution.py) a third build runs custom kernels in place of the
    contractions it matches, with the spec for the rest (`custom`). With neither spec, the
    default alone is compiled and timed (`default_only`): a run that found nothing faster
    still reports the model's time. With `default_model` (the user's model, the tuned builds
    starting from its rewritten layout: model/layouts.py) IREE's default is built from that,
    and the model at `model_path` is a tuned build even without a spec.
    `runtime_flags` (IREE's) time every build alike; with two or more `runtime_choices`
    the reported build (custom, else tuned, else the default) is timed with each first, and
    the fastest times every build: a call's cost beside its kernels depends on the model.
    With `build_cache` the builds are taken from (or kept in) that cache (model_build.py):
    a run's own compile of the model is its default build, the spec check's its tuned one.
    `build_choices` are compile flag sets (`measure/contract.fusion_choices`): the reported
    build is compiled with each (() is the build as it is), checked, and with two or more
    timed with each; the fastest (or the only one) is the build the proof times.
    """
    if rounds < 1:
        raise UserError(f"rounds is {rounds}: at least 1")
    spec = tuning_spec_flags(spec_path, spec_flag)
    with tempfile.TemporaryDirectory(prefix="autosched-proof-") as scratch:
        run = _Run(
            model_path, device, timeout, work_dir or scratch, repetitions, min_time,
            tuple(runtime_flags), given_inputs=inputs, seed=seed,
            default_model=default_model or model_path, build_cache=build_cache,
        )  # fmt: skip
        source = prepare_model(model_path, run.work)
        baseline = prepare_model(default_model, run.work) if default_model else source
        tuned = spec_path is not None or baseline != source
        builds = _compile_builds(run, (baseline, source), flags, spec, tuned, custom_spec)
        _mark_identical(builds)
        run.entry = source_entry_function(source, flags, function, run.work, timeout, model_path)
        _check_outputs(run, builds, tolerance)
        built = _choose_build_flags(run, builds, build_choices, tolerance)
        choices = _choose_runtime_flags(run, builds, runtime_choices)
        for round_index in range(rounds):
            _time_round(run, builds, round_index)
    proof = _model_proof(run.entry, builds)
    proof.runtime_flags, proof.runtime_choices = " ".join(run.runtime_flags), choices
    proof.build_flags, proof.build_choices = " ".join(run.build_flags), built
    proof.build_flags_of = run.build_flags_of
    proof.vmfbs = {build.name: build.vmfb for build in builds.compiled if build.vmfb}
    return proof


def _compile_builds(
    run: _Run,
    sources: tuple[str, str],
    flags: Sequence[str],
    spec: list[str],
    has_spec: bool,
    custom_spec: str | None,
) -> _Builds:
    """The default build (from the first of `sources`); the spec's with a spec or a custom
    spec, and the custom kernels' (from the second)."""
    baseline, source = sources
    default_vmfb = _whole_model(run, (run.default_model, baseline), flags, "default.vmfb")
    default = _Build("default", default_vmfb)
    builds = _Builds(default, _Build("tuned", None, runs=False), compiled=[default])
    if has_spec or custom_spec:
        builds.tuned.vmfb = _whole_model(
            run, (run.model_path, source), [*flags, *spec], "tuned.vmfb"
        )
        builds.tuned.runs = True
        builds.tuned.recipe = (source, (*flags, *spec))
        builds.compiled.append(builds.tuned)
    if custom_spec:
        builds.custom = custom_build(
            source, custom_spec, flags, spec, run.work, run.timeout, run.build_cache
        )
        builds.compiled.append(builds.custom[0])
    return builds


def _whole_model(run: _Run, model: tuple[str, str], flags: Sequence[str], name: str) -> str:
    """The model (as given, as prepared) built with `flags` at `name` in the proof's folder:
    from the run's build cache where it has one, else compiled."""
    out = os.path.join(run.work, name)
    given, prepared = model
    if run.build_cache:
        build = model_build(given, flags, run.build_cache, run.timeout, named=run.model_path)
        return linked(build.vmfb, out)
    return iree_compile(prepared, flags, out, run.timeout, run.model_path)


def _check_outputs(run: _Run, builds: _Builds, tolerance: float | None) -> None:
    """The inputs and the default build's outputs on them, and every other build's compared
    with those (where they are finite: else each build says why nothing was compared)."""

    def default_outputs(inputs: list[str]) -> list:
        folder = os.path.join(run.work, "default")
        return run_outputs(builds.default.vmfb, run.device, run.entry, inputs, folder, run.timeout)

    try:
        checked = checked_inputs(
            run.entry, os.path.join(run.work, "inputs"), run.seed, default_outputs,
            run.given_inputs, argument_names(run.default_model) if run.given_inputs else (),
        )  # fmt: skip
    except RunFailed as error:
        raise UserError(f"{run.model_path}: the model without the spec fails: {error}") from None
    run.inputs, run.reference, run.unusable = checked.flags, checked.reference, checked.unusable
    for build in builds.compiled[1:]:
        if build.runs:
            _checked(run, build, tolerance)


def _checked(run: _Run, build: _Build, tolerance: float | None) -> None:
    """The build's outputs against the default's (`_check_outputs`)."""
    _check_build(run, build, run.reference, tolerance)
    if run.unusable and build.runs:
        build.match, build.compared, build.message = False, False, run.unusable


def _check_build(run: _Run, build: _Build, expected: list, tolerance: float | None) -> None:
    try:
        outputs = run_outputs(
            build.vmfb,
            run.device,
            run.entry,
            run.inputs,
            os.path.join(run.work, build.name),
            run.timeout,
        )
        build.match, build.max_error, build.message = compare_outputs(
            outputs, expected, run.entry, tolerance
        )
    except RunFailed as error:
        build.match, build.runs = False, False
        build.message = f"the {build.name} model fails: {error}"


def _reported(builds: _Builds) -> _Build:
    """The build the run reports as its fastest: custom kernels, else the spec's."""
    custom = builds.custom[0] if builds.custom else None
    for build in (custom, builds.tuned):
        if build is not None and build.runs and build.match:
            return build
    return builds.default


def _timed_in_turn(run: _Run, runs: dict) -> dict:
    """Each key's (module, runtime flags) of `runs` timed twice, in turn; each one's faster
    time (None where it never ran)."""
    times = {key: [] for key in runs}
    for _ in range(2):
        for key, (vmfb, flags) in runs.items():
            timing = time_module(
                vmfb, run.device, run.inputs, 1, run.repetitions, run.min_time,
                run.timeout, run.entry.name, flags,
            )  # fmt: skip
            if timing.status == "ok":
                times[key].append(timing.median_ms)
    return {key: min(t) if t else None for key, t in times.items()}


def _choose_runtime_flags(run: _Run, builds: _Builds, choices) -> list[RuntimeChoice]:
    """With two or more candidate flag sets, times the reported build with each (twice,
    in turn, keeping each one's faster time) and sets the fastest as the run's flags."""
    if len(choices) < 2:
        return []
    build = _reported(builds)
    times = _timed_in_turn(run, {tuple(c): (build.vmfb, tuple(c)) for c in choices})
    ran = [(ms, flags) for flags, ms in times.items() if ms is not None]
    if ran:
        run.runtime_flags = min(ran)[1]
    return [RuntimeChoice(" ".join(flags), ms) for flags, ms in times.items()]


def _choose_build_flags(
    run: _Run, builds: _Builds, choices: Sequence[Sequence[str]], tolerance: float | None
) -> list[RuntimeChoice]:
    """The reported build compiled with each of `choices` (() as it is) and checked; of two
    or more that run alike, each timed twice, in turn, and the fastest kept where it beats
    the build as it is by more than NOISE_FLOOR (a build the default's byte for byte, or the
    default itself, is left alone: its flags would be the whole gain). Each choice's time
    (None: it did not build, run or agree)."""
    build = _reported(builds)
    if not any(choices) or build is builds.default or build.identical or not build.recipe:
        return []
    variants = {}
    for flags in map(tuple, choices):
        variant = _variant(run, build, flags, len(variants)) if flags else build
        if flags and variant is not None:
            _checked(run, variant, tolerance)
        variants[flags] = variant
    usable = {f: v for f, v in variants.items() if v is not None and v.runs and v.match}
    times = dict.fromkeys(variants)
    if len(usable) > 1:
        times |= _timed_in_turn(run, {f: (v.vmfb, run.runtime_flags) for f, v in usable.items()})
    if len(variants) == 1:  # one set of flags: applied where it builds and agrees
        chosen = next(iter(usable), ())
    else:
        as_is = times.get(())
        faster = [
            (ms, flags) for flags, ms in times.items()
            if flags and ms is not None and (as_is is None or ms < as_is * (1 - NOISE_FLOOR))
        ]  # fmt: skip
        chosen = min(faster)[1] if faster else ()
    if chosen:
        build.vmfb, build.max_error = usable[chosen].vmfb, usable[chosen].max_error
        run.build_flags, run.build_flags_of = chosen, build.name
    if len(variants) < 2:  # nothing was chosen between
        return []
    return [RuntimeChoice(" ".join(flags), ms) for flags, ms in times.items()]


def _variant(run: _Run, build: _Build, flags: tuple[str, ...], index: int) -> _Build | None:
    """The build compiled again with `flags` too (once a run where it has a build cache:
    each function of a model builds the same module); None where that does not compile."""
    source, compiled_with = build.recipe
    every = [*compiled_with, *flags]
    out = os.path.join(run.work, f"{build.name}.choice{index}.vmfb")
    try:
        if not run.build_cache:
            return _Build(build.name, iree_compile(source, every, out, run.timeout, run.model_path))
        once = compiled_once(source, every, run.build_cache, run.timeout, run.model_path)
    except (RuntimeError, UserError):
        return None
    return _Build(build.name, linked(once, out))


def _mark_identical(builds: _Builds) -> None:
    """Marks each build whose module is the default's byte for byte."""
    for build in builds.compiled[1:]:
        if build.vmfb and filecmp.cmp(builds.default.vmfb, build.vmfb, shallow=False):
            build.identical = True


def _time_round(run: _Run, builds: _Builds, round_index: int) -> None:
    """One round: every build that runs timed once, starting one build later each round; a
    build identical to the default takes the default's time of the round."""
    shift = round_index % len(builds.compiled)
    for build in builds.compiled[shift:] + builds.compiled[:shift]:
        if build.runs and not build.identical:
            _time_build(run, build, is_default=build is builds.default)
    for build in builds.compiled[1:]:
        if build.runs and build.identical:
            build.rounds.append(builds.default.rounds[-1])


def _time_build(run: _Run, build: _Build, is_default: bool) -> None:
    """One timing of the build; a build other than the default that fails stops running."""
    timing = time_module(
        build.vmfb,
        run.device,
        run.inputs,
        dispatch_repeat=1,
        repetitions=run.repetitions,
        min_time=run.min_time,
        timeout=run.timeout,
        function=run.entry.name,
        runtime_flags=run.runtime_flags,
    )
    if timing.status == "ok":
        build.rounds.append(timing.median_ms)
        return
    if is_default:
        raise UserError(
            f"{run.model_path}: timing the model without the spec failed: {timing.message}"
        )
    build.runs, build.rounds = False, []
    build.message = "; ".join(
        m for m in (build.message, f"timing the {build.name} model: {timing.message}") if m
    )


def _model_proof(entry: EntryFunction, builds: _Builds) -> ModelProof:
    default, tuned, custom = builds.default, builds.tuned, builds.custom
    default_ms, default_cv = _summary(default.rounds)
    tuned_ms = tuned_cv = None
    if tuned.rounds:
        tuned_ms, tuned_cv = _summary(tuned.rounds)
    speedup = model_verdict(default.rounds, tuned.rounds, tuned.identical).speedup
    return ModelProof(
        function=entry.name,
        default_ms=default_ms,
        tuned_ms=tuned_ms,
        default_cv=default_cv,
        tuned_cv=tuned_cv,
        speedup=speedup,
        outputs_match=tuned.match,
        max_error=tuned.max_error,
        outputs=len(entry.outputs),
        default_rounds_ms=default.rounds,
        tuned_rounds_ms=tuned.rounds,
        message=tuned.message,
        # Alone, the default is compared with nothing: the summary must not say it matched.
        outputs_compared=tuned.compared and len(builds.compiled) > 1,
        custom=_custom_proof(custom, default_ms, tuned_ms) if custom else None,
        default_only=len(builds.compiled) == 1,
        identical=tuned.identical,
    )


def custom_build(source, custom_spec, flags, spec, work, timeout, cache="") -> tuple[_Build, int]:
    """The model with custom kernels in place of their contractions (a build that does not
    compile is one that does not run: the spec-only proof stands); compiled once into
    `cache` where there is one (a model proved on several buckets builds it once)."""
    build = _Build(CUSTOM, None)
    try:
        rewritten, replaced = rewrite_model(
            source, custom_spec, flags, os.path.join(work, "custom.mlir"), timeout
        )
        build.placed = dict(placed_kernels(rewritten))
        build.recipe = (rewritten, (*flags, *spec, RESUME_FLAG))
        out = os.path.join(work, "custom.vmfb")
        if cache:
            once = compiled_once(rewritten, build.recipe[1], cache, timeout, source)
            build.vmfb = linked(once, out)
        else:
            build.vmfb = iree_compile(rewritten, list(build.recipe[1]), out, timeout, source)
    except (RuntimeError, UserError) as error:
        build.runs, build.match, build.message = False, False, f"does not compile: {error}"
        return build, 0
    if not replaced:
        build.runs, build.match = False, False
        build.message = "the custom-kernel spec matched no contraction of the model"
    return build, replaced


def _custom_proof(custom: tuple[_Build, int], default_ms: float, tuned_ms: float | None):
    build, replaced = custom
    proof = CustomProof(
        replaced=replaced,
        placed=build.placed,
        outputs_match=build.match and build.runs,
        max_error=build.max_error,
        rounds_ms=build.rounds,
        message=build.message,
    )
    if build.rounds:
        proof.ms, proof.cv = _summary(build.rounds)
        proof.speedup = default_ms / proof.ms
        proof.over_spec = tuned_ms / proof.ms if tuned_ms else None
    return proof
