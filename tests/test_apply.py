"""The whole-model proof with the real iree-compile and local-task runs: no mocks.

Specs are built the way the product builds them (`spec.tuning_spec` from problem, target and
point), with the problems taken from the dispatches IREE forms (`model.analyze_model`), so the
transposed Gemm's spec carries the dispatch's own maps.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from autosched.config import RunConfig
from autosched.drivers.proof import prove
from autosched.errors import UserError
from autosched.measure.module_io import (
    EntryFunction,
    TensorSpec,
    compare_outputs,
    entry_function,
    make_inputs,
    run_outputs,
)
from autosched.model.configured import compile_model, dispatch_configs, spec_coverage
from autosched.model.lowering import analyze_model
from autosched.outputs.spec import tuning_spec
from autosched.targets.cpu import CpuTarget

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
TARGET = CpuTarget(RunConfig())
FLAGS = TARGET.compile_flags()
DEVICE = "local-task"
QUICK = {"rounds": 3, "repetitions": 2, "min_time": 0.01, "timeout": 120}

# Hand-picked points, none of them IREE's default for these shapes.
ONNX_POINTS = {
    "matmul_transpose_b_8x24x32_f32_f32_f32": {
        "tile_m": 4,
        "tile_n": 8,
        "vec_m": 2,
        "vec_n": 4,
        "vec_k": 2,
    },
    "batch_matmul_2x16x24x32_f32_f32_f32": {
        "tile_m": 8,
        "tile_n": 8,
        "vec_m": 4,
        "vec_n": 4,
        "vec_k": 4,
    },
}
LLAMA_POINTS = {
    "batch_matmul_1x8x128x64_f32_f32_f32": {
        "tile_m": 8,
        "tile_n": 32,
        "vec_m": 4,
        "vec_n": 16,
        "vec_k": 4,
    },
    "batch_matmul_1x8x64x128_f32_f32_f32": {
        "tile_m": 8,
        "tile_n": 16,
        "vec_m": 4,
        "vec_n": 8,
        "vec_k": 8,
    },
}


def model(name: str) -> str:
    return os.path.join(MODELS, name)


def write_spec(path, model_name: str, points: dict) -> dict[str, str]:
    """Writes a spec for the model's contractions; returns contraction name -> config text."""
    analysis = analyze_model(model(model_name), FLAGS)
    best, expected = [], {}
    for contraction in analysis.contractions:
        problem = contraction.as_matmul_problem()
        point = points[problem.name]
        best.append((problem, TARGET, point))
        expected[contraction.name] = TARGET.lowering_config(problem, point)
    assert len(best) == len(points)
    path.write_text(tuning_spec(best))
    return expected


@pytest.fixture(scope="module")
def onnx_spec(tmp_path_factory):
    pytest.importorskip("onnx")
    path = tmp_path_factory.mktemp("onnx") / "spec.mlir"
    return str(path), write_spec(path, "gemm_matmul_transpose.onnx", ONNX_POINTS)


def test_spec_covers_both_onnx_dispatches(onnx_spec):
    spec_path, expected = onnx_spec
    configs = spec_coverage(model("gemm_matmul_transpose.onnx"), FLAGS, spec_path)
    assert [c.contraction for c in configs] == [
        "matmul_transpose_b_8x24x32_f32_f32_f32",
        "batch_matmul_2x16x24x32_f32_f32_f32",
    ]
    gemm, batched = configs
    assert gemm.op_name == "linalg.matmul" and gemm.entry_point.endswith("matmul_8x24x32_f32")
    assert batched.op_name == "linalg.batch_matmul" and batched.calls == 1
    for config in configs:
        assert config.carries(expected[config.contraction]), config
        assert config.changed
        assert config.default_lowering_config is not None
        assert config.lowering_config != config.default_lowering_config
    # The exact tile lists, as IREE printed them on each root.
    assert gemm.lowering_config == (
        "#iree_cpu.lowering_config<distribution = [4, 8, 0], "
        "vector_common_parallel = [2, 4, 0], vector_reduction = [0, 0, 2]>"
    )
    assert batched.lowering_config == (
        "#iree_cpu.lowering_config<distribution = [1, 8, 8, 0], "
        "vector_common_parallel = [1, 4, 4, 0], vector_reduction = [0, 0, 0, 4]>"
    )
    # Without the spec each root carries IREE's own choice, which is not the hand-picked one.
    plain = dispatch_configs(model("gemm_matmul_transpose.onnx"), FLAGS)
    assert [c.lowering_config for c in plain] == [c.default_lowering_config for c in configs]
    assert not any(c.carries(expected[c.contraction]) for c in plain)


