"""An attention's operands as the model holds them before SDPA's copies, and its result
where the copy after it would put it: the layout ops the flash kernel absorbs (issue 24).

At global optimization transformers' grouped-query attention takes K and V broadcast to
every query head (`repeat_kv`: on a Llama-3-8B layer 256 MB written per call) and V
transposed to head dim x keys: each a `linalg.generic` that only copies (its input map
drops or permutes dims), then a `tensor.collapse_shape` that merges the KV-head and group
dims into the op's batch. Its result is expanded and transposed back to sequence x heads x
head dim for the output projection, another copy. IREE runs each copy as a dispatch of its
own beside the custom kernel (0.06, 0.03 and 0.05 ms on that layer in the H200).

The flash kernel reads and writes every operand through strides, up to three batch loops.
So the same attention is written over the copies' sources: a batch loop a reshape merged is
split into the copy's dims (an operand that is no copy keeps its memory, read as the split
shape), and a copied operand's loops are those the copy's map reads or writes. A dim the
map drops is a loop the source does not index: stride 0, one KV head read for the whole
group.

GPT-2 (and other models with one fused q/k/v projection) slices Q, K and V out of the
projection's last dim (`tensor.extract_slice`) before it splits heads: IREE copies each
slice out (three copies of the projection's bytes). Such an operand is read from the
projection itself: its first element's offset, and its rows the whole projection apart
(`AttentionProblem.views`); the kernel takes the projection three times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from iree.compiler import ir

from autosched.ir_walk import defining_op, indexing_maps, walk_ops
from autosched.kernels.attention_layout import kernel_inputs, operand_tensor_types
from autosched.ops.attention import AttentionProblem, read_attention
from autosched.ops.base import ANY_OP, ANY_VALUE, DispatchSite
from autosched.rewrite.attention_ops import ATTENTION
from autosched.rewrite.builders import call, copy_dag, reshape, util_function
from autosched.rewrite.common import COLLAPSE, EXPAND, read_fused_model, reassociation, single_user
from autosched.rewrite.common import tensor_shape as _shape

ABSORBED = (0, 1, 2)  # Q, K and V
SLICE = "tensor.extract_slice"


@dataclass(frozen=True)
class CopySource:
    """A copy that makes an attention operand: its input (the tensor the kernel reads) and
    output types and its input map, as the spec's matcher compares them."""

    operand: int  # 0 (Q), 1 (K), 2 (V), or the output
    source_type: str
    copy_type: str
    input_map: str  # e.g. affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>
    element: str
    rank: int  # the copy's
    reshaped: bool  # a collapse_shape (an input) or expand_shape (the output) in between
    # An input copied from a slice of a wider tensor's last dim (GPT-2's fused q/k/v, split
    # by extract_slice, then expand_shape into heads): that tensor's type and the view
    # (offset, sliced extent, full extent); the kernel reads the wider tensor itself.
    whole_type: str = ""
    view: tuple[int, int, int] = (0, 0, 0)

    @property
    def read_type(self) -> str:
        """The tensor the kernel function takes for this operand."""
        return self.whole_type or self.source_type


@dataclass(frozen=True)
class AbsorbedAttention:
    """An attention written over the sources of its copied operands."""

    problem: AttentionProblem  # the same attention, batch loops split, copies' sources read
    sources: tuple[CopySource, ...]

    @property
    def inputs(self) -> list[CopySource]:
        return [source for source in self.sources if source.operand in ABSORBED]

    @property
    def output(self) -> CopySource | None:
        """The transposing copy of the result whose layout the kernel writes, if any."""
        return next((s for s in self.sources if s.operand not in ABSORBED), None)


def _copy(op: ir.Operation | None) -> list[int] | None:
    """The output dim each input dim of a generic that only copies its one input reads (its
    input map's results), or None where `op` is not such a copy."""
    if op is None or op.name != "linalg.generic" or len(op.operands) != 2:
        return None
    body = list(op.regions[0].blocks[0].operations)
    block = op.regions[0].blocks[0]
    if len(body) != 1 or list(body[0].operands) != [block.arguments[0]]:
        return None
    source, out = indexing_maps(op)
    if out != ir.AffineMap.get_identity(out.n_dims, context=op.context):
        return None
    dims = [e.position if isinstance(e, ir.AffineDimExpr) else None for e in source.results]
    return None if None in dims or len(set(dims)) != len(dims) else dims


