"""Convolutions as a root-op kind (issue 25), on torchvision's own resnet18 (f32, 2x3x64x64,
weights as arguments) exported with iree-turbine and committed. Real iree-compile and
local-task runs, no mocks.

Every 3x3 and 7x7 convolution is found with its loops' roles and strides, in the form IREE
configures; a spec from a point of the CPU space reaches the convolution in the dispatch
benchmark that is timed and in the whole model its answers are checked on; and a run
searches them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG, attach_dispatches, dispatch_check_takes_a_spec

from autosched.cli import cli
from autosched.compile import compile_one
from autosched.config import RunConfig
from autosched.drivers.campaign import ModelProblem
from autosched.model.configured import check_build, in_configured_form
from autosched.model.lowering import analyze_model
from autosched.ops.convolution import POINTWISE, STRIDED, WINDOW
from autosched.run.builds import dispatch_job, expected_config
from autosched.search.space import build_space
from autosched.targets.cpu import CpuTarget
from autosched.targets.cpu_convolution import UNIT_BATCH

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
MODEL_NAME = "tv_resnet18_f32.mlirbc"
MODEL = os.path.join(MODELS, MODEL_NAME)
MOBILENET = os.path.join(MODELS, "tv_mobilenet_v3_small_f32.mlirbc")
RESNET50 = os.path.join(MODELS, "tv_resnet50_f16.mlirbc")  # its strided 1x1s survive at 64x64
TWO_FUNCTIONS = os.path.join(MODELS, "two_function_convs.mlir")
CPU = CpuTarget(RunConfig())
CONV = "conv_nfohowckhkw_2x128x8x8x128x3x3_s1x1_f32_f32_f32"
POINTWISE_CONV = "conv_nfohowc_2x128x8x8x64_s1x1_f32_f32_f32"
POINTWISE_DEEPER = [
    "conv_nfohowc_2x256x4x4x128_s1x1_f32_f32_f32",
    "conv_nfohowc_2x512x2x2x256_s1x1_f32_f32_f32",
]
# A point of each form's CPU space (f_tile, oh_tile, ow_tile, f_vec, ow_vec, c_vec).
DEPTHWISE = "conv_nohowkhkwg_2x8x8x3x3x88_s1x1_f32_f32_f32"
STRIDED_CONVS = [
    "conv_nfohowc_2x512x8x8x256_s2x2_f16_f16_f32",
    "conv_nfohowc_2x1024x4x4x512_s2x2_f16_f16_f32",
    "conv_nfohowc_2x2048x2x2x1024_s2x2_f16_f16_f32",
]
STRIDED_CONV = STRIDED_CONVS[0]
RESNEXT = os.path.join(MODELS, "tv_resnext50_32x4d_f16.mlirbc")  # 32-group 3x3 convolutions
GROUPED = "conv_nfohowckhkwg_2x8x8x8x8x3x3x32_s2x2_f16_f16_f32"
POINTS = {
    GROUPED: {"f_tile": 8, "oh_tile": 4, "ow_tile": 8, "f_vec": 4, "ow_vec": 4, "c_vec": 4},
    STRIDED_CONV: {"f_tile": 32, "oh_tile": 8, "ow_tile": 8, "f_vec": 1, "ow_vec": 8, "c_vec": 16},
    DEPTHWISE: {"f_tile": 8, "oh_tile": 4, "ow_tile": 8, "f_vec": 4, "ow_vec": 4, "c_vec": 1},
    CONV: {"f_tile": 16, "oh_tile": 8, "ow_tile": 2, "f_vec": 8, "ow_vec": 2, "c_vec": 4},
    POINTWISE_CONV: {"f_tile": 32, "oh_tile": 4, "ow_tile": 8, "f_vec": 4, "ow_vec": 8, "c_vec": 8},
}


def analysis(model: str = MODEL):
    flags = CPU.compile_flags()
    return in_configured_form(analyze_model(model, flags), model, flags)


def test_every_resnet18_convolution_is_found_in_its_configured_form():
    found = analysis()
    convolutions = [r for r in found.roots if r.kind == "convolution"]
    windows = [c for c in convolutions if c.form == WINDOW]
    assert len(windows) == 8  # the 7x7 stem, 3x3 at four widths, strided and not
    assert sum(c.occurrences for c in windows) == 17
    stem = windows[0]
    assert stem.name == "conv_nfohowckhkw_2x64x32x32x3x7x7_s2x2_f32_f32_f32"
    assert stem.loops == ("n", "f", "oh", "ow", "c", "kh", "kw")
    assert stem.strides == (2, 2) and stem.dilations == (1, 1)
    assert stem.csv_shape() == {
        "M": 2 * 32 * 32,
        "N": 64,
        "K": 3 * 7 * 7,
        "batch": 1,
        "lhs_type": "f32",
        "rhs_type": "f32",
        "acc_type": "f32",
    }
    # The three 1x1 (downsampling) convolutions are contractions with no matmul form: the
    # pointwise kind, its image loops split by the output channel. Pooling windows are none.
    pointwise = [c for c in convolutions if c.form == POINTWISE]
    assert [c.name for c in pointwise] == [POINTWISE_CONV, *POINTWISE_DEEPER]
    assert pointwise[0].loops == ("n", "f", "oh", "ow", "c")
    assert pointwise[0].csv_shape()["K"] == 64
    assert found.skipped_counts() == {}


def test_a_batch_of_one_is_refused_with_its_reason():
    conv = next(r for r in analysis().roots if r.name == CONV)
    sizes = tuple(
        1 if role == "n" else s for role, s in zip(conv.loops, conv.loop_sizes, strict=True)
    )
    single = dataclasses.replace(conv, loop_sizes=sizes)
    assert CPU.for_problem(single).supports(single) == UNIT_BATCH
    assert CPU.for_problem(conv).supports(conv) is None


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_depthwise_convolutions_are_found_with_their_channel_as_depth():
    """mobilenet_v3's depthwise 3x3 and 5x5 convolutions, strided and not: MLIR's depth
    loop is the channel they keep apart; every one is tuned."""
    found = analysis(MOBILENET)
    depthwise = [r for r in found.roots if r.kind == "convolution" and r.depthwise]
    assert len(depthwise) == 9
    conv = next(r for r in depthwise if r.name == DEPTHWISE)
    assert conv.loops == ("n", "oh", "ow", "g", "kh", "kw") and conv.channel == "g"
    assert conv.size("f") == conv.size("c") == 1 and conv.size("g") == 88
    assert found.skipped_counts() == {}
    space = build_space(conv, CPU, {})
    assert POINTS[DEPTHWISE] in space.points
    assert "DoubleTilingExpert" in expected_config(conv, CPU, POINTS[DEPTHWISE])


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, name",
    [
        (MODEL, CONV),
        (MODEL, POINTWISE_CONV),
        (MOBILENET, DEPTHWISE),
        (RESNET50, STRIDED_CONV),
        (RESNEXT, GROUPED),
    ],
)
def test_a_cpu_spec_reaches_the_timed_dispatch_and_the_checked_model(tmp_path, model, name):
    """The timed dispatch and the whole model carry the point's configuration. The dispatch's
    own check module does too, except for a strided 1x1 (its stride moves out of the root
    when the check module is built from `flow`), so a run checks that one on the model."""
    conv = next(r for r in analysis(model).roots if r.name == name)
    entry = ModelProblem(conv, conv)
    attach_dispatches([entry], model, CPU.compile_flags(), str(tmp_path / "d"))
    on_dispatch = dispatch_check_takes_a_spec(entry, CPU, str(tmp_path / "w"))
    assert on_dispatch == (conv.form != STRIDED)
    entry.benchmark = entry.benchmark.on_whole_model()
    assert entry.benchmark.checks_model and entry.benchmark.check_function == "main"
    point = POINTS[name]
    assert point in build_space(conv, CPU, {}).points
    expected = expected_config(conv, CPU, point)
    timed = dispatch_job(entry.benchmark, conv, CPU, point, str(tmp_path / "timed"))
    assert compile_one(timed, 300).status == "ok"
    assert check_build(timed.output, expected).ok
    check = dispatch_job(entry.benchmark, conv, CPU, point, str(tmp_path / "c"), check=True)
    assert compile_one(check, 300).status == "ok"
    assert check_build(check.output, expected, only=name).ok  # every dispatch of it
    assert not check_build(check.output, expected).ok  # the model's other roots do not


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["normal", "fast"])
def test_a_run_checks_convolution_candidates_on_their_dispatch(tmp_path, monkeypatch, mode):
    """resnet18's convolutions (its 1x1 downsampling ones are pointwise by the time IREE forms
    their dispatches) are checked on their dispatches' own modules: the whole model is never
    built for a check. Fast mode too, which probes no timed module but still the check's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG)
    shutil.copy(MODEL, tmp_path)
    command = ["run", "tv_resnet18_f32.mlirbc", "--budget", "12", "--mode", mode]
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in open("generated/tv_resnet18_f32/tuning.jsonl")]
    convs = [r for r in records if r["shape"].get("kind") == "convolution" and not r["baseline"]]
    assert convs and not [r for r in convs if r["status"] == "not_applied"]
    checked = [r for r in convs if r["status"] == "ok"]
    assert checked and all(r["verification"] == "correct" for r in checked)
    log = open("generated/tv_resnet18_f32/run.log").read()
    assert log.count("answers checked on the dispatch against IREE's default") == 12
    assert "answers checked on the whole model" not in log
    assert not list(tmp_path.rglob("*.iree_default.vmfb"))  # the model's check build
    assert set(os.listdir(tmp_path)) == {"auto-scheduler.cfg", "generated", MODEL_NAME}


