"""The Triton kernel family as IREE custom dispatches: PTX made without a GPU, wrapped in a
`hal.dispatch.extern` module that iree-compile builds for sm_90, and (on a GPU) the same
answers as numpy for plain, transposed, batched and unevenly divided problems."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.manifest import KERNEL_FUNCTION
from autosched.records import problem_from_shape
from autosched.targets import make_target
from autosched.triton_kernels import KernelParams, compile_ptx, extern_module, unsupported
from autosched.verify import Verifier, make_problem_data

pytest.importorskip("triton")


def _problem(m, n, k, element="f16", acc="f32", batch=0, transpose_b=False, zero_init=True):
    return problem_from_shape(
        {
            "op": "linalg.batch_matmul" if batch else "linalg.matmul",
            "m": m,
            "n": n,
            "k": k,
            "batch": batch,
            "lhs_type": element,
            "rhs_type": element,
            "acc_type": acc,
            "transpose_a": False,
            "transpose_b": transpose_b,
            "zero_init": zero_init,
        }
    )


CASES = {
    "plain": (_problem(256, 384, 512), KernelParams(128, 128, 64, 4, 3, 8)),
    # Weights as nn.Linear stores them, bf16 in and out.
    "linear_bf16": (
        _problem(128, 256, 192, "bf16", "bf16", transpose_b=True),
        KernelParams(64, 128, 64, 4, 3, 4),
    ),
    "batched": (_problem(128, 128, 64, batch=3), KernelParams(64, 64, 32, 4, 2, 1)),
    # M, N and K that no block divides: masked loads and stores.
    "uneven": (_problem(200, 300, 100), KernelParams(64, 64, 32, 4, 2, 4)),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every case's PTX, extern module and sm_90 build."""
    folder = tmp_path_factory.mktemp("custom")
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    out = {}
    for name, (problem, params) in CASES.items():
        binary = compile_ptx(problem, params, "sm_90", str(folder / f"{name}.ptx"))
        source = folder / f"{name}.mlir"
        source.write_text(
            extern_module(problem, params, binary, target.executable_target(), KERNEL_FUNCTION)
        )
        result = compile_one(
            CompileJob(str(source), str(folder / f"{name}.vmfb"), target.compile_flags()), 300
        )
        out[name] = (problem, binary, result)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_the_extern_module_builds_for_sm_90(built, name):
    problem, binary, result = built[name]
    assert result.status == "ok", result.message
    assert binary.pointers >= 3 and binary.threads == CASES[name][1].warps * 32
    ptx = open(binary.ptx_path).read()
    assert ".target sm_90a" in ptx and ".version 8.4" in ptx


def test_hopper_tensor_cores_are_used(built):
    _, binary, _ = built["plain"]
    assert "wgmma" in open(binary.ptx_path).read()


def test_the_ptx_compiler_runs_in_its_own_process(tmp_path):
    _, params = CASES["uneven"]
    shape = {
        "op": "linalg.matmul",
        "m": 200,
        "n": 300,
        "k": 100,
        "batch": 0,
        "lhs_type": "f16",
        "rhs_type": "f16",
        "acc_type": "f32",
        "transpose_a": False,
        "transpose_b": False,
        "zero_init": True,
    }
    ptx = tmp_path / "k.ptx"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autosched.triton_kernels",
            "--shape",
            json.dumps(shape),
            "--params",
            json.dumps(params.__dict__),
            "--ptx",
            str(ptx),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads(done.stdout)
    assert meta["ptx_path"] == str(ptx) and meta["shared_bytes"] > 0 and ptx.exists()


def test_what_the_family_does_not_cover():
    assert "f16 or bf16" in unsupported(_problem(64, 64, 64, "f32"))
    assert "zero accumulator" in unsupported(_problem(64, 64, 64, zero_init=False))
    assert unsupported(_problem(64, 64, 64)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_custom_kernels_give_numpys_answer(built, name, tmp_path):
    problem, _, result = built[name]
    data = make_problem_data(problem, str(tmp_path / "inputs"))
    verifier = Verifier("cuda")
    try:
        check = verifier.check(result.job.output, data, problem, 120)
    finally:
        verifier.close()
    assert check.status == "correct", check.message
