"""What every backend provides: knobs, constraints, attribute text, flags, device."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module

from autosched.config import Knob, RunConfig
from autosched.errors import UserError
from autosched.ops.base import Problem
from autosched.ops.registry import BASE_KIND
from autosched.outputs.spec_flags import SPEC_SAFE_FLAGS
from autosched.targets.host import Machine

Point = dict[str, Knob]
MAX_KNOB = 1 << 20  # no tile, vector or thread count of a real kernel comes near this


@dataclass(frozen=True)
class KnobSpec:
    """One tunable: its name in [SearchSpace], its type, and what it means."""

    name: str
    help: str
    choices: tuple[str, ...] = ()  # for named knobs; empty for integer knobs
    minimum: int = 1  # smallest integer value; 0 where 0 means "derive" or "off"


@dataclass(frozen=True)
class Constraint:
    """A rule a point must pass before it is compiled.

    `needs` lists the knobs the test reads, so the space builder can apply it as soon as
    those are chosen and prune the rest of the product early.
    """

    reason: str
    needs: tuple[str, ...]
    test: Callable[[Problem, Point], bool]


@dataclass(frozen=True)
class Family:
    """One part of a target's space: knobs it pins, candidates of its own, its rules.

    Most targets have one. The CUDA target has two: IREE's pipelines, and custom kernels
    (which pin IREE's knobs to neutral values and search their own). The space is the union.
    """

    name: str
    constraints: list[Constraint]
    fixed: dict[str, list[Knob]] = field(default_factory=dict)  # knob -> its only values
    candidates: dict[str, list[Knob]] = field(default_factory=dict)  # when the cfg is silent


def by_role(problem, values: dict[str, int]) -> str:
    """A tile list in the op's loop order (`problem.loops` names each loop's role): each loop
    gets its role's value, 0 where `values` has none."""
    return "[" + ", ".join(str(values.get(role, 0)) for role in problem.loops) + "]"


def divides_role(knob: str, role: str) -> Constraint:
    """The rule that `knob` divides the size of the loops of `role` (`problem.size`)."""
    return Constraint(
        f"{knob} does not divide {role}", (knob,), lambda p, x: p.size(role) % x[knob] == 0
    )


def has_config(target: Target, problem: Problem, point: Point) -> bool:
    """Whether a tuning spec can carry `point` of `problem` (custom kernels cannot)."""
    return target.for_problem(problem).in_spec(point)


def powers_of_two(low: int, high: int) -> list[int]:
    values, p = [], 1
    while p <= high:
        if p >= low:
            values.append(p)
        p *= 2
    return values


def problem_candidates(dim: int, low: int, high: int) -> list[int]:
    """Powers of two up to the dimension plus its divisors up to 16 (MindSpore Lite's rule)."""
    values = set(powers_of_two(low, min(dim, high)))
    values.update(d for d in range(max(low, 1), 17) if dim % d == 0 and d <= high)
    return sorted(values)


class KindViews:
    """A backend's views for each root-op kind: the kind's subclass of the backend, sharing
    its state (device, arch, tools), made once. Kept apart from `Target`, which says what a
    backend does for one kind."""

    # Root-op kinds other than the one the backend's own class tunes (ops/registry.BASE_KIND),
    # each with its own knobs on this backend: kind name -> (module, class) of a subclass that
    # overrides the per-problem methods.
    kind_targets: dict[str, tuple[str, str]] = {}

    def tunes(self, kind: str) -> bool:
        """Whether this backend has knobs for a root-op kind."""
        return kind == BASE_KIND or kind in self.kind_targets

    def for_problem(self, problem: Problem) -> Target:
        """This backend as it tunes `problem`'s root-op kind."""
        return self.for_kind(problem.kind)

    def for_kind(self, kind: str) -> Target:
        """This backend as it tunes one root-op kind: itself for BASE_KIND, else the kind's
        subclass, sharing this target's state (device, arch, tools)."""
        base = getattr(self, "base", self)
        if kind == BASE_KIND:
            return base
        views = base.__dict__.setdefault("_views", {})
        if kind not in views:
            if kind not in base.kind_targets:
                raise KeyError(f"{base.name} does not tune {kind} roots")
            module, cls = base.kind_targets[kind]
            view = object.__new__(getattr(import_module(module), cls))
            view.__dict__.update(base.__dict__)
            view.base = base
            views[kind] = view
        return views[kind]

    def all_knobs(self) -> tuple[KnobSpec, ...]:
        """Every kind's knobs on this backend (what a cfg may set)."""
        knobs = list(self.knobs)
        for kind in self.kind_targets:
            view = self.for_kind(kind)
            knobs += [k for k in view.knobs if k.name not in {n.name for n in knobs}]
        return tuple(knobs)


