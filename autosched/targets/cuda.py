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
from autosched.kernels.base import WARP
from autosched.kernels.registry import all_families, families_for, family_knobs, family_of
from autosched.measure.contract import runtime_flags_text
from autosched.ops.matmul import MatmulProblem
from autosched.targets.base import Constraint, Family, KnobSpec, Point, Target
from autosched.targets.cuda_rules import (
    DERIVE,
    ELEMENT_BYTES,
    MMA_FOR_TYPES,
    MMA_KINDS,
    MMA_M,
    MMA_N,
    NONE,
    iree_rules,
    iree_shared_memory,
    is_mma,
    mma_k,
    padded_tile_candidates,
    padding,
)
from autosched.targets.host import Machine

FALLBACK_ARCH = "sm_80"


# IREE's pipelines; then each matmul kernel family's value of `pipeline` (kernels/: a point
# of a Triton kernel run as an IREE custom dispatch, `Custom`).
IREE_PIPELINES = ("TileAndFuse", "VectorDistribute")
PIPELINES = (*IREE_PIPELINES, *(f.selector[1] for f in families_for("matmul")))

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

# A call of 256 dispatches of a 5 us kernel (128^3 to 1024^3 f16 on the H200) is 1.3 ms, so
# the 0.3 ms each call costs adds about 1.2 us to every dispatch. At 4096 a call that IREE's
# default and the candidates both pay less of moved the f16 suite's speedups by 0.1-0.2x
# either way (geomean 2.44-2.45x, as at 256), and tripled the small problems' compile time
# (0.46 s a candidate instead of 0.3): h200_custom_f16.md, session 9.
MAX_DISPATCH_REPEAT = 256


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
    # Llama-3.2-1B's decode step on the H100: 3.73 ms a token as given, 2.19 ms with its
    # one-row projections as IREE's GEMVs (511 dispatches a step become 235;
    # benchmarks/results/h100_decode_step.md).
    generalizes_single_rows = True
    root_kind = "matmul"  # the kind whose kernel families this view searches
    kind_targets = {
        "attention": ("autosched.targets.cuda_attention", "CudaAttentionTarget"),
        "convolution": ("autosched.targets.cuda_convolution", "CudaConvolutionTarget"),
        "gather": ("autosched.targets.cuda_gather", "CudaGatherTarget"),
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
        *family_knobs("matmul"),  # the kernel families' own (kernels/)
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

    def describe(self) -> str:
        assembled = f", kernels assembled by {self.ptxas}" if self.ptxas else ""
        custom = "".join(
            family.describe(self.config.knob_space)
            for family in all_families()
            if family.unavailable(self) is None
        )
        flags = runtime_flags_text(self.config)
        timed = f"; runtime flags: {flags}" if flags else ""
        if self.config.runtime_flags.strip() == "auto":
            timed += (
                " (the whole-model proof also tries IREE's defaults and CUDA graphs, and keeps"
                " the fastest)"
            )
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
            return iree + [
                f.selector[1] for f in self.kernel_families() if f.why_not(self, problem) is None
            ]
        if knob == "mma_kind":
            return [default]
        # Tiles under 32 only where the dimension itself is that small; with tensor cores,
        # one that covers a dimension the intrinsic does not divide.
        step = mma_k(default) if mma else 1
        if knob == "tile_m":
            return padded_tile_candidates(problem.m, min(32, problem.m), 256, MMA_M if mma else 1)
        if knob == "tile_n":
            return padded_tile_candidates(problem.n, min(32, problem.n), 256, MMA_N if mma else 1)
        if knob == "tile_k":
            return padded_tile_candidates(problem.k, 8 if simt else 16, 128 if mma else 64, step)
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
        if knob in {k.name for k in family_knobs(self.root_kind)}:
            return [DERIVE]
        raise KeyError(knob)

    def families(self, problem: MatmulProblem, lists: dict[str, list[Knob]]) -> list[Family]:
        """IREE's pipelines, and each kernel family (kernels/) that `pipeline` lists and
        that can run the problem here."""
        pipelines = lists.get("pipeline") or self.candidates("pipeline", problem)
        families = self.kernel_families()
        iree = Family(
            "iree",
            self.constraints(problem),
            fixed={
                "pipeline": [p for p in pipelines if p in IREE_PIPELINES],
                **{knob.name: [DERIVE] for knob in family_knobs(self.root_kind)},
            },
        )
        neutral = ("subgroup_m", "subgroup_n", "thread_m", "thread_n")
        neutral += ("block_dim_x", "block_dim_y", "block_dim_z")
        pinned = {"mma_kind": [NONE], "promote_operands": [1], **{k: [DERIVE] for k in neutral}}
        return [iree] + [
            family.space(problem, self, pinned)
            for family in families
            if family.selector[1] in pipelines and family.why_not(self, problem) is None
        ]

    def starting_points(self, problem: MatmulProblem) -> list[Point]:
        """The kernel families' known-good points (the matmul family's CUSTOM_STARTING, and
        SKINNY_STARTING for few rows), then IREE's on the mma intrinsics
        (IREE_MMA_STARTING), where the problem's space has them."""
        knobs = ("pipeline", "tile_m", "tile_n", "tile_k", "subgroup_m", "subgroup_n")
        iree = [dict(zip(knobs, values, strict=True)) for values in IREE_MMA_STARTING]
        families = [p for f in self.kernel_families() for p in f.starting_points(problem, self)]
        return families + iree

    def workgroup_size(self, point: Point) -> list[int]:
        """The workgroup_size IREE needs for a point's tiles."""
        family = family_of(point)
        if family is not None:
            return family.workgroup_size(point)
        if is_mma(point):
            warps = (point["tile_m"] // (MMA_M * point["subgroup_m"])) * (
                point["tile_n"] // (MMA_N * point["subgroup_n"])
            )
            return [warps * WARP, 1, 1]
        return [point["tile_n"] // point["thread_n"], point["tile_m"] // point["thread_m"], 1]

    def constraints(self, problem: MatmulProblem) -> list[Constraint]:
        """The rules of IREE's pipelines (cuda_rules.py); the kernel families' are their
        own (kernels/)."""
        return iree_rules(self, problem)

    def kernel_families(self) -> list:
        """The custom kernel families of this view's kind (kernels/registry.py)."""
        return families_for(self.root_kind)

    # ---- attribute text -----------------------------------------------------------------

    def lowering_config(self, problem: MatmulProblem, point: Point) -> str:
        lead = [1] if problem.batch else []  # the batch loop: one batch per workgroup
        zeros = [0] * len(lead)
        entries: list[str] = []  # keys in alphabetical order, as IREE prints them
        vector_distribute = point["pipeline"] == "VectorDistribute"
        if is_mma(point):
            if not vector_distribute or not problem.zero_init:
                # IREE sets convert_acc_gemm on every TileAndFuse mma matmul; an accumulating
                # matmul needs it.
                entries.append("convert_acc_gemm")
            entries.append(f"mma_kind = #iree_gpu.mma_layout<{point['mma_kind']}>")
        padded = padding(problem, point)
        if padded:
            entries.append(f"padding = {_list([*lead, *padded])}")  # a 0 divides
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
        elif is_mma(point):
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
        return family_of(point) is None

    def source_command(self, problem: MatmulProblem, point: Point, source: str) -> list[str]:
        """Custom kernels: Triton compiles the point to PTX and writes its extern module."""
        family = family_of(point)
        return [] if family is None else family.source_command(problem, point, source, self.arch)

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
        family = family_of(point)
        if family is not None:
            return family.config_name(point)
        tiles = f"wg{point['tile_m']}x{point['tile_n']}x{point['tile_k']}"
        prefix = {"TileAndFuse": "tf", "VectorDistribute": "vd"}[point["pipeline"]]
        if is_mma(point):
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
        family = family_of(point)
        custom = family is not None
        shared = (
            family.shared_memory(problem, point, self)
            if custom
            else iree_shared_memory(problem, point)
        )
        element = ELEMENT_BYTES[problem.lhs_type]
        per_thread = tm * tn / threads  # accumulator elements each thread holds
        numeric = [k.name for k in self.knobs if not k.choices]
        return {
            **{f"log2_{k}": math.log2(max(int(point[k]), 1)) for k in numeric},
            "is_mma": float(is_mma(point)),
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
