"""Static analysis through the MLIR bindings, on varied real modules."""

from __future__ import annotations

import pytest
from conftest import BATCH, DYNAMIC, NO_MATMUL, TRANSPOSED_B, matmul_function

from autosched.errors import UserError
from autosched.ops.matmul import analyze_file


def test_finds_every_matmul_with_shapes_types_and_layouts(write_module):
    path = write_module(
        matmul_function("a", 64, 32, 16)
        + TRANSPOSED_B
        + BATCH
        + matmul_function("h", 128, 64, 32, "f16", "f32")
    )
    analysis = analyze_file(path)
    by_function = {p.sites[0].function: p for p in analysis.problems}
    assert set(by_function) == {"a", "transposed", "batched", "h"}

    plain = by_function["a"]
    assert (plain.m, plain.n, plain.k, plain.batch) == (64, 32, 16, 0)
    assert plain.zero_init and not plain.transpose_a and not plain.transpose_b
    assert plain.name == "matmul_64x32x16_f32_f32_f32"

    transposed = by_function["transposed"]
    assert (transposed.m, transposed.n, transposed.k) == (32, 16, 64)
    assert transposed.transpose_b and not transposed.transpose_a and not transposed.zero_init

    batched = by_function["batched"]
    assert batched.op_name == "linalg.batch_matmul"
    assert (batched.batch, batched.m, batched.n, batched.k) == (2, 32, 16, 64)

    half = by_function["h"]
    assert (half.lhs_type, half.rhs_type, half.acc_type) == ("f16", "f16", "f32")
    file, line, column = half.sites[0].location.rsplit(":", 2)
    assert file == path and int(line) > 1 and int(column) > 0


def test_same_signature_is_one_problem_with_two_sites(write_module):
    path = write_module(matmul_function("x", 64, 64, 64) + matmul_function("y", 64, 64, 64))
    analysis = analyze_file(path)
    assert len(analysis.problems) == 1
    assert [s.function for s in analysis.problems[0].sites] == ["x", "y"]
    assert [s.index for s in analysis.problems[0].sites] == [0, 1]


def test_dynamic_shape_is_skipped_with_a_reason(write_module):
    analysis = analyze_file(write_module(DYNAMIC + matmul_function("s", 32, 32, 32)))
    assert [p.sites[0].function for p in analysis.problems] == ["s"]
    assert len(analysis.skipped) == 1
    assert "dynamic shape" in analysis.skipped[0].reason


def test_only_dynamic_matmuls_is_an_error(write_module):
    with pytest.raises(UserError, match="dynamic shape"):
        analyze_file(write_module(DYNAMIC))


def test_no_matmul_is_an_error(write_module):
    with pytest.raises(UserError, match="no linalg.matmul"):
        analyze_file(write_module(NO_MATMUL))


def test_parse_error_names_line_and_column(write_module):
    path = write_module("func.func @broken(%a: tensor<4xf32>) {\n  return %a : \n")
    with pytest.raises(UserError) as caught:
        analyze_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:")
    assert "does not parse" in message and "\n" not in message


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        analyze_file(str(tmp_path / "absent.mlir"))


def test_matmul_on_buffers_is_skipped_not_a_crash(write_module):
    memref = """
func.func @buffers(%a: memref<16x16xf32>, %b: memref<16x16xf32>, %c: memref<16x16xf32>) {
  linalg.matmul ins(%a, %b : memref<16x16xf32>, memref<16x16xf32>) outs(%c : memref<16x16xf32>)
  return
}
"""
    analysis = analyze_file(write_module(memref + matmul_function("t", 16, 16, 16)))
    assert [p.sites[0].function for p in analysis.problems] == ["t"]
    assert "not ranked tensors" in analysis.skipped[0].reason


def test_integer_matmul_is_skipped_with_its_type(write_module):
    analysis = analyze_file(
        write_module(
            matmul_function("i", 16, 16, 16, "i8", "i32").replace("0.0", "0")
            + matmul_function("t", 16, 16, 16)
        )
    )
    assert len(analysis.problems) == 1
    assert "i8" in analysis.skipped[0].reason
