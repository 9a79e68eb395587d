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

from autosched.kernels.base import WARP
from autosched.kernels.registry import families_for, family_knobs, family_of
from autosched.ops.attention import AttentionProblem
from autosched.targets.base import Constraint, Family, KnobSpec, Point, by_role, powers_of_two
from autosched.targets.cuda import CudaTarget
from autosched.targets.cuda_rules import ELEMENT_BYTES, MMA_FOR_TYPES, MMA_M

IREE = "iree"  # the `kernel` knob: IREE's VectorDistribute, or a kernel family's (kernels/)
# IREE's knobs, the `kernel` knob that picks a kernel family (kernels/), then the families'.
ATTENTION_KNOBS = (
    KnobSpec("q_tile", "query rows per workgroup (attention)"),
    KnobSpec("kv_tile", "key rows per online-softmax step (attention)"),
    KnobSpec("q_warps", "warps along the query rows (attention)"),
    KnobSpec(
        "kernel",
        "attention: IREE's VectorDistribute (iree), or on sm_90 a Triton family that "
        "replaces the op before dispatches are formed: flash attention (flash) or, for a "
        "few query rows, flash decoding (flash_decoding)",
        choices=(IREE, *(f.selector[1] for f in families_for("attention"))),
    ),
    *family_knobs("attention"),
)


def family_own(family) -> set[str]:
    """The knobs a kernel family declares (the others' are pinned to 0 in its space)."""
    return {knob.name for knob in family.knobs}


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


class CudaAttentionTarget(CudaTarget):
    root_kind = "attention"
    knobs = ATTENTION_KNOBS

    def supports(self, problem: AttentionProblem) -> str | None:
        """The tensor-core intrinsic must exist for the types (no f32 attention here). A
        single query row (a decode step) has no configuration of IREE's: it is kept only
        where a kernel family may replace its op form (its own space at `flow` is empty,
        its default timed there, its kernels searched on the op form)."""
        if problem.single_row:
            families = self.kernel_families()
            if all(f.unavailable(self) or f.unsupported(problem) for f in families):
                return "a single query row (a decode step): no tensor-core configuration"
        kind = MMA_FOR_TYPES.get((problem.query_type, "f32"))
        types = {problem.query_type, problem.key_type, problem.value_type}
        if len(types) > 1 or kind not in self.mma_intrinsics:
            return f"attention on {sorted(types)}: no tensor-core configuration on {self.arch}"
        return None

    def dispatch_repeat(self, problem: AttentionProblem) -> int:
        """About 50 ms of work per timed call, as for matmuls (CudaTarget.dispatch_repeat)."""
        estimate_s = problem.flops / 100e12
        return int(min(200, max(1, math.ceil(0.05 / estimate_s))))

    def families(self, problem: AttentionProblem, lists) -> list[Family]:
        """IREE's pipeline, and each kernel family (kernels/; the flash family) where it can
        run: one that replaces the op before dispatches are formed has only the op form of
        an attention."""
        own = [knob.name for knob in family_knobs(self.root_kind)]
        iree = Family(
            IREE, self.constraints(problem), fixed={"kernel": [IREE], **{k: [0] for k in own}}
        )
        kernels = lists.get("kernel") or [IREE, *(f.selector[1] for f in self.kernel_families())]
        found = [
            family.space(problem, self, {k: [0] for k in own if k not in family_own(family)})
            for family in self.kernel_families()
            if family.selector[1] in kernels and family.why_not(self, problem) is None
        ]
        if not found:
            return [iree]
        return [iree, *found] if IREE in kernels else found

    def starting_points(self, problem: AttentionProblem) -> list[Point]:
        """The kernel families' (the flash family's FLASH_STARTING) where they run; IREE's
        sm_80 default for the small layer, the best of the Llama-3 layer's first batch on
        the H200 (0.63 ms against IREE's sm_90 default's 1.56 ms)."""
        families = [p for f in self.kernel_families() for p in f.starting_points(problem, self)]
        return families + [{"kernel": IREE, "q_tile": 64, "kv_tile": 64, "q_warps": 4}]

    def candidates(self, knob: str, problem: AttentionProblem) -> list[int]:
        if knob == "q_tile":  # a single row's tile, for the rule below to say why not
            return powers_of_two(MMA_M, max(MMA_M, min(problem.size("m"), 256)))
        if knob == "kv_tile":
            return powers_of_two(MMA_K, min(problem.size("k2"), MAX_KV_TILE))
        if knob == "q_warps":
            return [1, 2, 4, 8]
        if knob == "kernel":
            return [IREE, *(f.selector[1] for f in self.kernel_families())]
        raise KeyError(knob)

    def constraints(self, problem: AttentionProblem) -> list[Constraint]:
        return [
            Constraint(
                "a single query row has no configuration of IREE's (its op form is the "
                "kernel families')",
                ("q_tile",),
                lambda p, x: not p.single_row,
            ),
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
        family = family_of(point)
        if family is not None:
            return family.config_name(point)
        return f"q{point['q_tile']}_kv{point['kv_tile']}_w{point['q_warps']}"

    def features(self, problem: AttentionProblem, point: Point) -> dict[str, float]:
        """Knobs (log2) and what they imply: workgroups against the SMs (a partial block
        of rows is one; flash decoding's shares each one), shared memory."""
        blocks = math.ceil(problem.size("m") / point["q_tile"])
        workgroups = math.prod(problem.batch_sizes) * blocks * max(point.get("kv_splits", 0), 1)
        numeric = [k.name for k in self.knobs if not k.choices]
        return {
            **{f"log2_{k}": math.log2(max(point.get(k, 0), 1)) for k in numeric},
            "is_flash": float(not self.in_spec(point)),
            "log2_workgroups": math.log2(workgroups),
            "waves": workgroups / self.sm_count,
            "log2_shared_bytes": math.log2(shared_memory(problem, point)),
        }
