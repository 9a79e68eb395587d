"""Finds the matmuls of an MLIR module with IREE's MLIR Python bindings.

Every later stage works on `MatmulProblem`s, so this is the only place that reads the
user's MLIR. Ops with the same signature are one problem: one tuning serves them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from iree.compiler import ir

from autosched.errors import UserError, require_file
from autosched.ops.base import Operand, accumulated_tolerance
from autosched.ops.row_norm import RowNorm

MATMUL_OPS = ("linalg.matmul", "linalg.batch_matmul")
# The size of a dimension known only at run time, as MLIR spells it in a shape
# (ir.ShapedType.get_dynamic_size()): a problem whose M is DYNAMIC is its op at every count
# of rows (a model exported with a dynamic sequence length).
DYNAMIC = -(2**63)


@dataclass(frozen=True)
class OpSite:
    """Where one matmul op sits in the input module."""

    function: str
    index: int  # position among the module's matmul ops, in walk order
    location: str


@dataclass
class MatmulProblem:
    """One matmul signature: shape, element types and operand layout."""

    kind: ClassVar[str] = "matmul"  # its root-op kind (ops/registry.py)
    op_name: str  # linalg.matmul or linalg.batch_matmul
    m: int
    n: int
    k: int
    batch: int  # 0 for a plain matmul
    lhs_type: str
    rhs_type: str
    acc_type: str
    transpose_a: bool
    transpose_b: bool
    zero_init: bool  # the accumulator comes from a linalg.fill, not from a function input
    indexing_maps: str  # the op's indexing_maps attribute, as MLIR text
    sites: list[OpSite] = field(default_factory=list)
    # A form of the problem whose kernel computes the RMSNorm that makes A (rewrite/
    # row_norms.py): never searched, only substituted.
    norm: RowNorm | None = None

    @property
    def name(self) -> str:
        kind = self.op_name.split(".")[1]
        if self.transpose_a:
            kind += "_transpose_a"
        if self.transpose_b:
            kind += "_transpose_b"
        dims = [self.m, self.n, self.k] if not self.batch else [self.batch, self.m, self.n, self.k]
        shape = "x".join("any" if d == DYNAMIC else str(d) for d in dims)
        init = "" if self.zero_init else "_acc"
        # A normed form's kernels are the problem's own to placement.py (`{name}.{form}`).
        normed = f".rmsnorm{self.norm.digest}" if self.norm else ""
        return f"{kind}_{shape}_{self.lhs_type}_{self.rhs_type}_{self.acc_type}{init}{normed}"

    @property
    def any_rows(self) -> bool:
        """Whether M is DYNAMIC: the problem stands for its op at every count of rows."""
        return self.m == DYNAMIC

    @property
    def flops(self) -> int:
        return 2 * max(self.batch, 1) * self.m * self.n * self.k

    def record_shape(self) -> dict:
        """What a record keeps of the problem (records.problem_from_shape reads it back)."""
        return {
            "op": self.op_name,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "batch": self.batch,
            "lhs_type": self.lhs_type,
            "rhs_type": self.rhs_type,
            "acc_type": self.acc_type,
            "transpose_a": self.transpose_a,
            "transpose_b": self.transpose_b,
            "zero_init": self.zero_init,
        }

    @classmethod
    def from_shape(cls, shape: dict) -> MatmulProblem:
        """The problem a record names (no op sites: it is in no module here)."""
        return cls(
            op_name=shape["op"],
            m=shape["m"],
            n=shape["n"],
            k=shape["k"],
            batch=shape["batch"],
            lhs_type=shape["lhs_type"],
            rhs_type=shape["rhs_type"],
            acc_type=shape["acc_type"],
            transpose_a=shape["transpose_a"],
            transpose_b=shape["transpose_b"],
            zero_init=shape["zero_init"],
            indexing_maps=_indexing_maps(
                bool(shape["batch"]), shape["transpose_a"], shape["transpose_b"]
            ),
        )

    def key(self) -> str:
        return self.name

    def tolerance(self) -> float:
        return accumulated_tolerance(self.lhs_type, self.acc_type)

    def check_operands(self) -> list[Operand]:
        """A, B and, unless it starts from zero, the accumulator C."""
        operands = [
            Operand("lhs", self.lhs_shape, self.lhs_type),
            Operand("rhs", self.rhs_shape, self.rhs_type),
        ]
        if not self.zero_init:
            operands.append(Operand("acc", self.acc_shape, self.acc_type))
        return operands

    def reference(self, lhs: np.ndarray, rhs: np.ndarray, acc: np.ndarray | None = None):
        if self.transpose_a:
            lhs = np.swapaxes(lhs, -1, -2)
        if self.transpose_b:
            rhs = np.swapaxes(rhs, -1, -2)
        product = np.matmul(lhs, rhs)
        return product if acc is None else product + acc

    def reference_bytes(self) -> int:
        """A, B, C and the reference in float64, and as much again for temporaries."""
        shapes = [self.lhs_shape, self.rhs_shape, self.acc_shape, self.acc_shape]
        if not self.zero_init:
            shapes.append(self.acc_shape)
        return 8 * sum(int(np.prod(shape, dtype=np.float64)) for shape in shapes) * 2

    def csv_shape(self) -> dict:
        """The CSV's shape columns."""
        shape = self.record_shape()
        return {
            "M": self.m,
            "N": self.n,
            "K": self.k,
            **{k: shape[k] for k in ("batch", "lhs_type", "rhs_type", "acc_type")},
        }

    @property
    def lhs_shape(self) -> list[int]:
        shape = [self.k, self.m] if self.transpose_a else [self.m, self.k]
        return [self.batch, *shape] if self.batch else shape

    @property
    def rhs_shape(self) -> list[int]:
        shape = [self.n, self.k] if self.transpose_b else [self.k, self.n]
        return [self.batch, *shape] if self.batch else shape

    @property
    def acc_shape(self) -> list[int]:
        return [self.batch, self.m, self.n] if self.batch else [self.m, self.n]

    @property
    def output_shape(self) -> list[int]:
        """The kernel's result (every kind names it so; for a contraction, C)."""
        return self.acc_shape

    @property
    def out_type(self) -> str:
        return self.acc_type


