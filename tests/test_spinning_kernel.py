"""A kernel that never ends (issue 50): the worker stops it at the candidate's limit (20x the
default's work, at least a second), records a timeout, starts again on a fresh device
context, and the next candidate measures as before. On the CPU here, on the GPU where there
is one (a CUDA kernel that spins holds the device until its context is destroyed)."""

from __future__ import annotations

import time

import pytest
from conftest import matmul_function

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.measure.contract import MeasureSettings
from autosched.measure.worker import Verifier, make_problem_data
from autosched.ops.matmul import analyze_file
from autosched.ops.matmul_kernel import kernel_variant
from autosched.run.limits import LIMIT_FACTOR, run_limit
from autosched.targets.cpu import CpuTarget
from autosched.targets.cuda import CudaTarget

SIZE = 256
# Each output element counts up from its input by one until it reaches 1e30: an f32 stops
# growing at 2**24, so the loop never ends, and no compiler can prove it or fold it away.
SPINNING = f"""
func.func @main(%a: tensor<{SIZE}x{SIZE}xf16>, %b: tensor<{SIZE}x{SIZE}xf16>)
    -> tensor<{SIZE}x{SIZE}xf32> {{
  %empty = tensor.empty() : tensor<{SIZE}x{SIZE}xf32>
  %big = arith.constant 1.0e30 : f32
  %one = arith.constant 1.0 : f32
  %r = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>,
                                         affine_map<(i, j) -> (i, j)>],
                        iterator_types = ["parallel", "parallel"]}}
      ins(%a : tensor<{SIZE}x{SIZE}xf16>) outs(%empty : tensor<{SIZE}x{SIZE}xf32>) {{
  ^bb0(%x: f16, %o: f32):
    %start = arith.extf %x : f16 to f32
    %spun = scf.while (%s = %start) : (f32) -> f32 {{
      %go = arith.cmpf olt, %s, %big : f32
      scf.condition(%go) %s : f32
    }} do {{
    ^bb1(%s: f32):
      %next = arith.addf %s, %one : f32
      scf.yield %next : f32
    }}
    linalg.yield %spun : f32
  }} -> tensor<{SIZE}x{SIZE}xf32>
  return %r : tensor<{SIZE}x{SIZE}xf32>
}}
"""
TARGETS = {
    "cpu": (lambda: CpuTarget(RunConfig()), "local-task"),
    "cuda": (lambda: CudaTarget(RunConfig(target="cuda")), "cuda"),
}


def _built(tmp_path, name: str, text: str, target) -> str:
    source = tmp_path / f"{name}.mlir"
    source.write_text(text)
    job = CompileJob(str(source), str(tmp_path / f"{name}.vmfb"), target.compile_flags())
    compiled = compile_one(job, 300)
    assert compiled.status == "ok", compiled.message
    return compiled.job.output


@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_spinning_kernel_is_a_timeout_within_its_limit_and_the_next_one_measures(tmp_path, where):
    make_target, device = TARGETS[where]
    target = make_target()
    path = tmp_path / "mm.mlir"
    path.write_text(matmul_function("mm", SIZE, SIZE, SIZE, "f16", "f32"))
    (problem,) = analyze_file(str(path)).problems
    default = _built(tmp_path, "default", kernel_variant(problem, target, None), target)
    spinning = _built(tmp_path, "spinning", SPINNING, target)
    data = make_problem_data(problem, str(tmp_path / "data"))
    settings = MeasureSettings(repetitions=3, min_time=0.01, run_timeout=60.0, timer="worker")
    verifier = Verifier(device)
    try:
        assert verifier.check(default, data, problem, 60).status == "correct"
        verifier.time(default, data, 1, 3, 0.01, 60)  # warm: a cold first timing runs slow
        before = verifier.time(default, data, 1, 3, 0.01, 60)
        assert before.status == "ok", before.message
        limit = run_limit(before.median_ms, 1, settings)
        assert limit <= LIMIT_FACTOR * 0.05 + 1.0  # far below the cfg's run_timeout
        for step in ("check", "time"):
            began = time.monotonic()
            if step == "check":
                outcome = verifier.check(spinning, data, problem, limit)
            else:
                outcome = verifier.time(spinning, data, 1, 3, 0.01, limit)
            took = time.monotonic() - began
            assert outcome.status == "timeout", (step, outcome)
            assert took <= limit + 1.0, (step, took, limit)  # stopped, the worker with it
            # A fresh worker on a fresh context: the default checks and times as before.
            assert verifier.check(default, data, problem, 60).status == "correct", step
            after = verifier.time(default, data, 1, 3, 0.01, 60)
            assert after.status == "ok", (step, after.message)
            # A stopped kernel left spinning would slow it; faster is only noise on a busy
            # machine (the fresh worker is cold again), so the lower bound is loose.
            assert 0.1 < after.median_ms / before.median_ms < 3.0, (step, before, after)
    finally:
        verifier.close()
