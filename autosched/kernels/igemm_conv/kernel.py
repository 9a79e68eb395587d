"""A family of Triton implicit-GEMM convolution kernels that IREE runs as custom dispatches
(issue 25).

IREE 3.13's IGEMM configurations ran resnet50's 3x3 convolutions at 30-40 TFLOP/s on the
H200 (0.10 ms for 16x256x14x14 from 256 channels), a twentieth of its tensor cores. This
kernel is the implicit GEMM as the tensor cores want it: M the output pixels of one image
(a program's block never straddles two images, so its rows are one image's raster), N the
output channels, K the input channels for each tap of the filter window, one loop over
(tap, channel block) that Triton pipelines, and wgmma through `tl.dot`. No im2col is
written: each step loads its image tile straight from the tensor.

The kernel takes the convolution as IREE holds it at global optimization: any layout (NCHW
or NHWC images, FCHW or HWCF filters; each operand's strides come from its indexing map and
shape), strides and dilations, the image already padded (torch's padding is a `tensor.pad`
before the op). Where a pointwise convolution reads its image as a dense raster (stride 1,
no padding), the pixel block is one contiguous run of memory, loaded with vector copies.

A point is block_m (pixels), block_n (output channels), block_k (input channels per step),
warps and stages. Like the matmul and flash-attention families it is compiled by Triton to
a cubin and wrapped as a `hal.dispatch.extern` (family.py: the family behind the contract).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autosched.errors import UserError
from autosched.kernels.base import KernelBinary
from autosched.kernels.extern import dispatch_extern_function
from autosched.kernels.templates import epilogue_values, render
from autosched.kernels.triton import TRITON_TYPES, kernel_from_source, triton_binary
from autosched.ops.convolution import ConvolutionProblem, image_dims
from autosched.ops.epilogue import Epilogue
from autosched.ops.matmul_kernel import tensor_type

INPUT_TYPES = ("f16", "bf16")
OUTPUT_TYPES = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class ConvParams:
    """One point of the family."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int

    @property
    def name(self) -> str:
        return f"igemm_m{self.block_m}_n{self.block_n}_k{self.block_k}_w{self.warps}_s{self.stages}"


def unsupported(problem: ConvolutionProblem) -> str | None:
    """Why the family cannot compute this convolution, or None."""
    if problem.depthwise or problem.grouped:
        return "implicit-GEMM kernels take ungrouped convolutions"
    if problem.form == "strided":
        return "implicit-GEMM kernels replace window and pointwise convolutions"
    if problem.lhs_type != problem.rhs_type or problem.lhs_type not in INPUT_TYPES:
        return f"implicit-GEMM kernels take f16 or bf16 operands, not {problem.lhs_type}"
    if problem.acc_type not in OUTPUT_TYPES:
        return f"implicit-GEMM kernels write {OUTPUT_TYPES}, not {problem.acc_type}"
    if not problem.image_shape:
        return "the image's shape is not known"
    return None


def takes(problem: ConvolutionProblem) -> bool:
    """Whether the family computes this kind of convolution (in some form: a strided 1x1
    becomes a pointwise one in the strided layout)."""
    grouped = problem.depthwise or problem.grouped
    return not grouped and problem.lhs_type == problem.rhs_type in INPUT_TYPES


def _row_major(shape: list[int]) -> list[int]:
    return [math.prod(shape[d + 1 :]) for d in range(len(shape))]


IMAGE_ORDER = ("n", "h", "w", "c")  # the image as the kernel reads it: channels last
FILTER_ORDER = ("kh", "kw", "c", "f")  # a filter stored FCHW: output channels contiguous
CHANNELS = ("c", "f")  # a filter whose last dim is one of these is read as stored
# An NCHW image of fewer channels than the smallest block_k (an RGB image's 3) is read as
# stored, its filter FCHW too: a filter row's taps are contiguous in both, and a step takes
# every channel's row (`taps_in_k`). Made channels-last, the image was a transpose of its
# own: ViT-B/16's 32x3x224x224 took 0.099 ms on the H100, three times its patch conv's.
FEW_CHANNELS = 16
STORED_IMAGE = ("n", "c", "h", "w")
STORED_FILTER = ("f", "c", "kh", "kw")


