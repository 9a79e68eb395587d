"""Torch ops IREE 3.13 does not lower, rewritten before lowering into torch ops it does.

torch's exporter (iree-turbine, torch-mlir's FX importer) writes an aten op that torch-mlir
has no op definition for as a generic `torch.operator "torch.aten.NAME"`; IREE's torch
conversion has no pattern for it and stops with "failed to legalize operation
'torch.operator'". Some ops torch-mlir defines have no lowering either (`__and__.Tensor`).
transformers' mask code uses both (`torch.diff`, `&` of masks), so every `*ForCausalLM`
export stops there. `REWRITES` maps such an op's aten name to a function that builds the same
result from ops IREE lowers (the torch dialect's own ops, created with the MLIR bindings where
the op stood, with its location); the next op is one function and one line.

An operator left over that no rewrite covers is judged by IREE itself, not by a list kept
here: `iree-compile --compile-to=input` runs only the input conversion (a tenth of a second on
a small model), and its "failed to legalize" names the op. IREE lowers some operators (every
`onnx.*` op of an imported ONNX model), and a list would go stale with each IREE release.

iree.compiler ships no Python builders for the torch dialect: a vtensor type is parsed from
its spelling, as IREE's own FX importer (`iree.compiler.extras.fx_importer`) builds it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from iree.compiler import ir

from autosched import processes
from autosched.compile import compiler_path
from autosched.ir_walk import defining_op, walk_ops

OPERATOR = "torch.operator"
PROBE_PHASE = "input"  # iree-compile's phase that runs the torch conversion, and no more
PROBE_TIMEOUT = 120.0
NOT_LEGALIZED = "failed to legalize operation 'torch.operator'"
# Operators IREE's input conversion lowers itself: an imported ONNX model is all of them.
LOWERED_PREFIXES = ("onnx.",)
WAY_OUT = (
    "export the model with a decomposition for it (torch.export's run_decompositions),"
    " or open an issue"
)


@dataclass
class UnloweredOp(Exception):
    """A torch op that cannot reach IREE: no rewrite covers it, or its rewrite refused it."""

    name: str
    location: ir.Location
    why: str


# ---------------------------------------------------------------------------------------------
# Torch values and ops, built with the bindings


@dataclass(frozen=True)
class VTensor:
    """A `!torch.vtensor<[d0,d1,...],dtype>` type: sizes (None for `?`) and element type."""

    shape: tuple[int | None, ...]
    dtype: str

    @staticmethod
    def of(value: ir.Value) -> VTensor:
        text = str(value.type)
        head, tail = "!torch.vtensor<[", ">"
        if not (text.startswith(head) and text.endswith(tail) and "]," in text):
            raise ValueError(f"not a ranked !torch.vtensor: {text}")
        sizes, dtype = text[len(head) : -len(tail)].split("],", 1)
        dims = tuple(None if d == "?" else int(d) for d in sizes.split(",") if d)
        return VTensor(dims, dtype)

    def with_size(self, dim: int, size: int | None) -> VTensor:
        shape = list(self.shape)
        shape[dim] = size
        return VTensor(tuple(shape), self.dtype)

    def type_text(self) -> str:
        """As a tensor type reads: 1x?xsi64."""
        return "x".join([*("?" if d is None else str(d) for d in self.shape), self.dtype])

    def type(self) -> ir.Type:
        sizes = ",".join("?" if d is None else str(d) for d in self.shape)
        return ir.Type.parse(f"!torch.vtensor<[{sizes}],{self.dtype}>")


def _create(name: str, result: ir.Type, operands: list[ir.Value]) -> ir.Value:
    """A torch op at the insertion point and location in force; its one result."""
    return ir.Operation.create(name, results=[result], operands=operands).result


def _int(value: int) -> ir.Value:
    attribute = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    op = ir.Operation.create(
        "torch.constant.int", results=[ir.Type.parse("!torch.int")], attributes={"value": attribute}
    )
    return op.result


def _none() -> ir.Value:
    return ir.Operation.create("torch.constant.none", results=[ir.Type.parse("!torch.none")]).result


def constant_int(value: ir.Value) -> int | None:
    """The integer a `torch.constant.int` holds; None for anything computed."""
    op = defining_op(value)
    if op is None or op.name != "torch.constant.int":
        return None
    return ir.IntegerAttr(op.attributes["value"]).value


def is_none(value: ir.Value) -> bool:
    return str(value.type) == "!torch.none"


def cat(tensors: list[ir.Value], dim: int) -> ir.Value:
    """torch.aten.cat of `tensors` along `dim` (non-negative); one tensor is itself."""
    if len(tensors) == 1:
        return tensors[0]
    types = [VTensor.of(t) for t in tensors]
    sizes = [t.shape[dim] for t in types]
    total = None if None in sizes else sum(sizes)
    listed = ir.Operation.create(
        "torch.prim.ListConstruct",
        results=[ir.Type.parse("!torch.list<vtensor>")],
        operands=tensors,
    ).result
    return _create("torch.aten.cat", types[0].with_size(dim, total).type(), [listed, _int(dim)])


def slice_dim(tensor: ir.Value, dim: int, start: int, end: int | None) -> ir.Value:
    """torch.aten.slice.Tensor: tensor[start:end] along `dim` (end None: to the end; a
    negative end counts from it), step 1."""
    old = VTensor.of(tensor)
    size = old.shape[dim]
    if size is not None:
        stop = size if end is None else (end if end >= 0 else size + end)
        size = max(0, min(stop, size) - start)
    stop_value = _none() if end is None else _int(end)
    result = old.with_size(dim, size).type()
    operands = [tensor, _int(dim), _int(start), stop_value, _int(1)]
    return _create("torch.aten.slice.Tensor", result, operands)


# ---------------------------------------------------------------------------------------------
# The rewrites: op name -> a function that returns the op's replacement value


def rewrite_diff(op: ir.Operation) -> ir.Value:
    """torch.diff(x, n, dim, prepend, append): prepend and append are joined to x along dim
    once, then each of the n steps takes slice [1:] minus slice [:-1] (for bool tensors
    `!=`, as torch takes the exclusive or)."""
    x, order, axis, prepend, append = op.operands
    n, dim = constant_int(order), constant_int(axis)
    if n is None or dim is None:
        raise UnloweredOp(
            "torch.aten.diff", op.location, "has an order or dim that is not a constant: " + WAY_OUT
        )
    if n < 1:
        raise UnloweredOp("torch.aten.diff", op.location, f"has order {n}: torch wants n >= 1")
    dim = dim % len(VTensor.of(x).shape)
    current = cat([t for t in (prepend, x, append) if not is_none(t)], dim)
    for step in range(n):
        later, earlier = slice_dim(current, dim, 1, None), slice_dim(current, dim, 0, -1)
        result = VTensor.of(later).type() if step < n - 1 else op.results[0].type
        if VTensor.of(later).dtype == "i1":
            current = _create("torch.aten.ne.Tensor", result, [later, earlier])
        else:
            current = _create("torch.aten.sub.Tensor", result, [later, earlier, _int(1)])
    return current


def rewrite_and(op: ir.Operation) -> ir.Value:
    """`a & b` on tensors (transformers' `and_masks`) as torch.aten.bitwise_and.Tensor, what
    torch itself runs for it: IREE 3.13 lowers `__or__.Tensor` but not `__and__.Tensor`."""
    return _create("torch.aten.bitwise_and.Tensor", op.results[0].type, list(op.operands))


# The aten op's name, whether the exporter wrote it as a `torch.operator` (no op definition
# in torch-mlir) or as the op itself (defined, but IREE fails on the form the model has).
REWRITES: dict[str, Callable[[ir.Operation], ir.Value | None]] = {
    "torch.aten.diff": rewrite_diff,
    "torch.aten.__and__.Tensor": rewrite_and,
}


def operator_name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["name"]).value


def torch_name(op: ir.Operation) -> str:
    """The aten name of a torch op: a `torch.operator`'s `name`, else the op's own."""
    return operator_name(op) if op.name == OPERATOR else op.name


def rewrite_torch_ops(module: ir.Module) -> int:
    """Every op of `module` that a rewrite in REWRITES replaces, replaced in place (the
    others are left as they are); returns how many. A rewrite that refuses its op raises
    UnloweredOp."""
    rewritten = 0
    for op in [op for op in walk_ops(module.operation) if torch_name(op) in REWRITES]:
        with op.location, ir.InsertionPoint(op):
            try:
                replacement = REWRITES[torch_name(op)](op)
            except ValueError as error:  # an operand the rewrite cannot type (unranked)
                raise UnloweredOp(torch_name(op), op.location, f"{error}: {WAY_OUT}") from None
        if replacement is not None:
            op.results[0].replace_all_uses_with(replacement)
            op.erase()
            rewritten += 1
    return rewritten


def unrewritten_operators(module: ir.Module) -> list[ir.Operation]:
    """The `torch.operator` ops that IREE may not lower (not onnx.*), rewritten or not."""
    return [
        op
        for op in walk_ops(module.operation)
        if op.name == OPERATOR and not operator_name(op).startswith(LOWERED_PREFIXES)
    ]


# ---------------------------------------------------------------------------------------------
# A model file, rewritten for iree-compile


@lru_cache(maxsize=64)
def _needs_rewrite(path: str, stamp: tuple[int, int]) -> bool:
    """Whether the module at `path` holds an op REWRITES covers or a `torch.operator` IREE
    may not lower (cached per file version: a run prepares the same model several times).
    A file that does not parse is left to iree-compile, which says why."""
    try:
        module = ir.Module.parseFile(path, ir.Context())
    except (ir.MLIRError, OSError, ValueError, RuntimeError):
        return False
    return bool(unrewritten_operators(module)) or any(
        torch_name(op) in REWRITES for op in walk_ops(module.operation)
    )


def _stamp(path: str) -> tuple[int, int]:
    status = os.stat(path)
    return status.st_mtime_ns, status.st_size


def _probe_failure(path: str) -> str | None:
    """iree-compile's "failed to legalize" line for `path`'s torch conversion; None when it
    converts (or fails for another reason, which the lowering itself reports)."""
    command = [compiler_path(), path, f"--compile-to={PROBE_PHASE}", "-o", os.devnull]
    finished = processes.run(command, PROBE_TIMEOUT)
    if finished.returncode == 0 or finished.timed_out:
        return None
    return next((line for line in finished.stderr.splitlines() if NOT_LEGALIZED in line), None)


def check_lowered(path: str, leftovers: list[ir.Operation]) -> None:
    """UnloweredOp for the first of `leftovers` that IREE's torch conversion refuses."""
    if not leftovers:
        return
    line = _probe_failure(path)
    if line is None:
        return
    named = [op for op in leftovers if f'"{operator_name(op)}"' in line] or leftovers
    raise UnloweredOp(
        operator_name(named[0]),
        named[0].location,
        "has no lowering in IREE 3.13 and no rewrite in autosched (autosched/model/torch_ops.py): "
        + WAY_OUT,
    )


def rewrite_model(path: str, work_dir: str) -> str:
    """The torch-dialect model at `path` with REWRITES applied, as bytecode in `work_dir`,
    or `path` itself when it holds nothing to rewrite and no `torch.operator` to check.
    Raises UnloweredOp for an op that neither a rewrite nor IREE lowers."""
    if not _needs_rewrite(os.path.abspath(path), _stamp(path)):
        return path
    module = ir.Module.parseFile(path, ir.Context())
    rewrite_torch_ops(module)
    os.makedirs(work_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(path))[0]
    out = os.path.join(work_dir, stem + ".rewritten.mlirbc")
    partial = f"{out}.{os.getpid()}.{threading.get_ident()}"  # two stages may prepare at once
    with open(partial, "wb") as file:
        module.operation.write_bytecode(file)
    os.replace(partial, out)
    check_lowered(out, unrewritten_operators(module))  # what the rewrites left
    return out
