"""Real inputs and sane random ones (issue 47, item 2): a user's .npz is checked against the
model's arguments; random inputs on which IREE's default gives NaN (a batch norm's variance
drawn below zero) are drawn again, and nothing is hidden when they cannot be."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from autosched.cli import cli
from autosched.errors import UserError
from autosched.measure.input_files import input_files
from autosched.measure.module_io import (
    EntryFunction,
    TensorSpec,
    load_inputs,
    make_inputs,
)

ENTRY = EntryFunction(
    "main", (TensorSpec((4, 8), "f32"), TensorSpec((8,), "f32")), (TensorSpec((4, 8), "f32"),)
)


def test_a_file_that_does_not_fit_is_one_error_naming_it(tmp_path):
    path = str(tmp_path / "in.npz")
    np.savez(path, np.zeros((4, 8), np.float32))
    with pytest.raises(UserError, match=r"in\.npz: 1 array\(s\), but main takes 2"):
        load_inputs(path, ENTRY, str(tmp_path / "out"))
    np.savez(path, np.zeros((4, 8), np.float32), np.zeros((9,), np.float32))
    with pytest.raises(
        UserError, match=r"in\.npz: argument 1 \(arr_1\) is 9 float32, expected 8xf32"
    ):
        load_inputs(path, ENTRY, str(tmp_path / "out"))
    np.savez(path, np.zeros((4, 8), np.float64), np.zeros((8,), np.float32))
    with pytest.raises(UserError, match=r"argument 0 \(arr_0\) is 4x8 float64, expected 4x8xf32"):
        load_inputs(path, ENTRY, str(tmp_path / "out"))


def test_arrays_named_like_the_arguments_go_in_argument_order(tmp_path):
    path = str(tmp_path / "in.npz")
    np.savez(path, var=np.ones((8,), np.float32), x=np.full((4, 8), 2, np.float32))
    flags = load_inputs(path, ENTRY, str(tmp_path / "out"), names=["x", "var"])
    assert np.all(np.load(flags[0].removeprefix("@")) == 2)
    assert np.load(flags[1].removeprefix("@")).shape == (8,)


def test_a_redraw_keeps_statistics_positive_and_shrinks_the_rest(tmp_path):
    first = make_inputs(ENTRY, str(tmp_path / "a"), seed=0)
    again = make_inputs(ENTRY, str(tmp_path / "b"), seed=0, draw=2)
    matrix, vector = (np.load(f.removeprefix("@")) for f in again)
    assert np.all(vector > 0)
    assert np.abs(matrix).max() < np.abs(np.load(first[0].removeprefix("@"))).max()


def batch_norm_model(path: str) -> None:
    """A matmul and a BatchNormalization whose scale, bias, mean and variance are the
    model's arguments (as torchvision's resnet18 exported with its statistics as inputs)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"]),
        helper.make_node("BatchNormalization", ["y", "scale", "bias", "mean", "var"], ["z"]),
    ]
    vectors = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64]) for n in
               ("scale", "bias", "mean", "var")]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "batch_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64]), *vectors],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [32, 64])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.mark.slow
def test_batch_norm_statistics_as_arguments_are_tuned_with_nothing_hidden(tmp_path, monkeypatch):
    """IREE's default gives NaN on the first draw (a variance below zero): the inputs are
    drawn again, every trial is checked, and nothing is listed as not tuned."""
    monkeypatch.chdir(tmp_path)
    batch_norm_model("bn.onnx")
    result = CliRunner().invoke(cli, ["run", "bn.onnx", "--budget", "2", "--fresh"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "generated" / "bn" / "results.summary.json").read_text())
    (row,) = summary["problems"]
    assert row["trials"] == 2 and not row["stopped"]
    assert not [k for k in summary["skipped"] if k.startswith("not tuned:")]
    assert "OUTPUTS DIFFER" not in result.output and "not tuned" not in result.output


