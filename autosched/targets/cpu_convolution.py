"""Convolutions on IREE's llvm-cpu backend: `ConvTileAndDecomposeExpert` tiles, in the
convolution's own loop order (the roles come from `ConvolutionProblem.loops`).

IREE's default for torchvision's resnet18 3x3 convolutions (NCHW, batch 1) is
`distribution = [0, 8, 16, 16, 0, 0, 0]` (output channels and the image's rows and columns
per workgroup), `vector_common_parallel = [1, 8, 1, 8, 0, 0, 0]` (output channels and
columns of the vector tile; one row, as the pipeline decomposes the 2-D convolution into
1-D ones) and `vector_reduction = [0, 0, 0, 0, 8, 1, 1]` (input channels per step, one
filter tap at a time). Those are the knobs. A pointwise (1x1) convolution, a contraction,
takes the same knobs on IREE's `DoubleTilingExpert`, its default's pipeline (resnet18's:
`distribution = [1, 32, 8, 8, 0]`, `vector_common_parallel = [1, 1, 2, 8, 0]`,
`vector_reduction = [0, 0, 0, 0, 16]`), and so do a strided 1x1 one (resnet50's
downsampling, read through `d * 2`; its default: `distribution = [2, 32, 8, 8, 0]`,
`vector_common_parallel = [1, 1, 1, 8, 0]`, `vector_reduction = [0, 0, 0, 0, 32]` over
(n, f, oh, ow, c)) and a depthwise one (its channel loop, the depth `g`, takes f_tile and
f_vec; mobilenet_v3's default: `distribution = [1, 4, 16, 16, 0, 0]` over (n, oh, ow, g,
kh, kw)).
"""

from __future__ import annotations

import math

from autosched.ops.convolution import POINTWISE, STRIDED, ConvolutionProblem
from autosched.targets.base import (
    Constraint,
    KnobSpec,
    Point,
    by_role,
    divides_role,
    problem_candidates,
)
from autosched.targets.cpu import MAX_VECTOR_BYTES, CpuTarget, cpu_compilation_info

CONVOLUTION_KNOBS = (
    KnobSpec("f_tile", "output channels per workgroup (convolution)"),
    KnobSpec("oh_tile", "output rows per workgroup (convolution)"),
    KnobSpec("ow_tile", "output columns per workgroup (convolution)"),
    KnobSpec("f_vec", "output channels of the vector tile (convolution)"),
    KnobSpec("ow_vec", "output columns of the vector tile (convolution)"),
    KnobSpec("c_vec", "input channels per reduction step (convolution)"),
)
# Measured on resnet18 (tests/test_convolution.py): with a batch of 1, IREE 3.13 folds the
# batch loop at `flow` and brings it back after a spec has applied, and the op it brings
# back carries no configuration, in the model and in the dispatch alone. Only the dispatch
# benchmark (compiled from executable sources, where the loop is back) takes the spec, so a
# candidate could be timed but never checked or applied. With a batch of 2 the form holds.
UNIT_BATCH = (
    "convolution with a batch of 1: IREE 3.13 drops a spec's configuration when it brings "
    "the folded batch loop back"
)
ROLE_OF = {"oh_tile": "oh", "ow_tile": "ow", "ow_vec": "ow"}  # f_tile, f_vec: the channel


def role_of(knob: str, problem: ConvolutionProblem) -> str:
    """The loop a knob tiles: the output channel's (`g` in a depthwise convolution) for
    f_tile and f_vec."""
    return ROLE_OF.get(knob) or problem.channel


def _within(vector: str, tile: str) -> Constraint:
    return Constraint(
        f"{vector} does not divide {tile}",
        (tile, vector),
        lambda p, x: x[tile] % x[vector] == 0,
    )


class CpuConvolutionTarget(CpuTarget):
    knobs = CONVOLUTION_KNOBS

    def candidates(self, knob: str, problem: ConvolutionProblem) -> list[int]:
        if knob == "c_vec":
            return problem_candidates(problem.size("c"), 1, 16)
        size = problem.size(role_of(knob, problem))
        if knob == "f_tile":
            return problem_candidates(size, min(8, size), 64)
        if knob in ("oh_tile", "ow_tile"):
            return problem_candidates(size, 1, 32)
        return problem_candidates(size, 1, 16)  # f_vec, ow_vec

    def constraints(self, problem: ConvolutionProblem) -> list[Constraint]:
        return [
            divides_role("f_tile", problem.channel),
            divides_role("oh_tile", "oh"),
            divides_role("ow_tile", "ow"),
            _within("f_vec", "f_tile"),
            _within("ow_vec", "ow_tile"),
            divides_role("c_vec", "c"),
            Constraint(
                f"a vector contraction over {MAX_VECTOR_BYTES} bytes",
                ("f_vec", "ow_vec", "c_vec"),
                lambda p, x: x["f_vec"] * x["ow_vec"] * x["c_vec"] * 4 < MAX_VECTOR_BYTES,
            ),
        ]

    def supports(self, problem: ConvolutionProblem) -> str | None:
        if "n" in problem.loops and problem.size("n") == 1:
            return UNIT_BATCH
        return None

    def dispatch_repeat(self, problem: ConvolutionProblem) -> int:
        return self.default_dispatch_repeat

    def lowering_config(self, problem: ConvolutionProblem, point: Point) -> str:
        one = {"n": 1, "g": 1}
        channel = problem.channel
        distribution = {**one, channel: point["f_tile"]}
        distribution.update(oh=point["oh_tile"], ow=point["ow_tile"])
        vectors = {**one, channel: point["f_vec"], "oh": 1, "ow": point["ow_vec"]}
        reduction = {"c": point["c_vec"], "kh": 1, "kw": 1}
        # A pointwise convolution is a contraction, and IREE builds a strided 1x1 or a
        # depthwise one as generic loops too: DoubleTilingExpert, as their defaults.
        generic = problem.form in (POINTWISE, STRIDED) or problem.depthwise
        return cpu_compilation_info(
            {
                "distribution": by_role(problem, distribution),
                "vector_common_parallel": by_role(problem, vectors),
                "vector_reduction": by_role(problem, reduction),
            },
            "DoubleTilingExpert" if generic else "ConvTileAndDecomposeExpert",
        )

    def config_name(self, point: Point) -> str:
        return (
            f"f{point['f_tile']}_{point['oh_tile']}x{point['ow_tile']}"
            f"_vec_{point['f_vec']}x{point['ow_vec']}x{point['c_vec']}"
        )

    def features(self, problem: ConvolutionProblem, point: Point) -> dict[str, float]:
        """Knobs (log2) and what they imply: workgroups, the vector tile, the input patch."""
        tiles = point["f_tile"] * point["oh_tile"] * point["ow_tile"]
        pixels = problem.size(problem.channel) * problem.size("oh") * problem.size("ow")
        return {
            **{f"log2_{k}": math.log2(point[k]) for k in self.knob_names},
            "log2_workgroups": math.log2(pixels * problem.size("n") // tiles),
            "log2_vector": math.log2(point["f_vec"] * point["ow_vec"] * point["c_vec"]),
            "log2_patch_bytes": math.log2(
                point["oh_tile"] * point["ow_tile"] * problem.size("c") * 4
            ),
        }
