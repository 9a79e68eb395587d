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
from iree.compiler.dialects import flow, tensor, util

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
    """A static tensor as another shape, the elements in the same order (no copy)."""
    return flow.TensorReshapeOp(ir.Type.parse(to), value, [], []).result


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
