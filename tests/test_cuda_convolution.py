"""Convolutions on CUDA (issue 25): IREE's implicit-GEMM `TileAndFuse` configurations on the
tensor cores, on torchvision's own resnet18 in f16 (2x3x64x64, weights as arguments),
exported with iree-turbine and committed. Compiled here for sm_80 without a GPU (real
iree-compile); the run on the GPU is marked and skipped without one.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil

import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG, attach_dispatches, dispatch_check_takes_a_spec

from autosched.cli import cli
from autosched.compile import compile_one
from autosched.config import RunConfig
from autosched.drivers.model_stages.prepare import model_problems
from autosched.model.configured import check_build, in_configured_form
from autosched.model.lowering import analyze_model
from autosched.ops.convolution import POINTWISE, STRIDED, WINDOW, ConvolutionProblem
from autosched.run.builds import dispatch_job, expected_config
from autosched.search.space import build_space, matching_points
from autosched.targets.cpu import CpuTarget
from autosched.targets.cuda import CudaTarget
from autosched.targets.cuda_convolution import (
    IREE_KNOBS,
    IREE_STARTING,
    mma_extent,
    warps,
)

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
F16 = os.path.join(MODELS, "tv_resnet18_f16.mlirbc")
F32 = os.path.join(MODELS, "tv_resnet18_f32.mlirbc")
RESNET50 = os.path.join(MODELS, "tv_resnet50_f16.mlirbc")
MOBILENET = os.path.join(MODELS, "tv_mobilenet_v3_small_{}.mlirbc")
RESNEXT = os.path.join(MODELS, "tv_resnext50_32x4d_f16.mlirbc")
GROUPED = "conv_nfohowckhkwg_2x8x8x8x8x3x3x32_s2x2_f16_f16_f32"
DEPTHWISE = "conv_nohowkhkwg_2x8x8x3x3x88_s1x1_{t}_{t}_f32"
CUDA = CudaTarget(RunConfig(target="cuda", arch="sm_80"))
CONV = "conv_nfohowckhkw_2x128x8x8x128x3x3_s1x1_f16_f16_f32"
POINTWISE_CONV = "conv_nfohowc_2x128x8x8x64_s1x1_f16_f16_f32"
STRIDED_CONVS = [
    "conv_nfohowc_2x512x8x8x256_s2x2_f16_f16_f32",
    "conv_nfohowc_2x1024x4x4x512_s2x2_f16_f16_f32",
    "conv_nfohowc_2x2048x2x2x1024_s2x2_f16_f16_f32",
]


def problems_of(path: str, target=CUDA):
    flags = target.compile_flags()
    return model_problems(in_configured_form(analyze_model(path, flags), path, flags), target)


@functools.cache
def analysed(path: str):
    """The fast tests' shared reading of a model (nothing they do changes it)."""
    return problems_of(path)


def test_every_f16_convolution_is_a_cuda_problem_with_iree_defaults_in_its_space():
    problems, skipped = analysed(F16)
    convs = [e.problem for e in problems if e.problem.kind == "convolution"]
    # the 7x7 stem and the 3x3 ones, strided and not; the three 1x1 downsampling ones
    assert [c.form for c in convs].count(WINDOW) == 8
    assert [c.name for c in convs if c.form == POINTWISE] == [
        POINTWISE_CONV,
        "conv_nfohowc_2x256x4x4x128_s1x1_f16_f16_f32",
        "conv_nfohowc_2x512x2x2x256_s1x1_f16_f16_f32",
    ]
    assert skipped == {}  # every convolution is tuned
    for conv in convs:
        assert conv.output_roles == ("n", "f", "oh", "ow")
        space = build_space(conv, CUDA, {})
        assert len(space.points) > 100
        # the first points measured: IREE's own defaults, cut to the problem's loops
        starting = CUDA.for_problem(conv).starting_points(conv)
        assert matching_points(space.points, starting)


