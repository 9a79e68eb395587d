"""The matmul family's part of the CUDA target's space (`pipeline = Custom`): its knobs,
candidates and rules for a problem, its known-good points, and what a point of it needs
(workgroup, shared memory, name). IREE's knobs are the target's; the family pins them.
"""

from __future__ import annotations

from autosched.kernels.base import WARP
from autosched.kernels.matmul_gluon.source import LOADER_THREADS
from autosched.kernels.matmul_triton.kernel import persistent_unsupported, split_unsupported
from autosched.kernels.triton import ELEMENT_BYTES
from autosched.ops.matmul import MatmulProblem
from autosched.targets.base import Constraint, Family, KnobSpec, Point

CUSTOM = "Custom"  # the `pipeline` of a custom-kernel point
SKINNY_ROWS = 64  # a problem with at most this many rows of C gets the skinny custom blocks
SUMMED_ROWS = 4  # ... and with at most this many, blocks of its rows on the CUDA cores too
# A block under 16 rows holds its products (rows x columns x K) in registers: at most this
# many f32 a thread.
SUMMED_PER_THREAD = 64
# The family's own knobs, last in the CUDA target's (0 for IREE's pipelines).
CUSTOM_KNOB_SPECS = (
    KnobSpec("warps", "custom kernels: warps per workgroup (0 for IREE's pipelines)", minimum=0),
    KnobSpec(
        "group_m",
        "custom kernels: rows of blocks launched together, for L2 reuse (0 for IREE's)",
        minimum=0,
    ),
    KnobSpec(
        "split_k",
        "custom kernels: workgroups that share a block's K, adding up in turn (0 for IREE's)",
        minimum=0,
    ),
    KnobSpec(
        "persistent",
        "custom kernels: workgroups that take the output blocks in turn, loading by TMA "
        "(0: one workgroup per block)",
        minimum=0,
    ),
    KnobSpec(
        "specialized",
        "custom kernels: 1 for the persistent kernel warp-specialized, a loader warp feeding "
        "the MMA warps (Gluon)",
        minimum=0,
    ),
)
CUSTOM_KNOBS = tuple(knob.name for knob in CUSTOM_KNOB_SPECS)
# Custom kernels measured first: the fp16 configurations Triton's matmul tutorial autotunes
# over on NVIDIA GPUs (block M, N, K, warps, stages; launch group 8) that fit the family,
# plus the probe's 128x128x64. At 4096^3 f16 on the H200, xgboost alone needed a median of
# 31 trials to come within 5 % of the best of the family's 168 points (random: 17).
CUSTOM_STARTING = (
    # Warp-specialized (a loader warp feeding the MMA warps; persistent, loading by TMA):
    # at 128x256x64 in 3 stages it ran the Llama-3-8B layer's MLP matmuls at cuBLAS's
    # speed on the H200, 12-18 % faster than the plain 128x256x64 below (session 27).
    (128, 256, 64, 8, 3, "specialized"),
    (128, 128, 64, 4, 4, "specialized"),
    (128, 256, 64, 8, 3),
    # Persistent (one workgroup per SM), loading by TMA, where TMA can read the operands:
    # the largest blocks whose stages and epilogue fit an f32 C in shared memory.
    (256, 128, 64, 8, 3, "persistent"),
    (128, 128, 64, 4, 4, "persistent"),
    (256, 128, 64, 8, 3),
    (128, 128, 64, 4, 3),
    (64, 256, 32, 4, 4),
    (128, 128, 32, 4, 4),
    (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4),
    # The best at 1024^3 and at 512^3 f16 on the H200 (7.7 and 5.1-5.4 us; session 9's
    # sweeps, h200/custom_split_k_sweeps.jsonl): mid-size problems' blocks.
    (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
)

# Custom kernels measured first for skinny problems (M up to SKINNY_ROWS), after those above
# (block M, N, K, warps, stages, split_k): the best at 16x4096x4096 f16 on the H200, where the
# 64x64 block took 13.7 us and IREE's default 33.6; in 2 shares of K 10.9-11.6 us, whole
# 11.9-12.3 (h200/custom_sweep_16x4096x4096_f16.jsonl, h200/custom_split_k_sweeps.jsonl).
SKINNY_STARTING = (
    (16, 64, 128, 4, 3, 2),
    (64, 64, 128, 4, 4, 2),
    (64, 32, 128, 4, 4, 1),
    (16, 32, 64, 4, 4, 1),
)


def summed_rows(problem: MatmulProblem) -> int:
    """The rows of a block summed on the CUDA cores (`multiply_add`): M rounded up to a
    power of two, for at most SUMMED_ROWS rows; 0 for more."""
    return 1 << (problem.m - 1).bit_length() if problem.m <= SUMMED_ROWS else 0


# ... and for a decode step's few rows (`summed_rows`), blocks of just those rows summed on
# the CUDA cores (block N, K, warps, stages, split_k; block M the rows): more workgroups
# (narrow blocks, K in shares) each reading more of B a step of its loop (256 of K).
SUMMED_STARTING = (
    (32, 256, 8, 3, 2),
    (64, 128, 4, 3, 1),
    (16, 256, 4, 3, 4),
    (64, 256, 8, 3, 1),
)


def custom_blocks(problem: MatmulProblem) -> dict[str, list[int]]:
    """Block M, N and K of the custom family: 64-256, and for skinny problems (M up to
    SKINNY_ROWS) 16-64 rows and 32-256 columns. Why: at 16x4096x4096 f16 the
    64x64 block gave 64 workgroups for the H200's 132 SMs and 0.7 of cuBLAS; the product
    is bound by reading B, so more, narrower blocks keep more SMs reading. A decode step's
    few rows (`summed_rows`) also get a block of just their rows, summed on the CUDA
    cores, 16 columns and 256 of K: a workgroup reads more of B per step of its loop."""
    if problem.m > SKINNY_ROWS:
        return {"tile_m": [64, 128, 256], "tile_n": [64, 128, 256], "tile_k": [32, 64, 128]}
    rows = summed_rows(problem)
    if not rows:
        return {"tile_m": [16, 32, 64], "tile_n": [32, 64, 128, 256], "tile_k": [32, 64, 128]}
    return {
        "tile_m": [rows, 16, 32, 64],
        "tile_n": [16, 32, 64, 128, 256],
        "tile_k": [32, 64, 128, 256],
    }


def split_k_candidates(problem: MatmulProblem) -> list[int]:
    """Shares of K for the custom family: 1, and 2-8 for a skinny problem (its shares add
    up in C where C is f32, else in an f32 workspace).
    On the H200 two shares took 16x4096x4096 f16 from 11.9 to 10.9 us; at 512^3 and 1024^3
    every split was slower (7.2 and 12.9 us against 5.1 and 7.7): passing a block's lock on
    costs about 2 us, more than a short run of K saves (h200_custom_skinny_split.md)."""
    return [1, 2, 4, 8] if problem.m <= SKINNY_ROWS else [1]


def persistent_candidates(problem: MatmulProblem, sm_count: int) -> list[int]:
    """0 (a workgroup per block), and one workgroup per SM where TMA can load the
    operands. Triton's persistent matmul with tensor descriptors ran 13 % faster than its
    plain persistent one in f16 on an H100 (triton-lang/triton#5461)."""
    if not sm_count or persistent_unsupported(problem, 1):
        return [0]
    return [0, sm_count]


def specialized_fits(point: Point) -> bool:
    """Whether a warp-specialized point's block fits its kernel: persistent, each warp 16
    rows of the block (wgmma's rows; a warpgroup's 64 repeat down the block), at most 256
    columns (wgmma's widest), and an f32 accumulator of at most 128 registers a thread (at
    128x256 with 8 warps, the kernel's widest, the MMA warps take 240 registers)."""
    rows, columns, warps = point["tile_m"], point["tile_n"], point["warps"]
    return (
        point["persistent"] > 0
        and rows % (16 * warps) == 0
        and columns <= 256
        and rows * columns <= 128 * warps * WARP
    )


def summed_fits(point: Point) -> bool:
    """Whether a block under 16 rows (`multiply_add` on the CUDA cores) fits: the plain
    kernel, its products at most SUMMED_PER_THREAD f32 registers a thread."""
    products = point["tile_m"] * point["tile_n"] * point["tile_k"]
    return not point["persistent"] and products <= SUMMED_PER_THREAD * point["warps"] * WARP


def _power_of_two(knob: str, low: int) -> Constraint:
    return Constraint(
        f"custom kernels: {knob} is a power of two from {low}",
        (knob,),
        lambda p, x: x[knob] >= low and x[knob] & (x[knob] - 1) == 0,
    )


def space(problem: MatmulProblem, target, pinned: dict[str, list]) -> Family:
    """The family's part of the space; `pinned` holds IREE's knobs at neutral values."""
    persistent = persistent_candidates(problem, target.sm_count)
    return Family(
        "custom",
        constraints(target),
        fixed={"pipeline": [CUSTOM], **pinned},
        candidates={
            **custom_blocks(problem),
            "pipeline_depth": [3, 4],
            "warps": [4, 8],
            "group_m": [1, 8],
            "split_k": split_k_candidates(problem),
            "persistent": persistent,
            "specialized": [0, 1] if max(persistent) else [0],
        },
    )


def constraints(target) -> list[Constraint]:
    """The family's rules, on the target's shared memory."""
    return [
        _power_of_two("tile_m", 1),
        _power_of_two("tile_n", 16),
        _power_of_two("tile_k", 16),
        Constraint(
            "custom kernels: stages from 1 to 6",
            ("pipeline_depth",),
            lambda p, x: 1 <= x["pipeline_depth"] <= 6,
        ),
        Constraint(
            "custom kernels: 4 or 8 warps",
            ("warps",),
            lambda p, x: x["warps"] in (4, 8),
        ),
        Constraint(
            "custom kernels: group_m from 1 to 32",
            ("group_m",),
            lambda p, x: 1 <= x["group_m"] <= 32,
        ),
        Constraint(
            f"shared memory over the {target.arch} limit",
            ("tile_m", "tile_n", "tile_k", "pipeline_depth", "persistent", "specialized"),
            lambda p, x: shared_memory(p, x) <= target.shared_memory_bytes,
        ),
        Constraint(
            "custom kernels: a persistent kernel runs K whole, its operands' rows in "
            "16-byte steps (TMA)",
            ("split_k", "persistent"),
            lambda p, x: not x["persistent"] or not persistent_unsupported(p, x["split_k"]),
        ),
        Constraint(
            "custom kernels: a warp-specialized kernel is persistent, its block 16 rows a "
            "warp (wgmma) by at most 256 columns, its accumulator 128 registers a thread",
            ("tile_m", "tile_n", "warps", "persistent", "specialized"),
            lambda p, x: not x["specialized"] or specialized_fits(x),
        ),
        Constraint(
            f"custom kernels: a block under 16 rows sums its products on the CUDA cores, "
            f"in the plain kernel, at most {SUMMED_PER_THREAD} f32 a thread",
            ("tile_m", "tile_n", "tile_k", "warps", "persistent"),
            lambda p, x: x["tile_m"] >= 16 or summed_fits(x),
        ),
        Constraint(
            "custom kernels: split-K needs K in shares of whole blocks",
            ("tile_k", "split_k"),
            lambda p, x: (
                x["split_k"] >= 1 and split_unsupported(p, x["tile_k"], x["split_k"]) is None
            ),
        ),
    ]


def starting_points(problem: MatmulProblem, sm_count: int) -> list[Point]:
    """CUSTOM_STARTING (its persistent and warp-specialized ones where TMA can load the
    operands); for few rows SKINNY_STARTING before them, and for a decode step's
    SUMMED_STARTING before those (partial points): a skinny problem's first batch is
    of blocks made for its rows, not 128-256-row blocks of which it fills one row."""
    knobs = ("tile_m", "tile_n", "tile_k", "warps", "pipeline_depth")
    skinny = SKINNY_STARTING if problem.m <= SKINNY_ROWS else ()
    rows = summed_rows(problem)
    skinny = tuple((rows, *values) for values in SUMMED_STARTING) + skinny if rows else skinny
    programs = max(persistent_candidates(problem, sm_count))
    custom = [
        {"pipeline": CUSTOM, **dict(zip(knobs, values[:5], strict=True)), "group_m": 8}
        | ({"persistent": programs} if values[5:] else {})
        | ({"specialized": 1} if values[5:] == ("specialized",) else {})
        for values in CUSTOM_STARTING
        if not values[5:] or programs
    ]
    # K whole (split_k 1, the space's first) is left unnamed, so that records made
    # before split_k existed match too.
    return [
        {"pipeline": CUSTOM, **dict(zip(knobs, values[:5], strict=True)), "group_m": 8}
        | ({"split_k": values[5]} if values[5] > 1 else {})
        for values in skinny
    ] + custom


def workgroup_size(point: Point) -> list[int]:
    loader = LOADER_THREADS if point.get("specialized") else 0
    return [point["warps"] * WARP + loader, 1, 1]


def shared_memory(problem: MatmulProblem, point: Point) -> int:
    """Triton stages A and B blocks once per pipeline stage. A persistent kernel's
    epilogue runs while the next block's stages load, in shared memory of its own:
    Triton 3.9 gave it a quarter to all of a block of C (f32 C, 128x128 with 4 warps:
    32792 bytes; 128x256 with 8: 131096). Half a block is counted here; the compile
    step turns away a kernel over the limit (`triton_binary`)."""
    element = ELEMENT_BYTES[problem.lhs_type]
    blocks = (point["tile_m"] + point["tile_n"]) * point["tile_k"] * element
    epilogue = 0
    if point.get("specialized"):  # the epilogue stores from registers
        return blocks * point["pipeline_depth"]
    if point.get("persistent"):
        c_block = point["tile_m"] * point["tile_n"] * ELEMENT_BYTES[problem.acc_type]
        epilogue = c_block // 2
    return blocks * point["pipeline_depth"] + epilogue


def config_name(point: Point) -> str:
    tiles = f"wg{point['tile_m']}x{point['tile_n']}x{point['tile_k']}"
    split, persistent = point.get("split_k", 1), point.get("persistent", 0)
    name = f"tr_{tiles}_w{point['warps']}_s{point['pipeline_depth']}_g{point['group_m']}"
    name += f"_k{split}" if split > 1 else ""
    name += f"_p{persistent}" if persistent else ""
    return name + ("_ws" if point.get("specialized") else "")
