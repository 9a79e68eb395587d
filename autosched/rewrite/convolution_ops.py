"""A model's convolutions as they stand before IREE forms dispatches: the ops the custom
implicit-GEMM route replaces (issue 25).

At global optimization each convolution is one `linalg.generic` over its padded image (the
padding a `tensor.pad` before it) from a zero-filled f32 accumulator; IREE fuses its
neighbours (the pad, the folded batch norm, ReLU) into the dispatch later, and may reshape
it (a pointwise convolution's image loops collapsed), so the problem found at `flow` and the
op replaced here are two forms of one convolution. They are paired by the op's location and
its work: torchvision's blocks call one line for convolutions of every stage.

The module is read after IREE's own elementwise fusion (`ELEMENTWISE_FUSION`, the pass
dispatch creation runs first), which the substitution spec runs too: a batch norm, ReLU and
residual add after a convolution are then one `linalg.generic` (its epilogue,
`rewrite/epilogues.py`), and a filter's transpose is folded into the convolution's map.
"""

from __future__ import annotations

from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.ops.convolution import ConvolutionProblem
from autosched.ops.convolution_kind import ConvolutionKind
from autosched.rewrite.common import fused_model, op_convolution


def model_convolutions(model_path: str, compile_flags, work_dir: str) -> list[ConvolutionProblem]:
    """The model's window and pointwise convolutions at REWRITE_PHASE after IREE's
    elementwise fusion, as op-form problems; the fused module stays in `work_dir` (FUSED_MODEL)."""
    fused = fused_model(model_path, compile_flags, work_dir, again=True)
    return op_convolutions(ir.Module.parseFile(fused, ir.Context()))


def op_convolutions(module: ir.Module) -> list[ConvolutionProblem]:
    """The window and pointwise convolutions of a module at global optimization (identical
    ones, image extents included, merged), each with every location it is called from."""
    kind = ConvolutionKind()
    found: dict[str, ConvolutionProblem] = {}
    for op in walk_ops(module.operation):
        problem = op_convolution(op, kind)
        if problem is None:
            continue
        site = problem.sites[0]
        same = found.setdefault(problem.key(), problem)
        if same is not problem:
            same.sites.append(site)
    return list(found.values())


def paired(flow: ConvolutionProblem, ops: list[ConvolutionProblem]) -> ConvolutionProblem | None:
    """The op form of a dispatch's convolution: the op at one of its sites' locations that
    does the same work on the same types."""
    locations = {site.location for site in flow.sites}
    types = (flow.lhs_type, flow.rhs_type, flow.acc_type)
    for op in ops:
        if op.flops != flow.flops or (op.lhs_type, op.rhs_type, op.acc_type) != types:
            continue
        if any(site.location in locations for site in op.sites):
            return op
    return None
