"""`autosched run MODEL` and `autosched apply` on the committed models, on the CPU: every
contraction of the dispatches IREE forms is found and tuned under one budget, the spec
applies to each tuned dispatch, and the whole model's outputs match."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG

from autosched.cli import cli
from autosched.config import RunConfig
from autosched.model.lowering import analyze_model
from autosched.outputs.spec import tuning_spec
from autosched.targets.cpu import CpuTarget

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
CFG = MODEL_CFG + "dispatch_table = none\n"  # the whole-model table has its own tests


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(CFG)
    for name in os.listdir(MODELS):
        if not name.endswith(".py"):
            shutil.copy(os.path.join(MODELS, name), tmp_path / name)
    return tmp_path


GEMM = "generated/gemm_matmul_transpose"  # the ONNX model's work folder


def summary(folder) -> dict:
    return json.loads((folder / GEMM / "results.summary.json").read_text())


@pytest.mark.slow  # 12-17 s: run after the README's test command
def test_onnx_model_is_tuned_whole_under_one_budget(folder):
    result = CliRunner().invoke(cli, ["run", "gemm_matmul_transpose.onnx", "--budget", "6"])
    assert result.exit_code == 0, result.output
    report = summary(folder)
    problems = {p["problem"]: p for p in report["problems"]}
    # The Gemm(transB=1) as IREE forms it: a transposed-B matmul with the bias add fused;
    # the batched MatMul with the Transpose fused. Two dispatches, both found.
    assert set(problems) == {
        "matmul_transpose_b_8x24x32_f32_f32_f32",
        "batch_matmul_2x16x24x32_f32_f32_f32",
    }
    assert problems["matmul_transpose_b_8x24x32_f32_f32_f32"]["fuses"] == [
        "linalg.generic (arith.addf)"
    ]
    assert report["trials"] == 6 and report["budget"] == 6
    # Candidates are timed on IREE's own dispatch, fused bias add and all.
    assert problems["matmul_transpose_b_8x24x32_f32_f32_f32"]["timed_on"] == (
        "gemm_matmul_transpose$async_dispatch_0_matmul_8x24x32_f32"
    )
    assert abs(sum(p["share"] for p in report["problems"]) - 1) < 1e-3
    with open(folder / GEMM / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 + 6  # two defaults and the six trials of the budget
    records = (folder / GEMM / "tuning.jsonl").read_text().splitlines()
    assert len(records) == 8


def test_kernel_timing_is_still_there_for_models(folder):
    """(With a budget of one trial for two problems, the run names the one left untried.)"""
    (folder / "kernel.cfg").write_text(CFG + "time_on = kernel\n")
    result = CliRunner().invoke(
        cli, ["run", "gemm_matmul_transpose.onnx", "--budget", "1", "--config", "kernel.cfg"]
    )
    assert result.exit_code == 0, result.output
    assert {p["timed_on"] for p in summary(folder)["problems"]} == {"kernel"}
    assert [p["trials"] for p in summary(folder)["problems"]].count(0) == 1
    assert "the budget of 1 trial was used before 1 of 2 problems ran a trial" in result.output


def test_torch_export_counts_repeated_dispatches(folder):
    result = CliRunner().invoke(cli, ["run", "llama_mlp.mlirbc", "--mode", "fast", "--dry-run"])
    assert result.exit_code == 0, result.output
    # gate and up are one problem run twice, down runs once (three dispatches in all)
    assert "batch_matmul_1x8x128x64_f32_f32_f32: runs 2x" in result.output
    assert "batch_matmul_1x8x64x128_f32_f32_f32: runs 1x" in result.output
    assert "budget: 16 trials (fast mode)" in result.output


def test_attention_is_listed_with_its_space(folder):
    result = CliRunner().invoke(cli, ["run", "attention.mlirbc", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "not tuned" not in result.output
    assert "attention_4x16x16x16x16_f32: runs 1x" in result.output
    assert "batch_matmul_1x16x32x64_f32_f32_f32: runs 1x" in result.output
    assert "  attention_4x16x16x16x16_f32: " in result.stdout  # its space, knob by knob


def test_unsupported_element_type_is_a_counted_reason(folder):
    (folder / "int.mlir").write_text(
        """
