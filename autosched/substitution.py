"""Custom-kernel winners as a preprocessing transform spec: the matched op is replaced by
a call to a function that runs the kernel as a `hal.dispatch.extern` (issue 12).

A lowering configuration cannot say "use this PTX", so the winners of the custom family
are applied before IREE forms dispatches: `iree-compile
--iree-preprocessing-transform-spec-filename=SPEC` matches each tuned op by its name, its
operand types and a zero-filled accumulator (the family computes C = A·B from zero), and
`cast_and_call`s the kernel's function in its place, as IREE's own custom-kernel samples
do (../shared/probes/README.md: on the H200 the matmul became the extern dispatch and the
outputs matched the default build's).
"""

from __future__ import annotations

from autosched.analysis import MatmulProblem
from autosched.manifest import tensor_type
from autosched.triton_kernels import KernelBinary, KernelParams, extern_function

SPEC_FLAG = "--iree-preprocessing-transform-spec-filename"
ANY_OP, ANY_VALUE = "!transform.any_op", "!transform.any_value"
# Ops a substitution can name: the named contractions (a `linalg.generic` cannot be told
# from other generics by its name and types alone).
NAMED_OPS = (
    "linalg.matmul",
    "linalg.batch_matmul",
    "linalg.matmul_transpose_b",
    "linalg.batch_matmul_transpose_b",
)


def substitutable(problem: MatmulProblem) -> str | None:
    """Why a custom winner for this problem cannot be substituted, or None."""
    if problem.op_name not in NAMED_OPS:
        return f"{problem.op_name} cannot be matched by name"
    if problem.transpose_b and problem.n == problem.k and problem.op_name.endswith("matmul"):
        # B's type alone does not tell a transposed operand from a plain one.
        return "a square transposed B is ambiguous by type"
    return None


def _matcher(index: int, problem: MatmulProblem) -> str:
    types = [
        tensor_type(problem.lhs_shape, problem.lhs_type),
        tensor_type(problem.rhs_shape, problem.rhs_type),
        tensor_type(problem.acc_shape, problem.acc_type),
    ]
    checks = []
    for operand, type_text in enumerate(types):
        checks += [
            f"    %in{operand} = transform.get_operand %op[{operand}] : ({ANY_OP}) -> {ANY_VALUE}",
            f"    transform.iree.match.cast_compatible_type %in{operand} = {type_text} "
            f": {ANY_VALUE}",
        ]
    return "\n".join(
        [
            f"  transform.named_sequence @match_custom_{index}"
            f"(%op: {ANY_OP} {{transform.readonly}}) -> ({ANY_OP}) {{",
            f'    transform.match.operation_name %op ["{problem.op_name}"] : {ANY_OP}',
            *checks,
            # The family starts from zero: the accumulator must come from a linalg.fill.
            f"    %init = transform.get_producer_of_operand %op[2] : ({ANY_OP}) -> {ANY_OP}",
            f'    transform.match.operation_name %init ["linalg.fill"] : {ANY_OP}',
            f"    transform.yield %op : {ANY_OP}",
            "  }",
        ]
    )


def _caller(index: int) -> str:
    return "\n".join(
        [
            f"  transform.named_sequence @call_custom_{index}"
            f"(%op: {ANY_OP} {{transform.readonly}}) {{",
            f"    %module = transform.util.get_nearest_symbol_table %op : ({ANY_OP}) -> {ANY_OP}",
            f"    %func = transform.util.import_symbol @autosched_custom_{index} into %module "
            f"if undefined : ({ANY_OP}) -> {ANY_OP}",
            f"    %ins = transform.get_operand %op[0, 1] : ({ANY_OP}) -> {ANY_VALUE}",
            f"    %outs = transform.get_result %op[all] : ({ANY_OP}) -> {ANY_VALUE}",
            "    transform.util.cast_and_call %func(%ins) -> %outs before %op {",
            "      transform.type_conversion.tensor.cast_shape_dynamic_dims",
            f"    }} : ({ANY_OP}, {ANY_VALUE}, {ANY_VALUE}, {ANY_OP}) -> {ANY_OP}",
            "    transform.yield",
            "  }",
        ]
    )


def substitution_spec(
    winners: list[tuple[MatmulProblem, KernelParams, KernelBinary]], executable_target: str
) -> str:
    """The preprocessing spec that puts each winner's kernel in place of its op."""
    functions = [
        extern_function(
            problem, params, binary, executable_target, f"autosched_custom_{i}", "util.func"
        )
        for i, (problem, params, binary) in enumerate(winners)
    ]
    arms = ", ".join(f"@match_custom_{i} -> @call_custom_{i}" for i in range(len(winners)))
    main = "\n".join(
        [
            f"  transform.named_sequence @__transform_main(%module: {ANY_OP}) {{",
            '    %funcs = transform.structured.match ops{["func.func", "util.func"]} in %module '
            f": ({ANY_OP}) -> {ANY_OP}",
            f"    transform.foreach %funcs : {ANY_OP} {{",
            f"      ^bb1(%f: {ANY_OP}):",
            f"        transform.foreach_match in %f {arms} : ({ANY_OP}) -> ({ANY_OP})",
            "    }",
            f"    transform.apply_dce to %module : {ANY_OP}",
            f'    transform.apply_registered_pass "inline" to %module : ({ANY_OP}) -> {ANY_OP}',
            "    transform.yield",
            "  }",
        ]
    )
    parts = [
        *functions,
        *(_matcher(i, p) for i, (p, _, _) in enumerate(winners)),
        *(_caller(i) for i in range(len(winners))),
        main,
    ]
    body = "\n".join(parts)
    return f"module attributes {{transform.with_named_sequence}} {{\n{body}\n}}\n"


def write_substitution(path: str, winners: list[tuple[MatmulProblem, dict]], target) -> list[str]:
    """Writes the spec for the custom winners ((problem, point) pairs of the CUDA target)
    that can be substituted, their PTX beside it; returns why the others cannot be. A spec
    left by an earlier run is removed first."""
    import os

    from autosched.triton_kernels import compile_ptx

    if os.path.exists(path):
        os.remove(path)
    folder = path.removesuffix(".mlir")
    kept, refused = [], []
    for problem, point in winners:
        why = substitutable(problem)
        if why:
            refused.append(f"{problem.name}: {why}")
            continue
        params = KernelParams(
            point["tile_m"],
            point["tile_n"],
            point["tile_k"],
            point["warps"],
            point["pipeline_depth"],
            point["group_m"],
        )
        ptx = os.path.join(folder, f"{problem.name}.ptx")
        kept.append((problem, params, compile_ptx(problem, params, target.arch, ptx)))
    if kept:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(substitution_spec(kept, target.executable_target()))
    return refused
