"""A dispatch named by its root op, as a reader would: "matmul 512x512x512", "softmax",
"conv 3x3 64->64".

IREE names each dispatch after what it found at its root, and its names are for the compiler:
`..._dispatch_7_matmul_like_16x3136x64x64_f16xf16xf32` for a convolution read as a
contraction, `reduction_64x128_f32` for a softmax, and a dispatch with no compute of its own
after the op that stores its result (`tensor_store`). The picture of a model's dispatches
labelled its bars with those. Here the dispatch's own ops are read with the bindings and
its root is named by the kinds that tune it (a matmul's M x N x K, a convolution's window and
channels) or, for the rest, by what its ops do.
"""

from __future__ import annotations

from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.model.lowering import is_linalg_op
from autosched.ops.base import DispatchSite, SkippedRoot
from autosched.ops.convolution import ConvolutionProblem
from autosched.ops.matmul import MatmulProblem
from autosched.ops.registry import classify_root

_SITE = DispatchSite("", "", 1, (), "")  # classify_root reads the op, not its site
ATTENTION_OPS = ("iree_linalg_ext.attention", "iree_linalg_ext.online_attention")
_NORM_OPS = ("math.rsqrt", "math.sqrt")


def dispatch_label(source: str) -> str:
    """The root op of the one dispatch in a benchmark or check module (`source`, a file),
    or "" when the file holds none that can be read."""
    try:
        module = ir.Module.parseFile(source, ir.Context())
    except (ir.MLIRError, OSError, ValueError, RuntimeError):
        return ""
    for op in walk_ops(module.operation):
        if op.name == "func.func" and _inside_executable(op):
            return function_label(op)
    return ""


def _inside_executable(op: ir.Operation) -> bool:
    """Whether a function is a dispatch's (in a hal or flow executable), not a caller."""
    parent = op.parent
    while parent is not None:
        if parent.name in ("hal.executable", "flow.executable"):
            return True
        parent = parent.parent
    return False


def function_label(function: ir.Operation) -> str:
    """The root op of one dispatch function, named for a reader."""
    ops = [op for op in walk_ops(function) if is_linalg_op(op) and op.name != "linalg.fill"]
    if not ops:
        return "copy"
    for op in ops:
        if op.name in ATTENTION_OPS:
            return "attention"
        if op.name == "linalg.softmax":
            return f"softmax {_shape(op)}"
    for op in ops:
        found = classify_root(op, _SITE)
        if found is not None:
            return _root_label(found, op)
    return _rest_label(ops)


def _root_label(root, op: ir.Operation) -> str:
    """A root a kind knows (or skipped with its reason), by its problem's sizes."""
    if isinstance(root, SkippedRoot):
        return f"{root.reason} {_shape(op)}".strip()
    problem = root.as_problem()
    if isinstance(problem, MatmulProblem):
        kind = "batch matmul" if problem.batch else "matmul"
        dims = [problem.m, problem.n, problem.k]
        return f"{kind} {'x'.join(map(str, [problem.batch] * bool(problem.batch) + dims))}"
    if isinstance(problem, ConvolutionProblem):
        return convolution_label(problem)
    if problem is not None and problem.kind == "attention":
        return "attention"
    if problem is not None:  # another kind: its name and its output's shape (gather 16x64)
        return f"{problem.kind} {'x'.join(map(str, problem.output_shape))}"
    sizes = getattr(root, "loop_sizes", ())
    return f"contraction {'x'.join(map(str, sizes))}".strip()


def convolution_label(problem: ConvolutionProblem) -> str:
    """conv 3x3 64->64, with its stride (/2), groups or depthwise."""
    window = f"{problem.size('kh')}x{problem.size('kw')}"
    stride = "" if set(problem.strides) <= {1} else f" /{max(problem.strides)}"
    if problem.depthwise:
        return f"depthwise conv {window} {problem.size('g')}{stride}"
    groups = f" in {problem.size('g')} groups" if problem.grouped else ""
    channels = f"{problem.size('c') * max(problem.size('g'), 1)}->{problem.size('f')}"
    if problem.grouped:
        channels = (
            f"{problem.size('c') * problem.size('g')}->{problem.size('f') * problem.size('g')}"
        )
    return f"conv {window} {channels}{stride}{groups}"


def _rest_label(ops: list[ir.Operation]) -> str:
    """A dispatch no kind tunes: a softmax or a norm (reductions with exp, or a square
    root), a max pool, another reduction (with the shape it reduces), a transpose or copy
    (bodies that only move data), or element-wise work (with its result's shape)."""
    body = {inner.name for op in ops for inner in walk_ops(op) if inner is not op}
    reducing = [op for op in ops if "reduction" in str(op.attributes.get("iterator_types", ""))]
    shape = _shape(ops[0])
    if reducing:
        shape = _shape(reducing[0].operands[0]) if len(reducing[0].operands) else shape
        kind = (
            "softmax" if "math.exp" in body
            else "norm" if body & set(_NORM_OPS)
            else "max pool" if "arith.maximumf" in body and _permutes(reducing[0], window=True)
            else "reduction"
        )  # fmt: skip
    elif body <= {"linalg.yield"}:
        kind = "transpose" if any(_permutes(op) for op in ops) else "copy"
    else:
        kind = "elementwise"
    return f"{kind} {shape}".strip()


def _permutes(op: ir.Operation, window: bool = False) -> bool:
    """Whether a copy reads its input in another order than it writes (a transpose); with
    `window`, whether an input is read through a sum of loops (a sliding window)."""
    if "indexing_maps" not in op.attributes:
        return op.name == "linalg.transpose" and not window
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if window:
        return any(isinstance(e, ir.AffineBinaryExpr) for m in maps for e in m.results)
    return len({str(m) for m in maps}) > 1


def _shape(op_or_value) -> str:
    """The shape (`64x128`) of a value, or of an op's first result; '' where it has none
    ranked."""
    value = op_or_value
    if isinstance(op_or_value, ir.Operation):
        if not len(op_or_value.results):
            return ""
        value = op_or_value.results[0]
    try:
        tensor = ir.RankedTensorType(value.type)
    except ValueError:
        return ""
    return "x".join("?" if tensor.is_dynamic_dim(i) else str(d) for i, d in enumerate(tensor.shape))
