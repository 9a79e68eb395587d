"""Torch ops IREE 3.13 does not lower, rewritten before lowering (autosched.model.torch_ops):
each rewrite lowered and run with iree.runtime against numpy's answer, an op nothing lowers
refused in one line, and transformers' own LlamaForCausalLM tuned end to end, on the CPU."""

from __future__ import annotations

import json
import os
import shutil

import iree.runtime as runtime
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG
from iree import compiler

from autosched.cli import cli
from autosched.config import RunConfig
from autosched.errors import UserError
from autosched.model.lowering import analyze_model, prepare_model
from autosched.outputs.spec import tuning_spec
from autosched.targets.cpu import CpuTarget

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
CPU_BACKENDS = ["llvm-cpu"]

# torch.diff(x, n, dim, prepend, append), as iree-turbine exports it: a `torch.operator`.
DIFF = """
func.func @main(%x: !torch.vtensor<{x}>, %p: !torch.vtensor<{p}>) -> !torch.vtensor<{r}> {{
  %n = torch.constant.int {n}
  %dim = torch.constant.int {dim}
  %none = torch.constant.none
  %r = torch.operator "torch.aten.diff"(%x, %n, %dim, {prepend}, {append})
      : (!torch.vtensor<{x}>, !torch.int, !torch.int, {prepend_type}, {append_type})
      -> !torch.vtensor<{r}>
  return %r : !torch.vtensor<{r}>
}}
"""


def _type(array: np.ndarray) -> str:
    element = {"int64": "si64", "float32": "f32", "bool": "i1"}[array.dtype.name]
    return f"[{','.join(map(str, array.shape))}],{element}"


def run_model(text: str, folder, arrays: list[np.ndarray]) -> np.ndarray:
    """The torch-dialect module `text` prepared as a run prepares a model (the rewrites),
    compiled for the CPU and run on `arrays` with iree.runtime; its one result."""
    source = folder / "model.mlir"
    source.write_text(text)
    prepared = prepare_model(str(source), str(folder / "work"))
    assert prepared != str(source)  # rewritten
    vmfb = compiler.compile_file(
        prepared, target_backends=CPU_BACKENDS, extra_args=["--iree-llvmcpu-target-cpu=host"]
    )
    module = runtime.load_vm_flatbuffer(vmfb, driver="local-task")
    return np.asarray(module.main(*arrays).to_host())


@pytest.mark.parametrize(
    "shape, dtype, n, dim, where",
    [
        ((1, 16), "int64", 1, -1, "prepend"),  # transformers' masking_utils
        ((3, 5), "float32", 2, 0, "append"),
        ((2, 7), "bool", 1, 1, "prepend"),  # torch and numpy take != for bools
        ((4, 6), "float32", 3, 1, "none"),
    ],
)
def test_diff_is_rewritten_and_matches_numpy(tmp_path, shape, dtype, n, dim, where):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 9, size=shape) if dtype != "float32" else rng.standard_normal(shape)
    x = x.astype(dtype)
    extra_shape = list(shape)
    extra_shape[dim] = 1
    extra = (rng.integers(0, 9, size=extra_shape)).astype(dtype)
    kwargs = {} if where == "none" else {where: extra}
    expected = np.diff(x, n=n, axis=dim, **kwargs)
    text = DIFF.format(
        x=_type(x),
        p=_type(extra),
        r=_type(expected),
        n=n,
        dim=dim,
        prepend="%p" if where == "prepend" else "%none",
        append="%p" if where == "append" else "%none",
        prepend_type=f"!torch.vtensor<{_type(extra)}>" if where == "prepend" else "!torch.none",
        append_type=f"!torch.vtensor<{_type(extra)}>" if where == "append" else "!torch.none",
    )
    got = run_model(text, tmp_path, [x, extra])
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


AND = """
func.func @main(%a: !torch.vtensor<[],i1>, %b: !torch.vtensor<[4,6],i1>) -> !torch.vtensor<[4,6],i1> {
  %r = torch.aten.__and__.Tensor %a, %b : !torch.vtensor<[],i1>, !torch.vtensor<[4,6],i1> -> !torch.vtensor<[4,6],i1>
  return %r : !torch.vtensor<[4,6],i1>
}
"""


@pytest.mark.parametrize("scalar", [True, False])
def test_and_of_masks_is_rewritten_and_matches_numpy(tmp_path, scalar):
    """transformers' `and_masks` starts from a 0-d True and `&`s each mask in."""
    mask = np.random.default_rng(1).integers(0, 2, size=(4, 6)).astype(bool)
    got = run_model(AND, tmp_path, [np.array(scalar), mask])
    np.testing.assert_array_equal(got, np.logical_and(scalar, mask))


