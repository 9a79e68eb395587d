"""The RMSNorm that makes a matmul's A, read from a model so that the matmul's kernel computes
it (issue 48; ops/row_norm.py says what the kernel does).

At global optimization, after IREE's elementwise fusion, transformers' `LlamaRMSNorm` before
a projection is four generics, read here backwards from the contraction's A (through up to
MAX_RESHAPES reshapes): the weight multiply `g * normed` (g a vector along K), the scaling
`(wide * rsqrt(sums / K + eps))` rounded to x's type, the sum of squares of each row of
`wide` (from a zero fill), and the widening of x to f32 that both read. Anything else
before A is no norm, said with its reason.

The spec's matcher compares the widening's and the weight multiply's bodies exactly; the
scaling captures eps and K, so it is matched by its types, and a norm is kept only where
every chain of its types before the problem's contractions is the same norm (`model_norms`).
"""

from __future__ import annotations

from dataclasses import replace

from iree.compiler import ir

from autosched.ir_walk import defining_op, indexing_maps, walk_ops
from autosched.ops.base import ANY_OP, ANY_VALUE
from autosched.ops.matmul import MatmulProblem
from autosched.ops.row_norm import RowNorm
from autosched.rewrite.builders import dag_lines
from autosched.rewrite.common import RESHAPES, is_problems_op, problem_key, read_fused_model
from autosched.rewrite.common import element_type as _element
from autosched.rewrite.epilogues import generic_dag
from autosched.rewrite.narrow_reshapes import MAX_RESHAPES, ReshapeChain, chain_matcher_lines

# Each workgroup of a normed kernel reads its rows of x once more, over all of K, for their
# norms. Against a decode step's B (the whole weight) that is nothing; at a prompt's rows
# it is as much again as A's own reads, not yet measured against the norm's dispatch: up to
# this many rows the norm goes in the kernel.
MAX_NORMED_ROWS = 64
SCALING = ["arith.divf", "arith.addf", "math.rsqrt", "arith.mulf", "arith.truncf", "linalg.yield"]
SQUARES = (
    ["math.fpowi", "arith.addf", "linalg.yield"],
    ["arith.mulf", "arith.addf", "linalg.yield"],
)


def _body(op: ir.Operation) -> list[ir.Operation]:
    return [inner.operation for inner in op.regions[0].blocks[0].operations]


def _generic(value: ir.Value, inputs: int) -> ir.Operation | None:
    """The linalg.generic of `inputs` inputs and one result that makes `value`, or None."""
    op = defining_op(value)
    if op is None or op.name != "linalg.generic" or len(op.results) != 1:
        return None
    return op if len(op.operands) == inputs + 1 else None


def _constant(value: ir.Value, kind=ir.FloatAttr) -> float | int | None:
    """A constant the body reads from outside it (a float, or with `kind` IntegerAttr an
    integer), or None."""
    op = defining_op(value)
    if op is None or op.name != "arith.constant":
        return None
    try:
        return kind(op.attributes["value"]).value
    except ValueError:
        return None


def _weighted(op: ir.Operation) -> tuple[ir.Operation, int] | None:
    """(the weight multiply, its reshapes to `op`'s A): A made, through reshapes, by an
    elementwise generic of two inputs whose body multiplies them."""
    value, reshapes = op.operands[0], 0
    producer = defining_op(value)
    while producer is not None and producer.name in RESHAPES and reshapes < MAX_RESHAPES:
        value, reshapes = producer.operands[0], reshapes + 1
        producer = defining_op(value)
    weight = _generic(value, 2)
    if weight is None or [o.name for o in _body(weight)] != ["arith.mulf", "linalg.yield"]:
        return None
    return weight, reshapes


def _weight_and_scaling(weight: ir.Operation) -> tuple[int, ir.Operation] | None:
    """(g's operand position in the weight multiply, the two-input generic that makes the
    other operand): g a vector along the multiply's last loop, the other read as it is (in
    a single row both are read as they are: g is the one no such generic makes)."""
    maps = indexing_maps(weight)
    rank = maps[-1].n_dims
    context = weight.context
    identity = ir.AffineMap.get_identity(rank, context=context)
    last = ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(rank - 1, context=context)], context)
    for position in (0, 1):
        scaling = _generic(weight.operands[1 - position], 2)
        if maps[position] == last and maps[1 - position] == identity == maps[2] and scaling:
            return position, scaling
    return None


