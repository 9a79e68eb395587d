"""The dispatch table's lines: layout ops known by their root op, a call's time beside its
dispatches never printed as a negative cost."""

from __future__ import annotations

import os

import pytest
from conftest import attach_dispatches

from autosched.config import RunConfig
from autosched.drivers.campaign import ModelProblem
from autosched.drivers.dispatch_table import (
    SPEC_HATCH,
    Bar,
    DispatchRow,
    _spec_panel,
    bar_label,
    dispatch_lines,
    is_layout_op,
    layout_line,
    outside_line,
    picture_bars,
    plot_dispatches,
    time_dispatches,
)
from autosched.model.dispatch_benchmarks import dump_dispatch_benchmarks
from autosched.model.lowering import analyze_model
from autosched.outputs.dispatch_labels import dispatch_label
from autosched.outputs.spec import write_spec
from autosched.targets.cpu import CpuTarget


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


# The picture: bars labelled by their root op, and the bars the spec configures marked
# (issue 47, item 6).

THREE_ROOTS = """
func.func @main(%x: tensor<64x128xf32>, %w: tensor<128x64xf32>, %img: tensor<2x16x16x8xf32>,
                %filter: tensor<3x3x8x16xf32>) -> (tensor<64x128xf32>, tensor<64x64xf32>,
                                                   tensor<2x14x14x16xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x128xf32>
  %soft = linalg.softmax dimension(1) ins(%x : tensor<64x128xf32>)
      outs(%e : tensor<64x128xf32>) -> tensor<64x128xf32>
  %em = tensor.empty() : tensor<64x64xf32>
  %fm = linalg.fill ins(%zero : f32) outs(%em : tensor<64x64xf32>) -> tensor<64x64xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<64x128xf32>, tensor<128x64xf32>)
      outs(%fm : tensor<64x64xf32>) -> tensor<64x64xf32>
  %ec = tensor.empty() : tensor<2x14x14x16xf32>
  %fc = linalg.fill ins(%zero : f32) outs(%ec : tensor<2x14x14x16xf32>) -> tensor<2x14x14x16xf32>
  %conv = linalg.conv_2d_nhwc_hwcf ins(%img, %filter : tensor<2x16x16x8xf32>, tensor<3x3x8x16xf32>)
      outs(%fc : tensor<2x14x14x16xf32>) -> tensor<2x14x14x16xf32>
  return %soft, %mm, %conv : tensor<64x128xf32>, tensor<64x64xf32>, tensor<2x14x14x16xf32>
}
"""
CPU_FLAGS = [  # autosched.targets.cpu.CpuTarget.compile_flags()
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
]


def test_dispatches_are_labelled_by_their_root_op_not_by_iree_s_name(tmp_path):
    """IREE names the softmax's dispatch `..._softmax_64x128xf32_dispatch_tensor_store`, which
    the picture cut to "tensor_store"; each dispatch benchmark IREE writes is labelled by its
    root op, read with the bindings."""
    model = tmp_path / "three.mlir"
    model.write_text(THREE_ROOTS)
    benchmarks = dump_dispatch_benchmarks(str(model), CPU_FLAGS, str(tmp_path / "dispatches"))
    labels = {
        entry.rpartition("$")[2]: dispatch_label(benchmark.source)
        for entry, benchmark in benchmarks.items()
    }
    assert sorted(labels.values()) == ["conv 3x3 8->16", "matmul 64x64x128", "softmax 64x128"]
    rows = [DispatchRow(entry, 1, 0.1, 0.1, root_op=dispatch_label(b.source))
            for entry, b in benchmarks.items()]  # fmt: skip
    shown = [bar_label(r) for r in rows]
    assert not [label for label in shown if "tensor_store" in label], shown
    assert {label.split(" (#")[0] for label in shown} == set(labels.values())


def test_a_dispatch_whose_ops_cannot_be_read_keeps_iree_s_name(tmp_path):
    broken = tmp_path / "broken.mlir"
    broken.write_text("not mlir")
    assert dispatch_label(str(broken)) == ""
    row = DispatchRow("main$async_dispatch_3_reduction_64x128_f32", 1, 0.1, 0.1)
    assert bar_label(row) == "reduction_64x128_f32"
    custom = DispatchRow("main$async_extern_dispatch_0", 1, 0.1, 0.1)
    assert bar_label(custom).startswith("custom kernel")


def test_the_bars_the_spec_configures_are_marked():
    rows = [
        DispatchRow("m$async_dispatch_0_matmul_64x64x64_f32", 2, 1.0, 0.5, "mm", "matmul 64x64x64",
                    changed=True),
        DispatchRow("m$async_dispatch_1_reduction_64x128_f32", 1, 0.3, 0.3, root_op="softmax 64x128"),
    ]  # fmt: skip
    bars = picture_bars(rows)
    assert bars == [
        Bar("matmul 64x64x64 (#0)", 2.0, 1.0, True),
        Bar("softmax 64x128 (#1)", 0.3, 0.3, False),
    ]


