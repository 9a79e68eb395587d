"""Gathers (an embedding's lookup) on IREE's llvm-cpu backend: `DoubleTilingExpert` tiles
over (tokens, width), as IREE configures any elementwise op.

IREE's default for the tiny causal LM's embedding (16 tokens, width 64, f32) is
`distribution = [16, 64]`, `vector_common_parallel = [1, 16]`: tokens and width per
workgroup, and one token's `width_vec` elements a vector copy. Those are the knobs; the
vector tile keeps one token (each token's row starts at its own id).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autosched.ops.gather import GatherProblem
from autosched.targets.base import (
    Constraint,
    KnobSpec,
    Point,
    by_role,
    divides_role,
    problem_candidates,
)
from autosched.targets.cpu import BYTES, CpuTarget, cpu_compilation_info

GATHER_KNOBS = (
    KnobSpec("t_tile", "tokens per workgroup (gather)"),
    KnobSpec("d_tile", "elements of each row per workgroup (gather)"),
    KnobSpec("d_vec", "elements of a row a vector copies (gather)"),
)


@dataclass(frozen=True)
class GatherBounds:
    """A backend's limits on the knobs: most tokens a workgroup, fewest row elements a
    workgroup, most elements a vector (or a thread) copies."""

    tokens: int
    width: int
    vector: int


def gather_candidates(knob: str, problem: GatherProblem, bounds: GatherBounds) -> list[int]:
    """Divisors of the tokens and the width (problem_candidates) within a backend's bounds."""
    if knob == "t_tile":
        return problem_candidates(problem.tokens, 1, bounds.tokens)
    if knob == "d_tile":
        return problem_candidates(problem.width, min(bounds.width, problem.width), 4096)
    if knob == "d_vec":
        return problem_candidates(problem.width, 1, bounds.vector)
    raise KeyError(knob)


def gather_constraints() -> list[Constraint]:
    """Both backends': whole tiles, and a vector (a thread's share) inside a row's tile."""
    return [
        divides_role("t_tile", "t"),
        divides_role("d_tile", "d"),
        Constraint(
            "d_vec does not divide d_tile",
            ("d_tile", "d_vec"),
            lambda p, x: x["d_tile"] % x["d_vec"] == 0,
        ),
    ]


class CpuGatherTarget(CpuTarget):
    knobs = GATHER_KNOBS

    def starting_points(self, problem: GatherProblem) -> list[Point]:
        return []

    def candidates(self, knob: str, problem: GatherProblem) -> list[int]:
        return gather_candidates(knob, problem, GatherBounds(tokens=256, width=8, vector=64))

    def constraints(self, problem: GatherProblem) -> list[Constraint]:
        return gather_constraints()

    def supports(self, problem: GatherProblem) -> str | None:
        return None

    def dispatch_repeat(self, problem: GatherProblem) -> int:
        return self.default_dispatch_repeat

    def lowering_config(self, problem: GatherProblem, point: Point) -> str:
        distribution = {"t": point["t_tile"], "d": point["d_tile"]}
        return cpu_compilation_info(
            {
                "distribution": by_role(problem, distribution),
                "vector_common_parallel": by_role(problem, {"t": 1, "d": point["d_vec"]}),
            }
        )

    def config_name(self, point: Point) -> str:
        return f"t{point['t_tile']}_d{point['d_tile']}_vec{point['d_vec']}"

    def features(self, problem: GatherProblem, point: Point) -> dict[str, float]:
        """Knobs (log2) and what they imply: workgroups, and the bytes a vector copies."""
        workgroups = (problem.tokens // point["t_tile"]) * (problem.width // point["d_tile"])
        return {
            **{f"log2_{k}": math.log2(point[k]) for k in self.knob_names},
            "log2_workgroups": math.log2(workgroups),
            "even_workgroups": float(workgroups % 2 == 0),
            "log2_vector_bytes": math.log2(point["d_vec"] * BYTES[problem.element]),
        }
