"""Verification against numpy, with real compiles and real local-task runs."""

from __future__ import annotations

from conftest import TRANSPOSED_B, matmul_function

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.measure.worker import CHECK_PHASES, Verifier, make_problem_data, verify_module
from autosched.ops.matmul import analyze_file
from autosched.ops.matmul_kernel import kernel_module_text, kernel_variant
from autosched.targets.cpu import CpuTarget

TARGET = CpuTarget(RunConfig())


def compile_text(text: str, tmp_path, name: str, repeat: int = 1) -> str:
    source = tmp_path / f"{name}.mlir"
    source.write_text(text)
    flags = TARGET.compile_flags()
    if repeat > 1:
        flags = [*flags, f"--iree-hal-benchmark-dispatch-repeat-count={repeat}"]
    result = compile_one(
        CompileJob(str(source), str(tmp_path / f"{name}.vmfb"), flags), timeout=120
    )
    assert result.status == "ok", result.message
    return result.job.output


def test_correct_kernels_pass(write_module, tmp_path):
    analysis = analyze_file(
        write_module(
            matmul_function("f", 64, 32, 48, "f16", "f32")
            + matmul_function("b", 32, 32, 32, "bf16", "f32")  # raw .bin inputs, no numpy bf16
            + TRANSPOSED_B
        )
    )
    assert len(analysis.problems) == 3
    for problem in analysis.problems:
        data = make_problem_data(problem, str(tmp_path / problem.name))
        point = {"tile_m": 16, "tile_n": 16, "vec_m": 4, "vec_n": 8, "vec_k": 4}
        # Timed builds repeat the dispatch: harmless for a zero-filled accumulator only.
        repeat = 3 if problem.zero_init else 1
        vmfb = compile_text(kernel_variant(problem, TARGET, point), tmp_path, problem.name, repeat)
        result = verify_module(vmfb, "local-task", data, problem, timeout=60)
        assert result.status == "correct", result.message
        assert result.max_error < 1e-3


def test_wrong_answer_is_caught(write_module, tmp_path):
    problem = analyze_file(write_module(matmul_function("f", 32, 32, 32))).problems[0]
    data = make_problem_data(problem, str(tmp_path / "data"))
    # A real kernel that computes something else: the accumulator starts at 1, not 0.
    wrong = kernel_module_text(problem).replace("arith.constant 0.0", "arith.constant 1.0")
    vmfb = compile_text(wrong, tmp_path, "wrong")
    result = verify_module(vmfb, "local-task", data, problem, timeout=60)
    assert result.status == "wrong_answer"
    assert result.max_error > 0.01


def test_runtime_failure_is_recorded(write_module, tmp_path):
    problem = analyze_file(write_module(matmul_function("f", 32, 32, 32))).problems[0]
    data = make_problem_data(problem, str(tmp_path / "data"))
    broken = tmp_path / "broken.vmfb"
    broken.write_bytes(b"not a module")
    result = verify_module(str(broken), "local-task", data, problem, timeout=60)
    assert result.status == "runtime_error" and result.message


def test_the_long_lived_verifier_checks_and_survives_a_crash(write_module, tmp_path):
    problem = analyze_file(write_module(matmul_function("f", 32, 32, 32))).problems[0]
    data = make_problem_data(problem, str(tmp_path / "data"))
    point = {"tile_m": 16, "tile_n": 16, "vec_m": 4, "vec_n": 8, "vec_k": 4}
    good = compile_text(kernel_variant(problem, TARGET, point), tmp_path, "good")
    wrong_text = kernel_module_text(problem).replace("arith.constant 0.0", "arith.constant 1.0")
    wrong = compile_text(wrong_text, tmp_path, "wrong")
    broken = tmp_path / "broken.vmfb"
    broken.write_bytes(b"not a module")
    verifier = Verifier("local-task")
    try:
        assert verifier.check(good, data, problem, 60).status == "correct"
        assert verifier.check(wrong, data, problem, 60).status == "wrong_answer"
        assert verifier.check(str(broken), data, problem, 60).status == "runtime_error"
        worker = verifier.process
        assert verifier.check(good, data, problem, 60).status == "correct"
        assert verifier.process is worker  # a failing module is not a reason to restart
        worker.kill()  # as if a candidate had crashed the process
        worker.wait()
        assert verifier.check(good, data, problem, 60).status == "correct"
        assert verifier.process is not worker
    finally:
        verifier.close()
    assert verifier.process is None


