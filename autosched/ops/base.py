"""What every root-op kind provides, and where a root is found.

A kind (matmul and attention tuned; convolution recognised, not yet tuned) says how its root
ops are recognised in the dispatches IREE forms, what problem one becomes, and, when it is
tuned, the spec matcher that finds its roots again and, where it has one, the kernel module
that rebuilds one alone. A recognised root has `sites`, `occurrences`, `_key()` (identical
roots merge) and `as_problem()`. Each target holds each kind's knobs, constraints and
features (`Target.for_problem`). `registry.py` lists the kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from iree.compiler import ir

ANY_OP = "!transform.any_op"
ANY_VALUE = "!transform.any_value"
PARAM = "!transform.param<i64>"


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

    def has_kernel(self, problem) -> bool:
        """Whether the problem can be rebuilt alone (kernel_module), to check answers on
        when its dispatch's check cannot run."""
        return not self.needs_dispatch

    def spec_matcher(self, problem, handle: str = "%op") -> str:
        """Transform ops that match `handle` to the problem's roots in any module."""
        raise NotImplementedError(f"{self.name} roots are not tuned yet")

    def kernel_module(self, problem, target, point) -> str:
        """The problem rebuilt alone as a module, with `point`'s configuration attached."""
        raise NotImplementedError(f"{self.name} roots are not tuned yet")
