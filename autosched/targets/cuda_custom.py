"""A family of Triton matmul kernels that IREE runs as custom dispatches (issue 12).

IREE 3.13 has no Hopper tensor-core (wgmma) pipeline; Triton does. A kernel of this family
is compiled by Triton for sm_90a (wgmma, no TMA; its cubin) and wrapped in an IREE module as a
`hal.dispatch.extern` with the same signature as autosched's kernel modules, so it is
checked and timed like every other candidate. Its parameters (block sizes, warps, stages,
the launch-order group) are what a tuner searches.

Facts the module text relies on (../shared/probes/README.md, measured on the H200): launch
settings go in the extern op's properties; dynamic shared memory beyond 48 KB is granted
through `workgroup_local_memory`; bindings are the kernel's pointer parameters in operand
order, the output tied so that it is the third; Triton's hidden scratch pointers are extra
small operands.

Triton is an optional extra (`.[triton]`); `python -m
autosched.targets.cuda_custom_compile` is the PTX compiler the compile step runs, in its own
process, for each point.

`CustomKernels` is the family's part of the CUDA target's space (`pipeline = Custom`): its
knobs, candidates, rules and known-good points. The CUDA target holds one; this module
imports nothing of the target (targets/cuda.py imports it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import string
import sys
import tempfile
from dataclasses import asdict, dataclass, replace

from autosched.errors import UserError
from autosched.ops.epilogue import TRITON_TYPES as LANGUAGE_TYPES
from autosched.ops.epilogue import Epilogue
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kernel import tensor_type
from autosched.targets.base import Constraint, Family, KnobSpec, Point
from autosched.targets.cuda_custom_gluon import (
    GLUON_PRELUDE,
    LOADER_REGISTERS,
    LOADER_THREADS,
    SPECIALIZED_KERNEL_SOURCE,
    TMA_STORE,
)

TRITON_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}
INPUT_TYPES = ("f16", "bf16")  # the tensor-core inputs the family covers
OUTPUT_TYPES = ("f32", "f16", "bf16")
WARP = 32  # threads per warp (subgroup size) on every NVIDIA GPU
MIN_DOT = 16  # tl.dot's smallest extent of each dim


@dataclass(frozen=True)
class KernelParams:
    """One point of the family."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    group_m: int  # rows of blocks launched together, for L2 reuse
    split_k: int = 1  # workgroups that share one block's K, adding up in turn (serial split-K)
    # Workgroups that take the output blocks in turn, loading A and B by TMA descriptors
    # (`persistent_matmul`); 0: one workgroup per block, loading by pointers.
    persistent: int = 0
    # 1: the persistent kernel warp-specialized, a loader warp feeding the MMA warps
    # (`specialized_matmul`, Gluon: cuda_custom_gluon.py).
    specialized: int = 0

    @property
    def name(self) -> str:
        split = f"_k{self.split_k}" if self.split_k > 1 else ""
        persistent = f"_p{self.persistent}" if self.persistent else ""
        specialized = "_ws" if self.specialized else ""
        return (
            f"tr_b{self.block_m}x{self.block_n}x{self.block_k}_w{self.warps}"
            f"_s{self.stages}_g{self.group_m}{split}{persistent}{specialized}"
        )

    @classmethod
    def from_point(cls, point: dict) -> KernelParams:
        """A custom point of the CUDA target's space (a record older than split_k has
        none: K whole)."""
        return cls(
            block_m=point["tile_m"],
            block_n=point["tile_n"],
            block_k=point["tile_k"],
            warps=point["warps"],
            stages=point["pipeline_depth"],
            group_m=point["group_m"],
            split_k=max(point.get("split_k", 1), 1),
            persistent=point.get("persistent", 0),
            specialized=point.get("specialized", 0),
        )


@dataclass(frozen=True)
class KernelBinary:
    """What Triton produced for one point: PTX on disk and its launch needs."""

    ptx_path: str  # Triton's PTX, kept to read what it made
    cubin_path: str  # Triton's own machine code (its bundled ptxas): what IREE embeds
    entry: str  # the PTX entry point
    pointers: int  # pointer parameters: a, b, c, then Triton's scratch pointers
    shared_bytes: int  # dynamic shared memory per workgroup
    threads: int  # threads per workgroup (warps x 32)
    # Triton's global scratch per workgroup (where a kernel writes its TMA descriptors);
    # 0: the kernel uses none, and its scratch pointer is a placeholder.
    scratch_bytes: int = 0
    workgroups: tuple[int, ...] = ()  # the launch grid, where the point alone does not say


def unsupported(problem: MatmulProblem) -> str | None:
    """Why the family cannot compute this problem, or None."""
    if problem.lhs_type not in INPUT_TYPES or problem.rhs_type != problem.lhs_type:
        return f"custom kernels take f16 or bf16 inputs, not {problem.lhs_type}"
    if problem.acc_type not in OUTPUT_TYPES:
        return f"custom kernels write f32, f16 or bf16, not {problem.acc_type}"
    if not problem.zero_init:
        return "custom kernels start from a zero accumulator"
    return None


def split_unsupported(problem: MatmulProblem, block_k: int, split_k: int) -> str | None:
    """Why K cannot be split in `split_k` shares, or None: the shares add up in C itself,
    so C must be f32, and each share must be whole blocks of K."""
    if split_k == 1:
        return None
    if problem.acc_type != "f32":
        return f"split-K adds up in C, which must be f32, not {problem.acc_type}"
    if problem.k % (split_k * block_k):
        return f"split-K needs K ({problem.k}) in {split_k} shares of whole {block_k}-blocks"
    return None


# ---- the family in the CUDA target's space ---------------------------------------------------

