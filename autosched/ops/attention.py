"""Attention roots (`iree_linalg_ext.attention`, from SDPA) as a tuned root-op kind.

IREE forms one dispatch per attention; by the time it configures it, the op is an
`online_attention` (the flash-attention form: the output, a running max and a running sum,
accumulated in f32). Both forms are read here into one `AttentionProblem`, so the problem
found at `flow` is the one the configured build names. A spec matches the online op by its
operands' types and sets a `compilation_info` and, on GPUs, a `decomposition_config` (the
Q.K and P.V matmuls' own configurations).

Loops are named by their role, read from the maps: `m` the query rows, `k1` the head dim of
Q and K, `k2` the key rows, `n` the head dim of V; every other loop is a batch loop (batch,
heads; with grouped-query attention a query-head group loop that K and V do not index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
from iree.compiler import ir

from autosched.ops.base import (
    ANY_OP,
    TOLERANCE,
    DispatchSite,
    Operand,
    RootOpKind,
    SkippedRoot,
)

ONLINE = "iree_linalg_ext.online_attention"
ATTENTION_OPS = ("iree_linalg_ext.attention", ONLINE)
ATTENTION_TYPES = ("f32", "f16", "bf16")
ACCUMULATOR = "f32"  # online_attention's output, max and sum (IREE's conversion)
# IREE's codegen stores i1 tensors as i8 (type propagation), so the online_attention it
# configures takes a flow attention's i1 mask (a causal LM's boolean mask) as i8.
CONFIGURED_MASK_TYPES = {"i1": "i8"}


class AttentionCheck:
    """How an attention problem is checked alone: its inputs, its float64 answer and its
    tolerance (a mixin of AttentionProblem, apart from what the problem is)."""

    def tolerance(self) -> float:
        """The output is rounded to its type once (the sums stay in f32)."""
        return TOLERANCE[self.out_type]

    def check_operands(self) -> list[Operand] | None:
        """q, k and v of the op form (checked alone); None at `flow` (on IREE's dispatch)."""
        if self.form != "op":
            return None
        types = (self.query_type, self.key_type, self.value_type)
        operands = [Operand(name, self.operand_shape(i), types[i]) for i, name in enumerate("qkv")]
        if self.mask_tensor:
            operands.append(Operand("mask", self.operand_shape(3), self.mask_type))
        return operands

    def reference_bytes(self) -> int:
        """q, k, v, the output twice and three score blocks of one outer batch entry, in
        float64 (none at `flow`)."""
        if self.form != "op":
            return 0
        shapes = [self.operand_shape(i) for i in range(3)] + [self.output_shape] * 2
        scores = self.size("m") * self.size("k2") * math.prod(self.batch_sizes[1:])
        return 8 * (sum(math.prod(shape) for shape in shapes) + 3 * scores)

    def reference(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
    ) -> np.ndarray:
        """The op-form attention in float64 with numpy: softmax(scale * q.k + mask) . v, one
        entry of the outermost batch loop at a time (the scores of all at once would not fit).
        The mask is the causal one, or `mask` as IREE reads a mask tensor: an i1 mask keeps
        the keys where it is true, a float mask is added to the scaled scores."""
        letters = [chr(ord("a") + i) for i in range(len(self.loops))]

        def spec(loops) -> str:
            return "".join(letters[i] for i in loops)

        batch = self.positions("b")
        k2 = self.positions("k2")[0]
        scores = [i for i, role in enumerate(self.loops) if role in ("b", "m", "k2")]
        q_loops, k_loops, v_loops, *rest = self.operand_loops
        out_loops = rest[-1]
        out = np.zeros(self.output_shape, dtype=np.float64)
        outer = batch[0] if batch else None
        entries = self.loop_sizes[outer] if batch else 1

        def take(array, loops, index):
            return array if outer not in loops else np.take(array, [index], axis=loops.index(outer))

        for index in range(entries):
            s = np.einsum(
                f"{spec(q_loops)},{spec(k_loops)}->{spec(scores)}",
                take(q, q_loops, index),
                take(k, k_loops, index),
            )
            given = None if mask is None else take(mask, rest[0], index)
            s = self._masked(s * self.scale, scores, given)
            s = np.exp(s - s.max(axis=scores.index(k2), keepdims=True))
            s /= s.sum(axis=scores.index(k2), keepdims=True)
            part = np.einsum(
                f"{spec(scores)},{spec(v_loops)}->{spec(out_loops)}", s, take(v, v_loops, index)
            )
            if outer is None:
                return part
            slot = [slice(None)] * len(out_loops)
            slot[out_loops.index(outer)] = slice(index, index + 1)
            out[tuple(slot)] = part
        return out

    def _masked(self, s: np.ndarray, scores: list[int], given) -> np.ndarray:
        """The scaled scores `s` (in the `scores` loops) under the causal mask, or under
        `given` (the mask tensor's part for this batch entry); as they are without."""
        if self.causal:
            m, k2 = self.positions("m")[0], self.positions("k2")[0]
            hidden = np.triu(np.ones((self.size("m"), self.size("k2")), bool), 1)
            shape = [1] * len(scores)
            shape[scores.index(m)], shape[scores.index(k2)] = hidden.shape
            return np.where(hidden.reshape(shape), -np.inf, s)
        if given is None or not self.mask_tensor:
            return s
        mask = in_loops(given, self.operand_loops[3], scores)
        return np.where(mask != 0, s, -np.inf) if self.mask_type == "i1" else s + mask

    @property
    def mask_tensor(self) -> bool:
        """A mask the op reads as a tensor (not the causal one its kernel applies itself)."""
        return bool(self.mask_type) and not self.causal


def in_loops(array: np.ndarray, loops, scores: list[int]) -> np.ndarray:
    """`array` (indexed by `loops`, some of `scores`) laid out to broadcast against an array
    indexed by `scores`: its loops in that order, 1 for the others."""
    ordered = np.transpose(array, [loops.index(loop) for loop in scores if loop in loops])
    return ordered.reshape([array.shape[loops.index(i)] if i in loops else 1 for i in scores])


@dataclass
class AttentionProblem(AttentionCheck):
    """One attention signature of the model's dispatches, with every dispatch that holds it."""

    kind: ClassVar[str] = "attention"
    zero_init: ClassVar[bool] = True  # its kernel takes no accumulator to add into
    op_name: ClassVar[str] = "iree_linalg_ext.attention"  # as found at `flow`
    loops: tuple[str, ...]  # each loop's role in the op's iteration order: b, m, n, k1, k2
    loop_sizes: tuple[int, ...]
    query_type: str
    key_type: str
    value_type: str
    mask_type: str  # "" without a mask operand
    operand_loops: tuple[tuple[int, ...], ...]  # loop positions of q, k, v, [mask], out
    sites: list[DispatchSite] = field(default_factory=list)
    scale: float | None = None  # the constant Q.K is multiplied by; None if not a constant
    # Read at `flow` (a dispatch's root, timed on IREE's dispatch), or the op as it stands
    # before dispatches are formed ("op": what the custom route replaces, timed bare).
    form: str = "flow"
    causal: bool = False  # the op form's mask is the causal one (rewrite/attention_ops.py)
    output_type: str = ""  # the result's element type (the value type when not read)
    # Where a kernel reads q, k or v as a slice of a wider tensor's last dim (GPT-2's fused
    # q/k/v, rewrite/attention_sources.py): (offset of its first element, the sliced dim's
    # extent, the wider tensor's) per operand, (0, 0, 0) for one read whole; () for none.
    views: tuple[tuple[int, int, int], ...] = ()

    def size(self, role: str) -> int:
        return math.prod(s for r, s in zip(self.loops, self.loop_sizes, strict=True) if r == role)

    def positions(self, role: str) -> list[int]:
        return [i for i, r in enumerate(self.loops) if r == role]

    @property
    def single_row(self) -> bool:
        """One query row (a decode step): IREE folds its unit loop, so no loop is m."""
        return "m" not in self.loops

    @property
    def batch_sizes(self) -> list[int]:
        return [self.loop_sizes[i] for i in self.positions("b")]

    @property
    def heads_per_kv(self) -> int:
        """Query heads that share one K/V head (grouped-query attention); 1 without GQA."""
        key = set(self.operand_loops[1])
        return math.prod(self.loop_sizes[i] for i in self.positions("b") if i not in key)

    @property
    def name(self) -> str:
        dims = [*self.batch_sizes, *(self.size(r) for r in ("m", "k1", "k2", "n"))]
        types = dict.fromkeys((self.query_type, self.key_type, self.value_type))
        mask = f"_mask_{self.mask_type}" if self.mask_type else ""
        if self.form == "op":  # never a flow problem's name
            mask = "_causal" if self.causal else (f"{mask}_op" if mask else "_unmasked")
        gqa = f"_gqa{self.heads_per_kv}" if self.heads_per_kv > 1 else ""
        shape = "x".join("any" if d < 0 else str(d) for d in dims)  # any: a DYNAMIC length
        return f"attention_{shape}_{'_'.join(types)}{mask}{gqa}"

    @property
    def occurrences(self) -> int:
        return sum(site.calls for site in self.sites)

    @property
    def flops(self) -> int:
        """Q.K and P.V, as the op computes them (a mask does not skip work)."""
        rows = math.prod(self.batch_sizes) * self.size("m") * self.size("k2")
        return 2 * rows * (self.size("k1") + self.size("n"))

    @property
    def element_type(self) -> str:
        return self.query_type

    @property
    def indexing_maps(self) -> str:
        """The loops' roles and each operand's loops (q, k, v, [mask], out): the layout, the
        same in the op's attention and online forms."""
        operands = ", ".join(f"({', '.join(map(str, o))})" for o in self.operand_loops)
        return f"loops ({', '.join(self.loops)}), operands [{operands}]"

    def key(self) -> str:
        return self.name

    def as_problem(self) -> AttentionProblem:
        return self

    def operand_types(self, free: frozenset[str] = frozenset()) -> list[str | None]:
        """The online form's operand types in order: q, k, v, None for the scale, [mask],
        the f32 output; the mask's element type as IREE configures it (an i1 mask as i8).
        A loop whose role is in `free` is `?` (a dynamic model's lengths)."""
        q, k, v, *rest = self.operand_loops
        types = [self.query_type, self.key_type, self.value_type]
        mask = CONFIGURED_MASK_TYPES.get(self.mask_type, self.mask_type)
        types += [mask] * (len(rest) - 1) + [ACCUMULATOR]
        sizes = [
            "?" if role in free else str(size)
            for role, size in zip(self.loops, self.loop_sizes, strict=True)
        ]
        tensors = [
            f"tensor<{'x'.join(sizes[i] for i in loops)}x{element}>"
            for loops, element in zip([q, k, v, *rest], types, strict=True)
        ]
        return [*tensors[:3], None, *tensors[3:]]

    @property
    def out_type(self) -> str:
        return self.output_type or self.value_type

    @property
    def output_shape(self) -> list[int]:
        return [self.loop_sizes[i] for i in self.operand_loops[-1]]

    def operand_shape(self, operand: int) -> list[int]:
        return [self.loop_sizes[i] for i in self.operand_loops[operand]]

    def record_shape(self) -> dict:
        shape = {
            "kind": self.kind,
            "loops": list(self.loops),
            "loop_sizes": list(self.loop_sizes),
            "query_type": self.query_type,
            "key_type": self.key_type,
            "value_type": self.value_type,
            "mask_type": self.mask_type,
        }
        if self.form == "op":  # all it takes to rebuild the op alone (from_shape)
            shape |= {
                "form": self.form,
                "causal": self.causal,
                "scale": self.scale,
                "output_type": self.out_type,
                "operand_loops": [list(o) for o in self.operand_loops],
            }
        return shape

    @classmethod
    def from_shape(cls, shape: dict) -> AttentionProblem:
        """The op-form problem a record names (see record_shape)."""
        return cls(
            loops=tuple(shape["loops"]),
            loop_sizes=tuple(shape["loop_sizes"]),
            query_type=shape["query_type"],
            key_type=shape["key_type"],
            value_type=shape["value_type"],
            mask_type=shape["mask_type"],
            operand_loops=tuple(tuple(o) for o in shape["operand_loops"]),
            scale=shape["scale"],
            form=shape["form"],
            causal=shape["causal"],
            output_type=shape["output_type"],
        )

    def csv_shape(self) -> dict:
        """The CSV's shape columns: M query rows, N value head dim, K key rows."""
        return {
            "M": self.size("m"),
            "N": self.size("n"),
            "K": self.size("k2"),
            "batch": math.prod(self.batch_sizes),
            "lhs_type": self.query_type,
            "rhs_type": self.key_type,
            "acc_type": ACCUMULATOR,
        }


def _loop_positions(attribute: ir.Attribute) -> tuple[int, ...]:
    affine_map = ir.AffineMapAttr(attribute).value
    return tuple(ir.AffineDimExpr(expr).position for expr in affine_map.results)


def _roles(q: set[int], k: set[int], v: set[int], out: list[int], loops: int) -> list[str]:
    """Each loop's role, from which operands it indexes (see the module docstring)."""
    roles = []
    for i in range(loops):
        if i in q and i in k and i not in out:
            roles.append("k1")
        elif i in k and i in v and i not in q:
            roles.append("k2")
        elif i in v and i in out and i not in q:
            roles.append("n")
        else:
            roles.append("b")
    # The query rows: the innermost loop of Q that K and V do not index.
    query = [i for i in out if i in q and i not in k and i not in v]
    if query:
        roles[query[-1]] = "m"
    return roles


def read_attention(op: ir.Operation, site: DispatchSite) -> AttentionProblem | SkippedRoot:
    """The op's problem, or why it is not tuned."""
    maps = [_loop_positions(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    outputs = len(op.results)  # 1 for attention; out, max and sum for online_attention
    operands = [ir.ShapedType(o.type) if i != 3 else None for i, o in enumerate(op.operands)]
    inputs = len(maps) - outputs
    out_loops = list(maps[inputs])
    tensors = [t for t in operands if t is not None]
    if any(not t.has_static_shape for t in tensors):
        return SkippedRoot(op.name, "dynamic shape", "an operand has a dynamic shape", site)
    loops = max(max(m, default=-1) for m in maps) + 1
    sizes = [0] * loops
    for positions, tensor in zip(maps, operands, strict=False):
        for position, extent in zip(positions, tensor.shape if tensor else (), strict=True):
            sizes[position] = extent
    roles = _roles(set(maps[0]), set(maps[1]), set(maps[2]), out_loops, loops)
    # A decode step's attention has one query row, its unit loop folded away: no m.
    if any(roles.count(r) != 1 for r in ("n", "k1", "k2")) or roles.count("m") > 1:
        return SkippedRoot(op.name, "attention", f"loops {roles} are not one m, n, k1, k2", site)
    types = [str(operands[i].element_type) for i in range(3)]
    if not set(types) <= set(ATTENTION_TYPES):
        return SkippedRoot(op.name, "element type", f"attention on {types}", site)
    mask = str(operands[4].element_type) if inputs == 5 else ""
    return AttentionProblem(
        loops=tuple(roles),
        loop_sizes=tuple(sizes),
        query_type=types[0],
        key_type=types[1],
        value_type=types[2],
        mask_type=mask,
        operand_loops=tuple(tuple(m) for m in [*maps[:3], *maps[4:inputs], out_loops]),
        sites=[site],
        scale=constant_scale(op.operands[3]),
        output_type=str(ir.ShapedType(op.results[0].type).element_type),
    )


def constant_scale(value: ir.Value) -> float | None:
    """The scale operand's value when an `arith.constant` defines it, else None."""
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.operation.name != "arith.constant":
        return None
    attribute = owner.operation.attributes["value"]
    return ir.FloatAttr(attribute).value if isinstance(attribute, ir.FloatAttr) else None


NEGATIVE_INFINITY = {"f32": "0xFF800000", "f16": "0xFC00", "bf16": "0xFF80"}


def _map(problem: AttentionProblem, loops: tuple[int, ...]) -> str:
    dims = ", ".join(f"d{i}" for i in range(len(problem.loops)))
    return f"affine_map<({dims}) -> ({', '.join(f'd{i}' for i in loops)})>"


def _tensor(problem: AttentionProblem, operand: int, element: str) -> str:
    return f"tensor<{'x'.join(map(str, problem.operand_shape(operand)))}x{element}>"


def causal_mask_lines(problem: AttentionProblem, name: str) -> list[str]:
    """MLIR lines that build the causal mask `name` (0 where a key is at or before the query
    row, -inf after; for a boolean mask, true and false), in the mask operand's layout."""
    loops = problem.operand_loops[3]
    mask = _tensor(problem, 3, problem.mask_type)
    row = loops.index(problem.positions("m")[0])
    key = loops.index(problem.positions("k2")[0])
    rank = len(loops)
    identity = f"affine_map<({', '.join(f'd{i}' for i in range(rank))}) -> "
    identity += f"({', '.join(f'd{i}' for i in range(rank))})>"
    parallel = ", ".join(['"parallel"'] * rank)
    element = problem.mask_type
    if element == "i1":  # a boolean literal's type is i1
        constants = ["  %kept = arith.constant true", "  %hidden = arith.constant false"]
    else:
        constants = [
            f"  %kept = arith.constant 0.0 : {element}",
            f"  %hidden = arith.constant {NEGATIVE_INFINITY[element]} : {element}",
        ]
    return [
        *constants,
        f"  %mask_init = tensor.empty() : {mask}",
        f"  {name} = linalg.generic {{indexing_maps = [{identity}], iterator_types = "
        f"[{parallel}]}} outs(%mask_init : {mask}) {{",
        f"  ^bb0(%unused: {element}):",
        f"    %row = linalg.index {row} : index",
        f"    %key = linalg.index {key} : index",
        "    %seen = arith.cmpi sge, %row, %key : index",
        f"    %value = arith.select %seen, %kept, %hidden : {element}",
        f"    linalg.yield %value : {element}",
        f"  }} -> {mask}",
    ]


def op_module_text(problem: AttentionProblem, module_attributes: dict[str, str]) -> str:
    """The op-form attention alone in `@main(q, k, v[, mask]) -> out`: its scale a
    constant, a causal mask built inside (a mask tensor otherwise an argument)."""
    types = [problem.query_type, problem.key_type, problem.value_type]
    inputs = [_tensor(problem, i, types[i]) for i in range(3)]
    names = ["%q", "%k", "%v"]
    lines = []
    mask_loops = problem.operand_loops[3:-1]
    if problem.mask_type and problem.causal:
        lines += causal_mask_lines(problem, "%mask")
    elif problem.mask_type:
        inputs.append(_tensor(problem, 3, problem.mask_type))
        names.append("%mask")
    out = _tensor(problem, len(problem.operand_loops) - 1, problem.out_type)
    operands = ["%q", "%k", "%v", "%scale"] + (["%mask"] if mask_loops else [])
    operand_types = inputs[:3] + [problem.query_type]
    operand_types += [_tensor(problem, 3, problem.mask_type)] if mask_loops else []
    maps = [*(problem.operand_loops[:3]), (), *mask_loops, problem.operand_loops[-1]]
    listed = ", ".join(f"{name} = {text}" for name, text in module_attributes.items())
    signature = ", ".join(f"{n}: {t}" for n, t in zip(names, inputs, strict=True))
    return "\n".join(
        [
            f"module{f' attributes {{{listed}}}' if listed else ''} {{",
            f"func.func @main({signature}) -> {out} {{",
            f"  %scale = arith.constant {problem.scale!r} : {problem.query_type}",
            *lines,
            f"  %init = tensor.empty() : {out}",
            "  %result = iree_linalg_ext.attention "
            f"<indexing_maps = [{', '.join(_map(problem, m) for m in maps)}]>"
            f" ins({', '.join(operands)} : {', '.join(operand_types)}) outs(%init : {out}) {{",
            "  ^bb0(%score: f32):",
            "    iree_linalg_ext.yield %score : f32",
            f"  }} -> {out}",
            f"  return %result : {out}",
            "}",
            "}",
            "",
        ]
    )


class AttentionKind(RootOpKind):
    name = "attention"
    problem_type = AttentionProblem
    tuned = True
    needs_dispatch = True  # checked against the default build's outputs on IREE's dispatch

    def recognise(self, op: ir.Operation, site: DispatchSite):
        if op.name not in ATTENTION_OPS:
            return None
        return read_attention(op, site)

    def has_kernel(self, problem) -> bool:
        return problem.form == "op"

    def folded_forms(self, problem: AttentionProblem) -> list[AttentionProblem]:
        folded = without_unit_batches(problem)
        return [folded] if folded is not None else []

    def kernel_module(self, problem: AttentionProblem, target, point) -> str:
        """An op-form attention alone (IREE's default build of it; the custom route's
        points write their own modules). A flow problem has no module of its own."""
        if problem.form != "op":
            raise NotImplementedError("a flow attention is timed on IREE's dispatch")
        return op_module_text(problem, target.module_attributes())

    def spec_matcher(
        self, problem: AttentionProblem, handle: str = "%op", free: frozenset[str] = frozenset()
    ) -> str:
        """Transform ops that match `handle` to the problem's online_attention by the exact
        type of each tensor operand (q, k, v, the mask, the f32 output): shapes in the
        op's layout and element types as IREE configures them (an i1 mask is i8 there).
        Loops of the `free` roles are `?`, which a cast-compatible type matches at any size
        (a dynamic model's sequence lengths).

        Why not `transform.iree.match.online_attention`: in IREE 3.13 it matches no
        attention that has a mask (checked on the CPU with every map order), and a causal
        SDPA from torch always has one.
        """
        lines = [f'    transform.match.operation_name {handle} ["{ONLINE}"] : {ANY_OP}\n']
        for index, tensor in enumerate(problem.operand_types(free)):
            if tensor is None:
                continue  # the scale
            lines.append(
                f"    %operand{index} = transform.get_operand {handle}[{index}]"
                f" : ({ANY_OP}) -> !transform.any_value\n"
                f"    transform.iree.match.cast_compatible_type %operand{index} = {tensor}"
                " : !transform.any_value\n"
            )
        return "".join(lines)


def without_unit_batches(problem: AttentionProblem) -> AttentionProblem | None:
    """The problem without its batch loops of size 1, as IREE folds them where a module
    enters at `flow` (a batch-1 ViT's dispatch check module configures (b, m, n, k1, k2)
    where the dispatch it times keeps (b, b, m, n, k1, k2)); None when it has none."""
    kept = [
        i
        for i, (role, size) in enumerate(zip(problem.loops, problem.loop_sizes, strict=True))
        if role != "b" or size != 1
    ]
    if len(kept) == len(problem.loops):
        return None
    where = {old: new for new, old in enumerate(kept)}
    return replace(
        problem,
        loops=tuple(problem.loops[i] for i in kept),
        loop_sizes=tuple(problem.loop_sizes[i] for i in kept),
        operand_loops=tuple(
            tuple(where[i] for i in loops if i in where) for loops in problem.operand_loops
        ),
        sites=[],
    )


@dataclass(frozen=True)
class AttentionPattern:
    """An attention root of a dynamic model: its q, k and v shapes (None where a dimension
    is of dynamic size) and element types. The bucket problems it came from match it."""

    shapes: tuple[tuple[int | None, ...], ...]
    element_types: tuple[str, ...]

    def matches(self, problem: AttentionProblem) -> bool:
        """`problem` (a static root) is this op at some sizes of its dynamic dimensions."""
        if problem.kind != "attention":
            return False
        types = (problem.query_type, problem.key_type, problem.value_type)
        if types != self.element_types:
            return False
        for operand, shape in enumerate(self.shapes):
            static = problem.operand_shape(operand)
            if len(static) != len(shape):
                return False
            pairs = zip(shape, static, strict=True)
            if any(mine is not None and mine != size for mine, size in pairs):
                return False
        return True

    @property
    def dynamic(self) -> bool:
        return any(size is None for shape in self.shapes for size in shape)

    def free_roles(self, problem: AttentionProblem) -> frozenset[str]:
        """The loop roles of `problem` at the dimensions of dynamic size."""
        return frozenset(
            problem.loops[problem.operand_loops[operand][position]]
            for operand, shape in enumerate(self.shapes)
            for position, size in enumerate(shape)
            if size is None
        )


def attention_pattern(op: ir.Operation) -> AttentionPattern | None:
    """The op as an AttentionPattern (q, k, v: its first three operands), dynamic sizes and
    all; None for another op."""
    if op.name not in (AttentionProblem.op_name, ONLINE):
        return None
    try:
        tensors = [ir.RankedTensorType(op.operands[i].type) for i in range(3)]
    except (ValueError, IndexError):
        return None
    shapes = tuple(
        tuple(None if t.is_dynamic_dim(i) else t.shape[i] for i in range(t.rank)) for t in tensors
    )
    return AttentionPattern(shapes, tuple(str(t.element_type) for t in tensors))
