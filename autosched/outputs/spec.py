"""The winners as a tuning spec: a transform-dialect library that IREE applies to any module.

The annotated module (`*.best.mlir`) only helps when you compile that very file; a spec
matches contractions by element types, layout and shape inside whatever model you compile,
so it also serves models exported from a framework.
"""

from __future__ import annotations

import os
import tempfile

from iree.compiler import ir

from autosched import processes
from autosched.compile import opt_path
from autosched.errors import UserError
from autosched.ir_walk import children, scratch_context, symbol
from autosched.ops.base import ANY_OP, Problem
from autosched.ops.registry import kind_of
from autosched.targets.base import Point, Target

LINK_TIMEOUT = 120.0


def match_contraction(problem: Problem, handle: str = "%op", free: frozenset = frozenset()) -> str:
    """The problem's kind's matcher for `handle` (see ops/base.py); with `free` loop roles
    (a contraction of a dynamic model), one that leaves their sizes unchecked."""
    if free:
        return kind_of(problem).spec_matcher(problem, handle, free)
    return kind_of(problem).spec_matcher(problem, handle)


def _apply(name: str, attributes: list[str]) -> str:
    """A named sequence that sets each attribute on the op from a parameter of its own."""
    params = "".join(f", %{a}: !transform.any_param {{transform.readonly}}" for a in attributes)
    body = "".join(
        f'    transform.annotate %op "{a}" = %{a} : {ANY_OP}, !transform.any_param\n'
        for a in attributes
    )
    return (
        f"  transform.named_sequence @{name}(%op: {ANY_OP} {{transform.readonly}}{params}) {{\n"
        f"{body}    transform.yield\n  }}\n"
    )


APPLY_CONFIG = ("apply_op_config", ["compilation_info"])
# Attention's Q.K and P.V matmuls take their configurations from a second attribute.
APPLY_ATTENTION = ("apply_attention_config", ["compilation_info", "decomposition_config"])


def _matcher(
    problem: Problem, target: Target, point: Point, free: frozenset = frozenset()
) -> tuple[str, str, str]:
    """(name, named_sequence text, the apply sequence it feeds) matching the problem's roots
    (any size of the `free` loop roles) and giving its configuration."""
    name = f"match_{problem.name}" + (f"_any_{'_'.join(sorted(free))}" if free else "")
    target = target.for_problem(problem)
    values = [target.lowering_config(problem, point)]
    decomposition = target.decomposition_config(problem, point)
    if decomposition is not None:
        values.append(decomposition)
    params = ["%config", "%decomposition"][: len(values)]
    constants = "".join(
        f"    {param} = transform.param.constant {value} -> !transform.any_param\n"
        for param, value in zip(params, values, strict=True)
    )
    types = ", ".join([ANY_OP, *["!transform.any_param"] * len(values)])
    text = (
        f"  transform.named_sequence @{name}(%op: {ANY_OP} {{transform.readonly}})"
        f" -> ({types}) {{\n"
        f"{match_contraction(problem, free=free)}"
        f"{constants}"
        f"    transform.yield %op, {', '.join(params)} : {types}\n"
        f"  }}\n"
    )
    apply = APPLY_ATTENTION if decomposition is not None else APPLY_CONFIG
    return name, text, apply[0]


def tuning_spec(
    best: list[tuple[Problem, Target, Point]], free: dict[str, frozenset] | None = None
) -> str | None:
    """The spec text for the chosen points, parsed once here so that it is valid MLIR.

    None when there is nothing to configure (IREE requires the entry point to match).
    Points a lowering configuration cannot carry (custom kernels) are left out. `free`
    (problem name -> loop roles) leaves those roles' sizes unmatched (model/buckets.py).
    """
    free = free or {}
    best = [(p, target, point) for p, target, point in best if target.for_problem(p).in_spec(point)]
    if not best:
        return None
    # Each problem in its own form and its folded ones (RootOpKind.folded_forms), once
    # each: two problems may fold to one form.
    forms = [
        (form, target, point)
        for problem, target, point in best
        for form in (problem, *kind_of(problem).folded_forms(problem))
    ]
    named = {}
    for form, target, point in forms:
        name, text, apply = _matcher(form, target, point, free.get(form.name, frozenset()))
        named.setdefault(name, (name, text, apply))
    matchers = list(named.values())
    arms = ",\n        ".join(f"@{name} -> @{apply}" for name, _, apply in matchers)
    applies = [a for a in (APPLY_CONFIG, APPLY_ATTENTION) if any(m[2] == a[0] for m in matchers)]
    body = (
        f"    %result = transform.foreach_match in %variant\n        {arms}\n"
        f"      : ({ANY_OP}) -> {ANY_OP}\n"
        f"    transform.yield %result : {ANY_OP}\n"
    )
    text = (
        "module attributes {iree_codegen.tuning_spec_with_default_entrypoint,"
        " transform.with_named_sequence} {\n"
        + "".join(_apply(name, attributes) for name, attributes in applies)
        + "".join(text for _, text, _ in matchers)
        + f"  transform.named_sequence @__kernel_config(%variant: {ANY_OP} {{transform.consumed}})"
        f" -> {ANY_OP} attributes {{iree_codegen.tuning_spec_entrypoint}} {{\n"
        f"{body}  }}\n}}\n"
    )
    return str(ir.Module.parse(text, scratch_context()))