def _indexing_maps(batched: bool, transpose_a: bool, transpose_b: bool) -> str:
    """The op's maps for a layout, as the bindings print them."""
    b, m, n, k = ("d0, ", "d1", "d2", "d3") if batched else ("", "d0", "d1", "d2")
    dims = f"({b}{m}, {n}, {k})"
    lhs = f"{k}, {m}" if transpose_a else f"{m}, {k}"
    rhs = f"{n}, {k}" if transpose_b else f"{k}, {n}"
    maps = [f"affine_map<{dims} -> ({b}{x})>" for x in (lhs, rhs, f"{m}, {n}")]
    return f"[{', '.join(maps)}]"


@dataclass
class SkippedOp:
    site: OpSite
    reason: str


@dataclass
class Analysis:
    problems: list[MatmulProblem]
    skipped: list[SkippedOp]


def parse_module(path: str, context: ir.Context) -> ir.Module:
    """Parses a file, turning every failure into a one-line UserError."""
    require_file(path)
    try:
        return ir.Module.parseFile(path, context)
    except ir.MLIRError as error:
        diagnostics = error.error_diagnostics
        if diagnostics:
            where = _format_location(diagnostics[0].location)
            raise UserError(f"{where}: MLIR does not parse: {diagnostics[0].message}") from None
        raise UserError(f"{path}: MLIR does not parse: {error}".splitlines()[0]) from None


def _format_location(location: ir.Location) -> str:
    """file:line:col for a file location, MLIR's own text for any other kind."""
    try:
        return f"{location.filename}:{location.start_line}:{location.start_col}"
    except (ValueError, AttributeError):
        # Diagnostics carry a bare Location, printed as loc("file":line:col).
        text = str(location)
        if text.startswith('loc("') and '":' in text:
            file, line_column = text[len('loc("') : -1].split('":', 1)
            return f"{file}:{line_column}"
        return text


def walk_matmuls(module: ir.Module):
    """Yields (function name, op) for every matmul op in walk order."""

    def visit(operation: ir.Operation, function: str):
        for region in operation.regions:
            for block in region.blocks:
                for child in block.operations:
                    child = child.operation
                    name = function
                    if child.name in ("func.func", "util.func"):
                        name = ir.StringAttr(child.attributes["sym_name"]).value
                    if child.name in MATMUL_OPS:
                        yield name, child
                    yield from visit(child, name)

    yield from visit(module.operation, "")


def _dims_of(map_attr: ir.Attribute) -> list[int]:
    affine_map = ir.AffineMapAttr(map_attr).value
    return [ir.AffineDimExpr(expr).position for expr in affine_map.results]


