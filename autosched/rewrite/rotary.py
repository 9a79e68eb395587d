"""RoPE's rotate-half, read from a model so that the q or k kernel computes it (issue 24).

transformers' Llama applies rotary embeddings as `q * cos + rotate_half(q) * sin`. At global
optimization, after q's projection and its truncf, `rotate_half` is a chain of four ops: a
generic that moves the heads before the tokens, an expand_shape that splits the head dim in
two halves, a generic of no inputs whose body reads that tensor with `tensor.extract` at the
other half (negated in the first), and a collapse_shape back. The epilogue generic reads the
truncf (through the same move), cos, the chain's result and sin. In a decode step (one token)
there is no move: the epilogue reads the truncf reshaped into heads, and the chain's
expand_shape splits the truncf itself into heads and halves (`_is_view`).

The rotating generic's body is index arithmetic. It is evaluated here with numpy over its
whole iteration space (each loop index a broadcast arange, so every array is only as large as
what it depends on), and the chain is taken only where every element reads its own head's
other half, negated in the first half. The kernel then rotates its tile the same way
(`EpilogueInput.period`).
"""

from __future__ import annotations

import operator

import numpy as np
from iree.compiler import ir

from autosched.ir_walk import defining_op, indexing_maps
from autosched.rewrite.common import COLLAPSE, EXPAND, reassociation
from autosched.rewrite.common import tensor_shape as _shape


def _splits_last_in_halves(reshape: ir.Operation, split: ir.Value) -> bool:
    """Whether the reshape merges only the last two dims of its `split` side, the first of
    them 2: the head dim in two halves."""
    groups = reassociation(reshape)
    rank = len(_shape(split))
    expected = [[i] for i in range(rank - 2)] + [[rank - 2, rank - 1]]
    return groups == expected and _shape(split)[-2] == 2


def _is_move(op: ir.Operation | None, source: ir.Value, acc_map: ir.AffineMap) -> bool:
    """A generic that only copies `source`, read through `acc_map`, into its result."""
    if op is None or op.name != "linalg.generic" or len(op.operands) != 2:
        return False
    body = list(op.regions[0].blocks[0].operations)
    if [o.operation.name for o in body] != ["linalg.yield"]:
        return False
    maps = indexing_maps(op)
    identity = ir.AffineMap.get_identity(maps[1].n_dims, context=op.context)
    return op.operands[0] == source and maps[0] == acc_map and maps[1] == identity


def _chain(value: ir.Value) -> tuple | None:
    """(collapse, rotating generic, the tensor it extracts from, that tensor's expand) of
    the chain that ends in `value`, by its ops alone; None where it has none."""
    collapse = defining_op(value)
    if collapse is None or collapse.name != COLLAPSE:
        return None
    rotating = defining_op(collapse.operands[0])
    if rotating is None or rotating.name != "linalg.generic":
        return None
    source = _extracted_tensor(rotating)
    expand = defining_op(source) if source is not None else None
    if expand is None or expand.name != EXPAND:
        return None
    return collapse, rotating, source, expand


def rotation_start(value: ir.Value) -> ir.Operation | None:
    """The expand_shape at the start of the rotation chain that ends in `value`, if `value`
    ends one (before its checks: to tell which of a truncf's two users is the epilogue)."""
    chain = _chain(value)
    return chain[3] if chain else None


def rotation_period(
    value: ir.Value, rounded: ir.Value, read: ir.Value, acc_map: ir.AffineMap
) -> int | None:
    """The head dim when `value` (an input of an epilogue generic that reads the truncf's
    result `rounded` as `read`, itself or reshaped, through `acc_map`, over loops whose last
    is the head dim) is `read` as the generic reads it, rotated by half in each head; else
    None."""
    chain = _chain(value)
    if chain is None:
        return None
    collapse, rotating, source, expand = chain
    if len(rotating.operands) != 1 or _shape(source) != _shape(rotating.results[0]):
        return None
    moved = _splits_last_in_halves(expand, source) and _is_move(
        defining_op(expand.operands[0]), rounded, acc_map
    )
    halves = _splits_last_in_halves(collapse, rotating.results[0])
    if not (halves and (moved or _is_view(expand, rounded, read, acc_map))):
        return None
    return 2 * _shape(source)[-1] if rotates_half(rotating, source) else None


def _is_view(expand: ir.Operation, rounded: ir.Value, read: ir.Value, acc_map) -> bool:
    """Whether the chain's expand_shape splits `rounded` itself into the heads the generic
    reads it as (`read`, through the identity) and each head's halves. Reshapes keep the
    elements' order, so its [..., half, j] is `read`'s [..., half * H + j]."""
    identity = ir.AffineMap.get_identity(acc_map.n_dims, context=acc_map.context)
    split, viewed = _shape(expand.results[0]), _shape(read)
    return (
        expand.operands[0] == rounded
        and acc_map == identity
        and split[:-2] == viewed[:-1]
        and split[-2] == 2
        and split[-2] * split[-1] == viewed[-1]
    )


