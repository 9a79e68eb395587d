"""`python -m autosched.targets.cuda_custom_compile`: the compile pool's step that writes one
custom-kernel point (Triton to PTX, then its extern module), apart from the kernel family
(`cuda_custom`) so that the family needs nothing of the CUDA target that uses it."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from autosched.config import RunConfig
from autosched.ops.matmul_kernel import KERNEL_FUNCTION, write_text
from autosched.outputs.records import problem_from_shape
from autosched.targets.cuda import CudaTarget
from autosched.targets.cuda_custom import KernelParams, compile_ptx, extern_module
from autosched.targets.host import Machine


def main(argv: list[str] | None = None) -> None:
    """One point's PTX and its launch needs (JSON), and its extern module with --module."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--shape", required=True, help="the problem as records.problem_shape")
    parser.add_argument("--params", required=True, help="KernelParams as JSON")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--ptx", required=True)
    parser.add_argument("--module", help="also write the extern module (the kernel module)")
    options = parser.parse_args(argv)
    problem = problem_from_shape(json.loads(options.shape))
    params = KernelParams(**json.loads(options.params))
    binary = compile_ptx(problem, params, options.arch, options.ptx)
    if options.module:
        target = CudaTarget(RunConfig(target="cuda", arch=options.arch), Machine())
        text = extern_module(problem, params, binary, target.executable_target(), KERNEL_FUNCTION)
        write_text(options.module, text)
    json.dump(asdict(binary), sys.stdout)


if __name__ == "__main__":
    main()
