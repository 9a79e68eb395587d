"""Kernels for a length known at run time (a prompt of any length): matmuls for any count of
rows M and flash attention for any sequence length. The length is a value the kernel is
launched with, which IREE passes as a push constant, and the grid follows it. One build
then serves every length of a model exported with a dynamic sequence."""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter

import pytest
from iree.compiler import ir
from test_buckets import bucket_inputs
from test_causal_lm import dynamic_inputs
from test_matmul_epilogues import POINT
from test_triton_kernels import _check_on_the_gpu, _problem

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.drivers.bucket_kernels import shared_problem
from autosched.drivers.bucket_proof import prove_buckets
from autosched.drivers.custom_route import write_custom_substitution
from autosched.drivers.model_stages.prepare import model_problems
from autosched.drivers.proof import custom_build
from autosched.errors import UserError
from autosched.ir_walk import walk_ops
from autosched.kernels.attention_layout import at_length, length_constants, of_length
from autosched.kernels.extern import extern_module_text
from autosched.kernels.flash_attention import kernel as flash
from autosched.kernels.flash_attention.kernel import FlashParams
from autosched.kernels.flash_decoding import kernel as decoding
from autosched.kernels.matmul_triton.kernel import (
    KernelParams,
    compile_ptx,
    dynamic_unsupported,
    extern_module,
)
from autosched.kernels.matmul_triton.space import CUSTOM
from autosched.model.buckets import bucket_model, dynamic_patterns
from autosched.model.lowering import analyze_model, prepare_model
from autosched.ops.matmul import DYNAMIC
from autosched.ops.matmul_kernel import KERNEL_FUNCTION
from autosched.outputs.records import Trial
from autosched.outputs.report import RunLog
from autosched.rewrite.attention_ops import model_attentions, op_attentions, paired
from autosched.rewrite.common import is_truncf
from autosched.rewrite.placement import check_placed
from autosched.rewrite.replacements import substitutable
from autosched.run.problem import ProblemResult
from autosched.search.space import build_space
from autosched.targets import make_target
from autosched.targets.cuda import CudaTarget
from autosched.targets.host import Machine

pytest.importorskip("triton")

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
MLP_BF16 = os.path.join(MODELS, "llama_mlp_dynamic_bf16.mlirbc")
LLAMA_BF16 = os.path.join(MODELS, "hf_llama_layer_bf16.mlirbc")
# transformers' tiny LlamaForCausalLM, token ids [1, ?] (tools/export_causal_lm.py --dynamic
# --dtype bfloat16).
CAUSAL_LM_BF16 = os.path.join(MODELS, "hf_tiny_causal_lm_dynamic_bf16.mlirbc")
FLASH_POINT = {"kernel": "flash", "q_tile": 64, "kv_tile": 32, "q_warps": 4, "kv_stages": 2}

# Tuned at 512 rows; built for any. Weights as nn.Linear stores them, bf16 in and out.
TUNED = _problem(512, 384, 256, "bf16", "bf16", transpose_b=True)
PROBLEM = dataclasses.replace(TUNED, m=DYNAMIC)
PARAMS = KernelParams(128, 128, 64, 4, 3, 8)
ROWS = (1, 100, 512, 1500)  # a decode step, no whole block, the tuned size, no power of two


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory):
    """(the kernel for any M, its module's text, its sm_90 build)."""
    folder = tmp_path_factory.mktemp("dynamic_rows")
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    binary = compile_ptx(PROBLEM, PARAMS, "sm_90", str(folder / "any_m.ptx"))
    text = extern_module(PROBLEM, PARAMS, binary, target.executable_target(), KERNEL_FUNCTION)
    source = folder / "any_m.mlir"
    source.write_text(text)
    job = CompileJob(str(source), str(folder / "any_m.vmfb"), target.compile_flags())
    return binary, text, compile_one(job, 300)


