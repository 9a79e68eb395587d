"""The tuning spec: IREE applies it to the untouched module (CPU), and for CUDA compile-only."""

from __future__ import annotations

import subprocess

from conftest import ONE_F16_TILE_AND_FUSE_POINT, TRANSPOSED_B, matmul_function
from iree.compiler.tools.binaries import find_tool

from autosched.config import RunConfig
from autosched.ops.matmul import analyze_file
from autosched.outputs.spec import tuning_spec
from autosched.search.space import build_space
from autosched.targets.cpu import CpuTarget
from autosched.targets.cuda import CudaTarget


def configurations(source: str, flags: list[str]) -> str:
    finished = subprocess.run(
        [find_tool("iree-compile"), source, *flags, "--compile-to=executable-configurations"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    return finished.stdout


def test_cpu_spec_configures_every_matching_matmul(write_module, tmp_path):
    path = write_module(
        matmul_function("a", 64, 64, 64) + TRANSPOSED_B + matmul_function("b", 32, 64, 16)
    )
    analysis = analyze_file(path)
    target = CpuTarget(RunConfig())
    chosen = {
        "matmul_64x64x64_f32_f32_f32": {
            "tile_m": 32,
            "tile_n": 16,
            "vec_m": 4,
            "vec_n": 8,
            "vec_k": 2,
        },
        "matmul_transpose_b_32x16x64_f32_f32_f32_acc": {
            "tile_m": 8,
            "tile_n": 16,
            "vec_m": 2,
            "vec_n": 4,
            "vec_k": 4,
        },
    }
    best = [(p, target, chosen[p.name]) for p in analysis.problems if p.name in chosen]
    assert len(best) == 2
    spec = tmp_path / "spec.mlir"
    spec.write_text(tuning_spec(best))
    output = configurations(path, [*target.compile_flags(), *target.spec_flags(str(spec))])
    assert "distribution = [32, 16, 0]" in output and "vector_reduction = [0, 0, 2]" in output
    assert "distribution = [8, 16, 0]" in output and "vector_reduction = [0, 0, 4]" in output
    # The 32x64x16 matmul matched no rule: IREE chose its own configuration for it.
    plain = configurations(path, target.compile_flags())
    assert "distribution = [32, 16, 0]" not in plain


def test_no_winner_no_spec():
    assert tuning_spec([]) is None


def test_cuda_spec_is_applied_through_the_transform_library(write_module, tmp_path):
    path = write_module(matmul_function("h", 256, 256, 256, "f16", "f32"))
    (problem,) = analyze_file(path).problems
    target = CudaTarget(RunConfig(target="cuda", arch="sm_89"))
    lists = ONE_F16_TILE_AND_FUSE_POINT
    (point,) = build_space(problem, target, lists).points
    spec = tmp_path / "spec.mlir"
    spec.write_text(tuning_spec([(problem, target, point)]))
    output = configurations(path, [*target.compile_flags(), *target.spec_flags(str(spec))])
    assert "subgroup = [2, 2, 0]" in output and "reduction = [0, 0, 2]" in output
    assert "workgroup_size = [256, 1, 1]" in output


def test_starter_spec_is_linked_and_the_tuned_config_wins(write_module, tmp_path):
    """The user's spec keeps configuring what the run did not tune; where both match an op,
    the tuned configuration is the one IREE applies."""
    from autosched.outputs.spec import write_spec

    path = write_module(matmul_function("a", 64, 64, 64) + matmul_function("b", 32, 64, 16))
    target = CpuTarget(RunConfig())
    first, second = analyze_file(path).problems
    point = {"tile_m": 32, "tile_n": 16, "vec_m": 4, "vec_n": 8, "vec_k": 2}
    starter_point = {"tile_m": 16, "tile_n": 32, "vec_m": 4, "vec_n": 8, "vec_k": 4}
    starter = tmp_path / "starter.mlir"
    # The starter configures both problems; the run tuned only the first.
    starter.write_text(
        tuning_spec([(first, target, starter_point), (second, target, starter_point)])
    )
    spec = write_spec(str(tmp_path / "out" / "spec.mlir"), [(first, target, point)], str(starter))
    output = configurations(path, [*target.compile_flags(), *target.spec_flags(spec)])
    assert "distribution = [32, 16, 0]" in output  # the tuned one, on the first problem
    assert "distribution = [16, 32, 0]" in output  # the starter's, on the second
    assert output.count("distribution = [16, 32, 0]") == 1


def test_bad_starter_spec_is_an_error_before_the_run(write_module, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from autosched.cli import cli

    monkeypatch.chdir(tmp_path)
    write_module(matmul_function("a", 32, 32, 32), "mm.mlir")
    (tmp_path / "bad.mlir").write_text("module {")
    for starter, expected in [("absent.mlir", "cannot read"), ("bad.mlir", "does not parse")]:
        result = CliRunner().invoke(cli, ["run", "mm.mlir", "--starter-spec", starter])
        assert result.exit_code == 2 and expected in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "generated" / "mm" / "tuning.jsonl").exists()
