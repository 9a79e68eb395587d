"""The one contract of a custom kernel family (issue 46).

A family is a kind of kernel that autosched compiles itself (Triton, Gluon) and runs in
place of an IREE dispatch as a `hal.dispatch.extern`. Like a template of torch Inductor's
`select_algorithm`, each family says, for its root-op kind: whether it can run on a target
(`unavailable`) and compute a problem (`unsupported`), with the reason when not; its part of
the search space (its knobs, candidates and rules) and its known-good points; what a point
is (its kernel parameters, name, workgroup and shared memory); how a point becomes a binary
(`compile`) and the function that launches it (`extern_function`); and what it takes over
around its op in a model (`absorbs`), which the rewrite asks. The targets ask the registry
(kernels/registry.py) for the families of their kind; nothing else names a family.
"""

from __future__ import annotations

import json
import sys
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from autosched.ops.epilogue import Epilogue
from autosched.outputs.records import problem_shape
from autosched.targets.base import Family, KnobSpec, Point

WARP = 32  # threads per warp (subgroup size) on every NVIDIA GPU
HOPPER = ("sm_90",)  # the archs of the families written for Hopper's wgmma
COMPILE_STEP = "autosched.kernels.compile"  # the compile pool's step (`python -m`)


class KernelDoesNotFit(RuntimeError):
    """A kernel the GPU cannot launch (more shared memory than a workgroup has): a form of
    a winner its compiler refuses, which the rewrite leaves to IREE, never a user's error."""


@dataclass(frozen=True)
class KernelBinary:
    """What a family's compiler produced for one point: its code on disk and its launch
    needs (what `hal.dispatch.extern` says)."""

    ptx_path: str  # the PTX, kept to read what the compiler made
    cubin_path: str  # the machine code IREE embeds
    entry: str  # the entry point
    pointers: int  # parameters: the operands, any values (`scalars`), the scratch pointers
    shared_bytes: int  # dynamic shared memory per workgroup
    threads: int  # threads per workgroup
    # Global scratch per workgroup (where a Triton kernel writes its TMA descriptors); 0:
    # none, and its scratch pointer is a placeholder.
    scratch_bytes: int = 0
    workgroups: tuple[int, ...] = ()  # the launch grid, where the point alone does not say
    # 32-bit values among the parameters, after the operands (a dynamic row count: IREE
    # passes them as push constants, after every binding).
    scalars: int = 0


@dataclass(frozen=True)
class Absorbs:
    """What a family's kernel takes over around its op in a model (the rewrite
    asks before it builds the extra kernels for each)."""

    narrow_output: bool = False  # the truncf of an f32 result: the kernel stores the narrow type
    epilogues: bool = False  # elementwise epilogues after the op (ops/epilogue.py)
    stored_weights: bool = False  # a transposed stored weight: the kernel reads it as stored
    reshapes: bool = False  # reshapes between the op and its truncf
    padding: bool = False  # a zero pad before the op's image: the kernel masks the taps
    copied_operands: bool = False  # copies before the operands: the kernel reads the sources
    layouts: bool = False  # the operands in the op's own layout (the function transposes)
    norms: bool = False  # the RMSNorm that makes A (ops/row_norm.py): the kernel reads x and g


