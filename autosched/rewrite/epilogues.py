"""A contraction's epilogue, kept in its Triton kernel (issues 25 and 24).

After IREE's elementwise fusion (rewrite/convolution_ops.py) a torch convolution at global
optimization is three ops: the convolution into f32, a `truncf` to the model's type, and
one elementwise `linalg.generic` that reads it: the folded batch norm's scale and shift,
the residual add, ReLU. IREE fuses all three into one dispatch; a kernel that replaced the
convolution alone wrote its output, and a dispatch of its own read it back (on resnet50 in
the H200: 47 dispatches, 0.72 ms of 2.76). A transformer's `nn.Linear` is the same, with
the unit batch collapsed (and heads split) between the matmul and its `truncf`: the bias and
GELU, the residual add, SiLU(gate) times up.

Here that generic is read with the MLIR bindings and written as Triton statements over the
kernel's accumulator tile: each other input is a vector along the output channels (the
batch norm's parameters, a bias) or a tensor in the output's own layout (the residual, the
gate), each body op (arith's float ops, `select`, `math.rsqrt`, `math.erf` ...) one
statement, a constant it captures a literal. The generic may also move the dims of the
matmul's result (BERT's bias add that puts the heads before the tokens): the kernel then
stores each element where the generic would (`PermutedStore`). Llama's RoPE reads the rounded
result twice, as it is and rotated by half in each head (rewrite/rotary.py), with cos and sin
indexed by token and head dim: the kernel rotates its tile and reads those at their offsets.

A transform matcher cannot compare a body that captures constants, so such an epilogue is
matched by its operand and result types after the contraction and its `truncf`, and only
where every epilogue of that type signature in the model has the same statements and store
(`unambiguous`). One whose body captures nothing is matched exactly, maps and body (`generic_dag`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from iree.compiler import ir
from iree.compiler.dialects import func

from autosched.ir_walk import defining_op, indexing_maps, walk_ops
from autosched.ops.convolution import ConvolutionProblem
from autosched.ops.epilogue import (
    ACC,
    CHANNEL,
    FULL,
    INDEXED,
    ROTATED,
    TRITON_TYPES,
    Epilogue,
    EpilogueInput,
    PermutedStore,
    Then,
)
from autosched.ops.matmul import MatmulProblem
from autosched.rewrite import narrow_math
from autosched.rewrite.common import (
    RESHAPES,
    is_problems_op,
    is_truncf,
    problem_key,
    read_fused_model,
    single_user,
)
from autosched.rewrite.common import element_type as _element
from autosched.rewrite.narrow_reshapes import MAX_RESHAPES
from autosched.rewrite.rotary import rotation_period, rotation_start

BINARY = {"arith.addf": "+", "arith.subf": "-", "arith.mulf": "*", "arith.divf": "/"}
CALLS = {
    "arith.maximumf": "tl.maximum",
    "arith.maxnumf": "tl.maximum",
    "arith.minimumf": "tl.minimum",
    "arith.minnumf": "tl.minimum",
    "math.absf": "tl.abs",
}
WIDE_CALLS = {
    "math.rsqrt": "tl.math.rsqrt",
    "math.sqrt": "tl.sqrt",
    "math.exp": "tl.exp",
    "math.erf": "tl.math.erf",
}
CASTS = ("arith.extf", "arith.truncf")
MAX_POWER = 4  # math.fpowi's constant exponents written as products
# arith.cmpf's predicates (its enum's order) as Python comparisons that keep NaN's answer.
PREDICATES = {
    1: "({a} == {b})",
    2: "({a} > {b})",
    3: "({a} >= {b})",
    4: "({a} < {b})",
    5: "({a} <= {b})",
    6: "(({a} < {b}) | ({a} > {b}))",
    9: "(~({a} <= {b}))",
    10: "(~({a} < {b}))",
    11: "(~({a} >= {b}))",
    12: "(~({a} > {b}))",
    13: "({a} != {b})",
}


def _literal(op: ir.Operation) -> str | None:
    """A float constant as a Triton scalar of its type, or None."""
    element = _element(op.results[0].type)
    if op.name != "arith.constant" or element not in TRITON_TYPES:
        return None
    try:
        value = ir.FloatAttr(op.attributes["value"]).value
    except ValueError:  # a tensor constant
        return None
    text = repr(value) if value == value and abs(value) != float("inf") else f"float('{value}')"
    return f"tl.full([1, 1], {text}, {TRITON_TYPES[element]})"


def _power(op: ir.Operation, names: dict, target: str) -> str | None:
    """`math.fpowi` by a constant exponent of 1 to MAX_POWER as products (GPT-2's GELU
    cubes its input); None otherwise."""
    owner = op.operands[1].owner
    base = names.get(op.operands[0])
    if base is None or isinstance(owner, ir.Block) or owner.operation.name != "arith.constant":
        return None
    exponent = ir.IntegerAttr(owner.operation.attributes["value"]).value
    if not 1 <= exponent <= MAX_POWER:
        return None
    return f"{target} = {' * '.join([base] * exponent)}"


def _statement(op: ir.Operation, names: dict, target: str) -> str | None:
    """One body op as `target = ...` (lines), its operands by `names`; None if it has no
    form."""
    if op.name == "math.fpowi":
        return _power(op, names, target)
    args = [names.get(v) for v in op.operands]
    if None in args:
        return None
    if op.name in narrow_math.FORMS and _element(op.results[0].type) in narrow_math.NARROW:
        return "\n".join(narrow_math.FORMS[op.name](target, *args))  # no slow paths
    if op.name in BINARY:
        return f"{target} = {args[0]} {BINARY[op.name]} {args[1]}"
    if op.name in WIDE_CALLS:  # Triton's math takes f32: computed there, rounded back
        return f"{target} = {WIDE_CALLS[op.name]}({args[0]}.to(tl.float32)).to({args[0]}.dtype)"
    if op.name in CALLS:
        return f"{target} = {CALLS[op.name]}({', '.join(args)})"
    if op.name in CASTS:
        element = TRITON_TYPES.get(_element(op.results[0].type))
        return f"{target} = {args[0]}.to({element})" if element else None
    if op.name == "arith.negf":
        return f"{target} = -{args[0]}"
    if op.name == "math.tanh":  # 1 - 2 / (e^2x + 1) in f32: Gluon has no tanh nor sigmoid
        wide = f"{args[0]}.to(tl.float32)"
        return f"{target} = (1.0 - 2.0 / (tl.exp(2.0 * {wide}) + 1.0)).to({args[0]}.dtype)"
    if op.name == "arith.select":
        return f"{target} = tl.where({args[0]}, {args[1]}, {args[2]})"
    if op.name == "arith.cmpf":
        form = PREDICATES.get(ir.IntegerAttr(op.attributes["predicate"]).value)
        return f"{target} = {form.format(a=args[0], b=args[1])}" if form else None
    return None


def _captures(op: ir.Operation) -> bool:
    """Whether the generic's body reads a value defined outside it (a constant)."""
    block = op.regions[0].blocks[0]
    inside = {result for body_op in block.operations for result in body_op.results}
    inside |= set(block.arguments)
    return any(value not in inside for body_op in block.operations for value in body_op.operands)