def test_warps_follow_the_mma_tiles_the_way_iree_counts_them():
    """IREE's resnet50 defaults all run 8 warps: output columns count 8-wide mma tiles,
    output channels 16-wide ones, the outer loops elements (see cuda_convolution)."""
    by_name = {e.problem.name: e.problem for e in analysed(F16)[0]}
    conv = by_name[CONV]
    assert (mma_extent(conv, "ow"), mma_extent(conv, "f"), mma_extent(conv, "n")) == (8, 16, 1)
    # a pointwise one is IREE's contraction of the image (its lhs) with the filter
    assert (
        mma_extent(by_name[POINTWISE_CONV], "ow"),
        mma_extent(by_name[POINTWISE_CONV], "f"),
    ) == (16, 8)
    defaults = [dict(zip(IREE_KNOBS, values, strict=True)) for values in IREE_STARTING]
    assert [warps(conv, point) for point in defaults] == [8] * len(IREE_STARTING)


@pytest.mark.slow  # reads resnet50 or resnext50 for CUDA (15 s)
def test_strided_1x1_convolutions_are_found_and_tuned_with_thread_tiles():
    """resnet50's downsampling 1x1 convolutions read their image through `d * 2`: neither a
    convolution to MLIR nor a contraction. They are found, with their strides, and searched
    with plain thread tiles on CUDA (no mma intrinsic takes them)."""
    problems, skipped = analysed(RESNET50)
    assert skipped == {}
    strided = [e.problem for e in problems if getattr(e.problem, "form", "") == STRIDED]
    assert [p.name for p in strided] == STRIDED_CONVS
    first = strided[0]
    assert first.loops == ("n", "f", "oh", "ow", "c") and first.strides == (2, 2)
    assert first.csv_shape()["K"] == 256
    space = build_space(first, CUDA, {})
    assert space.points and all(p["thread_f"] > 0 and p["sg_f"] == 1 for p in space.points)
    assert "thread = [1, " in expected_config(first, CUDA, space.points[0])


@pytest.mark.slow
def test_the_cpu_tunes_strided_1x1_convolutions_on_double_tiling():
    """As IREE's CPU default does (DoubleTilingExpert over n, f, oh, ow, c); they were
    listed as not tuned. The spec's reach is in test_convolution.py."""
    cpu = CpuTarget(RunConfig())
    problems, skipped = problems_of(RESNET50, cpu)
    assert skipped == {}
    strided = [e.problem for e in problems if getattr(e.problem, "form", "") == STRIDED]
    assert [p.name for p in strided] == STRIDED_CONVS
    space = build_space(strided[0], cpu, {})
    assert space.points
    assert "DoubleTilingExpert" in expected_config(strided[0], cpu, space.points[0])


@pytest.mark.slow  # reads mobilenet_v3 for CUDA (14 s)
@pytest.mark.parametrize("element", ["f16", "f32"])
def test_depthwise_convolutions_take_thread_tiles_in_any_type(element):
    """No GEMM in a depthwise convolution: plain thread tiles over its own loops, the whole
    window a step, as IREE's default (f32 too: no tensor cores needed)."""
    problems, _ = analysed(MOBILENET.format(element))
    depthwise = [e.problem for e in problems if e.problem.kind == "convolution"]
    depthwise = [p for p in depthwise if p.depthwise]
    assert len(depthwise) == 9
    conv = next(p for p in depthwise if p.name == DEPTHWISE.format(t=element))
    space = build_space(conv, CUDA, {})
    assert all(p["thread_f"] > 0 and p["k_tile"] == 1 for p in space.points)
    starting = CUDA.for_problem(conv).starting_points(conv)
    assert matching_points(space.points, starting)
    config = expected_config(conv, CUDA, starting[0])
    assert "reduction = [0, 0, 0, 0, 3, 3]" in config and "promote_operands" not in config


@pytest.mark.slow  # reads resnet50 or resnext50 for CUDA (15 s)
def test_grouped_convolutions_take_thread_tiles_a_group_a_workgroup():
    """resnext's 32-group 3x3 convolutions (MLIR's `g` beside `f` and `c`): no implicit GEMM
    takes them, so plain thread tiles over one group a workgroup, the whole window and a
    few of the group's channels a step, as IREE's default (which they were refused
    before); IREE's default point is the first measured."""
    problems, skipped = analysed(RESNEXT)
    assert skipped == {}
    grouped = [e.problem for e in problems if getattr(e.problem, "grouped", False)]
    assert len(grouped) == 7
    conv = next(p for p in grouped if p.name == GROUPED)
    assert conv.loops == ("n", "g", "f", "oh", "ow", "c", "kh", "kw")
    space = build_space(conv, CUDA, {})
    assert all(p["thread_f"] > 0 and p["k_tile"] <= conv.size("c") for p in space.points)
    starting = CUDA.for_problem(conv).starting_points(conv)
    assert matching_points(space.points, starting)
    config = expected_config(conv, CUDA, starting[0])
    assert "reduction = [0, 0, 0, 0, 0, 1, 3, 3]" in config and "promote_operands" not in config
    assert "workgroup = [1, 1, 1, 2, 8, 0, 0, 0]" in config  # IREE's [1, 1, 1, 2, 16], cut
    assert build_space(conv, CpuTarget(RunConfig()), {}).points  # the CPU's tiles too


