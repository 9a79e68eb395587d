"""A model's attention ops as they stand before IREE forms dispatches: the ops the custom
flash-attention route replaces (issue 24).

At global optimization each attention is one `iree_linalg_ext.attention` whose operands are
plain tensors (grouped-query K and V broadcast to every query head, the mask a tensor).
IREE fuses those producers into the dispatch later, so the problem found at `flow` and the
op replaced here are two forms of one attention; they are paired by the op's location.

A causal mask is recognised by its values, not its form: when nothing the mask is computed
from is a function argument, the mask is the same on every call, so it is built once on the
CPU (its ops alone, printed with the module's names and compiled by IREE) and compared with
the causal pattern. Only then does a kernel that applies the causal mask itself, and needs no
mask tensor, compute the same attention.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
from iree import compiler, runtime
from iree.compiler import ir
from iree.compiler.tools.binaries import CompilerToolError

from autosched.ir_walk import walk_ops
from autosched.kernels.attention_layout import operand_tensor_types
from autosched.model.lowering import lower_to_phase, source_location
from autosched.ops.attention import AttentionProblem, read_attention
from autosched.ops.base import DispatchSite
from autosched.rewrite.common import REWRITE_PHASE

ATTENTION = "iree_linalg_ext.attention"
MASK_OPERAND = 4
# An additive mask value at or below this hides its key: exp of it is 0 in f32 (the f16
# type's lowest value; bf16's and -inf are lower).
HIDDEN = float(np.finfo(np.float16).min)
FLOAT_MASKS = ("f16", "bf16", "f32")
KEEP_MASKS = ("i1",)  # a key is kept where the mask is true (torch's boolean masks)
# The attention ops are read with constants up to this size printed: a mask computed from
# constants (positions 0..P-1 of a prompt, hoisted as a global) is evaluated from them;
# the weights, larger, stay elided.
MASK_CONSTANTS_ABOVE = 1 << 16


def model_attentions(model_path: str, compile_flags, work_dir: str) -> list[AttentionProblem]:
    """The model's attention ops at REWRITE_PHASE, as `op_attentions` reads them."""
    os.makedirs(work_dir, exist_ok=True)
    saved = os.path.join(work_dir, f"model.{REWRITE_PHASE}.mlir")
    return op_attentions(
        lower_to_phase(
            model_path, compile_flags, REWRITE_PHASE, saved, work_dir, MASK_CONSTANTS_ABOVE
        ),
        work_dir,
    )


def paired(flow: AttentionProblem, ops: list[AttentionProblem]) -> AttentionProblem | None:
    """The op form of a flow attention: the op at one of its sites' locations that does the
    same work. One source line may hold several attentions (a causal LM's prefill and decode
    call the same module): their op forms differ in query rows, so their FLOPs tell them
    apart, whatever layout the flow form gave the loops."""
    locations = {site.location for site in flow.sites}
    found = [op for op in ops if any(s.location in locations for s in op.sites)]
    return next((op for op in found if op.flops == flow.flops), None)


def ambiguous(op: AttentionProblem, ops: list[AttentionProblem]) -> str | None:
    """Why a spec that matches `op` by its operand types could replace another attention of
    the model too (same types, another layout, mask or scale), or None."""
    types = (operand_tensor_types(op), op.mask_type, op.operand_shape(3) if op.mask_type else 0)
    for other in ops:
        if other is op:
            continue
        other_types = (operand_tensor_types(other), other.mask_type)
        other_types += (other.operand_shape(3) if other.mask_type else 0,)
        if other_types == types:
            return f"another attention ({other.name}) has the same operand types"
    return None


def op_attentions(path: str, work_dir: str) -> list[AttentionProblem]:
    """The attention ops of a module at global optimization, as op-form problems
    (identical ones merged), each with its mask read as causal or not."""
    context = ir.Context()
    module = ir.Module.parseFile(path, context)
    found: list[AttentionProblem] = []
    for op in walk_ops(module.operation):
        if op.name != ATTENTION:
            continue
        site = DispatchSite("", "", 1, (), source_location(op.location))
        problem = read_attention(op, site)
        if not isinstance(problem, AttentionProblem):
            continue
        causal = bool(problem.mask_type) and mask_is_causal(op, problem, work_dir)
        problem = replace(problem, form="op", causal=causal)
        same = next((p for p in found if p.name == problem.name and p.scale == problem.scale), None)
        if same is None:
            found.append(problem)
        else:
            same.sites.append(site)
    return found


def defined_inside(value: ir.Value, op: ir.Operation) -> bool:
    """Whether `value` is defined in one of `op`'s regions."""
    owner = value.owner
    parent = owner.owner if isinstance(owner, ir.Block) else owner.operation.parent
    while parent is not None:
        if parent == op:
            return True
        parent = parent.parent
    return False


def _used_values(op: ir.Operation) -> list[ir.Value]:
    """The values `op` reads: its operands and what its regions take from outside."""
    values = list(op.operands)
    for inner in walk_ops(op):
        values += [v for v in inner.operands if not defined_inside(v, op)]
    return values


def constant_slice(value: ir.Value) -> list[ir.Operation] | None:
    """The ops that compute `value`, producers first; None when a function argument (a
    block argument outside any op of the slice) is among what it is computed from."""
    order: list[ir.Operation] = []
    seen: set = set()

    def visit(v: ir.Value) -> bool:
        if isinstance(v.owner, ir.Block):
            return False
        op = v.owner.operation
        if op in seen:
            return True
        seen.add(op)
        if not all(visit(used) for used in _used_values(op)):
            return False
        order.append(op)
        return True

    return order if visit(value) else None