class KernelFamily(ABC):
    """One custom kernel family. Instances hold no state: what depends on the target (arch,
    Triton installed, limits) is read from the `target` handed in."""

    name: ClassVar[str]  # its registry name, and its folder's
    kind: ClassVar[str]  # the root-op kind it serves (ops/registry.py)
    label: ClassVar[str]  # what messages call its kernels ("custom kernels")
    selector: ClassVar[tuple[str, Any]]  # (knob, value) that puts a point in the family
    knobs: ClassVar[tuple[KnobSpec, ...]] = ()  # knobs of its own, beside the kind target's
    archs: ClassVar[tuple[str, ...]] = HOPPER
    needs_triton: ClassVar[bool] = True
    absorbs: ClassVar[Absorbs] = Absorbs()
    params_type: ClassVar[type]  # its kernel parameters (a dataclass with a `name`)

    # ---- where it runs ------------------------------------------------------------------

    def unavailable(self, target) -> str | None:
        """Why the family cannot run on this target at all (arch, Triton), or None."""
        if target.arch not in self.archs:
            return f"{self.label} are written for {', '.join(self.archs)}, not {target.arch}"
        if self.needs_triton and not target.machine.triton:
            return f"{self.label} need Triton: pip install '.[triton]'"
        return None

    @abstractmethod
    def unsupported(self, problem) -> str | None:
        """Why the family's kernel cannot compute this problem, or None."""

    def form_unsupported(self, problem) -> str | None:
        """Why this form of a problem is not searched with the family (one that replaces
        the op before dispatches form is searched on the op form only), or None."""
        return None

    def why_not(self, target, problem) -> str | None:
        """Why the family is not searched for this problem on this target, or None."""
        return (
            self.form_unsupported(problem) or self.unavailable(target) or self.unsupported(problem)
        )

    def selects(self, point: Point) -> bool:
        """Whether a point is one of this family's."""
        knob, value = self.selector
        return point.get(knob) == value

    # ---- its part of the space ----------------------------------------------------------

    @abstractmethod
    def space(self, problem, target, pinned: dict[str, list]) -> Family:
        """Its part of the target's space for a problem; `pinned`: the kind target's own
        knobs at neutral values."""

    def starting_points(self, problem, target) -> list[Point]:
        """Its known-good (partial) points, measured before the tuner's picks."""
        return []

    def describe(self, knob_space: dict[str, list]) -> str:
        """What the run's first line says of it where it can run ("" for nothing)."""
        return ""

    # ---- what a point is ----------------------------------------------------------------

    @abstractmethod
    def params(self, point: Point):
        """A point's kernel parameters (`params_type`)."""

    def config_name(self, point: Point) -> str:
        return self.params(point).name

    def workgroup_size(self, point: Point) -> list[int]:
        return [self.params(point).warps * WARP, 1, 1]

    def shared_memory(self, problem, point: Point, target) -> int:
        """Bytes of shared memory a point's workgroup takes (0 where the family does not
        say)."""
        return 0

    def epilogue_form(self, point: Point) -> str:
        """How a point's kernel runs an epilogue beside its main loop, where forms differ
        (drivers/in_place.py times the fastest point of each form in the model); one form
        ("") where the family does not say."""
        return ""

    def features(self, problem, point: Point, target) -> dict[str, float]:
        """Numbers beyond the knobs that describe a point to the cost model."""
        return {}

    # ---- its binary and its dispatch ----------------------------------------------------

    @abstractmethod
    def compile(
        self, problem, params, arch: str, path: str, epilogue: Epilogue | None = None
    ) -> KernelBinary:
        """The point's binary (PTX written to `path`; no GPU needed), with `epilogue` in
        it where the family absorbs epilogues."""

    @abstractmethod
    def extern_function(
        self,
        problem,
        params,
        binary: KernelBinary,
        executable_target: str,
        name: str,
        kind: str = "func.func",
        epilogue: Epilogue | None = None,
    ) -> str:
        """A function `name(operands...) -> result` that launches `binary` as a
        `hal.dispatch.extern` (`kind` util.func for a substitution spec to call)."""

    def narrow_params(self, params):
        """The point of the kernel that stores a narrow type (absorbs.narrow_output)."""
        return params

    def source_command(self, problem, point: Point, source: str, arch: str) -> list[str]:
        """The compile pool's step for one point: its PTX beside `source`, its extern module
        at `source` (kernels/compile.py, in a process of its own)."""
        cls = type(self)
        return [
            sys.executable,
            "-m",
            COMPILE_STEP,
            "--family",
            f"{cls.__module__}:{cls.__qualname__}",
            "--shape",
            json.dumps(problem_shape(problem)),
            "--params",
            json.dumps(asdict(self.params(point))),
            "--arch",
            arch,
            "--ptx",
            source.removesuffix(".mlir") + ".ptx",
            "--module",
            source,
        ]