def _slice_view(copy: ir.Operation) -> tuple[ir.Value, tuple[int, int, int]] | None:
    """(the wider tensor, (offset, sliced extent, full extent)) where the copy's input is
    an expand_shape of a static, unit-step extract_slice of its last dim alone; else None."""
    expand = defining_op(copy.operands[0])
    if expand is None or expand.name != EXPAND:
        return None
    taken = defining_op(expand.operands[0])
    if taken is None or taken.name != SLICE or len(taken.operands) != 1:
        return None
    offsets, sizes, steps = (
        list(ir.DenseI64ArrayAttr(taken.attributes[f"static_{name}"]))
        for name in ("offsets", "sizes", "strides")
    )
    whole = _shape(taken.operands[0])
    if len(sizes) != len(whole) or set(steps) != {1}:
        return None
    if any(offsets[:-1]) or sizes[:-1] != whole[:-1] or _shape(taken.results[0]) != sizes:
        return None
    return taken.operands[0], (offsets[-1], sizes[-1], whole[-1])


def _copied(op: ir.Operation, operand: int):
    """(copy op, the copy's output dim each of its input dims reads, the copy's output dims
    grouped per operand dim, collapsed) of an operand made by a copy (through one
    collapse_shape), or None."""
    value, groups, collapsed = op.operands[operand], None, False
    producer = defining_op(value)
    if producer is not None and producer.name == COLLAPSE:
        groups, collapsed = reassociation(producer), True
        producer = defining_op(producer.operands[0])
    dims = _copy(producer)
    if dims is None:
        return None
    rank = len(ir.RankedTensorType(producer.results[0].type).shape)
    return producer, dims, groups or [[d] for d in range(rank)], collapsed


def _output_copy(op: ir.Operation):
    """(copy op, its dims, the copy's input dims grouped per output dim, expanded) of the
    attention's result when its only user is a transposing copy (through one
    expand_shape), or None."""
    user, groups, expanded = single_user(op.results[0]), None, False
    if user is not None and user.name == EXPAND:
        groups, expanded = reassociation(user), True
        user = single_user(user.results[0])
    dims = _copy(user)
    rank = len(ir.RankedTensorType(op.results[0].type).shape)
    if dims is None or sorted(dims) != list(range(len(dims))):  # a transpose: no broadcast
        return None
    return user, dims, groups or [[d] for d in range(rank)], expanded


def _splits(problem: AttentionProblem, copies: dict) -> dict[int, list[int]] | None:
    """Each loop a copy's reshape splits, into its dims' sizes (unit dims left out), or
    None where a split loop is not a batch loop or two copies split it differently.
    `copies`: operand -> (its copy-side dims grouped per operand dim, their shape)."""
    splits: dict[int, list[int]] = {}
    for operand, (groups, shape) in copies.items():
        for loop, group in zip(problem.operand_loops[operand], groups, strict=True):
            sizes = [shape[d] for d in group if shape[d] != 1]
            if len(sizes) < 2:
                continue
            if problem.loops[loop] != "b" or splits.get(loop, sizes) != sizes:
                return None
            splits[loop] = sizes
    return splits


def _dim_loops(loops: tuple[int, ...], groups, shape, new_loops) -> list[list[int]] | None:
    """The new loops each copy-side dim of an operand indexes, outermost first: one per
    dim of a split loop's group, all of them where one dim holds the whole split loop
    (merged, in the same order), none for a unit dim; None where they do not line up."""
    found: list[list[int]] = [[] for _ in shape]
    for loop, group in zip(loops, groups, strict=True):
        wide = [d for d in group if shape[d] != 1] or group[:1]
        parts = new_loops[loop]
        if len(wide) == len(parts):
            for d, new in zip(wide, parts, strict=True):
                found[d] = [new]
        elif len(wide) == 1:
            found[wide[0]] = list(parts)
        else:
            return None
    return found


