"""The epilogue after a matmul kept in its Triton kernel (issue 24): transformers' Llama layer
(bf16), whose o and down projections add the residual and whose up projection multiplies
by SiLU(gate), each after the unit batch is collapsed and the f32 result rounded."""

from __future__ import annotations

import os

import numpy as np
import pytest
from iree.compiler import ir

from autosched.config import RunConfig
from autosched.ir_walk import walk_ops
from autosched.ops.epilogue import ACC, FULL

pytest.importorskip("triton")

LLAMA_BF16 = os.path.join(os.path.dirname(__file__), "data", "models", "hf_llama_layer_bf16.mlirbc")
POINT = {"tile_m": 64, "tile_n": 64, "tile_k": 64, "warps": 4, "pipeline_depth": 3, "group_m": 8}


def read_epilogues(model_path: str, folder) -> tuple:
    """(target, the model lowered for sm_90, its matmul problems, their epilogues, folder):
    what a run reads from a model before it writes its custom kernels' spec."""
    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.lowering import analyze_model
    from autosched.rewrite.epilogues import winners_epilogues
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    model = model_for_target(model_path, target, str(folder / "work"))
    contractions = analyze_model(model, target.compile_flags()).contractions
    problems = list({p.name: p for c in contractions if (p := c.as_matmul_problem())}.values())
    epilogues = winners_epilogues(model, target.compile_flags(), str(folder / "fused"), problems)
    return target, model, problems, epilogues, folder


def triton_spec(read: tuple, path: str, point: dict, epilogues) -> str:
    """Every matmul problem of a model (`read_epilogues`) as one Triton point, with the
    model's reshape chains (and `epilogues`): the spec's path."""
    from autosched.rewrite.narrow_reshapes import model_reshape_chains
    from autosched.rewrite.spec import write_substitution

    target, model, problems, _, folder = read
    chains = model_reshape_chains(model, target.compile_flags(), str(folder / "narrow"))
    winners = [(p, point) for p in problems]
    assert write_substitution(path, winners, target, chains, epilogues) == []
    return path


@pytest.fixture(scope="module")
def llama_epilogues(tmp_path_factory):
    """(target, the model lowered for sm_90, its matmul problems, their epilogues, folder)."""
    return read_epilogues(LLAMA_BF16, tmp_path_factory.mktemp("llama_epilogues"))


def _spec(llama_epilogues, with_epilogues: bool) -> str:
    """The Llama layer's spec (with its epilogues, or without)."""
    path = str(llama_epilogues[-1] / f"custom_{with_epilogues}.mlir")
    return triton_spec(llama_epilogues, path, POINT, llama_epilogues[3] if with_epilogues else None)


def test_the_llama_layers_matmul_epilogues_are_read(llama_epilogues):
    """The o and down projections' residual add, and SiLU(gate) times up after the up (and
    gate) projection: each read behind the collapse of the unit batch (q's and k's RoPE:
    tests/test_rotary_epilogues.py), RMSNorm left alone."""
    _, _, problems, epilogues, _ = llama_epilogues
    by_name = {p.name: epilogues[p.name] for p in problems}
    square = by_name["batch_matmul_1x64x128x128_bf16_bf16_f32"]  # q and o share the shape
    residual = [e for e in square if e.period == 1]
    assert [[x.kind for x in e.inputs] for e in residual] == [[FULL, ACC]]
    assert residual[0].statements == ("v0 = a0 + a1", "out = v0")
    assert residual[0].reshapes == 1 and residual[0].acc_shape == (64, 128)
    gated = by_name["batch_matmul_1x64x256x128_bf16_bf16_f32"]  # gate and up share it too
    assert sorted(tuple(x.kind for x in e.inputs) for e in gated) == [(ACC, FULL), (FULL, ACC)]
    assert any("tl.exp(" in line and "tl.float32" in line for line in gated[0].statements)
    assert (
        by_name["batch_matmul_1x64x128x256_bf16_bf16_f32"][0].statements == residual[0].statements
    )
    kv = by_name["batch_matmul_1x64x64x128_bf16_bf16_f32"]  # k's RoPE; v: a transpose
    assert [e.period for e in kv] == [32] and [e.period for e in square] == [32, 1]


