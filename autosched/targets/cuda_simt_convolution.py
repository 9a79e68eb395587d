"""Strided 1x1 convolutions on IREE's CUDA backend: plain (SIMT) `TileAndFuse` tiles.

The image is read through `d * stride` (ops/convolution.py, the `strided` form), so the op
is no contraction to IREE and no mma intrinsic takes it ("expected indexing map 0 to be a
projected permutation", sm_80). IREE's default is a reduction: one output element per
workgroup of 32 threads (resnet50's three took 8.4-9.4 ms each on the H200). Here each
thread computes `thread_f` output channels x `thread_ow` output columns of a workgroup's
tile, `k_tile` input channels per step, both operands staged in shared memory. The lists
run over the op's own loops.
"""

from __future__ import annotations

import math

from autosched.ops.convolution import ConvolutionProblem
from autosched.targets.base import Constraint, Point
from autosched.targets.cuda import ELEMENT_BYTES

# Points of the strided space measured first, in CONVOLUTION_KNOBS' order (the mma warp
# shares pinned to 1): 256 threads each, 8 outputs a thread.
STRIDED_STARTING = (
    (1, 1, 32, 64, 16, 1, 1, 1, 1, 4, 2),
    (1, 2, 16, 64, 32, 1, 1, 1, 1, 4, 2),
    (1, 1, 16, 128, 16, 1, 1, 1, 1, 8, 1),
)
THREAD_KNOB = {"f": "thread_f", "ow": "thread_ow"}
MAX_THREADS = 1024


def threads(point: Point) -> int:
    """A workgroup's threads: one per `thread_f` x `thread_ow` outputs of its tile."""
    per_f = point["f_tile"] // point["thread_f"]
    per_ow = point["ow_tile"] // point["thread_ow"]
    return point["n_tile"] * point["oh_tile"] * per_f * per_ow


def shared_memory(problem: ConvolutionProblem, point: Point) -> int:
    """Bytes of the staged image tile (its strided reads compacted) and filter tile."""
    pixels = point["n_tile"] * point["oh_tile"] * point["ow_tile"]
    return ELEMENT_BYTES[problem.lhs_type] * point["k_tile"] * (pixels + point["f_tile"])


def constraints(problem: ConvolutionProblem, shared_limit: int) -> list[Constraint]:
    tiles = ("n_tile", "oh_tile", "ow_tile", "f_tile", "thread_f", "thread_ow")
    return [
        Constraint(
            "a thread's outputs do not divide the workgroup tile",
            ("f_tile", "ow_tile", "thread_f", "thread_ow"),
            lambda p, x: x["f_tile"] % x["thread_f"] == 0 and x["ow_tile"] % x["thread_ow"] == 0,
        ),
        Constraint(
            f"not a multiple of 32 threads up to {MAX_THREADS}",
            tiles,
            lambda p, x: threads(x) % 32 == 0 and threads(x) <= MAX_THREADS,
        ),
        Constraint(
            "k_tile does not divide the input channels",
            ("k_tile",),
            lambda p, x: p.size("c") % x["k_tile"] == 0,
        ),
        Constraint(
            "shared memory over the limit",
            ("n_tile", "oh_tile", "ow_tile", "f_tile", "k_tile"),
            lambda p, x: shared_memory(p, x) <= shared_limit,
        ),
    ]


def lowering_config(problem: ConvolutionProblem, point: Point, tile_knob: dict) -> str:
    """TileAndFuse with thread tiles over the op's loops (the reduction in elements)."""
    loops = problem.loops
    workgroup = [point[tile_knob[r]] if r in tile_knob else 0 for r in loops]
    thread = [point[THREAD_KNOB[r]] if r in THREAD_KNOB else int(r != "c") for r in loops]
    reduction = [point["k_tile"] if r == "c" else 0 for r in loops]
    config = (
        f"#iree_gpu.lowering_config<{{promote_operands = [0, 1], reduction = {reduction}, "
        f"thread = {thread}, workgroup = {workgroup}}}>"
    )
    translation = (
        "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> "
        f"workgroup_size = [{threads(point)}, 1, 1] subgroup_size = 32>"
    )
    return (
        f"#iree_codegen.compilation_info<lowering_config = {config}, "
        f"translation_info = {translation}>"
    )


def config_name(point: Point) -> str:
    tile = "x".join(str(point[k]) for k in ("n_tile", "oh_tile", "ow_tile", "f_tile"))
    return f"simt_wg{tile}_k{point['k_tile']}_th{point['thread_f']}x{point['thread_ow']}"


def features(problem: ConvolutionProblem, point: Point, sm_count: int) -> dict[str, float]:
    """What a point implies beyond its knobs: workgroups against the SMs, threads."""
    sizes = {"n": "n_tile", "oh": "oh_tile", "ow": "ow_tile", "f": "f_tile"}
    workgroups = math.prod(math.ceil(problem.size(r) / point[k]) for r, k in sizes.items())
    waves = workgroups / sm_count
    return {
        "log2_workgroups": math.log2(workgroups),
        "waves": waves,
        "wave_efficiency": waves / math.ceil(waves),
        "log2_threads": math.log2(threads(point)),
        "outputs_per_thread": float(point["thread_f"] * point["thread_ow"]),
    }
