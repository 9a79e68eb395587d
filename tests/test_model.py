"""Whole models: lowered by the real iree-compile to `flow`, then their dispatches' contractions.

The models under tests/data/models are made by the scripts next to them; every count and
shape below was worked out by hand from those scripts and checked against what IREE 3.13 forms.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autosched.errors import UserError
from autosched.model.lowering import analyze_model, find_contractions, lower_to_dispatches

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
CPU_FLAGS = [  # autosched.targets.cpu.CpuTarget.compile_flags()
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
]

# (m, n, k) -> (d0, d1, d2): lhs m x k, rhs n x k (transposed), acc m x n.
TRANSPOSED_B_MAPS = (
    "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>, "
    "affine_map<(d0, d1, d2) -> (d0, d1)>]"
)
BATCH_MAPS = (
    "[affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>, "
    "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>]"
)


def model(name: str) -> str:
    return os.path.join(MODELS, name)


def shapes(analysis) -> list[tuple]:
    return [(c.op_name, c.batch, c.m, c.n, c.k, c.occurrences) for c in analysis.contractions]


@pytest.fixture(scope="module")
def onnx_model():
    pytest.importorskip("onnx")
    return analyze_model(model("gemm_matmul_transpose.onnx"), CPU_FLAGS)


@pytest.fixture(scope="module")
def llama_mlp():
    return analyze_model(model("llama_mlp.mlirbc"), CPU_FLAGS)


@pytest.fixture(scope="module")
def attention():
    return analyze_model(model("attention.mlirbc"), CPU_FLAGS)


def test_onnx_gemm_and_batched_matmul(onnx_model):
    # Gemm(transB=1) + bias, and MatMul followed by Transpose: one dispatch each.
    assert onnx_model.dispatches == 2
    assert shapes(onnx_model) == [
        ("linalg.matmul", 0, 8, 24, 32, 1),
        ("linalg.batch_matmul", 2, 16, 24, 32, 1),
    ]
    assert onnx_model.skipped == []
    gemm, batched = onnx_model.contractions
    # IREE keeps the weight as 24x32 and forms a transposed-map matmul with the bias fused.
    assert gemm.indexing_maps == TRANSPOSED_B_MAPS
    assert gemm.loops == ("m", "n", "k")
    assert (gemm.transpose_a, gemm.transpose_b, gemm.zero_init) == (False, True, True)
    assert (gemm.lhs_type, gemm.rhs_type, gemm.acc_type) == ("f32", "f32", "f32")
    [site] = gemm.sites
    assert site.location == "gemm"  # the ONNX node's name
    assert site.fused_ops == ("linalg.generic (arith.addf)",)
    assert site.entry_point.startswith(site.executable) and site.entry_point.endswith(
        "matmul_8x24x32_f32"
    )
    problem = gemm.as_matmul_problem()
    assert problem.name == "matmul_transpose_b_8x24x32_f32_f32_f32"
    assert problem.indexing_maps == TRANSPOSED_B_MAPS
    # The Transpose after the MatMul is fused into the batch_matmul's dispatch.
    assert batched.indexing_maps == BATCH_MAPS
    assert not batched.transpose_a and not batched.transpose_b
    [site] = batched.sites
    assert (site.location, site.fused_ops) == ("batched_matmul", ("linalg.generic (copy)",))


def test_llama_mlp(llama_mlp):
    # gate and up (64 -> 128) are one problem in two dispatches, down (128 -> 64) another.
    assert llama_mlp.dispatches == 3
    assert shapes(llama_mlp) == [
        ("linalg.batch_matmul", 1, 8, 128, 64, 2),
        ("linalg.batch_matmul", 1, 8, 64, 128, 1),
    ]
    gate_up, down = llama_mlp.contractions
    # nn.Linear's transposed weights are hoisted into globals: IREE runs plain k x n weights.
    assert gate_up.indexing_maps == down.indexing_maps == BATCH_MAPS
    assert [site.fuses for site in gate_up.sites] == [False, True]
    silu_mul = gate_up.sites[1].fused_ops
    assert len(silu_mul) == 1 and "math.exp" in silu_mul[0] and "arith.mulf" in silu_mul[0]
    assert all(site.location.endswith("make_torch_model.py:37:0") for site in gate_up.sites)
    assert [p.name for p in llama_mlp.matmul_problems()] == [
        "batch_matmul_1x8x128x64_f32_f32_f32",
        "batch_matmul_1x8x64x128_f32_f32_f32",
    ]
    assert llama_mlp.skipped == []


def test_attention_is_a_root_of_its_own(attention):
    assert attention.dispatches == 2
    assert attention.skipped == []
    found, projection = attention.roots
    assert found.kind == "attention" and found.name == "attention_4x16x16x16x16_f32"
    assert found.loops == ("b", "m", "n", "k1", "k2") and found.mask_type == ""
    assert found.heads_per_kv == 1 and found.occurrences == 1
    assert found.sites[0].fused_ops == ("linalg.generic (copy)",)  # the heads' transpose
    # The output projection after it is a contraction, as before.
    assert shapes(attention) == [("linalg.batch_matmul", 1, 16, 32, 64, 1)]


LINALG_MODULE = """
#lhs = affine_map<(b, m, n, k) -> (b, m, k)>
#rhs = affine_map<(b, m, n, k) -> (n, k)>
#out = affine_map<(b, m, n, k) -> (b, m, n)>
#lhs2 = affine_map<(m, n, b, k) -> (b, k, m)>
#rhs2 = affine_map<(m, n, b, k) -> (b, n, k)>
#out2 = affine_map<(m, n, b, k) -> (b, m, n)>
func.func @main(%x: tensor<4x8x32xf16>, %w: tensor<24x32xf16>, %a: tensor<3x32x16xf32>, %bb: tensor<3x24x32xf32>,
                %d: tensor<?x32xf32>, %e: tensor<32x16xf32>, %i: tensor<8x32xi8>, %j: tensor<32x16xi8>,
                %p: tensor<8x32xf32>, %q: tensor<32x16xf32>, %p2: tensor<8x32xf32>, %q2: tensor<32x16xf32>)
    -> (tensor<4x8x24xf32>, tensor<3x16x24xf32>, tensor<?x16xf32>, tensor<8x16xi32>, tensor<8x16xf32>, tensor<8x16xf32>) {
  %z = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<4x8x24xf32>
  %f0 = linalg.fill ins(%z : f32) outs(%e0 : tensor<4x8x24xf32>) -> tensor<4x8x24xf32>
  %r0 = linalg.generic {indexing_maps = [#lhs, #rhs, #out], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%x, %w : tensor<4x8x32xf16>, tensor<24x32xf16>) outs(%f0 : tensor<4x8x24xf32>) {
  ^bb0(%u: f16, %v: f16, %acc: f32):
    %ue = arith.extf %u : f16 to f32
    %ve = arith.extf %v : f16 to f32
    %m = arith.mulf %ue, %ve : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  } -> tensor<4x8x24xf32>
  %e1 = tensor.empty() : tensor<3x16x24xf32>
  %f1 = linalg.fill ins(%z : f32) outs(%e1 : tensor<3x16x24xf32>) -> tensor<3x16x24xf32>
  %r1 = linalg.generic {indexing_maps = [#lhs2, #rhs2, #out2], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%a, %bb : tensor<3x32x16xf32>, tensor<3x24x32xf32>) outs(%f1 : tensor<3x16x24xf32>) {
  ^bb0(%u: f32, %v: f32, %acc: f32):
    %m = arith.mulf %u, %v : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  } -> tensor<3x16x24xf32>
  %c0 = arith.constant 0 : index
  %n = tensor.dim %d, %c0 : tensor<?x32xf32>
  %e2 = tensor.empty(%n) : tensor<?x16xf32>
  %f2 = linalg.fill ins(%z : f32) outs(%e2 : tensor<?x16xf32>) -> tensor<?x16xf32>
  %r2 = linalg.matmul ins(%d, %e : tensor<?x32xf32>, tensor<32x16xf32>) outs(%f2 : tensor<?x16xf32>) -> tensor<?x16xf32>
  %zi = arith.constant 0 : i32
  %e3 = tensor.empty() : tensor<8x16xi32>
  %f3 = linalg.fill ins(%zi : i32) outs(%e3 : tensor<8x16xi32>) -> tensor<8x16xi32>
  %r3 = linalg.matmul ins(%i, %j : tensor<8x32xi8>, tensor<32x16xi8>) outs(%f3 : tensor<8x16xi32>) -> tensor<8x16xi32>
  %e4 = tensor.empty() : tensor<8x16xf32>
  %f4 = linalg.fill ins(%z : f32) outs(%e4 : tensor<8x16xf32>) -> tensor<8x16xf32>
  %r4 = linalg.matmul ins(%p, %q : tensor<8x32xf32>, tensor<32x16xf32>) outs(%f4 : tensor<8x16xf32>) -> tensor<8x16xf32>
  %r5 = linalg.matmul ins(%p2, %q2 : tensor<8x32xf32>, tensor<32x16xf32>) outs(%f4 : tensor<8x16xf32>) -> tensor<8x16xf32>
  return %r0, %r1, %r2, %r3, %r4, %r5 : tensor<4x8x24xf32>, tensor<3x16x24xf32>, tensor<?x16xf32>, tensor<8x16xi32>, tensor<8x16xf32>, tensor<8x16xf32>
}
"""


def test_linalg_generics_dynamic_shapes_and_element_types(tmp_path):
    path = tmp_path / "contractions.mlir"
    path.write_text(LINALG_MODULE)
    analysis = find_contractions(lower_to_dispatches(str(path), CPU_FLAGS))
    assert shapes(analysis) == [
        ("linalg.generic", 0, 32, 24, 32, 1),  # IREE collapsed b=4 into m=8
        ("linalg.generic", 3, 16, 24, 32, 1),
        ("linalg.matmul", 0, 8, 16, 32, 2),  # two identical matmuls: one problem
    ]
    mixed, mnbk, twice = analysis.contractions
    assert (mixed.lhs_type, mixed.rhs_type, mixed.acc_type) == ("f16", "f16", "f32")
    assert mixed.indexing_maps == TRANSPOSED_B_MAPS and mixed.transpose_b
    assert mixed.as_matmul_problem().name == "matmul_transpose_b_32x24x32_f16_f16_f32"
    assert mnbk.loops == ("m", "n", "b", "k") and mnbk.loop_sizes == (16, 24, 3, 32)
    assert mnbk.transpose_a and mnbk.transpose_b
    assert mnbk.as_matmul_problem() is None  # loop order is not (b, m, n, k)
    assert twice.occurrences == 2
    assert analysis.skipped_counts() == {"dynamic shape": 1, "element type": 1}
    assert [p.name for p in analysis.matmul_problems()] == [
        "matmul_transpose_b_32x24x32_f16_f16_f32",
        "matmul_8x16x32_f32_f32_f32",
    ]


def test_compile_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text(
        "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %b : tensor<4xf32>\n}\n"
    )
    with pytest.raises(UserError) as error:
        lower_to_dispatches(str(bad), CPU_FLAGS)
    message = error.value.message
    assert "iree-compile failed" in message and "\n" not in message
    assert "use of undeclared SSA value" in message
    with pytest.raises(UserError, match="no such file"):
        lower_to_dispatches(str(tmp_path / "missing.onnx"), CPU_FLAGS)
    other = tmp_path / "model.pt"
    other.write_bytes(b"")
    with pytest.raises(UserError, match=r"\.onnx, \.mlir, \.mlirbc"):
        lower_to_dispatches(str(other), CPU_FLAGS)


def test_missing_onnx_extra_is_one_clear_error():
    script = (
        "import sys\n"
        "sys.modules['onnx'] = None\n"  # `import onnx` now fails as if it were not installed
        "from autosched.errors import UserError\n"
        "from autosched.model.lowering import lower_to_dispatches\n"
        "try:\n"
        f"    lower_to_dispatches({model('gemm_matmul_transpose.onnx')!r}, [])\n"
        "except UserError as error:\n"
        "    print(error.message)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("needs the onnx package: pip install '.[onnx]'")
