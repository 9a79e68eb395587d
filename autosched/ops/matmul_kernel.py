"""Writes the MLIR files: one kernel module per tuning point, and the tuned input module.

A point is timed on the matmul cut out of the input module (same op, types, layout and
accumulator kind), so its time is the op's alone and its answer can be checked with numpy.
The attribute is set through the MLIR bindings, so every emitted file is known to parse.
"""

from __future__ import annotations

import dataclasses
import os

from iree.compiler import ir
from iree.compiler.dialects import arith, func, linalg, tensor

from autosched.ops.matmul import MatmulProblem, parse_module, walk_matmuls
from autosched.targets.base import Point, Target

KERNEL_FUNCTION = "main"


def tensor_type(shape: list[int | str], element: str) -> str:
    """The tensor type's spelling; a negative size (DYNAMIC) is `?`, as `?` is."""
    sizes = ("?" if d == "?" or d < 0 else str(d) for d in shape)
    return f"tensor<{'x'.join(sizes)}x{element}>"


def kernel_module_text(
    problem: MatmulProblem, module_attributes: dict[str, str] | None = None
) -> str:
    """The problem's matmul alone in `@main`, zero-filled or accumulating as in the source."""
    lhs = tensor_type(problem.lhs_shape, problem.lhs_type)
    rhs = tensor_type(problem.rhs_shape, problem.rhs_type)
    acc = tensor_type(problem.acc_shape, problem.acc_type)
    args = f"%lhs: {lhs}, %rhs: {rhs}"
    if problem.zero_init:
        init = (
            f"  %zero = arith.constant 0.0 : {problem.acc_type}\n"
            f"  %empty = tensor.empty() : {acc}\n"
            f"  %acc = linalg.fill ins(%zero : {problem.acc_type}) outs(%empty : {acc}) -> {acc}\n"
        )
    else:
        args += f", %acc: {acc}"
        init = ""
    listed = ", ".join(f"{name} = {text}" for name, text in (module_attributes or {}).items())
    attributes = f" attributes {{{listed}}}" if listed else ""
    return (
        f"module{attributes} {{\n"
        f"func.func @{KERNEL_FUNCTION}({args}) -> {acc} {{\n"
        f"{init}"
        f"  %result = {problem.op_name} indexing_maps = {problem.indexing_maps}\n"
        f"      ins(%lhs, %rhs : {lhs}, {rhs}) outs(%acc : {acc}) -> {acc}\n"
        f"  return %result : {acc}\n"
        f"}}\n}}\n"
    )


def _attach(op: ir.Operation, attribute_text: str, context: ir.Context) -> None:
    op.attributes["compilation_info"] = ir.Attribute.parse(attribute_text, context)


NARROW_TYPES = ("bf16", "f16")


def rounds_from_f32(problem: MatmulProblem) -> bool:
    """Whether the problem is a kernel's narrowed form (no op of the user's module: no
    sites), a zero-filled 16-bit product of 16-bit operands. The model computes it in f32
    and rounds it (torch's matmul as IREE lowers it), and IREE 3.13 cannot build the bare
    op with a 16-bit accumulator on CUDA ('failed to distribute': the Llama-3-8B layer's
    projections then had no default to be timed against), so its kernel module does as the
    model does: the product in f32, then a truncf."""
    narrow = problem.acc_type in NARROW_TYPES and problem.lhs_type == problem.acc_type
    return narrow and problem.zero_init and not problem.sites


def one_input_generic(
    value: ir.Value, init: ir.Value, input_map: ir.AffineMap, rounds: bool
) -> linalg.GenericOp:
    """At the insertion point, an all-parallel linalg.generic that yields its one input
    (`value`, read through `input_map`) into `init`, rounded to `init`'s element type
    where `rounds`."""
    rank = ir.RankedTensorType(init.type).rank
    maps = [input_map, ir.AffineMap.get_identity(rank)]
    parallel = [linalg.IteratorType.parallel] * rank
    generic = linalg.GenericOp([init.type], [value], [init], maps, parallel)
    elements = [ir.ShapedType(v.type).element_type for v in (value, init)]
    body = generic.regions[0].blocks.append(*elements)
    with ir.InsertionPoint(body):
        yielded = body.arguments[0]
        if rounds:
            yielded = arith.TruncFOp(elements[1], yielded).result
        linalg.YieldOp([yielded])
    return generic


def _round_result(module: ir.Module, element: str) -> None:
    """`@main`'s f32 result rounded to `element` by a linalg.generic before it returns."""
    (function,) = [op for op in module.body.operations if isinstance(op, func.FuncOp)]
    returned = list(function.entry_block.operations)[-1]
    wide = returned.operands[0]
    shape = ir.RankedTensorType(wide.type).shape
    with ir.InsertionPoint(returned), ir.Location.unknown():
        empty = tensor.EmptyOp(shape, ir.Type.parse(element))
        identity = ir.AffineMap.get_identity(len(shape))
        generic = one_input_generic(wide, empty.result, identity, rounds=True)
    returned.operands[0] = generic.result
    inputs = ir.FunctionType(function.type).inputs
    function.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(inputs, [generic.result.type])
    )


def kernel_variant(problem: MatmulProblem, target: Target, point: Point | None) -> str:
    """Kernel module text; with a point, its matmul carries that point's compilation_info.
    A narrowed form's product is computed in f32 and rounded (`rounds_from_f32`)."""
    context = ir.Context()
    widened = rounds_from_f32(problem)
    source = dataclasses.replace(problem, acc_type="f32") if widened else problem
    module = ir.Module.parse(kernel_module_text(source, target.module_attributes()), context)
    if widened:
        with context:
            _round_result(module, problem.acc_type)
    if point is not None:
        ((_, op),) = walk_matmuls(module)
        _attach(op, target.lowering_config(problem, point), context)
    return str(module)


def variant_path(work_dir: str, problem: MatmulProblem, name: str) -> str:
    return os.path.join(
        work_dir, "linalg", problem.op_name.split(".")[1], problem.name, name + ".mlir"
    )


def write_text(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def tuned_input_module(input_file: str, best: list[tuple[MatmulProblem, Target, Point]]) -> str:
    """The user's module with each problem's best compilation_info on every op it covers."""
    context = ir.Context()
    module = parse_module(input_file, context)
    ops = [op for _, op in walk_matmuls(module)]
    for problem, target, point in best:
        if not target.in_spec(point):  # a custom kernel is not a configuration of the op
            continue
        for site in problem.sites:
            _attach(ops[site.index], target.lowering_config(problem, point), context)
        # The configs were tuned for this target (Hopper's has no iree-compile flag): keep
        # any target the user's module names, else add the one the kernels were built with.
        for name, text in target.module_attributes().items():
            if name not in module.operation.attributes:
                module.operation.attributes[name] = ir.Attribute.parse(text, context)
    return str(module)