func.func @f(%a: tensor<16x32xi8>, %b: tensor<32x8xi8>, %bias: tensor<16x8xi32>) -> tensor<16x8xi32> {
  %zero = arith.constant 0 : i32
  %e = tensor.empty() : tensor<16x8xi32>
  %fill = linalg.fill ins(%zero : i32) outs(%e : tensor<16x8xi32>) -> tensor<16x8xi32>
  %m = linalg.matmul ins(%a, %b : tensor<16x32xi8>, tensor<32x8xi8>) outs(%fill : tensor<16x8xi32>) -> tensor<16x8xi32>
  %r = arith.addi %m, %bias : tensor<16x8xi32>
  return %r : tensor<16x8xi32>
}
"""
    )
    result = CliRunner().invoke(cli, ["run", "int.mlir"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert "(not tuned: 1 element type)" in lines[0]


def test_missing_onnx_extra_is_one_clear_error(folder):
    code = (
        "import sys; sys.modules['onnx'] = None\n"
        "from autosched.cli import main\n"
        "sys.argv = ['autosched', 'run', 'gemm_matmul_transpose.onnx', '--dry-run']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "pip install '.[onnx]'" in lines[-1]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("model", ["gemm_matmul_transpose.onnx", "llama_mlp.mlirbc"])
def test_apply_proves_a_spec_on_the_whole_model(folder, model):
    """A spec for every contraction (hand-picked points) is applied to each dispatch, and the
    model's outputs match; llama_mlp's entry takes torch-typed tensors in its source."""
    target = CpuTarget(RunConfig())
    analysis = analyze_model(str(folder / model), target.compile_flags())
    point = {"tile_m": 8, "tile_n": 8, "vec_m": 4, "vec_n": 8, "vec_k": 4}
    best = [(p, target, point) for p in analysis.matmul_problems()]
    assert len(best) == 2
    (folder / "spec.mlir").write_text(tuning_spec(best))
    result = CliRunner().invoke(cli, ["apply", model, "--spec", "spec.mlir"])
    assert result.exit_code == 0, result.output
    dispatches = 2 if model.endswith(".onnx") else 3
    assert f"{dispatches} of {dispatches} contraction dispatch(es) configured" in result.output
    assert "outputs match" in result.output
    assert result.output.strip().splitlines()[-1].startswith("model: ")


def test_apply_with_a_spec_that_matches_nothing(folder):
    target = CpuTarget(RunConfig())
    analysis = analyze_model(str(folder / "gemm_matmul_transpose.onnx"), target.compile_flags())
    problem = analysis.matmul_problems()[0]
    problem.m *= 2  # a shape the model does not have
    point = {"tile_m": 8, "tile_n": 8, "vec_m": 4, "vec_n": 8, "vec_k": 4}
    (folder / "spec.mlir").write_text(tuning_spec([(problem, target, point)]))
    result = CliRunner().invoke(cli, ["apply", "gemm_matmul_transpose.onnx", "--spec", "spec.mlir"])
    assert result.exit_code == 0, result.output
    assert "0 of 2 contraction dispatch(es) configured" in result.output


CORRUPT_OUTPUTS = """#!/bin/sh
"{real}" "$@" || exit $?
case "$*" in *iree_default*) exit 0;; esac
for arg in "$@"; do
  case "$arg" in
    --output=@*.npy) "{python}" -c "import numpy, sys; a = numpy.load(sys.argv[1]); numpy.save(sys.argv[1], a + 1)" "${{arg#--output=@}}";;
  esac
