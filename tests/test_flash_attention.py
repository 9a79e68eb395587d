"""The flash-attention custom route (issue 24): a model's attention in its op form (before
IREE forms dispatches), its causal mask recognised by its values, the Triton family's PTX
made without a GPU and wrapped in an extern module iree-compile builds for sm_90, the
substitution that replaces the op (and leaves the mask tensor dead), and on a GPU the
kernel's answers and a run that searches it. Real iree-compile and local-task, no mocks."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG

from autosched.cli import cli
from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.kernels.flash_attention.family import FLASH
from autosched.kernels.flash_attention.kernel import FlashParams, compile_kernel, unsupported
from autosched.measure.worker import Verifier, make_problem_data, verify_module
from autosched.model.lowering import analyze_model
from autosched.ops.attention import AttentionProblem, op_module_text
from autosched.outputs.records import problem_from_shape, problem_shape
from autosched.rewrite.apply import rewrite_model
from autosched.rewrite.attention_ops import model_attentions, op_attentions, paired
from autosched.rewrite.spec import write_substitution
from autosched.search.space import build_space
from autosched.targets import make_target
from autosched.targets.cuda_attention import IREE

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
SM90 = make_target(RunConfig(target="cuda", arch="sm_90"))
CPU_FLAGS = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu"]
FLASH_POINT = {"kernel": FLASH, "q_tile": 64, "kv_tile": 64, "q_warps": 4, "kv_stages": 3}


def model(name: str) -> str:
    return os.path.join(MODELS, name)


@pytest.fixture(scope="module")
def llama_ops(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ops")
    return model_attentions(model("hf_llama_layer_bf16.mlirbc"), SM90.compile_flags(), str(folder))


def test_the_llama_layers_op_form_is_causal_with_its_constant_scale(llama_ops):
    (op,) = llama_ops
    assert op.name == "attention_4x64x32x64x32_bf16_causal"
    assert op.causal and op.form == "op" and op.scale == pytest.approx(32**-0.5, rel=1e-2)
    assert unsupported(op) is None


def test_the_op_form_is_paired_with_the_flow_problem_by_location(llama_ops):
    analysis = analyze_model(model("hf_llama_layer_bf16.mlirbc"), SM90.compile_flags())
    (flow,) = [r for r in analysis.roots if r.kind == "attention"]
    assert paired(flow, llama_ops) is llama_ops[0]


def test_a_bert_layer_has_no_mask_and_f32_is_not_the_familys(tmp_path):
    (op,) = model_attentions(model("hf_bert_layer_f32.mlirbc"), SM90.compile_flags(), str(tmp_path))
    assert not op.causal and not op.mask_type
    assert "f16 or bf16" in unsupported(op)


def _with_mask(tmp_path, mask_lines: list[str], argument: str = "") -> str:
    """The Llama op form alone with its mask built by `mask_lines` (or an argument)."""
    (op,) = op_attentions_of_llama(tmp_path)
    text = op_module_text(op, {})
    start, end = text.index("  %kept ="), text.index("  %init =")
    text = text[:start] + "\n".join(mask_lines) + "\n" + text[end:]
    if argument:
        text = text.replace("%v: tensor<4x32x64xbf16>)", f"%v: tensor<4x32x64xbf16>, {argument})")
    path = tmp_path / "mask.mlir"
    path.write_text(text)
    return str(path)


def op_attentions_of_llama(tmp_path):
    return model_attentions(
        model("hf_llama_layer_bf16.mlirbc"), SM90.compile_flags(), str(tmp_path)
    )


SLIDING = [  # keys at most 8 rows back: constant, but not causal
    "  %zero = arith.constant 0.0 : bf16",
    "  %hidden = arith.constant 0xFF80 : bf16",
    "  %c8 = arith.constant 8 : index",
    "  %mask_init = tensor.empty() : tensor<4x64x64xbf16>",
    "  %mask = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>], "
    'iterator_types = ["parallel", "parallel", "parallel"]} outs(%mask_init : '
    "tensor<4x64x64xbf16>) {",
    "  ^bb0(%unused: bf16):",
    "    %row = linalg.index 1 : index",
    "    %key = linalg.index 2 : index",
    "    %near = arith.addi %key, %c8 : index",
    "    %seen = arith.cmpi sge, %row, %key : index",
    "    %close = arith.cmpi slt, %row, %near : index",
    "    %both = arith.andi %seen, %close : i1",
    "    %value = arith.select %both, %zero, %hidden : bf16",
    "    linalg.yield %value : bf16",
    "  } -> tensor<4x64x64xbf16>",
]


def test_a_constant_mask_that_is_not_causal_is_not_taken_for_one(tmp_path):
    (op,) = op_attentions(_with_mask(tmp_path, SLIDING), str(tmp_path))
    assert op.mask_type == "bf16" and not op.causal
    assert unsupported(op) is None and op.mask_tensor  # the kernel adds the mask it is given


def test_a_mask_given_as_an_argument_is_not_causal(tmp_path):
    path = _with_mask(tmp_path, [], argument="%mask: tensor<4x64x64xbf16>")
    (op,) = op_attentions(path, str(tmp_path))
    assert not op.causal


def test_the_op_module_and_numpys_reference_agree_on_the_cpu(llama_ops, tmp_path):
    """IREE's own build of the op form alone (local-task) gives numpy's attention: the
    module the flash kernels' default is timed on, and the reference they are checked on."""
    (op,) = llama_ops
    assert_iree_gives_the_reference(op, tmp_path)


