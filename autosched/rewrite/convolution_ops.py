"""A model's convolutions as they stand before IREE forms dispatches: the ops the custom
implicit-GEMM route replaces (issue 25).

At global optimization each convolution is one `linalg.generic` over its padded image (the
padding a `tensor.pad` before it) from a zero-filled f32 accumulator; IREE fuses its
neighbours (the pad, the folded batch norm, ReLU) into the dispatch later, and may reshape
it (a pointwise convolution's image loops collapsed), so the problem found at `flow` and the
op replaced here are two forms of one convolution. They are paired by the op's location and
its work and output channels: torchvision's blocks call one line for convolutions of every
stage, and a stage that halves the image and doubles the channels does the same work.

The module is read after IREE's own elementwise fusion (`ELEMENTWISE_FUSION`, the pass
dispatch creation runs first), which the substitution spec runs too: a batch norm, ReLU and
residual add after a convolution are then one `linalg.generic` (its epilogue,
`rewrite/epilogues.py`), and a filter's transpose is folded into the convolution's map.
"""

from __future__ import annotations

from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.ops.convolution import STRIDED, ConvolutionProblem
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


def paired(flow, ops: list[ConvolutionProblem]) -> ConvolutionProblem | None:
    """The op form of a dispatch's convolution (or of the matmul IREE collapsed a pointwise
    one into): the op at one of its sites' locations that does the same work on the same
    types into as many output channels. The channels tell apart the convolutions one line
    makes at every stage: a ResNet stage halves the image and doubles the channels, so its
    3x3 convolutions do equal work (16x16 images of 64 channels, 8x8 of 128); and the
    window, where one line is also the stage's first, strided block."""
    locations = {site.location for site in flow.sites}
    types = (flow.lhs_type, flow.rhs_type, flow.acc_type)
    for op in ops:
        if op.flops != flow.flops or (op.lhs_type, op.rhs_type, op.acc_type) != types:
            continue
        if output_channels(op) != output_channels(flow) or not same_window(op, flow):
            continue
        if any(site.location in locations for site in op.sites):
            return op
    return None


def same_window(op: ConvolutionProblem, flow) -> bool:
    """Whether a dispatch's convolution steps and dilates as the op does (a ResNet block's
    3x3 line is its first block's stride-2 convolution and the others' stride-1 ones, of
    equal work at the first block's output size); a matmul has no window to compare."""
    if not isinstance(flow, ConvolutionProblem) or flow.form == STRIDED:
        return True
    return (op.strides, op.dilations) == (flow.strides, flow.dilations)


def output_channels(problem) -> int:
    """A convolution's output channels (a depthwise one's: its channels), or the columns of
    the matmul IREE collapsed a pointwise convolution into (its N)."""
    if isinstance(problem, ConvolutionProblem):
        return problem.size(problem.channel)
    return problem.n