done
"""


def test_candidates_are_checked_on_the_dispatch_against_the_default(folder, monkeypatch):
    """A candidate whose dispatch answers differently from IREE's default build on the same
    inputs is a wrong_answer (here iree-run-module's outputs are corrupted by a wrapper)."""
    from autosched.measure.worker import run_tool

    wrapper = folder / "corrupt.sh"
    wrapper.write_text(CORRUPT_OUTPUTS.format(real=run_tool(), python=sys.executable))
    wrapper.chmod(0o755)
    monkeypatch.setenv("AUTOSCHED_IREE_RUN_MODULE", str(wrapper))
    result = CliRunner().invoke(cli, ["run", "gemm_matmul_transpose.onnx", "--budget", "2"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (folder / GEMM / "tuning.jsonl").open()]
    tuned = [r for r in records if not r["baseline"]]
    assert len(tuned) == 2 and {r["status"] for r in tuned} == {"wrong_answer"}
    assert all(r["baseline"] and r["status"] == "ok" for r in records if r not in tuned)
    log = (folder / GEMM / "run.log").read_text()
    assert "answers checked on the dispatch against IREE's default" in log


STABLEHLO = """
func.func @main(%x: tensor<16x32xf32>, %w: tensor<32x24xf32>, %b: tensor<16x24xf32>) -> tensor<16x24xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x24xf32>) -> tensor<16x24xf32>
  %1 = stablehlo.add %0, %b : tensor<16x24xf32>
  return %1 : tensor<16x24xf32>
}
"""
TOSA = """
func.func @main(%x: tensor<2x16x32xf32>, %w: tensor<2x32x24xf32>) -> tensor<2x16x24xf32> {
  %azp = "tosa.const"() <{values = dense<0.0> : tensor<1xf32>}> : () -> tensor<1xf32>
  %bzp = "tosa.const"() <{values = dense<0.0> : tensor<1xf32>}> : () -> tensor<1xf32>
  %0 = tosa.matmul %x, %w, %azp, %bzp : (tensor<2x16x32xf32>, tensor<2x32x24xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<2x16x24xf32>
  return %0 : tensor<2x16x24xf32>
}
"""


@pytest.mark.parametrize(
    "text, expected",
    [
        (STABLEHLO, "matmul_16x24x32_f32_f32_f32: runs 1x, fused with linalg.generic (arith.addf)"),
        (TOSA, "batch_matmul_2x16x24x32_f32_f32_f32: runs 1x"),
    ],
    ids=["stablehlo", "tosa"],
)
def test_stablehlo_and_tosa_models_are_lowered_by_iree(folder, text, expected):
    (folder / "model.mlir").write_text(text)
    result = CliRunner().invoke(cli, ["run", "model.mlir", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert expected in result.output


def test_a_named_module_is_tuned_on_its_dispatches(folder):
    """iree-turbine exports `module @module {...}`: its dispatch check modules must not copy
    the name (a symbol name is no attribute of another module)."""
    (folder / "named.mlir").write_text(
        "module @module {\n" + STABLEHLO.replace("@main", "@forward") + "}\n"
    )
    result = CliRunner().invoke(cli, ["run", "named.mlir", "--budget", "2"])
    assert result.exit_code == 0, result.output
    log = (folder / "generated/named/run.log").read_text()
    assert "answers checked on the dispatch against IREE's default" in log


@pytest.mark.parametrize("parallel", ["1", pytest.param("2", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_a_model_rerun_resumes_past_n_trial_without_measuring_twice(folder, parallel):
    """A model's budget can give one problem more than n_trial points (4 here); a rerun
    resumes all of them (the budget counts new trials), spends its own budget on new points
    and measures nothing twice, IREE's defaults included. With two problems searched at
    once (a batch each per round), the budget is still spent exactly."""
    args = ["run", "gemm_matmul_transpose.onnx", "--budget", "12", "--parallel-problems", parallel]
    assert CliRunner().invoke(cli, args).exit_code == 0
    database = folder / GEMM / "tuning.jsonl"
    first = [json.loads(line) for line in database.read_text().splitlines()]
    per_problem = {}
    for record in first:
        per_problem[record["problem"]] = per_problem.get(record["problem"], 0) + 1
    assert max(per_problem.values()) > 4 + 1  # one problem got more than n_trial, plus default
    assert len(first) == 12 + 2  # the budget and the two defaults
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    after = [json.loads(line) for line in database.read_text().splitlines()]
    assert after[: len(first)] == first
    assert len(after) == len(first) + 12
    assert sum(r["baseline"] for r in after) == 2
    log = (database.parent / "run.log").read_text()
    assert "12 of 12 new trials used; 12 resumed from the database" in log
    keys = [(r["problem"], r["config"]) for r in after]
    assert len(keys) == len(set(keys))


@pytest.mark.slow  # about 5 s or more on two cores: the README's command stays under 10 minutes
def test_the_worker_times_a_models_dispatches(folder, monkeypatch):
    """`timer = worker`: IREE's dispatch benchmarks are timed in the long-lived worker (its
    function takes the dispatch count), not by iree-benchmark-module (every call of which
    is logged by a wrapper around the real tool)."""
    from autosched.measure.benchmark_tool import benchmark_tool

    calls = folder / "calls.txt"
    wrapper = folder / "bench.sh"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {benchmark_tool()} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("AUTOSCHED_IREE_BENCHMARK_MODULE", str(wrapper))
    cfg = folder / "auto-scheduler.cfg"
    cfg.write_text(cfg.read_text() + "timer = worker\n")
    result = CliRunner().invoke(cli, ["run", "gemm_matmul_transpose.onnx", "--budget", "2"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (folder / GEMM / "tuning.jsonl").open()]
    assert len(records) >= 3 and all(r["status"] == "ok" for r in records), records
    assert all(r["median_ms"] > 0 for r in records)
    logged = calls.read_text() if calls.exists() else ""
    assert ".dispatch.vmfb" not in logged  # no candidate, nor the default, went to the tool


SHIPPED_LISTS = """
[SearchSpace.cpu]
tile_m = [16, 32, 64, 128]
tile_n = [32, 64, 128, 256]
vec_m = [4, 8, 16]
vec_n = [8, 16, 32]
vec_k = [1, 4, 8]
"""


@pytest.mark.slow  # 12-16 s: run after the README's test command
def test_cfg_lists_that_empty_a_space_give_way_and_say_so(folder):
    """The shipped cfg's CPU tiles cannot divide 8x24 and 16x24: the dry run and the run say
    so on the console, the knobs are generated from the problem instead, the budget is spent,
    and the run ends with the model's line (issue 26)."""
    (folder / "lists.cfg").write_text(CFG + SHIPPED_LISTS)
    args = ["run", "gemm_matmul_transpose.onnx", "--config", "lists.cfg"]
    dry = CliRunner().invoke(cli, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "matmul_transpose_b_8x24x32_f32_f32_f32: 300 points, 100 valid" in dry.output
    assert "rejected: 432 tile_m does not divide M" in dry.output
    result = CliRunner().invoke(cli, [*args, "--budget", "4"])
    assert result.exit_code == 0, result.output
    assert result.output.count("searched with knobs generated from the problem") == 2
    assert "warning" not in result.output.split("budget:")[0]  # not a fault: a note
    assert "budget: 4 of 4 new trials used" in result.output
    assert "model: " in result.output
    if "tuned model:" in result.output:  # the printed command imports the ONNX model first
        assert "tuned model: iree-import-onnx gemm_matmul_transpose.onnx -o" in result.output


@pytest.mark.slow  # 15 s: run after the README's test command
def test_progress_lines_when_the_output_is_not_a_terminal(folder):
    """Piped or logged (CI, `| tee`), the bar cannot redraw: lines say how far the run is,
    the last one at the end of the work (issue 26)."""
    result = CliRunner().invoke(cli, ["run", "llama_mlp.mlirbc", "--budget", "4"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if " measured; last " in line]
    assert len(lines) >= 2 and lines[-1].strip().startswith("6/6 measured")


DOT = """
func.func @main(%a: tensor<64xf32>, %b: tensor<64xf32>) -> tensor<f32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<f32>
  %c = linalg.fill ins(%z : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %r = linalg.dot ins(%a, %b : tensor<64xf32>, tensor<64xf32>) outs(%c : tensor<f32>) -> tensor<f32>
  return %r : tensor<f32>
}
"""


def test_a_dot_product_is_refused_with_its_reason(folder):
    (folder / "dot.mlir").write_text(DOT)
    result = CliRunner().invoke(cli, ["run", "dot.mlir", "--dry-run"])
    assert result.exit_code == 2
    assert "(not tuned: 1 dot product)" in result.output


EMPTY_OUTPUTS = """#!/bin/sh
"{real}" "$@" || exit $?
for arg in "$@"; do
  case "$arg" in --output=@*) : > "${{arg#--output=@}}";; esac
done
"""


def test_an_empty_output_file_is_an_error_line_not_an_interrupt(folder, monkeypatch):
    """Issue 27 item 5: a full disk leaves iree-run-module's output file empty; numpy's
    EOFError must not look like a Ctrl-C: one Error: line (exit 2), no "interrupted"."""
    import subprocess

    from autosched.measure.worker import run_tool

    target = CpuTarget(RunConfig())
    analysis = analyze_model(str(folder / "gemm_matmul_transpose.onnx"), target.compile_flags())
    point = {"tile_m": 8, "tile_n": 8, "vec_m": 4, "vec_n": 8, "vec_k": 4}
    (folder / "spec.mlir").write_text(
        tuning_spec([(p, target, point) for p in analysis.matmul_problems()])
    )
    wrapper = folder / "empty.sh"
    wrapper.write_text(EMPTY_OUTPUTS.format(real=run_tool()))
    wrapper.chmod(0o755)
    env = {**os.environ, "AUTOSCHED_IREE_RUN_MODULE": str(wrapper)}
    done = subprocess.run(
        [sys.executable, "-m", "autosched", "apply", "gemm_matmul_transpose.onnx", "--spec",
         "spec.mlir"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "interrupted" not in done.stderr and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "empty" in errors[0], done.stderr


def _f64_gemm_onnx(path) -> None:
    """An ONNX Gemm in double precision, with a Relu after it (a model, not one op)."""
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.DOUBLE, [16, 32])
    b = helper.make_tensor_value_info("b", TensorProto.DOUBLE, [32, 24])
    out = helper.make_tensor_value_info("out", TensorProto.DOUBLE, [16, 24])
    nodes = [helper.make_node("Gemm", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["out"])]
    graph = helper.make_graph(nodes, "gemm_f64", [a, b], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))


def test_an_f64_model_runs_in_f64_and_says_so(folder):
    """Issue 26 item 7: IREE's default f64 demotion breaks an f64 ONNX model at run time; the
    run names the model's types, compiles it with f64 kept, tunes its Gemm as an f64 problem
    and its outputs match."""
    _f64_gemm_onnx(folder / "gemm_f64.onnx")
    result = CliRunner().invoke(cli, ["run", "gemm_f64.onnx", "--budget", "2"])
    assert result.exit_code == 0, result.output
    assert "takes f64, returns f64; compiled with --iree-input-demote-f64-to-f32=false" in (
        result.output
    )
    assert "_f64_f64_f64" in result.output  # tuned as f64, not as f32
    model_line = next(line for line in result.output.splitlines() if line.startswith("model:"))
    assert "outputs match" in model_line or "nothing faster" in model_line, model_line
