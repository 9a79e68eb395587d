"""Convolution roots (issue 25): the problem one becomes and how a dispatch's op is read into
one (the kind, its matchers and its module alone: ops/convolution_kind.py).

Where IREE forms its dispatches, a torch or ONNX convolution is a `linalg.generic` (IREE
generalizes the named `linalg.conv_*` ops; the dispatch is named `conv_...`). MLIR's own
`linalg.infer_convolution_dimensions` (in IREE's bindings) gives each loop's role: batch,
output image, output channel, filter window, input channel, depth (groups), with strides and
dilations. A pooling window has the same shape but no channels to reduce and no multiply:
only multiply-accumulate bodies with an input and an output channel are convolutions here.
Convolutions whose filter is 1x1 at stride 1 are plain contractions (the matmul family).

A spec matches the conv by `transform.iree.match.convolution` (element types and maps) and
each loop's size.

1x1 convolutions at stride 1 are contractions, but IREE forms most of them as generics with
no matmul form: the image's loops (batch, output rows, output columns) are split by the
output channel in NCHW (`(n, f, oh, ow, c)`), or there are three of them in NHWC. Those are
convolutions here too, of the `pointwise` form, matched as the contractions they are
(`transform.iree.match.contraction` with every loop's size).

A 1x1 convolution with a stride reads its image through `d * stride` in its map, which is
neither a convolution to MLIR nor a contraction: IREE forms it as a `reduction` dispatch
(resnet50's three strided 1x1s took 8.4-9.4 ms each on the H200, an output element per
workgroup). It is the `strided` form here, matched by its whole op
(`transform.iree.match.cast_compatible_dag_from_root`) and the operands' types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import linalg

from autosched.ir_walk import scratch_context
from autosched.ops.base import DispatchSite, Operand, SkippedRoot, accumulated_tolerance
from autosched.ops.contraction import (
    Contraction,
    is_multiply_add,
    recognise_contraction,
    static_types,
)

CONV_TYPES = ("f32", "f16", "bf16")
# Loop roles, named for an image: n batch, f output channel, oh/ow output image, c input
# channel, kh/kw filter window, g groups (depth).
ROLES = ("n", "f", "oh", "ow", "c", "kh", "kw", "g")
WINDOW, POINTWISE = "window", "pointwise"  # a ConvolutionOpInterface op, or a 1x1 contraction
STRIDED = "strided"  # a 1x1 convolution with a stride: `d * s` in the image's map


@dataclass
class ConvolutionProblem:
    """One convolution signature of the model's dispatches, with every dispatch holding it."""

    kind: ClassVar[str] = "convolution"
    zero_init: ClassVar[bool] = True  # its kernels take no accumulator to add into
    op_name: str
    loops: tuple[str, ...]  # each loop's role in the op's iteration order (ROLES)
    loop_sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    lhs_type: str  # the image
    rhs_type: str  # the filter
    acc_type: str
    indexing_maps: str
    output_roles: tuple[str, ...] = ()  # the output's loops in its own order (NCHW: n f oh ow)
    form: str = WINDOW  # WINDOW, POINTWISE or STRIDED (see the module docstring)
    sites: list[DispatchSite] = field(default_factory=list)
    image_shape: tuple[int, ...] = ()  # the image operand's extents (padded where it is)
    # The op as it stands where the custom route replaces it (global optimization), rebuilt
    # alone to search custom kernels on (kernel_module, a numpy reference).
    op_form: bool = False
    # Each image dim's (low, high) zero padding a kernel applies itself, reading the image
    # before its `tensor.pad` (`image_shape` then unpadded; rewrite/conv_padding.py); () none.
    padding: tuple[tuple[int, int], ...] = ()

    @property
    def depthwise(self) -> bool:
        """Each channel convolved alone (MLIR's depth loop, no channels to reduce)."""
        return "g" in self.loops and "f" not in self.loops and "c" not in self.loops

    @property
    def grouped(self) -> bool:
        """Channels in groups, each group convolved with its own filters (resnext's 32)."""
        return "g" in self.loops and not self.depthwise and self.size("g") > 1

    @property
    def channel(self) -> str:
        """The role of the output's channel loop: `g` in a depthwise convolution, else `f`."""
        return "g" if self.depthwise else "f"

    def size(self, role: str) -> int:
        return math.prod(s for r, s in zip(self.loops, self.loop_sizes, strict=True) if r == role)

    @property
    def name(self) -> str:
        roles = [r for r in ROLES if r in self.loops]
        shape = "x".join(str(self.size(r)) for r in roles)
        stride = "x".join(map(str, self.strides))
        dilation = "" if set(self.dilations) == {1} else "_d" + "x".join(map(str, self.dilations))
        types = f"{self.lhs_type}_{self.rhs_type}_{self.acc_type}"
        op = "_op" if self.op_form else ""  # never a dispatch problem's name (its records)
        return f"conv_{''.join(roles)}_{shape}_s{stride}{dilation}_{types}{op}"

    @property
    def occurrences(self) -> int:
        return sum(site.calls for site in self.sites)

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.loop_sizes)

    @property
    def output_shape(self) -> list[int]:
        """The result, in the output's layout (every kind names it so)."""
        return [self.size(r) for r in self.output_roles]

    @property
    def out_type(self) -> str:
        return self.acc_type

    def key(self) -> str:
        image = "x".join(map(str, self.image_shape)) if self.op_form else ""
        return f"{self.name} {self.indexing_maps} {image}"

    def operand_roles(self, operand: int) -> tuple[str, ...]:
        """The roles of a filter's (1) or output's (2) dims, in its own order."""
        if operand == 2:
            return self.output_roles
        maps = parsed_maps(self.indexing_maps)
        return tuple(self.loops[ir.AffineDimExpr(e).position] for e in maps[operand].results)

    def as_problem(self) -> ConvolutionProblem:
        return self

    def record_shape(self) -> dict:
        shape = {
            "kind": self.kind,
            "loops": list(self.loops),
            "loop_sizes": list(self.loop_sizes),
            "strides": list(self.strides),
            "dilations": list(self.dilations),
            "lhs_type": self.lhs_type,
            "rhs_type": self.rhs_type,
            "acc_type": self.acc_type,
        }
        if self.op_form:  # all it takes to rebuild the op alone (from_shape)
            shape |= {
                "op_form": True,
                "op_name": self.op_name,
                "form": self.form,
                "indexing_maps": self.indexing_maps,
                "output_roles": list(self.output_roles),
                "image_shape": list(self.image_shape),
            }
        return shape

    @classmethod
    def from_shape(cls, shape: dict) -> ConvolutionProblem:
        """The op-form problem a record names (see record_shape)."""
        return cls(
            op_name=shape["op_name"],
            loops=tuple(shape["loops"]),
            loop_sizes=tuple(shape["loop_sizes"]),
            strides=tuple(shape["strides"]),
            dilations=tuple(shape["dilations"]),
            lhs_type=shape["lhs_type"],
            rhs_type=shape["rhs_type"],
            acc_type=shape["acc_type"],
            indexing_maps=shape["indexing_maps"],
            output_roles=tuple(shape["output_roles"]),
            form=shape["form"],
            image_shape=tuple(shape["image_shape"]),
            op_form=True,
        )

    def tolerance(self) -> float:
        return accumulated_tolerance(self.lhs_type, self.acc_type)

    def check_operands(self) -> list[Operand] | None:
        """The op form's image and filter (checked alone); None for a dispatch's convolution
        (checked on IREE's dispatch)."""
        if not self.op_form:
            return None
        kernel = [self.size(r) for r in self.operand_roles(1)]
        return [
            Operand("image", list(self.image_shape), self.lhs_type),
            Operand("filter", kernel, self.rhs_type),
        ]

    def reference_bytes(self) -> int:
        """Not counted: a convolution's image, filter and output are small beside a host."""
        return 0

    def reference(self, image: np.ndarray, kernel: np.ndarray) -> np.ndarray:
        """The op-form convolution in float64 with numpy: for each filter tap, the image read at
        the tap's offset (strided, dilated) contracted with the tap's filter over the input
        channels; in the output's layout."""
        order = [roles[0] for roles in image_dims(self)]  # n, c, oh, ow in the image's order
        x = np.transpose(image, [order.index(r) for r in ("n", "c", "oh", "ow") if r in order])
        x = x if "oh" in order else x[:, :, None, :]  # a pointwise image of (n, c, pixels)
        roles = self.operand_roles(1)
        w = np.transpose(kernel, [roles.index(r) for r in ("f", "c", "kh", "kw") if r in roles])
        w = w.reshape(w.shape[:2] + (self.size("kh"), self.size("kw")))
        oh, ow = self.size("oh"), self.size("ow")
        (sh, sw), (dh, dw) = self.strides, self.dilations
        out = np.zeros((x.shape[0], w.shape[0], oh, ow))
        for kh in range(w.shape[2]):
            for kw in range(w.shape[3]):
                rows = slice(kh * dh, kh * dh + sh * (oh - 1) + 1, sh)
                columns = slice(kw * dw, kw * dw + sw * (ow - 1) + 1, sw)
                out += np.einsum(
                    "nchw,fc->nfhw", x[:, :, rows, columns], w[:, :, kh, kw], optimize=True
                )
        kept = ("n", "f", "oh", "ow") if "oh" in self.output_roles else ("n", "f", "ow")
        out = out if "oh" in self.output_roles else out[:, :, 0, :]
        return np.transpose(out, [kept.index(r) for r in self.output_roles])

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