@pytest.mark.slow  # over 5 s on two cores: the README's command stays under 10 minutes
def test_the_rewritten_layer_keeps_each_epilogue_in_its_kernel(llama_epilogues):
    """With the epilogues the three kernels write the epilogues' results (in the truncf's
    shape) and the residual adds and the SwiGLU product are gone from the model; the layer
    still builds for sm_90. Without them, the same kernels leave those ops to IREE."""
    from test_triton_kernels import _iree_compile

    from autosched.model.lowering import run_passes
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
    from autosched.rewrite.common import ELEMENTWISE_FUSION

    target, model, *_, folder = llama_epilogues
    flags = target.compile_flags()
    counts = {}
    for with_epilogues in (False, True):
        spec = _spec(llama_epilogues, with_epilogues)
        out = str(folder / f"rewritten_{with_epilogues}.mlir")
        rewritten, replaced = rewrite_model(model, spec, flags, out, 300)
        assert replaced == 7  # q, k, v, o, gate, up, down
        fused = f"{out}.fused.mlir"  # as IREE's dispatch creation fuses it (the spec did)
        run_passes(rewritten, f"builtin.module(util.func({ELEMENTWISE_FUSION}))", fused)
        module = ir.Module.parseFile(fused, ir.Context())
        ops = list(walk_ops(module.operation))
        externs = [str(op.results[0].type) for op in ops if op.name == "hal.dispatch.extern"]
        counts[with_epilogues] = (len([op for op in ops if op.name == "linalg.generic"]), externs)
    generics, externs = counts[True]
    # two residual adds, SiLU(gate) * up, and q's and k's RoPE (move, rotation, sum each)
    assert generics == counts[False][0] - 3 - 2 * 3
    assert externs.count("tensor<64x128xbf16>") == 2  # o and down, with the residual
    assert externs.count("tensor<64x256xbf16>") == 1  # up, times SiLU(gate)
    _iree_compile(rewritten, *flags, RESUME_FLAG, "--compile-to=stream")


def test_each_matmul_epilogues_statements_compute_what_iree_computes(llama_epilogues):
    """The Triton statements of the layer's epilogues, run by numpy (in bf16 where the
    kernel computes in bf16) against the same generic built alone by IREE for the CPU: the
    SiLU's exp, computed in f32 and rounded back, and the residual add keep IREE's answers."""
    import ml_dtypes
    from test_conv_kernels import epilogues_against_iree

    from autosched.rewrite.common import FUSED_MODEL
    from autosched.rewrite.common import is_problems_op as _is_problems_op

    *_, problems, _, folder = llama_epilogues

    def close(got, expected):  # bf16 rounds each step: two of its ulps (2^-7), or 0.01 near 0
        return (np.abs(got - expected) <= 2 * 2**-7 * np.abs(expected) + 0.01).all()

    checked = epilogues_against_iree(
        str(folder / "fused" / FUSED_MODEL),
        lambda op: next((p for p in problems if _is_problems_op(op, p)), None),
        lambda tensor: ml_dtypes.bfloat16,
        close,
        spread=4,
    )
    assert checked == 2  # the residual add, SiLU(gate) * up


@pytest.mark.gpu
def test_the_layer_with_epilogues_in_its_kernels_gives_the_default_builds_outputs(
    llama_epilogues, tmp_path, monkeypatch
):
    """On the GPU: every matmul of the Llama layer a Triton kernel, five of them with their
    epilogue (the residual adds, SiLU(gate) x up, q's and k's RoPE), and the outputs match
    IREE's default build."""
    from click.testing import CliRunner

    from autosched.cli import cli

    spec = _spec(llama_epilogues, with_epilogues=True)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", LLAMA_BF16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (7 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


