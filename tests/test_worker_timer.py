"""`timer = worker`: candidates timed in the verifier's long-lived worker agree with
iree-benchmark-module, and a run with it works end to end (CPU; the GPU check is a
benchmark)."""

from __future__ import annotations

import json
import os
import statistics

from click.testing import CliRunner
from conftest import matmul_function

from autosched.cli import cli
from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.measure.benchmark_tool import time_module
from autosched.measure.worker import CHECK_PHASES, Verifier, make_problem_data
from autosched.model.dispatch_benchmarks import dump_dispatch_benchmarks
from autosched.model.lowering import prepare_model
from autosched.ops.matmul import analyze_file
from autosched.ops.matmul_kernel import kernel_variant
from autosched.targets.cpu import CpuTarget

MODEL = os.path.join(os.path.dirname(__file__), "data", "models", "gemm_matmul_transpose.onnx")


def test_worker_timing_agrees_with_iree_benchmark_module(tmp_path):
    path = tmp_path / "mm.mlir"
    path.write_text(matmul_function("mm", 512, 512, 512))
    (problem,) = analyze_file(str(path)).problems
    target = CpuTarget(RunConfig())
    source = tmp_path / "kernel.mlir"
    source.write_text(kernel_variant(problem, target, None))
    built = compile_one(
        CompileJob(str(source), str(tmp_path / "k.vmfb"), target.compile_flags()), 120
    )
    assert built.status == "ok", built.message
    data = make_problem_data(problem, str(tmp_path / "inputs"))
    verifier = Verifier("local-task")
    worker, tool = [], []
    try:
        for _ in range(4):  # alternate, so that both see the same load on this machine
            timing = verifier.time(built.job.output, data, 4, 3, 0.05, 60)
            assert timing.status == "ok" and len(timing.samples_ms) == 3
            worker.append(timing.median_ms)
            timing = time_module(built.job.output, "local-task", data.inputs, 4, 3, 0.05, 60)
            tool.append(timing.median_ms)
    finally:
        verifier.close()
    ratio = statistics.median(worker) / statistics.median(tool)
    # On this 2-core VM the two differ by up to 60 % (benchmarks/results/cpu_worker_timer.md); the 2 %
    # agreement asked for is checked on the H200 (benchmarks/worker_timer_check.py). A
    # per-call time reported as per-dispatch would be 4x off.
    assert 0.4 < ratio < 2.5, (worker, tool)


def test_a_run_with_the_worker_timer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    (tmp_path / "auto-scheduler.cfg").write_text(
        "[SearchSpace]\ntile_m = [16, 32]\ntile_n = [16]\nvec_m = [4]\nvec_n = [8]\nvec_k = [1]\n"
        "[SearchStrategy]\nn_trial = 2\n[Benchmark]\nrepetitions = 2\nmin_time = 0.01\n"
        "timer = worker\nruntime_flags = --task_topology_group_count=1\n"
    )
    result = CliRunner().invoke(cli, ["run", "mm.mlir"])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "generated/mm/results.csv").read_text().splitlines()
    assert len(lines) == 1 + 3 and all(",ok," in line for line in lines[1:])
    # Each record keeps the steps of its check in the worker (cuda_suite.py reports them).
    records = [json.loads(line) for line in open(tmp_path / "generated/mm/tuning.jsonl")]
    assert len(records) == 3
    assert all(set(r["verify_phases"]) == set(CHECK_PHASES) for r in records)


def test_timer_auto_is_the_worker_where_it_was_checked_against_the_tool():
    """`timer = auto`: CUDA times in the worker (within 1.4 % of iree-benchmark-module on
    the H200), the CPU target with the tool, except in fast mode (the worker: about half
    the tool's wall time a timing); an explicit timer wins."""
    from dataclasses import replace

    from autosched.config import RunConfig
    from autosched.measure.contract import measure_settings
    from autosched.targets.cpu import CpuTarget
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    config = RunConfig()
    assert config.timer == "auto"
    cuda = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine())
    assert measure_settings(config, cuda).timer == "worker"
    assert measure_settings(config, CpuTarget(config, Machine())).timer == "tool"
    assert measure_settings(replace(config, timer="tool"), cuda).timer == "tool"
    cpu = CpuTarget(config, Machine())
    assert measure_settings(replace(config, mode="fast"), cpu).timer == "worker"
    assert measure_settings(replace(config, mode="fast", timer="tool"), cpu).timer == "tool"


def test_a_slow_dispatch_benchmark_dispatches_less_often_per_call(tmp_path):
    """IREE's dispatch benchmarks take how often to dispatch per call. Asked for far more
    than fits in a call (here 10^8, over a minute a call), the worker dispatches less often
    and still reports time per dispatch. On the H200, resnet50's strided 1x1 default at 200
    dispatches a call timed out after 120 s, and its problem, the model's largest, lost its
    default."""
    target = CpuTarget(RunConfig())
    source = prepare_model(MODEL, str(tmp_path / "m"))
    benchmarks = dump_dispatch_benchmarks(source, target.compile_flags(), str(tmp_path))
    benchmark = next(iter(benchmarks.values()))
    flags = [*target.compile_flags(), *benchmark.flags]
    built = compile_one(CompileJob(benchmark.source, str(tmp_path / "b.vmfb"), flags), 120)
    assert built.status == "ok", built.message
    path = tmp_path / "mm.mlir"
    path.write_text(matmul_function("mm", 8, 24, 32))  # inputs the worker keeps: unused
    (problem,) = analyze_file(str(path)).problems
    data = make_problem_data(problem, str(tmp_path / "inputs"))
    verifier = Verifier("local-task")
    try:
        timings = [
            verifier.time(built.job.output, data, count, 3, 0.05, 20, benchmark.function)
            for count in (50, 10**8)
        ]
    finally:
        verifier.close()
    assert all(t.status == "ok" for t in timings), timings
    normal, fitted = (t.median_ms for t in timings)
    assert 0.2 < fitted / normal < 5, (normal, fitted)  # per dispatch, either way
