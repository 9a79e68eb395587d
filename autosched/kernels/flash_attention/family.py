"""The flash-attention family behind the kernel contract (kernels/base.py): a point of the
CUDA attention target's space with `kernel = flash`, searched on an attention's op form (it
replaces the op before dispatches are formed)."""

from __future__ import annotations

from autosched.kernels.base import Absorbs, KernelFamily
from autosched.kernels.flash_attention import kernel
from autosched.targets.base import Constraint, Family, KnobSpec, Point

FLASH = "flash"  # the attention target's `kernel` knob for this family
# The first points on sm_90 (block M, block N, warps, stages): the best four of its grid on
# the H200 for the Llama-3-8B layer's causal attention, 0.096-0.108 ms against SDPA's 0.082
# (benchmarks/results/h200_flash/flash_attention.md); 64x64, 4 warps, 3 stages was also the
# best for BERT-base's (0.020 ms, SDPA 0.021).
FLASH_STARTING = ((64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 128, 4, 2))
POINT_KNOBS = ("q_tile", "kv_tile", "q_warps", "kv_stages")  # FlashParams' fields, in order


class FlashAttention(KernelFamily):
    name = "flash_attention"
    kind = "attention"
    label = "flash kernels"
    selector = ("kernel", FLASH)
    knobs = (
        KnobSpec("kv_stages", "flash kernels: key blocks in flight (0 for IREE's)", minimum=0),
    )
    # Copies before q, k and v: the kernel reads their sources (rewrite/attention_sources.py).
    absorbs = Absorbs(copied_operands=True)
    params_type = kernel.FlashParams
    # Its compile and its `hal.dispatch.extern` function (kernel.py).
    compile = staticmethod(kernel.compile_kernel)
    extern_function = staticmethod(kernel.extern_function)

    def unsupported(self, problem) -> str | None:
        return kernel.unsupported(problem)

    def form_unsupported(self, problem) -> str | None:
        if problem.form != "op":
            return "flash kernels replace the op form of an attention"
        return None

    def space(self, problem, target, pinned: dict[str, list]) -> Family:
        return Family(
            FLASH,
            [
                Constraint(
                    "flash kernels: under a causal mask kv_tile divides q_tile",
                    POINT_KNOBS,
                    lambda p, x: kernel.params_unsupported(p, self.params(x)) is None,
                ),
                Constraint(
                    "flash kernels: 4 or 8 warps, 1 to 4 stages",
                    ("q_warps", "kv_stages"),
                    lambda p, x: x["q_warps"] in (4, 8) and 1 <= x["kv_stages"] <= 4,
                ),
            ],
            fixed={"kernel": [FLASH], **pinned},
            candidates={
                "q_tile": [64, 128],
                "kv_tile": [32, 64, 128],
                "q_warps": [4, 8],
                "kv_stages": [2, 3],
            },
        )

    def starting_points(self, problem, target) -> list[Point]:
        return [
            {"kernel": FLASH, **dict(zip(POINT_KNOBS, values, strict=True))}
            for values in FLASH_STARTING
        ]

    def describe(self, knob_space: dict[str, list]) -> str:
        kernels = knob_space.get("kernel")
        return (
            ", flash-attention kernels too (`kernel = [iree]` leaves them out)"
            if kernels is None or FLASH in kernels
            else ", flash-attention kernels left out by the cfg's `kernel` list"
        )

    def params(self, point: Point) -> kernel.FlashParams:
        """Query rows, key rows, warps, stages."""
        return kernel.FlashParams(*(point[k] for k in POINT_KNOBS))
