"""The convolution family as a root-op kind (ops/convolution.py holds its problem and how a
dispatch's op is read into one): the spec matcher that finds its roots again in any module, by
form, and the kernel module that rebuilds an op-form convolution alone."""

from __future__ import annotations

from iree.compiler import ir

from autosched.ops.base import ANY_OP, ANY_VALUE, PARAM, DispatchSite, RootOpKind
from autosched.ops.contraction import contraction_matcher
from autosched.ops.convolution import (
    POINTWISE,
    STRIDED,
    ConvolutionProblem,
    read_convolution,
    read_pointwise,
    read_strided,
)

IMAGE = ("n", "oh", "ow")  # a pointwise convolution's m dims (the contraction's)
REDUCED = ("c", "kh", "kw")  # the loops a convolution adds up over


def _tensor(shape, element: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>"


def op_module_text(problem: ConvolutionProblem, module_attributes: dict[str, str]) -> str:
    """The op-form convolution alone in `@main(image, filter) -> out`, from a zero-filled
    accumulator, as a `linalg.generic` with the op's own maps (what IREE generalizes it to)."""
    image = _tensor(problem.image_shape, problem.lhs_type)
    kernel = _tensor([problem.size(r) for r in problem.operand_roles(1)], problem.rhs_type)
    acc = _tensor([problem.size(r) for r in problem.output_roles], problem.acc_type)
    wide = problem.acc_type
    iterators = ", ".join(f'"{"reduction" if r in REDUCED else "parallel"}"' for r in problem.loops)
    widen = [
        f"    %w{name} = arith.extf %{name} : {element} to {wide}"
        for name, element in (("a", problem.lhs_type), ("b", problem.rhs_type))
        if element != wide
    ]
    a = "%wa" if problem.lhs_type != wide else "%a"
    b = "%wb" if problem.rhs_type != wide else "%b"
    listed = ", ".join(f"{name} = {text}" for name, text in module_attributes.items())
    return "\n".join(
        [
            f"module{f' attributes {{{listed}}}' if listed else ''} {{",
            f"func.func @main(%image: {image}, %filter: {kernel}) -> {acc} {{",
            f"  %zero = arith.constant 0.0 : {wide}",
            f"  %empty = tensor.empty() : {acc}",
            f"  %init = linalg.fill ins(%zero : {wide}) outs(%empty : {acc}) -> {acc}",
            f"  %r = linalg.generic {{indexing_maps = {problem.indexing_maps}, iterator_types = "
            f"[{iterators}]}} ins(%image, %filter : {image}, {kernel}) outs(%init : {acc}) {{",
            f"  ^bb0(%a: {problem.lhs_type}, %b: {problem.rhs_type}, %c: {wide}):",
            *widen,
            f"    %m = arith.mulf {a}, {b} : {wide}",
            f"    %s = arith.addf %c, %m : {wide}",
            f"    linalg.yield %s : {wide}",
            f"  }} -> {acc}",
            f"  return %r : {acc}",
            "}",
            "}",
            "",
        ]
    )


class ConvolutionKind(RootOpKind):
    name = "convolution"
    problem_type = ConvolutionProblem
    tuned = True
    needs_dispatch = True  # checked against the default build's outputs on IREE's dispatch
    configured_form = True  # on the CPU the unit batch folded at `flow` comes back
    checks_model = True  # a spec misses the check module built from `flow` (unit batch)

    def recognise(self, op: ir.Operation, site: DispatchSite):
        return read_convolution(op, site) or read_pointwise(op, site) or read_strided(op, site)

    def has_kernel(self, problem) -> bool:
        return problem.op_form

    def kernel_module(self, problem: ConvolutionProblem, target, point) -> str:
        """An op-form convolution alone (IREE's default build of it; the Triton points write
        their own modules). A dispatch's convolution is timed on IREE's dispatch."""
        if not problem.op_form:
            raise NotImplementedError("a dispatch's convolution is timed on IREE's dispatch")
        return op_module_text(problem, target.module_attributes())

    def spec_matcher(self, problem: ConvolutionProblem, handle: str = "%op") -> str:
        """Transform ops that match `handle` to the problem's convolutions: element types,
        indexing maps and every loop's size."""
        if problem.form == POINTWISE:
            return _pointwise_matcher(problem, handle)
        if problem.form == STRIDED:
            return _strided_matcher(problem, handle)
        names = ["%batch", "%image", "%channel", "%window", "%input", "%depth", "%s", "%d"]
        roles = [("n",), ("oh", "ow"), ("f",), ("kh", "kw"), ("c",), ("g",)]
        checks = "".join(
            f"    transform.iree.match.dims_equal {name}, "
            f"[{', '.join(str(problem.size(r)) for r in group if r in problem.loops)}]"
            f" : {PARAM}\n"
            for name, group in zip(names, roles, strict=False)
        )
        return (
            f"    {', '.join(names)} = transform.iree.match.convolution {handle},"
            f" lhs_type = {problem.lhs_type}, rhs_type = {problem.rhs_type},"
            f" output_type = {problem.acc_type}, indexing_maps = {problem.indexing_maps}"
            f" : {ANY_OP} -> {PARAM}\n"
            f"{checks}"
        )


def _pointwise_matcher(problem: ConvolutionProblem, handle: str) -> str:
    """A 1x1 convolution is matched as the contraction it is: its image loops are the m
    dims, in loop order; the output channel n, the input channel k."""
    image = [s for r, s in zip(problem.loops, problem.loop_sizes, strict=True) if r in IMAGE]
    dims = {"m": image, "n": [problem.size("f")], "k": [problem.size("c")]}
    return contraction_matcher(problem, handle, dims)


def _strided_matcher(problem: ConvolutionProblem, handle: str) -> str:
    """The whole op: its maps and its multiply-add body (inputs widened to the accumulator's
    type where they are narrower), then the filter's and output's exact types; the image's
    rows and columns are left open (its map alone says how it is read)."""
    narrow, wide = problem.lhs_type, problem.acc_type
    out_shape = [problem.size(r) for r in problem.output_roles]
    image_shape = [
        "?" if r in ("oh", "ow") else str(problem.size(r))
        for r in ("n", "c", "oh", "ow")  # NCHW; NHWC images take the same open dims
    ]
    out = f"tensor<{'x'.join(map(str, out_shape))}x{wide}>"
    kernel = f"tensor<{problem.size('f')}x{problem.size('c')}x{problem.rhs_type}>"
    image = f"tensor<{'x'.join(image_shape)}x{narrow}>"
    loose = [
        f"tensor<?x?x?x?x{narrow}>",
        f"tensor<?x?x{problem.rhs_type}>",
        f"tensor<?x?x?x?x{wide}>",
    ]
    widen = narrow != wide
    body = [
        f"      ^bb1(%a: {narrow}, %b: {problem.rhs_type}, %c: {wide}):",
        *(
            [
                f"        %wa = arith.extf %a : {narrow} to {wide}",
                f"        %wb = arith.extf %b : {problem.rhs_type} to {wide}",
            ]
            if widen
            else []
        ),
        f"        %m = arith.mulf {'%wa, %wb' if widen else '%a, %b'} : {wide}",
        f"        %s = arith.addf %c, %m : {wide}",
        f"        linalg.yield %s : {wide}",
    ]
    iterators = ", ".join('"reduction"' if r == "c" else '"parallel"' for r in problem.loops)
    lines = [
        f"    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root {handle} {{",
        f"    ^bb0(%x: {loose[0]}, %w: {loose[1]}, %o: {loose[2]}):",
        f"      %r = linalg.generic {{indexing_maps = {problem.indexing_maps}, "
        f"iterator_types = [{iterators}]}} ins(%x, %w : {loose[0]}, {loose[1]}) "
        f"outs(%o : {loose[2]}) {{",
        *body,
        f"      }} -> {loose[2]}",
        f"    }} : ({ANY_OP}) -> ({ANY_VALUE}, {ANY_VALUE})",
    ]
    for position, tensor in enumerate((image, kernel, out)):
        lines += [
            f"    %operand{position} = transform.get_operand {handle}[{position}]"
            f" : ({ANY_OP}) -> {ANY_VALUE}",
            f"    transform.iree.match.cast_compatible_type %operand{position} = {tensor}"
            f" : {ANY_VALUE}",
        ]
    return "\n".join(lines) + "\n"
