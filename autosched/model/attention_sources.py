"""K and V as the model holds them before SDPA repeats them: the copies the flash kernel
absorbs (issue 24).

At global optimization transformers' grouped-query attention takes K and V broadcast to
every query head (`repeat_kv`: on a Llama-3-8B layer 256 MB written per call) and V
transposed to head dim x keys: each a `linalg.generic` that only copies (its input map
drops or permutes dims), then a `tensor.collapse_shape` that merges the KV-head and group
dims into the op's batch. IREE runs each copy as a dispatch of its own before the custom
kernel (0.06 and 0.03 ms on that layer in the H200).

The flash kernel reads every operand through strides, up to three batch loops. So the same
attention is written over the copies' sources: the batch loop the collapse merged is split
into the copy's dims (the query and output keep their memory, read as the split shape), and
K's and V's loops are those the copy's input map reads. A dim the map drops is a loop the
source does not index: stride 0, the kernel reads one KV head for the whole group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.ops.attention import AttentionProblem, read_attention
from autosched.ops.base import ANY_OP, ANY_VALUE, DispatchSite

ABSORBED = (0, 1, 2)  # Q, K and V
COLLAPSE = "tensor.collapse_shape"


@dataclass(frozen=True)
class CopySource:
    """A copy that makes an attention operand: its input (the tensor the kernel reads) and
    output types and its input map, as the spec's matcher compares them."""

    operand: int  # 1 (K) or 2 (V)
    source_type: str
    copy_type: str
    input_map: str  # e.g. affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>
    element: str
    rank: int  # the copy's
    collapsed: bool  # a collapse_shape between the copy and the attention


@dataclass(frozen=True)
class AbsorbedAttention:
    """An attention written over the sources of its copied operands."""

    problem: AttentionProblem  # the same attention, batch loops split, K and V as sources
    sources: tuple[CopySource, ...]


def _producer(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def _maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]


def _copy(op: ir.Operation | None) -> list[int] | None:
    """The output dim each input dim of a generic that only copies its one input reads (its
    input map's results), or None where `op` is not such a copy."""
    if op is None or op.name != "linalg.generic" or len(op.operands) != 2:
        return None
    body = list(op.regions[0].blocks[0].operations)
    block = op.regions[0].blocks[0]
    if len(body) != 1 or list(body[0].operands) != [block.arguments[0]]:
        return None
    source, out = _maps(op)
    if out != ir.AffineMap.get_identity(out.n_dims, context=op.context):
        return None
    dims = [e.position if isinstance(e, ir.AffineDimExpr) else None for e in source.results]
    return None if None in dims or len(set(dims)) != len(dims) else dims


def _reassociation(op: ir.Operation) -> list[list[int]]:
    groups = ir.ArrayAttr(op.attributes["reassociation"])
    return [[ir.IntegerAttr(d).value for d in ir.ArrayAttr(g)] for g in groups]


def _copied(op: ir.Operation, operand: int):
    """(copy op, its dims' groups per operand dim, collapsed) of an operand made by a copy
    (through one collapse_shape), or None."""
    value, groups, collapsed = op.operands[operand], None, False
    producer = _producer(value)
    if producer is not None and producer.name == COLLAPSE:
        groups, collapsed = _reassociation(producer), True
        producer = _producer(producer.operands[0])
    dims = _copy(producer)
    if dims is None:
        return None
    rank = len(ir.RankedTensorType(producer.results[0].type).shape)
    return producer, dims, groups or [[d] for d in range(rank)], collapsed


def absorbed_attention(op: ir.Operation, problem: AttentionProblem) -> AbsorbedAttention | None:
    """The attention over the sources of its copied K and V, or None where neither is a
    copy, a merged loop is not a batch loop, or K and V split a loop differently."""
    copies = {i: _copied(op, i) for i in ABSORBED}
    copies = {i: c for i, c in copies.items() if c is not None}
    if not copies:
        return None
    splits: dict[int, list[int]] = {}  # an old loop -> the sizes it splits into
    for operand, (copy, _, groups, _) in copies.items():
        shape = ir.RankedTensorType(copy.results[0].type).shape
        for loop, group in zip(problem.operand_loops[operand], groups, strict=True):
            sizes = [shape[d] for d in group]
            if len(sizes) > 1 and (problem.loops[loop] != "b" or splits.get(loop, sizes) != sizes):
                return None
            if len(sizes) > 1:
                splits[loop] = sizes
    new_loops: list[list[int]] = []  # each old loop's new loops
    roles, sizes = [], []
    for loop, role in enumerate(problem.loops):
        parts = splits.get(loop, [problem.loop_sizes[loop]])
        new_loops.append(list(range(len(roles), len(roles) + len(parts))))
        roles += [role] * len(parts)
        sizes += parts
    operand_loops = [
        tuple(n for loop in loops for n in new_loops[loop]) for loops in problem.operand_loops
    ]
    sources = []
    for operand, (copy, dims, _, collapsed) in copies.items():
        out_dims = operand_loops[operand]  # the copy's output dims, as new loops
        operand_loops[operand] = tuple(out_dims[d] for d in dims)
        input_map = f"affine_map<{_maps(copy)[0]}>"
        source_type, copy_type = (str(v.type) for v in copy.operands)
        element = str(ir.RankedTensorType(copy.operands[0].type).element_type)
        rank = len(ir.RankedTensorType(copy.results[0].type).shape)
        sources.append(
            CopySource(operand, source_type, copy_type, input_map, element, rank, collapsed)
        )
    absorbed = replace(
        problem, loops=tuple(roles), loop_sizes=tuple(sizes), operand_loops=tuple(operand_loops)
    )
    return AbsorbedAttention(absorbed, tuple(sources))


