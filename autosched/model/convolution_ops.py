"""A model's convolutions as they stand before IREE forms dispatches: the ops the custom
implicit-GEMM route replaces (issue 25).

At global optimization each convolution is one `linalg.generic` over its padded image (the
padding a `tensor.pad` before it) from a zero-filled f32 accumulator; IREE fuses its
neighbours (the pad, the folded batch norm, ReLU) into the dispatch later, and may reshape
it (a pointwise convolution's image loops collapsed), so the problem found at `flow` and the
op replaced here are two forms of one convolution. They are paired by the op's location and
its work: torchvision's blocks call one line for convolutions of every stage.
"""

from __future__ import annotations

import os
from dataclasses import replace

from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.model.attention_ops import OP_PHASE
from autosched.model.lowering import lower_to_phase, source_location
from autosched.ops.base import DispatchSite
from autosched.ops.convolution import POINTWISE, WINDOW, ConvolutionKind, ConvolutionProblem


def model_convolutions(model_path: str, compile_flags, work_dir: str) -> list[ConvolutionProblem]:
    """The model's window and pointwise convolutions at OP_PHASE, as op-form problems."""
    os.makedirs(work_dir, exist_ok=True)
    saved = os.path.join(work_dir, f"model.{OP_PHASE}.mlir")
    path = lower_to_phase(model_path, compile_flags, OP_PHASE, saved, work_dir)
    return op_convolutions(ir.Module.parseFile(path, ir.Context()))


def op_convolutions(module: ir.Module) -> list[ConvolutionProblem]:
    """The window and pointwise convolutions of a module at global optimization (identical
    ones, image extents included, merged), each with every location it is called from."""
    kind = ConvolutionKind()
    found: dict[str, ConvolutionProblem] = {}
    for op in walk_ops(module.operation):
        if op.name != "linalg.generic" and not op.name.startswith("linalg.conv"):
            continue
        site = DispatchSite("", "", 1, (), source_location(op.location))
        problem = kind.recognise(op, site)
        if not isinstance(problem, ConvolutionProblem) or problem.form not in (WINDOW, POINTWISE):
            continue
        problem = replace(problem, op_form=True, sites=[site])
        same = found.setdefault(problem._key(), problem)
        if same is not problem:
            same.sites.append(site)
    return list(found.values())


def paired(flow: ConvolutionProblem, ops: list[ConvolutionProblem]) -> ConvolutionProblem | None:
    """The op form of a dispatch's convolution: the op at one of its sites' locations that
    does the same work on the same types."""
    locations = {site.location for site in flow.sites}
    types = (flow.lhs_type, flow.rhs_type, flow.acc_type)
    for op in ops:
        if op.flops != flow.flops or (op.lhs_type, op.rhs_type, op.acc_type) != types:
            continue
        if any(site.location in locations for site in op.sites):
            return op
    return None
