"""The winners as a tuning spec: a transform-dialect library that IREE applies to any module.

The annotated module (`*.best.mlir`) only helps when you compile that very file; a spec
matches contractions by element types, layout and shape inside whatever model you compile,
so it also serves models exported from a framework.
"""

from __future__ import annotations

from iree.compiler import ir

from autosched.analysis import MatmulProblem
from autosched.targets.base import Point, Target

ANY_OP = "!transform.any_op"
PARAM = "!transform.param<i64>"


def _matcher(problem: MatmulProblem, target: Target, point: Point) -> tuple[str, str]:
    """(name, named_sequence text) matching the problem's contractions and giving its config."""
    name = f"match_{problem.name}"
    batch = f"[{problem.batch}]" if problem.batch else "[]"
    dims = [
        ("%batch", batch),
        ("%m", f"[{problem.m}]"),
        ("%n", f"[{problem.n}]"),
        ("%k", f"[{problem.k}]"),
    ]
    checks = "".join(f"    transform.iree.match.dims_equal {v}, {d} : {PARAM}\n" for v, d in dims)
    text = (
        f"  transform.named_sequence @{name}(%op: {ANY_OP} {{transform.readonly}})"
        f" -> ({ANY_OP}, !transform.any_param) {{\n"
        f"    %batch, %m, %n, %k = transform.iree.match.contraction %op,"
        f" lhs_type = {problem.lhs_type}, rhs_type = {problem.rhs_type},"
        f" output_type = {problem.acc_type}, indexing_maps = {problem.indexing_maps}"
        f" : {ANY_OP} -> {PARAM}\n"
        f"{checks}"
        f"    %config = transform.param.constant {target.lowering_config(problem, point)}"
        f" -> !transform.any_param\n"
        f"    transform.yield %op, %config : {ANY_OP}, !transform.any_param\n"
        f"  }}\n"
    )
    return name, text


def tuning_spec(best: list[tuple[MatmulProblem, Target, Point]]) -> str | None:
    """The spec text for the chosen points, parsed once here so that it is valid MLIR.

    None when there is nothing to configure (IREE requires the entry point to match).
    """
    if not best:
        return None
    matchers = [_matcher(problem, target, point) for problem, target, point in best]
    arms = ",\n        ".join(f"@{name} -> @apply_op_config" for name, _ in matchers)
    body = (
        f"    %result = transform.foreach_match in %variant\n        {arms}\n"
        f"      : ({ANY_OP}) -> {ANY_OP}\n"
        f"    transform.yield %result : {ANY_OP}\n"
    )
    text = (
        "module attributes {iree_codegen.tuning_spec_with_default_entrypoint,"
        " transform.with_named_sequence} {\n"
        f"  transform.named_sequence @apply_op_config(%op: {ANY_OP} {{transform.readonly}},"
        " %config: !transform.any_param {transform.readonly}) {\n"
        '    transform.annotate %op "compilation_info" = %config'
        f" : {ANY_OP}, !transform.any_param\n"
        "    transform.yield\n  }\n"
        + "".join(text for _, text in matchers)
        + f"  transform.named_sequence @__kernel_config(%variant: {ANY_OP} {{transform.consumed}})"
        f" -> {ANY_OP} attributes {{iree_codegen.tuning_spec_entrypoint}} {{\n"
        f"{body}  }}\n}}\n"
    )
    return str(ir.Module.parse(text, ir.Context()))