def test_the_row_count_is_a_value_after_the_operands(dynamic):
    """Triton's entry takes A, B, C, then M as a 32-bit value, then its scratch pointers;
    IREE passes bindings first and push constants after them, so the call binds A, B and
    C and passes M, then a zero for each scratch pointer (such a kernel has no global
    scratch), and the grid is ceil(M / 128) blocks of rows times 3 across N."""
    binary, text, _ = dynamic
    ptx = open(binary.ptx_path).read()
    parameters = re.search(r"\.entry\s+\w+\s*\(([^)]*)\)", ptx).group(1)
    kinds = re.findall(r"\.param\s+\.(\w+)", parameters)
    assert kinds == ["u64", "u64", "u64", "u32", "u64", "u64"]
    assert binary.scalars == 1 and binary.pointers == 6 and binary.scratch_bytes == 0
    assert "(%a0: tensor<?x256xbf16>, %a1: tensor<384x256xbf16>) -> tensor<?x384xbf16>" in text
    assert '"matmul"[%m](%a0, %a1, %out, %m32, %pad, %pad)' in text
    assert "constants = 3, bindings" in text
    assert "((s0 ceildiv 128) * 3)" in text


def test_the_kernel_for_any_m_builds_for_sm_90(dynamic):
    _, _, result = dynamic
    assert result.status == "ok", result.message


def test_a_static_kernel_keeps_m_as_a_constant(tmp_path):
    """The same point built for its own M takes no value: nothing changes for a static
    model."""
    binary = compile_ptx(TUNED, PARAMS, "sm_90", str(tmp_path / "static.ptx"))
    assert binary.scalars == 0 and binary.pointers == 5


def test_what_a_kernel_for_any_m_does_not_cover(tmp_path):
    """One batch entry at most, A with its rows along M (and no epilogue); split-K and
    persistent points run as their blocks, one workgroup each."""
    cases = [
        (_problem(DYNAMIC, 64, 64, batch=2), "one batch entry"),
        (dataclasses.replace(_problem(DYNAMIC, 64, 64), transpose_a=True), "rows along M"),
    ]
    for problem, why in cases:
        with pytest.raises(UserError, match=why):
            compile_ptx(problem, PARAMS, "sm_90", str(tmp_path / "x.ptx"))
    assert dynamic_unsupported(PROBLEM, None) is None
    split = dataclasses.replace(PARAMS, split_k=2, persistent=132)
    binary = compile_ptx(PROBLEM, split, "sm_90", str(tmp_path / "split.ptx"))
    assert binary.scalars == 1 and "atom" not in open(binary.ptx_path).read()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
def test_one_build_gives_numpys_answer_at_every_length(dynamic, rows, tmp_path):
    """The one build run with A of each row count: numpy's product every time."""
    _, _, result = dynamic
    problem = dataclasses.replace(TUNED, m=rows)
    check = _check_on_the_gpu(result.job.output, problem, tmp_path)
    assert check.status == "correct", check.message


@pytest.fixture(scope="module")
def bucket_kernels(tmp_path_factory):
    """The bf16 MLP exported with a dynamic length, tuned on buckets of 16 and 40 tokens,
    each bucket problem's custom kernel faster than IREE (its results as a run's): (the
    bucket model, the CUDA target, the spec the run writes, its folder)."""
    folder = tmp_path_factory.mktemp("bucket_kernels")
    target = CudaTarget(RunConfig(target="cuda", arch="sm_90", ptxas="none"), Machine(True))
    flags, work = target.compile_flags(), folder / "model"
    files = [bucket_inputs(folder / f"at{n}.npz", n) for n in (16, 40)]
    model = bucket_model(MLP_BF16, files, flags, str(work))
    model.patterns = dynamic_patterns(model, flags, str(work))
    problems, _ = model_problems(analyze_model(model.path, flags), target)
    assert len(problems) == 4  # two roots at two lengths
    custom = {}
    for entry in problems:
        points = build_space(entry.problem, target, {"pipeline": ["TileAndFuse", "Custom"]})
        iree = next(p for p in points.points if target.in_spec(p))
        entry.result = _result(entry.problem, target, iree, 0.2)
        point = dict(POINT, pipeline=CUSTOM, tile_m=16 if entry.problem.m == 16 else 32)
        custom[entry.problem.name] = _result(entry.problem, target, point, 0.1)
    log = RunLog(str(folder / "run.log"))
    spec = write_custom_substitution(
        str(folder / "custom.mlir"), target, problems, custom, log,
        (MLP_BF16, str(work / "dynamic")), buckets=model,
    )  # fmt: skip
    return model, target, spec, folder


