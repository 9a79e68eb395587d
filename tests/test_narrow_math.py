"""An epilogue's division and erf where the result is 16 bits (rewrite/narrow_math.py):
branch-free forms exact to well under the result's rounding step, so that the MMA warps
that run the epilogue keep their accumulators in registers. The tiny timm ViT's fc1
(bias, then erf GELU, f16) is the case: its statements against IREE's own answer on the
CPU, and its kernels built for sm_90 by Triton and assembled by Triton's ptxas, with no
spills and the wgmma pipeline not serialized."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess

import numpy as np
import pytest
from test_conv_kernels import epilogues_against_iree, numpy_tl, tile
from test_matmul_epilogues import read_epilogues

from autosched.kernels.matmul_triton.kernel import KernelParams, compile_ptx
from autosched.rewrite import narrow_math
from autosched.rewrite.common import FUSED_MODEL, is_problems_op, problem_key

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
VIT_F16 = os.path.join(MODELS, "timm_vit_tiny_f16.mlirbc")
# The zoo ViT's fc1 form that is not warp-specialized, and its warp-specialized one.
PLAIN = KernelParams(128, 128, 64, 4, 4, 8)
SPECIALIZED = KernelParams(128, 128, 64, 4, 4, 8, persistent=132, specialized=1)


def _run(statements: list[str], **arrays) -> np.ndarray:
    names = {"tl": numpy_tl(), **{key: tile(value) for key, value in arrays.items()}}
    exec("\n".join(statements), names)  # the kernel's own lines, as Python
    return np.asarray(names["out"])


def test_the_erf_form_is_erf_to_about_a_millionth_relative():
    """Across [-6, 6] and down to 1e-30 (where 1 - tail would lose erf's leading digits, the
    Taylor series takes over): within 2e-6 of erf relative, 5e-7 absolute; +-inf give +-1
    and NaN stays NaN, as erf does."""
    x = np.concatenate(
        [
            np.linspace(-6, 6, 100_001, dtype=np.float32),
            np.float32(10.0) ** np.arange(-30, 0, 0.01, dtype=np.float32),
            np.float32([0.0, -0.25, 0.25, np.inf, -np.inf]),
        ]
    )
    got = _run([*narrow_math.erf("v", "a"), "out = v"], a=x).astype(np.float64)
    exact = np.array([math.erf(value) for value in x.astype(np.float64)])
    error = np.abs(got - exact)
    assert error.max() <= 5e-7
    assert (error <= 2e-6 * np.abs(exact)).all()
    assert np.isnan(_run([*narrow_math.erf("v", "a"), "out = v"], a=np.float32([np.nan])))[0]


def test_the_tanh_form_is_tanh_to_a_millionth():
    """GPT-2's GELU: tanh as 1 - 2 / (e^2x + 1), +-1 beyond e^2x's range."""
    x = np.concatenate([np.linspace(-12, 12, 100_001, dtype=np.float32), np.float32([-99, 99])])
    got = _run([*narrow_math.tanh("v", "a"), "out = v"], a=x)
    assert got.dtype == np.float32 and np.abs(got - np.tanh(x.astype(np.float64))).max() < 1e-6


def test_the_division_rounds_to_the_narrow_type():
    a, b = np.float16([1.0, -3.0, 7.5]), np.float16([3.0, 1.4142, -0.1])
    got = _run([*narrow_math.divide("v", "a", "b"), "out = v"], a=a, b=b)
    assert got.dtype == np.float16 and (got == a / b).all()


@pytest.fixture(scope="module")
def vit_epilogues(tmp_path_factory):
    return read_epilogues(VIT_F16, tmp_path_factory.mktemp("vit_epilogues"))


def _gelu(vit_epilogues):
    """(fc1's problem, its bias-and-GELU epilogue)."""
    *_, problems, epilogues, _ = vit_epilogues
    found = [
        (problem, epilogue)
        for problem in problems
        for epilogue in epilogues[problem_key(problem)]
        if any(str(narrow_math.P) in line for line in epilogue.statements)
    ]
    assert len(found) == 1 and not any("tl.math.erf" in s for s in found[0][1].statements)
    return found[0]


def test_the_vits_gelu_computes_what_iree_computes(vit_epilogues):
    """fc1's epilogue in the tiny ViT (f16), its GELU's division and erf in their narrow
    forms, run by numpy against the same generic built by IREE for the CPU."""
    *_, folder = vit_epilogues
    fc1, _ = _gelu(vit_epilogues)

    def close(got, expected):  # f16 rounds each step of the GELU: a few of its ulps (2^-10)
        return (np.abs(got - expected) <= 4 * 2**-10 * np.abs(expected) + 4e-3).all()

    checked = epilogues_against_iree(
        str(folder / "fused" / FUSED_MODEL),
        lambda op: fc1 if is_problems_op(op, fc1) else None,
        lambda tensor: np.float32 if "xf32>" in tensor else np.float16,
        close,
        spread=4,
    )
    assert checked == 1


@pytest.mark.parametrize("params", [PLAIN, SPECIALIZED], ids=lambda p: p.name)
def test_the_gelu_kernels_keep_their_accumulators_in_registers(vit_epilogues, params, tmp_path):
    """fc1 at the zoo ViT's size (6304x3072x768) with its epilogue, assembled for sm_90a by
    Triton's ptxas: no spills, and the wgmma pipeline not serialized (with IREE's exact
    division and libdevice's erf, 68-144 bytes of spills; the plain kernel serialized)."""
    pytest.importorskip("triton")
    from triton.backends.nvidia.compiler import get_ptxas  # noqa: PLC0415 - an extra

    ptxas = get_ptxas(90).path  # the ptxas Triton ships for sm_90
    problem, epilogue = _gelu(vit_epilogues)
    big = dataclasses.replace(problem, m=6304, n=3072, k=768)
    binary = compile_ptx(big, params, "sm_90", str(tmp_path / "fc1.ptx"), epilogue)
    report = subprocess.run(
        [ptxas, "-arch=sm_90a", "-v", binary.ptx_path, "-o", str(tmp_path / "fc1.cubin")],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    assert "C7514" not in report  # wgmma serialized
    assert " 0 bytes spill stores, 0 bytes spill loads" in report, report
