"""The Triton implicit-GEMM convolution family (issue 25) as IREE custom dispatches: the op
form of a convolution rebuilt alone and checked against numpy on the CPU, PTX made without a
GPU, torchvision's resnet18 (f16, committed) with every convolution replaced before IREE forms
dispatches and compiled for sm_90; on a GPU, the kernels against numpy and the rewritten model
against IREE's default build."""

from __future__ import annotations

import dataclasses
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
from iree import compiler, runtime
from iree.compiler import ir

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.drivers.custom_route import custom_coverage
from autosched.drivers.model_stages.prepare import prepare
from autosched.drivers.model_stages.report import dry_run
from autosched.ops.convolution import POINTWISE, nchw_problem
from autosched.ops.convolution_kind import op_module_text
from autosched.outputs.records import problem_from_shape, problem_shape
from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
from autosched.rewrite.convolution_ops import model_convolutions, paired
from autosched.rewrite.epilogues import unambiguous, winners_epilogues
from autosched.rewrite.spec import write_substitution
from autosched.search.space import build_space
from autosched.targets import make_target

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
RESNET18 = os.path.join(MODELS, "tv_resnet18_f16.mlirbc")
# (batch, channels, image, filters, window, stride): 3x3 at stride 1 and 2, the 7x7 stem on
# an RGB image, a pointwise one, and output channels and pixels that no block divides.
# The last: a ViT's patch convolution (3 channels, taps of 8 at a stride of 8, read as stored).
SHAPES = [
    (2, 16, 9, 24, 3, 1),
    (2, 16, 9, 16, 3, 2),
    (1, 3, 19, 16, 7, 2),
    (2, 32, 7, 48, 1, 1),
    (2, 3, 32, 64, 8, 8),
]


def _random(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float16)


def _run(vmfb: bytes, driver: str, *inputs) -> np.ndarray:
    config = runtime.Config(driver)
    context = runtime.SystemContext(config=config)
    context.add_vm_module(runtime.VmModule.copy_buffer(config.vm_instance, vmfb))
    return np.asarray(context.modules.module["main"](*inputs).to_host())