def image_order(problem: ConvolutionProblem) -> list[str]:
    """Each image dim as IMAGE_ORDER names it, in the problem's order."""
    names = []
    for roles in image_dims(problem):
        names.append("h" if "oh" in roles or "kh" in roles else "w" if "ow" in roles else roles[0])
    return names


def taps_in_k(problem: ConvolutionProblem) -> bool:
    """Whether the kernel reads an NCHW image and an FCHW filter as stored, each filter
    row's taps and every channel one step along K (FEW_CHANNELS): no dilation along the
    row and no padding, whose masks go tap by tap."""
    return (
        tuple(image_order(problem)) == STORED_IMAGE
        and tuple(problem.operand_roles(1)) == STORED_FILTER
        and problem.size("c") < FEW_CHANNELS
        and problem.dilations[1] == 1
        and not problem.padding
    )


def image_roles(problem: ConvolutionProblem) -> list[str]:
    """The image's dims as the kernel reads it: channels last, or as stored (`taps_in_k`)."""
    names = image_order(problem)
    return names if taps_in_k(problem) else [r for r in IMAGE_ORDER if r in names]


def kernel_operands(problem: ConvolutionProblem) -> list[tuple[list[int], list[int]]]:
    """(shape the kernel takes, permutation from the op's layout) of the image and the
    filter: channels-last, so that each step's tiles are contiguous rows that Triton loads
    with 16-byte asynchronous copies (an NCHW image read by a shifted filter tap is never
    aligned), unless an image of a few channels is read as stored (`taps_in_k`). The
    permutation is the identity for an NHWC convolution."""
    names = image_order(problem)
    extents = dict(zip(names, problem.image_shape, strict=True))
    image_permutation = [names.index(r) for r in image_roles(problem)]
    filter_roles = list(problem.operand_roles(1))
    kernel_roles = filter_order(problem)
    filter_permutation = [filter_roles.index(r) for r in kernel_roles]
    return [
        ([extents[r] for r in image_roles(problem)], image_permutation),
        ([problem.size(r) for r in kernel_roles], filter_permutation),
    ]


def filter_order(problem: ConvolutionProblem) -> list[str]:
    """The filter's dims as the kernel reads them: as stored where a channel dim is
    contiguous (a pointwise filter, F x C, loads as a transposed B does: no transpose on
    every call), else FILTER_ORDER."""
    roles = list(problem.operand_roles(1))
    if roles[-1] in CHANNELS or taps_in_k(problem):
        return roles
    return [r for r in FILTER_ORDER if r in roles]


def layout_constants(problem: ConvolutionProblem) -> dict[str, int]:
    """The kernel's strides (channels-last image and filter, the output in the op's own
    layout; 0 along a dim an operand does not have), sizes, strides and dilations."""
    (image_shape, _), _ = kernel_operands(problem)
    x = dict(zip(image_roles(problem), _row_major(image_shape), strict=True))
    filter_roles = filter_order(problem)
    w = dict(zip(filter_roles, _row_major([problem.size(r) for r in filter_roles]), strict=True))
    out_roles = problem.output_roles
    o = dict(zip(out_roles, _row_major([problem.size(r) for r in out_roles]), strict=True))
    stride_h, stride_w = problem.strides
    dilation_h, dilation_w = problem.dilations
    return {
        "OH": problem.size("oh"),
        "OW": problem.size("ow"),
        "F": problem.size("f"),
        "C": problem.size("c"),
        "KH": problem.size("kh"),
        "KW": problem.size("kw"),
        "SH": stride_h,
        "SW": stride_w,
        "DH": dilation_h,
        "DW": dilation_w,
        **{f"sx{role}": x.get(role, 0) for role in ("n", "c", "h", "w")},
        **{
            f"sw{role}": w.get(r, 0)
            for role, r in (("f", "f"), ("c", "c"), ("h", "kh"), ("w", "kw"))
        },
        **{
            f"so{role}": o.get(r, 0)
            for role, r in (("n", "n"), ("f", "f"), ("h", "oh"), ("w", "ow"))
        },
    }