CUSTOM = "Custom"  # the `pipeline` of a custom-kernel point
CUSTOM_ARCHS = ("sm_90",)  # the family is written for Hopper's wgmma
# Shared memory a workgroup may have on each of those (cuda.py's ARCHS says the same).
SHARED_MEMORY_BYTES = {"sm_90": 232448}
SKINNY_ROWS = 64  # a problem with at most this many rows of C gets the skinny custom blocks
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


def is_custom(point: Point) -> bool:
    return point["pipeline"] == CUSTOM


def custom_blocks(problem: MatmulProblem) -> dict[str, list[int]]:
    """Block M and N of the custom family: 64-256, and for skinny problems (M up to
    SKINNY_ROWS) 16-64 rows and 32-256 columns. Why: at 16x4096x4096 f16 the
    64x64 block gave 64 workgroups for the H200's 132 SMs and 0.7 of cuBLAS; the product
    is bound by reading B, so more, narrower blocks keep more SMs reading."""
    if problem.m > SKINNY_ROWS:
        return {"tile_m": [64, 128, 256], "tile_n": [64, 128, 256]}
    return {"tile_m": [16, 32, 64], "tile_n": [32, 64, 128, 256]}


def split_k_candidates(problem: MatmulProblem) -> list[int]:
    """Shares of K for the custom family: 1, and 2-8 for a skinny problem with an f32 C.
    On the H200 two shares took 16x4096x4096 f16 from 11.9 to 10.9 us; at 512^3 and 1024^3
    every split was slower (7.2 and 12.9 us against 5.1 and 7.7): passing a block's lock on
    costs about 2 us, more than a short run of K saves (h200_custom_skinny_split.md)."""
    skinny = problem.m <= SKINNY_ROWS and problem.acc_type == "f32"
    return [1, 2, 4, 8] if skinny else [1]


def persistent_unsupported(problem: MatmulProblem, split_k: int) -> str | None:
    """Why a persistent kernel (TMA descriptors over A and B) cannot run this problem, or
    None: it runs K whole, and TMA needs each operand's rows (and batch entries) in steps
    of 16 bytes."""
    if split_k > 1:
        return "a persistent kernel runs its K whole"
    rows = (problem.m if problem.transpose_a else problem.k,
            problem.k if problem.transpose_b else problem.n)  # fmt: skip
    if any(row * 2 % 16 for row in rows):  # f16 or bf16 (INPUT_TYPES)
        return "TMA needs the operands' rows in steps of 16 bytes"
    return None


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


def _power_of_two(knob: str, low: int) -> Constraint:
    return Constraint(
        f"custom kernels: {knob} is a power of two from {low}",
        (knob,),
        lambda p, x: x[knob] >= low and x[knob] & (x[knob] - 1) == 0,
    )


class CustomKernels:
    """The CUDA target's custom-kernel family: where it is searched, its part of the space
    (its knobs, candidates and rules), its known-good points, and what a point of it is
    (name, workgroup, shared memory, the command that writes its module). The CUDA target
    holds one and hands it what is custom; IREE's knobs are the target's."""

    def __init__(
        self,
        arch: str,
        triton: bool,
        shared_memory_bytes: int,
        element_bytes: dict[str, int],
        sm_count: int = 0,
    ):
        self.arch = arch
        self.triton = triton  # Triton is installed (host discovery)
        self.shared_memory_bytes = shared_memory_bytes  # the arch's limit per workgroup
        self.element_bytes = element_bytes  # bytes of each element type the target knows
        self.sm_count = sm_count  # a persistent kernel's workgroups: one per SM

    def unavailable(self, problem: MatmulProblem) -> str | None:
        """Why custom kernels are not searched for this problem, or None."""
        if self.arch not in CUSTOM_ARCHS:
            return f"custom kernels are written for {', '.join(CUSTOM_ARCHS)}, not {self.arch}"
        if not self.triton:
            return "custom kernels need Triton: pip install '.[triton]'"
        return unsupported(problem)

    def family(self, problem: MatmulProblem, pinned: dict[str, list]) -> Family:
        """The family's part of the space; `pinned` holds IREE's knobs at neutral values."""
        persistent = persistent_candidates(problem, self.sm_count)
        return Family(
            "custom",
            self.constraints(problem),
            fixed={"pipeline": [CUSTOM], **pinned},
            candidates={
                **custom_blocks(problem),
                "tile_k": [32, 64, 128],
                "pipeline_depth": [3, 4],
                "warps": [4, 8],
                "group_m": [1, 8],
                "split_k": split_k_candidates(problem),
                "persistent": persistent,
                "specialized": [0, 1] if max(persistent) else [0],
            },
        )

    def constraints(self, problem: MatmulProblem) -> list[Constraint]:
        return [
            _power_of_two("tile_m", 16),
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
                f"shared memory over the {self.arch} limit",
                ("tile_m", "tile_n", "tile_k", "pipeline_depth", "persistent", "specialized"),
                lambda p, x: self.shared_memory(p, x) <= self.shared_memory_bytes,
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
                "custom kernels: split-K needs an f32 C and K in shares of whole blocks",
                ("tile_k", "split_k"),
                lambda p, x: (
                    x["split_k"] >= 1 and split_unsupported(p, x["tile_k"], x["split_k"]) is None
                ),
            ),
        ]

    def starting_points(self, problem: MatmulProblem) -> list[Point]:
        """CUSTOM_STARTING (its persistent and warp-specialized ones where TMA can load the
        operands), then SKINNY_STARTING for few rows (partial points)."""
        knobs = ("tile_m", "tile_n", "tile_k", "warps", "pipeline_depth")
        skinny = SKINNY_STARTING if problem.m <= SKINNY_ROWS else ()
        programs = max(persistent_candidates(problem, self.sm_count))
        custom = [
            {"pipeline": CUSTOM, **dict(zip(knobs, values[:5], strict=True)), "group_m": 8}
            | ({"persistent": programs} if values[5:] else {})
            | ({"specialized": 1} if values[5:] == ("specialized",) else {})
            for values in CUSTOM_STARTING
            if not values[5:] or programs
        ]
        # K whole (split_k 1, the space's first) is left unnamed, so that records made
        # before split_k existed match too.
        return custom + [
            {"pipeline": CUSTOM, **dict(zip(knobs, values[:5], strict=True)), "group_m": 8}
            | ({"split_k": values[5]} if values[5] > 1 else {})
            for values in skinny
        ]

    def workgroup_size(self, point: Point) -> list[int]:
        loader = LOADER_THREADS if point.get("specialized") else 0
        return [point["warps"] * WARP + loader, 1, 1]

    def shared_memory(self, problem: MatmulProblem, point: Point) -> int:
        """Triton stages A and B blocks once per pipeline stage. A persistent kernel's
        epilogue runs while the next block's stages load, in shared memory of its own:
        Triton 3.9 gave it a quarter to all of a block of C (f32 C, 128x128 with 4 warps:
        32792 bytes; 128x256 with 8: 131096). Half a block is counted here; the compile
        step turns away a kernel over the limit (`triton_binary`)."""
        element = self.element_bytes[problem.lhs_type]
        blocks = (point["tile_m"] + point["tile_n"]) * point["tile_k"] * element
        epilogue = 0
        if point.get("specialized"):  # the epilogue stores from registers
            return blocks * point["pipeline_depth"]
        if point.get("persistent"):
            c_block = point["tile_m"] * point["tile_n"] * self.element_bytes[problem.acc_type]
            epilogue = c_block // 2
        return blocks * point["pipeline_depth"] + epilogue

    def config_name(self, point: Point) -> str:
        tiles = f"wg{point['tile_m']}x{point['tile_n']}x{point['tile_k']}"
        split, persistent = point.get("split_k", 1), point.get("persistent", 0)
        name = f"tr_{tiles}_w{point['warps']}_s{point['pipeline_depth']}_g{point['group_m']}"
        name += f"_k{split}" if split > 1 else ""
        name += f"_p{persistent}" if persistent else ""
        return name + ("_ws" if point.get("specialized") else "")

    def source_command(self, problem: MatmulProblem, point: Point, source: str) -> list[str]:
        """Triton compiles the point to PTX and writes its extern module to `source`."""
        return compile_command(problem, asdict(KernelParams.from_point(point)), self.arch, source)


