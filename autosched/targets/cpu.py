"""IREE's llvm-cpu backend: DoubleTilingExpert tiles, run on local-task."""

from __future__ import annotations

import math

from autosched.ops.matmul import MatmulProblem
from autosched.targets.base import Constraint, KnobSpec, Point, Target, problem_candidates

# IREE's llvm-cpu backend refuses vectors of 512 native vectors or more (its
# iree-llvmcpu-max-allowed-number-of-native-vectors); with 32-byte AVX2 vectors that is
# 16384 bytes, and the largest vector of a matmul is the vec_m x vec_n x vec_k contraction
# (measured: 16x16x16 f32 fails, 16x16x8 compiles).
MAX_VECTOR_BYTES = 512 * 32
# A tile divides its dimension, unless no power of two from 8 up to 256 does (a ViT's 197
# tokens, or 37): then IREE's llvm-cpu pipeline runs a last, partial tile. On the 2-core VM
# every checked point of 197x768x768, 197x3072x768 and 12 batches of 197x197x64 f32 was
# right, and the best ran 3.3x, 7.0x and 14.7x faster than IREE's default; the tiny ViT's
# attention over 37 keys (partial key tiles) 4.1x, the model 1.52x. Such dimensions had no
# point at all before (benchmarks/results/cpu_partial_tiles.md).
WHOLE_TILES = (8, 16, 32, 64, 128, 256)
BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1}


def _lead(problem: MatmulProblem) -> list[int]:
    """The batch loop comes first in a batch_matmul's tile lists; it is never tiled above 1."""
    return [1] if problem.batch else []


def tiles_fit(dim: int, tile: int) -> bool:
    """Whether a tile fits a dimension: it divides it, or no whole tile of WHOLE_TILES does
    (then the last tile is partial)."""
    return dim % tile == 0 or not any(dim % t == 0 for t in WHOLE_TILES if t <= dim)


def fits_role(knob: str, role: str) -> Constraint:
    """The rule that `knob` tiles the loops of `role` (`problem.size`): `tiles_fit`."""
    return Constraint(
        f"{knob} does not divide {role}", (knob,), lambda p, x: tiles_fit(p.size(role), x[knob])
    )


def _widest(problem: MatmulProblem) -> int:
    return max(BYTES[t] for t in (problem.lhs_type, problem.rhs_type, problem.acc_type))


def cpu_compilation_info(tiles: dict[str, str], pipeline: str = "DoubleTilingExpert") -> str:
    """The `compilation_info` of an llvm-cpu configuration: the lowering config's tile lists
    (`distribution`, `vector_common_parallel`, ... in IREE's order) and the pipeline."""
    listed = ", ".join(f"{name} = {value}" for name, value in tiles.items())
    return (
        f"#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<{listed}>, "
        "translation_info = #iree_codegen.translation_info<pipeline = "
        f"#iree_cpu.pipeline<{pipeline}>>>"
    )