def parsed_maps(indexing_maps: str) -> list[ir.AffineMap]:
    """A problem's indexing maps (as the bindings print them), parsed again."""
    with scratch_context():
        return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(ir.Attribute.parse(indexing_maps))]


def _dims_of(expr) -> list[int]:
    """The loops an affine expression reads (`d2 * 2 + d5` reads d2 and d5)."""
    if isinstance(expr, ir.AffineDimExpr):
        return [expr.position]
    if isinstance(expr, ir.AffineBinaryExpr):
        return _dims_of(expr.lhs) + _dims_of(expr.rhs)
    return []


def image_dims(problem: ConvolutionProblem) -> list[tuple[str, ...]]:
    """The roles each dim of the image reads, in the image's order: ("n",), ("c",),
    ("oh", "kh"), ("ow", "kw") for NCHW."""
    image_map = parsed_maps(problem.indexing_maps)[0]
    return [tuple(problem.loops[d] for d in _dims_of(e)) for e in image_map.results]


def _roles(dims, loops: int) -> list[str] | None:
    """Each loop's role from MLIR's convolution dimensions (2-D images only; a depthwise
    convolution's channel is its depth loop, `g`)."""
    image, window = list(dims.output_image), list(dims.filter_loop)
    if len(image) != 2 or len(window) != 2:
        return None
    channels = bool(dims.output_channel) and bool(dims.input_channel)
    if not channels and not (dims.depth and not dims.output_channel and not dims.input_channel):
        return None  # neither from input to output channels nor depthwise
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
        why = "not a 2-D convolution from input to output channels, nor a depthwise one"
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
        output_roles=tuple(roles[ir.AffineDimExpr(e).position] for e in maps[2].results),
        sites=[site],
        image_shape=tuple(image.shape),
    )


