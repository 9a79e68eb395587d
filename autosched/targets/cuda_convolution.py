"""Convolutions on IREE's CUDA backend: `TileAndFuse` on the mma.sync tensor cores, as
implicit GEMMs (`use_igemm_convolution = true`) or, for pointwise (1x1) ones, as the
contractions they are.

IREE turns a window convolution into a matmul over an im2col view of the image: its loops
are the output's, in the output's order, then one reduction K (input channels x filter
window). The lowering config's lists are in that space. IREE 3.13's defaults for
torchvision's resnet50 (NCHW, f16 in, f32 accumulated; sm_80) read, for `[n, f, oh, ow, k]`:

    3x3 at 56x56, 64 -> 64:   workgroup [1, 64, 1, 64, 0]  subgroup [1, 2, 1, 2, 0]  K 64
    3x3 at 28x28, 128 -> 128: workgroup [1, 64, 2, 32, 0]  subgroup [1, 2, 2, 1, 0]  K 128
    3x3 at 7x7, 512 -> 512:   workgroup [4, 128, 1, 8, 0]  subgroup [2, 2, 1, 1, 0]  K 128

always 8 warps, `padding` equal to the workgroup tile (K in elements) and both operands in
shared memory. The `subgroup` entries of the two mma dims count 16x8 tiles (the last of
those defaults fixes which dim takes the 16 rows: `mma_rows_role`); the entries of the outer
loops (batch, output rows) count elements. A pointwise convolution's lists run over its own
loops (`config_loops`), with IREE's defaults of 4 warps (POINTWISE_STARTING). Those are the
knobs: the workgroup tile per loop, the reduction step, and each warp's share.

Compiled here for sm_80 (tests/test_cuda_convolution.py); iree-compile takes any workgroup
size, so only the run on the GPU, which checks every candidate's outputs, proves a point."""

from __future__ import annotations

import math

from autosched.kernels.base import WARP
from autosched.kernels.registry import families_for, family_knobs, family_of
from autosched.ops.convolution import POINTWISE, STRIDED, WINDOW, ConvolutionProblem
from autosched.targets import cuda_simt_convolution as simt
from autosched.targets.base import Constraint, Family, KnobSpec, Point, powers_of_two
from autosched.targets.cuda import CudaTarget
from autosched.targets.cuda_rules import ELEMENT_BYTES, MMA_FOR_TYPES, mma_k

IREE = "iree"  # the `conv_kernel` knob: IREE's, or a kernel family's (kernels/)
CONVOLUTION_KNOBS = (
    KnobSpec("n_tile", "images per workgroup (convolution)"),
    KnobSpec("oh_tile", "output rows per workgroup (convolution)"),
    KnobSpec("ow_tile", "output columns per workgroup (convolution)"),
    KnobSpec("f_tile", "output channels per workgroup (convolution)"),
    KnobSpec("k_tile", "input channels x window per reduction step (convolution, x16)"),
    KnobSpec("sg_n", "images per warp (convolution)"),
    KnobSpec("sg_oh", "output rows per warp (convolution)"),
    KnobSpec("sg_ow", "mma tiles per warp along the output columns (convolution)"),
    KnobSpec("sg_f", "mma tiles per warp along the output channels (convolution)"),
    KnobSpec("thread_f", "output channels per thread (strided 1x1 convolution; else 0)", minimum=0),
    KnobSpec("thread_ow", "output columns per thread (strided 1x1 convolution; else 0)", minimum=0),
    KnobSpec(
        "conv_kernel",
        "convolution: IREE's TileAndFuse (iree) or the Triton implicit-GEMM family on sm_90 "
        "(triton), which replaces the op before dispatches are formed",
        choices=(IREE, *(f.selector[1] for f in families_for("convolution"))),
    ),
    *family_knobs("convolution"),  # the kernel families' own (kernels/)
)
# IREE's knobs, in order: the starting tables' columns.
_NAMES = [k.name for k in CONVOLUTION_KNOBS]
IREE_KNOBS = tuple(_NAMES[: _NAMES.index("conv_kernel")])
TILE_KNOB = {"n": "n_tile", "oh": "oh_tile", "ow": "ow_tile", "f": "f_tile"}
WARP_KNOB = {"n": "sg_n", "oh": "sg_oh", "ow": "sg_ow", "f": "sg_f"}
MMA_ROWS, MMA_COLUMNS = 16, 8
STAGES = 2  # IREE's prefetch_num_stages for these configurations
MAX_WARPS = 16
# IREE's defaults above, in CONVOLUTION_KNOBS' order: the first points.
IREE_STARTING = (
    (1, 1, 64, 64, 64, 1, 1, 2, 2, 0, 0),
    (1, 2, 32, 64, 128, 1, 2, 1, 2, 0, 0),
    (4, 1, 8, 128, 128, 2, 1, 1, 2, 0, 0),
)
# IREE's defaults for resnet50's pointwise (1x1) convolutions, 4 warps each: [1, 64, 1, 64]
# over (n, f, oh, ow) with warps of [1, 4, 1, 2] and K 64; [4, 64, 16] over (n, f, oh x ow)
# with [2, 4, 1] and K 128; [1, 64, 2, 32] with [1, 4, 2, 1] and K 128.
POINTWISE_STARTING = (
    (1, 1, 64, 64, 64, 1, 1, 2, 4, 0, 0),
    (4, 1, 16, 64, 128, 2, 1, 1, 4, 0, 0),
    (1, 2, 32, 64, 128, 1, 2, 1, 4, 0, 0),
)
STARTING = {WINDOW: IREE_STARTING, POINTWISE: POINTWISE_STARTING, STRIDED: simt.STRIDED_STARTING}
MMA_SHARES = ("sg_n", "sg_oh", "sg_ow", "sg_f")


