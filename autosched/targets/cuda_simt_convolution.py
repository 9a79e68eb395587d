"""Convolutions no tensor-core configuration takes, on IREE's CUDA backend: plain (SIMT)
`TileAndFuse` tiles over the op's own loops.

- A strided 1x1 convolution reads its image through `d * stride` (ops/convolution.py, the
  `strided` form): no contraction to IREE, and no mma intrinsic takes it ("expected indexing
  map 0 to be a projected permutation", sm_80). IREE's default is a reduction, one output
  element per workgroup of 32 threads (resnet50's three took 8.4-9.4 ms each on the H200).
- A depthwise convolution has no channels to reduce, so no GEMM. IREE's default (sm_80,
  mobilenet_v3) is 32 threads of one output each, `workgroup = [1, 1, 4, 8, 0, 0]` over
  (n, oh, ow, g, kh, kw), the whole filter window per step, nothing staged.
- A grouped convolution (resnext's 32 groups) is no GEMM IREE's implicit-GEMM path takes
  either. IREE's default (sm_80) is 32 threads of one output each, `workgroup = [1, 1, 1,
  2, 16, 0, 0, 0]` over (n, g, f, oh, ow, c, kh, kw), one input channel and the whole window
  a step, nothing staged.

Here each thread computes `thread_f` output channels x `thread_ow` output columns of a
workgroup's tile (of one group). A strided convolution reduces `k_tile` input channels per
step with both operands in shared memory; a grouped one `k_tile` channels of its group and
the whole window, nothing staged; a depthwise one its whole window, as IREE's defaults do.
"""

from __future__ import annotations

import math

from autosched.ops.convolution import ConvolutionProblem
from autosched.targets.base import Constraint, Point
from autosched.targets.cuda_rules import ELEMENT_BYTES

# Points measured first, in CONVOLUTION_KNOBS' order (the mma warp shares pinned to 1):
# strided, 256 threads of 8 outputs each; depthwise, IREE's defaults and two with more
# outputs per thread.
STRIDED_STARTING = (
    (1, 1, 32, 64, 16, 1, 1, 1, 1, 4, 2),
    (1, 2, 16, 64, 32, 1, 1, 1, 1, 4, 2),
    (1, 1, 16, 128, 16, 1, 1, 1, 1, 8, 1),
)
DEPTHWISE_STARTING = (
    (1, 1, 4, 8, 1, 1, 1, 1, 1, 1, 1),
    (1, 1, 2, 16, 1, 1, 1, 1, 1, 1, 1),
    (1, 1, 1, 32, 1, 1, 1, 1, 1, 1, 1),
    (1, 1, 8, 32, 1, 1, 1, 1, 1, 1, 2),
    (1, 2, 8, 32, 1, 1, 1, 1, 1, 2, 2),
)
# grouped: IREE's default (32 threads of one output), then a group's 4 channels with 4 of
# its input channels a step, and 2x2 outputs per thread.
GROUPED_STARTING = (
    (1, 2, 16, 1, 1, 1, 1, 1, 1, 1, 1),
    (1, 2, 16, 4, 4, 1, 1, 1, 1, 1, 1),
    (1, 4, 16, 4, 4, 1, 1, 1, 1, 2, 2),
)
THREAD_KNOBS = ("thread_f", "thread_ow")
MAX_THREADS = 1024


def threads(point: Point) -> int:
    """A workgroup's threads: one per `thread_f` x `thread_ow` outputs of its tile."""
    per_f = point["f_tile"] // point["thread_f"]
    per_ow = point["ow_tile"] // point["thread_ow"]
    return point["n_tile"] * point["oh_tile"] * per_f * per_ow


def staged(problem: ConvolutionProblem) -> bool:
    """Whether both operands' tiles go through shared memory (a strided 1x1 alone)."""
    return not (problem.depthwise or problem.grouped)


def shared_memory(problem: ConvolutionProblem, point: Point) -> int:
    """Bytes of the staged image tile (its strided reads compacted) and filter tile; a
    depthwise or grouped convolution stages nothing."""
    if not staged(problem):
        return 0
    pixels = point["n_tile"] * point["oh_tile"] * point["ow_tile"]
    return ELEMENT_BYTES[problem.lhs_type] * point["k_tile"] * (pixels + point["f_tile"])


def constraints(problem: ConvolutionProblem, shared_limit: int) -> list[Constraint]:
    tiles = ("n_tile", "oh_tile", "ow_tile", "f_tile", *THREAD_KNOBS)
    return [
        Constraint(
            "a thread's outputs do not divide the workgroup tile",
            ("f_tile", "ow_tile", *THREAD_KNOBS),
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


def _reduction(problem: ConvolutionProblem, point: Point) -> dict[str, int]:
    """Each reduction loop's step: the whole filter window, and `k_tile` input channels."""
    window = {r: problem.size(r) for r in ("kh", "kw") if r in problem.loops}
    return window if problem.depthwise else {"c": point["k_tile"], **window}


def lowering_config(problem: ConvolutionProblem, point: Point, tile_knobs: dict) -> str:
    """TileAndFuse with thread tiles over the op's loops (the reduction in elements)."""
    loops = problem.loops
    steps = _reduction(problem, point)
    per_thread = {problem.channel: point["thread_f"], "ow": point["thread_ow"]}
    # A grouped convolution's workgroup takes one group (`g`, 1 in each list).
    workgroup = [point[tile_knobs[r]] if r in tile_knobs else int(r == "g") for r in loops]
    thread = [per_thread.get(r, 0 if r in steps or r in ("kh", "kw") else 1) for r in loops]
    reduction = [steps.get(r, 0) for r in loops]
    promote = "promote_operands = [0, 1], " if staged(problem) else ""
    config = (
        f"#iree_gpu.lowering_config<{{{promote}reduction = {reduction}, "
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


def features(
    problem: ConvolutionProblem, point: Point, tile_knobs: dict, sm_count: int
) -> dict[str, float]:
    """What a point implies beyond its knobs: workgroups against the SMs, threads."""
    workgroups = math.prod(math.ceil(problem.size(r) / point[k]) for r, k in tile_knobs.items())
    waves = workgroups / sm_count
    return {
        "log2_workgroups": math.log2(workgroups),
        "waves": waves,
        "wave_efficiency": waves / math.ceil(waves),
        "log2_threads": math.log2(threads(point)),
        "outputs_per_thread": float(point["thread_f"] * point["thread_ow"]),
    }
