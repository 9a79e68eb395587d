"""Custom-kernel winners as a transform spec: each matched contraction is replaced by a call
to a function that runs the kernel as a `hal.dispatch.extern` (issue 12).

A lowering configuration cannot say "use this PTX", so the winners of the custom family
replace their ops before IREE forms dispatches. The spec matches a contraction as the tuning
spec does (element types, indexing maps, every dimension, in any form: named op or
linalg.generic) whose accumulator is a `linalg.fill` (the family computes C = A·B from
zero), and `cast_and_call`s the kernel's function in its place, as IREE's own custom-kernel
samples do.

A contraction that accumulates in f32 and whose result only goes through a `truncf` to its
input type (what torch exports for f16 and bf16 layers) is replaced together with that
`truncf` by the kernel built to store the narrow type itself: its f32 accumulator is
rounded as `truncf` rounds (to nearest even), and the f32 tensor (537 MB for a decoder's
q·kᵀ) is neither written nor read again.

Two routes apply it:
- a module written by hand: `iree-compile --iree-preprocessing-transform-spec-filename=SPEC`
  (its ops already have their final form when preprocessing runs);
- a model (`rewrite_model`): the model is lowered to global optimization, where each
  contraction has the form its dispatch will have (a torch `nn.Linear` is a broadcast
  batch_matmul of a transposed weight before it, a matmul with a transposed map after), the
  spec is applied there with iree-opt, and iree-compile goes on from that phase.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

from autosched import processes
from autosched.ops.matmul import MatmulProblem
from autosched.outputs.spec import match_contraction
from autosched.targets.cuda_custom import KernelBinary, KernelParams, extern_function, unsupported

SPEC_FLAG = "--iree-preprocessing-transform-spec-filename"
REWRITE_PHASE = "global-optimization"  # where a model's contractions have their dispatch form
RESUME_FLAG = f"--compile-from={REWRITE_PHASE}"  # compiles a rewritten model the rest of the way
FUNCTION_PREFIX = "autosched_custom_"
ANY_OP, ANY_VALUE = "!transform.any_op", "!transform.any_value"


NARROW_FROM = "f32"  # an accumulator type whose truncf consumer the kernel can take over


@dataclass(frozen=True)
class Substitute:
    """One winner as the spec uses it: its kernel, and the kernel that stores the narrow
    type for the contraction-then-truncf form (None where the output is already narrow)."""

    problem: MatmulProblem
    params: KernelParams
    binary: KernelBinary
    narrow: tuple[MatmulProblem, KernelBinary] | None = None


def narrow_params(params: KernelParams) -> KernelParams:
    """The narrow kernel's point: shares of K add up in C, so one that writes f16 or bf16
    runs its K whole."""
    return dataclasses.replace(params, split_k=1)


def narrowed(problem: MatmulProblem) -> MatmulProblem | None:
    """The problem with its output in its input type, when its f32 output may be followed
    by a truncf to that type; None otherwise."""
    if problem.acc_type != NARROW_FROM or unsupported(problem):
        return None
    narrow = dataclasses.replace(problem, acc_type=problem.lhs_type, sites=[])
    return None if unsupported(narrow) else narrow


def substitutable(problem: MatmulProblem) -> str | None:
    """Why a custom winner for this problem cannot be substituted, or None."""
    return unsupported(problem)


def _matcher(index: int, problem: MatmulProblem) -> str:
    return "\n".join(
        [
            f"  transform.named_sequence @match_custom_{index}"
            f"(%op: {ANY_OP} {{transform.readonly}}) -> ({ANY_OP}) {{",
            match_contraction(problem).rstrip("\n"),
            # The family starts from zero: the accumulator must come from a linalg.fill.
            f"    %init = transform.get_producer_of_operand %op[2] : ({ANY_OP}) -> {ANY_OP}",
            f'    transform.match.operation_name %init ["linalg.fill"] : {ANY_OP}',
            f"    transform.yield %op : {ANY_OP}",
            "  }",
        ]
    )


def _narrow_matcher(index: int, problem: MatmulProblem, narrow: str) -> str:
    """Matches a `truncf` to `narrow` (an elementwise linalg.generic of nothing else) whose
    input is one of the problem's zero-filled contractions; yields both."""
    rank = len(problem.acc_shape)
    dims = ", ".join(f"d{i}" for i in range(rank))
    identity = f"affine_map<({dims}) -> ({dims})>"
    wide = f"tensor<{'?x' * rank}{NARROW_FROM}>"
    thin = f"tensor<{'?x' * rank}{narrow}>"
    parallel = ", ".join(['"parallel"'] * rank)
    return "\n".join(
        [
            f"  transform.named_sequence @match_narrow_{index}"
            f"(%op: {ANY_OP} {{transform.readonly}}) -> ({ANY_OP}, {ANY_OP}) {{",
            "    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {",
            f"    ^bb0(%in: {wide}, %out: {thin}):",
            f"      %r = linalg.generic {{indexing_maps = [{identity}, {identity}], "
            f"iterator_types = [{parallel}]}} ins(%in : {wide}) outs(%out : {thin}) {{",
            f"      ^bb1(%a: {NARROW_FROM}, %b: {narrow}):",
            f"        %c = arith.truncf %a : {NARROW_FROM} to {narrow}",
            f"        linalg.yield %c : {narrow}",
            f"      }} -> {thin}",
            f"    }} : ({ANY_OP}) -> ({ANY_VALUE}, {ANY_VALUE})",
            f"    %mm = transform.get_producer_of_operand %op[0] : ({ANY_OP}) -> {ANY_OP}",
            match_contraction(problem, "%mm").rstrip("\n"),
            # The truncf is the contraction's only user: else its f32 result is still needed.
            f"    transform.match.structured %mm : {ANY_OP} {{",
            f"    ^bb2(%s: {ANY_OP}):",
            f"      %user = transform.match.structured.result %s[0] single"
            f" : ({ANY_OP}) -> {ANY_OP}",
            "      transform.match.structured.yield",
            "    }",
            f"    %init = transform.get_producer_of_operand %mm[2] : ({ANY_OP}) -> {ANY_OP}",
            f'    transform.match.operation_name %init ["linalg.fill"] : {ANY_OP}',
            f"    transform.yield %op, %mm : {ANY_OP}, {ANY_OP}",
            "  }",
        ]
    )