def generic_dag(op: ir.Operation) -> str:
    """The generic as the region of a transform DAG matcher (`^bb0` over its operands, then
    the op, body and maps included), which matches it exactly; "" when its body captures a
    value from outside, which such a matcher cannot follow."""
    if _captures(op):
        return ""
    types = [value.type for value in op.operands]
    with op.context, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            alone = func.FuncOp("alone", (types, [op.results[0].type]))
            block = alone.add_entry_block()
            with ir.InsertionPoint(block):
                copy = op.clone()
                for position, argument in enumerate(block.arguments):
                    copy.operands[position] = argument
                func.ReturnOp([copy.results[0]])
        text = copy.get_asm(use_local_scope=True, enable_debug_info=False)
    arguments = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(types))
    return f"^bb0({arguments}):\n{text.strip()}"


def _statements(
    op: ir.Operation, inputs: int, arguments: list[str] | None = None, prefix: str = ""
) -> list[str] | str:
    """The generic's body as Triton statements, or why it has none: its inputs named
    `arguments` (a0, a1, ...), its values `prefix`ed (a second generic's apart from the
    first's)."""
    block = op.regions[0].blocks[0]
    arguments = arguments or [f"a{i}" for i in range(inputs)]
    names: dict = {block.arguments[i]: arguments[i] for i in range(inputs)}
    lines = []
    for count, body_op in enumerate(block.operations):
        body_op = body_op.operation
        for value in body_op.operands:  # a constant captured from outside the body
            owner = value.owner
            if value in names or isinstance(owner, ir.Block) or body_op.name == "math.fpowi":
                continue
            literal = _literal(owner.operation)
            if literal is None:
                return f"its body reads {owner.operation.name} from outside"
            names[value] = f"{prefix}k{len(lines)}"
            lines.append(f"{names[value]} = {literal}")
        if body_op.name == "linalg.yield":
            return [*lines, f"out = {names[body_op.operands[0]]}"]
        target = f"{prefix}v{count}"
        if body_op.name == "arith.constant":
            literal = _literal(body_op)
            line = None if literal is None else f"{target} = {literal}"
        else:
            line = _statement(body_op, names, target)
        if line is None:
            return f"no Triton form for {body_op.name}"
        names[body_op.results[0]] = target
        lines.extend(line.splitlines())
    return "its body has no yield"