class Target(KindViews, ABC):
    """One backend. Adding a backend means adding one module under targets/."""

    name: str
    knobs: tuple[KnobSpec, ...]
    default_device: str
    default_dispatch_repeat: int  # dispatches per timed call (DESIGN.md: time dispatches)
    timing_overlaps_compile = False  # time a candidate while others compile (GPU targets)
    # The timer `timer = auto` picks: the worker where it was checked against
    # iree-benchmark-module (benchmarks/worker_timer_check.py), else the tool.
    default_timer = "tool"
    arch = ""  # the chip the code is built for, where the backend has such a notion
    tuning_spec_flag = "--iree-codegen-tuning-spec-path"  # how iree-compile takes a spec
    # A strided 1x1 convolution is read through a strided slice before dispatches form
    # (model/layouts.py): where its strided form has no fast configuration.
    slices_strided_convolutions = False
    # A single-row contraction (a decode step's projection) is made a generic before
    # dispatches form (model/single_rows.py): where its batch-matmul form is slow and the
    # step launches one kernel per op.
    generalizes_single_rows = False
    # Flags a model's own types need, in every compile of it (model/input_types.py).
    input_flags: tuple[str, ...] = ()

    def __init__(self, config: RunConfig, machine: Machine | None = None):
        """`machine` is what discovery found on this host (host.discover): a target runs
        no process of its own."""
        self.config = config
        self.machine = machine or Machine()
        self.device = config.device or self.default_device

    def use_input_flags(self, flags: list[str]) -> None:
        """Every compile of this model gets `flags` (its kinds' views too)."""
        base = getattr(self, "base", self)
        for holder in [base, *base.__dict__.get("_views", {}).values()]:
            holder.input_flags = tuple(flags)

    @property
    def knob_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def check_device(self) -> None:  # noqa: B027 - most targets need no check
        """Raises UserError when this machine cannot run the target's code."""

    def dispatch_repeat(self, problem: Problem) -> int:
        """Dispatches per timed call when the cfg leaves dispatch_repeat at 0."""
        return self.default_dispatch_repeat

    def supports(self, problem: Problem) -> str | None:
        """None when the target can tune this problem, else the reason it cannot."""
        return None

    def starting_points(self, problem: Problem) -> list[Point]:
        """Points known to be good on this target, measured before the tuner's own picks.

        Each names only the knobs that matter (a partial point); the first point of the
        space that agrees on all of them is measured. Most targets know none.
        """
        return []

    @abstractmethod
    def candidates(self, knob: str, problem: Problem) -> list[Knob]:
        """Values for a knob the cfg leaves out, generated from the problem."""

    @abstractmethod
    def constraints(self, problem: Problem) -> list[Constraint]:
        """The rules a point must pass, in the order they are best applied."""

    def families(self, problem: Problem, lists: dict[str, list[Knob]]) -> list[Family]:
        """The parts of the space (`lists`: the cfg's knob lists); one by default."""
        return [Family("", self.constraints(problem))]

    def source_command(self, problem: Problem, point: Point, source: str) -> list[str]:
        """A command that writes a point's module to `source`, for points whose module is
        not a lowering configuration on the op (custom kernels); [] for the others."""
        return []

    def in_spec(self, point: Point) -> bool:
        """Whether a tuning spec (a lowering configuration) can carry this point."""
        return True

    @abstractmethod
    def lowering_config(self, problem: Problem, point: Point) -> str:
        """The #iree_codegen.compilation_info attribute text for a point."""

    def decomposition_config(self, problem: Problem, point: Point) -> str | None:
        """The `decomposition_config` dictionary an attention point sets beside its
        compilation_info (the Q.K and P.V matmuls' configurations); None where none is set."""
        return None

    @abstractmethod
    def compile_flags(self) -> list[str]:
        """iree-compile flags that select this backend."""

    def spec_flags(self, spec_path: str) -> list[str]:
        """iree-compile flags that apply a tuning spec file (see spec.SPEC_SAFE_FLAGS)."""
        return [f"{self.tuning_spec_flag}={spec_path}", *SPEC_SAFE_FLAGS]

    def module_attributes(self) -> dict[str, str]:
        """Attributes the module needs (name -> MLIR text), e.g. a full GPU target; often none."""
        return {}

    @abstractmethod
    def config_name(self, point: Point) -> str:
        """A short, readable, file-name-safe name for a point."""

    @abstractmethod
    def features(self, problem: Problem, point: Point) -> dict[str, float]:
        """Numbers that describe a point for the cost model: knobs and derived quantities."""

    def describe(self) -> str:
        return f"{self.name} (device {self.device})"


def check_search_space(target: Target, config: RunConfig) -> None:
    """Every knob the cfg sets must be a knob of this target, with values of its type."""
    knobs = target.all_knobs()
    for key, values in config.knob_space.items():
        spec = next((k for k in knobs if k.name == key), None)
        section = f"{config.source}: [{config.knob_section(key)}]"
        where = f"{section} {key} = {values}"
        if spec is None:
            raise UserError(
                f"{section} unknown key {key!r} for target {target.name} "
                f"(knobs: {', '.join(k.name for k in knobs)}; a section [SearchSpace.<target>] "
                "holds knobs used only with that target)"
            )
        for value in values:
            if spec.choices and value not in spec.choices:
                raise UserError(f"{where}: {value!r} is not one of {', '.join(spec.choices)}")
            if not spec.choices and (
                not isinstance(value, int) or not spec.minimum <= value <= MAX_KNOB
            ):
                raise UserError(
                    f"{where}: {value!r} is not an integer from {spec.minimum} to {MAX_KNOB}"
                )


def recorded_point(target: Target, point: Point) -> Point:
    """A point as an older record wrote it, with the integer knobs added since at their
    neutral value, 0 (so today's features can describe it)."""
    return {**{k.name: 0 for k in target.knobs if not k.choices}, **point}