def _extracted_tensor(generic: ir.Operation) -> ir.Value | None:
    """The one tensor the generic's body reads with tensor.extract, or None."""
    sources = {
        op.operands[0]
        for op in generic.regions[0].blocks[0].operations
        if op.operation.name == "tensor.extract"
    }
    return next(iter(sources)) if len(sources) == 1 else None


# Index arithmetic, as numpy computes it on broadcast index arrays (signed ops truncate, as
# arith's do).
def _divsi(a, b):
    return np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))


INDEX_OPS = {
    "arith.addi": operator.add,
    "arith.subi": operator.sub,
    "arith.muli": operator.mul,
    "arith.divsi": _divsi,
    "arith.remsi": lambda a, b: a - b * _divsi(a, b),
    "arith.divui": operator.floordiv,
    "arith.remui": operator.mod,
}
# arith.cmpi's predicates, by their enum value.
COMPARISONS = {
    0: operator.eq,
    1: operator.ne,
    2: operator.lt,
    3: operator.le,
    4: operator.gt,
    5: operator.ge,
    6: operator.lt,
    7: operator.le,
    8: operator.gt,
    9: operator.ge,
}


class _Read:
    """An element of the extracted tensor: its indices and the sign it is taken with."""

    def __init__(self, indices: tuple, sign):
        self.indices, self.sign = indices, sign


def _evaluate(generic: ir.Operation, source: ir.Value) -> _Read | None:
    """What the body yields, over the whole iteration space: one read of `source` with a
    sign; None for a body with any other op."""
    shape = _shape(generic.results[0])
    values: dict = {}
    for op in generic.regions[0].blocks[0].operations:
        op = op.operation
        args = [values[v] if v in values else _captured(v) for v in op.operands]
        if op.name == "linalg.yield":
            return args[0] if isinstance(args[0], _Read) else None
        result = _evaluate_op(op, args, shape, source)
        if result is None:
            return None
        values[op.results[0]] = result
    return None


def _captured(value: ir.Value):
    """An integer constant the body reads from outside it; None for anything else."""
    owner = defining_op(value)
    if owner is None or owner.name != "arith.constant":
        return None
    return _evaluate_op(owner, [], [], value)


def _evaluate_op(op: ir.Operation, args: list, shape: list[int], source: ir.Value):
    """One body op on evaluated operands; None where it is not index arithmetic, a read
    of `source`, its negation or a choice between reads of the same element."""
    name = op.name
    if name == "linalg.index":
        dim = ir.IntegerAttr(op.attributes["dim"]).value
        return np.arange(shape[dim]).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    if name == "arith.constant":
        try:
            return np.int64(ir.IntegerAttr(op.attributes["value"]).value)
        except ValueError:
            return None
    if name == "tensor.extract" and op.operands[0] == source:
        indices = tuple(args[1:])
        return _Read(indices, np.int64(1)) if all(a is not None for a in indices) else None
    if any(a is None for a in args):
        return None
    if name in INDEX_OPS:
        return INDEX_OPS[name](args[0], args[1])
    if name == "arith.cmpi":
        compare = COMPARISONS[ir.IntegerAttr(op.attributes["predicate"]).value]
        return compare(args[0], args[1])
    if name == "arith.negf" and isinstance(args[0], _Read):
        return _Read(args[0].indices, -args[0].sign)
    if name == "arith.select" and isinstance(args[1], _Read) and isinstance(args[2], _Read):
        if args[1].indices is not args[2].indices:
            return None
        return _Read(args[1].indices, np.where(args[0], args[1].sign, args[2].sign))
    return None


def rotates_half(generic: ir.Operation, source: ir.Value) -> bool:
    """Whether the generic (no inputs, all loops parallel) yields at each (..., i, j) of its
    result `source`[..., 1 - i, j], negated where i is 0: rotate_half over the last two dims
    (the halves and their elements)."""
    iterators = [str(i) for i in ir.ArrayAttr(generic.attributes["iterator_types"])]
    if any("parallel" not in i for i in iterators):
        return False
    read = _evaluate(generic, source)
    shape = _shape(generic.results[0])
    if read is None or len(read.indices) != len(shape):
        return False
    grids = np.indices(shape, sparse=True)
    expected = [*grids[:-2], 1 - grids[-2], grids[-1]]
    for got, want in zip(read.indices, expected, strict=True):
        if not np.array_equal(np.broadcast_to(got, shape), np.broadcast_to(want, shape)):
            return False
    sign = np.where(grids[-2] == 0, -1, 1)
    return np.array_equal(np.broadcast_to(read.sign, shape), np.broadcast_to(sign, shape))
