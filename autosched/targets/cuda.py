"""IREE's CUDA backend: TileAndFuse configurations, with tensor cores (mma) or without (SIMT).

A point picks a workgroup tile (tile_m x tile_n, tile_k reduction elements per step) and how
the workgroup's threads split it: by warps of 16x8 mma tiles (subgroup_m x subgroup_n) when
the element types have a tensor-core intrinsic, by per-thread tiles (thread_m x thread_n)
when they do not. The workgroup size follows from those, so block_dim_* are derived, not
searched. Knobs that mean nothing for a point's kind hold the sentinel 0, so the space never
holds two points that compile to the same kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autosched.config import Knob, RunConfig
from autosched.errors import UserError
from autosched.measure.contract import runtime_flags_text
from autosched.ops.matmul import MatmulProblem
from autosched.targets.base import (
    Constraint,
    Family,
    KnobSpec,
    Point,
    Target,
    powers_of_two,
    problem_candidates,
)
from autosched.targets.cuda_custom import (
    CUSTOM,
    CUSTOM_ARCHS,
    CUSTOM_KNOB_SPECS,
    CUSTOM_KNOBS,
    WARP,
    CustomKernels,
    is_custom,
)
from autosched.targets.host import Machine

NONE = "none"  # mma_kind for SIMT code (no tensor cores)
DERIVE = 0  # sentinel: a knob that is derived from the others, or unused by this point's kind
MMA_M, MMA_N = 16, 8  # every NV_MMA_SYNC intrinsic offered here is 16x8 (x16, or x32 for fp8)
FALLBACK_ARCH = "sm_80"

# Tensor-core intrinsic per (lhs/rhs element type, accumulator type).
MMA_FOR_TYPES = {
    ("f16", "f32"): "NV_MMA_SYNC_F32_16x8x16_F16",
    ("f16", "f16"): "NV_MMA_SYNC_F16_16x8x16_F16",
    ("bf16", "f32"): "NV_MMA_SYNC_F32_16x8x16_BF16",
    # fp8 (sm_89 and later): 32 reduction elements per step. At 4096^3 on an H200 IREE's
    # default ran 0.668 ms and a VectorDistribute point 0.532 ms (DESIGN.md).
    ("f8E4M3FN", "f32"): "NV_MMA_SYNC_F32_16x8x32_F8E4M3FN",
    ("f8E5M2", "f32"): "NV_MMA_SYNC_F32_16x8x32_F8E5M2",
}
MMA_KINDS = tuple(MMA_FOR_TYPES.values())


def mma_k(kind: str) -> int:
    """Reduction elements one mma step covers: 32 for the fp8 intrinsics, else 16."""
    return 32 if "_16x8x32_" in kind else 16


# A custom point is a Triton kernel run as an IREE custom dispatch (cuda_custom.py).
PIPELINES = ("TileAndFuse", "VectorDistribute", CUSTOM)

# IREE configurations measured first for problems on the mma intrinsics (pipeline, tile M, N,
# K, subgroups along M and N): the winners of the H200 suite's f16 problems across sessions,
# large to skinny (benchmarks/results/h200/suite_records_s7.jsonl). The first is also the best
# of all 1062 points of the held-out 2048x8192x1024 f16 sweep. A point the problem's space
# prunes (a 128-row tile for 16 rows) is skipped.
IREE_MMA_STARTING = (
    ("TileAndFuse", 128, 128, 64, 4, 8),
    ("VectorDistribute", 128, 128, 128, 8, 4),
    ("VectorDistribute", 64, 64, 128, 2, 4),
    ("VectorDistribute", 32, 64, 128, 1, 2),
    ("VectorDistribute", 16, 32, 128, 1, 1),
)

ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1}
SHARED_ROW_PAD = 8  # bytes IREE adds to each row of a promoted tile

# Past these, a warp's accumulators (4 f32 registers per 16x8 mma tile) or a thread's
# accumulators spill out of the 255 registers a thread may hold: slow and slow to compile.
MAX_MMA_TILES_PER_WARP = 32
MAX_THREAD_TILE = 64
# A call of 256 dispatches of a 5 us kernel (128^3 to 1024^3 f16 on the H200) is 1.3 ms, so
# the 0.3 ms each call costs adds about 1.2 us to every dispatch. At 4096 a call that IREE's
# default and the candidates both pay less of moved the f16 suite's speedups by 0.1-0.2x
# either way (geomean 2.44-2.45x, as at 256), and tripled the small problems' compile time
# (0.46 s a candidate instead of 0.3): h200_custom_f16.md, session 9.
MAX_DISPATCH_REPEAT = 256
# The knobs the derived workgroup size reads.
WORKGROUP_SIZE_KNOBS = (
    "mma_kind",
    "tile_m",
    "tile_n",
    "subgroup_m",
    "subgroup_n",
    "thread_m",
    "thread_n",
)


@dataclass(frozen=True)
class ArchInfo:
    """What iree-compile's target attribute says about one arch, plus its SM count."""

    ptx: str  # the `features` IREE uses for the arch
    shared_memory_bytes: int  # max_workgroup_memory_bytes
    sm_count: int  # of the arch's flagship part: the wave feature, a persistent kernel's workgroups
    mma: tuple[str, ...]  # NV_MMA_SYNC intrinsics in the arch's `wgp`