def _scaling_eps(scaling: ir.Operation, k: int) -> float | str:
    """eps of `wide * rsqrt(sums / K + eps)` rounded (the body `SCALING`, K this problem's),
    or why the body is not that."""
    body = _body(scaling)
    if [o.name for o in body] != SCALING:
        return "A is not made by an RMSNorm's scaling"
    if not _rows_of(scaling):
        return "the scaling does not read each row's sum beside the row"
    block = scaling.regions[0].blocks[0]
    divide, add, rsqrt, multiply = body[:4]
    divisor, eps = _constant(divide.operands[1]), _constant(add.operands[1])
    if divide.operands[0] != block.arguments[1] or divisor != k or eps is None:
        return "the scaling does not divide the sum of squares by K and add eps"
    if add.operands[0] != divide.results[0] or rsqrt.operands[0] != add.results[0]:
        return "the scaling does not take rsqrt(sums / K + eps)"
    if set(multiply.operands) != {block.arguments[0], rsqrt.results[0]}:
        return "the scaling does not multiply x by its row's rsqrt"
    return eps


def _sums_squares(sums: ir.Value, wide: ir.Value) -> bool:
    """Whether `sums` is the sum of the squares of each row of `wide`, from a zero fill."""
    op = _generic(sums, 1)
    if op is None or op.operands[0] != wide or [o.name for o in _body(op)] not in SQUARES:
        return False
    iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
    if "reduction" not in iterators[-1] or any("reduction" in i for i in iterators[:-1]):
        return False
    square, add = _body(op)[:2]
    block = op.regions[0].blocks[0]
    x, total = block.arguments[0], block.arguments[1]
    squared = list(square.operands) == [x, x] or (
        square.name == "math.fpowi"
        and square.operands[0] == x
        and _constant(square.operands[1], ir.IntegerAttr) == 2
    )
    if not squared or set(add.operands) != {square.results[0], total} or not _rows_of(op):
        return False
    fill = defining_op(op.operands[1])
    return fill is not None and fill.name == "linalg.fill" and _constant(fill.operands[0]) == 0.0


def _rows_of(op: ir.Operation) -> bool:
    """Whether a generic reads its first input as it is and its second operand (an input or
    its result) by the rows alone (every loop but the last): a row and its sum."""
    maps = indexing_maps(op)
    rank = maps[0].n_dims
    context = op.context
    identity = ir.AffineMap.get_identity(rank, context=context)
    rows = ir.AffineMap.get(
        rank, 0, [ir.AffineDimExpr.get(d, context=context) for d in range(rank - 1)], context
    )
    return maps[0] == identity and maps[1] == rows


def norm_of(op: ir.Operation, problem: MatmulProblem) -> RowNorm | str:
    """The RMSNorm that makes the contraction's A, or why there is none."""
    if problem.transpose_a:
        return "A is read transposed"
    found = _weighted(op)
    if found is None:
        return "A is not a product with a weight vector"
    weight, reshapes = found
    paired = _weight_and_scaling(weight)
    if paired is None:
        return "A is not a product of a weight vector and a scaling"
    position, scaling = paired
    eps = _scaling_eps(scaling, problem.k)
    if isinstance(eps, str):
        return eps
    wide = scaling.operands[0]
    widening = _generic(wide, 1)
    if widening is None or [o.name for o in _body(widening)] != ["arith.extf", "linalg.yield"]:
        return "the norm's input is not widened to f32 alone"
    if not _sums_squares(scaling.operands[1], wide):
        return "the scaling does not read the sum of squares of its own input"
    x = widening.operands[0]
    shape = ir.RankedTensorType(x.type).shape
    if shape[-1] != problem.k or _element(x.type) != problem.lhs_type:
        return "the norm's input is not A's rows in A's type"
    wide_dag, weight_dag = generic_dag(widening), generic_dag(weight)
    if not wide_dag or not weight_dag:  # a body that captures a value: no exact matcher
        return "the norm's widening or weight multiply reads a value from outside"
    return RowNorm(
        eps=eps,
        x_type=str(x.type),
        wide_type=str(wide.type),
        sums_type=str(scaling.operands[1].type),
        normed_type=str(scaling.results[0].type),
        g_type=str(weight.operands[position].type),
        weighted_type=str(weight.results[0].type),
        weight_first=position == 0,
        reshapes=reshapes,
        wide_dag=wide_dag,
        weight_dag=weight_dag,
    )


def _chain_types(op: ir.Operation) -> tuple | None:
    """The types the spec's matcher compares for a norm before `op` (`_signature`), read
    from any two-input product and two-input generic before its A; None without them."""
    found = _weighted(op)
    paired = _weight_and_scaling(found[0]) if found else None
    if paired is None:
        return None
    return str(found[0].results[0].type), str(paired[1].results[0].type), found[1]


def _signature(norm: RowNorm) -> tuple:
    return norm.weighted_type, norm.normed_type, norm.reshapes


