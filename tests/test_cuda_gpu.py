"""On a real NVIDIA GPU: the whole loop, and verification catching a kernel that is wrong.

Marked `gpu`: skipped where nvidia-smi finds no GPU (as in CI); run on the GPU machine.
"""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner
from conftest import ONE_F16_TILE_AND_FUSE_POINT, matmul_function

from autosched.cli import cli
from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.measure.worker import make_problem_data, verify_module
from autosched.ops.matmul import analyze_file
from autosched.ops.matmul_kernel import kernel_variant
from autosched.search.space import build_space
from autosched.targets.cuda import CudaTarget

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("element", ["f32", "f16"])
def test_cuda_run_end_to_end(tmp_path, monkeypatch, element):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.mlir").write_text(matmul_function("mm", 256, 256, 256, element, "f32"))
    (tmp_path / "auto-scheduler.cfg").write_text(
        "[SearchStrategy]\ntuner = random\nn_trial = 6\nbatch_size = 6\n"
        "[Benchmark]\nrepetitions = 3\nmin_time = 0.01\nretime_top = 2\n"
    )
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--target", "cuda"])
    assert result.exit_code == 0, result.output
    with open("generated/mm/results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 7
    assert all(r["status"] == "ok" and r["verification"] == "correct" for r in rows), rows
    assert rows[0]["target"].startswith("cuda:sm_")


def test_wrong_answer_is_caught_on_the_gpu(tmp_path):
    """A real CUDA kernel computing something else (accumulator starting at 1) is flagged.

    (A workgroup_size smaller than the tiles need compiled and still gave the right answer on
    an H200, so it is no test of the check: IREE's distribution loops cover the tile.)
    """
    path = tmp_path / "mm.mlir"
    path.write_text(matmul_function("mm", 256, 256, 256, "f16", "f32"))
    problem = analyze_file(str(path)).problems[0]
    target = CudaTarget(RunConfig(target="cuda"))
    lists = ONE_F16_TILE_AND_FUSE_POINT
    point = build_space(problem, target, lists).points[0]
    good = kernel_variant(problem, target, point)
    wrong = good.replace("arith.constant 0.000000e+00", "arith.constant 1.000000e+00")
    assert wrong != good
    data = make_problem_data(problem, str(tmp_path / "data"))
    statuses = {}
    for name, text in (("good", good), ("wrong", wrong)):
        source = tmp_path / f"{name}.mlir"
        source.write_text(text)
        job = CompileJob(str(source), str(tmp_path / f"{name}.vmfb"), target.compile_flags())
        compiled = compile_one(job, 300)
        assert compiled.status == "ok", compiled.message
        statuses[name] = verify_module(compiled.job.output, "cuda", data, problem, 60).status
    assert statuses == {"good": "correct", "wrong": "wrong_answer"}
