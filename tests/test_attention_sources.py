"""The flash kernel reading K and V as the model holds them (issue 24): transformers' Llama
layer (bf16, GQA 4/2 heads) repeats K and V for each query head of a group, and transposes
V, in copies before SDPA; the kernel absorbs both."""

from __future__ import annotations

import os

import numpy as np
import pytest
from iree.compiler import ir

from autosched.config import RunConfig
from autosched.ir_walk import walk_ops
from autosched.kernels.attention_layout import operand_strides
from autosched.kernels.flash_attention.family import FLASH
from autosched.rewrite.attention_ops import model_attentions
from autosched.rewrite.attention_sources import winners_absorbed
from autosched.targets import make_target

LLAMA_BF16 = os.path.join(os.path.dirname(__file__), "data", "models", "hf_llama_layer_bf16.mlirbc")
SM90 = make_target(RunConfig(target="cuda", arch="sm_90"))
FLASH_POINT = {"kernel": FLASH, "q_tile": 64, "kv_tile": 64, "q_warps": 4, "kv_stages": 3}


def read_absorbed(model_path: str, folder) -> tuple:
    """(the model's one attention op form, its absorbed forms, the work folder)."""
    (op,) = model_attentions(model_path, SM90.compile_flags(), str(folder / "ops"))
    found = winners_absorbed(model_path, SM90.compile_flags(), str(folder / "fused"), [op])
    return op, found[op.name], folder


@pytest.fixture(scope="module")
def llama_absorbed(tmp_path_factory):
    """(the attention's op form, its form over K's and V's sources, the work folder)."""
    return read_absorbed(LLAMA_BF16, tmp_path_factory.mktemp("absorbed"))


def test_the_kernel_reads_k_and_v_before_their_copies(llama_absorbed):
    """The op's batch (4 query heads) is split into 2 KV heads x 2 heads per group; K is
    read from the 2 KV heads, V from the v projection's seq x heads x dim, neither repeated."""
    op, forms, _ = llama_absorbed
    writing, reading = forms  # the one that writes the result's transposed layout first
    assert writing.inputs == reading.inputs and reading.output is None
    assert [s.operand for s in reading.inputs] == [1, 2]
    assert [s.source_type for s in reading.inputs] == [
        "tensor<2x64x32xbf16>",  # K, RoPE'd, per KV head
        "tensor<64x2x32xbf16>",  # V as its projection wrote it
    ]
    assert writing.output.copy_type == "tensor<1x64x4x32xbf16>"  # seq x heads x dim: o_proj's
    for absorbed in forms:
        form = absorbed.problem
        assert form.batch_sizes == [2, 2] and form.heads_per_kv == 2 and form.causal
        sizes = (form.size("m"), form.size("k1"), form.size("k2"), form.size("n"))
        assert sizes == (64, 32, 64, 32) and op.flops == form.flops


def _copied(source, dims: list[int], shape: list[int]) -> np.ndarray:
    """What a copy generic computes: out[i] = source[i's dims the input map reads]."""
    index = np.indices(shape)
    return source[tuple(index[d] for d in dims)]


