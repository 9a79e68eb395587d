"""Attention on IREE's CUDA backend: `VectorDistribute` configurations of the online
attention, on the mma.sync tensor cores.

IREE's default for transformers' small Llama layer in bf16 (sm_80, 64 query rows, head dim
32) is one workgroup of 4 warps per 64 query rows (`workgroup = [1, 1, 64, 32, 0, 0]`),
64 key rows per step (`reduction`), Q, K and V staged in shared memory, and a
`decomposition_config` giving the Q.K and P.V matmuls the `NV_MMA_SYNC_F32_16x8x16_BF16`
intrinsic with the warps split along the query rows (`subgroup_basis`). The knobs are those
three numbers: query rows per workgroup, key rows per step, warps along the query rows.
The head dims stay whole, as in IREE's default.
"""

from __future__ import annotations

import math

from autosched.ops.attention import AttentionProblem
from autosched.targets import cuda_flash_attention as flash
from autosched.targets.base import Constraint, Family, KnobSpec, Point, by_role, powers_of_two
from autosched.targets.cuda import ELEMENT_BYTES, MMA_FOR_TYPES, MMA_M, CudaTarget
from autosched.targets.cuda_custom import CUSTOM_ARCHS, WARP

IREE, FLASH = "iree", "flash"  # the `kernel` knob: IREE's VectorDistribute, or Triton's
ATTENTION_KNOBS = (
    KnobSpec("q_tile", "query rows per workgroup (attention)"),
    KnobSpec("kv_tile", "key rows per online-softmax step (attention)"),
    KnobSpec("q_warps", "warps along the query rows (attention)"),
    KnobSpec(
        "kernel",
        "attention: IREE's VectorDistribute (iree) or the Triton flash-attention family on "
        "sm_90 (flash), which replaces the op before dispatches are formed",
        choices=(IREE, FLASH),
    ),
    KnobSpec("kv_stages", "flash kernels: key blocks in flight (0 for IREE's)", minimum=0),
)
# The flash family's first points on sm_90 (block M, block N, warps, stages): the best four
# of its grid on the H200 for the Llama-3-8B layer's causal attention, 0.096-0.108 ms against
# SDPA's 0.082 (benchmarks/results/h200_flash/flash_attention.md); 64x64, 4 warps, 3 stages
# was also the best for BERT-base's (0.020 ms, SDPA 0.021).
FLASH_STARTING = ((64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 128, 4, 2))
MMA_K = 16  # every 16-bit NV_MMA_SYNC intrinsic reduces 16 elements per step
# Measured on the H200 (Llama-3 layer, benchmarks/results/h200_models/
# llama3_bf16_attention_session12.md): over 32 query rows per warp compiled in up to 82 s and
# ran 2.4-16 ms (one point past the 120 s run timeout) against 0.63-1.06 ms; 256 key rows
# per step were slower than 128 at every warp count.
MAX_ROWS_PER_WARP = 32
MAX_KV_TILE = 128
PROMOTED = "#iree_gpu.derived_thread_config"  # how IREE's default stages each operand


def _promote(operands: list[int]) -> str:
    kinds = ", ".join([PROMOTED] * len(operands))
    return f"promote_operands = {operands}, promotion_types = [{kinds}]"


def shared_memory(problem: AttentionProblem, point: Point) -> int:
    """Bytes of the staged Q tile and K and V tiles (IREE's default promotes all three)."""
    element = ELEMENT_BYTES[problem.query_type]
    k1, n = problem.size("k1"), problem.size("n")
    return element * (point["q_tile"] * k1 + point["kv_tile"] * (k1 + n))


def flash_params(point: Point) -> flash.FlashParams:
    """A flash point's kernel parameters (query rows, key rows, warps, stages)."""
    return flash.FlashParams(
        point["q_tile"], point["kv_tile"], point["q_warps"], point["kv_stages"]
    )


