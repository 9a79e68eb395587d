"""Attention on IREE's llvm-cpu backend: `LinalgExtTileAndVectorize` tiles of the online
attention, in its own loop order (the roles come from `AttentionProblem.loops`).

IREE's default for transformers' small Llama layer (64 query rows, head dim 32) is
`distribution = [1, 1, 32, 32, 0, 0]`, `vector_common_parallel = [1, 1, 8, 16, 0, 0]`,
`vector_reduction = [0, 0, 0, 0, 0, 16]`: query rows per workgroup, the vector tile over
query rows and value columns, and key rows per step of the online softmax. Those are the
knobs; the head dims stay whole (the distribution keeps all of N, the Q.K reduction all of K1).
"""

from __future__ import annotations

import math

from autosched.ops.attention import AttentionProblem
from autosched.targets.base import (
    Constraint,
    KnobSpec,
    Point,
    by_role,
    divides_role,
    problem_candidates,
)
from autosched.targets.cpu import MAX_VECTOR_BYTES, CpuTarget, cpu_compilation_info, fits_role

ATTENTION_KNOBS = (
    KnobSpec("q_tile", "query rows per workgroup (attention)"),
    KnobSpec("q_vec", "query rows of the vector tile (attention)"),
    KnobSpec("n_vec", "value columns of the vector tile (attention)"),
    KnobSpec("kv_tile", "key rows per online-softmax step (attention)"),
)


class CpuAttentionTarget(CpuTarget):
    knobs = ATTENTION_KNOBS

    def candidates(self, knob: str, problem: AttentionProblem) -> list[int]:
        m, n, k2 = (problem.size(r) for r in ("m", "n", "k2"))
        if knob == "q_tile":
            return problem_candidates(m, min(8, m), 128)
        if knob == "q_vec":
            return problem_candidates(m, 1, 16)
        if knob == "n_vec":
            return problem_candidates(n, min(4, n), 32)
        if knob == "kv_tile":
            return problem_candidates(k2, min(4, k2), 64)
        raise KeyError(knob)

    def constraints(self, problem: AttentionProblem) -> list[Constraint]:
        return [
            fits_role("q_tile", "m"),
            Constraint(
                "q_vec does not divide q_tile",
                ("q_tile", "q_vec"),
                lambda p, x: x["q_tile"] % x["q_vec"] == 0,
            ),
            divides_role("n_vec", "n"),
            fits_role("kv_tile", "k2"),  # a partial key tile too: checked answers were right
            # Measured: q_vec 8 x kv_tile 32 x K1 32 in f32 (32768 bytes) fails to compile,
            # IREE's default 8 x 16 x 32 (16384 bytes) compiles.
            Constraint(
                f"a Q.K or P.V vector over {MAX_VECTOR_BYTES} bytes",
                ("q_vec", "n_vec", "kv_tile"),
                lambda p, x: (
                    max(p.size("k1"), x["n_vec"]) * x["q_vec"] * x["kv_tile"] * 4
                    <= MAX_VECTOR_BYTES
                ),
            ),
        ]

    def supports(self, problem: AttentionProblem) -> str | None:
        return None

    def dispatch_repeat(self, problem: AttentionProblem) -> int:
        return self.default_dispatch_repeat

    def lowering_config(self, problem: AttentionProblem, point: Point) -> str:
        distribution = {"b": 1, "m": point["q_tile"], "n": problem.size("n")}
        vectors = {"b": 1, "m": point["q_vec"], "n": point["n_vec"]}
        return cpu_compilation_info(
            {
                "distribution": by_role(problem, distribution),
                "vector_common_parallel": by_role(problem, vectors),
                "vector_reduction": by_role(problem, {"k2": point["kv_tile"]}),
            },
            "LinalgExtTileAndVectorize",
        )

    def config_name(self, point: Point) -> str:
        return f"q{point['q_tile']}_vec_{point['q_vec']}x{point['n_vec']}_kv{point['kv_tile']}"

    def features(self, problem: AttentionProblem, point: Point) -> dict[str, float]:
        """Knobs (log2) and what they imply: workgroups, the score tile, the K/V bytes read
        per step."""
        workgroups = math.prod(problem.batch_sizes) * problem.size("m") // point["q_tile"]
        return {
            **{f"log2_{k}": math.log2(point[k]) for k in self.knob_names},
            "log2_workgroups": math.log2(workgroups),
            "log2_score_tile": math.log2(point["q_vec"] * point["kv_tile"]),
            "log2_step_bytes": math.log2(
                point["kv_tile"] * (problem.size("k1") + problem.size("n")) * 4
            ),
        }