def test_a_model_tuned_on_buckets_runs_one_kernel_for_any_m_per_root(bucket_kernels, tmp_path):
    """The spec is written for the dynamic model, each dynamic root's two bucket problems
    sharing one kernel for any M at the 40-token bucket's point. Its three matmuls then
    run those kernels, reading the weights as stored and storing bf16 (no transpose or
    truncf of theirs left), every bucket problem's winner is placed, and the model builds
    for sm_90, once for the proofs of both buckets."""
    _, target, spec, _ = bucket_kernels
    assert spec.not_placed == [] and len(spec.winners) == 4
    kernels = {w.kernel for w in spec.winners}
    assert kernels == {
        "batch_matmul_1xanyx128x64_bf16_bf16_f32",
        "batch_matmul_1xanyx64x128_bf16_bf16_f32",
    }
    text = open(spec.path).read()
    assert text.count("(s0 ceildiv 32)") >= 2 and "(s0 ceildiv 16)" not in text  # 40's point
    cache, flags = str(tmp_path / "builds"), target.compile_flags()
    for folder in "ab":  # each bucket's proof folder
        (tmp_path / folder).mkdir()
    proofs = [
        custom_build(MLP_BF16, spec.path, flags, [], str(tmp_path / b), 300, cache) for b in "ab"
    ]
    (built, replaced), (again, _) = proofs
    assert replaced == 3 and built.runs, built.message
    assert check_placed(spec.winners, Counter(built.placed)) == []
    # One compile for every bucket's proof: the second is the first's build.
    assert os.path.samefile(built.vmfb, again.vmfb)
    module = ir.Module.parseFile(built.recipe[0], ir.Context())
    generics = [op for op in walk_ops(module.operation) if op.name == "linalg.generic"]
    assert not any(is_truncf(op) for op in generics)
    assert len(generics) == 3  # SiLU's two steps and the product: no transposes left


@pytest.mark.gpu
def test_the_dynamic_build_with_its_kernels_gives_the_defaults_outputs_at_each_length(
    bucket_kernels,
):
    """On the GPU: the dynamic model with its kernels for any M, proved on each bucket's
    inputs (16 and 40 tokens) as a run proves it: the same outputs as IREE's default."""
    model, target, spec, folder = bucket_kernels
    proof = prove_buckets(
        model, target.compile_flags(), None, target.device, custom_spec=spec.path,
        work_dir=str(folder / "proof"), spec_flag=target.tuning_spec_flag, rounds=2,
    )  # fmt: skip
    assert proof.custom is not None and proof.custom.replaced == 3, proof.message
    assert proof.custom.outputs_match, proof.custom.message


def _result(problem, target, point: dict, ms: float) -> ProblemResult:
    """A search's result whose winner is `point` at `ms`."""
    name = target.for_problem(problem).config_name(point)
    best = Trial(problem.name, "cuda", "sm_90", name, point, False, "ok", median_ms=ms)
    return ProblemResult(problem, None, [best], best=best, best_ms=ms, baseline_ms=0.3)


