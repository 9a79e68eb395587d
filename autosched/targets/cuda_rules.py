"""The rules of IREE's CUDA pipelines for a matmul point (TileAndFuse and VectorDistribute,
on the mma.sync tensor cores or SIMT), and the facts they read: the intrinsics per element
types, the sentinels, the shared memory IREE allocates. `CudaTarget.constraints` applies
them in this order (a point is rejected for the first rule it fails); the custom kernel
families' rules are their own (kernels/)."""

from __future__ import annotations

import math

from autosched.kernels.base import WARP
from autosched.ops.matmul import MatmulProblem
from autosched.targets.base import Constraint, Point, powers_of_two, problem_candidates

NONE = "none"  # mma_kind for SIMT code (no tensor cores)
DERIVE = 0  # sentinel: a knob that is derived from the others, or unused by this point's kind
MMA_M, MMA_N = 16, 8  # every NV_MMA_SYNC intrinsic offered here is 16x8 (x16, or x32 for fp8)

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


ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1}
SHARED_ROW_PAD = 8  # bytes IREE adds to each row of a promoted tile

# Past these, a warp's accumulators (4 f32 registers per 16x8 mma tile) or a thread's
# accumulators spill out of the 255 registers a thread may hold: slow and slow to compile.
MAX_MMA_TILES_PER_WARP = 32
MAX_THREAD_TILE = 64
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


def _divides(part: int, whole: int) -> bool:
    return part > 0 and whole % part == 0


def is_mma(point: Point) -> bool:
    return point["mma_kind"] != NONE


def iree_shared_memory(problem: MatmulProblem, point: Point) -> int:
    """Bytes of shared memory IREE allocates for a point of its pipelines (0 without
    promotion; a custom point's is its kernel family's `shared_memory`).

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


def _threads(target, point: Point) -> int:
    return math.prod(target.workgroup_size(point))


def _kind_rules(target, problem: MatmulProblem) -> list[Constraint]:
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
            lambda p, x: x["pipeline"] == "TileAndFuse" or is_mma(x),
        ),
        Constraint("mma_kind does not fit the element types or arch", ("mma_kind",), kind_ok),
    ]


def pads(point: Point) -> bool:
    """Whether a point may leave a tile that does not divide its dimension to padding:
    TileAndFuse on tensor cores pads each operand tile up to the workgroup's (IREE's own
    default does so for a 1000-wide classifier); SIMT and VectorDistribute points cannot."""
    return point["pipeline"] == "TileAndFuse" and is_mma(point)


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


def padded_tile_candidates(dim: int, low: int, high: int, unit: int) -> list[int]:
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
    return not is_mma(x) or (
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
        lambda p, x: (x[knob] > 0) == (is_mma(x) == used_by_mma),
    )


def _warp_tile_fits(p: MatmulProblem, x: Point) -> bool:
    return not is_mma(x) or (
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
                not is_mma(x) or x["subgroup_m"] * x["subgroup_n"] <= MAX_MMA_TILES_PER_WARP
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
                is_mma(x) or (x["tile_m"] % x["thread_m"] == 0 and x["tile_n"] % x["thread_n"] == 0)
            ),
        ),
        Constraint(
            f"thread tile over {MAX_THREAD_TILE} elements (register spills)",
            ("mma_kind", "thread_m", "thread_n"),
            lambda p, x: is_mma(x) or x["thread_m"] * x["thread_n"] <= MAX_THREAD_TILE,
        ),
    ]


def _block_dim_rule(target, axis: int, knob: str) -> Constraint:
    """block_dim_* is 0 (derive) or the derived workgroup size along its axis."""
    return Constraint(
        f"{knob} differs from the derived workgroup size",
        (*WORKGROUP_SIZE_KNOBS, knob),
        lambda p, x: x[knob] in (DERIVE, target.workgroup_size(x)[axis]),
    )


def _workgroup_rules(target) -> list[Constraint]:
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


def _memory_rules(target) -> list[Constraint]:
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


def iree_rules(target, problem: MatmulProblem) -> list[Constraint]:
    """Every rule of IREE's pipelines, in the order they are best applied."""
    return [
        *_kind_rules(target, problem),
        *_tile_rules(),
        *_warp_rules(),
        *_thread_rules(),
        *_workgroup_rules(target),
        *_memory_rules(target),
    ]