def _flat(constants: dict[str, int], prefix: str, step_h: int) -> bool:
    """Whether an operand's pixels are one dense raster, rows `step_h` apart: pixel p at p
    times its column stride (an output's, or a 1x1 image read at column stride 1)."""
    row, column = constants[f"{prefix}h"], constants[f"{prefix}w"]
    return constants["OH"] == 1 or step_h * row == constants["OW"] * column


def _constants(problem: ConvolutionProblem, params: ConvParams) -> dict:
    constants = layout_constants(problem) | _padding_constants(problem)
    constants["KW_IN"] = 1
    if taps_in_k(problem):  # K steps over (channel, tap) pairs, the image as stored
        constants["KW_IN"] = constants["KW"]
        constants["C"] *= constants["KW"]
        constants["KW"] = 1
    elif constants["C"] < params.block_k and constants["DW"] == 1 and not problem.padding:
        # A few input channels (an RGB image's 3): a filter row's taps and channels are
        # one contiguous run of both operands, channels-last, so each step takes them all.
        constants["C"] *= constants["KW"]
        constants["KW"] = 1
    window = constants["KH"] * constants["KW"] == 1
    constants["FLAT_X"] = (
        window
        and constants["SW"] == 1
        and _flat(constants, "sx", constants["SH"])
        and not problem.padding  # a padded raster is not the image's
    )
    constants["FLAT_O"] = _flat(constants, "so", 1)
    pixels = constants["OH"] * constants["OW"]
    constants |= {
        "P": pixels,
        "BM": params.block_m,
        "BN": params.block_n,
        "BK": params.block_k,
        "EVEN_P": pixels % params.block_m == 0,
        "EVEN_F": constants["F"] % params.block_n == 0,
        "EVEN_C": constants["C"] % params.block_k == 0,
    }
    return constants


def _padding_constants(problem: ConvolutionProblem) -> dict:
    """PADDED, the low padding of the image's rows and columns, and their unpadded extents
    (the kernel masks the taps that fall outside the image)."""
    names = image_order(problem)
    low = (
        dict(zip(names, (lo for lo, _ in problem.padding), strict=True)) if problem.padding else {}
    )
    extents = dict(zip(names, problem.image_shape, strict=True))
    return {
        "PADDED": bool(problem.padding),
        "PH": low.get("h", 0),
        "PW": low.get("w", 0),
        "IH": extents.get("h", 1),
        "IW": extents.get("w", 1),
    }


def kernel_source(epilogue: Epilogue | None = None) -> str:
    """The kernel's source (`conv.py.tmpl`: Triton compiles a function from its file), with
    the epilogue's pointers and its loads and statements after the main loop."""
    values = epilogue_values(epilogue, ("f", "F", "o_offsets", "o_mask"))
    return render(__package__, "conv.py.tmpl", **values)


def _kernel(epilogue: Epilogue | None = None):
    """The Triton kernel, from its source written to a file of its own (Triton reads a
    kernel's source from its file); importing this module needs no Triton."""
    return kernel_from_source(kernel_source(epilogue), "conv")


def grid(problem: ConvolutionProblem, params: ConvParams) -> tuple[int, int, int]:
    """Workgroups: pixel blocks times output-channel blocks, times the images."""
    pixels = problem.size("oh") * problem.size("ow")
    blocks = math.ceil(pixels / params.block_m) * math.ceil(problem.size("f") / params.block_n)
    return blocks, problem.size("n"), 1