def _operands(problem, seed=0):
    filter_shape = [problem.size(r) for r in problem.operand_roles(1)]
    return _random(problem.image_shape, seed), _random(filter_shape, seed + 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_op_form_built_by_iree_gives_numpys_convolution(shape):
    """The module a bare search times IREE's default on, and the reference its candidates
    are checked against, agree (real iree-compile, real local-task)."""
    problem = nchw_problem(*shape)
    vmfb = compiler.compile_str(
        op_module_text(problem, {}),
        target_backends=["llvm-cpu"],
        extra_args=["--iree-llvmcpu-target-cpu=generic"],
    )
    image, kernel = _operands(problem)
    out = _run(vmfb, "local-task", image, kernel)
    expected = problem.reference(image.astype(np.float64), kernel.astype(np.float64))
    assert out.shape == tuple(problem.output_shape)
    assert np.abs(out - expected).max() < 1e-3 * np.abs(expected).max()
    wrong = problem.reference(image.astype(np.float64), -kernel.astype(np.float64))
    assert np.abs(out - wrong).max() > 0.5 * np.abs(expected).max()


def test_an_op_form_round_trips_through_its_record():
    problem = nchw_problem(2, 16, 9, 24, 3, 2)
    again = problem_from_shape(problem_shape(problem))
    assert again == problem
    assert problem.name.endswith("_op")  # never a dispatch problem's name (or records)


def test_triton_points_are_only_in_an_op_forms_space_on_sm_90():
    pytest.importorskip("triton")
    op = nchw_problem(2, 64, 16, 64, 3, 1)
    hopper = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    points = build_space(op, hopper, {}).points
    assert points and {p["conv_kernel"] for p in points} == {"triton"}
    assert not build_space(op, make_target(RunConfig(target="cuda", arch="sm_80")), {}).points
    dispatch = nchw_problem(2, 64, 16, 64, 3, 1)
    dispatch.op_form = False
    assert {p["conv_kernel"] for p in build_space(dispatch, hopper, {}).points} == {"iree"}


def test_the_kernel_reads_channels_last_tiles_with_asynchronous_copies(tmp_path):
    pytest.importorskip("triton")
    from autosched.kernels.igemm_conv import kernel as family

    problem = nchw_problem(16, 256, 14, 256, 3, 1)
    params = family.ConvParams(64, 128, 64, 4, 3)
    binary = family.compile_kernel(problem, params, "sm_90", str(tmp_path / "conv.ptx"))
    ptx = open(binary.ptx_path).read()
    assert "wgmma" in ptx and "cp.async" in ptx
    assert binary.shared_bytes == 3 * (64 + 128) * 64 * 2  # every stage staged
    stem = family._constants(nchw_problem(16, 3, 224, 64, 7, 2), params)
    assert (stem["C"], stem["KW"]) == (21, 1)  # a filter row's taps and channels in one step


def _starting_points_spec(model: str, target, ops, folder) -> str:
    """A custom spec that replaces each op form (with its epilogues, and the zero padding
    before it) of `model` by the family's first starting point; returns its path."""
    from autosched.rewrite.conv_padding import winners_paddings

    view = target.for_kind("convolution")
    winners = [(op, view.starting_points(op)[0]) for op in ops]
    spec = str(folder / "custom.mlir")
    flags = target.compile_flags()
    epilogues = winners_epilogues(model, flags, str(folder), ops)
    paddings = winners_paddings(model, flags, str(folder), ops)
    assert write_substitution(spec, winners, target, None, epilogues, paddings=paddings) == []
    return spec


def _channels_last_spec(folder) -> object:
    """The starting points' spec (folder / custom.mlir) for resnet18 in the layout that
    `layout = auto` chooses on sm_90 with Triton; returns the folder."""
    from autosched.drivers.model_stages.prepare import laid_out

    pytest.importorskip("triton")
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    flags = target.compile_flags()
    converted, _ = laid_out(RunConfig(target="cuda"), target, RESNET18, flags, str(folder))
    assert converted.channels_last
    ops = model_convolutions(converted.source, flags, str(folder))
    _starting_points_spec(converted.source, target, ops, folder)
    return folder


@pytest.fixture(scope="module")
def resnet18_rewritten(tmp_path_factory):
    """resnet18's op forms, and the model with each replaced by a Triton point."""
    pytest.importorskip("triton")
    folder = tmp_path_factory.mktemp("resnet18")
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    ops = model_convolutions(RESNET18, target.compile_flags(), str(folder))
    spec = _starting_points_spec(RESNET18, target, ops, folder)
    out = str(folder / "model.custom.mlir")
    rewritten, replaced = rewrite_model(RESNET18, spec, target.compile_flags(), out, 300)
    return target, ops, rewritten, replaced, folder


@pytest.mark.slow  # resnet18 lowered, rewritten and built for sm_90 (25 s)
def test_resnet18s_convolutions_are_replaced_before_dispatches_form(resnet18_rewritten):
    target, ops, rewritten, replaced, folder = resnet18_rewritten
    assert len(ops) == 11 and sum(len(op.sites) for op in ops) == 20
    assert [op.form for op in ops].count(POINTWISE) == 3
    assert replaced == 20  # every convolution of the model runs a Triton kernel
    # ... that stores f16 itself, in place of the conv's f32 result and its truncf
    from iree.compiler import ir

    from autosched.ir_walk import walk_ops

    module = ir.Module.parseFile(rewritten, ir.Context())
    externs = [op for op in walk_ops(module.operation) if op.name == "hal.dispatch.extern"]
    outputs = {str(ir.RankedTensorType(op.results[0].type).element_type) for op in externs}
    assert outputs == {"f16"}
    # ... that reads each 3x3 convolution's image before its zero pad (conv_padding.py):
    # of the pads a kernel reads only the stem's is left (3 channels: its kernel reads a
    # filter row's taps at once); the max pool's (-inf) is IREE's
    kernels = ("hal.dispatch.extern", "linalg.transpose")  # NCHW: transposed first
    pads = [op for op in walk_ops(module.operation) if op.name == "tensor.pad"]
    read = [p for p in pads if any(u.owner.name in kernels for u in p.results[0].uses)]
    assert [ir.RankedTensorType(op.operands[0].type).shape[1] for op in read] == [3]
    # ... and computes the batch norm, ReLU and residual add after it (model/epilogues.py):
    # no elementwise op reads a convolution's result any more
    from autosched.model.lowering import lower_to_dispatches

    flags = [*target.compile_flags(), RESUME_FLAG]
    dispatches = lower_to_dispatches(rewritten, flags)
    exports = [
        str(op.attributes["sym_name"]) for op in walk_ops(dispatches.operation)
        if op.name == "flow.executable.export"
    ]  # fmt: skip
    elementwise = [name for name in exports if "elementwise" in name]
    assert all("elementwise_1024_" in name for name in elementwise), exports  # the pool's mean
    built = compile_one(CompileJob(rewritten, str(folder / "model.vmfb"), flags), 600)
    assert built.status == "ok", built.message


@pytest.mark.slow  # resnet18 lowered, rewritten and built for sm_90 (25 s)
def test_each_dispatch_convolution_pairs_with_its_op_form(resnet18_rewritten):
    from test_cuda_convolution import analysed

    from autosched.ops.convolution import STRIDED

    _, ops, *_ = resnet18_rewritten
    problems, _ = analysed(RESNET18)
    convolutions = [e.problem for e in problems if e.problem.kind == "convolution"]
    taken = {}
    for flow in convolutions:
        op = paired(flow, ops)
        if flow.form == STRIDED:
            continue
        assert op is not None and op.flops == flow.flops, flow.name
        # One source line makes every stage's 3x3 convolutions, of equal work (16x16 by 64
        # channels, 8x8 by 128): each dispatch pairs with its own op, not the first stage's.
        assert (op.size("f"), op.strides) == (flow.size("f"), flow.strides), flow.name
        assert taken.setdefault(op.key(), flow.name) == flow.name, (flow.name, taken[op.key()])
    assert len(taken) == len([f for f in convolutions if f.form != STRIDED]) >= 9


@pytest.mark.slow  # resnet18 lowered for sm_90 and fused (25 s)
def test_the_custom_route_covers_every_convolution_of_every_stage_before_the_campaign(
    tmp_path, capsys
):
    """What fast mode leaves to the custom route is what that route searches, known before
    the campaign: each of resnet18's convolution dispatches (every stage's, though one
    source line makes each stage's 3x3 convolutions at equal work) by its own op form; the
    classifier's matmul, timed as a kernel in the campaign, is not. A dry run says which
    families will search each problem."""
    config = RunConfig(
        target="cuda", arch="sm_90", work_dir=str(tmp_path), input_file=RESNET18, mode="fast"
    )
    prepared = prepare(config)
    said = []
    tuning = SimpleNamespace(
        target=prepared.target, config=config, log=SimpleNamespace(write=said.append)
    )
    covered = custom_coverage(tuning, prepared.problems, prepared.layout.source)
    convolutions = {e.problem.name for e in prepared.problems if e.problem.kind == "convolution"}
    assert set(covered) == convolutions and len(convolutions) >= 9, said
    assert len({op.key() for op in covered.values()}) == len(convolutions)
    assert all(op.op_form for op in covered.values())
    dry_run(prepared, covered)
    lines = [line for line in capsys.readouterr().out.splitlines() if " points, " in line]
    assert len(lines) == len(prepared.problems)
    assert sum(line.endswith("; custom kernels: igemm_conv") for line in lines) == len(covered)
    assert [line for line in lines if "matmul" in line][0].endswith("custom kernels: matmul_triton")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
def test_the_kernels_give_numpys_answer_on_the_gpu(shape, tmp_path):
    from autosched.kernels.igemm_conv import kernel as family

    target = make_target(RunConfig(target="cuda", arch="sm_90"))
    problem = nchw_problem(*shape)
    for params in (family.ConvParams(64, 64, 32, 4, 3), family.ConvParams(128, 128, 64, 8, 3)):
        out, expected = _kernel_and_numpy(problem, params, target, tmp_path)
        assert np.abs(out - expected).max() < 1e-3 * np.abs(expected).max(), params.name


PADDED_SHAPES = [(16, 64, 56, 64, 3, 1), (16, 128, 28, 128, 3, 2)]


def _padded(shape):
    """(the op form of a torch Conv2d, the same reading its image before the pad)."""
    from autosched.rewrite.conv_padding import padded_form

    problem = nchw_problem(*shape)
    pad = shape[4] // 2
    return problem, padded_form(problem, ((0, 0), (0, 0), (pad, pad), (pad, pad)))


@pytest.mark.parametrize("shape", PADDED_SHAPES)
def test_a_kernel_that_pads_the_image_itself_still_pipelines_its_loads(shape, tmp_path):
    """The taps outside the unpadded image are masked loads: Triton still copies the tiles
    asynchronously (its masked cp.async fills zeros) and runs wgmma."""
    pytest.importorskip("triton")
    from autosched.kernels.igemm_conv import kernel as family

    _, padded = _padded(shape)
    constants = family._constants(padded, family.ConvParams(64, 64, 32, 4, 3))
    assert constants["PADDED"] and (constants["PH"], constants["IH"]) == (1, shape[2])
    binary = family.compile_kernel(
        padded, family.ConvParams(64, 64, 32, 4, 3), "sm_90", str(tmp_path / "p.ptx")
    )
    ptx = open(binary.ptx_path).read()
    assert "wgmma" in ptx and "cp.async" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("shape", PADDED_SHAPES)
def test_a_kernel_that_pads_the_image_itself_gives_numpys_answer(shape, tmp_path):
    """Fed the image before its pad, the kernel gives numpy's convolution of the padded one."""
    from autosched.kernels.extern import extern_module_text
    from autosched.kernels.igemm_conv import kernel as family

    target = make_target(RunConfig(target="cuda", arch="sm_90"))
    problem, padded = _padded(shape)
    image, kernel = _operands(padded)
    pads = [(0, 0)] * 2 + [(shape[4] // 2,) * 2] * 2
    whole = np.pad(image.astype(np.float64), pads)
    expected = problem.reference(whole, kernel.astype(np.float64))
    params = family.ConvParams(64, 64, 32, 4, 3)
    binary = family.compile_kernel(padded, params, "sm_90", str(tmp_path / "k.ptx"))
    executable = target.executable_target()
    body = family.extern_function(padded, params, binary, executable, "main")
    vmfb = compiler.compile_str(
        extern_module_text(executable, body), extra_args=target.compile_flags()
    )
    out = _run(vmfb, "cuda", image, kernel)
    assert np.abs(out - expected).max() < 1e-3 * np.abs(expected).max()


def _kernel_and_numpy(problem, params, target, tmp_path):
    """(the Triton point's output through IREE on the GPU, numpy's) on seeded operands."""
    from autosched.kernels.extern import extern_module_text
    from autosched.kernels.igemm_conv import kernel as family

    image, kernel = _operands(problem)
    expected = problem.reference(image.astype(np.float64), kernel.astype(np.float64))
    binary = family.compile_kernel(problem, params, "sm_90", str(tmp_path / "k.ptx"))
    executable = target.executable_target()
    body = family.extern_function(problem, params, binary, executable, "main")
    vmfb = compiler.compile_str(
        extern_module_text(executable, body), extra_args=target.compile_flags()
    )
    return _run(vmfb, "cuda", image, kernel), expected


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["none", "auto"])
def test_resnet18_with_triton_convolutions_gives_the_default_builds_outputs(
    layout, request, tmp_path, monkeypatch
):
    """`autosched apply MODEL --custom SPEC` on the GPU: every convolution a Triton kernel
    with its epilogue, and the outputs match IREE's default build; in the model as given
    (`layout = none`) and in the channels-last layout `auto` chooses on sm_90."""
    from click.testing import CliRunner

    from autosched.cli import cli

    if layout == "none":
        folder = request.getfixturevalue("resnet18_rewritten")[-1]
    else:  # the layout as the run chooses it, strided 1x1 convolutions' barriers and all
        folder = _channels_last_spec(tmp_path / "cl")
    cfg = tmp_path / "auto-scheduler.cfg"
    cfg.write_text(f"[SearchStrategy]\nlayout = {layout}\n")
    monkeypatch.chdir(tmp_path)
    arguments = ["apply", RESNET18, "--custom", str(folder / "custom.mlir"), "--target", "cuda"]
    result = CliRunner().invoke(cli, [*arguments, "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (20 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


def test_a_triton_point_and_the_default_compile_through_the_runs_own_jobs(tmp_path):
    """What the custom pass builds for an op form: IREE's default of the op alone and a
    Triton point (its PTX and extern module written by the compile pool's own step), each
    timed `repeat` times a call; and the inputs and numpy answer it checks them with."""
    pytest.importorskip("triton")
    from autosched.measure.worker import make_problem_data
    from autosched.run.builds import kernel_job

    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    problem = nchw_problem(2, 16, 9, 24, 3, 2)
    point = target.for_problem(problem).starting_points(problem)[0]
    for name, chosen in (("default", None), ("triton", point)):
        job = kernel_job(problem, target, chosen, str(tmp_path / f"{name}.mlir"), 10)
        built = compile_one(job, 300)
        assert built.status == "ok", built.message
    assert "hal.dispatch.extern" in (tmp_path / "triton.mlir").read_text()
    data = make_problem_data(problem, str(tmp_path / "data"))
    assert len(data.inputs) == 2 and data.reference.shape == tuple(problem.output_shape)


@pytest.fixture(scope="module")
def resnet18_channels_last(tmp_path_factory):
    """resnet18 in the channels-last layout (`layout = channels_last`), and its op forms."""
    from autosched.model.layouts import choose_layout

    folder = tmp_path_factory.mktemp("resnet18_cl")
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    layout = choose_layout(RESNET18, target.compile_flags(), str(folder), 0, channels_last=True)
    ops = model_convolutions(layout.source, target.compile_flags(), str(folder))
    return target, layout, ops, folder


def test_in_the_channels_last_layout_the_kernels_take_every_operand_as_it_is(
    resnet18_channels_last,
):
    """IREE's conversion and transpose propagation leave each convolution an NHWC image and
    a filter the kernel reads as stored where a channel dim is contiguous (pointwise ones):
    the kernel's function transposes no image and no pointwise filter on each call."""
    from autosched.kernels.igemm_conv import kernel as family

    _, layout, ops, _ = resnet18_channels_last
    assert layout.channels_last and "NHWC" in layout.describe()
    assert sum(len(op.sites) for op in ops) == 20  # every convolution has its op form
    for op in ops:
        (_, image_permutation), (_, filter_permutation) = family.kernel_operands(op)
        assert image_permutation == sorted(image_permutation), op.name
        if op.form == POINTWISE:
            assert filter_permutation == sorted(filter_permutation), op.name
            assert family.filter_order(op) == ["f", "c"]


@pytest.mark.gpu
def test_the_kernels_give_numpys_answer_on_channels_last_op_forms(resnet18_channels_last, tmp_path):
    """A window and a pointwise op form of the channels-last resnet18 (the pointwise one
    reads its F x C filter as stored) against numpy through IREE on the GPU."""
    from autosched.kernels.igemm_conv import kernel as family

    target, _, ops, _ = resnet18_channels_last
    chosen = [next(op for op in ops if op.form == form) for form in ("window", POINTWISE)]
    for problem in chosen:
        params = family.ConvParams(64, 64, 32, 4, 3)
        out, expected = _kernel_and_numpy(problem, params, target, tmp_path)
        assert np.abs(out - expected).max() < 1e-3 * np.abs(expected).max(), problem.name


def test_each_convolution_of_resnet18_keeps_its_epilogue_in_its_kernel(
    resnet18_channels_last, tmp_path
):
    """After IREE's elementwise fusion each convolution's batch norm, ReLU (and residual
    add) is one generic: read as Triton statements (per-channel parameters, the residual in
    the output's layout), and compiled into the kernel (PTX, no GPU)."""
    pytest.importorskip("triton")
    from autosched.kernels.igemm_conv import kernel as family
    from autosched.ops.epilogue import CHANNEL, FULL

    target, layout, ops, folder = resnet18_channels_last
    found = winners_epilogues(layout.source, target.compile_flags(), str(folder), ops)
    assert all(found[op.key()] for op in ops)  # every convolution has one
    epilogues = [e for op in ops for e in found[op.key()]]
    kinds = {x.kind for e in epilogues for x in e.inputs}
    assert {CHANNEL, FULL} <= kinds  # batch norm parameters, and a residual
    relu = next(e for e in epilogues if any("tl.where" in s for s in e.statements))
    assert relu.statements[-1].startswith("out = ") and relu.narrow == "f16"
    op = next(op for op in ops if relu in found[op.key()])
    params = family.ConvParams(64, 64, 32, 4, 3)
    binary = family.compile_kernel(op, params, "sm_90", str(tmp_path / "e.ptx"), relu)
    assert "wgmma" in open(binary.ptx_path).read()
    assert binary.pointers >= 3 + len(relu.extras)  # the image, filter, extras and output


def test_epilogues_the_spec_cannot_tell_apart_get_no_arm():
    """Two epilogues of the same types but other statements (a ReLU, and none): the spec's
    matcher sees only types, so neither is kept in a kernel; a third of other types is."""
    from autosched.ops.epilogue import ACC, CHANNEL, Epilogue, EpilogueInput

    acc = EpilogueInput(ACC, "tensor<2x4x4x8xf16>", "f16")
    scale = EpilogueInput(CHANNEL, "tensor<8xf16>", "f16")
    out = ("tensor<2x4x4x8xf16>", "f16", "f16")
    relu = Epilogue((acc, scale), *out, ("v0 = a0 * a1", "out = tl.maximum(v0, 0.0)"))
    plain = Epilogue((acc, scale), *out, ("v0 = a0 * a1", "out = v0"))
    alone = Epilogue((acc,), *out, ("out = a0",))
    assert unambiguous([relu, plain, alone]) == [alone]
    assert unambiguous([relu, alone]) == [relu, alone]
    # ... nor one whose types an epilogue with no Triton form (a tanh, say) also has
    assert unambiguous([relu, alone], {relu.signature}) == [alone]


def test_a_failing_elementwise_fusion_is_a_recorded_reason(tmp_path, monkeypatch):
    """iree-opt failing on the model (swapped for a failing wrapper, as the fault tests do)
    is a RuntimeError with its telling line, which the custom route records as why the
    Triton kernels were not searched, not an internal error of the run."""
    failing = tmp_path / "iree-opt"
    failing.write_text("#!/bin/sh\necho 'error: no fusion today' >&2\nexit 3\n")
    failing.chmod(0o755)
    monkeypatch.setenv("AUTOSCHED_IREE_OPT", str(failing))
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    with pytest.raises(RuntimeError, match="no fusion today"):
        model_convolutions(RESNET18, target.compile_flags(), str(tmp_path / "work"))


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_a_runs_custom_spec_keeps_a_winners_epilogue(tmp_path):
    """The run's own spec writer (`write_custom_spec` with the model and the run's model
    folder) reads the convolution's epilogue where `convolution_forms` read its op form and
    writes its arm: a model run reaches what the tests above build by hand."""
    pytest.importorskip("triton")
    from test_cuda_convolution import analysed

    from autosched.drivers.custom_route import write_custom_spec
    from autosched.outputs.records import Trial
    from autosched.outputs.report import RunLog
    from autosched.run.problem import ProblemResult
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90", ptxas="none"), Machine(triton=True))
    work = tmp_path / "model"
    ops = model_convolutions(RESNET18, target.compile_flags(), str(work / "convolution"))
    problems, _ = analysed(RESNET18)
    entry = next(e for e in problems if e.problem.kind == "convolution" and paired(e.problem, ops))
    op = paired(entry.problem, ops)
    point = target.for_kind("convolution").starting_points(op)[0]
    best = Trial(op.name, "cuda", "sm_90", "triton", point, False, "ok", median_ms=0.01)
    found = ProblemResult(op, None, [best], best=best, best_ms=0.01, baseline_ms=0.3)
    campaign = ProblemResult(entry.problem, None, [], baseline_ms=0.3)
    entry = dataclasses.replace(entry, result=campaign)  # the shared reading stays as it is
    spec = str(tmp_path / "results.custom.mlir")
    log = RunLog(str(tmp_path / "run.log"))
    written = write_custom_spec(
        spec, target, [entry], {entry.problem.name: found}, log, (RESNET18, str(work))
    )
    assert written and "@match_epilogue_0_0 -> @call_epilogue_0_0" in open(spec).read()
    logged = (tmp_path / "run.log").read_text()
    assert "epilogues kept in their kernels: " in logged
    assert "convolutions whose kernel pads the image itself: " in logged


class _Tile(np.ndarray):
    """A numpy array with Triton's `.to(dtype)`, to run an epilogue's statements."""

    def to(self, dtype):
        return self.astype(dtype).view(_Tile)


def tile(array) -> _Tile:
    return np.asarray(array).view(_Tile)


def numpy_tl():
    """The part of `triton.language` an epilogue uses, in numpy (a load takes what a
    `NumpyPointer` plus offsets gathered)."""
    from types import SimpleNamespace

    import ml_dtypes

    return SimpleNamespace(
        float16=np.float16, float32=np.float32, bfloat16=ml_dtypes.bfloat16,
        full=lambda shape, value, dtype: tile(np.full(shape, value, dtype)),
        where=lambda c, a, b: tile(np.where(c, a, b)),
        maximum=lambda a, b: tile(np.maximum(a, b)), minimum=lambda a, b: tile(np.minimum(a, b)),
        exp=lambda a: tile(np.exp(a)), sqrt=lambda a: tile(np.sqrt(a)),
        abs=lambda a: tile(np.abs(a)),
        fdiv=lambda a, b, ieee_rounding=True: tile(np.divide(a, b)),
        math=SimpleNamespace(
            rsqrt=lambda a: tile(1 / np.sqrt(a)), erf=lambda a: tile(np.vectorize(math.erf)(a))
        ),
        reshape=lambda x, shape: tile(np.reshape(x, shape)),
        permute=lambda x, dims: tile(np.transpose(x, dims)),
        split=lambda x: (tile(x[..., 0]), tile(x[..., 1])),
        join=lambda a, b: tile(np.stack([a, b], axis=-1)),
        load=lambda gathered, mask=None, other=None: tile(gathered),
    )  # fmt: skip


class NumpyPointer:
    """A kernel's pointer to a tensor, for `numpy_tl`: plus offsets, the elements there."""

    def __init__(self, array: np.ndarray):
        self.flat = np.asarray(array).reshape(-1)

    def __add__(self, offsets):
        return self.flat[np.asarray(offsets)]


def _numpy_statements(epilogue, inputs: list[np.ndarray]) -> np.ndarray:
    """The epilogue's Triton statements run by numpy on the whole output (pixels x output
    channels, as the kernel's tiles are), its inputs as the kernel loads them."""
    names = {"tl": numpy_tl()}
    for position, array in enumerate(inputs):
        shaped = array.reshape(1, -1) if array.ndim == 1 else array.reshape(-1, array.shape[-1])
        names[f"a{position}"] = tile(shaped)
    exec("\n".join(epilogue.statements), names)  # the kernel's own lines, as Python
    return np.asarray(names["out"])


def _alone(op) -> str:
    """A module whose `main` is the epilogue generic `op` alone (its captured constants
    copied in), for IREE to compute it on the CPU."""
    from iree.compiler.dialects import func, tensor

    from autosched.ir_walk import walk_ops

    with op.context, ir.Location.unknown():
        module = ir.Module.create()
        inputs = [value.type for value in list(op.operands)[:-1]]
        result = ir.RankedTensorType(op.results[0].type)
        with ir.InsertionPoint(module.body):
            main = func.FuncOp("main", (inputs, [result]))
            block = main.add_entry_block()
            with ir.InsertionPoint(block):
                init = tensor.EmptyOp(result.shape, result.element_type)
                copy = op.clone()
                for position, argument in enumerate(block.arguments):
                    copy.operands[position] = argument
                copy.operands[len(inputs)] = init.result
                constants = {}  # the outer constants the body reads, copied in once
                for inner in walk_ops(copy):
                    for index, value in enumerate(inner.operands):
                        owner = value.owner
                        if isinstance(owner, ir.Block) or owner.operation.parent.name not in (
                            "util.func",
                            "func.func",
                        ):
                            continue
                        if value not in constants:
                            point = ir.InsertionPoint(copy)
                            constants[value] = owner.operation.clone(ip=point).results[0]
                        inner.operands[index] = constants[value]  # the model stays as it is
                func.ReturnOp([copy.results[0]])
    return str(module)


def test_each_epilogues_statements_compute_what_iree_computes(resnet18_channels_last):
    """The Triton statements of every epilogue of resnet18 (channels-last), run by numpy on
    the tiles the kernel loads, against the same generic built alone by IREE for the CPU:
    the translation of its body (casts, the batch norm, the residual add, ReLU's compare and
    select, the captured zero) keeps its answers."""
    from autosched.ops.convolution_kind import ConvolutionKind
    from autosched.rewrite.common import FUSED_MODEL, op_convolution

    *_, folder = resnet18_channels_last
    kind = ConvolutionKind()
    checked = epilogues_against_iree(
        str(folder / FUSED_MODEL),
        lambda op: op_convolution(op, kind) if op.name.startswith("linalg") else None,
        lambda tensor: np.float32 if "f32" in tensor else np.float16,
        lambda got, expected: np.abs(got - expected).max() < 2e-2,
        spread=2,
    )
    assert checked >= 3  # batch norm and ReLU, with a residual, with a downsampling one


def _cpu_module(generic) -> bytes:
    """The generic alone (`_alone`), built by IREE for the CPU."""
    return compiler.compile_str(
        _alone(generic), target_backends=["llvm-cpu"],
        extra_args=["--iree-llvmcpu-target-cpu=generic"],
    )  # fmt: skip


def _drawn(generic, rng, element, spread: float) -> list[np.ndarray]:
    """Seeded inputs of the generic in [-spread, spread], typed by `element`."""
    return [
        rng.uniform(-spread, spread, ir.RankedTensorType(v.type).shape).astype(element(str(v.type)))
        for v in list(generic.operands)[:-1]
    ]


def _then_generic(generic):
    """The generic that reads `generic`'s result through reshapes (an epilogue's `then`)."""
    from autosched.rewrite.common import RESHAPES, single_user

    user = single_user(generic.results[0])
    while user.name in RESHAPES:
        user = single_user(user.results[0])
    return user


def epilogues_against_iree(fused: str, problem_of, element, close, spread: float) -> int:
    """Each distinct epilogue of the module at `fused` (after the op `problem_of` gives a
    problem for) run by numpy and by IREE on the CPU (its generic alone) on seeded inputs in
    [-spread, spread] of the numpy type `element` gives for its type: `close(got, expected)`
    for each; returns how many were checked."""
    from autosched.ir_walk import walk_ops
    from autosched.rewrite.epilogues import after_contraction, epilogue_of

    module = ir.Module.parseFile(fused, ir.Context())
    checked = set()
    for op in list(walk_ops(module.operation)):
        problem = problem_of(op)
        epilogue = epilogue_of(op, problem) if problem else None
        if not hasattr(epilogue, "statements") or epilogue.statements in checked:
            continue
        if epilogue.period > 1:  # RoPE's chain: tests/test_rotary_epilogues.py
            continue
        checked.add(epilogue.statements)
        rng = np.random.default_rng(len(checked))
        generic = after_contraction(op)[1]
        inputs = _drawn(generic, rng, element, spread)
        expected = _run(_cpu_module(generic), "local-task", *inputs)
        if epilogue.then is not None:  # its second generic on the first's result, reshaped
            then = _then_generic(generic)
            added = _drawn(then, rng, element, spread)
            operands = [np.asarray(x) for x in added]
            operands[epilogue.then.acc] = expected.reshape(operands[epilogue.then.acc].shape)
            expected = _run(_cpu_module(then), "local-task", *operands)
            positions = epilogue.then.positions
            inputs = [*inputs, *(added[p] for p in positions)]
        expected = expected.astype(np.float32)
        got = _numpy_statements(epilogue, inputs).astype(np.float32)
        assert close(got.reshape(expected.shape), expected), epilogue.statements
    return len(checked)


def test_an_rgb_image_and_its_filter_are_read_as_stored(tmp_path):
    """ViT-B/16's patch convolution (3 channels, 16x16 taps, stride 16): the kernel reads the
    NCHW image and the FCHW filter as stored, a filter row's taps of every channel one step
    along K, so its function has no transpose (made channels-last, the image was a dispatch
    of its own, 0.099 ms on the H100), and its loads stay 16-byte asynchronous copies. An
    image of 16 channels is still read channels-last."""
    pytest.importorskip("triton")
    from autosched.kernels.igemm_conv import kernel as family

    target = make_target(RunConfig(target="cuda", arch="sm_90"))
    params = family.ConvParams(128, 128, 64, 8, 3)
    patch, wide = nchw_problem(32, 3, 224, 768, 16, 16), nchw_problem(2, 16, 9, 24, 3, 1)
    assert family.taps_in_k(patch) and not family.taps_in_k(wide)
    constants = family._constants(patch, params)
    assert (constants["KW_IN"], constants["C"], constants["KW"]) == (16, 48, 1)
    for problem, transposes in ((patch, 0), (wide, 2)):
        binary = family.compile_kernel(problem, params, "sm_90", str(tmp_path / "k.ptx"))
        body = family.extern_function(problem, params, binary, target.executable_target(), "f")
        assert body.count("linalg.transpose") == transposes
    ptx = open(
        family.compile_kernel(patch, params, "sm_90", str(tmp_path / "p.ptx")).ptx_path
    ).read()
    assert "wgmma" in ptx and "cp.async.cg.shared.global" in ptx and ", 0x10," in ptx
