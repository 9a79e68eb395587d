"""Walking MLIR with IREE's bindings: an op's children, all ops below it, a symbol's name."""

from __future__ import annotations

from iree.compiler import ir


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