def read_pointwise(op: ir.Operation, site: DispatchSite) -> ConvolutionProblem | None:
    """A 1x1 convolution as IREE forms it (a contraction with no matmul form whose filter
    has only the output and input channels), or None."""
    found = recognise_contraction(op, site)
    if not isinstance(found, Contraction) or found.as_matmul_problem() is not None:
        return None
    roles, (_, filter_loops, out_loops) = found.loops, found.operand_loops
    if "b" in roles or roles.count("n") != 1 or roles.count("k") != 1:
        return None
    if sorted(roles[i] for i in filter_loops) != ["k", "n"]:
        return None
    image = [i for i in out_loops if roles[i] == "m"]  # in the output's order
    if len(image) not in (2, 3):
        return None
    named = list(roles)
    names = ("n", "oh", "ow") if len(image) == 3 else ("n", "ow")
    for position, name in zip(image, names, strict=True):
        named[position] = name
    named[roles.index("n")], named[roles.index("k")] = "f", "c"
    if not {found.lhs_type, found.rhs_type, found.acc_type} <= set(CONV_TYPES):
        return None
    return ConvolutionProblem(
        op_name=op.name,
        loops=tuple(named),
        loop_sizes=found.loop_sizes,
        strides=(1, 1),
        dilations=(1, 1),
        lhs_type=found.lhs_type,
        rhs_type=found.rhs_type,
        acc_type=found.acc_type,
        indexing_maps=found.indexing_maps,
        output_roles=tuple(named[i] for i in out_loops),
        form=POINTWISE,
        sites=[site],
        image_shape=tuple(found.loop_sizes[i] for i in found.operand_loops[0]),
    )


def _image_reads(image_map: ir.AffineMap) -> list[tuple[int, int]] | None:
    """(loop, stride) of each result of the image's map (stride 1 for a plain loop), or None
    where a result is anything else."""
    reads = []
    for expr in image_map.results:
        if isinstance(expr, ir.AffineDimExpr):
            reads.append((expr.position, 1))
        elif (
            isinstance(expr, ir.AffineMulExpr)
            and isinstance(expr.lhs, ir.AffineDimExpr)
            and isinstance(expr.rhs, ir.AffineConstantExpr)
        ):
            reads.append((expr.lhs.position, expr.rhs.value))
        else:
            return None
    return reads