def assert_iree_gives_the_reference(op, tmp_path) -> None:
    """IREE's CPU build of the op form alone, checked against the problem's reference."""
    source = tmp_path / "op.mlir"
    source.write_text(op_module_text(op, {}))
    built = compile_one(CompileJob(str(source), str(tmp_path / "op.vmfb"), CPU_FLAGS), 120)
    assert built.status == "ok", built.message
    data = make_problem_data(op, str(tmp_path / "inputs"))
    check = verify_module(built.job.output, "local-task", data, op, 60)
    assert check.status == "correct", check.message


def test_a_causal_op_read_from_a_boolean_mask_builds_its_own_and_gives_the_reference(tmp_path):
    """The cached LM's prefill attention, causal by its i1 mask's values: its op module
    builds that mask itself as booleans (true where the key is at or before the row), and
    IREE's CPU build gives numpy's causal answer (the default a run times and checks its
    flash kernels against; a float -inf for an i1 mask failed every run of the model)."""
    path = os.path.join(MODELS, "hf_tiny_llama_cached_bf16.mlirbc")
    ops = model_attentions(path, CPU_FLAGS, str(tmp_path / "ops"))
    (causal,) = [op for op in ops if op.causal]
    assert causal.mask_type == "i1" and "arith.constant true" in op_module_text(causal, {})
    assert_iree_gives_the_reference(causal, tmp_path)


def test_the_reference_is_causal(llama_ops):
    """Changing keys after a query row does not change that row's answer."""
    (op,) = llama_ops
    rng = np.random.default_rng(1)
    q, k, v = (rng.uniform(-1, 1, op.operand_shape(i)) for i in range(3))
    before = op.reference(q, k, v)
    k[:, 40:, :] = rng.uniform(-1, 1, k[:, 40:, :].shape)
    after = op.reference(q, k, v)
    assert np.allclose(before[:, :40], after[:, :40]) and not np.allclose(before, after)


def test_an_op_problem_survives_its_record(llama_ops):
    (op,) = llama_ops
    again = problem_from_shape(json.loads(json.dumps(problem_shape(op))))
    assert again.name == op.name and again.causal and again.scale == op.scale
    assert again.operand_loops == op.operand_loops