def compile_command(problem, params: dict, arch: str, source: str) -> list[str]:
    """The compile pool's step for one custom point of either family
    (`cuda_custom_compile`): its PTX beside `source`, its extern module at `source`."""
    from autosched.outputs.records import problem_shape

    return [
        sys.executable,
        "-m",
        "autosched.targets.cuda_custom_compile",
        "--shape",
        json.dumps(problem_shape(problem)),
        "--params",
        json.dumps(params),
        "--arch",
        arch,
        "--ptx",
        source.removesuffix(".mlir") + ".ptx",
        "--module",
        source,
    ]


def import_triton():
    # Triton 3.9 warns unless the FP-fusion default is named; keep its long-standing one.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        import triton
    except ImportError:
        raise UserError(
            "custom kernels need Triton, an optional extra: pip install '.[triton]'"
        ) from None
    return triton


def _strides(problem: MatmulProblem) -> dict[str, int]:
    """Element strides of A, B and C (batch, row, column), from the problem's layout."""
    m, n, k = problem.m, problem.n, problem.k
    a_m, a_k = (1, m) if problem.transpose_a else (k, 1)
    b_k, b_n = (1, k) if problem.transpose_b else (n, 1)
    return {
        "sab": m * k,
        "sam": a_m,
        "sak": a_k,
        "sbb": k * n,
        "sbk": b_k,
        "sbn": b_n,
        "scb": m * n,
        "scm": n,
        "scn": 1,
    }


# The parameters of the matmul kernels (`$params`: the epilogue's extra pointers).
KERNEL_PARAMETERS = """    a, b, $params c, locks,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    sab: tl.constexpr, sam: tl.constexpr, sak: tl.constexpr,
    sbb: tl.constexpr, sbk: tl.constexpr, sbn: tl.constexpr,
    scb: tl.constexpr, scm: tl.constexpr, scn: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr,
    EVEN: tl.constexpr, SPLIT: tl.constexpr, K_PART: tl.constexpr,"""