_MMA_ALL = MMA_KINDS
_MMA_AMPERE = MMA_KINDS[:3]  # no fp8 before sm_89
_MMA_NO_BF16 = MMA_KINDS[:2]
# From `iree-compile --compile-to=executable-configurations --iree-cuda-target=<arch>` (3.13).
# IREE 3.13 knows no sm_90; its entry is the sm_89 target with Hopper's shared memory.
ARCHS: dict[str, ArchInfo] = {
    "sm_60": ArchInfo("+ptx76", 49152, 56, ()),
    "sm_61": ArchInfo("+ptx76", 49152, 28, ()),
    "sm_70": ArchInfo("+ptx76", 98304, 80, _MMA_NO_BF16),
    "sm_75": ArchInfo("+ptx76", 65536, 68, _MMA_NO_BF16),
    "sm_80": ArchInfo("+ptx76", 166912, 108, _MMA_AMPERE),
    "sm_86": ArchInfo("+ptx76", 166912, 84, _MMA_AMPERE),
    "sm_87": ArchInfo("+ptx76", 166912, 16, _MMA_AMPERE),
    "sm_89": ArchInfo("+ptx84", 101376, 128, _MMA_ALL),
    "sm_90": ArchInfo("+ptx84", 232448, 132, _MMA_ALL),
    "sm_120": ArchInfo("+ptx87", 101376, 170, _MMA_ALL),
}
# Archs that iree-compile 3.13 cannot name with --iree-cuda-target; they get a full target
# attribute in the module instead.
ATTRIBUTE_ONLY_ARCHS = ("sm_90",)

MMA_LIST_SM89 = (
    "[<NV_MMA_SYNC_F32_16x8x16_F16>, <NV_MMA_SYNC_F16_16x8x16_F16>, "
    "<NV_MMA_SYNC_F32_16x8x16_BF16>, <NV_MMA_SYNC_F32_16x8x32_F8E4M3FN>, "
    "<NV_MMA_SYNC_F32_16x8x32_F8E5M2>, <NV_WMMA_F32_16x16x16_F16>, <NV_WMMA_F16_16x16x16_F16>]"
)


def _arch_number(arch: str) -> int:
    return int(arch.removeprefix("sm_"))


def arch_for(compute_capability: str) -> str:
    """The arch (sm_XY) for a GPU's compute capability ("9.0"): the nearest one this module
    knows (a newer GPU runs PTX built for an older arch; the driver JITs it), else sm_80."""
    try:
        major, minor = compute_capability.split(".")
        number = int(major) * 10 + int(minor)
    except ValueError:
        return FALLBACK_ARCH
    known = [a for a in ARCHS if _arch_number(a) <= number]
    return max(known, key=_arch_number) if known else FALLBACK_ARCH


