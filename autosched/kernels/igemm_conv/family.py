"""The implicit-GEMM convolution family behind the kernel contract (kernels/base.py): a
point of the CUDA convolution target's space with `conv_kernel = triton`, searched on a
convolution's op form (it replaces the op before dispatches are formed)."""

from __future__ import annotations

import math

from autosched.kernels.base import Absorbs, KernelFamily
from autosched.kernels.igemm_conv import kernel
from autosched.kernels.triton import ELEMENT_BYTES
from autosched.targets.base import Constraint, Family, KnobSpec, Point

TRITON = "triton"  # the convolution target's `conv_kernel` knob for this family
POINT_KNOBS = ("block_pixels", "block_filters", "block_channels", "kernel_warps", "kernel_stages")
# The first points (pixels, output channels, input channels per step, warps, stages): the
# best of benchmarks/conv_kernels.py's six on resnet50's 23 convolutions on the H200
# (benchmarks/results/h200_conv/conv_kernels_session18.md), most often first (9, 7, 5, 1
# and 1 of them); a 32-channel step for images of a few channels (the stem's 3).
TRITON_STARTING = (
    (64, 64, 64, 4, 4),
    (64, 128, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (128, 64, 64, 4, 3),
    (128, 256, 64, 8, 3),
    (64, 64, 32, 4, 4),
)


class IgemmConvolution(KernelFamily):
    name = "igemm_conv"
    kind = "convolution"
    label = "Triton convolution kernels"
    selector = ("conv_kernel", TRITON)
    knobs = tuple(
        KnobSpec(name, f"Triton convolution kernels: {what} (0 for IREE's)", minimum=0)
        for name, what in zip(
            POINT_KNOBS,
            (
                "output pixels per workgroup",
                "output channels per workgroup",
                "input channels per step",
                "warps per workgroup",
                "steps in flight",
            ),
            strict=True,
        )
    )
    # The narrow output, epilogues, the image's zero pad (rewrite/conv_padding.py), and the
    # operands in the op's layout (its function puts them channels-last).
    absorbs = Absorbs(narrow_output=True, epilogues=True, padding=True, layouts=True)
    params_type = kernel.ConvParams
    # Its compile and its `hal.dispatch.extern` function (kernel.py).
    compile = staticmethod(kernel.compile_kernel)
    extern_function = staticmethod(kernel.extern_function)

    def unavailable(self, target) -> str | None:
        if target.arch not in self.archs:
            return f"{self.label} are written for {', '.join(self.archs)}"
        return super().unavailable(target)

    def unsupported(self, problem) -> str | None:
        return kernel.unsupported(problem)

    def form_unsupported(self, problem) -> str | None:
        if not problem.op_form:
            return "Triton convolution kernels replace the op form of a convolution"
        return None

    def space(self, problem, target, pinned: dict[str, list]) -> Family:
        """Blocks of pixels, output channels and input channels; IREE's knobs pinned."""
        return Family(
            TRITON,
            [
                Constraint(
                    "Triton convolution kernels: 4 or 8 warps, 2 to 5 stages",
                    ("kernel_warps", "kernel_stages"),
                    lambda p, x: x["kernel_warps"] in (4, 8) and 2 <= x["kernel_stages"] <= 5,
                ),
                Constraint(
                    f"shared memory over the {target.arch} limit",
                    ("block_pixels", "block_filters", "block_channels", "kernel_stages"),
                    lambda p, x: self.shared_memory(p, x, target) <= target.shared_memory_bytes,
                ),
            ],
            fixed=pinned | {"conv_kernel": [TRITON]},
            candidates={
                "block_pixels": [64, 128, 256],
                "block_filters": [64, 128, 256],
                "block_channels": [32, 64],
                "kernel_warps": [4, 8],
                "kernel_stages": [3, 4],
            },
        )

    def starting_points(self, problem, target) -> list[Point]:
        return [
            {"conv_kernel": TRITON, **dict(zip(POINT_KNOBS, values, strict=True))}
            for values in TRITON_STARTING
        ]

    def params(self, point: Point) -> kernel.ConvParams:
        return kernel.ConvParams(*(point[k] for k in POINT_KNOBS))

    def shared_memory(self, problem, point: Point, target) -> int:
        """Bytes of the image and filter blocks Triton stages, once per step in flight."""
        element = ELEMENT_BYTES[problem.lhs_type]
        blocks = (point["block_pixels"] + point["block_filters"]) * point["block_channels"]
        return blocks * element * point["kernel_stages"]

    def features(self, problem, point: Point, target) -> dict[str, float]:
        """Workgroups against the SMs, and the shared memory a point takes of the limit."""
        blocks = kernel.grid(problem, self.params(point))
        workgroups = blocks[0] * blocks[1]
        return {
            "log2_workgroups": math.log2(workgroups),
            "waves": workgroups / target.sm_count,
            "shared_memory_fraction": self.shared_memory(problem, point, target)
            / target.shared_memory_bytes,
        }