@pytest.mark.slow
def test_apply_on_inputs_that_give_nan_says_nothing_could_be_compared(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    batch_norm_model("bn.onnx")
    spec = tmp_path / "spec.mlir"  # the starter of test_verdict: matches nothing here
    from test_verdict import _no_op_starter

    spec.write_text(open(_no_op_starter(tmp_path)).read())
    x = np.ones((32, 64), np.float32)
    vector = np.ones(64, np.float32)
    np.savez("nan.npz", x=x, scale=vector, bias=vector, mean=vector, var=-vector)
    result = CliRunner().invoke(
        cli, ["apply", "bn.onnx", "--spec", str(spec), "--inputs", "nan.npz"]
    )
    assert result.exit_code == 0, result.output
    assert "outputs could not be compared" in result.output
    assert "OUTPUTS DIFFER" not in result.output
    np.savez("bad.npz", x=x, scale=vector, bias=vector, mean=vector, var=np.ones(3, np.float32))
    result = CliRunner().invoke(
        cli, ["apply", "bn.onnx", "--spec", str(spec), "--inputs", "bad.npz"]
    )
    assert result.exit_code == 2
    assert "bad.npz: argument 4 (var) is 3 float32, expected 64xf32" in result.output


def test_compile_checks_the_module_on_the_users_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    batch_norm_model("bn.onnx")
    vector = np.ones(64, np.float32)
    np.savez("in.npz", np.ones((32, 64), np.float32), vector, vector, vector, vector)
    result = CliRunner().invoke(cli, ["compile", "bn.onnx", "--inputs", "in.npz", "-o", "bn.vmfb"])
    assert result.exit_code == 0, result.output
    assert "outputs match IREE's default build's on in.npz" in result.output


# Several .npy files, one per argument in argument order, as iree-run-module takes them
# (issue 47, item 2).


def npy_inputs(folder, arrays) -> list[str]:
    """Each array saved as its own .npy file under `folder`; their paths, in order."""
    paths = []
    for index, array in enumerate(arrays):
        paths.append(str(folder / f"arg{index}.npy"))
        np.save(paths[-1], array)
    return paths


def test_npy_files_are_the_arguments_in_the_order_given(tmp_path):
    matrix, vector = np.full((4, 8), 3, np.float32), np.arange(8, dtype=np.float32)
    paths = npy_inputs(tmp_path, [matrix, vector])
    assert input_files(",".join(paths)) == paths
    flags = load_inputs(",".join(paths), ENTRY, str(tmp_path / "out"))
    assert np.array_equal(np.load(flags[0].removeprefix("@")), matrix)
    assert np.array_equal(np.load(flags[1].removeprefix("@")), vector)
    # In the other order, the vector is argument 0: the error names its file.
    swapped = ",".join(reversed(paths))
    with pytest.raises(UserError, match=r"arg1\.npy: argument 0 is 8 float32, expected 4x8xf32"):
        load_inputs(swapped, ENTRY, str(tmp_path / "out"))


def test_a_path_with_a_comma_that_names_a_file_is_one_file(tmp_path):
    path = tmp_path / "a,b.npz"
    np.savez(path, np.zeros((4, 8), np.float32), np.zeros(8, np.float32))
    assert input_files(str(path)) == [str(path)]
    assert len(load_inputs(str(path), ENTRY, str(tmp_path / "out"))) == 2


@pytest.mark.parametrize(
    ("contents", "expected"),
    [
        ("one", r"x\.npy: 1 \.npy file\(s\), but main takes 2 argument\(s\)"),
        ("three", r": 3 \.npy file\(s\), but main takes 2"),
        ("text", r"arg1\.npy: not a numpy \.npy file"),
        ("cut", r"arg1\.npy: not a numpy \.npy file \(EOF"),
        ("missing", r"gone\.npy: no such file"),
        ("npz among npy", r"arg1\.npy: not a numpy \.npy file"),
        ("npy as npz", r"x\.npz: one numpy array, not an \.npz file"),
        ("f64", r"arg1\.npy: argument 1 is 8 float64, expected 8xf32 \(float32\)"),
    ],
)
def test_a_bad_npy_file_is_one_error_naming_it(tmp_path, contents, expected):
    matrix, vector = np.zeros((4, 8), np.float32), np.zeros(8, np.float32)
    paths = npy_inputs(tmp_path, [matrix, vector])
    if contents == "one":
        given = str(tmp_path / "x.npy")
        np.save(given, matrix)
    elif contents == "three":
        given = ",".join([*paths, paths[0]])
    elif contents == "text":
        (tmp_path / "arg1.npy").write_text("0 1 2 3\n")
        given = ",".join(paths)
    elif contents == "cut":
        (tmp_path / "arg1.npy").write_bytes((tmp_path / "arg1.npy").read_bytes()[:70])
        given = ",".join(paths)
    elif contents == "missing":
        given = ",".join([paths[0], str(tmp_path / "gone.npy")])
    elif contents == "npz among npy":
        np.savez(tmp_path / "arg1.npy.npz", vector)
        (tmp_path / "arg1.npy.npz").rename(tmp_path / "arg1.npy")
        given = ",".join(paths)
    elif contents == "npy as npz":
        np.save(tmp_path / "x.npy", matrix)
        (tmp_path / "x.npy").rename(tmp_path / "x.npz")
        given = str(tmp_path / "x.npz")
    else:
        np.save(paths[1], vector.astype(np.float64))
        given = ",".join(paths)
    with pytest.raises(UserError, match=expected):
        load_inputs(given, ENTRY, str(tmp_path / "out"))


def test_a_bad_npy_file_ends_the_run_before_any_work(tmp_path, monkeypatch):
    """Checked against the model's arguments when the model is first read: one Error line
    naming the file, exit 2, nothing searched, no traceback (it came after the search)."""
    monkeypatch.chdir(tmp_path)
    batch_norm_model("bn.onnx")
    vector = np.ones(64, np.float32)
    paths = npy_inputs(tmp_path, [np.ones((32, 64), np.float32), vector, vector, vector])
    np.save(tmp_path / "var.npy", np.ones(3, np.float32))
    options = [item for path in paths for item in ("--inputs", path)]
    result = CliRunner().invoke(cli, ["run", "bn.onnx", *options, "--inputs", "var.npy"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == (
        "Error: var.npy: argument 4 is 3 float32, expected 64xf32 (float32)"
    )
    assert "Traceback" not in result.output
    assert not (tmp_path / "generated" / "bn" / "tuning.jsonl").exists()
    result = CliRunner().invoke(cli, ["run", "bn.onnx", "--inputs", f"{paths[0]},missing.npy"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["Error: missing.npy: no such file"]


def test_compile_checks_the_module_on_npy_files_given_in_argument_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    batch_norm_model("bn.onnx")
    vector = np.ones(64, np.float32)
    paths = npy_inputs(tmp_path, [np.ones((32, 64), np.float32), vector, vector, vector, vector])
    options = ["--inputs", paths[0], "--inputs", ",".join(paths[1:])]
    result = CliRunner().invoke(cli, ["compile", "bn.onnx", *options, "-o", "bn.vmfb"])
    assert result.exit_code == 0, result.output
    assert f"outputs match IREE's default build's on {','.join(paths)}" in result.output


@pytest.mark.slow
def test_a_run_and_apply_check_and_prove_on_the_npy_files(tmp_path, monkeypatch):
    """The user's .npy files are the model's inputs for the run's whole-model timing and
    proof (its summary names them), and for `apply`'s: on a variance of -1 IREE's default
    gives NaN, which apply says, where random inputs would have been drawn again."""
    monkeypatch.chdir(tmp_path)
    batch_norm_model("bn.onnx")
    vector = np.ones(64, np.float32)
    paths = npy_inputs(tmp_path, [np.ones((32, 64), np.float32), vector, vector, vector, vector])
    (tmp_path / "auto-scheduler.cfg").write_text("[Benchmark]\ndispatch_table = none\n")
    given = ["--inputs", paths[0], "--inputs", ",".join(paths[1:])]
    result = CliRunner().invoke(cli, ["run", "bn.onnx", "--budget", "2", "--fresh", *given])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "generated" / "bn" / "results.summary.json").read_text())
    assert summary["model"]["inputs"] == ",".join(paths)
    np.save(paths[-1], -vector)
    from test_verdict import _no_op_starter

    spec = _no_op_starter(tmp_path)
    result = CliRunner().invoke(cli, ["apply", "bn.onnx", "--spec", str(spec), *given])
    assert result.exit_code == 0, result.output
    assert "outputs could not be compared" in result.output
    assert "arg4.npy" in result.output and "Traceback" not in result.output


def test_a_dynamic_models_file_may_leave_out_its_static_last_arguments(tmp_path):
    """x of dynamic rows given, the (static) weight left out: drawn at random, the same
    draw every time; a model of static sizes takes all its arrays (above)."""
    entry = EntryFunction(
        "main",
        (TensorSpec((1, 8), "f32", dynamic=(0,)), TensorSpec((8, 4), "f32")),
        (TensorSpec((1, 4), "f32", dynamic=(0,)),),
    )
    path = str(tmp_path / "x.npz")
    np.savez(path, np.ones((5, 8), np.float32))
    first = load_inputs(path, entry, str(tmp_path / "a"))
    again = load_inputs(path, entry, str(tmp_path / "b"))
    x, weight = (np.load(flag.removeprefix("@")) for flag in first)
    assert x.shape == (5, 8) and weight.shape == (8, 4) and np.abs(weight).max() > 0
    assert np.array_equal(weight, np.load(again[1].removeprefix("@")))
