"""The flash-decoding family behind the kernel contract (kernels/base.py): a point of the
CUDA attention target's space with `kernel = flash_decoding`, searched on the op form of an
attention with few query rows (a decode step), where it replaces the op."""

from __future__ import annotations

from autosched.kernels.base import Absorbs, KernelFamily
from autosched.kernels.flash_decoding import kernel
from autosched.targets.base import Constraint, Family, KnobSpec, Point

DECODING = "flash_decoding"  # the attention target's `kernel` knob for this family
POINT_KNOBS = ("q_tile", "kv_tile", "kv_splits", "q_warps", "kv_stages")  # DecodingParams'
SMS = 132  # the H100's and the H200's: the workgroups one wave of shares should fill
STARTING_BLOCKS = (64, 128)  # keys per step of the first points


class FlashDecoding(KernelFamily):
    name = "flash_decoding"
    kind = "attention"
    label = "flash-decoding kernels"
    selector = ("kernel", DECODING)
    knobs = (
        KnobSpec(
            "kv_splits",
            "flash decoding: shares of the keys, one workgroup each (0 for other kernels)",
            minimum=0,
        ),
        KnobSpec("kv_stages", "flash kernels: key blocks in flight (0 for IREE's)", minimum=0),
    )
    params_type = kernel.DecodingParams
    # Copies before q, k and v: the kernel reads their sources (rewrite/attention_sources.py).
    absorbs = Absorbs(copied_operands=True)
    compile = staticmethod(kernel.compile_kernel)
    extern_function = staticmethod(kernel.extern_function)

    def unsupported(self, problem) -> str | None:
        return kernel.unsupported(problem)

    def form_unsupported(self, problem) -> str | None:
        if problem.form != "op":
            return "flash-decoding kernels replace the op form of an attention"
        return None

    def space(self, problem, target, pinned: dict[str, list]) -> Family:
        return Family(
            DECODING,
            [
                Constraint(
                    "flash decoding: 2 or more shares of whole key blocks, the rows in one",
                    POINT_KNOBS,
                    lambda p, x: kernel.params_unsupported(p, self.params(x)) is None,
                ),
            ],
            fixed={"kernel": [DECODING], "q_tile": [kernel.rows_block(problem)], **pinned},
            candidates={
                "kv_tile": [32, 64, 128],
                "kv_splits": [2, 4, 8, 16, 32],
                "q_warps": [4],
                "kv_stages": [1, 2, 3],
            },
        )

    def starting_points(self, problem, target) -> list[Point]:
        """Shares that fill two waves of the GPU's SMs over the batch entries, where the
        keys have that many blocks."""
        wanted = max(2, 2 * SMS // kernel.entries(problem))
        points = []
        for block in STARTING_BLOCKS:
            splits = min(1 << (wanted.bit_length() - 1), 32, kernel.key_blocks(problem, block))
            values = (kernel.rows_block(problem), block, splits, 4, 2)
            point = {"kernel": DECODING, **dict(zip(POINT_KNOBS, values, strict=True))}
            if kernel.params_unsupported(problem, self.params(point)) is None:
                points.append(point)
        return points

    def params(self, point: Point) -> kernel.DecodingParams:
        """Query rows, keys per step, shares, warps, stages."""
        return kernel.DecodingParams(*(point[k] for k in POINT_KNOBS))
