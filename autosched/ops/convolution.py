"""Convolution roots as a tuned root-op kind (issue 25).

Where IREE forms its dispatches, a torch or ONNX convolution is a `linalg.generic` (IREE
generalizes the named `linalg.conv_*` ops; the dispatch is named `conv_...`). MLIR's own
`linalg.infer_convolution_dimensions` (in IREE's bindings) gives each loop's role: batch,
output image, output channel, filter window, input channel, depth (groups), with strides and
dilations. A pooling window has the same shape but no channels to reduce and no multiply:
only multiply-accumulate bodies with an input and an output channel are convolutions here.
Convolutions whose filter is 1x1 at stride 1 are plain contractions (the matmul family).

A spec matches the conv by `transform.iree.match.convolution` (element types and maps) and
each loop's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import linalg

from autosched.ops.base import ANY_OP, PARAM, DispatchSite, RootOpKind, SkippedRoot
from autosched.ops.contraction import is_multiply_add, static_types

CONV_TYPES = ("f32", "f16", "bf16")
# Loop roles, named for an image: n batch, f output channel, oh/ow output image, c input
# channel, kh/kw filter window, g groups (depth).
ROLES = ("n", "f", "oh", "ow", "c", "kh", "kw", "g")


@dataclass
class ConvolutionProblem:
    """One convolution signature of the model's dispatches, with every dispatch holding it."""

    kind: ClassVar[str] = "convolution"
    op_name: str
    loops: tuple[str, ...]  # each loop's role in the op's iteration order (ROLES)
    loop_sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    lhs_type: str  # the image
    rhs_type: str  # the filter
    acc_type: str
    indexing_maps: str
    sites: list[DispatchSite] = field(default_factory=list)

    def size(self, role: str) -> int:
        return math.prod(s for r, s in zip(self.loops, self.loop_sizes, strict=True) if r == role)

    @property
    def name(self) -> str:
        roles = [r for r in ROLES if r in self.loops]
        shape = "x".join(str(self.size(r)) for r in roles)
        stride = "x".join(map(str, self.strides))
        dilation = "" if set(self.dilations) == {1} else "_d" + "x".join(map(str, self.dilations))
        types = f"{self.lhs_type}_{self.rhs_type}_{self.acc_type}"
        return f"conv_{''.join(roles)}_{shape}_s{stride}{dilation}_{types}"

    @property
    def occurrences(self) -> int:
        return sum(site.calls for site in self.sites)

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.loop_sizes)

    def _key(self) -> str:
        return f"{self.name} {self.indexing_maps}"

    def as_problem(self) -> ConvolutionProblem:
        return self

    def record_shape(self) -> dict:
        return {
            "kind": self.kind,
            "loops": list(self.loops),
            "loop_sizes": list(self.loop_sizes),
            "strides": list(self.strides),
            "dilations": list(self.dilations),
            "lhs_type": self.lhs_type,
            "rhs_type": self.rhs_type,
            "acc_type": self.acc_type,
        }

    def csv_shape(self) -> dict:
        """The CSV's shape columns as the implicit GEMM sees them: M output pixels, N output
        channels, K input channels x filter window."""
        pixels = self.size("n") * self.size("oh") * self.size("ow")
        return {
            "M": pixels,
            "N": self.size("f"),
            "K": self.size("c") * self.size("kh") * self.size("kw"),
            "batch": self.size("g"),
            "lhs_type": self.lhs_type,
            "rhs_type": self.rhs_type,
            "acc_type": self.acc_type,
        }


def _roles(dims, loops: int) -> list[str] | None:
    """Each loop's role from MLIR's convolution dimensions (2-D images only)."""
    image, window = list(dims.output_image), list(dims.filter_loop)
    if len(image) != 2 or len(window) != 2 or not dims.output_channel or not dims.input_channel:
        return None
    roles = ["?"] * loops
    for positions, names in (
        (list(dims.batch), ["n"]),
        (list(dims.output_channel), ["f"]),
        (list(dims.input_channel), ["c"]),
        (list(dims.depth), ["g"]),
        (image, ["oh", "ow"]),
        (window, ["kh", "kw"]),
    ):
        if len(positions) > len(names):
            return None  # several loops of one role: not an image convolution
        for position, name in zip(positions, names, strict=False):
            roles[position] = name
    return None if "?" in roles else roles


def read_convolution(op: ir.Operation, site: DispatchSite):
    """The op's problem, a SkippedRoot, or None when it is no convolution."""
    if op.name != "linalg.generic" and not op.name.startswith(("linalg.conv", "linalg.depthwise")):
        return None
    if not linalg.isa_convolution_op(op.opview) or not is_multiply_add(op):
        return None  # pooling windows, or not a convolution at all
    dims = linalg.infer_convolution_dimensions(op.opview)
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    loops = maps[0].n_dims
    roles = _roles(dims, loops)
    if roles is None:
        why = "not a 2-D convolution from input to output channels (depthwise: not yet)"
        return SkippedRoot(op.name, "convolution", why, site)
    types = static_types(op)
    if isinstance(types, str):
        return SkippedRoot(op.name, "dynamic shape", types, site)
    image, kernel, out = types
    sizes: dict[int, int] = {}
    for affine, tensor in ((maps[1], kernel), (maps[2], out)):
        for expr, extent in zip(affine.results, tensor.shape, strict=True):
            sizes[ir.AffineDimExpr(expr).position] = extent
    if len(sizes) != loops:  # a loop that only the image indexes
        return SkippedRoot(op.name, "convolution", "a loop only the image indexes", site)
    elements = [str(t.element_type) for t in (image, kernel, out)]
    if not set(elements) <= set(CONV_TYPES):
        return SkippedRoot(op.name, "element type", f"convolution on {elements}", site)
    return ConvolutionProblem(
        op_name=op.name,
        loops=tuple(roles),
        loop_sizes=tuple(sizes[i] for i in range(loops)),
        strides=tuple(dims.strides),
        dilations=tuple(dims.dilations),
        lhs_type=elements[0],
        rhs_type=elements[1],
        acc_type=elements[2],
        indexing_maps=str(op.attributes["indexing_maps"]),
        sites=[site],
    )


class ConvolutionKind(RootOpKind):
    name = "convolution"
    tuned = True
    needs_dispatch = True  # checked against the default build's outputs on IREE's dispatch
    configured_form = True  # on the CPU the unit batch folded at `flow` comes back
    checks_model = True  # a spec misses the check module built from `flow` (unit batch)

    def recognise(self, op: ir.Operation, site: DispatchSite):
        return read_convolution(op, site)

    def spec_matcher(self, problem: ConvolutionProblem, handle: str = "%op") -> str:
        """Transform ops that match `handle` to the problem's convolutions: element types,
        indexing maps and every loop's size."""
        names = ["%batch", "%image", "%channel", "%window", "%input", "%depth", "%s", "%d"]
        roles = [("n",), ("oh", "ow"), ("f",), ("kh", "kw"), ("c",), ("g",)]
        checks = "".join(
            f"    transform.iree.match.dims_equal {name}, "
            f"[{', '.join(str(problem.size(r)) for r in group if r in problem.loops)}]"
            f" : {PARAM}\n"
            for name, group in zip(names, roles, strict=False)
        )
        return (
            f"    {', '.join(names)} = transform.iree.match.convolution {handle},"
            f" lhs_type = {problem.lhs_type}, rhs_type = {problem.rhs_type},"
            f" output_type = {problem.acc_type}, indexing_maps = {problem.indexing_maps}"
            f" : {ANY_OP} -> {PARAM}\n"
            f"{checks}"
        )
