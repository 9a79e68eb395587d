"""`python -m autosched.kernels.compile`: the compile pool's step that writes one point of a
custom kernel family (its binary, then its extern module), in a process of its own so that
Triton's compile and memory stay out of the run's. The family is named by its class
(`module:Class`, what `KernelFamily.source_command` writes), so the step needs nothing of
the target that searched it beyond the arch."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from importlib import import_module

from autosched.config import RunConfig
from autosched.kernels.base import KernelFamily
from autosched.kernels.extern import extern_module_text
from autosched.ops.matmul_kernel import KERNEL_FUNCTION, write_text
from autosched.outputs.records import problem_from_shape
from autosched.targets.cuda import CudaTarget
from autosched.targets.host import Machine


def family_class(entry: str) -> type[KernelFamily]:
    """The family class `module:Class` names."""
    module, _, name = entry.partition(":")
    return getattr(import_module(module), name)


def main(argv: list[str] | None = None) -> None:
    """One point's binary and its launch needs (JSON), and its extern module with --module."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--family", required=True, help="the family's class, as module:Class")
    parser.add_argument("--shape", required=True, help="the problem as records.problem_shape")
    parser.add_argument("--params", required=True, help="the family's parameters as JSON")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--ptx", required=True)
    parser.add_argument("--module", help="also write the extern module (the kernel module)")
    options = parser.parse_args(argv)
    family = family_class(options.family)()
    problem = problem_from_shape(json.loads(options.shape))
    params = family.params_type(**json.loads(options.params))
    binary = family.compile(problem, params, options.arch, options.ptx)
    if options.module:
        target = CudaTarget(RunConfig(target="cuda", arch=options.arch), Machine())
        executable = target.executable_target()
        body = family.extern_function(problem, params, binary, executable, KERNEL_FUNCTION)
        write_text(options.module, extern_module_text(executable, body))
    json.dump(asdict(binary), sys.stdout)


if __name__ == "__main__":
    main()