def test_each_operands_strides_read_what_the_copy_would_have_written(llama_absorbed):
    """The absorbed form's strides, applied to K's and V's sources, read for every batch
    entry, key row and head dim the element the copy and its collapse give the op; applied
    to the output, they store each element where the expand and the transposing copy after
    the op put it: the kernel reads and writes the same numbers without the copies."""
    op, (writing, _), _ = llama_absorbed
    form = writing.problem
    rng = np.random.default_rng(0)
    b0, b1 = form.batch_sizes
    for source in writing.sources:
        with ir.Context():
            input_map = ir.AffineMapAttr(ir.Attribute.parse(source.input_map)).value
            shape = ir.RankedTensorType(ir.Type.parse(source.source_type)).shape
            copy_shape = ir.RankedTensorType(ir.Type.parse(source.copy_type)).shape
            dims = [ir.AffineDimExpr(e).position for e in input_map.results]
        strides = operand_strides(form, source.operand)
        row, column = {1: ("k2", "k1"), 2: ("k2", "n"), 4: ("m", "n")}[source.operand]
        rows = np.arange(form.size(row))[:, None] * strides[row]
        columns = np.arange(form.size(column))[None, :] * strides[column]
        if source.operand == writing.output.operand:  # where the kernel stores each element
            result = rng.standard_normal(op.output_shape)  # the attention's, as the op has it
            expected = _copied(result.reshape(shape), dims, copy_shape).reshape(-1)
            written = np.zeros_like(expected)
            for entry in range(b0 * b1):
                base = (entry // b1) * strides["b0"] + (entry % b1) * strides["b1"]
                written[base + rows + columns] = result[entry]
            np.testing.assert_array_equal(written, expected)
            continue
        data = rng.standard_normal(shape)
        expected = _copied(data, dims, copy_shape).reshape(op.operand_shape(source.operand))
        flat = data.reshape(-1)
        for entry in range(b0 * b1):
            base = (entry // b1) * strides["b0"] + (entry % b1) * strides["b1"]
            got = flat[base + rows + columns]
            want = expected[entry] if source.operand == 1 else expected[entry].T
            np.testing.assert_array_equal(got, want)


def rewritten_both_ways(model_path: str, absorbed_fixture) -> dict[bool, list]:
    """The model's ops after the flash kernel's substitution without and with its absorbed
    arms (absorbing -> each op's name and first result type); the absorbing one built for
    sm_90."""
    pytest.importorskip("triton")
    from autosched.compile import CompileJob, compile_one
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
    from autosched.rewrite.spec import write_substitution

    op, absorbed, folder = absorbed_fixture
    found = {}
    for absorbing in (False, True):
        spec = str(folder / f"custom_{absorbing}.mlir")
        forms = {op.name: absorbed} if absorbing else None
        assert write_substitution(spec, [(op, FLASH_POINT)], SM90, absorbed=forms) == []
        out = str(folder / f"rewritten_{absorbing}.mlir")
        rewritten, replaced = rewrite_model(model_path, spec, SM90.compile_flags(), out, 300)
        assert replaced == 1
        module = ir.Module.parseFile(rewritten, ir.Context())
        found[absorbing] = [
            (o.name, str(o.results[0].type) if len(o.results) else "")
            for o in walk_ops(module.operation)
        ]  # read while the module lives
    flags = [*SM90.compile_flags(), RESUME_FLAG]
    built = compile_one(CompileJob(rewritten, str(folder / "m.vmfb"), flags), 300)
    assert built.status == "ok", built.message
    return found


@pytest.mark.slow  # over 5 s on two cores: the README's command stays under 10 minutes
def test_the_rewritten_layer_has_no_copy_of_k_or_v(llama_absorbed):
    """With the flash kernel's absorbed arms the spec calls it on K's and V's sources, in
    place of the transposing copy of its result: the repeat and both transposes are left
    dead and removed, and the layer builds for sm_90."""
    ops = rewritten_both_ways(LLAMA_BF16, llama_absorbed)
    counts = {
        absorbing: {kind for name, kind in found if name == "linalg.generic"}
        for absorbing, found in ops.items()
    }
    copies = {source.copy_type for source in llama_absorbed[1][0].sources}  # K's, V's, out's
    assert len(copies) == 3 and copies <= counts[False] and not copies & counts[True]


@pytest.mark.gpu
def test_the_layer_with_k_and_v_read_before_their_copies_gives_the_default_builds_outputs(
    llama_absorbed, tmp_path, monkeypatch
):
    """On the GPU: the attention as the flash kernel reading K and V's sources, and the
    outputs match IREE's default build."""
    from click.testing import CliRunner

    from autosched.cli import cli
    from autosched.rewrite.spec import write_substitution

    op, absorbed, _ = llama_absorbed
    spec = str(tmp_path / "custom.mlir")
    assert write_substitution(spec, [(op, FLASH_POINT)], SM90, absorbed={op.name: absorbed}) == []
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", LLAMA_BF16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (1 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


def test_a_runs_custom_spec_reads_k_and_v_before_their_copies(llama_absorbed, tmp_path):
    """The run's own spec writer (`write_custom_spec` with the model) reads the flash
    winner's copied operands from the model and writes the absorbed arm first, and says so
    in run.log: a model run reaches what the tests above build by hand."""
    import dataclasses

    from autosched.drivers.custom_route import write_custom_spec
    from autosched.drivers.model_stages.prepare import model_problems
    from autosched.model.lowering import analyze_model
    from autosched.outputs.records import Trial
    from autosched.outputs.report import RunLog
    from autosched.run.problem import ProblemResult

    pytest.importorskip("triton")
    op, *_ = llama_absorbed
    problems, _ = model_problems(analyze_model(LLAMA_BF16, SM90.compile_flags()), SM90)
    entry = next(e for e in problems if e.problem.kind == "attention")
    best = Trial(op.name, "cuda", "sm_90", "flash", FLASH_POINT, False, "ok", median_ms=0.01)
    found = ProblemResult(op, None, [best], best=best, best_ms=0.01, baseline_ms=0.3)
    entry = dataclasses.replace(
        entry, result=ProblemResult(entry.problem, None, [], baseline_ms=0.3)
    )
    spec = str(tmp_path / "results.custom.mlir")
    log = RunLog(str(tmp_path / "run.log"))
    model_and_work = (LLAMA_BF16, str(tmp_path / "model"))
    written = write_custom_spec(
        spec, SM90, [entry], {entry.problem.name: found}, log, model_and_work
    )
    text = open(written).read()
    arms = ["@match_absorbed_0_0 ->", "@match_absorbed_0_1 ->", "@match_custom_0 ->"]
    assert [text.index(arm) for arm in arms] == sorted(text.index(arm) for arm in arms)
    logged = (tmp_path / "run.log").read_text()
    assert "the kernel reads K, V as the model holds them and writes its result" in logged


@pytest.fixture(
    scope="module",
    params=[False, pytest.param(True, marks=pytest.mark.slow)],  # the second about 25 s
    ids=["norms_to_iree", "norms_in_kernels"],
)
def llama_every_kernel(llama_absorbed, request):
    """The Llama layer's spec with every custom kernel: the 7 matmuls (weights as stored,
    truncfs behind reshapes, epilogues; with the param, the RMSNorms before q, k, v, gate
    and up in their kernels) and the flash kernel (K, V and its result as the model holds
    them); (its path, the model lowered for sm_90, whether the norms are in)."""
    from test_matmul_epilogues import POINT

    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.lowering import analyze_model
    from autosched.rewrite.epilogues import winners_epilogues
    from autosched.rewrite.narrow_reshapes import model_reshape_chains
    from autosched.rewrite.row_norms import winners_norms
    from autosched.rewrite.spec import write_substitution
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    op, forms, folder = llama_absorbed
    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    model = model_for_target(LLAMA_BF16, target, str(folder / "every"))
    flags = target.compile_flags()
    contractions = analyze_model(model, flags).contractions
    matmuls = list({p.name: p for c in contractions if (p := c.as_matmul_problem())}.values())
    chains = model_reshape_chains(model, flags, str(folder / "every_narrow"))
    epilogues = winners_epilogues(model, flags, str(folder / "every_fused"), matmuls)
    norms = None
    if request.param:
        norms = winners_norms(model, flags, str(folder / "every_fused"), matmuls)
    winners = [*((p, POINT) for p in matmuls), (op, FLASH_POINT)]
    spec = str(folder / f"every_{request.param}.mlir")
    absorbed = {op.name: forms}
    assert write_substitution(spec, winners, target, chains, epilogues, absorbed, None, norms) == []
    return spec, model, request.param


def test_with_every_kernel_only_rmsnorm_is_left_to_iree(llama_every_kernel, tmp_path):
    """Every arm together on the layer: 8 kernels, the attention's output written in
    o_proj's seq x heads x dim, q and k with their RoPE, and of IREE's element-wise work only
    the two RMSNorms (4 generics each) left, or none with the norms in the kernels after
    them; the layer builds for sm_90."""
    from autosched.compile import CompileJob, compile_one
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model

    spec, model, norms_in = llama_every_kernel
    out = str(tmp_path / "every.mlir")
    rewritten, replaced = rewrite_model(model, spec, SM90.compile_flags(), out, 300)
    assert replaced == 8
    module = ir.Module.parseFile(rewritten, ir.Context())  # alive while its ops are read
    ops = list(walk_ops(module.operation))
    externs = [str(o.results[0].type) for o in ops if o.name == "hal.dispatch.extern"]
    assert "tensor<64x2x2x32xbf16>" in externs  # the attention, in seq x heads x dim
    assert len([o for o in ops if o.name == "linalg.generic"]) == (0 if norms_in else 2 * 4)
    flags = [*SM90.compile_flags(), RESUME_FLAG]
    built = compile_one(CompileJob(rewritten, str(tmp_path / "every.vmfb"), flags), 300)
    assert built.status == "ok", built.message


@pytest.mark.gpu
def test_the_layer_with_every_kernel_gives_the_default_builds_outputs(
    llama_every_kernel, tmp_path, monkeypatch
):
    """On the GPU: the layer with every custom kernel and absorbed layout op (and with
    the norms in the kernels), against IREE's default build."""
    from click.testing import CliRunner

    from autosched.cli import cli

    spec, *_ = llama_every_kernel
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", LLAMA_BF16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (8 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


GPT2_F16 = os.path.join(os.path.dirname(__file__), "data", "models", "hf_gpt2_block_f16.mlirbc")


@pytest.fixture(scope="module")
def gpt2_absorbed(tmp_path_factory):
    """(the GPT-2 block's attention op form, its absorbed forms, the work folder)."""
    return read_absorbed(GPT2_F16, tmp_path_factory.mktemp("gpt2_absorbed"))


def test_q_k_and_v_are_read_as_slices_of_the_fused_projection(gpt2_absorbed):
    """GPT-2 splits its one q/k/v projection ([2, 32, 384]) into three slices of its last
    dim, each split into heads and transposed: the kernel reads each slice of the projection
    itself (its offset, the 128 columns it holds, rows 384 apart), with no copy."""
    op, forms, _ = gpt2_absorbed
    for form in forms:
        assert [s.operand for s in form.inputs] == [0, 1, 2]
        assert {s.read_type for s in form.inputs} == {"tensor<2x32x384xf16>"}
        assert form.problem.views == ((0, 128, 384), (128, 128, 384), (256, 128, 384))
        assert form.problem.flops == op.flops and form.problem.causal
    problem = forms[0].problem
    rng = np.random.default_rng(0)
    fused = rng.standard_normal((2, 32, 384))
    for operand in range(3):
        strides = operand_strides(problem, operand)
        offset = problem.views[operand][0]
        row, column = {0: ("m", "k1"), 1: ("k2", "k1"), 2: ("k2", "n")}[operand]
        heads = fused[..., offset : offset + 128].reshape(2, 32, 4, 32).transpose(0, 2, 1, 3)
        rows = np.arange(32)[:, None] * strides[row]
        columns = np.arange(32)[None, :] * strides[column]
        flat = fused.reshape(-1)
        for b in range(2):
            for h in range(4):
                base = offset + b * strides["b0"] + h * strides["b1"]
                np.testing.assert_array_equal(flat[base + rows + columns], heads[b, h])


def test_the_rewritten_block_has_no_slice_copies(gpt2_absorbed):
    """With the absorbed arms the kernel takes the projection's result three times in place
    of the three slices IREE copies out of it: no extract_slice is left, and the block
    builds for sm_90."""
    ops = rewritten_both_ways(GPT2_F16, gpt2_absorbed)
    slices = {
        a: [name for name, _ in found].count("tensor.extract_slice") for a, found in ops.items()
    }
    assert slices == {False: 3, True: 0}