@pytest.fixture(scope="module")
def any_length_attention(tmp_path_factory):
    """The Llama layer's causal attention (query rows and keys one length) with that length
    DYNAMIC, one flash point's kernel for it and its extern module built for sm_90."""
    folder = tmp_path_factory.mktemp("flash_any_length")
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    (op,) = model_attentions(LLAMA_BF16, target.compile_flags(), str(folder / "ops"))
    problem = of_length(op, {"m", "k2"})
    params = FlashParams(64, 32, 4, 3)
    binary = flash.compile_kernel(problem, params, "sm_90", str(folder / "fa.ptx"))
    body = flash.extern_function(problem, params, binary, target.executable_target(), "main")
    source = folder / "fa.mlir"
    source.write_text(extern_module_text(target.executable_target(), body))
    job = CompileJob(str(source), str(folder / "fa.vmfb"), target.compile_flags())
    return problem, binary, body, compile_one(job, 300)


def test_a_flash_kernel_for_any_length_takes_it_at_launch(any_length_attention):
    """The length L is a value after the operands; each stride over it is a multiple of L
    the kernel takes at launch (q's batch stride is L x 32: bit 0), the grid is ceil(L /
    64) query blocks by 4 heads, and only the last key block is masked: the others load
    by 16-byte asynchronous copies."""
    problem, binary, body, built = any_length_attention
    assert built.status == "ok", built.message
    assert binary.scalars == 1
    constants = length_constants(problem)
    assert constants["sqb0"] == 32 and constants["BY_L"] & 1
    assert constants["M_BY_L"] and constants["N_BY_L"]
    assert '"flash_attention"[%m]' in body and "tensor<4x?x32xbf16>{%m}" in body
    assert "((s0 ceildiv 64) * 1)" in body and "%y = arith.constant 4 : index" in body
    ptx = open(binary.ptx_path).read()
    assert "cp.async.cg.shared.global" in ptx


def test_what_a_flash_kernel_for_any_length_does_not_cover(any_length_attention):
    """Query rows of the length (keys too, or not); never a head dim; flash decoding runs
    at one cache length."""
    problem, *_ = any_length_attention
    assert "query rows and keys" in flash.unsupported(of_length(problem, {"n"}))
    assert flash.unsupported(problem) is None
    assert "one length of the cache" in decoding.unsupported(problem)


@pytest.mark.gpu
@pytest.mark.parametrize("length", ROWS)
def test_one_flash_build_gives_numpys_answer_at_every_length(
    any_length_attention, length, tmp_path
):
    """The one build run at each length: numpy's causal attention every time."""
    problem, _, _, built = any_length_attention
    check = _check_on_the_gpu(built.job.output, at_length(problem, length), tmp_path)
    assert check.status == "correct", check.message


@pytest.fixture(scope="module")
def causal_lm_kernels(tmp_path_factory):
    """transformers' tiny LlamaForCausalLM in bf16, its sequence length dynamic, tuned on
    buckets of 16 and 40 tokens, every custom kernel faster than IREE (its results as a
    run's: flash kernels on the attentions' op forms): (the bucket model, the target, the
    spec the run writes, its folder)."""
    folder = tmp_path_factory.mktemp("causal_lm_kernels")
    target = CudaTarget(RunConfig(target="cuda", arch="sm_90", ptxas="none"), Machine(True))
    flags, work = target.compile_flags(), folder / "model"
    files = []
    for length in (16, 40):
        dynamic_inputs(folder / f"at{length}.npz", length)
        files.append(str(folder / f"at{length}.npz"))
    model = bucket_model(CAUSAL_LM_BF16, files, flags, str(work))
    model.patterns = dynamic_patterns(model, flags, str(work))
    problems, _ = model_problems(analyze_model(model.path, flags), target)
    ops = model_attentions(model.path, flags, str(folder / "ops"))
    custom = {}
    for entry in problems:
        entry.result = ProblemResult(entry.problem, None, [], baseline_ms=0.2)  # IREE's
        problem = entry.problem
        if problem.kind == "attention":
            problem, point = paired(problem, ops), dict(FLASH_POINT)
        elif problem.kind == "matmul" and not substitutable(problem):
            point = dict(POINT, pipeline=CUSTOM, tile_m=16 if problem.m == 16 else 32)
        else:  # the embedding's gather; RoPE's bf16 x f32 product, which no family takes
            continue
        custom[entry.problem.name] = _result(problem, target, point, 0.1)
    spec = write_custom_substitution(
        str(folder / "custom.mlir"), target, problems, custom, RunLog(str(folder / "run.log")),
        (CAUSAL_LM_BF16, str(work / "dynamic")), buckets=model,
    )  # fmt: skip
    return model, target, spec, folder


