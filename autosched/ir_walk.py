"""Walking MLIR with IREE's bindings: an op's children, all ops below it, a symbol's name,
the op that defines a value, a structured op's indexing maps, a context for small parses."""

from __future__ import annotations

import threading

from iree.compiler import ir

_PER_THREAD = threading.local()


def scratch_context() -> ir.Context:
    """This thread's MLIR context for small parses (an attribute, a one-point spec, one
    configured executable). A new context costs about 7 ms, and a fast model run made
    hundreds (3.5 s of resnet18's 60 s on the CPU). Not for modules with large constants:
    what a context uniques lives as long as the context."""
    context = getattr(_PER_THREAD, "context", None)
    if context is None:
        context = _PER_THREAD.context = ir.Context()
    return context


def children(operation: ir.Operation):
    """The ops directly inside `operation`'s regions, in order."""
    for region in operation.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation


def walk_ops(operation: ir.Operation):
    """Every op below `operation`, depth first, in order."""
    for child in children(operation):
        yield child
        yield from walk_ops(child)


def symbol(operation: ir.Operation) -> str:
    return ir.StringAttr(operation.attributes["sym_name"]).value


def defining_op(value: ir.Value) -> ir.Operation | None:
    """The op whose result `value` is; None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def indexing_maps(op: ir.Operation) -> list[ir.AffineMap]:
    """A structured op's indexing maps, its operands' order."""
    return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
