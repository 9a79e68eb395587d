"""The dispatch table's lines: layout ops known by their root op, a call's time beside its
dispatches never printed as a negative cost."""

from __future__ import annotations

from autosched.drivers.dispatch_table import DispatchRow, is_layout_op, layout_line, outside_line


def row(entry_point: str, ms: float) -> DispatchRow:
    return DispatchRow(entry_point, 1, ms, ms)


def test_layout_ops_are_known_by_their_root_op_not_by_a_word_anywhere_in_the_name():
    assert is_layout_op("main$async_dispatch_3_transpose_128x128_bf16")
    assert is_layout_op("forward$async_dispatch_7_elementwise_broadcast_32x2048x2048_bf16")
    # A model whose function is named after a transpose: its matmuls are not layout ops.
    assert not is_layout_op("transpose_model$async_dispatch_0_matmul_64x64x64_f32")
    # Nor is a matmul that reads B transposed.
    assert not is_layout_op("main$async_dispatch_1_matmul_transpose_b_4096x768x768_f16xf16xf32")
    rows = [
        row("transpose_model$async_dispatch_0_matmul_64x64x64_f32", 1.0),
        row("transpose_model$async_dispatch_1_matmul_64x64x64_f32", 1.0),
    ]
    assert layout_line(rows, 2.0) == []


def test_a_call_faster_than_its_dispatches_alone_is_said_to_be_within_noise():
    rows = [row("main$async_dispatch_0_matmul_64x64x64_f32", 0.3)]
    line = outside_line("tuned", 0.1, rows)
    assert "within the timings' noise" in line and "-" not in line.split("ms a call")[1]
    assert "beside them (the runtime" in outside_line("tuned", 0.5, rows)