@pytest.mark.slow  # the causal LM's buckets, its spec and its sm_90 build
def test_a_causal_lm_tuned_on_buckets_runs_flash_for_any_length(causal_lm_kernels, tmp_path):
    """Each layer's attention, whose boolean mask was causal at both buckets' lengths
    (recognised by its values there), runs one flash kernel for any length that applies
    the causal mask itself, the model's mask left unread; every matmul of dynamic rows (the
    lm head's too) runs one kernel for any M; every winner is placed and the model builds
    for sm_90."""
    _, target, spec, _ = causal_lm_kernels
    assert spec.not_placed == [], spec.not_placed
    attention = {w.kernel for w in spec.winners if w.kind == "attention"}
    assert attention == {"attention_4xanyx16xanyx16_bf16_causal"}
    (tmp_path / "proof").mkdir()
    flags = target.compile_flags()
    source = prepare_model(CAUSAL_LM_BF16, str(tmp_path))  # as a proof prepares it
    built, _ = custom_build(source, spec.path, flags, [], str(tmp_path / "proof"), 300)
    assert built.runs, built.message
    assert check_placed(spec.winners, Counter(built.placed)) == []
    assert Counter(built.placed)["attention_4xanyx16xanyx16_bf16_causal"] == 2  # 2 layers
    module = ir.Module.parseFile(built.recipe[0], ir.Context())
    ops = list(walk_ops(module.operation))
    assert "iree_linalg_ext.attention" not in [op.name for op in ops]
    externs = [op for op in ops if op.name == "hal.dispatch.extern"]
    assert not any("xi1>" in str(v.type) for op in externs for v in op.operands)  # no mask


@pytest.mark.gpu
def test_the_dynamic_causal_lm_with_its_kernels_gives_the_defaults_logits(causal_lm_kernels):
    """On the GPU: the dynamic causal LM with its flash and matmul kernels for any length,
    proved on each bucket's tokens (16 and 40): IREE's default's logits."""
    model, target, spec, folder = causal_lm_kernels
    proof = prove_buckets(
        model, target.compile_flags(), None, target.device, custom_spec=spec.path,
        work_dir=str(folder / "proof"), spec_flag=target.tuning_spec_flag, rounds=2,
    )  # fmt: skip
    assert proof.custom is not None and proof.custom.outputs_match, proof.message


@pytest.mark.slow  # the causal LM's buckets, its spec and its sm_90 build
def test_an_attention_of_any_length_is_causal_only_where_every_buckets_mask_was(
    causal_lm_kernels,
):
    """The causal kernel ignores the model's mask: one bucket whose mask was not read as
    causal makes the kernel for every length read it."""
    _, _, _, folder = causal_lm_kernels
    ops = op_attentions(str(folder / "ops" / "model.global-optimization.mlir"), str(folder))
    assert all(op.causal for op in ops) and len(ops) == 2  # 16 and 40 tokens
    free = frozenset({"m", "k2"})
    shared = shared_problem(ops[1], free, ops)
    assert shared.causal and not shared.mask_tensor
    mixed = [ops[0], dataclasses.replace(ops[1], causal=False)]
    shared = shared_problem(ops[1], free, mixed)
    assert not shared.causal and shared.mask_tensor
    assert flash.unsupported(shared) is None
