"""Contractions whose f32 result is reshaped before its `truncf` (issue 24).

torch exports `nn.Linear` on a 3-D input as a unit-batch `batch_matmul`; at global
optimization its f32 result goes through `tensor.collapse_shape` (1 x M x N into M x N) and,
for q, k and v, `tensor.expand_shape` into heads, before the `truncf` to bf16 or f16. The
narrow kernel (one that stores the narrow type itself) was matched only where the `truncf`
reads the contraction directly, so on every transformers model the custom kernels wrote f32
and IREE ran a dispatch of its own to truncate it (0.48 ms of a Llama-3-8B layer's 2.57 on
the H200).

Reshapes keep the elements' order, so the narrow kernel's result reshaped to the `truncf`'s
shape is the `truncf`'s result. The shapes are read from the model lowered to global
optimization, with the bindings; the substitution spec gets one arm per (contraction, chain
length, shape), whose function calls the narrow kernel and reshapes its result.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from iree.compiler import ir

from autosched.ir_walk import defining_op, walk_ops
from autosched.model.lowering import lower_to_phase
from autosched.rewrite.builders import call, reshape, util_function
from autosched.rewrite.common import RESHAPES, REWRITE_PHASE, is_truncf

MAX_RESHAPES = 2  # collapse the unit batch, then split heads: what torch's exports hold


@dataclass(frozen=True, order=True)
class ReshapeChain:
    """Reshapes between a contraction and its `truncf`: how many, and the shape the
    `truncf` reads."""

    length: int
    shape: tuple[int, ...]


def truncf_chains(module: ir.Module):
    """(producer, chain) for each truncf-only generic that reads an op's result through 1 to
    MAX_RESHAPES reshapes."""
    for op in walk_ops(module.operation):
        if not is_truncf(op):
            continue
        shape = tuple(ir.RankedTensorType(op.results[0].type).shape)
        producer, length = defining_op(op.operands[0]), 0
        while producer is not None and producer.name in RESHAPES and length < MAX_RESHAPES:
            producer, length = defining_op(producer.operands[0]), length + 1
        if producer is not None and length and producer.name not in RESHAPES:
            yield producer, ReshapeChain(length, shape)


def reshape_chains(module: ir.Module) -> dict[str, set[ReshapeChain]]:
    """For each contraction result type (its text, e.g. `tensor<1x2048x4096xf32>`), the
    reshape chains that lead from a result of that type to a truncf-only generic. The
    spec's matchers check the contraction itself."""
    found: dict[str, set[ReshapeChain]] = {}
    for producer, chain in truncf_chains(module):
        found.setdefault(str(producer.results[0].type), set()).add(chain)
    return found


def model_reshape_chains(
    model_path: str, flags: Sequence[str], work_dir: str
) -> dict[str, set[ReshapeChain]]:
    """`reshape_chains` of the model lowered to global optimization, where the substitution
    rewrites it (REWRITE_PHASE)."""
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, "narrow_reshapes.global.mlir")
    lower_to_phase(model_path, flags, REWRITE_PHASE, path, work_dir)
    return reshape_chains(ir.Module.parseFile(path, ir.Context()))


def chain_matcher_lines(
    handle: str, chain: ReshapeChain, any_op: str, operand: int = 0, bound: str = "%mm"
) -> list[str]:
    """Transform lines that walk from `handle` (the truncf; or an epilogue's second generic,
    from its `operand`) up `chain.length` reshapes to the op bound to `bound`."""
    lines, current, position = [], handle, operand
    names = ", ".join(f'"{name}"' for name in RESHAPES)
    prefix = bound.lstrip("%")
    for step in range(chain.length):
        reshape = f"%{prefix}_reshape{step}"
        lines += [
            f"    {reshape} = transform.get_producer_of_operand {current}[{position}]"
            f" : ({any_op}) -> {any_op}",
            f"    transform.match.operation_name {reshape} [{names}] : {any_op}",
        ]
        current, position = reshape, 0
    lines.append(
        f"    {bound} = transform.get_producer_of_operand {current}[{position}]"
        f" : ({any_op}) -> {any_op}"
    )
    return lines


def reshaped_function(
    name: str, callee: str, arguments: Sequence[str], result: str, reshaped: str
) -> str:
    """`name(args) -> reshaped`: calls `callee` (which returns `result`) and reshapes its
    result, elements in the same order (no copy)."""
    return util_function(
        name, arguments, reshaped, lambda args: reshape(call(callee, args, result), reshaped)
    )
