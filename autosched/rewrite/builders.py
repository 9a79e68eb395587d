"""The spec's functions built with the MLIR Python bindings, printed into its text.

The functions a substitution spec imports into the model (a kernel's wrappers: reshapes
around a `util.call`) are built here as ops, with types parsed from their spellings, so a
malformed one fails where it is built, not in iree-opt. Each is printed on its own (its
callee is defined elsewhere in the spec, so the printer is told not to verify it) and the
spec stays one text module, beside the transform sequences and the `hal.dispatch.extern`
functions that IREE 3.13's bindings cannot build (see docs/how-it-works.md, "The rewrite").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from iree.compiler import ir
from iree.compiler.dialects import arith, flow, func, tensor, util

from autosched.ops.matmul_kernel import one_input_generic

ANY_OP, ANY_VALUE = "!transform.any_op", "!transform.any_value"
Body = Callable[[list[ir.Value]], ir.Value]  # a function's arguments -> the value it returns


def util_function(name: str, inputs: Sequence[str], result: str, body: Body) -> str:
    """A private `util.func @name(inputs) -> result` whose body `body` builds from its
    arguments, as text."""
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.create()
        types = [ir.Type.parse(spelled) for spelled in inputs]
        signature = ir.FunctionType.get(types, [ir.Type.parse(result)])
        with ir.InsertionPoint(module.body):
            function = util.FuncOp(name, ir.TypeAttr.get(signature), sym_visibility="private")
            block = function.body.blocks.append(*types)
            with ir.InsertionPoint(block):
                util.ReturnOp([body(list(block.arguments))])
        return function.operation.get_asm(assume_verified=True)


def call(callee: str, arguments: Sequence[ir.Value], result: str) -> ir.Value:
    """`util.call @callee(arguments) -> result`."""
    return util.CallOp([ir.Type.parse(result)], callee, list(arguments)).results[0]


def reshape(value: ir.Value, to: str) -> ir.Value:
    """A tensor as another shape, the elements in the same order (no copy). A dynamic one
    has one dynamic size (a count of rows), which the reshape keeps."""
    target = ir.RankedTensorType(ir.Type.parse(to))
    source = ir.RankedTensorType(value.type)
    sizes = [
        tensor.DimOp(value, arith.ConstantOp(ir.IndexType.get(), position).result).result
        for position in range(source.rank)
        if source.is_dynamic_dim(position)
    ]
    kept = sizes if any(target.is_dynamic_dim(d) for d in range(target.rank)) else []
    return flow.TensorReshapeOp(target, value, sizes, kept).result


def collapse(value: ir.Value, groups: list[list[int]], to: str) -> ir.Value:
    """`tensor.collapse_shape` of `value` by `groups` into the type `to`."""
    return tensor.CollapseShapeOp(ir.Type.parse(to), value, _groups(groups)).result


def expand(value: ir.Value, groups: list[list[int]], to: str) -> ir.Value:
    """`tensor.expand_shape` of `value` by `groups` into the static type `to`."""
    shape = ir.RankedTensorType(ir.Type.parse(to)).shape
    return tensor.ExpandShapeOp(ir.Type.parse(to), value, _groups(groups), [], shape).result


def _groups(groups: list[list[int]]) -> ir.ArrayAttr:
    """A reshape's reassociation attribute."""
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get(
        [ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in group]) for group in groups]
    )


def copy_dag(names: str, handle: str, source: str, result: str, input_map: str) -> list[str]:
    """Transform lines that match `handle` as a linalg.generic that only copies its one
    input (of type `source`, read through `input_map`) into `result`, bound to `names`."""
    return dag_lines(names, handle, _one_input_generic(source, result, input_map, False))


def truncf_dag(names: str, handle: str, source: str, result: str) -> list[str]:
    """Transform lines that match `handle` as an elementwise linalg.generic that only
    rounds its one input (of type `source`) to `result`'s element type, bound to `names`."""
    rank = ir.RankedTensorType(ir.Type.parse(source, ir.Context())).rank
    dims = ", ".join(f"d{i}" for i in range(rank))
    identity = f"affine_map<({dims}) -> ({dims})>"
    return dag_lines(names, handle, _one_input_generic(source, result, identity, True))


def dag_lines(names: str, handle: str, region: str) -> list[str]:
    """`transform.iree.match.cast_compatible_dag_from_root` of `handle` with the pattern
    `region` (its block's arguments, then the op)."""
    return [
        f"    {names} = transform.iree.match.cast_compatible_dag_from_root {handle} {{",
        *(f"    {line}" for line in region.splitlines()),
        f"    }} : ({ANY_OP}) -> ({ANY_VALUE}, {ANY_VALUE})",
    ]


def _one_input_generic(source: str, result: str, input_map: str, rounds: bool) -> str:
    """A DAG pattern's region: `^bb0` over a generic's input and init, then the generic
    (all loops parallel, its input read through `input_map`, its init as it is) whose body
    yields its input element, rounded to the result's element type where `rounds`."""
    with ir.Context(), ir.Location.unknown():
        types = [ir.Type.parse(source), ir.Type.parse(result)]
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            alone = func.FuncOp("alone", (types, types[1:]))
            block = alone.add_entry_block()
        read = ir.AffineMapAttr(ir.Attribute.parse(input_map)).value
        with ir.InsertionPoint(block):
            generic = one_input_generic(block.arguments[0], block.arguments[1], read, rounds)
            func.ReturnOp([generic.result])
        text = generic.operation.get_asm(use_local_scope=True, assume_verified=True)
    arguments = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(types))
    return f"^bb0({arguments}):\n{text.strip()}"