def _then(first: ir.Operation, epilogue: Epilogue) -> Epilogue:
    """`epilogue` (of a generic that rounds the f32 result itself) with the elementwise
    generic after it (through up to MAX_RESHAPES reshapes, each the only user) in the same
    kernel, where that generic reads its result as it is, in the same element type, and
    otherwise only output-shaped tensors or vectors along its last dim; `epilogue` as it is
    otherwise."""
    value, reshapes = first.results[0], 0
    user = single_user(value)
    while user is not None and user.name in RESHAPES and reshapes < MAX_RESHAPES:
        value, reshapes = user.results[0], reshapes + 1
        user = single_user(value)
    if user is None or user.name != "linalg.generic" or len(user.results) != 1:
        return epilogue
    iterators = [str(i) for i in ir.ArrayAttr(user.attributes["iterator_types"])]
    maps, inputs = indexing_maps(user), len(user.operands) - 1
    identity = ir.AffineMap.get_identity(len(iterators), context=user.context)
    last = [ir.AffineDimExpr.get(len(iterators) - 1, context=user.context)]
    acc = [i for i in range(inputs) if user.operands[i] == value]
    if any("parallel" not in i for i in iterators) or maps[-1] != identity or len(acc) != 1:
        return epilogue
    if maps[acc[0]] != identity or _element(user.results[0].type) != epilogue.out_element:
        return epilogue
    if list(user.regions[0].blocks[0].arguments[inputs].uses):
        return epilogue
    names, added, positions = [], [], []
    for position in range(inputs):
        operand, results = user.operands[position], list(maps[position].results)
        if position == acc[0]:
            names.append("out")
            continue
        kind = FULL if maps[position] == identity else CHANNEL if results == last else None
        # A vector along the last dim is the kernel's per-column one only where that dim
        # is N whole (not a head dim a reshape split N into).
        columns = ir.RankedTensorType(value.type).shape[-1] == epilogue.acc_shape[-1]
        if kind is None or (kind == CHANNEL and not columns):
            return epilogue
        names.append(f"a{len(epilogue.inputs) + len(added)}")
        added.append(_plain(operand, kind))
        positions.append(position)
    statements = _statements(user, inputs, names, prefix="t")
    if isinstance(statements, str):
        return epilogue
    then = Then(
        acc[0], tuple(positions), str(value.type), epilogue.out_type, reshapes, generic_dag(user)
    )
    return replace(
        epilogue,
        inputs=(*epilogue.inputs, *added),
        out_type=str(user.results[0].type),
        statements=(*epilogue.statements, *statements),
        then=then,
    )


def after_contraction(op: ir.Operation) -> tuple[ir.Operation | None, ir.Operation, int] | str:
    """(truncf, generic, reshapes) after a contraction: its only user a truncf (through up to
    MAX_RESHAPES reshapes, each its only user: `reshapes` of them), whose only user is a
    generic of one result; or why not. A matmul's only user may also be a generic that
    reads the f32 result itself and rounds what it computes (torch's `addmm` in f16: the
    bias added in f32, then rounded), or a truncf that also permutes it (through the
    reshapes): (None, that generic, 0)."""
    value, reshapes = op.results[0], 0
    user = single_user(value)
    rounding = _rounding_user(op, user)
    if rounding is not None:
        return None, rounding, 0
    while user is not None and user.name in RESHAPES and reshapes < MAX_RESHAPES:
        value, reshapes = user.results[0], reshapes + 1
        user = single_user(value)
    if not is_truncf(user):
        return "its result is not only rounded to a narrower type"
    if not _elementwise(user):  # a truncf that moves dims too (v's heads before its tokens)
        return None, user, 0
    generic = single_user(user.results[0]) or _rotating_user(user.results[0])
    if generic is None or generic.name != "linalg.generic" or len(generic.results) != 1:
        return "its rounded result has not one elementwise user"
    return user, generic, reshapes