def _caller(name: str, function: str, narrow: bool = False) -> str:
    """Calls `function` on the contraction's A and B in place of the matched op's result
    (`narrow`: the matched op is the truncf, its operand's producer the contraction)."""
    params = f"%op: {ANY_OP} {{transform.readonly}}"
    if narrow:
        params += f", %mm: {ANY_OP} {{transform.readonly}}"
    contraction = "%mm" if narrow else "%op"
    return "\n".join(
        [
            f"  transform.named_sequence @{name}({params}) {{",
            f"    %module = transform.util.get_nearest_symbol_table %op : ({ANY_OP}) -> {ANY_OP}",
            f"    %func = transform.util.import_symbol @{function} into %module "
            f"if undefined : ({ANY_OP}) -> {ANY_OP}",
            f"    %ins = transform.get_operand {contraction}[0, 1] : ({ANY_OP}) -> {ANY_VALUE}",
            f"    %outs = transform.get_result %op[all] : ({ANY_OP}) -> {ANY_VALUE}",
            "    transform.util.cast_and_call %func(%ins) -> %outs before %op {",
            "      transform.type_conversion.tensor.cast_shape_dynamic_dims",
            f"    }} : ({ANY_OP}, {ANY_VALUE}, {ANY_VALUE}, {ANY_OP}) -> {ANY_OP}",
            "    transform.yield",
            "  }",
        ]
    )


def substitution_spec(winners: list[Substitute], executable_target: str) -> str:
    """The preprocessing spec that puts each winner's kernel in place of its op: first every
    contraction-then-truncf pair that a narrow kernel covers, then the contractions left."""
    functions, narrow_arms, narrow_matchers = [], [], []
    for i, w in enumerate(winners):
        name = f"{FUNCTION_PREFIX}{i}"
        functions.append(
            extern_function(w.problem, w.params, w.binary, executable_target, name, "util.func")
        )
        if w.narrow is not None:
            problem, binary = w.narrow
            functions.append(
                extern_function(
                    problem,
                    narrow_params(w.params),
                    binary,
                    executable_target,
                    f"{name}_narrow",
                    "util.func",
                )
            )
            narrow_arms.append(i)
            narrow_matchers.append(_narrow_matcher(i, w.problem, problem.acc_type))
    passes = [
        ", ".join(f"@match_narrow_{i} -> @call_narrow_{i}" for i in narrow_arms),
        ", ".join(f"@match_custom_{i} -> @call_custom_{i}" for i in range(len(winners))),
    ]
    main = [f"  transform.named_sequence @__transform_main(%module: {ANY_OP}) {{"]
    # The narrow pass must see the contractions unreplaced; each pass matches the functions
    # afresh (a pass's matching invalidates the handles it walked).
    for index, arms in enumerate(filter(None, passes)):
        main += [
            f'    %funcs{index} = transform.structured.match ops{{["func.func", "util.func"]}} '
            f"in %module : ({ANY_OP}) -> {ANY_OP}",
            f"    transform.foreach %funcs{index} : {ANY_OP} {{",
            f"      ^bb1(%f: {ANY_OP}):",
            f"        transform.foreach_match in %f {arms} : ({ANY_OP}) -> ({ANY_OP})",
            "    }",
        ]
    main += [
        f"    transform.apply_dce to %module : {ANY_OP}",
        f'    transform.apply_registered_pass "inline" to %module : ({ANY_OP}) -> {ANY_OP}',
        "    transform.yield",
        "  }",
    ]
    parts = [
        *functions,
        *narrow_matchers,
        *(_matcher(i, w.problem) for i, w in enumerate(winners)),
        *(_caller(f"call_narrow_{i}", f"{FUNCTION_PREFIX}{i}_narrow", True) for i in narrow_arms),
        *(_caller(f"call_custom_{i}", f"{FUNCTION_PREFIX}{i}") for i in range(len(winners))),
        "\n".join(main),
    ]
    body = "\n".join(parts)
    return f"module attributes {{transform.with_named_sequence}} {{\n{body}\n}}\n"


