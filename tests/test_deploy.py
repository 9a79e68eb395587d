"""A deployable result: `autosched compile` writes the tuned module, and every build command
the tool prints runs as pasted (paths with spaces, upper-case extensions), with the real
iree-compile and iree.runtime."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import iree.runtime as runtime
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import matmul_function
from test_apply import LLAMA_POINTS, MODELS, write_spec

from autosched.cli import cli
from autosched.config import RunConfig
from autosched.drivers.custom_route import custom_commands
from autosched.drivers.model_stages.report import tuned_model_command
from autosched.model.configured import compile_model
from autosched.ops.matmul import analyze_file
from autosched.outputs.spec import tuning_spec
from autosched.targets.cpu import CpuTarget

MODEL = "llama_mlp.mlirbc"


def outputs(vmfb: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The module's first exported function on `arrays`, on local-task."""
    config = runtime.Config(device=runtime.get_device("local-task"))
    with open(vmfb, "rb") as handle:
        module = runtime.VmModule.copy_buffer(config.vm_instance, handle.read())
    context = runtime.SystemContext(config=config)
    context.add_vm_module(module)
    name = next(n for n in module.function_names if not n.startswith("__") and "$" not in n)
    result = context.modules[module.name][name](*arrays)
    results = result if isinstance(result, (list, tuple)) else [result]
    return [np.asarray(r.to_host()) for r in results]


@pytest.mark.slow  # about 5 s or more on two cores: the README's command stays under 10 minutes
def test_compile_writes_the_tuned_model_with_the_default_builds_outputs(tmp_path, monkeypatch):
    """The spec a run leaves in the model's work folder is the one built by default; the
    module carries it (another binary than IREE's default) and answers as the default does."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(os.path.join(MODELS, MODEL), tmp_path)
    spec = tmp_path / "generated" / "llama_mlp" / "results.spec.mlir"
    spec.parent.mkdir(parents=True)
    write_spec(spec, MODEL, LLAMA_POINTS)  # as a run writes its winners
    result = CliRunner().invoke(cli, ["compile", MODEL, "-o", "out dir/Tuned.VMFB"])
    assert result.exit_code == 0, result.output
    assert "with the spec generated/llama_mlp/results.spec.mlir" in result.output
    tuned = tmp_path / "out dir" / "Tuned.VMFB"
    default = compile_model(
        MODEL, CpuTarget(RunConfig()).compile_flags(), out_path=str(tmp_path / "default.vmfb")
    )
    assert tuned.read_bytes() != open(default, "rb").read()
    inputs = [np.random.default_rng(0).standard_normal((1, 8, 64)).astype(np.float32)]
    (expected,), (got,) = outputs(default, inputs), outputs(str(tuned), inputs)
    assert got.shape == (1, 8, 64)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert not (tmp_path / "generated" / "llama_mlp" / "compile").exists()  # its scratch


def test_compile_without_a_run_builds_irees_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(os.path.join(MODELS, MODEL), tmp_path)
    result = CliRunner().invoke(cli, ["compile", MODEL])
    assert result.exit_code == 0, result.output
    assert "IREE's default configurations" in result.output
    assert (tmp_path / "generated" / "llama_mlp" / "model.vmfb").is_file()
    absent = CliRunner().invoke(cli, ["compile", MODEL, "--spec", "nothere.mlir"])
    assert absent.exit_code == 2 and "nothere.mlir: no such tuning spec" in absent.output


def shell(line: str, cwd) -> subprocess.CompletedProcess:
    """`line` as a user pastes it into a POSIX shell, IREE's tools on PATH."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return subprocess.run(
        ["/bin/sh", "-c", line], cwd=cwd, env={**os.environ, "PATH": path},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_printed_build_command_runs_as_pasted_with_spaces_in_its_paths(tmp_path):
    folder = tmp_path / "my models"
    folder.mkdir()
    source = folder / "My Matmul.MLIR"
    source.write_text(matmul_function("mm", 32, 32, 32))
    target = CpuTarget(RunConfig(work_dir=str(tmp_path / "work dir")))
    (tmp_path / "work dir").mkdir()  # as the run that printed the command left it
    (problem,) = analyze_file(str(source)).problems
    point = {"tile_m": 16, "tile_n": 16, "vec_m": 4, "vec_n": 8, "vec_k": 4}
    spec = folder / "the spec.mlir"
    spec.write_text(tuning_spec([(problem, target, point)]))
    line = tuned_model_command(str(source), target, str(spec))
    assert line.startswith("tuned model: iree-compile ") and " -o " in line
    done = shell(line.removeprefix("tuned model: "), tmp_path)
    assert done.returncode == 0, done.stderr
    vmfb = tmp_path / "work dir" / "model.vmfb"
    a, b = (np.random.default_rng(s).standard_normal((32, 32)).astype(np.float32) for s in (1, 2))
    (got,) = outputs(str(vmfb), [a, b])
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


def test_the_custom_kernel_commands_quote_their_paths_and_name_the_module():
    target = CpuTarget(RunConfig())
    text = custom_commands("my model.mlir", target, "a spec.mlir", "the custom.mlir", "w d")
    lines = text.splitlines()
    assert lines[0] == "tuned model with custom kernels:"
    assert "'w d/model/model.custom.mlir'" in lines[-1]
    assert lines[-1].rstrip().endswith("-o 'w d/model.vmfb'")
    assert "'--iree-codegen-tuning-spec-path=a spec.mlir'" in lines[-1]


@pytest.mark.parametrize("extension", [".ONNX", ".onnx"])
def test_an_onnx_models_command_imports_it_first_whatever_its_case(extension):
    from autosched.outputs.commands import shell_line, tuned_model_steps

    steps = tuned_model_steps(f"my net{extension}", CpuTarget(RunConfig()), None, "o.vmfb")
    assert [step[0] for step in steps] == ["iree-import-onnx", "iree-compile"]
    assert shell_line(steps).startswith(f"iree-import-onnx 'my net{extension}' -o 'my net.mlir'")


def test_compile_builds_with_the_flags_the_runs_proof_chose(tmp_path, monkeypatch):
    """The compile flags the run's proof chose for its tuned build (its summary's
    `build_flags`) reach `autosched compile`'s build: a flag iree-compile does not know
    stops it with one line; chosen for the custom build, they do not reach the tuned one."""
    import json

    monkeypatch.chdir(tmp_path)
    shutil.copy(os.path.join(MODELS, MODEL), tmp_path)
    work = tmp_path / "generated" / "llama_mlp"
    work.mkdir(parents=True)
    write_spec(work / "results.spec.mlir", MODEL, LLAMA_POINTS)
    summary = work / "results.summary.json"
    chosen = {"build_flags": "--no-such-iree-flag", "build_flags_of": "tuned"}
    summary.write_text(json.dumps({"model": chosen}))
    refused = CliRunner().invoke(cli, ["compile", MODEL])
    assert refused.exit_code == 2 and "iree-compile failed" in refused.output  # the flag
    summary.write_text(json.dumps({"model": {**chosen, "build_flags_of": "custom"}}))
    built = CliRunner().invoke(cli, ["compile", MODEL])
    assert built.exit_code == 0, built.output