SPECIALIZED = {**POINT, "persistent": 132, "specialized": 1}


def test_warp_specialized_kernels_keep_the_layers_epilogues(llama_epilogues):
    """Every matmul of the Llama layer as the warp-specialized kernel (Gluon: a loader warp
    feeding the MMA warps), each with its epilogue, a loader warpgroup beside its 4 MMA
    warps; where RoPE rotates heads within the tile, the persistent kernel. The rewritten
    layer builds for sm_90."""
    from test_triton_kernels import _iree_compile

    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model

    target, model, *_, folder = llama_epilogues
    spec = triton_spec(
        llama_epilogues, str(folder / "specialized.mlir"), SPECIALIZED, llama_epilogues[3]
    )
    module = ir.Module.parseFile(spec, ir.Context())
    sizes = [
        str(op.attributes["workgroup_size"])
        for op in walk_ops(module.operation)
        if op.name == "hal.dispatch.extern"
    ]
    threads = [int(size.split(" : ")[0].strip("[")) for size in sizes]
    # Every variant of the spec (plain, narrow, stored, with an epilogue) is a
    # warp-specialized kernel but q's and k's RoPE epilogues (each plain and stored).
    assert threads.count(4 * 32 + 128) == len(threads) - 4
    assert threads.count(4 * 32) == 4
    flags = target.compile_flags()
    out = str(folder / "rewritten_specialized.mlir")
    rewritten, replaced = rewrite_model(model, spec, flags, out, 300)
    assert replaced == 7
    _iree_compile(rewritten, *flags, RESUME_FLAG, "--compile-to=stream")