def model_norms(module: ir.Module, problem: MatmulProblem) -> list[RowNorm]:
    """The norms before the problem's contractions in the module (fused), each once, and
    only those no other chain of the same types differs from (the matcher cannot tell them
    apart: see the module's docstring)."""
    found, unread = [], set()
    for op in walk_ops(module.operation):
        if not is_problems_op(op, problem):
            continue
        norm = norm_of(op, problem)
        if isinstance(norm, str):
            types = _chain_types(op)
            if types is not None:
                unread.add(types)
        elif norm not in found:
            found.append(norm)
    alike = [_signature(n) for n in found]
    return [n for n in found if _signature(n) not in unread and alike.count(_signature(n)) == 1]


def winners_norms(
    model_path: str, compile_flags, work_dir: str, problems: list
) -> dict[str, list[RowNorm]]:
    """Each matmul problem's norms in the model (by `problem_key`), as the op forms were read
    (work_dir's FUSED_MODEL, lowered and fused when it is not there)."""
    module = read_fused_model(model_path, compile_flags, work_dir)
    return {problem_key(p): model_norms(module, p) for p in problems if p.kind == "matmul"}


def normed(problem: MatmulProblem, norm: RowNorm) -> MatmulProblem:
    """The problem's form whose kernel computes the norm (takes x and g for A)."""
    return replace(problem, norm=norm, sites=[])


def normed_forms(family, problem, point: dict, forms) -> list[MatmulProblem]:
    """The winner's forms that compute a norm read before its ops (`forms.norms`), where
    its family absorbs norms, the rows are few (MAX_NORMED_ROWS) and its point runs the
    plain kernel: the norm is in `matmul` and `rotated_matmul`, not in the persistent forms
    nor in a kernel for any count of rows."""
    if problem.kind != "matmul" or not family.absorbs.norms or problem.any_rows:
        return []
    if problem.m * max(problem.batch, 1) > MAX_NORMED_ROWS:
        return []
    if point.get("persistent") or point.get("specialized"):
        return []
    found = [normed(problem, norm) for norm in forms.norms.get(problem_key(problem), [])]
    return [form for form in found if family.unsupported(form) is None]


def normed_form(problem) -> bool:
    """Whether the problem (of any kind) is a matmul's normed form."""
    return getattr(problem, "norm", None) is not None


def norm_handles(problem) -> list[str]:
    """The handles a matcher yields for a normed form: the widening (its operand 0 is x)
    and the weight multiply (g is its operand `weight_position`)."""
    return ["%nx", "%nw"] if normed_form(problem) else []


def lhs_sources(problem, handle: str, b: tuple[str, str]) -> list[tuple[str, str]]:
    """(handle, operand positions) of what the kernel reads for A and B, in its order: A
    and then `b` (a handle and B's position on it), or for a normed form x, B and g."""
    norm = problem.norm if normed_form(problem) else None
    if norm is None:
        return [(handle, "0"), b] if b[0] != handle else [(handle, f"0, {b[1]}")]
    return [("%nx", "0"), b, ("%nw", str(norm.weight_position))]


def norm_matcher_lines(handle: str, norm: RowNorm) -> list[str]:
    """Transform lines that match the producer of `handle`'s A (through the norm's
    reshapes) as the norm's weight multiply (`%nw`, exactly), the scaling before it by
    its types, and the widening before that (`%nx`, exactly)."""
    lines = chain_matcher_lines(handle, ReshapeChain(norm.reshapes, ()), ANY_OP, 0, "%nw")
    lines += dag_lines("%nw_ins, %nw_outs", "%nw", norm.weight_dag)
    lines.append(
        f"    %nn = transform.get_producer_of_operand %nw[{norm.normed_position}]"
        f" : ({ANY_OP}) -> {ANY_OP}"
    )
    param = "!transform.param<i64>"
    lines += [
        f'    transform.match.operation_name %nn ["linalg.generic"] : {ANY_OP}',
        f"    transform.match.structured %nn : {ANY_OP} {{",
        f"    ^bb0(%scaling: {ANY_OP}):",
        f"      %nn_count = transform.match.structured.num_inputs %scaling : ({ANY_OP}) -> {param}",
        f"      %nn_want = transform.param.constant 2 : i64 -> {param}",
        f"      transform.match.param.cmpi eq %nn_count, %nn_want : {param}",
        "      transform.match.structured.yield",
        "    }",
    ]
    for position, spelled in enumerate((norm.wide_type, norm.sums_type, norm.normed_type)):
        lines += [
            f"    %nn{position} = transform.get_operand %nn[{position}]"
            f" : ({ANY_OP}) -> {ANY_VALUE}",
            f"    transform.iree.match.cast_compatible_type %nn{position} = {spelled}"
            f" : {ANY_VALUE}",
        ]
    lines.append(f"    %nx = transform.get_producer_of_operand %nn[0] : ({ANY_OP}) -> {ANY_OP}")
    return lines + dag_lines("%nx_ins, %nx_outs", "%nx", norm.wide_dag)
