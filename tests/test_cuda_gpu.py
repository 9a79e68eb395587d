"""On a real NVIDIA GPU: the whole loop, and verification catching a kernel that is wrong.

Marked `gpu`: skipped where nvidia-smi finds no GPU (as in CI); run on the GPU machine.
"""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from click.testing import CliRunner
from conftest import ONE_F16_TILE_AND_FUSE_POINT, matmul_function
from test_model_run import MODELS

from autosched.cli import cli
from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.measure.worker import make_problem_data, verify_module
from autosched.ops.matmul import analyze_file
from autosched.ops.matmul_kernel import kernel_variant
from autosched.outputs.records import UNCHECKED
from autosched.search.space import build_space
from autosched.targets.cuda import CudaTarget

pytestmark = pytest.mark.gpu
FAST_MODEL = "hf_llama_mlp_f32"


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


def test_a_fast_run_on_the_gpu_times_first_and_checks_what_can_win(tmp_path, monkeypatch):
    """Fast mode's timed-first path on CUDA: candidates are timed in the worker, only those
    within reach of the default get a check build, and a winner is always a checked one."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(f"{MODELS}/{FAST_MODEL}.mlirbc", tmp_path)
    result = CliRunner().invoke(
        cli, ["run", f"{FAST_MODEL}.mlirbc", "--target", "cuda", "--mode", "fast", "--budget", "12"]
    )
    assert result.exit_code == 0, result.output
    work = tmp_path / "generated" / FAST_MODEL
    records = [json.loads(line) for line in (work / "tuning.jsonl").read_text().splitlines()]
    candidates = [r for r in records if not r["baseline"]]
    assert candidates and all(r["target"] == "cuda" for r in records)
    assert {r["status"] for r in candidates} <= {"ok", UNCHECKED, "compile_error", "timeout"}
    for record in candidates:
        if record["status"] == UNCHECKED:
            assert record["verification"] == "" and record["median_ms"] > 0
        elif record["status"] == "ok":
            assert record["verification"] == "correct"
    summary = json.loads((work / "results.summary.json").read_text())
    checked = {r["problem"] for r in candidates if r["status"] == "ok"}
    assert {row["problem"] for row in summary["problems"] if row["in_spec"]} <= checked
    model = summary["model"]
    assert model["outputs_match"] or model["default_only"], result.output