def mma_rows_role(problem: ConvolutionProblem) -> str:
    """Which of output channels and output columns takes the mma's 16 rows: the lhs's.
    IREE's implicit GEMM of an NCHW convolution reads the filter as its lhs; an NHWC one,
    and a pointwise convolution (a contraction), the image."""
    if problem.form == WINDOW and problem.output_roles[-1] != "f":
        return "f"
    return "ow"


def mma_extent(problem: ConvolutionProblem, role: str) -> int:
    """Elements of one mma tile along an output loop: 16 for the lhs's side (mma_rows_role),
    8 for the other of output channels and columns, 1 for the outer loops."""
    if role not in ("f", "ow"):
        return 1
    return MMA_ROWS if role == mma_rows_role(problem) else MMA_COLUMNS


def uses_simt(problem: ConvolutionProblem) -> bool:
    """Whether no tensor-core configuration takes the convolution (cuda_simt_convolution):
    strided 1x1, depthwise and grouped ones."""
    return problem.form == STRIDED or problem.depthwise or problem.grouped


def _starting_table(problem: ConvolutionProblem) -> tuple:
    """The known-good points of the problem's form, in CONVOLUTION_KNOBS' order."""
    if problem.depthwise:
        return simt.DEPTHWISE_STARTING
    if problem.grouped:
        return simt.GROUPED_STARTING
    return STARTING[problem.form]


def tile_knobs(problem: ConvolutionProblem) -> dict[str, str]:
    """Each output loop's workgroup-tile knob (f_tile tiles the channel, `g` if depthwise)."""
    return {**{r: k for r, k in TILE_KNOB.items() if r != "f"}, problem.channel: "f_tile"}


def config_loops(problem: ConvolutionProblem) -> list[str]:
    """The loops a configuration's lists run over, by role: the implicit GEMM's (the output's
    loops, then K as "c") for a window convolution, the op's own for a pointwise one."""
    if problem.form == POINTWISE:
        return list(problem.loops)
    return [*problem.output_roles, "c"]