def _elementwise(op: ir.Operation) -> bool:
    """Whether a generic reads each input as it writes its result (identity maps)."""
    maps = indexing_maps(op)
    return all(m == maps[-1] for m in maps) and maps[-1].is_permutation


def _rounding_user(op: ir.Operation, user: ir.Operation | None) -> ir.Operation | None:
    """`user` where it is a generic of one result, in the matmul's input type (narrower
    than its f32 result), that reads the result as it is and rounds within its body; None
    otherwise (a truncf alone is `is_truncf`'s)."""
    if user is None or user.name != "linalg.generic" or len(user.results) != 1:
        return None
    if not op.name.startswith("linalg") or is_truncf(user) or "conv" in op.name:
        return None
    wide, narrow = _element(op.results[0].type), _element(user.results[0].type)
    body = [inner.operation.name for inner in user.regions[0].blocks[0].operations]
    if wide != "f32" or narrow != _element(op.operands[0].type) or "arith.truncf" not in body:
        return None
    return user if op.results[0] in list(user.operands)[:-1] else None


def _rotating_user(rounded: ir.Value) -> ir.Operation | None:
    """Of a rounded result's two users, the generic that also reads it through the other
    (RoPE: `q * cos + rotate_half(q) * sin`, rewrite/rotary.py): the generic itself or
    reshapes before it (`read_rounded`), and the rotation chain's move generic or, in a
    decode step, its expand_shape; None otherwise."""
    users = [use.owner.operation for use in rounded.uses]
    if len(users) != 2:
        return None
    for first, other in (users, users[::-1]):
        generic = first
        while generic is not None and generic.name in RESHAPES:
            generic = single_user(generic.results[0])
        if generic is None or generic.name != "linalg.generic":
            continue
        if read_rounded(rounded, generic) is None:
            continue
        for operand in list(generic.operands)[:-1]:
            start = rotation_start(operand)
            if start is not None and other in (start, defining_op(start.operands[0])):
                return generic
    return None


def read_rounded(rounded: ir.Value, generic: ir.Operation) -> tuple[ir.Value, int] | None:
    """(the generic's operand that is `rounded` itself or reshaped, the reshapes between
    them), or None where it reads no such operand."""
    for operand in list(generic.operands)[:-1]:
        value, reshapes = operand, 0
        while value != rounded and reshapes < MAX_RESHAPES:
            producer = defining_op(value)
            if producer is None or producer.name not in RESHAPES:
                break
            value, reshapes = producer.operands[0], reshapes + 1
        if value == rounded:
            return operand, reshapes
    return None


def _column_dims(problem: MatmulProblem, shape: tuple[int, ...]) -> int | None:
    """How many trailing dims of a matmul's rounded result (of `shape`, after its reshapes)
    make up N (one, or the heads and head dim a reshape split it into), the dims before them
    the rows; None when they are no whole dims."""
    rows = max(problem.batch, 1) * problem.m
    for count in range(1, len(shape) + 1):
        if math.prod(shape[-count:]) == problem.n and math.prod(shape[:-count]) == rows:
            return count
    return None


def _permuted_store(
    acc_map: ir.AffineMap, shape: tuple[int, ...], out_shape: list[int], rows: int
) -> PermutedStore | None:
    """Where each dim of the rounded result (of `shape`) lands in the epilogue's result (of
    `out_shape`, over the generic's loops) when the generic reads it through `acc_map`, a
    permutation of its loops; None when the map is no permutation."""
    try:
        loops = [ir.AffineDimExpr(expr).position for expr in acc_map.results]
    except ValueError:  # a result that is not one loop
        return None
    if sorted(loops) != list(range(len(out_shape))):
        return None
    strides = [math.prod(out_shape[i + 1 :]) for i in range(len(out_shape))]
    return PermutedStore(tuple(shape), tuple(strides[loop] for loop in loops), rows)