@pytest.mark.slow
def test_a_strided_1x1_is_checked_on_the_whole_model_built_once(tmp_path, monkeypatch):
    """resnet50's strided 1x1 convolutions, which no spec reaches in their dispatches' check
    modules, are checked on the whole model; IREE's default build of it, the same for every
    such problem, is built once, under its work folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG)
    shutil.copy(RESNET50, tmp_path)
    result = CliRunner().invoke(cli, ["run", os.path.basename(RESNET50), "--budget", "4"])
    assert result.exit_code == 0, result.output
    sections = open("generated/tv_resnet50_f16/run.log").read().split("--- problem ")
    on_model = [s.split(" ---")[0] for s in sections if "checked on the whole model" in s]
    assert sorted(on_model) == sorted(STRIDED_CONVS), on_model
    defaults = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.iree_default.vmfb")]
    assert defaults == ["generated/tv_resnet50_f16/model/check/tv_resnet50_f16.iree_default.vmfb"]
    records = [json.loads(line) for line in open("generated/tv_resnet50_f16/tuning.jsonl")]
    assert all(r["status"] != "not_applied" for r in records), result.output


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["dispatch", "dispatch_and_model"])
def test_a_convolution_whose_dispatch_check_cannot_run_is_checked_on_the_whole_model(
    tmp_path, monkeypatch, failing
):
    """A convolution has no kernel of its own to check answers on: when its dispatch's check
    cannot run (on the H200 resnet50's and mobilenet_v3's 1x1 ones ran past the run
    timeout), its answers are checked on the whole model. When that cannot run either, the
    problem is not searched (not even timed) and says why, and the run goes on."""

    def fails(search, name: str) -> bool:
        on_model = name == "model"
        return search.problem.kind == "convolution" and (not on_model or failing != "dispatch")

    result = _run_with_failing_checks(tmp_path, monkeypatch, MODEL, fails)
    records = [json.loads(line) for line in open("generated/tv_resnet18_f32/tuning.jsonl")]
    kinds = {r["shape"].get("kind", "matmul") for r in records}
    log = open("generated/tv_resnet18_f32/run.log").read()
    assert "the dispatch check could not run (iree-run-module took over 20 s): answers " \
        "checked on the whole model" in log  # fmt: skip
    if failing == "dispatch":
        assert "convolution" in kinds and "not searched" not in result.output
        convs = [r for r in records if r["shape"].get("kind") == "convolution"]
        assert all(r["verification"] == "correct" for r in convs if r["status"] == "ok")
    else:
        assert "has no kernel of its own to check answers on: not searched" in result.output
        assert kinds == {"matmul"}  # the classifier's matmul searched, no convolution measured
    assert "model:" in result.output  # and the whole model proved


@pytest.mark.slow
def test_a_model_of_several_functions_checks_each_convolution_on_its_own_function(
    tmp_path, monkeypatch
):
    """A model exporting two functions (as prefill and decode do), a convolution in each:
    checked on the whole model, each problem runs the function its dispatch belongs to
    (the check asked for "the" function and stopped the run with "name one")."""
    _run_with_failing_checks(
        tmp_path, monkeypatch, TWO_FUNCTIONS, lambda search, name: name != "model"
    )
    folder = tmp_path / "generated" / "two_function_convs"
    records = [json.loads(line) for line in open(folder / "tuning.jsonl")]
    assert {r["problem"] for r in records} == {
        "conv_nfohowckhkw_2x16x14x14x8x3x3_s1x1_f32_f32_f32",
        "conv_nfohowckhkw_2x32x12x12x16x3x3_s1x1_f32_f32_f32",
    }
    assert all(r["verification"] == "correct" for r in records if r["status"] == "ok")
    assert (folder / "run.log").read_text().count("answers checked on the whole model") == 2


def _run_with_failing_checks(tmp_path, monkeypatch, model: str, fails):
    """`autosched run MODEL --budget 4` in `tmp_path` where each default-answer check that
    `fails(search, name)` names ("model": the whole model's) times out; its result."""
    from autosched.measure.module_io import RunFailed
    from autosched.run.checks import AnswerChecks

    answer = AnswerChecks.default_answer

    def check(self, search, entry, name):
        if fails(search, name):
            return RunFailed("iree-run-module took over 20 s")
        return answer(self, search, entry, name)

    monkeypatch.setattr(AnswerChecks, "default_answer", check)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG)
    shutil.copy(model, tmp_path)
    result = CliRunner().invoke(cli, ["run", os.path.basename(model), "--budget", "4"])
    assert result.exit_code == 0, result.output
    return result
