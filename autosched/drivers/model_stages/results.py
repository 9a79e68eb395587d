"""What each stage of a model run hands to the next: plain data, no behaviour, so that the
stages (and the report, which every stage prints through) import it without a circle."""

from __future__ import annotations

from dataclasses import dataclass, field

from autosched.config import RunConfig
from autosched.drivers.campaign import CampaignReport, ModelProblem
from autosched.model.buckets import BucketModel
from autosched.model.layouts import ModelLayout
from autosched.outputs.paths import RunPaths
from autosched.outputs.records import Trial
from autosched.outputs.report import RunLog
from autosched.run.phases import PhaseClock
from autosched.run.problem import ProblemResult
from autosched.targets.base import Target


@dataclass
class ModelDispatches:
    """Every dispatch IREE forms that has a benchmark module, and its launches per call."""

    benchmarks: dict = field(default_factory=dict)  # entry point -> DispatchBenchmark
    calls: dict[str, int] = field(default_factory=dict)  # entry point -> launches


@dataclass
class Prepared:
    """The prepare stage's result: the model every build starts from and what to tune."""

    config: RunConfig
    target: Target
    paths: RunPaths
    work: str  # the run's model folder
    layout: ModelLayout  # its `source` is the model every build starts from
    flags: list[str]  # the target's compile flags with what the model's types need
    problems: list[ModelProblem]
    skipped: dict[str, int]  # reason -> count of the roots not tuned
    budget: int  # trials in all
    dispatches: ModelDispatches = field(default_factory=ModelDispatches)
    clock: PhaseClock = field(default_factory=PhaseClock)  # every stage's phases, from the start
    buckets: BucketModel | None = None  # a dynamic model tuned on buckets (model/buckets.py)


@dataclass
class Searched:
    """The search stage's result: the campaign's account and the custom route's searches
    (each problem's own result is on its `ModelProblem`)."""

    log: RunLog
    campaign: CampaignReport  # its budget, trials, skipped roots and custom trials
    custom: dict[str, ProblemResult]  # problem name -> its custom-kernel search
    measured: list[Trial] = field(default_factory=list)  # every candidate the run measured


@dataclass
class Decided:
    """The decide stage's result: the spec and the custom spec written, where the spec
    applies in the model, the whole model's proof and the summary's per-problem rows."""

    spec_path: str | None
    custom_spec: str | None
    applied: dict[str, bool]  # problem name -> its dispatches carry the tuned configuration
    proof: dict | None  # the summary's `model` numbers
    rows: list[dict]  # per problem: shares, the spec, the route its winner took
    # The problems whose winner is not in the built model (rewrite/placement.NotPlaced).
    not_placed: list = field(default_factory=list)

    @property
    def custom_wins(self) -> bool:
        """Whether the custom kernels made the model faster than the spec alone, with the
        same outputs."""
        verdict = (self.proof or {}).get("custom") or {}
        return (
            bool(self.custom_spec)
            and bool(verdict.get("outputs_match"))
            and (verdict.get("over_spec") or 0) > 1
        )
