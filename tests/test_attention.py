"""Attention as a tuned root op (issue 24), on transformers' own layers exported with
iree-turbine and committed: a Llama decoder layer (SDPA, causal, GQA 4/2 heads) in f32 and
bf16, and a BERT layer (SDPA, no mask). Real iree-compile and local-task runs, no mocks.

The attention is found where IREE forms its dispatches, with its loops' roles; a spec built
from a point of its space reaches the `online_attention` IREE configures (on the CPU, and on
CUDA compiled here without a GPU, with its decomposition_config); the model built with that
spec gives the default build's outputs; and a run searches it like any problem.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG, attach_dispatches

from autosched.cli import cli
from autosched.compile import compile_one
from autosched.config import RunConfig
from autosched.drivers.model_stages.prepare import model_problems
from autosched.drivers.proof import prove
from autosched.model.configured import check_build, dispatch_configs
from autosched.model.lowering import analyze_model
from autosched.ops.registry import kind_of
from autosched.outputs.spec import tuning_spec
from autosched.run.builds import dispatch_job, expected_config, expected_configs
from autosched.search.space import build_space
from autosched.targets.cpu import CpuTarget
from autosched.targets.cuda import CudaTarget

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
CPU = CpuTarget(RunConfig())
LLAMA = "attention_2x2x64x32x64x32_{t}_mask_{t}_gqa2"  # kv heads, group, q, k1, k2, n
BERT = "attention_2x4x32x32x32x32_f32"  # batch, heads, q, k1, k2, n
MASKED = "attention_4x32x16x32x16_f32_mask_i1"  # batch, q, k1, k2, n; a boolean mask
# A boolean (i1) mask, as a causal LM's attention takes it: IREE configures it as i8.
MASKED_MLIR = """
#q = affine_map<(b, m, n, k1, k2) -> (b, m, k1)>
#k = affine_map<(b, m, n, k1, k2) -> (b, k2, k1)>
#v = affine_map<(b, m, n, k1, k2) -> (b, k2, n)>
#s = affine_map<(b, m, n, k1, k2) -> ()>
#mask = affine_map<(b, m, n, k1, k2) -> (b, m, k2)>
#o = affine_map<(b, m, n, k1, k2) -> (b, m, n)>
func.func @main(%q: tensor<4x32x16xf32>, %k: tensor<4x32x16xf32>, %v: tensor<4x32x16xf32>,
                %mask: tensor<4x32x32xi1>) -> tensor<4x32x16xf32> {
  %scale = arith.constant 0.25 : f32
  %init = tensor.empty() : tensor<4x32x16xf32>
  %r = iree_linalg_ext.attention <indexing_maps = [#q, #k, #v, #s, #mask, #o]>
      ins(%q, %k, %v, %scale, %mask : tensor<4x32x16xf32>, tensor<4x32x16xf32>,
          tensor<4x32x16xf32>, f32, tensor<4x32x32xi1>)
      outs(%init : tensor<4x32x16xf32>) {
    ^bb0(%x: f32):
      iree_linalg_ext.yield %x : f32
  } -> tensor<4x32x16xf32>
  return %r : tensor<4x32x16xf32>
}
"""


def model(name: str) -> str:
    return os.path.join(MODELS, name)


def attention_of(name: str, target=CPU):
    analysis = analyze_model(model(name), target.compile_flags())
    (found,) = [r for r in analysis.roots if r.kind == "attention"]
    return analysis, found


@pytest.mark.parametrize("element", ["f32", "bf16"])
def test_llama_layer_attention_is_found_with_gqa_and_its_causal_mask(element):
    analysis, found = attention_of(f"hf_llama_layer_{element}.mlirbc")
    assert found.name == LLAMA.format(t=element)
    assert found.loops == ("b", "b", "m", "n", "k1", "k2")
    assert found.heads_per_kv == 2  # 4 query heads on 2 K/V heads, K and V not repeated
    assert found.mask_type == element  # the causal mask torch-mlir materializes
    assert found.batch_sizes == [2, 2] and found.size("m") == found.size("k2") == 64
    assert "attention" not in analysis.skipped_counts()
    assert len(analysis.contractions) == 4  # q/o, k/v, gate/up, down projections


def test_bert_layer_attention_has_no_mask():
    _, found = attention_of("hf_bert_layer_f32.mlirbc")
    assert found.name == BERT and found.mask_type == "" and found.heads_per_kv == 1


def spec_for(tmp_path, problem, target, point) -> str:
    path = tmp_path / "spec.mlir"
    path.write_text(tuning_spec([(problem, target, point)]))
    return str(path)


def not_default(problem, target, default: str):
    """The first point of the space whose configuration is not IREE's default."""
    view = target.for_problem(problem)
    for point in build_space(problem, target, {}).points:
        if view.lowering_config(problem, point).find(default) < 0:
            return point
    raise AssertionError("every point is the default")


@pytest.mark.parametrize(
    "name",
    [
        "hf_llama_layer_f32.mlirbc",
        pytest.param("hf_llama_layer_bf16.mlirbc", marks=pytest.mark.slow),
        pytest.param("hf_bert_layer_f32.mlirbc", marks=pytest.mark.slow),
    ],
)
def test_a_cpu_spec_reaches_the_online_attention_and_outputs_match(tmp_path, name):
    _, problem = attention_of(name)
    point = {"q_tile": 16, "q_vec": 4, "n_vec": 8, "kv_tile": 8}
    assert point in build_space(problem, CPU, {}).points
    spec = spec_for(tmp_path, problem, CPU, point)
    expected = CPU.for_problem(problem).lowering_config(problem, point)
    configs = [
        c
        for c in dispatch_configs(model(name), CPU.compile_flags(), spec)
        if c.contraction == problem.name
    ]
    assert len(configs) == 1 and configs[0].op_name == "iree_linalg_ext.online_attention"
    assert configs[0].carries(expected), configs[0].lowering_config
    plain = [
        c
        for c in dispatch_configs(model(name), CPU.compile_flags())
        if c.contraction == problem.name
    ]
    assert not plain[0].carries(expected)  # IREE's own choice is another
    proof = prove(
        model(name),
        CPU.compile_flags(),
        spec,
        "local-task",
        rounds=1,
        repetitions=1,
        min_time=0.005,
        work_dir=str(tmp_path / "proof"),
    )
    assert proof.outputs_match, proof.message


def test_a_cpu_spec_reaches_the_online_attention_of_an_i1_mask(tmp_path):
    """IREE configures the i1 mask as i8: the spec's matcher asks for i8, the name keeps i1."""
    path = tmp_path / "masked.mlir"
    path.write_text(MASKED_MLIR)
    _, problem = attention_of(str(path))
    assert problem.name == MASKED and problem.mask_type == "i1"
    (plain,) = dispatch_configs(str(path), CPU.compile_flags())
    point = not_default(problem, CPU, plain.lowering_config)
    spec = spec_for(tmp_path, problem, CPU, point)
    expected = CPU.for_problem(problem).lowering_config(problem, point)
    assert not plain.carries(expected)  # IREE's own choice is another
    (configured,) = dispatch_configs(str(path), CPU.compile_flags(), spec)
    assert configured.op_name == "iree_linalg_ext.online_attention"
    assert configured.contraction == MASKED.replace("_mask_i1", "_mask_i8")
    assert configured.carries(expected), configured.lowering_config


@pytest.mark.slow
def test_a_run_searches_an_i1_masked_attention(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG)
    (tmp_path / "masked.mlir").write_text(MASKED_MLIR)
    result = CliRunner().invoke(cli, ["run", "masked.mlir", "--budget", "3"])
    assert result.exit_code == 0, result.output
    assert "the spec does not reach" not in result.output
    assert "a one-point spec reaches" in (tmp_path / "generated/masked/run.log").read_text()
    summary = json.loads((tmp_path / "generated/masked/results.summary.json").read_text())
    (row,) = summary["problems"]
    assert row["problem"] == MASKED and row["trials"] >= 2 and row["not_applied"] == 0
    records = [json.loads(line) for line in open("generated/masked/tuning.jsonl")]
    checked = [r for r in records if not r["baseline"] and r["status"] == "ok"]
    assert len(checked) >= 2 and all(r["verification"] == "correct" for r in checked)


@pytest.mark.slow  # the tiny ViT in fast mode: about 30 s on two cores
@pytest.mark.parametrize("name", ["timm_vit_tiny_f32", "timm_vit_tiny_b1_f32"])
def test_an_attention_over_37_keys_is_tuned_with_partial_tiles(tmp_path, monkeypatch, name):
    """A tiny ViT's attention (37 queries and keys, of which no tile from 8 up divides
    either) had no point; its query and key tiles now overhang, and the candidates checked
    against IREE's default are right, in the dispatch and in the whole model. At batch 1
    too, whose check module folds the attention's unit batch loop: every point applies."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(model(f"{name}.mlirbc"), tmp_path)
    result = CliRunner().invoke(cli, ["run", f"{name}.mlirbc", "--mode", "fast"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in open(f"generated/{name}/tuning.jsonl")]
    mine = [r for r in records if r["problem"].startswith("attention") and not r["baseline"]]
    assert mine and any(37 % r["point"]["kv_tile"] for r in mine)
    assert not [r for r in mine if r["status"] == "not_applied"]
    checked = [r for r in mine if r["status"] == "ok" and r["verification"] != "unchecked"]
    assert checked and all(r["verification"] == "correct" for r in checked)
    assert "OUTPUTS DIFFER" not in result.output


def test_a_batch_1_attention_carries_its_point_in_the_check_module_that_folds_its_batch(
    tmp_path,
):
    """At batch 1, IREE folds the unit batch loop of a ViT's attention where its check
    module enters (at `flow`): 5 loops there, 6 in the dispatch that is timed. The spec
    matches both forms, each given the point's tiles of its own loops, so both builds carry
    the point (before, the check module kept IREE's default: every candidate `not_applied`)."""
    name = "timm_vit_tiny_b1_f32.mlirbc"
    problems, _ = model_problems(analyze_model(model(name), CPU.compile_flags()), CPU)
    attach_dispatches(problems, model(name), CPU.compile_flags(), str(tmp_path / "d"))
    (entry,) = [p for p in problems if p.problem.kind == "attention"]
    problem = entry.problem
    assert problem.loops == ("b", "b", "m", "n", "k1", "k2") and problem.batch_sizes == [2, 1]
    (folded,) = kind_of(problem).folded_forms(problem)
    assert folded.loops == ("b", "m", "n", "k1", "k2") and folded.loop_sizes[0] == 2
    point = {"q_tile": 8, "q_vec": 8, "n_vec": 32, "kv_tile": 8}
    assert point in build_space(problem, CPU, {}).points
    expected = expected_configs(problem, CPU, point)
    assert len(expected) == 2 and expected[0] != expected[1]
    forms = []
    for check in (False, True):
        job = dispatch_job(entry.benchmark, problem, CPU, point, str(tmp_path / "c"), check)
        assert compile_one(job, 300).status == "ok"
        verdict = check_build(job.output, expected)
        assert verdict.ok, verdict.message
        forms.append(verdict.form)
        other_form = expected[0] if check else expected[1]
        assert not check_build(job.output, other_form).ok
    assert forms[0] != forms[1]  # 6 loops timed, 5 checked


def test_the_vector_limit_leaves_out_points_that_do_not_compile():
    _, problem = attention_of("hf_llama_layer_f32.mlirbc")
    space = build_space(problem, CPU, {})
    assert {"q_tile": 8, "q_vec": 8, "n_vec": 4, "kv_tile": 32} not in space.points  # 32 KB
    assert any("vector over" in reason for reason in space.rejected)


def test_cuda_attention_candidate_is_in_the_timed_dispatch(tmp_path):
    """sm_80, compiled here: the dispatch benchmark that is timed carries the point's
    compilation_info and its decomposition_config (the Q.K and P.V intrinsics)."""
    target = CudaTarget(RunConfig(target="cuda", arch="sm_80"))
    name = "hf_llama_layer_bf16.mlirbc"
    problems, _ = model_problems(analyze_model(model(name), target.compile_flags()), target)
    attach_dispatches(problems, model(name), target.compile_flags(), str(tmp_path / "d"))
    (entry,) = [p for p in problems if p.problem.kind == "attention"]
    assert entry.benchmark is not None and entry.benchmark.check_source
    problem = entry.problem
    points = build_space(problem, target, {}).points
    point = {"q_tile": 32, "kv_tile": 32, "q_warps": 2, "kernel": "iree", "kv_stages": 0}
    point["kv_splits"] = 0  # the flash kernels' knobs, neutral for IREE's points
    assert point in points and len(points) > 4
    job = dispatch_job(entry.benchmark, problem, target, point, str(tmp_path / "cand"))
    assert compile_one(job, 300).status == "ok"
    verdict = check_build(job.output, expected_config(problem, target, point))
    assert verdict.ok, verdict.message
    assert "online_attention" in verdict.form
    configured = open(
        next(os.path.join(job.output + ".configs", f) for f in os.listdir(job.output + ".configs"))
    ).read()
    assert "NV_MMA_SYNC_F32_16x8x16_BF16" in configured and "subgroup_basis" in configured


def test_cuda_f32_attention_is_not_tuned_and_says_why():
    target = CudaTarget(RunConfig(target="cuda", arch="sm_80"))
    analysis = analyze_model(model("hf_bert_layer_f32.mlirbc"), target.compile_flags())
    problems, skipped = model_problems(analysis, target)
    assert all(p.problem.kind == "matmul" for p in problems)
    assert any("no tensor-core configuration on sm_80" in reason for reason in skipped)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG)
    shutil.copy(model("hf_llama_layer_f32.mlirbc"), tmp_path)
    return tmp_path


@pytest.mark.slow
def test_a_run_searches_the_attention_on_its_dispatch(folder):
    result = CliRunner().invoke(cli, ["run", "hf_llama_layer_f32.mlirbc", "--budget", "14"])
    assert result.exit_code == 0, result.output
    summary = json.loads((folder / "generated/hf_llama_layer_f32/results.summary.json").read_text())
    (row,) = [p for p in summary["problems"] if p["problem"] == LLAMA.format(t="f32")]
    assert row["kind"] == "attention" and row["trials"] >= 2
    assert "online_attention" in row["timed_form"] and row["not_applied"] == 0
    records = [
        json.loads(line)
        for line in (folder / "generated/hf_llama_layer_f32/tuning.jsonl").read_text().splitlines()
    ]
    mine = [r for r in records if r["problem"] == LLAMA.format(t="f32")]
    assert any(r["baseline"] for r in mine)
    checked = [r for r in mine if not r["baseline"] and r["status"] == "ok"]
    assert checked and all(r["verification"] == "correct" for r in checked)
    assert all(r["shape"]["kind"] == "attention" for r in mine)
    assert all(
        set(r["point"]) == {"q_tile", "q_vec", "n_vec", "kv_tile"} for r in mine if r["point"]
    )
    assert "not tuned: 1 attention" not in result.output


@pytest.mark.gpu
def test_cuda_run_checks_and_times_the_attention_on_the_gpu(tmp_path, monkeypatch):
    """On the GPU: the bf16 Llama layer's attention candidates are built, checked against
    the default build's outputs and timed on IREE's dispatch."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(model("hf_llama_layer_bf16.mlirbc"), tmp_path)
    cfg = MODEL_CFG + "[SearchSpace.cuda]\npipeline = [TileAndFuse, VectorDistribute]\n"
    (tmp_path / "auto-scheduler.cfg").write_text(cfg)
    result = CliRunner().invoke(
        cli, ["run", "hf_llama_layer_bf16.mlirbc", "--target", "cuda", "--budget", "12"]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in open("generated/hf_llama_layer_bf16/tuning.jsonl")]
    mine = [r for r in records if r["problem"] == LLAMA.format(t="bf16") and not r["baseline"]]
    timed = [r for r in mine if r["status"] == "ok"]
    assert timed and all(r["verification"] == "correct" and r["median_ms"] > 0 for r in timed)
    assert not [r for r in mine if r["status"] == "not_applied"]