def warps(problem: ConvolutionProblem, point: Point) -> int:
    """Warps of a workgroup: each output loop's tile over one warp's share of it."""
    count = 1
    for role in TILE_KNOB:
        share = point[WARP_KNOB[role]] * mma_extent(problem, role)
        count *= max(point[TILE_KNOB[role]] // share, 1)
    return count


def shared_memory(problem: ConvolutionProblem, point: Point) -> int:
    """Bytes of the staged image and filter tiles, for each of IREE's prefetch stages."""
    pixels = point["n_tile"] * point["oh_tile"] * point["ow_tile"]
    element = ELEMENT_BYTES[problem.lhs_type]
    return STAGES * element * point["k_tile"] * (pixels + point["f_tile"])


def _shares_divide(problem: ConvolutionProblem, x: Point) -> bool:
    return all(x[TILE_KNOB[r]] % (x[WARP_KNOB[r]] * mma_extent(problem, r)) == 0 for r in TILE_KNOB)


class CudaConvolutionTarget(CudaTarget):
    root_kind = "convolution"
    knobs = CONVOLUTION_KNOBS

    def supports(self, problem: ConvolutionProblem) -> str | None:
        """16-bit operands with an mma intrinsic (plain thread tiles need none)."""
        if uses_simt(problem):
            return None
        kind = MMA_FOR_TYPES.get((problem.lhs_type, problem.acc_type))
        if problem.lhs_type != problem.rhs_type or kind not in self.mma_intrinsics:
            types = f"{problem.lhs_type} x {problem.rhs_type} -> {problem.acc_type}"
            return f"convolution on {types}: no tensor-core configuration on {self.arch}"
        return None

    def dispatch_repeat(self, problem: ConvolutionProblem) -> int:
        """About 50 ms of work per timed call, as for matmuls (CudaTarget.dispatch_repeat)."""
        estimate_s = problem.flops / 100e12
        return int(min(200, max(1, math.ceil(0.05 / estimate_s))))

    def families(self, problem: ConvolutionProblem, lists) -> list[Family]:
        """The mma configurations, or plain thread tiles (strided 1x1 and depthwise); for
        the op form of a convolution (the custom route's), the kernel families (kernels/;
        the Triton implicit-GEMM family) alone, IREE's knobs pinned."""
        own = [knob.name for knob in family_knobs(self.root_kind)]
        if problem.op_form:
            pinned = {k: [0 if k in simt.THREAD_KNOBS else 1] for k in IREE_KNOBS}
            return [
                family.space(problem, self, pinned)
                for family in self.kernel_families()
                if family.why_not(self, problem) is None
            ]
        neutral = {"conv_kernel": [IREE]} | {k: [0] for k in own}
        if uses_simt(problem):
            rules = simt.constraints(problem, self.shared_memory_bytes)
            fixed = {k: [1] for k in MMA_SHARES} | ({"k_tile": [1]} if problem.depthwise else {})
            return [Family("simt", rules, fixed=fixed | neutral)]
        fixed = {k: [0] for k in simt.THREAD_KNOBS}
        return [Family("mma", self.constraints(problem), fixed=fixed | neutral)]

    def starting_points(self, problem: ConvolutionProblem) -> list[Point]:
        """IREE's own defaults for resnet50 (IREE_STARTING, POINTWISE_STARTING; the strided,
        depthwise and grouped forms': cuda_simt_convolution's), each tile cut to the
        problem's candidates and each warp's share to its tile (small images have no
        64-column tile). The op form's: the kernel families' (the Triton family's
        TRITON_STARTING)."""
        if problem.op_form:
            return [p for f in self.kernel_families() for p in f.starting_points(problem, self)]
        points: list[Point] = []
        for values in _starting_table(problem):
            point = dict(zip(IREE_KNOBS, values, strict=True))
            for role, knob in tile_knobs(problem).items():
                fitting = [v for v in self.candidates(knob, problem) if v <= point[knob]]
                point[knob] = max(fitting, default=point[knob])
                share = max(point[knob] // mma_extent(problem, role), 1)
                warp = WARP_KNOB[role if role != "g" else "f"]
                point[warp] = min(point[warp], share)
            if point not in points:
                points.append(point)
        return points

    def candidates(self, knob: str, problem: ConvolutionProblem) -> list[int]:
        """Powers of two, up to the loop's size rounded up (IREE pads a partial tile)."""

        def upto(role: str, low: int, high: int) -> list[int]:
            bound = 2 ** math.ceil(math.log2(max(problem.size(role), 1)))
            return powers_of_two(low, min(bound, high)) or [low]

        if knob == "n_tile":
            return upto("n", 1, 4)
        if knob == "oh_tile":
            return upto("oh", 1, 8)
        plain = uses_simt(problem)
        if knob == "ow_tile":
            return upto("ow", 1 if plain else mma_extent(problem, "ow"), 64)
        if knob == "f_tile":
            return upto(problem.channel, 1 if plain else mma_extent(problem, "f"), 256)
        if knob == "k_tile" and problem.grouped:  # a group's few input channels
            return [v for v in powers_of_two(1, 64) if problem.size("c") % v == 0]
        if knob == "k_tile":
            return [16, 32, 64, 128]
        if knob in MMA_SHARES:
            return [1, 2, 4]
        if knob in simt.THREAD_KNOBS:
            return [1, 2, 4, 8]
        if knob == "conv_kernel":
            return [IREE, *(f.selector[1] for f in self.kernel_families())]
        for family in self.kernel_families():
            if knob in {k.name for k in family.knobs}:
                return family.space(problem, self, {}).candidates[knob]
        raise KeyError(knob)

    def constraints(self, problem: ConvolutionProblem) -> list[Constraint]:
        """The mma configurations' rules (the strided form's: cuda_strided_convolution)."""
        every = (*TILE_KNOB.values(), *MMA_SHARES)
        return [
            Constraint(
                "a warp's share does not divide the workgroup tile",
                every,
                lambda p, x: _shares_divide(p, x),
            ),
            Constraint(
                f"not 2 to {MAX_WARPS} warps (a power of two)",
                every,
                lambda p, x: warps(p, x) in powers_of_two(2, MAX_WARPS),
            ),
            Constraint(
                f"shared memory over the {self.arch} limit",
                ("n_tile", "oh_tile", "ow_tile", "f_tile", "k_tile"),
                lambda p, x: shared_memory(p, x) <= self.shared_memory_bytes,
            ),
            Constraint(
                "the reduction step is longer than the reduction",
                ("k_tile",),
                lambda p, x: x["k_tile"] <= max(16, p.size("c") * p.size("kh") * p.size("kw")),
            ),
        ]

    def lowering_config(self, problem: ConvolutionProblem, point: Point) -> str:
        if uses_simt(problem):
            return simt.lowering_config(problem, point, tile_knobs(problem))
        kind = MMA_FOR_TYPES[(problem.lhs_type, problem.acc_type)]
        loops = config_loops(problem)
        workgroup = [point[TILE_KNOB[r]] if r in TILE_KNOB else int(r != "c") for r in loops]
        subgroup = [point[WARP_KNOB[r]] if r in WARP_KNOB else int(r != "c") for r in loops]
        padding = [
            point["k_tile"] if r == "c" else w for r, w in zip(loops, workgroup, strict=True)
        ]
        steps = [point["k_tile"] // mma_k(kind) if r == "c" else 0 for r in loops]
        config = (
            f"#iree_gpu.lowering_config<{{convert_acc_gemm, mma_kind = "
            f"#iree_gpu.mma_layout<{kind}>, padding = {padding}, "
            f"promote_operands = [0, 1], reduction = {steps}, "
            f"subgroup = {subgroup}, workgroup = {workgroup}}}>"
        )
        igemm = "true" if problem.form == WINDOW else "false"
        options = (
            f"{{gpu_pipeline_options = #iree_gpu.pipeline_options<prefetch_num_stages = {STAGES}"
            f", no_reduce_shared_memory_bank_conflicts = false, use_igemm_convolution = {igemm}>}}"
        )
        translation = (
            "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> "
            f"workgroup_size = [{warps(problem, point) * WARP}, 1, 1] subgroup_size = {WARP}, "
            f"{options}>"
        )
        return (
            f"#iree_codegen.compilation_info<lowering_config = {config}, "
            f"translation_info = {translation}>"
        )

    def config_name(self, point: Point) -> str:
        family = family_of(point)
        if family is not None:
            return family.config_name(point)
        if point.get("thread_f"):
            return simt.config_name(point)
        tile = "x".join(str(point[k]) for k in ("n_tile", "oh_tile", "ow_tile", "f_tile"))
        share = "x".join(str(point[k]) for k in ("sg_n", "sg_oh", "sg_ow", "sg_f"))
        return f"igemm_wg{tile}_k{point['k_tile']}_sg{share}"

    def features(self, problem: ConvolutionProblem, point: Point) -> dict[str, float]:
        """Knobs (log2) and what they imply: workgroups against the SMs, warps, shared
        memory, and the tile's reuse (multiply-adds per element loaded)."""
        numeric = [k.name for k in CONVOLUTION_KNOBS if not k.choices]
        knobs = {f"log2_{k}": math.log2(max(point.get(k, 0), 1)) for k in numeric}
        family = family_of(point)
        if family is not None:
            return {**knobs, **family.features(problem, point, self)}
        if uses_simt(problem):
            sizes = tile_knobs(problem)
            return {**knobs, **simt.features(problem, point, sizes, self.sm_count)}
        tiles = {r: point[TILE_KNOB[r]] for r in TILE_KNOB}
        workgroups = math.prod(math.ceil(problem.size(r) / t) for r, t in tiles.items())
        pixels = tiles["n"] * tiles["oh"] * tiles["ow"]
        waves = workgroups / self.sm_count
        return {
            **knobs,
            "log2_workgroups": math.log2(workgroups),
            "waves": waves,
            "wave_efficiency": waves / math.ceil(waves),
            "warps": float(warps(problem, point)),
            "shared_memory_fraction": shared_memory(problem, point) / self.shared_memory_bytes,
            "tile_intensity": pixels * tiles["f"] / (pixels + tiles["f"]),
        }