def test_flash_points_join_the_op_forms_space_on_sm_90_only(llama_ops):
    (op,) = llama_ops
    points = build_space(op, SM90, {}).points
    kernels = {p["kernel"] for p in points}
    assert kernels == {IREE, FLASH}
    flash = [p for p in points if p["kernel"] == FLASH]
    assert all(p["q_tile"] % p["kv_tile"] == 0 for p in flash)  # causal: key blocks tile rows
    sm80 = make_target(RunConfig(target="cuda", arch="sm_80"))
    assert {p["kernel"] for p in build_space(op, sm80, {}).points} == {IREE}
    analysis = analyze_model(model("hf_llama_layer_bf16.mlirbc"), SM90.compile_flags())
    (flow,) = [r for r in analysis.roots if r.kind == "attention"]
    assert {p["kernel"] for p in build_space(flow, SM90, {}).points} == {IREE}


@pytest.fixture(scope="module")
def flash_module(llama_ops, tmp_path_factory):
    """One flash point of the Llama op form: its PTX, and its extern module built for sm_90."""
    pytest.importorskip("triton")
    (op,) = llama_ops
    folder = tmp_path_factory.mktemp("flash")
    view = SM90.for_problem(op)
    source = str(folder / "fa.mlir")
    command = view.source_command(op, view_point(view, op), source)
    job = CompileJob(source, str(folder / "fa.vmfb"), SM90.compile_flags(), command)
    built = compile_one(job, 300)
    assert built.status == "ok", built.message
    return op, built


def view_point(view, op):
    return next(
        p for p in build_space(op, SM90, {}).points if view.config_name(p) == "fa_m64_n64_w4_s3"
    )


def test_a_flash_point_builds_for_sm_90_as_an_extern_dispatch(flash_module):
    op, built = flash_module
    text = open(built.job.source).read()
    assert 'hal.dispatch.extern "flash_attention"' in text
    assert "tensor<4x64x32xbf16>, tensor<4x64x32xbf16>, tensor<4x32x64xbf16>" in text
    ptx = open(built.job.source.removesuffix(".mlir") + ".ptx").read()
    assert "mma" in ptx and "ex2.approx" in ptx  # tensor cores, the exp2 online softmax


def test_the_flash_kernel_replaces_the_attention_and_its_mask(llama_ops, tmp_path):
    """The substitution spec puts the kernel in place of the op at global optimization; the
    causal mask it no longer needs is left dead and removed; the model builds for sm_90."""
    pytest.importorskip("triton")
    (op,) = llama_ops
    spec = str(tmp_path / "custom.mlir")
    assert write_substitution(spec, [(op, FLASH_POINT)], SM90) == []
    out, replaced = rewrite_model(
        model("hf_llama_layer_bf16.mlirbc"),
        spec,
        SM90.compile_flags(),
        str(tmp_path / "m.mlir"),
        300,
    )
    assert replaced == 1
    from iree.compiler import ir

    from autosched.ir_walk import walk_ops

    module = ir.Module.parseFile(out, ir.Context())
    names = [o.name for o in walk_ops(module.operation)]
    assert "iree_linalg_ext.attention" not in names
    assert names.count("linalg.index") < [
        o.name
        for o in walk_ops(
            ir.Module.parseFile(out.removesuffix(".mlir") + ".global.mlir", ir.Context()).operation
        )
    ].count("linalg.index")
    built = compile_one(
        CompileJob(
            out,
            str(tmp_path / "m.vmfb"),
            [*SM90.compile_flags(), "--compile-from=global-optimization"],
        ),
        300,
    )
    assert built.status == "ok", built.message


@pytest.mark.gpu
def test_the_flash_kernel_gives_numpys_answer(flash_module, tmp_path):
    op, built = flash_module
    data = make_problem_data(op, str(tmp_path / "inputs"))
    verifier = Verifier("cuda")
    try:
        check = verifier.check(built.job.output, data, op, 120)
    finally:
        verifier.close()
    assert check.status == "correct", check.message