@pytest.mark.slow  # about 5 s or more on two cores: the README's command stays under 10 minutes
def test_f32_convolutions_are_not_tuned_on_cuda_and_say_why():
    problems, skipped = analysed(F32)
    assert not [e for e in problems if e.problem.kind == "convolution"]
    assert any("no tensor-core configuration on sm_80" in reason for reason in skipped)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, name",
    [
        (F16, CONV),
        (F16, POINTWISE_CONV),
        (RESNET50, STRIDED_CONVS[0]),
        (MOBILENET.format("f16"), DEPTHWISE.format(t="f16")),
        (RESNEXT, GROUPED),
    ],
)
def test_a_cuda_point_reaches_the_timed_dispatch_and_the_checked_module(tmp_path, model, name):
    """A random point of the space, compiled for sm_80: the dispatch benchmark that is timed
    and the module its answers are checked on both carry its configuration (the
    dispatch's batch-norm constants, which IREE's dump leaves out, come with it). That is the
    dispatch's own check module (a result written into the next layer's padded input stays
    tied), except for a strided 1x1, whose stride the check module built from `flow` moves
    out of the root: it is checked on the whole model."""
    problems, _ = problems_of(model)
    (entry,) = [e for e in problems if e.problem.name == name]
    attach_dispatches([entry], model, CUDA.compile_flags(), str(tmp_path / "d"))
    conv: ConvolutionProblem = entry.problem
    on_dispatch = dispatch_check_takes_a_spec(entry, CUDA, str(tmp_path / "w"))
    assert on_dispatch == (conv.form != STRIDED)
    if not on_dispatch:
        entry.benchmark = entry.benchmark.on_whole_model()
    point = random.Random(0).choice(build_space(conv, CUDA, {}).points)
    expected = expected_config(conv, CUDA, point)
    if conv.form != STRIDED and not conv.depthwise and not conv.grouped:
        igemm = "true" if conv.form == WINDOW else "false"
        assert f"use_igemm_convolution = {igemm}" in expected
    timed = dispatch_job(entry.benchmark, conv, CUDA, point, str(tmp_path / "timed"))
    assert compile_one(timed, 300).status == "ok"
    assert check_build(timed.output, expected).ok
    check = dispatch_job(entry.benchmark, conv, CUDA, point, str(tmp_path / "c"), check=True)
    assert compile_one(check, 300).status == "ok"
    verdict = check_build(check.output, expected, only="" if on_dispatch else name)
    assert verdict.ok, verdict.message


@pytest.mark.gpu
def test_a_cuda_run_checks_and_times_the_convolutions_on_the_gpu(tmp_path, monkeypatch):
    """On the GPU: resnet18's convolution candidates are built, checked against the default
    build's outputs and timed."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(F16, tmp_path)
    # Every core compiles (the GPU machine has 16), IREE's configurations alone, no table.
    # Some implicit-GEMM configurations never finish on sm_90: each is a timeout, at 10 s.
    cfg = MODEL_CFG.replace("jobs = 2", "jobs = 0\nrun_timeout = 10")
    cfg += "dispatch_table = none\n[SearchSpace.cuda]\npipeline = [TileAndFuse]\n"
    (tmp_path / "auto-scheduler.cfg").write_text(cfg)
    result = CliRunner().invoke(
        cli, ["run", "tv_resnet18_f16.mlirbc", "--target", "cuda", "--budget", "24"]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in open("generated/tv_resnet18_f16/tuning.jsonl")]
    convs = [r for r in records if r["shape"].get("kind") == "convolution" and not r["baseline"]]
    timed = [r for r in convs if r["status"] == "ok"]
    assert timed and all(r["verification"] == "correct" and r["median_ms"] > 0 for r in timed)
    assert not [r for r in convs if r["status"] == "not_applied"]