def test_spec_that_matches_nothing_covers_nothing(tmp_path):
    pytest.importorskip("onnx")
    analysis = analyze_model(model("gemm_matmul_transpose.onnx"), FLAGS)
    best = []
    for contraction in analysis.contractions:
        problem = contraction.as_matmul_problem()
        point = ONNX_POINTS[problem.name]
        # The same layout and types, twice the rows: no dispatch of this model has that shape.
        best.append((dataclasses.replace(problem, m=problem.m * 2), TARGET, point))
    spec = tmp_path / "spec.mlir"
    spec.write_text(tuning_spec(best))
    configs = spec_coverage(model("gemm_matmul_transpose.onnx"), FLAGS, str(spec))
    assert len(configs) == 2
    for config, (problem, _, point) in zip(configs, best, strict=True):
        assert not config.changed
        assert config.lowering_config == config.default_lowering_config
        assert not config.carries(TARGET.lowering_config(problem, point))


def test_prove_onnx_model(onnx_spec, tmp_path):
    spec_path, _ = onnx_spec
    proof = prove(
        model("gemm_matmul_transpose.onnx"),
        FLAGS,
        spec_path,
        DEVICE,
        work_dir=str(tmp_path),
        **QUICK,
    )
    assert proof.function == "gemm_matmul_transpose"
    assert proof.outputs == 2
    assert proof.outputs_match, proof.message
    assert proof.max_error is not None and proof.max_error <= 1e-4
    assert proof.default_ms > 0 and proof.tuned_ms > 0
    assert len(proof.default_rounds_ms) == len(proof.tuned_rounds_ms) == QUICK["rounds"]
    assert proof.speedup == pytest.approx(1 / proof.verdict.median)  # the paired statistic
    assert proof.default_cv >= 0 and proof.tuned_cv >= 0
    # The inputs are kept for iree-benchmark-module as .npy files.
    assert sorted(os.listdir(tmp_path / "inputs")) == ["input0.npy", "input1.npy", "input2.npy"]


@pytest.mark.slow  # about 5 s or more on two cores: the README's command stays under 10 minutes
def test_prove_llama_mlp(tmp_path):
    spec = tmp_path / "spec.mlir"
    expected = write_spec(spec, "llama_mlp.mlirbc", LLAMA_POINTS)
    configs = spec_coverage(model("llama_mlp.mlirbc"), FLAGS, str(spec))
    # gate and up share a signature: one spec rule configures both dispatches.
    assert len(configs) == 3
    assert all(c.carries(expected[c.contraction]) for c in configs)
    proof = prove(model("llama_mlp.mlirbc"), FLAGS, str(spec), DEVICE, seed=1, **QUICK)
    assert proof.function == "main"  # a torch export: !torch.vtensor in, plain tensors compiled
    assert proof.outputs_match, proof.message
    assert proof.default_ms > 0 and proof.tuned_ms > 0 and proof.speedup > 0


def test_entry_function_types():
    entry = entry_function(model("attention.mlirbc"), FLAGS)
    assert entry.name == "main"
    assert [i.text for i in entry.inputs] == ["1x4x16x16xf32"] * 3 + ["64x32xf32"]
    assert [o.text for o in entry.outputs] == ["1x16x32xf32"]


MIXED_TYPES = """
func.func @mixed(%a: tensor<4x8xf16>, %b: tensor<4x8xbf16>, %c: tensor<4xi32>, %x: tensor<8x8xf32>)
    -> (tensor<4x8xf16>, tensor<4x8xbf16>, tensor<4xi32>, tensor<8x8xf32>) {
  %a2 = arith.addf %a, %a : tensor<4x8xf16>
  %b2 = arith.mulf %b, %b : tensor<4x8xbf16>
  %c2 = arith.addi %c, %c : tensor<4xi32>
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<8x8xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%empty : tensor<8x8xf32>) -> tensor<8x8xf32>
  %m = linalg.matmul ins(%x, %x : tensor<8x8xf32>, tensor<8x8xf32>)
                     outs(%fill : tensor<8x8xf32>) -> tensor<8x8xf32>
  return %a2, %b2, %c2, %m : tensor<4x8xf16>, tensor<4x8xbf16>, tensor<4xi32>, tensor<8x8xf32>
}
"""