def test_verifier_falls_back_to_iree_run_module_when_the_device_will_not_open(
    write_module, tmp_path
):
    problem = analyze_file(write_module(matmul_function("f", 32, 32, 32))).problems[0]
    data = make_problem_data(problem, str(tmp_path / "data"))
    good = compile_text(kernel_module_text(problem), tmp_path, "good")
    verifier = Verifier("no-such-driver")
    try:
        result = verifier.check(good, data, problem, 60)
    finally:
        verifier.close()
    assert verifier.unavailable.startswith("unavailable")
    assert result.status == "runtime_error"  # iree-run-module cannot open it either


ACCUMULATING = """
func.func @acc(%a: tensor<32x16xf32>, %b: tensor<16x32xf32>, %c: tensor<32x32xf32>) -> tensor<32x32xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<32x16xf32>, tensor<16x32xf32>) outs(%c : tensor<32x32xf32>) -> tensor<32x32xf32>
  return %r : tensor<32x32xf32>
}
"""


def test_the_verifier_keeps_inputs_on_the_device_unchanged_across_checks(write_module, tmp_path):
    """Cached device inputs must not be written by a kernel that accumulates into one."""
    analysis = analyze_file(write_module(matmul_function("f", 32, 32, 32) + ACCUMULATING))
    zero_filled, accumulating = sorted(analysis.problems, key=lambda p: p.zero_init)[::-1]
    assert not accumulating.zero_init
    verifier = Verifier("local-task")
    try:
        for problem in (accumulating, zero_filled, accumulating):  # switching problems too
            data = make_problem_data(problem, str(tmp_path / problem.name))
            vmfb = compile_text(kernel_module_text(problem), tmp_path, problem.name)
            for _ in range(3):
                result = verifier.check(vmfb, data, problem, 60)
                assert result.status == "correct", result.message
    finally:
        verifier.close()


def test_the_worker_reuses_a_checked_module_for_its_timing_but_never_a_rebuilt_one(
    write_module, tmp_path
):
    """A timing after its check skips the reload and the warm-up; a module rebuilt at the
    same path is the new one; a candidate slower than `slow_ms` keeps one sample."""
    problem = analyze_file(write_module(matmul_function("f", 64, 64, 64))).problems[0]
    data = make_problem_data(problem, str(tmp_path / "data"))
    right = kernel_module_text(problem)
    wrong = right.replace("arith.constant 0.0", "arith.constant 1.0")
    vmfb = compile_text(right, tmp_path, "k")
    verifier = Verifier("local-task")
    try:
        checked = verifier.check(vmfb, data, problem, 60)
        assert checked.status == "correct"
        assert list(checked.phases) == list(CHECK_PHASES)  # where a check's time went
        assert all(seconds >= 0 for seconds in checked.phases.values())
        timing = verifier.time(vmfb, data, 1, 3, 0.01, 60)  # after its check: reused
        assert timing.status == "ok" and len(timing.samples_ms) == 3
        assert compile_text(wrong, tmp_path, "k") == vmfb  # rebuilt in place
        assert verifier.check(vmfb, data, problem, 60).status == "wrong_answer"
        loser = verifier.time(vmfb, data, 1, 3, 0.01, 60, slow_ms=timing.median_ms / 1e3)
        assert loser.status == "ok" and len(loser.samples_ms) == 1
        fine = verifier.time(vmfb, data, 1, 3, 0.01, 60, slow_ms=timing.median_ms * 1e3)
        assert fine.status == "ok" and len(fine.samples_ms) == 3
    finally:
        verifier.close()


def test_the_verifiers_worker_takes_iree_runtime_flags(write_module, tmp_path):
    """Runtime flags (CUDA's --cuda_use_streams, here the CPU's task flags) reach the worker
    before it opens the device: a flag the runtime knows is used, an unknown one keeps the
    worker from starting, with the runtime's reason."""
    problem = analyze_file(write_module(matmul_function("f", 32, 32, 32))).problems[0]
    data = make_problem_data(problem, str(tmp_path / "data"))
    good = compile_text(kernel_module_text(problem), tmp_path, "good")
    known = Verifier("local-task", ("--task_topology_group_count=1",))
    unknown = Verifier("local-task", ("--no_such_flag=1",))
    try:
        assert known.check(good, data, problem, 60).status == "correct"
        assert not known.unavailable
        assert unknown.time(good, data, 1, 1, 0.01, 60) is None  # the caller falls back
        assert "no_such_flag" in unknown.unavailable
    finally:
        known.close()
        unknown.close()