def compile_kernel(
    problem: ConvolutionProblem,
    params: ConvParams,
    arch: str,
    path: str,
    epilogue: Epilogue | None = None,
) -> KernelBinary:
    """Triton's PTX and cubin for one point (no GPU needed), with `epilogue` in it (its
    extra inputs after the image and filter; it writes the epilogue's type)."""
    why = unsupported(problem)
    if why:
        raise UserError(f"{params.name}: {why}")
    element = TRITON_TYPES[problem.lhs_type]
    signature = {"x": f"*{element}", "w": f"*{element}"}
    for index, (_, operand) in enumerate(epilogue.extras if epilogue else []):
        signature[f"e{index}"] = f"*{TRITON_TYPES[operand.element]}"
    output = epilogue.out_element if epilogue else problem.acc_type
    signature["o"] = f"*{TRITON_TYPES[output]}"
    return triton_binary(
        _kernel(epilogue), signature, _constants(problem, params), len(signature), arch,
        params.warps, params.stages, path,
    )  # fmt: skip


def operand_tensor_types(problem: ConvolutionProblem) -> tuple[list[str], str]:
    """(image, filter) and the output as tensor types, in the op's layout."""
    filter_shape = [problem.size(r) for r in problem.operand_roles(1)]
    inputs = [
        tensor_type(list(problem.image_shape), problem.lhs_type),
        tensor_type(filter_shape, problem.rhs_type),
    ]
    return inputs, tensor_type([problem.size(r) for r in problem.output_roles], problem.acc_type)


def extern_function(
    problem: ConvolutionProblem,
    params: ConvParams,
    binary: KernelBinary,
    executable_target: str,
    name: str,
    kind: str = "func.func",
    epilogue: Epilogue | None = None,
) -> str:
    """A function `name(image, filter) -> out` in the op's layout (`kind` util.func for a
    substitution spec to call) that puts the image and filter channels-last where they are
    not (IREE's own transposes, which it may fuse into their producers) and runs the kernel
    on them as a `hal.dispatch.extern` (`{name}_kernel`). With `epilogue`: `name(image,
    filter, extras...)` returns the epilogue's result."""
    inputs, out = operand_tensor_types(problem)
    kernel_inputs = [tensor_type(shape, t) for (shape, _), t in zip(
        kernel_operands(problem), (problem.lhs_type, problem.rhs_type), strict=True
    )]  # fmt: skip
    extras = [operand.type for _, operand in epilogue.extras] if epilogue else []
    out = epilogue.out_type if epilogue else out
    workgroups = grid(problem, params)
    kernel = dispatch_extern_function(
        f"{name}_kernel", "util.func", [*kernel_inputs, *extras], out, binary,
        executable_target, workgroups,
    )  # fmt: skip
    returns = "util.return" if kind == "util.func" else "return"
    visibility = " private" if kind == "util.func" else ""
    arguments = [f"%image: {inputs[0]}", f"%filter: {inputs[1]}"]
    arguments += [f"%e{i}: {t}" for i, t in enumerate(extras)]
    lines = [f"  {kind}{visibility} @{name}({', '.join(arguments)}) -> {out} {{"]
    values = []
    for operand, (_, permutation), source, wanted in zip(
        ("image", "filter"), kernel_operands(problem), inputs, kernel_inputs, strict=True
    ):
        if permutation == sorted(permutation):
            values.append(f"%{operand}")
            continue
        lines += [
            f"    %{operand}_init = tensor.empty() : {wanted}",
            f"    %{operand}_t = linalg.transpose ins(%{operand} : {source}) "
            f"outs(%{operand}_init : {wanted}) permutation = {permutation}",
        ]
        values.append(f"%{operand}_t")
    values += [f"%e{i}" for i in range(len(extras))]
    lines += [
        f"    %out = util.call @{name}_kernel({', '.join(values)}) : "
        f"({', '.join([*kernel_inputs, *extras])}) -> {out}",
        f"    {returns} %out : {out}",
        "  }",
    ]
    return kernel + "\n".join(lines) + "\n"