def test_a_diff_of_order_zero_is_refused_in_one_line(tmp_path):
    x = np.zeros((2, 3), np.int64)
    text = DIFF.format(
        x=_type(x),
        p=_type(x),
        r=_type(x),
        n=0,
        dim=1,
        prepend="%none",
        append="%none",
        prepend_type="!torch.none",
        append_type="!torch.none",
    )
    (tmp_path / "model.mlir").write_text(text)
    with pytest.raises(UserError, match=r"torch\.aten\.diff \(.*model\.mlir:6:8\) has order 0"):
        prepare_model(str(tmp_path / "model.mlir"), str(tmp_path / "work"))


UNKNOWN = """
func.func @main(%x: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %r = torch.operator "torch.aten.frobnicate"(%x) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %r : !torch.vtensor<[4],f32>
}
"""


def test_an_op_nothing_lowers_is_one_error_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.mlir").write_text(UNKNOWN)
    result = CliRunner().invoke(cli, ["run", "model.mlir", "--dry-run"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1] == (
        "Error: model.mlir: torch.aten.frobnicate (model.mlir:3:8) has no lowering in IREE 3.13"
        " and no rewrite in autosched (autosched/model/torch_ops.py): export the model with a"
        " decomposition for it (torch.export's run_decompositions), or open an issue"
    )
    assert "Traceback" not in result.output


def test_a_model_with_nothing_to_rewrite_is_taken_as_it_is(tmp_path):
    path = os.path.join(MODELS, "hf_llama_layer_f32.mlirbc")
    assert prepare_model(path, str(tmp_path)) == path
    assert not os.listdir(tmp_path)


LM_HEAD = "batch_matmul_1x16x256x64_f32_f32_f32"  # N = vocab: the model's widest matmul
LM_HEAD_POINT = {"tile_m": 16, "tile_n": 32, "vec_m": 8, "vec_n": 16, "vec_k": 4}
EMBEDDING = "gather_16x64_from_256_f32_i64"
EMBEDDING_POINT = {"t_tile": 4, "d_tile": 32, "d_vec": 8}


@pytest.mark.slow  # about 2 minutes on two cores: a whole run with a budget of 6
def test_a_transformers_causal_lm_is_tuned_end_to_end(tmp_path, monkeypatch):
    """transformers 5.17's LlamaForCausalLM (torch.diff in its mask code, `&` of masks):
    every matmul found, the lm head (N = vocab = 256) among them, the budget spent, the
    whole model's outputs compared, and the random token ids valid rows of the embedding."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG + "dispatch_table = none\n")
    shutil.copy(os.path.join(MODELS, "hf_tiny_causal_lm_f32.mlirbc"), tmp_path)
    result = CliRunner().invoke(cli, ["run", "hf_tiny_causal_lm_f32.mlirbc", "--budget", "6"])
    assert result.exit_code == 0, result.output
    work = tmp_path / "generated" / "hf_tiny_causal_lm_f32"
    report = json.loads((work / "results.summary.json").read_text())
    problems = {p["problem"] for p in report["problems"]}
    assert LM_HEAD in problems
    assert "batch_matmul_1x16x128x64_f32_f32_f32" in problems  # the MLP's gate and up
    assert report["trials"] == 6 and report["budget"] == 6
    assert "\nmodel: " in result.output  # the whole model timed (a winner, or the default)
    ids = np.load(work / "model" / "proof" / "inputs" / "input0.npy")
    assert ids.dtype == np.int64 and ids.shape == (1, 16)
    assert ids.min() >= 0 and ids.max() < 256  # the vocabulary

    # A spec on the lm head (the noise of two cores may leave the run no winner): the
    # rewritten model with it answers as IREE's default build does.
    target = CpuTarget(RunConfig())
    analysis = analyze_model("hf_tiny_causal_lm_f32.mlirbc", target.compile_flags())
    head = next(p for p in analysis.matmul_problems() if p.name == LM_HEAD)
    # ... and on the embedding's lookup, a gather root (tokens and width per workgroup).
    assert EMBEDDING in problems
    (gather,) = [r for r in analysis.roots if r.kind == "gather"]
    best = [(head, target, LM_HEAD_POINT), (gather, target, EMBEDDING_POINT)]
    (tmp_path / "head.mlir").write_text(tuning_spec(best))
    args = ["apply", "hf_tiny_causal_lm_f32.mlirbc", "--spec", "head.mlir"]
    applied = CliRunner().invoke(cli, args)
    assert applied.exit_code == 0, applied.output
    assert f"{LM_HEAD} (spec)" in applied.output and "outputs match" in applied.output
    assert f"{EMBEDDING} (spec)" in applied.output