def test_prove_handles_f16_bf16_and_integer_inputs(tmp_path):
    source = tmp_path / "mixed.mlir"
    source.write_text(MIXED_TYPES)
    entry = entry_function(str(source), FLAGS)
    assert [i.text for i in entry.inputs] == ["4x8xf16", "4x8xbf16", "4xi32", "8x8xf32"]
    # A spec for the 8x8x8 matmul: the other dispatches keep IREE's defaults.
    problem = analyze_model(str(source), FLAGS).matmul_problems()[0]
    point = {"tile_m": 4, "tile_n": 8, "vec_m": 2, "vec_n": 4, "vec_k": 2}
    spec = tmp_path / "spec.mlir"
    spec.write_text(tuning_spec([(problem, TARGET, point)]))
    proof = prove(str(source), FLAGS, str(spec), DEVICE, work_dir=str(tmp_path / "w"), **QUICK)
    assert proof.outputs == 4
    assert proof.outputs_match, proof.message
    assert proof.tuned_ms > 0
    inputs = sorted(os.listdir(tmp_path / "w" / "inputs"))
    assert inputs == ["input0.npy", "input1.bin", "input2.npy", "input3.npy"]
    assert np.load(tmp_path / "w" / "inputs" / "input2.npy").dtype == np.int32


WRONG = """
func.func @main(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {{
  %init = arith.constant {init} : f32
  %empty = tensor.empty() : tensor<16x16xf32>
  %fill = linalg.fill ins(%init : f32) outs(%empty : tensor<16x16xf32>) -> tensor<16x16xf32>
  %m = linalg.matmul ins(%x, %x : tensor<16x16xf32>, tensor<16x16xf32>)
                     outs(%fill : tensor<16x16xf32>) -> tensor<16x16xf32>
  return %m : tensor<16x16xf32>
}}
"""


def test_a_wrong_answer_is_caught(tmp_path):
    """Two modules with the same signature, one off by a constant: the comparison says so."""
    entry = EntryFunction("main", (TensorSpec((16, 16), "f32"),), (TensorSpec((16, 16), "f32"),))
    inputs = make_inputs(entry, str(tmp_path / "inputs"), seed=3)
    outputs = []
    for name, init in (("right", "0.0"), ("wrong", "0.01")):
        source = tmp_path / f"{name}.mlir"
        source.write_text(WRONG.format(init=init))
        assert entry_function(str(source), FLAGS) == entry
        vmfb = compile_model(str(source), FLAGS, out_path=str(tmp_path / f"{name}.vmfb"))
        outputs.append(run_outputs(vmfb, DEVICE, entry, inputs, str(tmp_path / name)))
    right, wrong = outputs
    match, error, message = compare_outputs(right, right, entry)
    assert match and error == 0.0 and message == ""
    match, error, message = compare_outputs(wrong, right, entry)
    assert not match and error > 1e-4
    assert message.startswith("output 0 (16x16xf32): relative error")


def test_compile_failures_are_one_line_user_errors(tmp_path):
    pytest.importorskip("onnx")
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @f() { this is not mlir }\n")
    with pytest.raises(UserError, match="iree-compile failed") as caught:
        compile_model(str(bad), FLAGS, out_path=str(tmp_path / "bad.vmfb"))
    assert "\n" not in caught.value.message
    with pytest.raises(UserError, match="no such tuning spec"):
        compile_model(
            model("gemm_matmul_transpose.onnx"),
            FLAGS,
            str(tmp_path / "missing.mlir"),
            out_path=str(tmp_path / "m.vmfb"),
        )
    spec = tmp_path / "broken_spec.mlir"
    spec.write_text("module { not a spec }\n")
    with pytest.raises(UserError, match="iree-compile failed"):
        compile_model(
            model("gemm_matmul_transpose.onnx"), FLAGS, str(spec), out_path=str(tmp_path / "s.vmfb")
        )