def _strided_roles(maps: list[ir.AffineMap], iterators: list[str]):
    """(each loop's role, the strides) of a strided 1x1 convolution's maps, or None."""
    reads = _image_reads(maps[0])
    if reads is None or maps[0].n_dims != 5:
        return None
    try:
        filter_loops = [ir.AffineDimExpr(e).position for e in maps[1].results]
        out_loops = [ir.AffineDimExpr(e).position for e in maps[2].results]
    except ValueError:
        return None
    strided = [loop for loop, stride in reads if stride > 1]
    reduced = [i for i, kind in enumerate(iterators) if kind == "reduction"]
    plain = [loop for loop, stride in reads if stride == 1 and loop not in reduced]
    channel = [loop for loop in filter_loops if loop not in reduced]
    if len(strided) != 2 or len(reduced) != 1 or len(plain) != 1 or len(channel) != 1:
        return None
    if sorted(filter_loops) != sorted([*channel, *reduced]) or len(out_loops) != 4:
        return None
    roles = [""] * 5
    roles[plain[0]], roles[channel[0]], roles[reduced[0]] = "n", "f", "c"
    rows, columns = sorted(strided, key=out_loops.index)
    roles[rows], roles[columns] = "oh", "ow"
    strides = {loop: stride for loop, stride in reads}
    return roles, (strides[rows], strides[columns]), [roles[i] for i in out_loops]


def read_strided(op: ir.Operation, site: DispatchSite) -> ConvolutionProblem | None:
    """A 1x1 convolution with a stride as IREE forms it (see the module docstring), or None."""
    if op.name != "linalg.generic" or len(op.operands) != 3 or not is_multiply_add(op):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    iterators = [str(i).split("<")[-1].rstrip(">") for i in op.attributes["iterator_types"]]
    found = _strided_roles(maps, iterators)
    types = static_types(op)
    if found is None or isinstance(types, str):
        return None
    roles, strides, output_roles = found
    sizes: dict[int, int] = {}
    for affine, tensor in ((maps[1], types[1]), (maps[2], types[2])):
        for expr, extent in zip(affine.results, tensor.shape, strict=True):
            sizes[expr.position] = extent
    elements = [str(t.element_type) for t in types]
    if not set(elements) <= set(CONV_TYPES):
        return SkippedRoot(op.name, "element type", f"convolution on {elements}", site)
    return ConvolutionProblem(
        op_name=op.name,
        loops=tuple(roles),
        loop_sizes=tuple(sizes[i] for i in range(5)),
        strides=strides,
        dilations=(1, 1),
        lhs_type=elements[0],
        rhs_type=elements[1],
        acc_type=elements[2],
        indexing_maps=str(op.attributes["indexing_maps"]),
        output_roles=tuple(output_roles),
        form=STRIDED,
        sites=[site],
    )


def nchw_problem(
    batch: int,
    channels: int,
    size: int,
    filters: int,
    window: int,
    stride: int = 1,
    element: str = "f16",
    acc: str = "f32",
) -> ConvolutionProblem:
    """The op-form problem of a torch `Conv2d` (NCHW image padded by window // 2, FCHW
    filter) as IREE holds it at global optimization: for tests and benchmarks."""
    pad = window // 2
    out = (size + 2 * pad - window) // stride + 1
    dims = "(d0, d1, d2, d3, d4, d5, d6)"

    def read(d: str, tap: str) -> str:
        return f"{d} * {stride} + {tap}" if stride > 1 else f"{d} + {tap}"

    maps = (
        f"[affine_map<{dims} -> (d0, d4, {read('d2', 'd5')}, {read('d3', 'd6')})>, "
        f"affine_map<{dims} -> (d1, d4, d5, d6)>, affine_map<{dims} -> (d0, d1, d2, d3)>]"
    )
    return ConvolutionProblem(
        op_name="linalg.conv_2d_nchw_fchw",
        loops=("n", "f", "oh", "ow", "c", "kh", "kw"),
        loop_sizes=(batch, filters, out, out, channels, window, window),
        strides=(stride, stride),
        dilations=(1, 1),
        lhs_type=element,
        rhs_type=element,
        acc_type=acc,
        indexing_maps=maps,
        output_roles=("n", "f", "oh", "ow"),
        image_shape=(batch, channels, size + 2 * pad, size + 2 * pad),
        op_form=True,
    )