def _describe(function: str, index: int, op: ir.Operation) -> MatmulProblem | SkippedOp:
    """The op's problem, or why it cannot be tuned."""
    site = OpSite(function=function, index=index, location=_format_location(op.location))
    try:
        lhs, rhs, acc = (ir.RankedTensorType(v.type) for v in op.operands[:3])
    except ValueError:
        return SkippedOp(site, "operands are not ranked tensors (memrefs are not supported)")
    for name, tensor in (("lhs", lhs), ("rhs", rhs), ("acc", acc)):
        if not tensor.has_static_shape:
            return SkippedOp(site, f"dynamic shape: {name} is {tensor}")
    batched = op.name == "linalg.batch_matmul"
    if "indexing_maps" not in op.attributes:
        return SkippedOp(site, "no indexing_maps attribute")
    maps = ir.ArrayAttr(op.attributes["indexing_maps"])
    try:
        lhs_dims, rhs_dims, acc_dims = (_dims_of(m) for m in maps)
    except ValueError:
        return SkippedOp(site, "indexing maps are not plain permutations")
    # Loop dims: (m, n, k) for matmul, (b, m, n, k) for batch_matmul.
    b, m, n, k = (0, 1, 2, 3) if batched else (None, 0, 1, 2)
    lead = [b] if batched else []
    if acc_dims != [*lead, m, n]:
        return SkippedOp(site, "accumulator layout other than (m, n) is not supported")
    if lhs_dims not in ([*lead, m, k], [*lead, k, m]):
        return SkippedOp(site, f"lhs layout {lhs_dims} is not supported")
    if rhs_dims not in ([*lead, k, n], [*lead, n, k]):
        return SkippedOp(site, f"rhs layout {rhs_dims} is not supported")
    transpose_a = lhs_dims == [*lead, k, m]
    transpose_b = rhs_dims == [*lead, n, k]
    sizes = {}
    for dims, tensor in ((lhs_dims, lhs), (rhs_dims, rhs), (acc_dims, acc)):
        for dim, size in zip(dims, tensor.shape, strict=True):
            sizes[dim] = size
    empty = [
        name for name, size in (("M", sizes[m]), ("N", sizes[n]), ("K", sizes[k])) if size == 0
    ]
    if empty or (batched and sizes[b] == 0):
        return SkippedOp(
            site, f"zero-sized dimension {', '.join(empty) or 'batch'}: nothing to tune"
        )
    owner = getattr(op.operands[2].owner, "operation", op.operands[2].owner)  # op or block
    zero_init = isinstance(owner, ir.Operation) and owner.name == "linalg.fill"
    return MatmulProblem(
        op_name=op.name,
        m=sizes[m],
        n=sizes[n],
        k=sizes[k],
        batch=sizes[b] if batched else 0,
        lhs_type=str(lhs.element_type),
        rhs_type=str(rhs.element_type),
        acc_type=str(acc.element_type),
        transpose_a=transpose_a,
        transpose_b=transpose_b,
        zero_init=zero_init,
        indexing_maps=str(maps),
        sites=[site],
    )


FP8_TYPES = ("f8E4M3FN", "f8E5M2")
SUPPORTED_TYPES = ("f32", "f16", "bf16", *FP8_TYPES, "f64")  # f64: the CPU's alone


def unsupported_types(problem: MatmulProblem) -> str | None:
    """Why the problem's element types cannot be tuned, or None (fp8 only as inputs)."""
    types = {problem.lhs_type, problem.rhs_type, problem.acc_type}
    if not types <= set(SUPPORTED_TYPES):
        return f"element type {sorted(types - set(SUPPORTED_TYPES))} not supported"
    if problem.acc_type in FP8_TYPES:
        return f"an {problem.acc_type} accumulator is not supported (fp8 inputs accumulate in f32)"
    return None


def analyze_module(module: ir.Module) -> Analysis:
    problems: dict[str, MatmulProblem] = {}
    skipped: list[SkippedOp] = []
    for index, (function, op) in enumerate(walk_matmuls(module)):
        found = _describe(function, index, op)
        if isinstance(found, SkippedOp):
            skipped.append(found)
            continue
        reason = unsupported_types(found)
        if reason:
            skipped.append(SkippedOp(found.sites[0], reason))
            continue
        if found.name in problems:
            problems[found.name].sites.extend(found.sites)
        else:
            problems[found.name] = found
    return Analysis(problems=list(problems.values()), skipped=skipped)


def analyze_file(path: str, context: ir.Context | None = None) -> Analysis:
    """Analyzes a file; a module with no tunable matmul is a UserError."""
    context = context or ir.Context()
    analysis = analyze_module(parse_module(path, context))
    if not analysis.problems:
        if analysis.skipped:
            first = analysis.skipped[0]
            raise UserError(
                f"{path}: no matmul can be tuned: {first.site.location} @{first.site.function}: "
                f"{first.reason}"
            )
        raise UserError(f"{path}: no linalg.matmul or linalg.batch_matmul in the module")
    return analysis
