"""Matmul kernels for any count of rows M (a prompt of any length): the row count is a value
the kernel is launched with, which IREE passes as a push constant, and the grid follows it.
One build then serves every length of a model exported with a dynamic sequence."""

from __future__ import annotations

import dataclasses
import re

import pytest
from test_triton_kernels import _check_on_the_gpu, _problem

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.errors import UserError
from autosched.kernels.matmul_triton.kernel import (
    KernelParams,
    compile_ptx,
    dynamic_unsupported,
    extern_module,
)
from autosched.ops.matmul_kernel import KERNEL_FUNCTION
from autosched.targets import make_target

pytest.importorskip("triton")

# Tuned at 512 rows; built for any. Weights as nn.Linear stores them, bf16 in and out.
PROBLEM = _problem(512, 384, 256, "bf16", "bf16", transpose_b=True)
PARAMS = KernelParams(128, 128, 64, 4, 3, 8)
ROWS = (1, 100, 512, 1500)  # a decode step, no whole block, the tuned size, no power of two


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory):
    """(the kernel for any M, its module's text, its sm_90 build)."""
    folder = tmp_path_factory.mktemp("dynamic_rows")
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    binary = compile_ptx(PROBLEM, PARAMS, "sm_90", str(folder / "any_m.ptx"), dynamic_m=True)
    text = extern_module(
        PROBLEM, PARAMS, binary, target.executable_target(), KERNEL_FUNCTION, dynamic_m=True
    )
    source = folder / "any_m.mlir"
    source.write_text(text)
    job = CompileJob(str(source), str(folder / "any_m.vmfb"), target.compile_flags())
    return binary, text, compile_one(job, 300)


def test_the_row_count_is_a_value_after_the_operands(dynamic):
    """Triton's entry takes A, B, C, then M as a 32-bit value, then its scratch pointers;
    IREE passes bindings first and push constants after them, so the call binds A, B and
    C and passes M, then a zero for each scratch pointer (such a kernel has no global
    scratch), and the grid is ceil(M / 128) blocks of rows times 3 across N."""
    binary, text, _ = dynamic
    ptx = open(binary.ptx_path).read()
    parameters = re.search(r"\.entry\s+\w+\s*\(([^)]*)\)", ptx).group(1)
    kinds = re.findall(r"\.param\s+\.(\w+)", parameters)
    assert kinds == ["u64", "u64", "u64", "u32", "u64", "u64"]
    assert binary.scalars == 1 and binary.pointers == 6 and binary.scratch_bytes == 0
    assert "(%a0: tensor<?x256xbf16>, %a1: tensor<384x256xbf16>) -> tensor<?x384xbf16>" in text
    assert '"matmul"[%m](%a0, %a1, %out, %m32, %pad, %pad)' in text
    assert "constants = 3, bindings" in text
    assert "((s0 ceildiv 128) * 3)" in text


def test_the_kernel_for_any_m_builds_for_sm_90(dynamic):
    _, _, result = dynamic
    assert result.status == "ok", result.message


def test_a_static_kernel_keeps_m_as_a_constant(tmp_path):
    """The same point built for its own M takes no value: nothing changes for a static
    model."""
    binary = compile_ptx(PROBLEM, PARAMS, "sm_90", str(tmp_path / "static.ptx"))
    assert binary.scalars == 0 and binary.pointers == 5


def test_what_a_kernel_for_any_m_does_not_cover(tmp_path):
    """One batch entry at most, A with its rows along M (and no epilogue); split-K and
    persistent points run as their blocks, one workgroup each."""
    cases = [
        (_problem(64, 64, 64, batch=2), None, "one batch entry"),
        (dataclasses.replace(_problem(64, 64, 64), transpose_a=True), None, "rows along M"),
    ]
    for problem, epilogue, why in cases:
        with pytest.raises(UserError, match=why):
            compile_ptx(problem, PARAMS, "sm_90", str(tmp_path / "x.ptx"), epilogue, True)
    assert dynamic_unsupported(PROBLEM, None) is None
    split = dataclasses.replace(PARAMS, split_k=2, persistent=132)
    binary = compile_ptx(PROBLEM, split, "sm_90", str(tmp_path / "split.ptx"), dynamic_m=True)
    assert binary.scalars == 1 and "atom" not in open(binary.ptx_path).read()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ROWS)
def test_one_build_gives_numpys_answer_at_every_length(dynamic, rows, tmp_path):
    """The one build run with A of each row count: numpy's product every time."""
    _, _, result = dynamic
    problem = dataclasses.replace(PROBLEM, m=rows)
    check = _check_on_the_gpu(result.job.output, problem, tmp_path)
    assert check.status == "correct", check.message