def _list(values: list[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


# Measured first where the space has them (tile_m, tile_n, vec_m, vec_n, vec_k): the two
# points within 5 % of the best on both f32 landscapes re-timed on the project's 2-core VM
# (benchmarks/results/cpu_landscapes.md): 1.43x and 1.40x IREE's default at 512^3, 1.55x
# both at 256x1024x512, where the median point is level with the default (1.01x) and 16 of
# the 416 points are over 1.4x.
CPU_STARTING = ((64, 256, 8, 16, 8), (16, 128, 8, 16, 4))


class CpuTarget(Target):
    name = "cpu"
    default_device = "local-task"
    default_dispatch_repeat = 1
    kind_targets = {
        "attention": ("autosched.targets.cpu_attention", "CpuAttentionTarget"),
        "convolution": ("autosched.targets.cpu_convolution", "CpuConvolutionTarget"),
        "gather": ("autosched.targets.cpu_gather", "CpuGatherTarget"),
    }
    knobs = (
        KnobSpec("tile_m", "rows of C per workgroup (distribution tile)"),
        KnobSpec("tile_n", "columns of C per workgroup (distribution tile)"),
        KnobSpec("vec_m", "rows of the vector (register) tile"),
        KnobSpec("vec_n", "columns of the vector (register) tile"),
        KnobSpec("vec_k", "reduction elements per vector step"),
    )

    def starting_points(self, problem: MatmulProblem) -> list[Point]:
        """CPU_STARTING, where the problem's space has them."""
        knobs = ("tile_m", "tile_n", "vec_m", "vec_n", "vec_k")
        return [dict(zip(knobs, values, strict=True)) for values in CPU_STARTING]

    def candidates(self, knob: str, problem: MatmulProblem) -> list[int]:
        # Tiles under 8 (vectors under 4) only where the dimension itself is that small: an
        # M or N under 8 (ONNX's Gemm and MatMul node tests) had no tile at all.
        if knob == "tile_m":
            return problem_candidates(problem.m, min(8, problem.m), 256)
        if knob == "tile_n":
            return problem_candidates(problem.n, min(8, problem.n), 256)
        if knob == "vec_m":
            return problem_candidates(problem.m, 1, 16)
        if knob == "vec_n":
            return problem_candidates(problem.n, min(4, problem.n), 64)
        if knob == "vec_k":
            return problem_candidates(problem.k, 1, 16)
        raise KeyError(knob)

    def constraints(self, problem: MatmulProblem) -> list[Constraint]:
        return [
            Constraint(
                "tile_m does not divide M", ("tile_m",), lambda p, x: tiles_fit(p.m, x["tile_m"])
            ),
            Constraint(
                "tile_n does not divide N", ("tile_n",), lambda p, x: tiles_fit(p.n, x["tile_n"])
            ),
            Constraint(
                "vec_m does not divide tile_m",
                ("tile_m", "vec_m"),
                lambda p, x: x["vec_m"] > 0 and x["tile_m"] % x["vec_m"] == 0,
            ),
            Constraint(
                "vec_n does not divide tile_n",
                ("tile_n", "vec_n"),
                lambda p, x: x["vec_n"] > 0 and x["tile_n"] % x["vec_n"] == 0,
            ),
            Constraint(
                "vec_k does not divide K",
                ("vec_k",),
                lambda p, x: x["vec_k"] > 0 and p.k % x["vec_k"] == 0,
            ),
            Constraint(
                f"vector contraction of {MAX_VECTOR_BYTES} bytes or more",
                ("vec_m", "vec_n", "vec_k"),
                lambda p, x: x["vec_m"] * x["vec_n"] * x["vec_k"] * _widest(p) < MAX_VECTOR_BYTES,
            ),
        ]

    def lowering_config(self, problem: MatmulProblem, point: Point) -> str:
        lead = _lead(problem)
        return cpu_compilation_info(
            {
                "distribution": _list([*lead, point["tile_m"], point["tile_n"], 0]),
                "vector_common_parallel": _list([*lead, point["vec_m"], point["vec_n"], 0]),
                "vector_reduction": _list([*[0] * len(lead), 0, 0, point["vec_k"]]),
            }
        )

    def compile_flags(self) -> list[str]:
        return [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host",
            *self.input_flags,
        ]

    def config_name(self, point: Point) -> str:
        return (
            f"tile_{point['tile_m']}x{point['tile_n']}"
            f"_vec_{point['vec_m']}x{point['vec_n']}x{point['vec_k']}"
        )

    def features(self, problem: MatmulProblem, point: Point) -> dict[str, float]:
        """Knobs (log2) and what they imply for caches, registers and the cores' share."""
        tm, tn, vm, vn, vk = (point[k] for k in self.knob_names)
        workgroups = (problem.m // tm) * (problem.n // tn) * max(problem.batch, 1)
        element = _widest(problem)
        return {
            **{f"log2_{k}": math.log2(point[k]) for k in self.knob_names},
            "log2_workgroups": math.log2(workgroups),
            "even_workgroups": float(workgroups % 2 == 0),
            "accumulator_vectors": vm * vn * element / 32,  # 32-byte (AVX2) registers
            "full_vector_width": float(vn * element % 32 == 0),
            "log2_contraction": math.log2(vm * vn * vk),
            "log2_panel_bytes": math.log2((tm + tn) * problem.k * element),  # A and B panels
            "log2_tile_bytes": math.log2(tm * tn * element),
            "tile_intensity": tm * tn / (tm + tn),
        }