def model_absorbed(module: ir.Module, problem: AttentionProblem) -> AbsorbedAttention | None:
    """The problem's absorbed form in the module, where every one of its attention ops has
    the same (the spec matches the copies by type and map)."""
    from autosched.model.attention_ops import ATTENTION

    forms = [
        absorbed_attention(op, problem)
        for op in walk_ops(module.operation)
        if op.name == ATTENTION and _same_attention(op, problem)
    ]
    return forms[0] if forms and all(form == forms[0] for form in forms) else None


def _same_attention(op: ir.Operation, problem: AttentionProblem) -> bool:
    """Whether the attention op has the problem's loops, sizes, layout and types (every op
    of a transformers model has the same location: SDPA's)."""
    found = read_attention(op, DispatchSite("", "", 1, (), ""))
    fields = ("loops", "loop_sizes", "operand_loops", "query_type", "key_type", "value_type")
    fields += ("mask_type", "scale")
    return isinstance(found, AttentionProblem) and all(
        getattr(found, name) == getattr(problem, name) for name in fields
    )


def winners_absorbed(
    model_path: str, compile_flags, work_dir: str, problems: list[AttentionProblem]
) -> dict[str, AbsorbedAttention]:
    """Each attention problem's absorbed form (by name) in the model as the substitution
    spec sees it (model/convolution_ops.fused_model), where it has one."""
    from autosched.model.convolution_ops import fused_model

    module = ir.Module.parseFile(fused_model(model_path, compile_flags, work_dir), ir.Context())
    found = {problem.name: model_absorbed(module, problem) for problem in problems}
    return {name: form for name, form in found.items() if form is not None}


def copy_matcher_lines(absorbed: AbsorbedAttention) -> list[str]:
    """Transform lines that match each copied operand of the attention `%op` as its copy
    (through the collapse), bound to `%copy{operand}`."""
    lines = []
    for source in absorbed.sources:
        handle, rank = f"%copy{source.operand}", source.rank
        made = f"%collapse{source.operand}" if source.collapsed else handle
        lines.append(
            f"    {made} = transform.get_producer_of_operand %op[{source.operand}]"
            f" : ({ANY_OP}) -> {ANY_OP}"
        )
        if source.collapsed:
            lines += [
                f'    transform.match.operation_name {made} ["{COLLAPSE}"] : {ANY_OP}',
                f"    {handle} = transform.get_producer_of_operand {made}[0]"
                f" : ({ANY_OP}) -> {ANY_OP}",
            ]
        dims = ", ".join(f"d{i}" for i in range(rank))
        parallel = ", ".join(['"parallel"'] * rank)
        element = source.element
        lines += [
            f"    %in{source.operand}, %out{source.operand} = "
            f"transform.iree.match.cast_compatible_dag_from_root {handle} {{",
            f"    ^bb0(%in: {source.source_type}, %out: {source.copy_type}):",
            f"      %r = linalg.generic {{indexing_maps = [{source.input_map}, "
            f"affine_map<({dims}) -> ({dims})>], iterator_types = [{parallel}]}} "
            f"ins(%in : {source.source_type}) outs(%out : {source.copy_type}) {{",
            f"      ^bb1(%a: {element}, %b: {element}):",
            f"        linalg.yield %a : {element}",
            f"      }} -> {source.copy_type}",
            f"    }} : ({ANY_OP}) -> ({ANY_VALUE}, {ANY_VALUE})",
        ]
    return lines


def absorbed_function(
    name: str, kernel: str, original: AttentionProblem, absorbed: AbsorbedAttention
) -> str:
    """`name(q, k, v) -> out` in the op's types, K and V as their copies' sources where
    absorbed: the others read as the split shape (a reshape, no copy), the kernel called on
    them, and its output reshaped back to the op's."""
    from autosched.targets.cuda_flash_attention import operand_tensor_types

    inputs, out = operand_tensor_types(original)
    wanted, result = operand_tensor_types(absorbed.problem)
    sources = {s.operand: s.source_type for s in absorbed.sources}
    arguments = [sources.get(i, inputs[i]) for i in range(3)]
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(arguments))
    lines = [f"  util.func private @{name}({params}) -> {out} {{"]
    values = []
    for i, (given, kernel_type) in enumerate(zip(arguments, wanted, strict=True)):
        if given == kernel_type:
            values.append(f"%a{i}")
            continue
        lines.append(f"    %r{i} = flow.tensor.reshape %a{i} : {given} -> {kernel_type}")
        values.append(f"%r{i}")
    lines += [
        f"    %o = util.call @{kernel}({', '.join(values)}) : ({', '.join(wanted)}) -> {result}",
        f"    %out = flow.tensor.reshape %o : {result} -> {out}",
        f"    util.return %out : {out}",
        "  }",
    ]
    return "\n".join(lines) + "\n"