def absorbed_attention(
    op: ir.Operation, problem: AttentionProblem, output: bool = False
) -> AbsorbedAttention | None:
    """The attention over the sources of its copied Q, K and V (with `output`: writing what
    the transposing copy of its result writes, or None without one), or None where no
    operand is a copy, a merged loop is not a batch loop, or two copies split it
    differently."""
    copies = {i: _copied(op, i) for i in ABSORBED}
    copies = {i: c for i, c in copies.items() if c is not None}
    out = len(problem.operand_loops) - 1
    if output:
        copies[out] = _output_copy(op)
        if copies[out] is None:
            return None
    if not copies:
        return None
    # The copy-side shape of each: a copy's output for an input, its input for the output.
    sides = {
        i: (copy, dims, groups, reshaped, _shape(copy.operands[0] if i == out else copy.results[0]))
        for i, (copy, dims, groups, reshaped) in copies.items()
    }
    splits = _splits(problem, {i: (side[2], side[4]) for i, side in sides.items()})
    if splits is None:
        return None
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
    sources, views = [], [(0, 0, 0)] * len(ABSORBED)
    for operand, (copy, dims, groups, reshaped, shape) in sides.items():
        side = _dim_loops(problem.operand_loops[operand], groups, shape, new_loops)
        if side is None:
            return None
        if operand == out:  # the copy's output dim o is its input dim dims.index(o)
            loops = [side[dims.index(o)] for o in range(len(dims))]
        else:
            loops = [side[d] for d in dims]
        operand_loops[operand] = tuple(loop for part in loops for loop in part)
        sources.append(_source(operand, copy, reshaped))
        if operand in ABSORBED:
            views[operand] = sources[-1].view
    absorbed = replace(
        problem, loops=tuple(roles), loop_sizes=tuple(sizes), operand_loops=tuple(operand_loops),
        views=tuple(views) if any(v != (0, 0, 0) for v in views) else (),
    )  # fmt: skip
    return AbsorbedAttention(absorbed, tuple(sources))


def _source(operand: int, copy: ir.Operation, reshaped: bool) -> CopySource:
    source_type, copy_type = (str(v.type) for v in copy.operands)
    sliced = _slice_view(copy) if operand in ABSORBED else None
    whole, view = (str(sliced[0].type), sliced[1]) if sliced else ("", (0, 0, 0))
    return CopySource(
        operand=operand,
        source_type=source_type,
        copy_type=copy_type,
        input_map=f"affine_map<{indexing_maps(copy)[0]}>",
        element=str(ir.RankedTensorType(copy.operands[0].type).element_type),
        rank=len(_shape(copy.results[0])),
        reshaped=reshaped,
        whole_type=whole,
        view=view,
    )


def model_absorbed(module: ir.Module, problem: AttentionProblem) -> list[AbsorbedAttention]:
    """The problem's absorbed forms in the module, the one that writes its result's
    transposed layout first, each where every one of its attention ops has it (the spec
    matches the copies by type and map)."""
    ops = [
        op
        for op in walk_ops(module.operation)
        if op.name == ATTENTION and _same_attention(op, problem)
    ]
    found = []
    for output in (True, False):
        forms = [absorbed_attention(op, problem, output) for op in ops]
        if forms and forms[0] is not None and all(form == forms[0] for form in forms):
            found.append(forms[0])
    return found


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
) -> dict[str, list[AbsorbedAttention]]:
    """Each attention problem's absorbed forms (by name) in the model as the substitution
    spec sees it (rewrite/common.fused_model), where it has any."""
    module = read_fused_model(model_path, compile_flags, work_dir)
    found = {problem.name: model_absorbed(module, problem) for problem in problems}
    return {name: forms for name, forms in found.items() if forms}


def _copy_dag(source: CopySource, handle: str, names: str) -> list[str]:
    """Transform lines that match `handle` as the copy `source` names: its input and output
    types, its input map, a body that only yields (the values bound to `names`)."""
    return copy_dag(names, handle, source.source_type, source.copy_type, source.input_map)