def test_the_model_line_calls_a_speedup_within_the_rounds_noise_no_change():
    """Issue 27, item 12: identical builds printed 0.79x-1.06x; issue 47: the line says the
    paired verdict (proof.ModelVerdict), and rounds that straddle 1 are no change."""
    from autosched.drivers.model_stages.report import model_line
    from autosched.drivers.proof import ModelProof

    same = ModelProof(
        "main",
        10.0,
        9.9,
        0.02,
        0.03,
        10.0 / 9.9,
        True,
        0.0,
        default_rounds_ms=[10.0, 10.4, 9.7],
        tuned_rounds_ms=[9.9, 10.6, 9.4],
    )
    assert same.verdict.ratios == pytest.approx((0.99, 10.6 / 10.4, 9.4 / 9.7))
    assert "no change within noise (3 paired rounds" in model_line(same)
    faster = dataclasses.replace(same, tuned_ms=5.0, speedup=2.0, tuned_rounds_ms=[5.0, 5.2, 4.85])
    line = model_line(faster)
    assert "x: faster (3 paired rounds" in line and "no change" not in line


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_the_proof_times_every_build_with_the_runtime_flags(tmp_path):
    """The cfg's IREE runtime flags reach every timing of the proof: IREE's caching
    allocator times both builds; an allocator IREE does not have fails the default's."""
    spec = tmp_path / "spec.mlir"
    write_spec(spec, "llama_mlp.mlirbc", LLAMA_POINTS)
    flags = ("--device_allocator=caching",)
    proof = prove(model("llama_mlp.mlirbc"), FLAGS, str(spec), DEVICE, runtime_flags=flags, **QUICK)
    assert proof.outputs_match and proof.default_ms > 0 and proof.tuned_ms > 0
    with pytest.raises(UserError, match="without the spec failed.*no_such_allocator"):
        prove(
            model("llama_mlp.mlirbc"), FLAGS, str(spec), DEVICE,
            runtime_flags=("--device_allocator=no_such_allocator",), **QUICK,
        )  # fmt: skip


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_the_proof_keeps_the_fastest_runtime_flags_for_every_build(tmp_path):
    """With several candidate flag sets the reported build is timed with each, and the
    fastest times every build: one worker thread against two (a local-task device), each
    candidate's time kept in the proof."""
    from autosched.drivers.model_stages.report import runtime_line

    spec = tmp_path / "spec.mlir"
    write_spec(spec, "llama_mlp.mlirbc", LLAMA_POINTS)
    choices = (("--task_topology_group_count=1",), ("--task_topology_group_count=2",))
    proof = prove(
        model("llama_mlp.mlirbc"), FLAGS, str(spec), DEVICE, runtime_choices=choices, **QUICK
    )
    assert proof.outputs_match and proof.tuned_ms > 0
    timed = {c.flags: c.ms for c in proof.runtime_choices}
    assert set(timed) == {" ".join(c) for c in choices} and all(ms > 0 for ms in timed.values())
    assert proof.runtime_flags == min(timed, key=timed.get)
    line = " ".join(runtime_line(proof))
    assert f"runtime flags: `{proof.runtime_flags}`, the fastest" in line
    assert "task_topology_group_count=1" in line and "task_topology_group_count=2" in line


@pytest.mark.parametrize(
    "target, setting, expected",
    [
        ("cuda", "auto", ("--cuda_async_allocations=false", "--device_allocator=caching")),
        ("cpu", "auto", ()),
        ("cuda", "", ()),
        ("cpu", "--device_allocator=caching", ("--device_allocator=caching",)),
    ],
)
def test_runtime_flags_auto_are_the_targets_and_iree_takes_them(target, setting, expected):
    """`runtime_flags = auto` (the default) times CUDA runs with IREE's caching allocator and
    CPU runs with none; IREE's own runtime parses them (an unknown flag would be an error);
    empty means none, and any other setting is the user's."""
    from autosched.measure.contract import runtime_flags

    assert RunConfig().runtime_flags == "auto"
    assert runtime_flags(RunConfig(target=target, runtime_flags=setting)) == expected


@pytest.mark.slow  # about 9 s on two cores: two builds of the model, timed
def test_the_proof_builds_the_tuned_model_both_ways_and_keeps_the_faster(tmp_path):
    """`dispatch_fusion = choose`: the reported build is compiled again with IREE's aggressive
    fusion, checked against the default's outputs, and each build timed; the faster is the
    one every round times where it beats the other beyond the noise, its flags named. With
    the aggressive fusion alone it is applied
    and nothing is timed twice."""
    from autosched.drivers.model_stages.report import build_flags_line
    from autosched.drivers.proof import NOISE_FLOOR
    from autosched.measure.contract import AGGRESSIVE_FUSION, FUSION_CHOICES

    spec = tmp_path / "spec.mlir"
    write_spec(spec, "llama_mlp.mlirbc", LLAMA_POINTS)
    path = model("llama_mlp.mlirbc")
    proof = prove(path, FLAGS, str(spec), DEVICE, build_choices=FUSION_CHOICES["choose"], **QUICK)
    assert proof.outputs_match and proof.tuned_ms > 0
    timed = {c.flags: c.ms for c in proof.build_choices}
    assert set(timed) == {"", AGGRESSIVE_FUSION} and all(ms > 0 for ms in timed.values())
    faster = timed[AGGRESSIVE_FUSION] < timed[""] * (1 - NOISE_FLOOR)  # beyond the noise
    assert proof.build_flags == (AGGRESSIVE_FUSION if faster else "")
    assert proof.build_flags_of == ("tuned" if proof.build_flags else "")
    assert "dispatch fusion: `" in " ".join(build_flags_line(proof))
    forced = prove(
        path, FLAGS, str(spec), DEVICE, build_choices=FUSION_CHOICES["aggressive"], **QUICK
    )
    assert forced.build_flags == AGGRESSIVE_FUSION and forced.build_flags_of == "tuned"
    assert forced.outputs_match and not forced.build_choices
    alone = prove(path, FLAGS, None, DEVICE, build_choices=FUSION_CHOICES["choose"], **QUICK)
    assert alone.default_only and not alone.build_choices and not alone.build_flags
