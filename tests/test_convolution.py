"""Convolutions as a root-op kind (issue 25), on torchvision's own resnet18 (f32, 1x3x64x64,
weights as arguments) exported with iree-turbine and committed. Real iree-compile, no mocks.

Every 3x3 and 7x7 convolution is found with its loops' roles, strides and the form IREE
configures; a spec from a point of the CPU space reaches the convolution in the dispatch
benchmark that is timed; and the module that checks answers is still out of a spec's
reach, which is why the CPU space is not searched yet (targets/cpu_convolution.py).
"""

from __future__ import annotations

import os

from autosched.compile import compile_one
from autosched.config import RunConfig
from autosched.drivers.model_run import attach_benchmarks, model_problems
from autosched.model.configured import check_build, in_configured_form
from autosched.model.lowering import analyze_model
from autosched.run.builds import dispatch_job, expected_config
from autosched.search.space import build_space
from autosched.targets.cpu import CpuTarget
from autosched.targets.cpu_convolution import NOT_CHECKABLE

MODEL = os.path.join(os.path.dirname(__file__), "data", "models", "tv_resnet18_f32.mlirbc")
CPU = CpuTarget(RunConfig())


def analysis():
    flags = CPU.compile_flags()
    return in_configured_form(analyze_model(MODEL, flags), MODEL, flags)


def test_every_resnet18_convolution_is_found_in_its_configured_form():
    convolutions = [r for r in analysis().roots if r.kind == "convolution"]
    assert len(convolutions) == 8  # 7x7 stem, 3x3 at four widths, strided and not
    assert sum(c.occurrences for c in convolutions) == 17
    stem = convolutions[0]
    assert stem.name == "conv_nfohowckhkw_1x64x32x32x3x7x7_s2x2_f32_f32_f32"
    # At `flow` the unit batch is folded away; IREE configures the op with it.
    assert stem.loops == ("n", "f", "oh", "ow", "c", "kh", "kw")
    assert stem.strides == (2, 2) and stem.dilations == (1, 1)
    assert stem.csv_shape()["K"] == 3 * 7 * 7


def test_a_cpu_spec_reaches_the_timed_convolution_but_not_the_check_module(tmp_path):
    found = analysis()
    problems, skipped = model_problems(found, CPU)
    assert skipped.get(NOT_CHECKABLE) == 8  # listed, with why, not searched
    conv = next(r for r in found.roots if r.name.endswith("1x128x8x8x128x3x3_s1x1_f32_f32_f32"))
    entry = type(problems[0])(conv, conv)
    attach_benchmarks([entry], MODEL, CPU.compile_flags(), str(tmp_path / "d"))
    point = {"f_tile": 16, "oh_tile": 8, "ow_tile": 2, "f_vec": 8, "ow_vec": 2, "c_vec": 4}
    assert point in build_space(conv, CPU, {}).points
    expected = expected_config(conv, CPU, point)
    timed = dispatch_job(entry.benchmark, conv, CPU, point, str(tmp_path / "timed"))
    assert compile_one(timed, 300).status == "ok"
    assert check_build(timed.output, expected).ok
    check = dispatch_job(entry.benchmark, conv, CPU, point, str(tmp_path / "c"), check=True)
    assert compile_one(check, 300).status == "ok"
    assert not check_build(check.output, expected).ok  # the blocker NOT_CHECKABLE names
