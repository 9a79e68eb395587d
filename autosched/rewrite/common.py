"""What the rewrite's modules share: where in IREE's pipeline it reads and rewrites the model,
the fused model its forms are read from, small readers of ops, and the predicate that tells
a problem's own contractions from the model's other ops.

This is the bottom of `autosched.rewrite`: it imports no other module of the package, so the
modules that each absorb one thing around a replaced op (epilogues, rotary, reshapes, stored
weights, padding, attention sources) can all lean on it without a circle.
"""

from __future__ import annotations

import os
from dataclasses import replace

from iree.compiler import ir

from autosched.model.lowering import lower_to_phase, run_passes, source_location
from autosched.ops.base import DispatchSite, Problem
from autosched.ops.contraction import Contraction, recognise_contraction
from autosched.ops.convolution import POINTWISE, WINDOW, ConvolutionProblem
from autosched.ops.convolution_kind import ConvolutionKind
from autosched.ops.matmul import MatmulProblem

REWRITE_PHASE = "global-optimization"  # where a model's ops have their dispatch form
ELEMENTWISE_FUSION = "iree-dispatch-creation-elementwise-op-fusion"
FUSED_MODEL = "model.fused.mlir"  # the module the op forms (and their epilogues) are read from
RESHAPES = ("tensor.collapse_shape", "tensor.expand_shape")
COLLAPSE, EXPAND = RESHAPES


def fused_model(model_path: str, compile_flags, work_dir: str, again: bool = False) -> str:
    """The model at REWRITE_PHASE after IREE's elementwise fusion, as the substitution spec
    sees it (work_dir's FUSED_MODEL; lowered again when it is not there, or with `again`)."""
    fused = os.path.join(work_dir, FUSED_MODEL)
    if os.path.exists(fused) and not again:
        return fused
    os.makedirs(work_dir, exist_ok=True)
    saved = os.path.join(work_dir, f"model.{REWRITE_PHASE}.mlir")
    path = lower_to_phase(model_path, compile_flags, REWRITE_PHASE, saved, work_dir)
    run_passes(path, f"builtin.module(util.func({ELEMENTWISE_FUSION}))", fused)
    return fused


def read_fused_model(model_path: str, compile_flags, work_dir: str) -> ir.Module:
    """`fused_model`, parsed in a context of its own."""
    return ir.Module.parseFile(fused_model(model_path, compile_flags, work_dir), ir.Context())


def tensor_shape(value: ir.Value) -> list[int]:
    """A ranked tensor value's static shape."""
    return list(ir.RankedTensorType(value.type).shape)


def element_type(value_type: ir.Type) -> str:
    """A tensor's element type, or a scalar's type, as MLIR spells it."""
    try:
        return str(ir.ShapedType(value_type).element_type)
    except ValueError:
        return str(value_type)


def single_user(value: ir.Value) -> ir.Operation | None:
    """The one op that reads `value`, or None where it has none or several."""
    users = [use.owner for use in value.uses]
    return users[0] if len(users) == 1 else None


def reassociation(reshape: ir.Operation) -> list[list[int]]:
    """A collapse_shape's or expand_shape's groups of dims."""
    groups = ir.ArrayAttr(reshape.attributes["reassociation"])
    return [[ir.IntegerAttr(d).value for d in ir.ArrayAttr(g)] for g in groups]


def is_truncf(op: ir.Operation | None) -> bool:
    """A linalg.generic of one input whose body only rounds it to a narrower float."""
    if op is None or op.name != "linalg.generic" or len(op.operands) != 2:
        return False
    body = [o.operation.name for o in op.regions[0].blocks[0].operations]
    return body == ["arith.truncf", "linalg.yield"]


def op_convolution(op: ir.Operation, kind: ConvolutionKind) -> ConvolutionProblem | None:
    """The op-form problem of a window or pointwise convolution op (one site: its own)."""
    if op.name != "linalg.generic" and not op.name.startswith("linalg.conv"):
        return None
    site = DispatchSite("", "", 1, (), source_location(op.location))
    problem = kind.recognise(op, site)
    if not isinstance(problem, ConvolutionProblem) or problem.form not in (WINDOW, POINTWISE):
        return None
    return replace(problem, op_form=True, sites=[site])


def is_problems_op(op: ir.Operation, problem) -> bool:
    """Whether `op` is one of the problem's contractions, as the spec's matcher sees them:
    a convolution's op form, or a matmul's maps, sizes and types."""
    if not op.name.startswith("linalg"):
        return False
    if isinstance(problem, ConvolutionProblem):
        same = op_convolution(op, ConvolutionKind())
        return same is not None and same.key() == problem.key()
    found = recognise_contraction(op, DispatchSite("", "", 1, (), ""))
    same = found.as_matmul_problem() if isinstance(found, Contraction) else None
    fields = ("indexing_maps", "m", "n", "k", "batch", "lhs_type", "rhs_type", "acc_type")
    return same is not None and all(
        getattr(same, name) == getattr(problem, name) for name in fields
    )


def problem_key(problem: Problem) -> object:
    """How a problem's forms read from the model are named: a convolution by its op form's
    key (two may share a name), a matmul by its name (a normed form by its problem's), any
    other kind (attention) by its name."""
    if isinstance(problem, ConvolutionProblem):
        return problem.key()
    if isinstance(problem, MatmulProblem) and problem.norm:
        return replace(problem, norm=None).name
    return problem.name