def output_matcher_lines(absorbed: AbsorbedAttention) -> list[str]:
    """Transform lines that match `%root` as the transposing copy of an attention's result
    (through the expand), the attention bound to `%op`."""
    source = absorbed.output
    lines = _copy_dag(source, "%root", "%out_in, %out_out")
    made = "%expand" if source.reshaped else "%op"
    lines.append(
        f"    {made} = transform.get_producer_of_operand %root[0] : ({ANY_OP}) -> {ANY_OP}"
    )
    if source.reshaped:
        lines += [
            f'    transform.match.operation_name %expand ["{EXPAND}"] : {ANY_OP}',
            f"    %op = transform.get_producer_of_operand %expand[0] : ({ANY_OP}) -> {ANY_OP}",
        ]
    return lines


def copy_matcher_lines(absorbed: AbsorbedAttention) -> list[str]:
    """Transform lines that match each copied operand of the attention `%op` as its copy
    (through the collapse), bound to `%copy{operand}`."""
    lines = []
    for source in absorbed.inputs:
        handle = f"%copy{source.operand}"
        made = f"%collapse{source.operand}" if source.reshaped else handle
        lines.append(
            f"    {made} = transform.get_producer_of_operand %op[{source.operand}]"
            f" : ({ANY_OP}) -> {ANY_OP}"
        )
        if source.reshaped:
            lines += [
                f'    transform.match.operation_name {made} ["{COLLAPSE}"] : {ANY_OP}',
                f"    {handle} = transform.get_producer_of_operand {made}[0]"
                f" : ({ANY_OP}) -> {ANY_OP}",
            ]
        lines += _copy_dag(source, handle, f"%in{source.operand}, %out{source.operand}")
        if source.whole_type:
            lines += _slice_lines(source)
    return lines


def copied_handle(source: CopySource) -> str:
    """The handle whose operand 0 the kernel reads for a copied input: its copy's, or the
    extract_slice's (the wider tensor) where the copy reads a slice."""
    return f"%slice{source.operand}" if source.whole_type else f"%copy{source.operand}"


def _slice_lines(source: CopySource) -> list[str]:
    """Transform lines that match the copy's input as an expand_shape of an extract_slice
    of a tensor of the wider type, the slice bound to `copied_handle`. The offsets are not
    matched: every attention of the problem was read with the same ones."""
    operand, whole = source.operand, source.whole_type
    return [
        f"    %expand{operand} = transform.get_producer_of_operand %copy{operand}[0]"
        f" : ({ANY_OP}) -> {ANY_OP}",
        f'    transform.match.operation_name %expand{operand} ["{EXPAND}"] : {ANY_OP}',
        f"    %slice{operand} = transform.get_producer_of_operand %expand{operand}[0]"
        f" : ({ANY_OP}) -> {ANY_OP}",
        f'    transform.match.operation_name %slice{operand} ["{SLICE}"] : {ANY_OP}',
        f"    %whole{operand} = transform.get_operand %slice{operand}[0]"
        f" : ({ANY_OP}) -> {ANY_VALUE}",
        f"    transform.iree.match.cast_compatible_type %whole{operand} = {whole} : {ANY_VALUE}",
    ]


def absorbed_function(
    name: str, kernel: str, original: AttentionProblem, absorbed: AbsorbedAttention
) -> str:
    """`name(q, k, v[, mask]) -> out` in the op's types, Q, K and V as their copies' sources
    where absorbed: the others (and a mask tensor) read as the split shape (a reshape, no
    copy), the kernel called on them, and its output reshaped back to the op's (or to the
    output copy's, in whose layout the kernel wrote it)."""
    inputs, out = kernel_inputs(original), operand_tensor_types(original)[1]
    wanted, result = kernel_inputs(absorbed.problem), operand_tensor_types(absorbed.problem)[1]
    sources = {s.operand: s.read_type for s in absorbed.inputs}
    out = absorbed.output.copy_type if absorbed.output else out
    arguments = [sources.get(i, spelled) for i, spelled in enumerate(inputs)]

    def body(args):
        pairs = zip(args, wanted, strict=True)
        values = [v if str(v.type) == spelled else reshape(v, spelled) for v, spelled in pairs]
        return reshape(call(kernel, values, result), out)

    return util_function(name, arguments, out, body) + "\n"
