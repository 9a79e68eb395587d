"""The zero padding before a convolution, applied by its Triton kernel (issue 25).

torch's `Conv2d(padding=1)` is a `tensor.pad` of the image before the convolution at global
optimization. IREE fuses the pad into its convolution's dispatch; a custom kernel that
replaced the convolution (and its epilogue) left the pad alone in a dispatch of its own that
copies the whole image (one per 3x3 convolution of resnet50, 16 of them). The kernel reads
the image before the pad instead and masks the taps that fall outside it.

A transform matcher can check the pad's input and result types but not its amounts or its
value, so they are read here from the model with the bindings: a problem's pad is absorbed
only where every one of its convolutions in the model reads a zero pad of the same amounts,
on its rows and columns alone.
"""

from __future__ import annotations

from dataclasses import replace

from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.kernels.igemm_conv.kernel import image_order
from autosched.ops.convolution import ConvolutionProblem
from autosched.rewrite.common import is_problems_op, read_fused_model

PAD = "tensor.pad"
Padding = tuple[tuple[int, int], ...]  # each image dim's (low, high)


def _zero(value: ir.Value) -> bool:
    """Whether `value` is a float constant 0."""
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.operation.name != "arith.constant":
        return False
    try:
        return ir.FloatAttr(owner.operation.attributes["value"]).value == 0.0
    except ValueError:
        return False


def image_padding(op: ir.Operation) -> Padding | None:
    """(low, high) of each image dim of the zero `tensor.pad` that makes the op's image, or
    None where it is not one."""
    owner = op.operands[0].owner
    if isinstance(owner, ir.Block) or owner.operation.name != PAD:
        return None
    pad = owner.operation
    low = list(ir.DenseI64ArrayAttr(pad.attributes["static_low"]))
    high = list(ir.DenseI64ArrayAttr(pad.attributes["static_high"]))
    if min(low + high) < 0:  # a dynamic amount
        return None
    body = list(pad.regions[0].blocks[0].operations)
    if not body or not _zero(body[-1].operands[0]):
        return None
    return tuple(zip(low, high, strict=True))


def padded_form(problem: ConvolutionProblem, padding: Padding) -> ConvolutionProblem:
    """The problem reading its image before the pad: the unpadded extents, the padding."""
    shape = tuple(e - lo - hi for e, (lo, hi) in zip(problem.image_shape, padding, strict=True))
    return replace(problem, image_shape=shape, padding=padding)


def padded_extents(problem: ConvolutionProblem) -> list[int]:
    """The image's extents after the pad (the convolution's operand)."""
    return [e + lo + hi for e, (lo, hi) in zip(problem.image_shape, problem.padding, strict=True)]


def model_padding(module: ir.Module, problem: ConvolutionProblem) -> Padding | None:
    """The problem's padding where every one of its convolutions in the module reads a zero
    pad of the same amounts, on rows and columns only; else None."""
    found = {image_padding(op) for op in walk_ops(module.operation) if is_problems_op(op, problem)}
    if len(found) != 1 or None in found:
        return None
    (padding,) = found
    names = image_order(problem)
    if any(pads != (0, 0) for name, pads in zip(names, padding, strict=True) if name in ("n", "c")):
        return None
    return padding if any(lo or hi for lo, hi in padding) else None


def winners_paddings(
    model_path: str, compile_flags, work_dir: str, problems: list[ConvolutionProblem]
) -> dict[str, Padding]:
    """Each convolution problem's padding (by its `key()`) in the model as the substitution
    spec sees it (common.fused_model), where it has one."""
    module = read_fused_model(model_path, compile_flags, work_dir)
    found = {problem.key(): model_padding(module, problem) for problem in problems}
    return {key: padding for key, padding in found.items() if padding is not None}