def read_starter(starter_path: str, context: ir.Context) -> ir.Module:
    """The user's starter spec, parsed (checked before a run starts, and when merging)."""
    try:
        with open(starter_path, "rb") as handle:
            module = ir.Module.parse(handle.read(), context)
    except OSError as error:
        raise UserError(f"{starter_path}: cannot read the starter spec: {error.strerror}") from None
    except ir.MLIRError as error:
        message = str(error).splitlines()[0]
        raise UserError(f"{starter_path}: the starter spec does not parse: {message}") from None
    _check_tuning_library(starter_path, module)
    return module


def _check_tuning_library(path: str, module: ir.Module) -> None:
    """A tuning spec is a transform library (`transform.with_named_sequence`) whose entry
    is `@__kernel_config`: anything else would be refused by iree-compile only at the
    proof, after the whole search."""
    if "transform.with_named_sequence" not in module.operation.attributes:
        raise UserError(
            f"{path}: not a tuning spec (a module with transform.with_named_sequence and a "
            "@__kernel_config entry, as a run writes results.spec.mlir)"
        )
    sequences = [op for op in children(module.operation) if op.name == "transform.named_sequence"]
    entry = [
        op
        for op in sequences
        if symbol(op) == "__kernel_config" or "iree_codegen.tuning_spec_entrypoint" in op.attributes
    ]
    if not entry:
        raise UserError(
            f"{path}: the tuning spec has no entry sequence (@__kernel_config, or one marked "
            "iree_codegen.tuning_spec_entrypoint)"
        )


def check_starter(path: str) -> None:
    """The starter spec, if any, is a tuning spec (a dry run checks it too)."""
    if path:
        read_starter(path, ir.Context())


def merge_with_starter(tuned: str, starter_path: str) -> str:
    """The tuned spec linked with a spec the user already has, by IREE's own linker.

    Both go into one module as nested specs and `iree-opt --iree-codegen-link-tuning-specs`
    makes one entry point that tries them in order. The tuned spec comes first: where both
    match an op, the first spec's configuration is the one IREE keeps (checked on the CPU).
    """
    context = ir.Context()
    starter = read_starter(starter_path, context)
    outer = ir.Module.parse("module attributes {transform.with_named_sequence} {}", context)
    for module in (ir.Module.parse(tuned, context), starter):
        outer.body.append(module.operation.clone())
    with tempfile.TemporaryDirectory(prefix="autosched-spec-") as folder:
        nested = os.path.join(folder, "nested.mlir")
        with open(nested, "w", encoding="utf-8") as handle:
            handle.write(str(outer))
        command = [opt_path(), nested, "--iree-codegen-link-tuning-specs"]
        finished = processes.run(command, LINK_TIMEOUT)
    if finished.timed_out or finished.returncode != 0:
        reason = processes.describe_failure(finished, "iree-opt")
        raise UserError(
            f"{starter_path}: cannot link the starter spec with the tuned one: {reason}"
        )
    return finished.stdout


def write_spec(
    path: str,
    best: list[tuple[Problem, Target, Point]],
    starter: str = "",
    free: dict[str, frozenset] | None = None,
    header: str = "",
) -> str | None:
    """Writes the winners' spec (linked with `starter` when given); None when there is none.

    A spec left by an earlier run is removed first, so that it never outlives its results.
    With a starter spec and no winner, the starter alone is written: it still applies.
    `free` is tuning_spec's; `header` (comment lines) goes first, as what the spec serves.
    """
    if os.path.exists(path):
        os.remove(path)
    text = tuning_spec(best, free)
    if starter:
        text = merge_with_starter(text, starter) if text else open(starter, encoding="utf-8").read()
    if not text:
        return None
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(header + text)
    return path