# The kernels as Python source: Triton compiles a function from its file, and an epilogue
# (model/epilogues.py) is written into it as statements. `$params` are the epilogue's extra
# pointers, `$epilogue` its statements (`out = acc` without one). First the helpers, then
# `matmul`.
KERNEL_HELPERS = """import triton
import triton.language as tl


@triton.jit
def block_of(pid, M: tl.constexpr, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, G):
    # The output block (row and column of blocks) of workgroup `pid`: blocks are launched G
    # rows of blocks at a time, for L2 reuse.
    blocks_m = tl.cdiv(M, BM)
    blocks_n = tl.cdiv(N, BN)
    group = pid // (G * blocks_n)
    first = group * G
    size = min(blocks_m - first, G)
    return first + (pid % (G * blocks_n)) % size, (pid % (G * blocks_n)) // size


@triton.jit
def wait_for_turn(lock, part):
    # Serial split-K: the block's K shares add up in order, as CUTLASS's serial split-K
    # does: share s waits until the block's lock reads s, adds what C holds, stores, and
    # passes the lock on; the last share sets it back to 0 for the next call. Share s-1 is
    # launched before share s (z is the slowest grid axis; CUDA starts blocks in order,
    # which CUTLASS relies on too), so the wait ends.
    while tl.atomic_cas(lock, part, part, sem="acquire") != part:
        pass


@triton.jit
def load_tile(p, rows, columns, R, C, EVEN: tl.constexpr):
    # The tile at p: masked, unless the problem's dims are multiples of the blocks.
    if EVEN:
        tile = tl.load(p)
    else:
        tile = tl.load(p, mask=(rows[:, None] < R) & (columns[None, :] < C), other=0.0)
    return tile


@triton.jit
def accumulate(
    pa, pb, rm, rk, rn,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, K_PART: tl.constexpr,
    sak: tl.constexpr, sbk: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr,
):
    # The (BM, BN) tile of A·B at rows rm and columns rn, over K_PART of K from pa and pb.
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K_PART, BK):
        x = load_tile(pa, rm, rk + k, M, K, EVEN)
        acc = tl.dot(x, load_tile(pb, rk + k, rn, K, N, EVEN), acc)
        pa += BK * sak
        pb += BK * sbk
    return acc
"""
KERNEL_SOURCE = (
    KERNEL_HELPERS
    + """

@triton.jit
def matmul(
$parameters
):
    pid = tl.program_id(0)
    batch = tl.program_id(1)
    # This workgroup's share of K (serial split-K). A constant 0 when K is whole, so that
    # the kernel is the one without split-K, instruction for instruction.
    if SPLIT > 1:
        part = tl.program_id(2)
    else:
        part = 0
    pm, pn = block_of(pid, M, N, BM, BN, G)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = part * K_PART + tl.arange(0, BK)
    pa = a + batch * sab + rm[:, None] * sam + rk[None, :] * sak
    pb = b + batch * sbb + rk[:, None] * sbk + rn[None, :] * sbn
    acc = accumulate(pa, pb, rm, rk, rn, M, N, K, K_PART, sak, sbk, BM, BN, BK, EVEN)
    c_ptrs = c + batch * scb + rm[:, None] * scm + rn[None, :] * scn
    if SPLIT > 1:  # the shares add up in C in order (see wait_for_turn)
        lock = locks + batch * tl.num_programs(0) + pid
        if part > 0:
            wait_for_turn(lock, part)
            inside = (rm[:, None] < M) & (rn[None, :] < N)
            # From L2 (.cg): an SM's L1 does not see another SM's stores.
            acc += tl.load(c_ptrs, mask=inside, cache_modifier=".cg")
$store_tile
    if SPLIT > 1:
        tl.debug_barrier()  # every thread's store lands before the lock moves on
        tl.atomic_xchg(lock, (part + 1) % SPLIT, sem="release")
"""
)


# The epilogue and store of the tile `acc` at rows `rm` and columns `rn`. Where C is
# written, an epilogue's output-shaped inputs are read too; an epilogue whose result permutes
# C's dims writes each element where that result has it (`$pointers`).
STORE_TILE = """    offsets = $offsets
$pointers
    inside = (rm[:, None] < M) & (rn[None, :] < N)
$epilogue
    value = out.to(c.dtype.element_ty)
$store"""
# STORE_TILE's store: masked unless the blocks cover C exactly.
PLAIN_STORE = """    if EVEN:
        tl.store(c_ptrs, value)
    else:
        tl.store(c_ptrs, value, mask=inside)"""

# RoPE's rotate_half in each head of 2 * HALF columns, kept in the kernel (issue 24): a
# block computes BN // 2 columns of the heads' first halves, each beside its partner HALF
# columns on (B's columns read in that order), so that one split of the accumulator's
# innermost pair, which each thread holds in its own registers, gives the first halves' tile
# and their partners'. The rotation is then a choice of tile (the first halves take their
# partners negated, the second halves their partners), and no value moves between threads.
# For blocks of a head or part of one (`rotated_kernel`); K is whole.
ROTATED_KERNEL_SOURCE = """

@triton.jit
def rotated_matmul(
$parameters
    HALF: tl.constexpr,
):
    pid = tl.program_id(0)
    batch = tl.program_id(1)
    pm, pn = block_of(pid, M, N, BM, BN, G)
    rm = pm * BM + tl.arange(0, BM)
    first = pn * (BN // 2) + tl.arange(0, BN // 2)  # which of the N // 2 first-half columns
$columns
    rk = tl.arange(0, BK)
    pa = a + batch * sab + rm[:, None] * sam + rk[None, :] * sak
    pb = b + batch * sbb + rk[:, None] * sbk + pairs[None, :] * sbn
    acc = accumulate(pa, pb, rm, rk, pairs, M, N, K, K, sak, sbk, BM, BN, BK, EVEN)
$halves
"""
# A rotated kernel's columns, from `first`: the first halves' (`lo`), and B's (`pairs`:
# each of those, then its partner; past N where `first` is past N // 2).
ROTATED_COLUMNS = (
    "lo = first // HALF * (2 * HALF) + first % HALF",
    "pairs = tl.reshape(tl.join(lo, lo + HALF), (BN,))",
)
# The accumulator's pairs apart: the first halves' tile and their partners'.
ROTATED_SPLIT = "acc_lo, acc_hi = tl.split(tl.reshape(acc, (BM, BN // 2, 2)))"
# Each half of a rotated kernel's block: its columns, its tile and that rotated, then the
# epilogue and store (`STORE_TILE`).
ROTATED_HALVES = (
    ("rn = lo", "acc = acc_lo", "rot = -acc_hi"),
    ("rn = lo + HALF", "acc = acc_hi", "rot = acc_lo"),
)
ROW_MAJOR = "batch * scb + rm[:, None] * scm + rn[None, :] * scn"