def _tensor(shape: list[int], element: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>"


def mask_module(mask: ir.Value, ops: list[ir.Operation], shape: list[int], element: str) -> str:
    """A module whose `@mask` computes the mask alone (its ops printed with the names the
    model gives them) and returns it widened to f32."""
    function = ops[-1].parent
    while function.name not in ("func.func", "util.func"):
        function = function.parent
    state = ir.AsmState(function)
    initial = _initial_values(function.parent)
    lines = []
    for op in ops:
        if op.name == "util.global.load":  # a hoisted constant: its value
            value = initial.get(ir.FlatSymbolRefAttr(op.attributes["global"]).value)
            if value is None:
                raise ValueError("the mask reads a global an initializer computes")
            lines.append(f"{op.results[0].get_name(state)} = arith.constant {value}")
            continue
        text = []
        op.print(state, file=_Lines(text))
        lines.append("".join(text))
    rank = len(shape)
    dims = ", ".join(f"d{i}" for i in range(rank))
    identity = f"affine_map<({dims}) -> ({dims})>"
    source, wide = _tensor(shape, element), _tensor(shape, "f32")
    name = mask.get_name(state)
    parallel = ", ".join(['"parallel"'] * rank)
    body = "\n".join(lines)
    return (
        f"func.func @mask() -> {wide} {{\n{body}\n"
        f"%widen_out = tensor.empty() : {wide}\n"
        f"%widened = linalg.generic {{indexing_maps = [{identity}, {identity}], "
        f"iterator_types = [{parallel}]}} ins({name} : {source}) outs(%widen_out : {wide}) {{\n"
        f"^bb0(%a: {element}, %b: f32):\n"
        + _widened(element)
        + f"  linalg.yield {'%w' if element != 'f32' else '%a'} : f32\n"
        f"}} -> {wide}\n"
        f"return %widened : {wide}\n}}\n"
    )


def _initial_values(module: ir.Operation) -> dict[str, ir.Attribute]:
    """Each global of `module` that no initializer stores to, by name: its initial value
    (what IREE hoisted out of a function, an arange say), for a mask computed from it."""
    stored = {
        ir.FlatSymbolRefAttr(op.attributes["global"]).value
        for op in walk_ops(module)
        if op.name == "util.global.store"
    }
    return {
        ir.StringAttr(op.attributes["sym_name"]).value: op.attributes["initial_value"]
        for op in module.regions[0].blocks[0].operations
        if op.name == "util.global"
        and "initial_value" in op.attributes
        and ir.StringAttr(op.attributes["sym_name"]).value not in stored
    }


def _widened(element: str) -> str:
    """The mask module's body line that widens an element `%a` to f32 `%w` (a keep mask's
    true to 1.0)."""
    if element == "f32":
        return ""
    cast = "arith.uitofp" if element in KEEP_MASKS else "arith.extf"
    return f"  %w = {cast} %a : {element} to f32\n"


class _Lines:
    """A file-like sink for Operation.print."""

    def __init__(self, parts: list[str]):
        self.parts = parts

    def write(self, text: str) -> None:
        self.parts.append(text)


def evaluate_mask(text: str, work_dir: str) -> np.ndarray:
    """The mask's values: the module compiled for the CPU and run once."""
    os.makedirs(work_dir, exist_ok=True)
    vmfb = compiler.compile_str(
        text, target_backends=["llvm-cpu"], extra_args=["--iree-llvmcpu-target-cpu=generic"]
    )
    config = runtime.Config("local-task")
    context = runtime.SystemContext(config=config)
    context.add_vm_module(runtime.VmModule.copy_buffer(config.vm_instance, vmfb))
    return np.asarray(context.modules.module["mask"]().to_host())


def is_causal(values: np.ndarray, problem: AttentionProblem) -> bool:
    """Whether the mask (in the op's layout) lets query row i see keys 0..i and hides the
    rest, for every batch entry (top-left aligned, as torch's is_causal): an additive
    mask 0 and at most HIDDEN, a keep mask (as f32) 1 and 0."""
    loops = problem.operand_loops[MASK_OPERAND - 1]
    m, k2 = problem.positions("m")[0], problem.positions("k2")[0]
    if m not in loops or k2 not in loops:
        return False
    order = [i for i in loops if i not in (m, k2)] + [m, k2]
    plane = np.transpose(values, [loops.index(i) for i in order])
    rows, keys = plane.shape[-2:]
    visible = np.tri(rows, keys, dtype=bool)
    if problem.mask_type in KEEP_MASKS:
        return bool(np.all(plane[..., visible] == 1) and np.all(plane[..., ~visible] == 0))
    return bool(np.all(plane[..., visible] == 0) and np.all(plane[..., ~visible] <= HIDDEN))


def mask_is_causal(op: ir.Operation, problem: AttentionProblem, work_dir: str) -> bool:
    """The mask operand is computed from constants alone and its values are causal."""
    if problem.mask_type not in (*FLOAT_MASKS, *KEEP_MASKS):
        return False
    if not problem.positions("m"):  # a decode step's single query row: no diagonal to read
        return False
    mask = op.operands[MASK_OPERAND]
    ops = constant_slice(mask)
    if ops is None:
        return False
    shape = problem.operand_shape(MASK_OPERAND - 1)
    try:
        text = mask_module(mask, ops, shape, problem.mask_type)
        values = evaluate_mask(text, work_dir)
    except (RuntimeError, ValueError, CompilerToolError):  # not built or run: not proven
        return False
    return is_causal(values, problem)
