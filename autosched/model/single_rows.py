"""Single-row contractions as generics (`layout = rows`): a decode step's projections.

torch exports a decode step's linear layers as `linalg.batch_matmul` ops of one row (a unit
batch at batch 1, the weight broadcast over the batch at batch 8). IREE forms those as batch
matmuls and a one-row batch matmul misses every fast path: on the H100 its CUDA default took
27 us for Llama-3.2-1B's 2048 x 2048 projection, where the plain product ran in 5.1 us, at
cuBLAS's speed (benchmarks/results/h100_decode_step.md). As a `linalg.generic`, IREE folds
its unit dims and forms a matrix-vector dispatch, and fuses more around it: the 1B decode
step for sm_90 is 235 dispatches instead of 511 (prefill's stay 413). Every other named op
stays named, so the custom kernels still find prefill's matmuls and the attentions.

The ops are tagged here and generalized by the transform dialect's `structured.generalize`
(run by `transform-interpreter`), built with the MLIR bindings.
"""

from __future__ import annotations

from iree.compiler import ir
from iree.compiler.dialects import transform
from iree.compiler.dialects.transform import structured

from autosched.ir_walk import walk_ops

# Named contractions whose result's next-to-last dim is the rows (M).
CONTRACTIONS = (
    "linalg.matmul",
    "linalg.batch_matmul",
    "linalg.matmul_transpose_a",
    "linalg.matmul_transpose_b",
    "linalg.batch_matmul_transpose_a",
    "linalg.batch_matmul_transpose_b",
)
TAG = "autosched.generalize"  # marks the ops the sequence generalizes
ENTRY = "__transform_main"  # transform-interpreter's entry point
SEQUENCE_ATTR = "transform.with_named_sequence"
GENERALIZE_TAGGED = "builtin.module(transform-interpreter)"


def single_row(op: ir.Operation) -> bool:
    """A named contraction with one row per batch entry (its result's M dim is 1)."""
    if op.name not in CONTRACTIONS:
        return False
    shape = ir.RankedTensorType(op.results[0].type).shape
    return len(shape) >= 2 and shape[-2] == 1


def tag_single_rows(module: ir.Module) -> int:
    """Marks each single-row contraction for the sequence; how many."""
    tagged = 0
    with module.context:
        for op in walk_ops(module.operation):
            if single_row(op):
                op.attributes[TAG] = ir.UnitAttr.get()
                tagged += 1
    return tagged


def add_sequence(module: ir.Module) -> None:
    """Appends the named sequence that generalizes the tagged ops."""
    with module.context, ir.Location.unknown():
        module.operation.attributes[SEQUENCE_ATTR] = ir.UnitAttr.get()
        any_op = transform.AnyOpType.get()
        with ir.InsertionPoint(module.body):
            sequence = transform.NamedSequenceOp(
                ENTRY, [any_op], [], arg_attrs=[{"transform.readonly": ir.UnitAttr.get()}]
            )
        with ir.InsertionPoint(sequence.body):
            root = sequence.bodyTarget
            tagged = structured.MatchOp(any_op, root, op_attrs={TAG: ir.UnitAttr.get()})
            structured.GeneralizeOp(tagged.result)
            transform.YieldOp([])


def drop_sequence(module: ir.Module) -> None:
    """Takes the sequence, its module attribute and the tags (the generics keep them) out
    once it ran."""
    for op in list(module.body.operations):
        if op.operation.name == "transform.named_sequence":
            op.operation.erase()
    if SEQUENCE_ATTR in module.operation.attributes:
        del module.operation.attributes[SEQUENCE_ATTR]
    for op in walk_ops(module.operation):
        if TAG in op.attributes:
            del op.attributes[TAG]