# PROGRAMS workgroups (one per SM) take the output blocks in turn, reading A and B through
# TMA descriptors (Hopper's bulk tensor copies; Triton writes each workgroup's descriptors
# to its global scratch), the loop over blocks and the loop over K flattened into one, so
# that the next block's loads are under way during this block's epilogue. K is whole.
PERSISTENT_KERNEL_SOURCE = """

@triton.jit
def persistent_matmul(
$parameters
    PROGRAMS: tl.constexpr,
):
    batch = tl.program_id(1)
    if sak == 1:  # A's rows along K
        a_desc = tl.make_tensor_descriptor(
            a + batch * sab, shape=[M, K], strides=[sam, 1], block_shape=[BM, BK]
        )
    else:
        a_desc = tl.make_tensor_descriptor(
            a + batch * sab, shape=[K, M], strides=[sak, 1], block_shape=[BK, BM]
        )
    if sbn == 1:  # B's rows along N
        b_desc = tl.make_tensor_descriptor(
            b + batch * sbb, shape=[K, N], strides=[sbk, 1], block_shape=[BK, BN]
        )
    else:
        b_desc = tl.make_tensor_descriptor(
            b + batch * sbb, shape=[N, K], strides=[sbn, 1], block_shape=[BN, BK]
        )
    blocks = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    for block in tl.range(tl.program_id(0), blocks, PROGRAMS, flatten=True):
        pm, pn = block_of(block, M, N, BM, BN, G)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            if sak == 1:
                x = a_desc.load([pm * BM, k])
            else:
                x = tl.trans(a_desc.load([k, pm * BM]))
            if sbn == 1:
                y = b_desc.load([k, pn * BN])
            else:
                y = tl.trans(b_desc.load([pn * BN, k]))
            acc = tl.dot(x, y, acc)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        c_ptrs = c + batch * scb + rm[:, None] * scm + rn[None, :] * scn
$store_tile
"""


def rotated_kernel(epilogue: Epilogue | None, block_n: int) -> bool:
    """Whether the epilogue's kernel is `rotated_matmul`: it rotates heads, and a block of
    `block_n` columns holds a head or part of one (`rotates_in_tile` says why not more)."""
    return epilogue is not None and 1 < epilogue.period and block_n <= epilogue.period


def rotates_in_tile(epilogue: Epilogue | None, block_n: int) -> bool:
    """Whether a rotated epilogue's kernel is `matmul` rotating its whole tile of several
    heads in registers (`tile_rotation`) rather than `rotated_matmul`. With blocks wider
    than a head, `rotated_matmul`'s half tiles came out of Triton 3.6 with every epilogue
    load and store scalar (the PTX of the Llama-3 q projection at 128x256: 256 loads and
    128 stores against 32 and 16), and that kernel ran 0.307 ms on the H200 against 0.139
    for the whole tile rotated; at a block of one head (the k projection at 128x128)
    `rotated_matmul` ran 0.036 ms against 0.058."""
    return epilogue is not None and 1 < epilogue.period < block_n


def tile_rotation(epilogue: Epilogue) -> list[str]:
    """Statements that set `rot` to rotate_half of the rounded tile `acc` within each head
    of a block of whole heads: the first half's columns take the second half's values
    negated, the second half's the first's."""
    heads, half, narrow = f"BN // {epilogue.period}", epilogue.period // 2, epilogue.narrow
    return [
        f"rot = acc.to({LANGUAGE_TYPES[narrow]})",
        f"rot = tl.permute(tl.reshape(rot, (BM, {heads}, 2, {half})), (0, 1, 3, 2))",
        "rot_lo, rot_hi = tl.split(rot)",
        "rot = tl.reshape(tl.permute(tl.join(-rot_hi, rot_lo), (0, 1, 3, 2)), (BM, BN))",
    ]


def kernel_function(epilogue: Epilogue | None, params: KernelParams) -> str:
    """Which kernel a point runs: `rotated_matmul` for an epilogue rotating heads in blocks
    of a head or less (it has no persistent form), else `specialized_matmul`,
    `persistent_matmul` or `matmul`. A warp-specialized point whose epilogue rotates its
    tile (`rotates_in_tile`: reshapes of the tile Gluon would need layouts for) runs
    `persistent_matmul`."""
    if rotated_kernel(epilogue, params.block_n):
        return "rotated_matmul"
    if params.specialized and params.persistent and not rotates_in_tile(epilogue, params.block_n):
        return "specialized_matmul"
    return "persistent_matmul" if params.persistent else "matmul"


def specialized_source(epilogue: Epilogue | None, block_n: int) -> str:
    """`specialized_matmul`'s source (cuda_custom_gluon.py), its epilogue and store inside
    the MMA warps' loop over blocks."""
    tile = matmul_store_tile(epilogue, block_n, TMA_STORE).splitlines()
    inner = "\n".join(x if x == "$epilogue" else f"    {x}" for x in tile)
    source = GLUON_PRELUDE + string.Template(SPECIALIZED_KERNEL_SOURCE).safe_substitute(
        store_tile=inner, parameters=KERNEL_PARAMETERS, loader_registers=LOADER_REGISTERS
    )
    return with_epilogue(source, epilogue, ("rn", "N", "offsets", "inside"), indent=2)


def kernel_source(
    epilogue: Epilogue | None = None, block_n: int = 0, persistent: bool = False
) -> str:
    """The kernel's source, with the epilogue's loads and statements after the main loop
    (a kernel with one never splits K: `narrow_params`) and its result's layout; with a
    rotated input, `matmul` rotating its tile or also `rotated_matmul` (`rotates_in_tile`
    at `block_n` columns a block); `persistent`: `persistent_matmul` alone, its epilogue
    inside its loop over blocks."""
    store = epilogue.store if epilogue else None
    offsets = store.offsets("rm[:, None]", "rn[None, :]") if store else ROW_MAJOR
    names = ("rn", "N", "offsets", "inside")
    if persistent and not rotated_kernel(epilogue, block_n):
        tile = matmul_store_tile(epilogue, block_n).splitlines()
        inner = "\n".join(x if x == "$epilogue" else f"    {x}" for x in tile)
        source = KERNEL_HELPERS + string.Template(PERSISTENT_KERNEL_SOURCE).safe_substitute(
            store_tile=inner, parameters=KERNEL_PARAMETERS
        )
        return with_epilogue(source, epilogue, names, indent=2)
    source = string.Template(KERNEL_SOURCE).safe_substitute(
        store_tile=matmul_store_tile(epilogue, block_n), parameters=KERNEL_PARAMETERS
    )
    if rotated_kernel(epilogue, block_n):
        source += string.Template(ROTATED_KERNEL_SOURCE).safe_substitute(
            parameters=KERNEL_PARAMETERS,
            columns="\n".join(f"    {line}" for line in ROTATED_COLUMNS),
            halves="\n".join(rotated_halves(offsets)),
        )
    return with_epilogue(source, epilogue, names)