def _layout(problem, acc_map: ir.AffineMap, shape: tuple, out_shape: list):
    """(the loops a per-channel input is read by, or None; the store, or None) of an epilogue
    whose generic reads the rounded result (of `shape`) through `acc_map`: as it is, or (an
    unbatched matmul's) permuted; or why it has none. A convolution's channels are its F (a
    depthwise one has none: its channels are groups); a matmul's its N, whole or in heads."""
    identity = ir.AffineMap.get_identity(len(out_shape), context=acc_map.context)
    results = list(acc_map.results)
    if isinstance(problem, ConvolutionProblem):
        if acc_map != identity:
            return "its user reads the convolution's output permuted"
        roles = problem.output_roles
        return ([results[roles.index("f")]] if "f" in roles else None), None
    columns = _column_dims(problem, shape)
    channel = results[-columns:] if columns else None
    if acc_map == identity:
        return channel, None
    if problem.batch > 1 or columns is None:
        return "its user reads a batched or reshaped contraction's output permuted"
    store = _permuted_store(acc_map, shape, out_shape, len(shape) - columns)
    if store is None:
        return "its user reads the contraction's output through no permutation"
    return channel, store


def _plain(operand: ir.Value, kind: str) -> EpilogueInput:
    """An input of `kind` that needs nothing more than its type."""
    return EpilogueInput(kind, str(operand.type), _element(operand.type))


def _rotated(
    operand: ir.Value, rounded: ir.Value, read: ir.Value, acc_map: ir.AffineMap
) -> EpilogueInput | None:
    """The rounded result (as the generic reads it, `read`) rotated by half in each head
    (rewrite/rotary.py), where the head dim is the last one read (so a head is that many
    columns of the kernel's tile)."""
    shape = ir.RankedTensorType(read.type).shape
    period = rotation_period(operand, rounded, read, acc_map)
    last = ir.AffineDimExpr.get(acc_map.n_dims - 1, context=acc_map.context)
    if period is None or period != shape[-1] or acc_map.results[-1] != last:
        return None
    return EpilogueInput(ROTATED, str(operand.type), _element(operand.type), period=period)


def _indexed(
    operand: ir.Value, in_map: ir.AffineMap, acc_map: ir.AffineMap, shape: tuple, problem
) -> EpilogueInput | None:
    """An input read through a projection of the generic's loops (RoPE's cos and sin, by
    token and head dim): each of the rounded result's dims (of `shape`, read through
    `acc_map`) with its stride in the input; a matmul's only, None otherwise."""
    if isinstance(problem, ConvolutionProblem):
        return None
    columns = _column_dims(problem, shape)
    try:
        loops = [ir.AffineDimExpr(e).position for e in in_map.results]
        acc_loops = [ir.AffineDimExpr(e).position for e in acc_map.results]
    except ValueError:  # a result that is not one loop
        return None
    if columns is None or len(set(loops)) != len(loops):
        return None
    extents = ir.RankedTensorType(operand.type).shape
    strides = [math.prod(extents[i + 1 :]) for i in range(len(extents))]
    per_dim = tuple(strides[loops.index(loop)] if loop in loops else 0 for loop in acc_loops)
    index = PermutedStore(tuple(shape), per_dim, len(shape) - columns)
    return EpilogueInput(INDEXED, str(operand.type), _element(operand.type), index=index)


def _signature(op: ir.Operation) -> tuple:
    """A generic's input and result types, as an Epilogue's `signature`."""
    inputs = len(op.operands) - 1
    return tuple(str(op.operands[i].type) for i in range(inputs)), str(op.results[0].type)