@pytest.mark.gpu
def test_a_run_replaces_the_attention_with_a_flash_kernel_on_the_gpu(tmp_path, monkeypatch):
    """On sm_90 with Triton, the flash family is searched without a cfg change: its points
    are checked against numpy and timed on the op form; a winner under IREE's best dispatch
    is substituted and the whole model still gives the default build's outputs."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(model("hf_llama_layer_bf16.mlirbc"), tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG)
    result = CliRunner().invoke(
        cli, ["run", "hf_llama_layer_bf16.mlirbc", "--target", "cuda", "--budget", "12"]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in open("generated/hf_llama_layer_bf16/tuning.jsonl")]
    flash = [r for r in records if r["config"].startswith("fa_")]
    assert flash and all(r["verification"] == "correct" for r in flash if r["status"] == "ok")
    assert any(r["status"] == "ok" for r in flash)
    if "with custom kernels" in result.output:
        assert "outputs match" in result.output.split("with custom kernels")[1]


def test_an_attention_problem_from_its_shape_is_its_op_form():
    problem = AttentionProblem(
        loops=("b", "m", "n", "k1", "k2"),
        loop_sizes=(2, 16, 16, 16, 16),
        query_type="f16",
        key_type="f16",
        value_type="f16",
        mask_type="",
        operand_loops=((0, 1, 3), (0, 4, 3), (0, 4, 2), (0, 1, 2)),
        scale=0.25,
        form="op",
    )
    flow = AttentionProblem(**{**problem.__dict__, "form": "flow", "sites": []})
    assert problem.name.endswith("_unmasked") and problem.name != flow.name


def test_causal_key_blocks_must_tile_query_blocks(llama_ops, tmp_path):
    pytest.importorskip("triton")
    (op,) = llama_ops
    with pytest.raises(Exception, match="does not divide block_m"):
        compile_kernel(op, FlashParams(64, 128, 4, 3), "sm_90", str(tmp_path / "k.ptx"))


def _all_custom(tmp_path):
    """A spec that replaces every contraction of the bf16 Llama layer with a custom matmul
    kernel and its attention with a flash kernel (the points are the families' first)."""
    from autosched.drivers.model_stages.prepare import model_problems

    name = model("hf_llama_layer_bf16.mlirbc")
    problems, _ = model_problems(analyze_model(name, SM90.compile_flags()), SM90)
    point = {"pipeline": "Custom", "tile_m": 64, "tile_n": 64, "tile_k": 64, "warps": 4}
    point |= {"pipeline_depth": 3, "group_m": 8, "split_k": 1}
    winners = [(e.problem, point) for e in problems if e.problem.kind == "matmul"]
    (op,) = model_attentions(name, SM90.compile_flags(), str(tmp_path / "ops"))
    spec = str(tmp_path / "custom.mlir")
    assert write_substitution(spec, [*winners, (op, FLASH_POINT)], SM90) == []
    return name, spec


def test_stored_weights_are_read_as_stored_and_their_transposes_vanish(tmp_path):
    """torch's linear of a 3-D input transposes each weight (N x 1 x K) on every call; the
    custom kernels read the weight as stored, so no transpose dispatch is left, and the
    mask and the attention are gone too (8 ops replaced: 7 contractions, 1 attention)."""
    pytest.importorskip("triton")
    from autosched.model.lowering import lower_to_dispatches

    name, spec = _all_custom(tmp_path)
    out, replaced = rewrite_model(name, spec, SM90.compile_flags(), str(tmp_path / "m.mlir"), 300)
    assert replaced == 8
    before = _dispatch_roots(lower_to_dispatches(name, SM90.compile_flags()))
    flags = [*SM90.compile_flags(), "--compile-from=global-optimization"]
    after = _dispatch_roots(lower_to_dispatches(out, flags))
    assert sum("transpose_128x128" in d or "transpose_256x128" in d for d in before) >= 2
    assert not [d for d in after if "batch_matmul" in d or "attention" in d]
    assert not [
        d for d in after if d.endswith(("transpose_128x128_bf16", "transpose_256x128_bf16"))
    ]


def _dispatch_roots(module) -> list[str]:
    from autosched.ir_walk import symbol, walk_ops

    return [symbol(op) for op in walk_ops(module.operation) if op.name == "flow.executable.export"]


@pytest.mark.gpu
def test_the_whole_custom_llama_layer_gives_the_default_builds_outputs(tmp_path, monkeypatch):
    """On the GPU: every op of the layer the families cover replaced (weights read as
    stored, the causal flash kernel without a mask), the model's outputs match IREE's."""
    name, spec = _all_custom(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", name, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (8 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


@pytest.mark.gpu
def test_the_custom_build_is_tabled_dispatch_by_dispatch(tmp_path, monkeypatch):
    """Issue 24 item 3 for the custom route: the model built with its custom kernels has
    each of its dispatches timed, the kernels (`hal.dispatch.extern`) among them, the
    transposes and the mask they absorbed not."""
    from autosched.drivers.custom_route import custom_build_dispatches
    from autosched.outputs.report import RunLog

    name, spec = _all_custom(tmp_path)
    monkeypatch.chdir(tmp_path)
    config = RunConfig(target="cuda", arch="sm_90", work_dir=str(tmp_path / "w"))
    target = make_target(config)
    rows = custom_build_dispatches(
        config, target, RunLog(str(tmp_path / "run.log")), name, spec, None
    )
    externs = [r for r in rows if "extern_dispatch" in r.entry_point]
    assert externs and all(r.tuned_ms and r.tuned_ms > 0 for r in externs)
    assert not [r for r in rows if r.entry_point.endswith("transpose_128x128_bf16")]
    assert "all dispatches with the custom kernels" in open(tmp_path / "run.log").read()


@pytest.mark.parametrize("kernels", [None, ["iree"]])
def test_the_flash_route_pairs_each_attention_unless_the_cfg_leaves_it_out(tmp_path, kernels):
    """The route reads the model's attention ops and pairs them with the campaign's flow
    problems; `kernel = [iree]` leaves the family out before anything is lowered again."""
    from types import SimpleNamespace

    from autosched.drivers.campaign import ModelProblem
    from autosched.drivers.custom_route import flash_forms
    from autosched.drivers.model_stages.prepare import model_problems
    from autosched.outputs.report import RunLog

    name = model("hf_llama_layer_bf16.mlirbc")
    problems, _ = model_problems(analyze_model(name, SM90.compile_flags()), SM90)
    assert all(isinstance(p, ModelProblem) for p in problems)
    knobs = {"kernel": kernels} if kernels else {}
    config = RunConfig(target="cuda", arch="sm_90", work_dir=str(tmp_path), search_space=knobs)
    log = RunLog(str(tmp_path / "run.log"))
    forms = flash_forms(SimpleNamespace(target=SM90, config=config, log=log), problems, name)
    if kernels:
        assert forms == {} and "leaves them out" in open(tmp_path / "run.log").read()
        assert not (tmp_path / "model" / "attention").exists()
    else:
        ((flow, op),) = forms.items()
        assert flow.startswith("attention_2x2x64") and op.name.endswith("_causal")


DECODE_SHAPE = {  # the tiny cached Llama's decode step: one query row, an i1 mask of the cache
    "kind": "attention",
    "loops": ["b", "n", "k1", "k2"],
    "loop_sizes": [4, 16, 16, 64],
    "query_type": "f32",
    "key_type": "f32",
    "value_type": "f32",
    "mask_type": "i1",
    "form": "op",
    "causal": False,
    "scale": 0.25,
    "output_type": "f32",
    "operand_loops": [[0, 2], [0, 3, 2], [0, 1, 3], [0, 3], [0, 1]],
}


@pytest.mark.parametrize("mask_type", ["i1", "f32"])
def test_a_masked_single_row_op_and_numpys_reference_agree_on_the_cpu(tmp_path, mask_type):
    """A decode step's attention (one query row, a mask tensor of the cache's keys): IREE's
    build of the op alone gives the reference's answer, i1 masks keeping the keys where true
    and float masks added to the scaled scores."""
    op = problem_from_shape(dict(DECODE_SHAPE, mask_type=mask_type))
    assert op.single_row and op.mask_tensor
    assert_iree_gives_the_reference(op, tmp_path)


@pytest.mark.parametrize("mask_type", ["i1", "bf16"])
def test_a_masked_decode_attention_is_replaced_with_its_mask_an_operand(tmp_path, mask_type):
    """A decode step's attention (one query row, the cache's keys masked by a tensor) is the
    flash family's: the kernel takes the mask as its fourth operand, the substitution passes
    the op's mask to it, and the module builds for sm_90."""
    pytest.importorskip("triton")
    types = {f"{role}_type": "bf16" for role in ("query", "key", "value", "output")}
    sizes = {"loop_sizes": [8, 64, 64, 256], "mask_type": mask_type}
    op = problem_from_shape({**DECODE_SHAPE, **types, **sizes})
    source = tmp_path / "decode.mlir"
    source.write_text(op_module_text(op, {}))
    (found,) = op_attentions(str(source), str(tmp_path))
    assert found.single_row and found.mask_tensor and unsupported(found) is None
    spec = str(tmp_path / "custom.mlir")
    assert write_substitution(spec, [(found, FLASH_POINT)], SM90) == []
    assert f"tensor<8x256x{mask_type}>) -> tensor<8x64xbf16>" in open(spec).read()
    out, replaced = rewrite_model(
        str(source), spec, SM90.compile_flags(), str(tmp_path / "m.mlir"), 300
    )
    assert replaced == 1
    text = open(out).read()
    assert (
        "iree_linalg_ext.attention" not in text and 'hal.dispatch.extern "flash_attention"' in text
    )
    flags = [*SM90.compile_flags(), "--compile-from=global-optimization"]
    built = compile_one(CompileJob(out, str(tmp_path / "m.vmfb"), flags), 300)
    assert built.status == "ok", built.message


@pytest.mark.gpu
@pytest.mark.parametrize("mask_type", ["i1", "bf16"])
def test_a_masked_decode_attention_gives_numpys_answer_on_the_gpu(tmp_path, mask_type):
    types = {f"{role}_type": "bf16" for role in ("query", "key", "value", "output")}
    sizes = {"loop_sizes": [8, 64, 64, 200], "mask_type": mask_type}  # keys not a block's multiple
    op = problem_from_shape({**DECODE_SHAPE, **types, **sizes})
    view = SM90.for_problem(op)
    source = str(tmp_path / "fa.mlir")
    job = CompileJob(
        source, str(tmp_path / "fa.vmfb"), SM90.compile_flags(),
        view.source_command(op, FLASH_POINT, source),
    )  # fmt: skip
    built = compile_one(job, 300)
    assert built.status == "ok", built.message
    data = make_problem_data(op, str(tmp_path / "inputs"))
    verifier = Verifier("cuda")
    try:
        check = verifier.check(built.job.output, data, op, 120)
    finally:
        verifier.close()
    assert check.status == "correct", check.message


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_a_cached_lms_masked_attentions_are_replaced_and_the_model_builds(tmp_path):
    """transformers' Llama with a static cache in bf16 (prefill and decode in one module):
    both its attentions take the cache's i1 mask, prefill's 8 query rows and decode's one.
    Prefill's, over a cache it fills from position 0, is the causal mask (recognised by its
    values: its kernel applies it and reads no key past the diagonal); decode's is passed
    on. The flash kernels replace both, and the model builds for sm_90."""
    pytest.importorskip("triton")
    path = model("hf_tiny_llama_cached_bf16.mlirbc")
    ops = model_attentions(path, SM90.compile_flags(), str(tmp_path / "ops"))
    assert sorted(op.name for op in ops) == [
        "attention_4x1x16x64x16_bf16_mask_i1_op",
        "attention_4x8x16x64x16_bf16_causal",
    ]
    assert [op.mask_tensor for op in sorted(ops, key=lambda op: op.name)] == [True, False]
    assert all(unsupported(op) is None for op in ops)
    # Prefill's and decode's attentions come from one source line: each flow attention is
    # paired with its own op form (its query rows), not the first op at that line.
    flows = [r for r in analyze_model(path, SM90.compile_flags()).roots if r.kind == "attention"]
    pairs = {flow.name: paired(flow, ops).name for flow in flows}
    assert pairs == {
        "attention_2x2x8x16x64x16_bf16_mask_i1_gqa2": "attention_4x8x16x64x16_bf16_causal",
        "attention_4x1x16x64x16_bf16_mask_i1": "attention_4x1x16x64x16_bf16_mask_i1_op",
    }
    point = dict(FLASH_POINT, q_tile=64, kv_tile=32)
    spec = str(tmp_path / "custom.mlir")
    assert write_substitution(spec, [(op, point) for op in ops], SM90) == []
    out, replaced = rewrite_model(path, spec, SM90.compile_flags(), str(tmp_path / "m.mlir"), 300)
    assert replaced == 4  # each of the two layers' attentions, in prefill and in decode
    flags = [*SM90.compile_flags(), "--compile-from=global-optimization"]
    built = compile_one(CompileJob(out, str(tmp_path / "m.vmfb"), flags), 300)
    assert built.status == "ok", built.message


@pytest.mark.slow  # 8-14 s on two cores: run after the README's test command
def test_transformers_5s_constant_masks_are_read_whole_and_one_query_row_is_no_diagonal(
    tmp_path,
):
    """transformers 5's in-place export of the tiny Llama with a 96-token prompt and a
    160-token cache (`tools/export_causal_lm.py --in-place --dtype bfloat16 --prompt 96
    --cache 160`, torch 2.11, transformers 5.17). Both masks are computed from constants:
    prefill's from the prompt's 96 positions, hoisted as a global and printed in full (once
    elided, its causal mask went unread), and decode's, whose single query row has no `m`
    loop and so no diagonal: passed on as a mask (once an IndexError that ended the run)."""
    path = model("hf_tiny_llama_in_place_p96_bf16.mlirbc")
    ops = model_attentions(path, SM90.compile_flags(), str(tmp_path / "ops"))
    assert sorted(op.name for op in ops) == [
        "attention_4x1x16x160x16_bf16_mask_i1_op",
        "attention_4x96x16x160x16_bf16_causal",
    ]
    decode = next(op for op in ops if not op.causal)
    assert decode.mask_tensor and not decode.positions("m")


@pytest.mark.gpu
def test_a_cached_lms_masked_attentions_run_as_flash_kernels_on_the_gpu(tmp_path, monkeypatch):
    """The bf16 cached Llama on the GPU: its decode attention (one query row, IREE has no
    configuration for it) and prefill's are searched as flash kernels with the cache's
    mask (flash attention's and flash decoding's points); the checked points give numpy's
    answer and a custom build keeps the outputs. Fast mode: 8 kernels a problem; the
    matmuls' custom kernels are left out (IREE's pipelines only), so that the test's time
    goes to the attentions (about 80 s on an H100, not 200)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(model("hf_tiny_llama_cached_bf16.mlirbc"), tmp_path)
    cfg = "[SearchSpace.cuda]\npipeline = [TileAndFuse, VectorDistribute]\n"
    (tmp_path / "auto-scheduler.cfg").write_text(cfg)
    arguments = ["hf_tiny_llama_cached_bf16.mlirbc", "--target", "cuda", "--mode", "fast"]
    result = CliRunner().invoke(cli, ["run", *arguments, "--budget", "16"])
    assert result.exit_code == 0, result.output
    work = tmp_path / "generated" / "hf_tiny_llama_cached_bf16"
    records = [json.loads(line) for line in (work / "tuning.jsonl").read_text().splitlines()]
    flash = [r for r in records if r["config"].startswith(("fa_", "fd_"))]
    decode = [r for r in flash if "attention_4x1x" in r["problem"]]
    assert decode and any(r["status"] == "ok" for r in decode), result.output
    assert all(r["verification"] == "correct" for r in flash if r["status"] == "ok")
    if "with custom kernels" in result.output:
        assert "outputs match" in result.output.split("with custom kernels")[1]