def matmul_store_tile(epilogue: Epilogue | None, block_n: int, write: str = PLAIN_STORE) -> str:
    """`matmul`'s lines after its main loop (`STORE_TILE`): its result's layout, and with a
    rotated input whose blocks rotate in their tile, that rotation (`$epilogue` left to
    fill); `write` stores the tile `value`."""
    store = epilogue.store if epilogue else None
    offsets = store.offsets("rm[:, None]", "rn[None, :]") if store else ROW_MAJOR
    pointers = "    c_ptrs = c + offsets" if store else ""
    if rotates_in_tile(epilogue, block_n):
        pointers += "".join(f"\n    {line}" for line in tile_rotation(epilogue))
    return string.Template(STORE_TILE).safe_substitute(
        offsets=offsets, pointers=pointers, store=write
    )


def rotated_halves(offsets: str) -> list[str]:
    """The lines after a rotated kernel's main loop: the accumulator split in its halves,
    then each half's epilogue and store, the result written at `offsets` (`$epilogue` left
    to fill)."""
    tile = string.Template(STORE_TILE).safe_substitute(
        offsets=offsets, pointers="    c_ptrs = c + offsets", store=PLAIN_STORE
    )
    halves = [line for half in ROTATED_HALVES for line in [*(f"    {x}" for x in half), tile]]
    return [f"    {ROTATED_SPLIT}", *halves]


def with_epilogue(
    template: str, epilogue: Epilogue | None, names: tuple[str, ...], indent: int = 1
) -> str:
    """A kernel's source `template` with the epilogue's pointers (`$params`) and its loads and
    statements (`$epilogue`, `indent` levels in; `out = acc` without one); `names`: the
    template's output-channel index and count, and the output tile's offsets and mask
    (`Epilogue.triton_lines`)."""
    margin = "    " * indent
    if epilogue is None:
        return string.Template(template).substitute(params="", epilogue=f"{margin}out = acc")
    params, body = epilogue.triton_lines(*names)
    return string.Template(template).substitute(
        params="".join(f"{p}, " for p in params),
        epilogue="\n".join(f"{margin}{line}" for line in body),
    )


def _kernel(epilogue: Epilogue | None, params: KernelParams):
    """The Triton kernel `kernel_function` names (built from its source, so that importing
    this module needs no Triton)."""
    function = kernel_function(epilogue, params)
    if function == "specialized_matmul":
        return kernel_from_source(specialized_source(epilogue, params.block_n), function)
    persistent = function == "persistent_matmul"
    return kernel_from_source(kernel_source(epilogue, params.block_n, persistent), function)