class CudaAttentionTarget(CudaTarget):
    knobs = ATTENTION_KNOBS

    def supports(self, problem: AttentionProblem) -> str | None:
        """The tensor-core intrinsic must exist for the types (no f32 attention here)."""
        kind = MMA_FOR_TYPES.get((problem.query_type, "f32"))
        types = {problem.query_type, problem.key_type, problem.value_type}
        if len(types) > 1 or kind not in self.mma_intrinsics:
            return f"attention on {sorted(types)}: no tensor-core configuration on {self.arch}"
        return None

    def dispatch_repeat(self, problem: AttentionProblem) -> int:
        """About 50 ms of work per timed call, as for matmuls (CudaTarget.dispatch_repeat)."""
        estimate_s = problem.flops / 100e12
        return int(min(200, max(1, math.ceil(0.05 / estimate_s))))

    def flash_unavailable(self, problem: AttentionProblem) -> str | None:
        """Why the flash family is not searched for this problem, or None: it replaces the
        op before dispatches are formed, so only the op form of an attention has it."""
        if problem.form != "op":
            return "flash kernels replace the op form of an attention"
        return self.flash_available() or flash.unsupported(problem)

    def flash_available(self) -> str | None:
        """Why this target cannot run the flash family at all, or None."""
        if self.arch not in CUSTOM_ARCHS:
            return f"flash kernels are written for {', '.join(CUSTOM_ARCHS)}, not {self.arch}"
        if not self.machine.triton:
            return "flash kernels need Triton: pip install '.[triton]'"
        return None

    def families(self, problem: AttentionProblem, lists) -> list[Family]:
        """IREE's pipeline, and the flash family where it can run (see flash_unavailable)."""
        iree = Family(IREE, self.constraints(problem), fixed={"kernel": [IREE], "kv_stages": [0]})
        kernels = lists.get("kernel") or [IREE, FLASH]
        if FLASH not in kernels or self.flash_unavailable(problem):
            return [iree]
        flash_family = Family(
            FLASH,
            self.flash_constraints(problem),
            fixed={"kernel": [FLASH]},
            candidates={
                "q_tile": [64, 128],
                "kv_tile": [32, 64, 128],
                "q_warps": [4, 8],
                "kv_stages": [2, 3],
            },
        )
        return [iree, flash_family] if IREE in kernels else [flash_family]

    def flash_constraints(self, problem: AttentionProblem) -> list[Constraint]:
        return [
            Constraint(
                "flash kernels: under a causal mask kv_tile divides q_tile",
                ("q_tile", "kv_tile", "q_warps", "kv_stages"),
                lambda p, x: flash.params_unsupported(p, flash_params(x)) is None,
            ),
            Constraint(
                "flash kernels: 4 or 8 warps, 1 to 4 stages",
                ("q_warps", "kv_stages"),
                lambda p, x: x["q_warps"] in (4, 8) and 1 <= x["kv_stages"] <= 4,
            ),
        ]

    def in_spec(self, point: Point) -> bool:
        return point.get("kernel", IREE) == IREE

    def source_command(self, problem: AttentionProblem, point: Point, source: str) -> list[str]:
        """Flash kernels: Triton compiles the point and writes its extern module."""
        if self.in_spec(point):
            return []
        return flash.source_command(problem, flash_params(point), self.arch, source)

    def starting_points(self, problem: AttentionProblem) -> list[Point]:
        """The flash family's (FLASH_STARTING) where it runs; IREE's sm_80 default for the
        small layer, the best of the Llama-3 layer's first batch on the H200 (0.63 ms
        against IREE's sm_90 default's 1.56 ms)."""
        knobs = ("q_tile", "kv_tile", "q_warps", "kv_stages")
        flash_points = [
            {"kernel": FLASH, **dict(zip(knobs, values, strict=True))} for values in FLASH_STARTING
        ]
        return flash_points + [{"kernel": IREE, "q_tile": 64, "kv_tile": 64, "q_warps": 4}]

    def candidates(self, knob: str, problem: AttentionProblem) -> list[int]:
        if knob == "q_tile":
            return powers_of_two(MMA_M, min(problem.size("m"), 256))
        if knob == "kv_tile":
            return powers_of_two(MMA_K, min(problem.size("k2"), MAX_KV_TILE))
        if knob == "q_warps":
            return [1, 2, 4, 8]
        if knob == "kernel":
            return [IREE, FLASH]
        raise KeyError(knob)

    def constraints(self, problem: AttentionProblem) -> list[Constraint]:
        return [
            Constraint(
                "q_tile does not divide the query rows",
                ("q_tile",),
                lambda p, x: p.size("m") % x["q_tile"] == 0,
            ),
            Constraint(
                "kv_tile does not divide the key rows",
                ("kv_tile",),
                lambda p, x: p.size("k2") % x["kv_tile"] == 0,
            ),
            Constraint(
                "q_tile is not a multiple of 16 rows per warp",
                ("q_tile", "q_warps"),
                lambda p, x: x["q_tile"] % (MMA_M * x["q_warps"]) == 0,
            ),
            Constraint(
                f"over {MAX_ROWS_PER_WARP} query rows per warp (slow to build and to run)",
                ("q_tile", "q_warps"),
                lambda p, x: x["q_tile"] <= MAX_ROWS_PER_WARP * x["q_warps"],
            ),
            Constraint(
                f"shared memory over the {self.arch} limit",
                ("q_tile", "kv_tile"),
                lambda p, x: shared_memory(p, x) <= self.shared_memory_bytes,
            ),
        ]

    def _mma(self, problem: AttentionProblem) -> str:
        return f"mma_kind = #iree_gpu.mma_layout<{MMA_FOR_TYPES[(problem.query_type, 'f32')]}>"

    def lowering_config(self, problem: AttentionProblem, point: Point) -> str:
        workgroup = by_role(problem, {"b": 1, "m": point["q_tile"], "n": problem.size("n")})
        reduction = by_role(problem, {"k2": point["kv_tile"]})
        config = (
            f"#iree_gpu.lowering_config<{{{_promote([0, 1, 2])}, "
            f"reduction = {reduction}, workgroup = {workgroup}}}>"
        )
        translation = (
            "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<VectorDistribute> "
            f"workgroup_size = [{WARP * point['q_warps']}, 1, 1] subgroup_size = {WARP}, "
            '{iree_codegen.denormal_fp_math_f32 = #iree_codegen.denormal_fp_math<"preserve-sign">}>'
        )
        return (
            f"#iree_codegen.compilation_info<lowering_config = {config}, "
            f"translation_info = {translation}>"
        )

    def decomposition_config(self, problem: AttentionProblem, point: Point) -> str:
        """Q.K (every loop but n) and P.V (every loop but k1), warps along the query rows."""
        counts = [point["q_warps"] if role == "m" else 1 for role in problem.loops]

        def basis(left_out: str) -> str:
            loops = [i for i, role in enumerate(problem.loops) if role != left_out]
            return f"subgroup_basis = [{counts}, {loops}]"

        def attrs(promote: list[int], left_out: str) -> str:
            return (
                f"{{lowering_config = #iree_gpu.lowering_config<{{{self._mma(problem)}, "
                f"{_promote(promote)}, {basis(left_out)}}}>}}"
            )

        return f"{{pv_attrs = {attrs([1], 'k1')}, qk_attrs = {attrs([0, 1], 'n')}}}"

    def config_name(self, point: Point) -> str:
        if not self.in_spec(point):
            return flash_params(point).name
        return f"q{point['q_tile']}_kv{point['kv_tile']}_w{point['q_warps']}"

    def features(self, problem: AttentionProblem, point: Point) -> dict[str, float]:
        """Knobs (log2) and what they imply: workgroups against the SMs, shared memory."""
        workgroups = math.prod(problem.batch_sizes) * problem.size("m") // point["q_tile"]
        numeric = [k.name for k in self.knobs if not k.choices]
        return {
            **{f"log2_{k}": math.log2(max(point.get(k, 0), 1)) for k in numeric},
            "is_flash": float(not self.in_spec(point)),
            "log2_workgroups": math.log2(workgroups),
            "waves": workgroups / self.sm_count,
            "log2_shared_bytes": math.log2(shared_memory(problem, point)),
        }
