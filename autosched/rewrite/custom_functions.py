"""The util.funcs the substitution spec imports into the model: the custom module.

Each kernel is a function that runs it as a `hal.dispatch.extern` (its family's emitter);
the forms that absorb more than the op wrap it: the stored weight reshaped to the kernel's
batch x N x K (stored_weights.py), the narrow result reshaped to the truncf's shape
(narrow_reshapes.py), an attention's operands as their copies' sources
(attention_sources.py).
"""

from __future__ import annotations

import dataclasses

from autosched.kernels.matmul_triton.kernel import operand_types
from autosched.ops.matmul_kernel import tensor_type
from autosched.rewrite.attention_sources import absorbed_function
from autosched.rewrite.narrow_reshapes import reshaped_function
from autosched.rewrite.replacements import FUNCTION_PREFIX, Substitute
from autosched.rewrite.stored_weights import wrapper_function


def winner_functions(i: int, w: Substitute, executable_target: str) -> list[str]:
    """The util.funcs a winner's arms call: its kernel, its narrow twin, and for a stored
    weight the kernels that read it as stored with their wrappers."""
    name = f"{FUNCTION_PREFIX}{i}"
    extern = w.family.extern_function

    def kernel(problem, params, binary, called):
        return extern(problem, params, binary, executable_target, called, "util.func")

    functions = [kernel(w.problem, w.params, w.binary, name)] if w.binary is not None else []
    functions += _epilogue_functions(name, w, executable_target)
    for j, (absorbed, binary) in enumerate(w.absorbed):
        called = f"{name}_absorbed{j}"
        functions += [
            kernel(absorbed.problem, w.params, binary, f"{called}_kernel"),
            absorbed_function(called, f"{called}_kernel", w.problem, absorbed),
        ]
    if w.narrow is not None:
        narrow, binary = w.narrow
        functions.append(kernel(narrow, w.family.narrow_params(w.params), binary, f"{name}_narrow"))
    if w.stored is not None:
        layout, problem, binary, narrow_binary = w.stored
        functions += [
            kernel(problem, w.params, binary, f"{name}_stored_kernel"),
            wrapper_function(
                f"{name}_stored", f"{name}_stored_kernel", w.problem, layout, w.problem.acc_type
            ),
        ]
        if narrow_binary is not None:
            narrow_problem = dataclasses.replace(problem, acc_type=w.narrow[0].acc_type)
            functions += [
                kernel(
                    narrow_problem,
                    w.family.narrow_params(w.params),
                    narrow_binary,
                    f"{name}_ns_kernel",
                ),
                wrapper_function(
                    f"{name}_narrow_stored",
                    f"{name}_ns_kernel",
                    w.problem,
                    layout,
                    narrow_problem.acc_type,
                ),
            ]
    return functions + _reshaped_functions(name, w)


def _epilogue_functions(name: str, w: Substitute, executable_target: str) -> list[str]:
    """For each epilogue of a winner: its kernel's function (`{name}_e{j}`), and for a
    matmul whose B is a stored weight's transpose the kernel that reads it as stored with
    its wrapper (`{name}_e{j}_stored`)."""
    functions = []
    for j, (epilogue, binary, stored_binary) in enumerate(w.epilogues):
        called = f"{name}_e{j}"
        if w.problem.kind == "convolution":
            functions.append(
                w.family.extern_function(
                    w.problem, w.params, binary, executable_target, called, "util.func",
                    epilogue,
                )
            )  # fmt: skip
            continue
        params = w.family.narrow_params(w.params)
        functions.append(
            w.family.extern_function(
                w.narrow[0], params, binary, executable_target, called, "util.func", epilogue
            )
        )
        if stored_binary is None:
            continue
        layout, problem, *_ = w.stored
        narrow_problem = dataclasses.replace(problem, acc_type=epilogue.narrow)
        extras = [operand.type for _, operand in epilogue.extras]
        functions += [
            w.family.extern_function(
                narrow_problem, params, stored_binary, executable_target,
                f"{called}_stored_kernel", "util.func", epilogue,
            ),
            wrapper_function(
                f"{called}_stored", f"{called}_stored_kernel", w.problem, layout,
                epilogue.narrow, extras, epilogue.out_type,
            ),
        ]  # fmt: skip
    return functions


def _reshaped_functions(name: str, w: Substitute) -> list[str]:
    """For each reshape chain of a narrowed winner: its narrow kernel (and the one that
    reads the weight as stored) with the result reshaped to the truncf's shape."""
    if w.narrow is None or not w.chains:
        return []
    narrow_type = w.narrow[0].acc_type
    result = tensor_type(w.problem.acc_shape, narrow_type)
    lhs, after_b = operand_types(w.problem)
    operands = [("narrow", tensor_type(w.problem.rhs_shape, w.problem.rhs_type))]
    if w.stored is not None and w.stored[3] is not None:
        operands.append(("narrow_stored", tensor_type(w.stored[0].shape, w.problem.rhs_type)))
    functions = []
    for j, chain in enumerate(w.chains):
        reshaped = tensor_type(list(chain.shape), narrow_type)
        for kind, rhs in operands:
            functions.append(
                reshaped_function(
                    f"{name}_{kind}_r{j}", f"{name}_{kind}", [lhs, rhs, *after_b], result,
                    reshaped,
                )
            )  # fmt: skip
    return functions