def kernel_from_source(source: str, function: str):
    """The Triton kernel `function` of `source`, written to a file of its own named by its
    hash in a per-user folder (Triton reads a kernel's source from its file)."""
    import_triton()
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), f"autosched-triton-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{function}_{digest}.py")
    if not os.path.exists(path):
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".py", delete=False) as handle:
            handle.write(source)
        os.replace(handle.name, path)  # whole, even with another process writing it too
    spec = importlib.util.spec_from_file_location(f"autosched_{function}_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def grid(problem: MatmulProblem, params: KernelParams) -> tuple[int, int, int]:
    """Workgroups: one per output block (a persistent kernel's, at most one per SM), times
    the batch, times the shares of K."""
    per_batch = blocks(problem, params)
    if params.persistent:
        per_batch = min(per_batch, params.persistent)
    return per_batch, max(problem.batch, 1), params.split_k


def blocks(problem: MatmulProblem, params: KernelParams) -> int:
    """Output blocks of one batch entry."""
    return math.ceil(problem.m / params.block_m) * math.ceil(problem.n / params.block_n)


def compile_ptx(
    problem: MatmulProblem,
    params: KernelParams,
    arch: str,
    path: str,
    epilogue: Epilogue | None = None,
) -> KernelBinary:
    """Triton's PTX for one point, written to `path` (no GPU needed); with `epilogue` in it
    (its extra inputs after A and B; it writes the epilogue's type; K is never split).
    The binary names its workgroups: a persistent point runs one workgroup per block
    where its kernel has no persistent form (`rotated_matmul`) or TMA cannot load this
    form's operands (a weight read as stored, whose rows run along K)."""
    rotated = kernel_function(epilogue, params) == "rotated_matmul"
    if rotated or persistent_unsupported(problem, params.split_k):
        params = replace(params, persistent=0, specialized=0)
    kernel = _kernel(epilogue, params)
    gluon = kernel_function(epilogue, params) == "specialized_matmul"
    element, output = TRITON_TYPES[problem.lhs_type], TRITON_TYPES[problem.acc_type]
    why = split_unsupported(problem, params.block_k, params.split_k)
    if epilogue is not None and params.split_k > 1:
        why = "a kernel with an epilogue runs its K whole"
    if why:
        raise UserError(f"{params.name}: {why}")
    k_part = problem.k // params.split_k if params.split_k > 1 else problem.k
    even = (
        problem.m % params.block_m == 0
        and problem.n % params.block_n == 0
        and problem.k % params.block_k == 0
    )
    constants = {
        "M": problem.m,
        "N": problem.n,
        "K": problem.k,
        **_strides(problem),
        "BM": params.block_m,
        "BN": params.block_n,
        "BK": params.block_k,
        "G": params.group_m,
        "EVEN": even,
        "SPLIT": params.split_k,
        "K_PART": k_part,
    }
    if rotated_kernel(epilogue, params.block_n):
        if params.block_n < 2 * MIN_DOT:
            raise UserError(f"{params.name}: a rotated kernel's half blocks need {MIN_DOT} columns")
        constants["HALF"] = epilogue.period // 2
    if params.persistent:
        constants["PROGRAMS"] = params.persistent
    if gluon:
        constants["STAGES"] = params.stages  # Gluon does not pipeline: the kernel's ring
    signature = {"a": f"*{element}", "b": f"*{element}"}
    for index, (_, operand) in enumerate(epilogue.extras if epilogue else []):
        signature[f"e{index}"] = f"*{TRITON_TYPES[operand.element]}"
    if epilogue is not None:
        output = TRITON_TYPES[epilogue.out_element]
    signature |= {"c": f"*{output}", "locks": "*i32"}
    if params.split_k == 1:
        constants["locks"] = None  # no lock pointer in the kernel's parameters
    if gluon:
        constants["TMA_STORE"] = tma_store_fits(problem, params, epilogue, output, arch)
    buffers = len(signature) - 1  # the locks are not one of IREE's bindings here
    binary = triton_binary(
        kernel, signature, constants, buffers, arch, params.warps, params.stages, path, gluon
    )
    return replace(binary, workgroups=grid(problem, params))


TRITON_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def tma_store_fits(
    problem: MatmulProblem, params: KernelParams, epilogue: Epilogue | None, output: str, arch: str
) -> bool:
    """Whether the warp-specialized kernel stores its blocks by TMA: C row-major (no
    epilogue that writes it permuted), its rows in 16-byte steps, and a block of C beside
    the stages in shared memory (at 128x256x64 in 3 stages, a bf16 C fits and an f32 one
    does not). On the H200 the TMA store took the Llama-3 gate projection from 0.393 to
    0.338 ms (benchmarks/gluon_matmul.py, session 27)."""
    if epilogue is not None and epilogue.store is not None:
        return False
    element = TRITON_BYTES[TRITON_TYPES[problem.lhs_type]]
    stages = params.stages * (params.block_m + params.block_n) * params.block_k * element
    c_block = params.block_m * params.block_n * TRITON_BYTES[output]
    limit = SHARED_MEMORY_BYTES.get(arch, 0) - 1024  # the stages' barriers and alignment
    return problem.n * TRITON_BYTES[output] % 16 == 0 and stages + c_block <= limit


def triton_binary(
    kernel,
    signature: dict[str, str],
    constants: dict,
    buffers: int,
    arch: str,
    warps: int,
    stages: int,
    path: str,
    gluon: bool = False,
) -> KernelBinary:
    """Triton's PTX and cubin for one kernel (`buffers`: its leading pointer parameters,
    IREE's bindings), the PTX written to `path` (no GPU needed); `gluon`: a Gluon kernel
    (its stages its own, its threads all its warps, the loader's too)."""
    triton = import_triton()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **{name: "constexpr" for name in constants}}
    # IREE's bindings are 16-byte aligned. Told so, Triton loads with vector and
    # asynchronous copies and pipelines its stages; untold, each element is its own load
    # (1.5 ms instead of about 0.2 at 4096^3 f16 on the H200).
    aligned = {(index,): [["tt.divisibility", 16]] for index in range(buffers)}
    options = {"num_warps": warps, "num_stages": stages}
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource

        source = GluonASTSource(kernel, signature, constants, aligned)
        options.pop("num_stages")
    else:
        source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
    capability = int(arch.removeprefix("sm_"))
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    shared = int(compiled.metadata.shared)
    if shared > SHARED_MEMORY_BYTES.get(arch, shared):
        raise UserError(
            f"the kernel needs {shared} bytes of shared memory, over {arch}'s "
            f"{SHARED_MEMORY_BYTES[arch]} per workgroup"
        )
    ptx = compiled.asm["ptx"]
    entry = re.search(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx, re.S)
    if entry is None:
        raise RuntimeError("Triton's PTX has no entry point")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(ptx)
    # IREE embeds Triton's cubin, not its PTX: at 4096^3 f16 on the H200 the same kernel
    # assembled from PTX ISA 8.4 by CUDA 13.0's ptxas (or the driver) ran 0.254 ms in IREE,
    # launched by Triton from its own build 0.210 ms.
    cubin = os.path.splitext(os.path.abspath(path))[0] + ".cubin"
    with open(cubin, "wb") as handle:
        handle.write(compiled.asm["cubin"])
    return KernelBinary(
        ptx_path=os.path.abspath(path),
        cubin_path=cubin,
        entry=entry.group(1),
        pointers=entry.group(2).count(".param"),
        shared_bytes=shared,
        threads=int(compiled.metadata.num_warps) * WARP,  # a Gluon kernel's loader warps too
        scratch_bytes=int(getattr(compiled.metadata, "global_scratch_size", 0)),
    )


def object_attribute(binary: KernelBinary) -> str:
    """The kernel's cubin as IREE embeds it: its bytes in the attribute itself (`data`), so
    that a custom spec or module builds wherever it is copied; `path` names where it was
    built (IREE reads the bytes, not the file)."""
    with open(binary.cubin_path, "rb") as handle:
        data = handle.read()
    return (
        f'#hal.executable.object<{{path = "{binary.cubin_path}", '
        f'data = dense<"0x{data.hex().upper()}"> : vector<{len(data)}xi8>}}>'
    )