def _list(values: list[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _divides(part: int, whole: int) -> bool:
    return part > 0 and whole % part == 0


def _is_mma(point: Point) -> bool:
    return point["mma_kind"] != NONE


def iree_shared_memory(problem: MatmulProblem, point: Point) -> int:
    """Bytes of shared memory IREE allocates for a point of its pipelines (0 without
    promotion; a custom point's is `cuda_custom.CustomKernels.shared_memory`).

    Measured on iree-compile 3.13 (`workgroup_local_memory` of the executable): one tile of
    A and one of B, each row padded by 8 bytes against bank conflicts. prefetch_num_stages
    does not multiply it (the prefetch goes through registers).
    """
    element = ELEMENT_BYTES[problem.lhs_type]
    if not point["promote_operands"]:
        return 0
    tm, tn, tk = point["tile_m"], point["tile_n"], point["tile_k"]
    a_rows, a_row = (tk, tm) if problem.transpose_a else (tm, tk)
    b_rows, b_row = (tn, tk) if problem.transpose_b else (tk, tn)
    pad = SHARED_ROW_PAD
    return a_rows * (a_row * element + pad) + b_rows * (b_row * element + pad)


# ---- the rules of IREE's pipelines (CudaTarget.constraints, in this order) -------------------


def _threads(target: CudaTarget, point: Point) -> int:
    return math.prod(target.workgroup_size(point))


def _kind_rules(target: CudaTarget, problem: MatmulProblem) -> list[Constraint]:
    """The pipeline and the intrinsic a point may use."""
    types = (problem.lhs_type, problem.acc_type)

    def kind_ok(p: MatmulProblem, x: Point) -> bool:
        kind = x["mma_kind"]
        return kind == NONE or (
            p.lhs_type == p.rhs_type
            and MMA_FOR_TYPES.get(types) == kind
            and kind in target.mma_intrinsics
        )

    return [
        Constraint(
            "VectorDistribute needs tensor cores (an mma_kind)",
            ("pipeline", "mma_kind"),
            lambda p, x: x["pipeline"] == "TileAndFuse" or _is_mma(x),
        ),
        Constraint("mma_kind does not fit the element types or arch", ("mma_kind",), kind_ok),
    ]


def pads(point: Point) -> bool:
    """Whether a point may leave a tile that does not divide its dimension to padding:
    TileAndFuse on tensor cores pads each operand tile up to the workgroup's (IREE's own
    default does so for a 1000-wide classifier); SIMT and VectorDistribute points cannot."""
    return point["pipeline"] == "TileAndFuse" and _is_mma(point)


def padding(problem: MatmulProblem, point: Point) -> list[int] | None:
    """The padded tile (m, n, k in elements) where a tile overhangs its dimension, else None
    (an aligned point's config stays exactly as before)."""
    tiles = [point["tile_m"], point["tile_n"], point["tile_k"]]
    dims = [problem.m, problem.n, problem.k]
    if not pads(point) or all(_divides(t, d) for t, d in zip(tiles, dims, strict=True)):
        return None
    return tiles


def _divides_rule(knob: str, dim: str) -> Constraint:
    """`knob` divides the problem's dimension `dim` (m, n or k), unless the point pads."""
    return Constraint(
        f"{knob} does not divide {dim.upper()} (only TileAndFuse on tensor cores pads)",
        (knob, "pipeline", "mma_kind"),
        lambda p, x: pads(x) or _divides(x[knob], getattr(p, dim)),
    )


def _padded_tile_candidates(dim: int, low: int, high: int, unit: int) -> list[int]:
    """A dimension's tile candidates, with the smallest power of two of at least `unit`
    that covers a dimension the tensor-core tile does not divide (2 rows take a 16-row
    tile, padded)."""
    values = set(problem_candidates(dim, low, high))
    if dim % unit:
        cover = max(unit, 2 ** math.ceil(math.log2(dim)))
        values.update(powers_of_two(unit, min(cover, high)))
    if not values and dim <= high:  # 24 columns (mobilenet's squeeze-excite FCs): one tile
        values.add(dim)
    return sorted(values)


def _mma_tile_fits(p: MatmulProblem, x: Point) -> bool:
    return not _is_mma(x) or (
        x["tile_m"] % MMA_M == 0
        and x["tile_n"] % MMA_N == 0
        and x["tile_k"] % mma_k(x["mma_kind"]) == 0
    )


def _tile_rules() -> list[Constraint]:
    """The workgroup tile divides the problem, and the mma tile divides the workgroup's."""
    return [
        _divides_rule("tile_m", "m"),
        _divides_rule("tile_n", "n"),
        _divides_rule("tile_k", "k"),
        Constraint(
            "mma tile does not divide the workgroup tile",
            ("mma_kind", "tile_m", "tile_n", "tile_k"),
            _mma_tile_fits,
        ),
    ]


def _sentinel_rule(knob: str, used_by_mma: bool) -> Constraint:
    """A knob of one kind of point (tensor-core or SIMT) is 0 on the other kind."""
    kind = "tensor-core" if used_by_mma else "SIMT"
    return Constraint(
        f"{knob} is only for {kind} points (0 otherwise)",
        ("mma_kind", knob),
        lambda p, x: (x[knob] > 0) == (_is_mma(x) == used_by_mma),
    )


def _warp_tile_fits(p: MatmulProblem, x: Point) -> bool:
    return not _is_mma(x) or (
        x["tile_m"] % (MMA_M * x["subgroup_m"]) == 0
        and x["tile_n"] % (MMA_N * x["subgroup_n"]) == 0
    )


def _warp_rules() -> list[Constraint]:
    """Tensor-core points: how warps of mma tiles split the workgroup tile."""
    return [
        _sentinel_rule("subgroup_m", True),
        _sentinel_rule("subgroup_n", True),
        Constraint(
            "warp tile does not divide the workgroup tile",
            ("mma_kind", "tile_m", "tile_n", "subgroup_m", "subgroup_n"),
            _warp_tile_fits,
        ),
        Constraint(
            f"warp tile over {MAX_MMA_TILES_PER_WARP} mma tiles (register spills)",
            ("mma_kind", "subgroup_m", "subgroup_n"),
            lambda p, x: (
                not _is_mma(x) or x["subgroup_m"] * x["subgroup_n"] <= MAX_MMA_TILES_PER_WARP
            ),
        ),
    ]


def _thread_rules() -> list[Constraint]:
    """SIMT points: how per-thread tiles split the workgroup tile."""
    return [
        _sentinel_rule("thread_m", False),
        _sentinel_rule("thread_n", False),
        Constraint(
            "thread tile does not divide the workgroup tile",
            ("mma_kind", "tile_m", "tile_n", "thread_m", "thread_n"),
            lambda p, x: (
                _is_mma(x)
                or (x["tile_m"] % x["thread_m"] == 0 and x["tile_n"] % x["thread_n"] == 0)
            ),
        ),
        Constraint(
            f"thread tile over {MAX_THREAD_TILE} elements (register spills)",
            ("mma_kind", "thread_m", "thread_n"),
            lambda p, x: _is_mma(x) or x["thread_m"] * x["thread_n"] <= MAX_THREAD_TILE,
        ),
    ]


def _block_dim_rule(target: CudaTarget, axis: int, knob: str) -> Constraint:
    """block_dim_* is 0 (derive) or the derived workgroup size along its axis."""
    return Constraint(
        f"{knob} differs from the derived workgroup size",
        (*WORKGROUP_SIZE_KNOBS, knob),
        lambda p, x: x[knob] in (DERIVE, target.workgroup_size(x)[axis]),
    )


def _workgroup_rules(target: CudaTarget) -> list[Constraint]:
    """The derived workgroup size: within the GPU's limits, and what block_dim_* say."""
    return [
        Constraint(
            f"over {target.max_threads} threads per workgroup",
            WORKGROUP_SIZE_KNOBS,
            lambda p, x: _threads(target, x) <= target.max_threads,
        ),
        Constraint(
            "fewer than 32 threads per workgroup",
            WORKGROUP_SIZE_KNOBS,
            lambda p, x: _threads(target, x) >= WARP,
        ),
        _block_dim_rule(target, 0, "block_dim_x"),
        _block_dim_rule(target, 1, "block_dim_y"),
        Constraint(
            "block_dim_z must be 1 (or 0 to derive)",
            ("block_dim_z",),
            lambda p, x: x["block_dim_z"] in (DERIVE, 1),
        ),
    ]


def _memory_rules(target: CudaTarget) -> list[Constraint]:
    """Operand promotion, and the shared memory it takes within the arch's limit."""
    return [
        Constraint(
            "promote_operands is 0 or 1",
            ("promote_operands",),
            lambda p, x: x["promote_operands"] in (0, 1),
        ),
        Constraint(
            f"shared memory over the {target.arch} limit",
            ("tile_m", "tile_n", "tile_k", "promote_operands"),
            lambda p, x: iree_shared_memory(p, x) <= target.shared_memory_bytes,
        ),
    ]


class CudaTarget(Target):
    name = "cuda"
    default_device = "cuda"
    default_dispatch_repeat = 20
    timing_overlaps_compile = True  # the GPU times one candidate while the CPUs compile others
    default_timer = "worker"  # within 1.4 % of the tool on six H200 problems (h200_worker_timer.md)
    # iree-compile 3.13 ignores --iree-codegen-tuning-spec-path for CUDA (checked with
    # --compile-to=executable-configurations); the transform library applies the same file.
    tuning_spec_flag = "--iree-codegen-transform-dialect-library"
    # As IREE forms them, they take plain thread tiles only (resnet50's: 0.7-1.9 ms each,
    # tuned, on the H200); as pointwise convolutions over a slice, the tensor cores.
    slices_strided_convolutions = True
    kind_targets = {
        "attention": ("autosched.targets.cuda_attention", "CudaAttentionTarget"),
        "convolution": ("autosched.targets.cuda_convolution", "CudaConvolutionTarget"),
    }
    knobs = (
        KnobSpec("pipeline", "IREE codegen pipeline", choices=PIPELINES),
        KnobSpec(
            "mma_kind",
            "tensor-core intrinsic, or none for plain (SIMT) code; must fit the element types",
            choices=(NONE, *MMA_KINDS),
        ),
        KnobSpec("tile_m", "rows of C per workgroup"),
        KnobSpec("tile_n", "columns of C per workgroup"),
        KnobSpec("tile_k", "reduction elements per step (a multiple of 16 with tensor cores)"),
        KnobSpec(
            "subgroup_m", "16x8 mma tiles per warp along M (tensor cores; 0 otherwise)", minimum=0
        ),
        KnobSpec(
            "subgroup_n", "16x8 mma tiles per warp along N (tensor cores; 0 otherwise)", minimum=0
        ),
        KnobSpec("thread_m", "rows of C per thread (SIMT; 0 with tensor cores)", minimum=0),
        KnobSpec("thread_n", "columns of C per thread (SIMT; 0 with tensor cores)", minimum=0),
        KnobSpec("block_dim_x", "workgroup size x; derived from the tiles, 0 = derive", minimum=0),
        KnobSpec("block_dim_y", "workgroup size y; derived from the tiles, 0 = derive", minimum=0),
        KnobSpec("block_dim_z", "workgroup size z; always 1, 0 = derive", minimum=0),
        KnobSpec(
            "pipeline_depth",
            "prefetch_num_stages; 0 = leave it out (IREE 3.13 CUDA emits the same PTX for all)",
            minimum=0,
        ),
        KnobSpec(
            "promote_operands", "1: stage A and B tiles in shared memory, 0: do not", minimum=0
        ),
        *CUSTOM_KNOB_SPECS,  # the custom family's own (cuda_custom.py)
    )

    def __init__(self, config: RunConfig, machine: Machine | None = None):
        super().__init__(config, machine)
        if config.arch:
            if config.arch not in ARCHS:
                raise UserError(
                    f"{config.source}: [Env] arch = {config.arch}: unknown CUDA arch "
                    f"(known: {', '.join(ARCHS)})"
                )
            self.arch = config.arch
        elif self.machine.gpus:
            self.arch = arch_for(self.machine.gpus[0].compute_capability)
        else:
            self.arch = FALLBACK_ARCH
        info = ARCHS[self.arch]
        self.ptxas = self.machine.ptxas
        # Limits the constraints and features read.
        self.max_threads = 1024
        self.shared_memory_bytes = info.shared_memory_bytes
        self.sm_count = info.sm_count
        self.mma_intrinsics = info.mma
        self.custom = CustomKernels(
            self.arch, self.machine.triton, self.shared_memory_bytes, ELEMENT_BYTES, info.sm_count
        )

    def describe(self) -> str:
        assembled = f", kernels assembled by {self.ptxas}" if self.ptxas else ""
        custom = ""
        if self.arch in CUSTOM_ARCHS and self.machine.triton:
            listed = self.config.knob_space.get("pipeline")
            custom = (
                ", custom Triton matmul kernels searched too (a cfg's `pipeline` list without "
                "Custom leaves them out)"
                if listed is None or CUSTOM in listed
                else ", custom matmul kernels left out by the cfg's `pipeline` list"
            )
            kernels = self.config.knob_space.get("kernel")
            custom += (
                ", flash-attention kernels too (`kernel = [iree]` leaves them out)"
                if kernels is None or "flash" in kernels
                else ", flash-attention kernels left out by the cfg's `kernel` list"
            )
        flags = runtime_flags_text(self.config)
        timed = f"; runtime flags: {flags}" if flags else ""
        if self.config.runtime_flags.strip() == "auto":
            timed += " (the whole-model proof also tries IREE's defaults and keeps the faster)"
        return f"{self.name} {self.arch} (device {self.device}{assembled}){custom}{timed}"

    def check_device(self) -> None:
        if not self.machine.gpus:
            raise UserError(
                "--target cuda times and checks candidates on an NVIDIA GPU, and nvidia-smi "
                "finds none here (--dry-run writes the variants without one)"
            )

    def dispatch_repeat(self, problem: MatmulProblem) -> int:
        """Dispatches per timed call: about 50 ms of work at an optimistic rate.

        Each call costs about 0.3 ms of allocation and submission (DESIGN.md). On an H200,
        15 dispatches of a 0.6 ms kernel still carried 0.02 ms of it each (3 %), enough to
        shift a speedup; at 50 ms of work per call it is under 1 %.
        """
        rate = 20e12 if problem.lhs_type == "f32" else 100e12  # FLOP/s, above IREE's best
        estimate_s = problem.flops / rate
        return int(min(MAX_DISPATCH_REPEAT, max(1, math.ceil(0.05 / estimate_s))))

    # ---- the space ----------------------------------------------------------------------

    def supports(self, problem: MatmulProblem) -> str | None:
        """fp8 needs the arch's fp8 intrinsics: IREE 3.13 cannot lower fp8 SIMT code; f64
        has no knobs here (tuned on the CPU only)."""
        if "f64" in (problem.lhs_type, problem.rhs_type, problem.acc_type):
            return "f64 contractions are tuned on the CPU only"
        kind = MMA_FOR_TYPES.get((problem.lhs_type, problem.acc_type), "")
        if ELEMENT_BYTES.get(problem.lhs_type) == 1 and kind not in self.mma_intrinsics:
            return f"{problem.lhs_type} needs sm_89 or later (this is {self.arch})"
        return None

    def default_mma_kind(self, problem: MatmulProblem) -> str:
        """The intrinsic for the problem's types when the arch has it, whatever the shape."""
        kind = MMA_FOR_TYPES.get((problem.lhs_type, problem.acc_type))
        # A shape the intrinsic does not divide still takes it: TileAndFuse pads (`pads`).
        if problem.lhs_type != problem.rhs_type or kind not in self.mma_intrinsics:
            return NONE
        return kind

    def candidates(self, knob: str, problem: MatmulProblem) -> list[Knob]:
        # mma_kind values this problem's space will hold: the user's list, else the default.
        default = self.default_mma_kind(problem)
        kinds = self.config.knob_space.get("mma_kind", [default])
        simt = NONE in kinds
        mma = any(k != NONE for k in kinds)
        if knob == "pipeline":
            # VectorDistribute compiled, verified and won at 4096^3 f16 on an H200 (0.75 ms
            # against 0.77 ms for the best TileAndFuse point of the same run); it needs mma.
            # The custom family, where it can run, is the fastest route (0.86-0.95 of cuBLAS
            # at 4096^3 and 4096x11008 against IREE's 0.25): searched unless a cfg's
            # `pipeline` list leaves it out.
            iree = ["TileAndFuse", "VectorDistribute"] if mma else ["TileAndFuse"]
            return iree + ([CUSTOM] if self.custom.unavailable(problem) is None else [])
        if knob == "mma_kind":
            return [default]
        # Tiles under 32 only where the dimension itself is that small; with tensor cores,
        # one that covers a dimension the intrinsic does not divide.
        step = mma_k(default) if mma else 1
        if knob == "tile_m":
            return _padded_tile_candidates(problem.m, min(32, problem.m), 256, MMA_M if mma else 1)
        if knob == "tile_n":
            return _padded_tile_candidates(problem.n, min(32, problem.n), 256, MMA_N if mma else 1)
        if knob == "tile_k":
            return _padded_tile_candidates(problem.k, 8 if simt else 16, 128 if mma else 64, step)
        if knob in ("subgroup_m", "subgroup_n"):
            return ([DERIVE] if simt else []) + (powers_of_two_up_to(8) if mma else [])
        if knob in ("thread_m", "thread_n"):
            return ([DERIVE] if mma else []) + (powers_of_two_up_to(16) if simt else [])
        if knob in ("block_dim_x", "block_dim_y", "block_dim_z"):
            return [DERIVE]
        if knob == "pipeline_depth":
            # iree-compile 3.13 emits byte-identical PTX for stages 0..5 (TileAndFuse and
            # VectorDistribute, mma and SIMT): searching it would only time duplicates.
            return [DERIVE]
        if knob == "promote_operands":
            # Unpromoted operands were 9x slower at 4096^3 f32 on the H200: opt-in only.
            return [1]
        if knob in CUSTOM_KNOBS:
            return [DERIVE]
        raise KeyError(knob)

    def families(self, problem: MatmulProblem, lists: dict[str, list[Knob]]) -> list[Family]:
        """IREE's pipelines, and (when `pipeline` lists Custom) the custom kernel family."""
        pipelines = lists.get("pipeline") or self.candidates("pipeline", problem)
        iree = Family(
            "iree",
            self.constraints(problem),
            fixed={
                "pipeline": [p for p in pipelines if p != CUSTOM],
                **{knob: [DERIVE] for knob in CUSTOM_KNOBS},
            },
        )
        if CUSTOM not in pipelines or self.custom.unavailable(problem):
            return [iree]
        neutral = ("subgroup_m", "subgroup_n", "thread_m", "thread_n")
        neutral += ("block_dim_x", "block_dim_y", "block_dim_z")
        pinned = {"mma_kind": [NONE], "promote_operands": [1], **{k: [DERIVE] for k in neutral}}
        return [iree, self.custom.family(problem, pinned)]

    def starting_points(self, problem: MatmulProblem) -> list[Point]:
        """The custom family's known-good points (cuda_custom.CUSTOM_STARTING, and
        SKINNY_STARTING for few rows), then IREE's on the mma intrinsics
        (IREE_MMA_STARTING), where the problem's space has them."""
        knobs = ("pipeline", "tile_m", "tile_n", "tile_k", "subgroup_m", "subgroup_n")
        iree = [dict(zip(knobs, values, strict=True)) for values in IREE_MMA_STARTING]
        return self.custom.starting_points(problem) + iree

    def workgroup_size(self, point: Point) -> list[int]:
        """The workgroup_size IREE needs for a point's tiles."""
        if is_custom(point):
            return self.custom.workgroup_size(point)
        if _is_mma(point):
            warps = (point["tile_m"] // (MMA_M * point["subgroup_m"])) * (
                point["tile_n"] // (MMA_N * point["subgroup_n"])
            )
            return [warps * WARP, 1, 1]
        return [point["tile_n"] // point["thread_n"], point["tile_m"] // point["thread_m"], 1]

    def constraints(self, problem: MatmulProblem) -> list[Constraint]:
        """The rules of IREE's pipelines, in this order (a point is rejected for the first
        rule it fails); the custom family's are its own (cuda_custom.CustomKernels)."""
        return [
            *_kind_rules(self, problem),
            *_tile_rules(),
            *_warp_rules(),
            *_thread_rules(),
            *_workgroup_rules(self),
            *_memory_rules(self),
        ]

    # ---- attribute text -----------------------------------------------------------------

    def lowering_config(self, problem: MatmulProblem, point: Point) -> str:
        lead = [1] if problem.batch else []  # the batch loop: one batch per workgroup
        zeros = [0] * len(lead)
        entries: list[str] = []  # keys in alphabetical order, as IREE prints them
        vector_distribute = point["pipeline"] == "VectorDistribute"
        if _is_mma(point):
            if not vector_distribute or not problem.zero_init:
                # IREE sets convert_acc_gemm on every TileAndFuse mma matmul; an accumulating
                # matmul needs it.
                entries.append("convert_acc_gemm")
            entries.append(f"mma_kind = #iree_gpu.mma_layout<{point['mma_kind']}>")
        padded = padding(problem, point)
        if padded:
            entries.append(f"padding = {_list([*zeros, *padded])}")
        if point["promote_operands"]:
            entries.append("promote_operands = [0, 1]")
        if vector_distribute:
            # Reduction in elements; warps given as a count per dim (m, n, k) and their order.
            warps_m = point["tile_m"] // (MMA_M * point["subgroup_m"])
            warps_n = point["tile_n"] // (MMA_N * point["subgroup_n"])
            entries.append(f"reduction = {_list([*zeros, 0, 0, point['tile_k']])}")
            counts = _list([*lead, warps_m, warps_n, 1])
            order = _list(list(range(len(lead) + 3)))
            entries.append(f"subgroup_basis = [{counts}, {order}]")
        elif _is_mma(point):
            # Reduction in mma K steps; subgroup = 16x8 mma tiles per warp.
            steps = point["tile_k"] // mma_k(point["mma_kind"])
            entries.append(f"reduction = {_list([*zeros, 0, 0, steps])}")
            entries.append(
                f"subgroup = {_list([*zeros, point['subgroup_m'], point['subgroup_n'], 0])}"
            )
        else:
            entries.append(f"reduction = {_list([*zeros, 0, 0, point['tile_k']])}")
            entries.append(f"thread = {_list([*zeros, point['thread_m'], point['thread_n'], 0])}")
        entries.append(f"workgroup = {_list([*lead, point['tile_m'], point['tile_n'], 0])}")
        config = "#iree_gpu.lowering_config<{" + ", ".join(entries) + "}>"
        options = ""
        if point["pipeline_depth"] != DERIVE:
            options = (
                ", {gpu_pipeline_options = #iree_gpu.pipeline_options<"
                f"prefetch_num_stages = {point['pipeline_depth']}>}}"
            )
        translation = (
            f"#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<{point['pipeline']}> "
            f"workgroup_size = {_list(self.workgroup_size(point))} subgroup_size = {WARP}"
            f"{options}>"
        )
        return (
            f"#iree_codegen.compilation_info<lowering_config = {config}, "
            f"translation_info = {translation}>"
        )

    def in_spec(self, point: Point) -> bool:
        return not is_custom(point)

    def source_command(self, problem: MatmulProblem, point: Point, source: str) -> list[str]:
        """Custom kernels: Triton compiles the point to PTX and writes its extern module."""
        return self.custom.source_command(problem, point, source) if is_custom(point) else []

    def compile_flags(self) -> list[str]:
        flags = ["--iree-hal-target-device=cuda"]
        if self.arch not in ATTRIBUTE_ONLY_ARCHS:  # else the target comes from the module
            flags.append(f"--iree-cuda-target={self.arch}")
        if self.ptxas:
            flags += ["--iree-cuda-use-ptxas", f"--iree-cuda-use-ptxas-from={self.ptxas}"]
        return flags + list(self.input_flags)

    def module_attributes(self) -> dict[str, str]:
        """For an arch iree-compile cannot name, the full device target, built like sm_89's."""
        if self.arch not in ATTRIBUTE_ONLY_ARCHS:
            return {}
        device = f'[#hal.device.target<"cuda", [{self.executable_target()}]> : !hal.device]'
        return {"hal.device.targets": device}

    def executable_target(self) -> str:
        """The arch's `#hal.executable.target` attribute, written out in full (what a
        module names when no flag can, and what a custom dispatch's objects are keyed by)."""
        info = ARCHS[self.arch]
        wgp = (
            "compute = fp64|fp32|fp16|int64|int32|int16|int8, storage = b64|b32|b16|b8, "
            "subgroup = shuffle|arithmetic, dot = dp4xi8toi32, "
            f"mma = {MMA_LIST_SM89}, subgroup_size_choices = [32], "
            "max_workgroup_sizes = [1024, 1024, 1024], "
            f"max_thread_count_per_workgroup = {self.max_threads}, "
            f"max_workgroup_memory_bytes = {info.shared_memory_bytes}, "
            "max_workgroup_counts = [2147483647, 65535, 65535]"
        )
        target = (
            f'#iree_gpu.target<arch = "{self.arch}", features = "{info.ptx}", wgp = <{wgp}>, '
            f"chip = <wgp_count = {info.sm_count}>>"
        )
        return (
            f'#hal.executable.target<"cuda", "cuda-nvptx-fb", '
            f"{{iree_codegen.target_info = {target}}}>"
        )

    # ---- names and features -------------------------------------------------------------

    def config_name(self, point: Point) -> str:
        if is_custom(point):
            return self.custom.config_name(point)
        tiles = f"wg{point['tile_m']}x{point['tile_n']}x{point['tile_k']}"
        prefix = {"TileAndFuse": "tf", "VectorDistribute": "vd"}[point["pipeline"]]
        if _is_mma(point):
            shape = "_16x8x32_" if mma_k(point["mma_kind"]) == 32 else "_16x8x16_"
            kind = point["mma_kind"].removeprefix("NV_MMA_SYNC_").split(shape)
            inner = f"sg{point['subgroup_m']}x{point['subgroup_n']}_{kind[0]}{kind[1]}".lower()
        else:
            inner = f"th{point['thread_m']}x{point['thread_n']}_simt"
        return f"{prefix}_{tiles}_{inner}_s{point['pipeline_depth']}_p{point['promote_operands']}"

    def features(self, problem: MatmulProblem, point: Point) -> dict[str, float]:
        tm, tn, tk = point["tile_m"], point["tile_n"], point["tile_k"]
        threads = math.prod(self.workgroup_size(point))
        # Ceiling: a custom kernel's block may overhang M or N (its loads are masked).
        split = max(point.get("split_k", 1), 1)
        workgroups = math.ceil(problem.m / tm) * math.ceil(problem.n / tn) * max(problem.batch, 1)
        workgroups *= split
        waves = workgroups / self.sm_count
        custom = is_custom(point)
        shared = (self.custom.shared_memory if custom else iree_shared_memory)(problem, point)
        element = ELEMENT_BYTES[problem.lhs_type]
        per_thread = tm * tn / threads  # accumulator elements each thread holds
        numeric = [k.name for k in self.knobs if not k.choices]
        return {
            **{f"log2_{k}": math.log2(max(int(point[k]), 1)) for k in numeric},
            "is_mma": float(_is_mma(point)),
            "is_custom": float(custom),
            # log2 of the knob cannot tell 0 from 1: a loader warp feeding the MMA warps
            "is_specialized": float(point.get("specialized", 0) > 0),
            "vector_distribute": float(point["pipeline"] == "VectorDistribute"),
            "log2_threads": math.log2(threads),
            "warps": threads / WARP,
            "shared_memory_kib": shared / 1024,
            "shared_memory_fraction": shared / self.shared_memory_bytes,
            "log2_workgroups": math.log2(workgroups),
            "waves": waves,
            # Fraction of the SMs busy in the last wave: a half-empty last wave wastes time.
            "wave_efficiency": waves / math.ceil(waves),
            "k_steps": problem.k / tk / split,
            "tile_intensity": tm * tn / (tm + tn),  # flops per byte loaded, up to a constant
            "tile_bytes_per_step": (tm + tn) * tk * element,
            "accumulators_per_thread": per_thread,
            "aspect": math.log2(tm / tn),
            # Work spent on a padded or masked overhang of M and N (1: none).
            "overhang": math.ceil(problem.m / tm)
            * tm
            * math.ceil(problem.n / tn)
            * tn
            / (problem.m * problem.n),
        }


def powers_of_two_up_to(high: int) -> list[int]:
    return [2**i for i in range(int(math.log2(high)) + 1)]
