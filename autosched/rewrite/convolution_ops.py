"""A model's convolutions as they stand before IREE forms dispatches: the ops the custom
implicit-GEMM route replaces (issue 25).

At global optimization each convolution is one `linalg.generic` over its padded image (the
padding a `tensor.pad` before it) from a zero-filled f32 accumulator; IREE fuses its
neighbours (the pad, the folded batch norm, ReLU) into the dispatch later, and may reshape
it (a pointwise convolution's image loops collapsed), so the problem found at `flow` and the
op replaced here are two forms of one convolution. They are paired by the op's location and
its work: torchvision's blocks call one line for convolutions of every stage.

The module is read after IREE's own elementwise fusion (`ELEMENTWISE_FUSION`, the pass
dispatch creation runs first), which the substitution spec runs too: a batch norm, ReLU and
residual add after a convolution are then one `linalg.generic` (its epilogue,
`model/epilogues.py`), and a filter's transpose is folded into the convolution's map.
"""

from __future__ import annotations

import os
from dataclasses import replace

from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.model.attention_ops import OP_PHASE
from autosched.model.lowering import lower_to_phase, run_passes, source_location
from autosched.ops.base import DispatchSite
from autosched.ops.convolution import POINTWISE, WINDOW, ConvolutionKind, ConvolutionProblem

ELEMENTWISE_FUSION = "iree-dispatch-creation-elementwise-op-fusion"
FUSED_MODEL = "model.fused.mlir"  # the module the op forms (and their epilogues) are read from


def model_convolutions(model_path: str, compile_flags, work_dir: str) -> list[ConvolutionProblem]:
    """The model's window and pointwise convolutions at OP_PHASE after IREE's elementwise
    fusion, as op-form problems; the fused module stays in `work_dir` (FUSED_MODEL)."""
    fused = fused_model(model_path, compile_flags, work_dir, again=True)
    return op_convolutions(ir.Module.parseFile(fused, ir.Context()))


def fused_model(model_path: str, compile_flags, work_dir: str, again: bool = False) -> str:
    """The model at OP_PHASE after IREE's elementwise fusion, as the substitution spec sees
    it (work_dir's FUSED_MODEL; lowered again when it is not there, or with `again`)."""
    fused = os.path.join(work_dir, FUSED_MODEL)
    if os.path.exists(fused) and not again:
        return fused
    os.makedirs(work_dir, exist_ok=True)
    saved = os.path.join(work_dir, f"model.{OP_PHASE}.mlir")
    path = lower_to_phase(model_path, compile_flags, OP_PHASE, saved, work_dir)
    run_passes(path, f"builtin.module(util.func({ELEMENTWISE_FUSION}))", fused)
    return fused


def op_convolution(op: ir.Operation, kind: ConvolutionKind) -> ConvolutionProblem | None:
    """The op-form problem of a window or pointwise convolution op (one site: its own)."""
    if op.name != "linalg.generic" and not op.name.startswith("linalg.conv"):
        return None
    site = DispatchSite("", "", 1, (), source_location(op.location))
    problem = kind.recognise(op, site)
    if not isinstance(problem, ConvolutionProblem) or problem.form not in (WINDOW, POINTWISE):
        return None
    return replace(problem, op_form=True, sites=[site])


def op_convolutions(module: ir.Module) -> list[ConvolutionProblem]:
    """The window and pointwise convolutions of a module at global optimization (identical
    ones, image extents included, merged), each with every location it is called from."""
    kind = ConvolutionKind()
    found: dict[str, ConvolutionProblem] = {}
    for op in walk_ops(module.operation):
        problem = op_convolution(op, kind)
        if problem is None:
            continue
        site = problem.sites[0]
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