def extern_function(
    problem: MatmulProblem,
    params: KernelParams,
    binary: KernelBinary,
    executable_target: str,
    name: str,
    kind: str = "func.func",
    epilogue: Epilogue | None = None,
) -> str:
    """A function `name(A, B) -> C` that runs the kernel as a `hal.dispatch.extern` (`kind`
    util.func for a substitution spec to call). With `epilogue`: `name(A, B, extras...)`
    returns the epilogue's result, in its own shape (a reshape of C: the same elements in
    the same order).

    The output is a `flow.tensor.alloca`: memory with undefined contents, never hoisted,
    since the kernel stores every element of C (it computes A·B from zero in registers). A
    zero-filled output, or a bare empty one, is hoisted into a constant that IREE then
    copies into C on every call (64 MB at 4096² f32). An optimization barrier on the empty
    tensor stops that, but it is a host-side step between device work: each custom
    dispatch then ended the model's command buffer. (A decoder layer with nine of them ran
    slower than IREE's default on the H200; that split was the difference we found in its
    stream IR.)
    """
    lhs = tensor_type(problem.lhs_shape, problem.lhs_type)
    rhs = tensor_type(problem.rhs_shape, problem.rhs_type)
    out = tensor_type(problem.acc_shape, problem.acc_type)
    extras = [operand.type for _, operand in epilogue.extras] if epilogue else []
    x, y, z = binary.workgroups or grid(problem, params)
    # Split-K's locks, one per output block: zeros that the kernel leaves at zero.
    locks = [f"tensor<{x * y}xi32>"] if params.split_k > 1 else []
    return dispatch_extern_function(
        name, kind, [lhs, rhs, *extras], epilogue.out_type if epilogue else out, binary,
        executable_target, (x, y, z), locks,
    )  # fmt: skip


def dispatch_extern_function(
    name: str,
    kind: str,
    inputs: list[str],
    out: str,
    binary: KernelBinary,
    executable_target: str,
    workgroups: tuple[int, int, int],
    zeroed: list[str] = (),
) -> str:
    """A function `name(inputs...) -> out` that launches `binary` on `workgroups` as a
    `hal.dispatch.extern`: the inputs read-only, then the output and `zeroed` tensors
    (written; they start at zero), then Triton's scratch pointers: its global scratch,
    where the kernel uses one, written (each workgroup's share, undefined at the start),
    and small placeholders for the rest."""
    x, y, z = workgroups
    hidden = binary.pointers - len(inputs) - 1 - len(zeroed)  # Triton's scratch pointers
    global_bytes = binary.scratch_bytes * x * y * z
    global_scratch = [f"tensor<{global_bytes}xi8>"] if global_bytes else []
    scratch_values = [f"%s{i}" for i in range(hidden - len(global_scratch))]
    arguments = [f"%a{i}" for i in range(len(inputs))]
    zero_values = [f"%z{i}" for i in range(len(zeroed))]
    written_values = ["%out", *zero_values, *["%g" for _ in global_scratch]]
    operand_types = [*inputs, out, *zeroed, *global_scratch]
    operand_types += ["tensor<256xi8>"] * len(scratch_values)
    operands = [*arguments, *written_values, *scratch_values]
    # Indirect: the buffers come from the call's binding table, so IREE records the command
    # buffer once and replays it. Without the flag an extern dispatch binds its buffers
    # directly and the command buffer (every repeat of the dispatch) is recorded on every
    # call, as IREE's own dispatches are not.
    read_only = '#hal.pipeline.binding<storage_buffer, "ReadOnly|Indirect">'
    written = "#hal.pipeline.binding<storage_buffer, Indirect>"
    bindings = [read_only] * len(inputs) + [written] * len(written_values)
    bindings += [read_only] * len(scratch_values)
    returns = "util.return" if kind == "util.func" else "return"
    visibility = " private" if kind == "util.func" else ""
    several = len(written_values) > 1
    results = f"({', '.join(written_values)})" if several else "%out"
    count = f":{len(written_values)}" if several else ""
    result = "%r#0" if several else "%r"
    signature = ", ".join(f"{a}: {t}" for a, t in zip(arguments, inputs, strict=True))
    zeros = zip(zero_values, zeroed, strict=True)
    lines = [
        f"  {kind}{visibility} @{name}({signature}) -> {out} {{",
        f"    %out = flow.tensor.alloca : {out}",
        *[f"    %g = flow.tensor.alloca : {t}" for t in global_scratch],
        *[f"    {v} = arith.constant dense<0> : {t}" for v, t in zeros],
        *[f"    {v} = arith.constant dense<0> : tensor<256xi8>" for v in scratch_values],
        f'    %r{count} = hal.dispatch.extern "{binary.entry}"'
        f"({', '.join(operands)}) : ({', '.join(operand_types)}) -> {results}",
        "      count(%device: !hal.device) -> (index, index, index) {",
        f"        %x = arith.constant {x} : index",
        f"        %y = arith.constant {y} : index",
        f"        %z = arith.constant {z} : index",
        "        hal.return %x, %y, %z : index, index, index",
        "      }",
        f"      layout(#hal.pipeline.layout<bindings = [{', '.join(bindings)}]>)",
        "      objects({",
        f"        {executable_target} ordinal(0) = [{object_attribute(binary)}]",
        "      })",
        f"      <{{workgroup_size = [{binary.threads} : index, 1 : index, 1 : index], "
        f"subgroup_size = 32 : index, workgroup_local_memory = {binary.shared_bytes} : index}}>",
        f"    {returns} {result} : {out}",
        "  }",
    ]
    return "\n".join(lines) + "\n"


def extern_module(
    problem: MatmulProblem,
    params: KernelParams,
    binary: KernelBinary,
    executable_target: str,
    function: str,
) -> str:
    """An IREE module whose `function` takes A and B like autosched's kernel modules (see
    `extern_function`); the executable target is the arch's full attribute
    (CudaTarget.executable_target), named on the module too."""
    body = extern_function(problem, params, binary, executable_target, function)
    return extern_module_text(executable_target, body)


def extern_module_text(executable_target: str, body: str) -> str:
    """A module around extern functions, its device target named (any family's)."""
    device = f'[#hal.device.target<"cuda", [{executable_target}]> : !hal.device]'
    return f"module attributes {{hal.device.targets = {device}}} {{\n{body}}}\n"
