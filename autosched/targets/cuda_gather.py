"""Gathers (an embedding's lookup) on IREE's CUDA backend: `TileAndFuse` over (tokens,
width), as IREE configures any elementwise op there.

IREE's default for the tiny cached Llama's embedding (8 tokens, width 64, bf16, sm_90) is
`workgroup = [4, 32]`, `thread = [1, 4]`, 32 threads: tokens and width per workgroup, and a
thread's share of one token's row. Those are the knobs (ops/gather.py says what a gather
is); the workgroup size follows from them, one thread per `d_vec` elements of a token.
"""

from __future__ import annotations

import math

from autosched.kernels.base import WARP
from autosched.ops.gather import GatherProblem
from autosched.targets.base import Constraint, Family, Point
from autosched.targets.cpu_gather import (
    GATHER_KNOBS,
    GatherBounds,
    gather_candidates,
    gather_constraints,
)
from autosched.targets.cuda import CudaTarget
from autosched.targets.cuda_rules import ELEMENT_BYTES

MAX_THREADS = 1024
# IREE's default for the cached Llama's 8x64 embedding, then wider rows a workgroup and
# 8 or 16 bytes a thread (one vector load of a row's bytes).
STARTING = ((4, 32, 4), (1, 64, 4), (4, 64, 8), (8, 128, 8))


def threads(point: Point) -> int:
    """A workgroup's threads: one per `d_vec` elements of each of its tokens' rows."""
    return point["t_tile"] * point["d_tile"] // point["d_vec"]


class CudaGatherTarget(CudaTarget):
    root_kind = "gather"
    knobs = GATHER_KNOBS

    def supports(self, problem: GatherProblem) -> str | None:
        return None

    def dispatch_repeat(self, problem: GatherProblem) -> int:
        """About 50 ms of copying per timed call, at about a TB/s, up to 200 dispatches."""
        estimate_s = 2 * problem.flops * ELEMENT_BYTES[problem.element] / 1e12
        return int(min(200, max(1, math.ceil(0.05 / max(estimate_s, 1e-9)))))

    def families(self, problem: GatherProblem, lists) -> list[Family]:
        """One space: IREE's configurations (no kernel family copies rows)."""
        return [Family("", self.constraints(problem))]

    def starting_points(self, problem: GatherProblem) -> list[Point]:
        return [dict(zip(("t_tile", "d_tile", "d_vec"), v, strict=True)) for v in STARTING]

    def candidates(self, knob: str, problem: GatherProblem) -> list[int]:
        return gather_candidates(knob, problem, GatherBounds(tokens=64, width=WARP, vector=16))

    def constraints(self, problem: GatherProblem) -> list[Constraint]:
        """The CPU's, and whole warps: one thread per `d_vec` elements of each token."""
        return [
            *gather_constraints(),
            Constraint(
                f"not a multiple of {WARP} threads up to {MAX_THREADS}",
                ("t_tile", "d_tile", "d_vec"),
                lambda p, x: threads(x) % WARP == 0 and threads(x) <= MAX_THREADS,
            ),
        ]

    def workgroup_size(self, point: Point) -> list[int]:
        return [threads(point), 1, 1]

    def lowering_config(self, problem: GatherProblem, point: Point) -> str:
        """TileAndFuse: a workgroup's tokens and width, a thread's share of one row."""
        config = (
            f"#iree_gpu.lowering_config<{{thread = [1, {point['d_vec']}], "
            f"workgroup = [{point['t_tile']}, {point['d_tile']}]}}>"
        )
        translation = (
            "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> "
            f"workgroup_size = {self.workgroup_size(point)} subgroup_size = {WARP}>"
        )
        return (
            f"#iree_codegen.compilation_info<lowering_config = {config}, "
            f"translation_info = {translation}>"
        )

    def config_name(self, point: Point) -> str:
        return f"t{point['t_tile']}_d{point['d_tile']}_th{point['d_vec']}"

    def features(self, problem: GatherProblem, point: Point) -> dict[str, float]:
        """Knobs (log2) and what they imply: workgroups against the SMs, threads, and the
        bytes a thread copies."""
        workgroups = (problem.tokens // point["t_tile"]) * (problem.width // point["d_tile"])
        return {
            **{f"log2_{k}": math.log2(point[k]) for k in self.knob_names},
            "log2_workgroups": math.log2(workgroups),
            "waves": workgroups / self.sm_count,
            "log2_threads": math.log2(threads(point)),
            "log2_thread_bytes": math.log2(point["d_vec"] * ELEMENT_BYTES[problem.element]),
        }