@pytest.mark.gpu
def test_warp_specialized_kernels_give_the_default_builds_outputs(
    llama_epilogues, tmp_path, monkeypatch
):
    """On the GPU: the layer with its matmuls as warp-specialized kernels (and their
    epilogues) gives IREE's default build's outputs."""
    from click.testing import CliRunner

    from autosched.cli import cli

    folder = llama_epilogues[-1]
    spec = triton_spec(
        llama_epilogues, str(folder / "specialized_gpu.mlir"), SPECIALIZED, llama_epilogues[3]
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", LLAMA_BF16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (7 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


def test_a_winner_whose_kernel_does_not_fit_the_gpu_is_refused_with_its_reason(
    llama_epilogues, monkeypatch
):
    """A kernel over the GPU's shared memory (in the BERT zoo model, a warp-specialized
    winner timed with an f16 output needed 278552 bytes in its op's f32 form) stops no run:
    the winner is refused with the reason, named as not placed, and no spec is written."""
    from autosched.kernels import triton as triton_kernels
    from autosched.rewrite import spec as spec_module
    from autosched.rewrite.narrow_reshapes import model_reshape_chains
    from autosched.rewrite.spec import write_substitution

    target, model, problems, epilogues, folder = llama_epilogues
    # The point's kernels take 49152 bytes: a GPU with less cannot launch them (compiled
    # here, in turn, where the smaller limit holds: not in processes of their own).
    monkeypatch.setitem(triton_kernels.SHARED_MEMORY_BYTES, "sm_90", 32768)
    monkeypatch.setattr(spec_module, "compile_calls", lambda calls, jobs=None: {})
    chains = model_reshape_chains(model, target.compile_flags(), str(folder / "narrow"))
    path = folder / "too_large.mlir"
    refused = write_substitution(
        str(path), [(p, POINT) for p in problems], target, chains, epilogues
    )
    assert [why.split(": ")[0] for why in refused] == [p.name for p in problems]
    assert all("49152 bytes of shared memory, over sm_90's 32768" in why for why in refused)
    assert not path.exists()


@pytest.mark.slow  # over 5 s on two cores: the README's command stays under 10 minutes
def test_an_epilogue_whose_kernel_does_not_fit_stays_irees_and_the_winner_stays(
    llama_epilogues, monkeypatch
):
    """The warp-specialized kernels of the Llama layer take 49308 bytes of shared memory,
    but with q's and k's RoPE epilogue 57368: on a GPU of 50000 bytes those two epilogues
    stay IREE's, every other kernel is built, and all 7 matmuls still run a kernel."""
    from test_triton_kernels import _iree_compile

    from autosched.kernels import triton as triton_kernels
    from autosched.rewrite import spec as spec_module
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model

    target, model, problems, epilogues, folder = llama_epilogues
    full = triton_spec(llama_epilogues, str(folder / "fits.mlir"), SPECIALIZED, epilogues)
    monkeypatch.setitem(triton_kernels.SHARED_MEMORY_BYTES, "sm_90", 50000)
    monkeypatch.setattr(spec_module, "compile_calls", lambda calls, jobs=None: {})  # here
    spec = triton_spec(llama_epilogues, str(folder / "smaller.mlir"), SPECIALIZED, epilogues)

    def functions(path: str) -> set[str]:
        module = ir.Module.parseFile(path, ir.Context())
        return {
            str(op.attributes["sym_name"]).strip('"')
            for op in walk_ops(module.operation)
            if op.name == "util.func"
        }

    left_out = functions(full) - functions(spec)
    assert left_out and all("_e" in name for name in left_out), left_out
    flags = target.compile_flags()
    out = str(folder / "rewritten_smaller.mlir")
    rewritten, replaced = rewrite_model(model, spec, flags, out, 300)
    assert replaced == 7
    _iree_compile(rewritten, *flags, RESUME_FLAG, "--compile-to=stream")


GPT2_F16 = os.path.join(os.path.dirname(__file__), "data", "models", "hf_gpt2_block_f16.mlirbc")


@pytest.fixture(scope="module")
def gpt2_epilogues(tmp_path_factory):
    """The GPT-2 block's (target, model, problems, epilogues, folder): `read_epilogues`."""
    return read_epilogues(GPT2_F16, tmp_path_factory.mktemp("gpt2_epilogues"))


def test_a_bias_added_to_the_f32_result_and_rounded_in_one_generic_is_read(gpt2_epilogues):
    """GPT-2's Conv1D projections (`addmm` in f16): the bias is added to the matmul's f32
    result and rounded in one generic, with no truncf before it. Each projection's epilogue
    reads the accumulator unrounded (`rounded_before` False) and the bias per column; the
    generic after it (behind the reshape to batch x tokens) joins it in the kernel: the
    residual add after the attention's and the MLP's output projections, the tanh GELU
    after the MLP's up projection. q, k and v are sliced apart after theirs: no generic."""
    from autosched.ops.epilogue import CHANNEL, FULL

    _, _, problems, epilogues, _ = gpt2_epilogues
    assert sorted(p.name for p in problems) == [
        "matmul_64x128x128_f16_f16_f32",  # the attention's output projection
        "matmul_64x128x512_f16_f16_f32",  # the MLP's down projection
        "matmul_64x384x128_f16_f16_f32",  # q, k and v in one
        "matmul_64x512x128_f16_f16_f32",  # the MLP's up projection
    ]
    read = {p.name: epilogues[p.name] for p in problems}
    for name, (epilogue,) in read.items():
        assert not epilogue.rounded_before and epilogue.narrow == "f16", name
        assert [x.kind for x in epilogue.first_inputs] == [ACC, CHANNEL]
        assert epilogue.inputs[0].element == "f32" and epilogue.out_element == "f16"
        params, lines = epilogue.triton_lines("rn", "N", "offsets", "mask")
        assert lines[0] == "a0 = acc"  # the f32 tile itself
        assert len(params) == len(epilogue.extras) == len(epilogue.inputs) - 1
    assert read["matmul_64x384x128_f16_f16_f32"][0].then is None
    for residual in ("matmul_64x128x128_f16_f16_f32", "matmul_64x128x512_f16_f16_f32"):
        (epilogue,) = read[residual]
        assert [x.kind for x in epilogue.inputs] == [ACC, CHANNEL, FULL]
        assert epilogue.out_type == "tensor<2x32x128xf16>" and epilogue.exact
        assert epilogue.statements[-2] in ("tv0 = out + a2", "tv0 = a2 + out")
    (gelu,) = read["matmul_64x512x128_f16_f16_f32"]
    assert gelu.out_type == "tensor<2x32x512xf16>" and not gelu.exact  # constants captured
    assert "tv0 = out * out * out" in gelu.statements
    assert any("tl.exp(2.0 * " in line for line in gelu.statements)  # tanh


@pytest.mark.parametrize("kernel", ["plain", "warp-specialized"])
def test_the_rewritten_block_keeps_each_bias_in_its_kernel(gpt2_epilogues, kernel):
    """With the epilogues each of the four kernels stores the biased f16 result itself, and
    three of them the residual add or the GELU after it, in the block's batch x tokens
    shape: the f32 results and those generics leave the model (a kernel that replaced the
    matmul alone wrote the f32 result for IREE to read back), and the block builds for
    sm_90, with the plain kernels and with the warp-specialized (Gluon) ones."""
    from test_triton_kernels import _iree_compile

    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model

    target, model, *_, folder = gpt2_epilogues
    flags = target.compile_flags()
    results = {}
    for with_epilogues in (False, True):
        point = SPECIALIZED if kernel == "warp-specialized" else POINT
        spec = triton_spec(
            gpt2_epilogues, str(folder / f"custom_{kernel}_{with_epilogues}.mlir"), point,
            gpt2_epilogues[3] if with_epilogues else None,
        )  # fmt: skip
        out = str(folder / f"rewritten_{kernel}_{with_epilogues}.mlir")
        rewritten, replaced = rewrite_model(model, spec, flags, out, 300)
        assert replaced == 4
        module = ir.Module.parseFile(rewritten, ir.Context())
        ops = list(walk_ops(module.operation))
        externs = [str(op.results[0].type) for op in ops if op.name == "hal.dispatch.extern"]
        results[with_epilogues] = sorted(externs)
    assert all(t.endswith("xf32>") for t in results[False])
    assert results[True] == [
        "tensor<2x32x128xf16>", "tensor<2x32x128xf16>", "tensor<2x32x512xf16>",
        "tensor<64x384xf16>",
    ]  # fmt: skip
    _iree_compile(rewritten, *flags, RESUME_FLAG, "--compile-to=stream")


def test_a_bias_epilogues_statements_compute_what_iree_computes(gpt2_epilogues):
    """The block's epilogues' statements, run by numpy on an f32 accumulator, an f16 bias
    (and residual), give what IREE computes from the same generics on the CPU: the bias
    rounded once, at the end; the residual add and the tanh GELU (in f16, tanh in f32)
    after it."""
    from test_conv_kernels import epilogues_against_iree

    from autosched.rewrite.common import FUSED_MODEL
    from autosched.rewrite.common import is_problems_op as _is_problems_op

    *_, problems, _, folder = gpt2_epilogues

    def close(got, expected):  # f16 rounds each step of the GELU: a few of its ulps (2^-10)
        return (np.abs(got - expected) <= 4 * 2**-10 * np.abs(expected) + 4e-3).all()

    checked = epilogues_against_iree(
        str(folder / "fused" / FUSED_MODEL),
        lambda op: next((p for p in problems if _is_problems_op(op, p)), None),
        lambda tensor: np.float32 if "xf32>" in tensor else np.float16,
        close,
        spread=4,
    )
    # q/k/v's bias; the bias and residual (the residual first, or second); the bias and GELU
    assert checked == 4


class _Log:
    """run.log's writer, kept in memory (what the spec writer logs about its readings)."""

    def __init__(self):
        self.lines = []

    def write(self, line: str) -> None:
        self.lines.append(line)


def every_kernel_spec(gpt2_epilogues, path: str) -> tuple[str, list[str]]:
    """The GPT-2 block with every op a custom kernel, as a run writes it: each projection
    with its epilogue, the causal flash kernel reading q, k and v from the fused projection
    (what it reads from the model: drivers/custom_route.MODEL_READINGS); the spec's path
    and what was logged."""
    from autosched.drivers.custom_route import MODEL_READINGS
    from autosched.kernels.flash_attention.family import FLASH
    from autosched.rewrite.attention_ops import model_attentions
    from autosched.rewrite.spec import write_substitution

    target, model, problems, _, folder = gpt2_epilogues
    (attention,) = model_attentions(model, target.compile_flags(), str(folder / "ops"))
    flash = {"kernel": FLASH, "q_tile": 64, "kv_tile": 64, "q_warps": 4, "kv_stages": 3}
    winners = [*((p, POINT) for p in problems), (attention, flash)]
    log = _Log()
    readings = [read((model, str(folder)), winners, target, log) for read in MODEL_READINGS]
    assert write_substitution(path, winners, target, *readings) == []
    return path, log.lines


def test_the_block_with_every_kernel_keeps_nine_dispatches(gpt2_epilogues):
    """Every op of the block a kernel, as a run's spec writes them: the four epilogues and
    q, k and v read from the projection are taken in, the layer norms alone stay IREE's,
    and the block builds for sm_90."""
    from test_triton_kernels import _iree_compile

    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model

    target, model, *_, folder = gpt2_epilogues
    spec, lines = every_kernel_spec(gpt2_epilogues, str(folder / "every.mlir"))
    assert "epilogues kept in their kernels: 4" in lines
    assert any("reads Q, K, V as the model holds them" in line for line in lines)
    out = str(folder / "every_rewritten.mlir")
    rewritten, replaced = rewrite_model(model, spec, target.compile_flags(), out, 300)
    assert replaced == 5
    module = ir.Module.parseFile(rewritten, ir.Context())
    names = [op.name for op in walk_ops(module.operation)]
    assert names.count("hal.dispatch.extern") == 5 and "tensor.extract_slice" not in names
    _iree_compile(rewritten, *target.compile_flags(), RESUME_FLAG, "--compile-to=stream")


@pytest.mark.gpu
def test_the_block_with_every_kernel_gives_the_default_builds_outputs(
    gpt2_epilogues, tmp_path, monkeypatch
):
    """On the GPU: the block with every op a kernel (the epilogues, the slices read in
    place) answers as IREE's default build does."""
    from click.testing import CliRunner

    from autosched.cli import cli

    spec, _ = every_kernel_spec(gpt2_epilogues, str(tmp_path / "every.mlir"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", GPT2_F16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (5 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


def test_each_custom_dispatch_of_the_block_names_its_kernel_and_form(gpt2_epilogues):
    """The kernel each custom dispatch of the block runs, read from the model lowered to
    flow, where the dispatch benchmarks get their names: the in-place timing
    (drivers/in_place.py) adds each benchmark's time to its winner by it and tells the
    kernels that carry an epilogue by their form."""
    from autosched.model.lowering import dispatch_calls, lower_to_dispatches
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
    from autosched.rewrite.placement import extern_kernels

    target, model, problems, _, folder = gpt2_epilogues
    spec, _ = every_kernel_spec(gpt2_epilogues, str(folder / "named.mlir"))
    out = str(folder / "named_rewritten.mlir")
    rewritten, _ = rewrite_model(model, spec, target.compile_flags(), out, 300)
    lowered = lower_to_dispatches(rewritten, [*target.compile_flags(), RESUME_FLAG])
    kernels = extern_kernels(lowered)
    assert set(kernels) <= set(dispatch_calls(lowered)) and len(kernels) == 5
    stems = {kernel.split(".")[0] for kernel in kernels.values()}
    assert {p.name for p in problems} < stems and any(s.startswith("attention") for s in stems)
    forms = [kernel.partition(".")[2] for kernel in kernels.values()]
    assert sum(form.startswith("epilogue") for form in forms) == 4, kernels


@pytest.mark.gpu
def test_each_projection_is_timed_in_place_with_its_epilogue_on_the_gpu(gpt2_epilogues, tmp_path):
    """On the GPU: each projection of the block (bias, GELU, residual epilogues) is built
    into the model with its plain and its persistent point in turn, each timed on the
    rewritten model's dispatch benchmarks, and the faster kept; run.log says both times."""
    from autosched.drivers.in_place import choose_in_place
    from autosched.drivers.model_stages.prepare import model_problems
    from autosched.kernels.matmul_triton.space import CUSTOM
    from autosched.model.lowering import analyze_model
    from autosched.outputs.records import Trial
    from autosched.run.problem import ProblemResult

    target, model, *_ = gpt2_epilogues
    config = RunConfig(target="cuda", arch="sm_90", work_dir=str(tmp_path), repetitions=2)
    entries, _ = model_problems(analyze_model(model, target.compile_flags()), target)
    custom = {}
    for entry in entries:
        entry.result = ProblemResult(entry.problem, None, baseline_ms=1.0)  # IREE's time
        if entry.problem.kind != "matmul":
            continue
        trials = [
            Trial(
                entry.problem.name,
                "cuda",
                "sm_90",
                name,
                {**POINT, **extra},
                False,
                "ok",
                median_ms=ms,
            )  # fmt: skip
            for name, extra, ms in (
                ("plain", {"pipeline": CUSTOM, "split_k": 1, "persistent": 0}, 0.01),
                ("persistent", {"pipeline": CUSTOM, "split_k": 1, "persistent": 132}, 0.02),
            )
        ]
        custom[entry.problem.name] = ProblemResult(
            entry.problem, None, trials, best=trials[0], best_ms=0.01
        )
    log = _Log()
    model_folder = str(tmp_path / "model")
    chosen = choose_in_place(config, target, entries, custom, (model, model_folder), log)
    timed = [line for line in log.lines if "epilogue and all" in line]
    assert len(timed) == len(custom) == 4, log.lines
    assert all("(plain)" in line and "(persistent)" in line for line in timed), timed
    assert set(chosen) == set(custom)


def test_the_kernels_compiled_side_by_side_are_those_compiled_in_turn(
    gpt2_epilogues, tmp_path, monkeypatch
):
    """The block's every kernel (each projection's plain, narrow, stored-weight and
    epilogue forms, the flash kernel's absorbed forms) is compiled in processes of their
    own before the spec is written (rewrite/compile_ahead.py): the spec and every PTX are
    those of compiling them one at a time here."""
    import filecmp

    from autosched.rewrite import spec as spec_module

    ahead, _ = every_kernel_spec(gpt2_epilogues, str(tmp_path / "ahead" / "custom.mlir"))
    calls = []

    def in_turn(found, jobs=None):
        calls.extend(found)
        return {}  # none compiled ahead: the spec's builder compiles each in turn

    monkeypatch.setattr(spec_module, "compile_calls", in_turn)
    in_order, _ = every_kernel_spec(gpt2_epilogues, str(tmp_path / "turn" / "custom.mlir"))
    assert len(calls) >= 10 and len({c.path for c in calls}) == len(calls)
    text = open(ahead).read().replace(str(tmp_path / "ahead"), "FOLDER")
    assert text == open(in_order).read().replace(str(tmp_path / "turn"), "FOLDER")
    for call in calls:
        twin = call.path.replace(str(tmp_path / "turn"), str(tmp_path / "ahead"))
        assert filecmp.cmp(call.path, twin, shallow=False), call.path