def write_substitution(path: str, winners: list[tuple[MatmulProblem, dict]], target) -> list[str]:
    """Writes the spec for the custom winners ((problem, point) pairs of the CUDA target)
    that can be substituted, their PTX beside it; returns why the others cannot be. A spec
    left by an earlier run is removed first."""
    from autosched.targets.cuda_custom import compile_ptx

    if os.path.exists(path):
        os.remove(path)
    folder = path.removesuffix(".mlir")
    kept, refused = [], []
    for problem, point in winners:
        why = substitutable(problem)
        if why:
            refused.append(f"{problem.name}: {why}")
            continue
        params = KernelParams.from_point(point)
        ptx = os.path.join(folder, f"{problem.name}.ptx")
        binary = compile_ptx(problem, params, target.arch, ptx)
        narrow = narrowed(problem)
        if narrow is not None:
            ptx = os.path.join(folder, f"{problem.name}.to_{narrow.acc_type}.ptx")
            narrow = (narrow, compile_ptx(narrow, narrow_params(params), target.arch, ptx))
        kept.append(Substitute(problem, params, binary, narrow))
    if kept:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(substitution_spec(kept, target.executable_target()))
    return refused


def rewrite_commands(
    source: str, spec: str, flags: Sequence[str], out: str
) -> list[tuple[str, list[str]]]:
    """(tool, command) to lower the model to global optimization and apply the spec there;
    `out` gets the rewritten module, to compile on with `flags` and RESUME_FLAG."""
    from autosched.compile import compiler_path, opt_path

    lowered = _lowered(out)
    pipeline = (
        f"builtin.module(iree-preprocessing-transform-interpreter{{transform-spec-path={spec}}})"
    )
    return [
        (
            "iree-compile",
            [compiler_path(), source, *flags, f"--compile-to={REWRITE_PHASE}", "-o", lowered],
        ),
        ("iree-opt", [opt_path(), lowered, f"--pass-pipeline={pipeline}", "-o", out]),
    ]


def rewrite_model(
    source: str, spec: str, flags: Sequence[str], out: str, timeout: float
) -> tuple[str, int]:
    """The model at global optimization with the spec's kernels in place of their ops, and how
    many ops were replaced. A failing tool is a RuntimeError with its one telling line."""
    for tool, command in rewrite_commands(source, spec, flags, out):
        finished = processes.run(command, timeout)
        if finished.timed_out or finished.returncode != 0:
            why = (
                f"over {timeout:g} s"
                if finished.timed_out
                else processes.describe_failure(finished, tool)
            )
            raise RuntimeError(f"{tool}: {why}")
    return out, count_externs(out) - count_externs(_lowered(out))


def check_custom_spec(path: str) -> None:
    """A custom-kernel spec (a run's `results.custom.mlir`) must parse and be the
    preprocessing library that replaces ops (`@__transform_main`); anything else is one
    UserError naming the file, before anything is compiled."""
    from iree.compiler import ir

    from autosched.errors import UserError
    from autosched.ir_walk import children, symbol

    try:
        with open(path, "rb") as handle:
            module = ir.Module.parse(handle.read(), ir.Context())
    except OSError as error:
        raise UserError(f"{path}: cannot read the custom spec: {error.strerror}") from None
    except ir.MLIRError as error:
        found = error.error_diagnostics
        message = found[0].message if found else str(error).splitlines()[0]
        raise UserError(f"{path}: the custom spec does not parse: {message}") from None
    names = {
        symbol(op) for op in children(module.operation) if op.name == "transform.named_sequence"
    }
    if "__transform_main" in names:
        return
    if "__kernel_config" in names:
        raise UserError(f"{path}: this is a tuning spec: give it with --spec, not --custom")
    raise UserError(
        f"{path}: not a custom-kernel spec (no @__transform_main; a run writes one as "
        "results.custom.mlir)"
    )


def _lowered(out: str) -> str:
    """Where the model lowered to global optimization is kept, beside the rewritten one."""
    return out.removesuffix(".mlir") + ".global.mlir"


def count_externs(path: str) -> int:
    """Custom dispatches (`hal.dispatch.extern`) in a module, read with the bindings: the
    rewrite adds one for each contraction that now runs a custom kernel."""
    from iree.compiler import ir

    from autosched.ir_walk import walk_ops

    module = ir.Module.parseFile(path, ir.Context())
    return sum(1 for op in walk_ops(module.operation) if op.name == "hal.dispatch.extern")
