"""What every root-op kind provides, and where a root is found.

A kind (matmul, attention, convolution and gather, each tuned) says how its root ops are recognised
in the dispatches IREE forms, what problem one becomes, the spec matcher that finds its roots
again and, where it has one, the kernel module that rebuilds one alone. A recognised root is
a `Root`; the problem a target tunes is a `Problem`, the one type that generic code (measure/,
outputs/, run/, search/, targets/) names: each kind's problem answers for its own record
fields, reference data, tolerance and bytes, so nothing outside ops/ branches on the kind.
Each target holds each kind's knobs, constraints and features (`Target.for_problem`).
`registry.py` lists the kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Protocol

import numpy as np
from iree.compiler import ir

ANY_OP = "!transform.any_op"
ANY_VALUE = "!transform.any_value"
PARAM = "!transform.param<i64>"

# Largest error a check allows, relative to the largest magnitude of the reference. Inputs are
# exact in their type, so the error is the accumulator's rounding; a wrong tiling is off by
# order one.
TOLERANCE = {"f64": 1e-10, "f32": 1e-4, "f16": 1e-2, "bf16": 3e-2}
MIXED_TOLERANCE = 1e-3  # f16/bf16 (or fp8) inputs accumulated in f32


def accumulated_tolerance(input_type: str, acc_type: str) -> float:
    """The tolerance of a sum of products of `input_type` values kept in `acc_type`."""
    if acc_type == "f32" and input_type != "f32":
        return MIXED_TOLERANCE
    return TOLERANCE[acc_type]


class Operand(NamedTuple):
    """One input of a problem's check: the name its file takes, its shape, its element type."""

    name: str
    shape: list[int]
    element: str


class Problem(Protocol):
    """One signature of a root op that a target tunes: what generic code asks of any kind's
    problem (MatmulProblem, AttentionProblem, ConvolutionProblem and GatherProblem answer it
    structurally)."""

    kind: ClassVar[str]  # its root-op kind (ops/registry.py)
    zero_init: bool  # its kernel takes no accumulator to add into
    op_name: str  # the root op's name (its builds' folder, the configured form)
    indexing_maps: str  # the root op's maps as MLIR prints them (its configured form)
    sites: list  # where it occurs: OpSites of a module, or DispatchSites of a model

    @property
    def name(self) -> str:
        """Unique among problems: records, CSV rows and spec names say it."""

    @property
    def flops(self) -> int: ...

    @property
    def output_shape(self) -> list[int]: ...

    @property
    def out_type(self) -> str: ...

    def key(self) -> Hashable:
        """Identical problems (and roots) have equal keys: one tuning serves them all."""

    def record_shape(self) -> dict:
        """What a record keeps of the problem (`from_shape` reads it back)."""

    @classmethod
    def from_shape(cls, shape: dict) -> Problem:
        """The problem a record names (a custom-route kind's only in its op form)."""

    def csv_shape(self) -> dict:
        """The CSV's shape columns: M, N, K, batch and the element types."""

    def tolerance(self) -> float:
        """The largest relative error a correct answer has."""

    def check_operands(self) -> list[Operand] | None:
        """The inputs of its check against numpy, or None: checked only on IREE's dispatch,
        against the default build's outputs."""

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The answer in float64 with numpy, for `check_operands`' values in order."""

    def reference_bytes(self) -> int:
        """Peak host memory to make its check's inputs and reference, roughly."""


class Root(Protocol):
    """A root op recognised in a model's dispatches, with every dispatch that holds it."""

    sites: list[DispatchSite]

    @property
    def occurrences(self) -> int: ...

    def key(self) -> Hashable:
        """Identical roots merge."""

    def as_problem(self) -> Problem | None:
        """The problem a target tunes for it (None where it has no form a target tunes)."""


@dataclass(frozen=True)
class DispatchSite:
    """One dispatch that holds an op: its executable, entry point, launches and neighbours."""

    executable: str  # the flow.executable symbol
    entry_point: str  # its export: the dispatch function, named by IREE after its root op
    calls: int  # flow.dispatch ops of the model that launch it
    fused_ops: tuple[str, ...]  # the dispatch's other linalg / linalg_ext ops, in walk order
    location: str  # the op's location, as IREE carried it from the source

    @property
    def function(self) -> str:
        """The dispatch function (named as its export), where an OpSite names its function."""
        return self.entry_point

    @property
    def fuses(self) -> bool:
        return bool(self.fused_ops)


@dataclass(frozen=True)
class SkippedRoot:
    """A dispatch root that is not tuned, and why.

    `reason` is one of: "attention", "dynamic shape", "element type", "convolution",
    "matrix-vector", "dot product"; `detail` says what exactly.
    """

    op_name: str
    reason: str
    detail: str
    site: DispatchSite


class RootOpKind(ABC):
    """One kind of root op. `recognise` is all a kind that is not tuned yet provides."""

    name: str = ""
    problem_type: type  # its Problem class (records name a problem by its kind)
    tuned: bool = False  # its problems are searched (spec_matcher and kernel_module exist)
    # Timed and checked only on IREE's dispatch of the model (no kernel_module of its own).
    needs_dispatch: bool = False
    # IREE re-forms its roots between `flow` and configuration: read them as configured.
    configured_form: bool = False
    # Answers are checked on the whole model built with the candidate's spec, against the
    # default model's outputs: the dispatch alone, built from `flow`, is out of a spec's reach.
    checks_model: bool = False

    @abstractmethod
    def recognise(self, op: ir.Operation, site: DispatchSite):
        """The op as this kind's problem, a SkippedRoot (this kind, not tuned, and why), or
        None: not this kind."""

    def has_kernel(self, problem: Problem) -> bool:
        """Whether the problem can be rebuilt alone (kernel_module), to check answers on
        when its dispatch's check cannot run."""
        return not self.needs_dispatch

    def spec_matcher(self, problem: Problem, handle: str = "%op") -> str:
        """Transform ops that match `handle` to the problem's roots in any module."""
        raise NotImplementedError(f"{self.name} roots are not tuned yet")

    def kernel_module(self, problem: Problem, target, point) -> str:
        """The problem rebuilt alone as a module, with `point`'s configuration attached."""
        raise NotImplementedError(f"{self.name} roots are not tuned yet")

    def folded_forms(self, problem: Problem) -> list[Problem]:
        """The problem as IREE may configure it with loops folded away (the same work in
        fewer loops): a spec matches these too, each given the point's configuration of its
        own loops, and a build that carries any of them carries the point."""
        return []
