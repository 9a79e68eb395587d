"""`python -m autosched.targets.cuda_custom_compile`: the compile pool's step that writes one
custom-kernel point (Triton to PTX, then its extern module) of the matmul family
(`cuda_custom`), the flash-attention one (`cuda_flash_attention`) or the convolution one
(`cuda_custom_convolution`), apart from the
families so that they need nothing of the CUDA target that uses them."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from autosched.config import RunConfig
from autosched.ops.matmul_kernel import KERNEL_FUNCTION, write_text
from autosched.outputs.records import problem_from_shape
from autosched.targets import cuda_custom_convolution as igemm
from autosched.targets import cuda_flash_attention as flash
from autosched.targets.cuda import CudaTarget
from autosched.targets.cuda_custom import (
    KernelParams,
    compile_ptx,
    extern_function,
    extern_module_text,
)
from autosched.targets.cuda_flash_attention import FlashParams
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
    if problem.kind == "attention":
        params = FlashParams(**json.loads(options.params))
        binary = flash.compile_kernel(problem, params, options.arch, options.ptx)
        extern = flash.extern_function
    elif problem.kind == "convolution":
        params = igemm.ConvParams(**json.loads(options.params))
        binary = igemm.compile_kernel(problem, params, options.arch, options.ptx)
        extern = igemm.extern_function
    else:
        params = KernelParams(**json.loads(options.params))
        binary = compile_ptx(problem, params, options.arch, options.ptx)
        extern = extern_function
    if options.module:
        target = CudaTarget(RunConfig(target="cuda", arch=options.arch), Machine())
        executable = target.executable_target()
        body = extern(problem, params, binary, executable, KERNEL_FUNCTION)
        write_text(options.module, extern_module_text(executable, body))
    json.dump(asdict(binary), sys.stdout)


if __name__ == "__main__":
    main()
