"""The substitution spec's action sequences built with the MLIR bindings: each arm's caller
and `@__transform_main`, which runs the arms in passes.

The transform dialect's core ops have Python builders in IREE 3.13; IREE's `transform.util`
ops (`get_nearest_symbol_table`, `import_symbol`, `cast_and_call`) and the
`type_conversion` op inside `cast_and_call` have none, so they are created by name with
their attributes (`_util_op`), which the bindings check against the registered op. Each
sequence is printed on its own: the symbols it names are defined elsewhere in the spec.
"""

from __future__ import annotations

from collections.abc import Sequence

from iree.compiler import ir
from iree.compiler.dialects import transform
from iree.compiler.dialects.transform import structured

Arm = tuple[str, str]  # (matcher, action): the names of a foreach_match pair
FUNCTIONS = ["func.func", "util.func"]  # the ops whose bodies the arms walk


def caller_sequence(
    name: str,
    function: str,
    params: list[str],
    sources: list[tuple[str, str]],
    callees: tuple[str, ...] = (),
) -> str:
    """Calls `function` in place of the matched op's result (`params`: the matcher's handles,
    the first the op replaced) on the operands `sources` names (handle, operand positions):
    a contraction's A and B, an attention's q, k, v, or A and the stored weight. `callees`:
    functions `function` calls, imported first."""
    with ir.Context(), ir.Location.unknown():
        any_op, any_value = transform.AnyOpType.get(), transform.AnyValueType.get()
        readonly = {"transform.readonly": ir.UnitAttr.get()}
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            sequence = transform.NamedSequenceOp(
                name, [any_op] * len(params), [], arg_attrs=[readonly] * len(params)
            )
        handles = dict(zip(params, sequence.body.arguments, strict=True))
        replaced = handles[params[0]]
        with ir.InsertionPoint(sequence.body):
            table = _util_op("get_nearest_symbol_table", [any_op], [replaced])
            for callee in callees:
                _import_symbol(callee, table, any_op)
            func = _import_symbol(function, table, any_op)
            values = [
                transform.GetOperandOp(any_value, handles[handle], _positions(positions)).result
                for handle, positions in sources
            ]
            ins = values[0] if len(values) == 1 else transform.MergeHandlesOp(values).result
            outs = transform.GetResultOp(any_value, replaced, [], is_all=True).result
            _cast_and_call(replaced, ins, outs, func, any_op)
            transform.YieldOp()
        return sequence.operation.get_asm(assume_verified=True)


def main_sequence(passes: Sequence[list[Arm]], fuse_first: str | None) -> str:
    """`@__transform_main`: with `fuse_first` (a pass name), that pass on every util.func
    first; then each non-empty pass of arms over every function, matched afresh (a pass's
    matching invalidates the handles it walked); then dead code removed and the called
    functions inlined."""
    with ir.Context(), ir.Location.unknown():
        any_op = transform.AnyOpType.get()
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            sequence = transform.NamedSequenceOp("__transform_main", [any_op], [])
        root = sequence.bodyTarget
        with ir.InsertionPoint(sequence.body):
            if fuse_first:
                _each(root, ["util.func"], lambda f: _registered_pass(fuse_first, f))
            for arms in filter(None, passes):
                _each(root, FUNCTIONS, lambda f, arms=arms: _foreach_match(f, arms))
            transform.ApplyDeadCodeEliminationOp(root)
            _registered_pass("inline", root)
            transform.YieldOp()
        return sequence.operation.get_asm(assume_verified=True)


def _each(root: ir.Value, names: list[str], body) -> None:
    """`body` on each op of `root` named one of `names`."""
    matched = structured.MatchOp.match_op_names(root, names).result
    foreach = transform.ForeachOp([], [matched])
    with ir.InsertionPoint(foreach.body):
        body(foreach.bodyTargets[0])
        transform.YieldOp()


def _foreach_match(target: ir.Value, arms: list[Arm]) -> None:
    matchers = ir.ArrayAttr.get([ir.FlatSymbolRefAttr.get(m) for m, _ in arms])
    actions = ir.ArrayAttr.get([ir.FlatSymbolRefAttr.get(a) for _, a in arms])
    transform.ForeachMatchOp(target.type, [], target, [], matchers, actions)


def _registered_pass(name: str, target: ir.Value) -> None:
    transform.ApplyRegisteredPassOp(target.type, target, name)


def _positions(spelled: str) -> list[int]:
    """Operand positions as the arms spell them ("0, 1")."""
    return [int(p) for p in spelled.split(",")]


def _import_symbol(symbol: str, table: ir.Value, any_op: ir.Type) -> ir.Value:
    """`transform.util.import_symbol @symbol into table if undefined`."""
    attributes = {"symbol": ir.FlatSymbolRefAttr.get(symbol), "if_undefined": ir.UnitAttr.get()}
    return _util_op("import_symbol", [any_op], [table], attributes)


def _cast_and_call(
    before: ir.Value, ins: ir.Value, outs: ir.Value, func: ir.Value, any_op: ir.Type
) -> None:
    """`transform.util.cast_and_call func(ins) -> outs before op`, casting tensors whose
    shapes differ only in dynamic dims."""
    segments = ir.DenseI32ArrayAttr.get([1, 1, 1, 1])
    call = ir.Operation.create(
        "transform.util.cast_and_call",
        results=[any_op],
        operands=[before, ins, outs, func],
        attributes={"operandSegmentSizes": segments},
        regions=1,
    )
    with ir.InsertionPoint(call.regions[0].blocks.append()):
        ir.Operation.create("transform.type_conversion.tensor.cast_shape_dynamic_dims")


def _util_op(name: str, results: list[ir.Type], operands: list[ir.Value], attributes=None):
    """An IREE `transform.util` op, which has no Python builder: its one result."""
    op = ir.Operation.create(
        f"transform.util.{name}", results=results, operands=operands, attributes=attributes or {}
    )
    return op.result