def test_the_picture_hatches_the_bars_the_spec_configures(tmp_path):
    matplotlib = pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        DispatchRow("m$async_dispatch_0_matmul_64x64x64_f32", 1, 1.0, 0.5, root_op="matmul 64x64x64",
                    changed=True),
        DispatchRow("m$async_dispatch_1_reduction_64x128_f32", 1, 0.3, 0.3, root_op="softmax 64x128"),
    ]  # fmt: skip
    figure, axes = plt.subplots()
    _spec_panel(axes, picture_bars(rows))
    default, tuned = axes.containers[:2]
    assert [p.get_hatch() for p in tuned.patches] == [SPEC_HATCH, None]
    assert [p.get_hatch() for p in default.patches] == [None, None]
    assert [t.get_text() for t in axes.get_yticklabels()] == [
        "matmul 64x64x64 (#0)", "softmax 64x128 (#1)"
    ]  # fmt: skip
    legend = [t.get_text() for t in axes.get_legend().get_texts()]
    assert legend == ["IREE default", "with the spec", "configured by the spec"]
    keys = axes.get_legend().get_patches()  # drawn as their bars are
    assert [k.get_hatch() for k in keys] == [None, None, SPEC_HATCH]
    assert keys[0].get_facecolor() != keys[2].get_facecolor()
    plt.close(figure)
    assert plot_dispatches(rows, str(tmp_path / "d.png")) == str(tmp_path / "d.png")


def test_the_table_names_each_root_op_and_marks_only_the_problems_in_the_spec():
    """A problem searched but not in the spec ran IREE's default before and after: the
    table said "tuned as" it all the same."""
    rows = [
        DispatchRow("m$async_dispatch_0_matmul_64x64x64_f32", 1, 1.0, 0.5, "matmul_64x64x64",
                    "matmul 64x64x64", changed=True),
        DispatchRow("m$async_dispatch_1_matmul_32x32x32_f32", 1, 0.3, 0.3, "matmul_32x32x32",
                    "matmul 32x32x32"),
        DispatchRow("m$async_dispatch_2_reduction_64x128_f32", 1, 0.2, 0.2, root_op="softmax 64x128"),
    ]  # fmt: skip
    lines = dispatch_lines(rows).splitlines()
    assert lines[0].split() == [
        "dispatch", "root", "op", "runs", "ms", "before", "share", "ms", "after", "share", "after",
        "problem",
    ]  # fmt: skip
    assert lines[2].rstrip().endswith("matmul_64x64x64 (in spec)") and "matmul 64x64x64" in lines[2]
    assert lines[3].rstrip().endswith("matmul_32x32x32") and "softmax 64x128" in lines[4]


def test_without_a_spec_the_picture_has_the_defaults_bars_alone():
    """A run that wrote no spec times nothing after: its picture had orange bars "with the
    spec", each equal to the default's."""
    matplotlib = pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        DispatchRow("m$async_dispatch_0_matmul_64x64x64_f32", 2, 1.0, root_op="matmul 64x64x64"),
        DispatchRow("m$async_dispatch_1_reduction_64x128_f32", 1, 0.3, root_op="softmax 64x128"),
    ]
    bars = picture_bars(rows)
    assert [b.tuned_ms for b in bars] == [None, None] and bars[0].default_ms == 2.0
    figure, axes = plt.subplots()
    _spec_panel(axes, bars)
    assert len(axes.containers) == 1
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["IREE default"]
    assert "no spec written" in axes.get_title()
    plt.close(figure)


def test_without_a_spec_the_table_has_no_after_columns():
    rows = [DispatchRow("m$async_dispatch_0_matmul_64x64x64_f32", 2, 1.0, root_op="matmul")]
    lines = dispatch_lines(rows).splitlines()
    assert "ms after" not in lines[0] and "share after" not in lines[0]
    assert lines[-1] == "all dispatches: 2 ms per model call (IREE's default; no spec written)"


MLP = os.path.join(os.path.dirname(__file__), "data", "models", "hf_llama_mlp_f32.mlirbc")


def test_a_dispatch_the_spec_leaves_as_it_was_keeps_its_default_time(tmp_path):
    """A dispatch the spec does not touch builds byte for byte as IREE's default: it has
    the default's time after, not a second timing's noise (under load a 7x7 convolution
    the spec left alone read 2.5x faster)."""
    target = CpuTarget(RunConfig())
    flags = target.compile_flags()
    contractions = analyze_model(MLP, flags).contractions
    entries = [ModelProblem(c.as_matmul_problem(), c) for c in contractions]
    dispatches = attach_dispatches(entries, MLP, flags, str(tmp_path / "d"))
    chosen = entries[0].problem
    point = {"tile_m": 16, "tile_n": 64, "vec_m": 8, "vec_n": 16, "vec_k": 4}
    spec = write_spec(str(tmp_path / "spec.mlir"), [(chosen, target, point)])
    config = RunConfig(work_dir=str(tmp_path / "w"), repetitions=1, min_time=0.01)
    in_spec = {s.entry_point for s in entries[0].contraction.sites}
    rows = time_dispatches(
        dispatches.benchmarks, dispatches.calls, target, spec, config, {}, changed=in_spec
    )
    untouched = [r for r in rows if r.entry_point not in in_spec]
    assert untouched and all(r.tuned_ms == r.default_ms is not None for r in untouched)
    touched = [r for r in rows if r.entry_point in in_spec]
    assert touched and all(r.tuned_ms is not None and r.changed for r in touched)