def epilogue_of(op: ir.Operation, problem) -> Epilogue | str:
    """The epilogue after a contraction op (a convolution or a matmul: its only user a
    truncf, whose only user is an elementwise generic), or why there is none. A matmul's
    generic may read the rounded result permuted: the kernel then stores each element where
    the generic would (`PermutedStore`)."""
    after = after_contraction(op)
    if isinstance(after, str):
        return after
    truncf, generic, reshapes = after
    rounded = truncf.results[0] if truncf is not None else op.results[0]
    iterators = [str(i) for i in ir.ArrayAttr(generic.attributes["iterator_types"])]
    if any("parallel" not in i for i in iterators):
        return "its user reduces"
    maps = indexing_maps(generic)
    inputs = len(generic.operands) - 1
    identity = ir.AffineMap.get_identity(len(iterators), context=generic.context)
    read, read_reshapes = read_rounded(rounded, generic) or (rounded, 0)
    acc = [i for i in range(inputs) if generic.operands[i] == read]
    if len(acc) != 1 or maps[-1] != identity:
        return "its user is not elementwise on the contraction's output"
    shape = tuple(ir.RankedTensorType(read.type).shape)
    out_shape = list(ir.RankedTensorType(generic.results[0].type).shape)
    layout = _layout(problem, maps[acc[0]], shape, out_shape)
    if isinstance(layout, str):
        return layout
    channel, store = layout
    kinds = []
    for position in range(inputs):
        operand = generic.operands[position]
        results = list(maps[position].results)
        if position == acc[0]:
            kind = _plain(operand, ACC)
        elif maps[position] == identity:
            rotated = truncf and _rotated(operand, rounded, read, maps[acc[0]])
            kind = rotated or _plain(operand, FULL)
        elif channel is not None and results == channel:
            kind = _plain(operand, CHANNEL)
        else:
            kind = _indexed(operand, maps[position], maps[acc[0]], shape, problem)
        if kind is None:
            return "an input of its user is neither per channel nor output-shaped"
        kinds.append(kind)
    if len(list(rounded.uses)) > 1 and not any(k.kind == ROTATED for k in kinds):
        return "its rounded result has another user"
    if read_reshapes and truncf is not None and not any(k.kind == ROTATED for k in kinds):
        return "it reads the rounded result reshaped"  # a decode step's RoPE alone
    if list(generic.regions[0].blocks[0].arguments[inputs].uses):
        return "its user reads its own output"
    statements = _statements(generic, inputs)
    if isinstance(statements, str):
        return statements
    read = Epilogue(
        inputs=tuple(kinds),
        out_type=str(generic.results[0].type),
        out_element=_element(generic.results[0].type),
        narrow=_element((truncf or generic).results[0].type),
        rounded_before=truncf is not None,
        statements=tuple(statements),
        reshapes=reshapes,
        acc_shape=tuple(ir.RankedTensorType(rounded.type).shape),
        read_reshapes=read_reshapes,
        store=store,
        dag=generic_dag(generic),
    )
    return read if truncf is not None or store is not None else _then(generic, read)


def model_epilogues(module: ir.Module, problem) -> list[Epilogue]:
    """The epilogues after the problem's contractions in the module (fused, as
    rewrite/convolution_ops.py reads it), each once, and only those the spec can tell apart
    by their types (`unambiguous`)."""
    found, unread = [], set()
    for op in walk_ops(module.operation):
        if not is_problems_op(op, problem):
            continue
        after = after_contraction(op)
        if isinstance(after, str):  # nothing after it to keep in its kernel
            continue
        epilogue = epilogue_of(op, problem)
        if isinstance(epilogue, str):  # a generic the kernel cannot compute
            unread.add(_signature(after[1]))
        elif epilogue not in found:
            found.append(epilogue)
    return unambiguous(found, unread)


def unambiguous(epilogues: list[Epilogue], unread: set[tuple] = frozenset()) -> list[Epilogue]:
    """The epilogues the spec's matcher tells apart: each one it matches exactly (`dag`: a
    body that captures nothing, maps included; one that reads a rotation, whose chain the
    matcher follows by its ops alone, only where no epilogue of its types was left unread),
    and each it matches by types alone that no other of the same types differs from in its
    statements or store, nor one with no Triton form (`unread`: their signatures)."""
    by_signature: dict[tuple, set[tuple]] = {}
    for epilogue in epilogues:
        by_signature.setdefault(epilogue.signature, set()).add(
            (epilogue.statements, epilogue.store)
        )
    return [
        e
        for e in epilogues
        if (e.exact and (e.period == 1 or e.signature not in unread))
        or (len(by_signature[e.signature]) == 1 and e.signature not in unread)
    ]


def winners_epilogues(
    model_path: str, compile_flags, work_dir: str, problems: list
) -> dict[str, list[Epilogue]]:
    """Each problem's epilogues (a convolution's or a matmul's, by `problem_key`) in the model
    as the op forms were read (work_dir's FUSED_MODEL, lowered and fused when it is not
    there)."""
    module = read_fused_model(model_path, compile_flags, work_dir)
    return {problem_key(problem): model_epilogues(module, problem) for problem in problems}
