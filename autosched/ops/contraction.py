"""The matmul family's roots in a dispatch: any two-input contraction (named matmuls,
`linalg.contract`, and generics whose maps and body make one), its loops' roles, and, where
it has one, its form as a named-op `MatmulProblem`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from iree.compiler import ir

from autosched.ops.base import ANY_OP, PARAM, DispatchSite, SkippedRoot
from autosched.ops.matmul import SUPPORTED_TYPES, MatmulProblem, OpSite

# Contraction roots: the named matmuls and any op whose maps and body make it one.
CONTRACTION_OPS = ("linalg.matmul", "linalg.batch_matmul", "linalg.contract", "linalg.generic")
MATVEC_OPS = ("linalg.matvec", "linalg.vecmat", "linalg.batch_matvec", "linalg.batch_vecmat")


@dataclass
class Contraction:
    """One contraction signature found in the dispatches, with every dispatch that holds it.

    Why not `MatmulProblem`: a dispatch's root is often a `linalg.generic` that IREE
    made from a matmul (collapsed batch dims, mixed f16 x f16 -> f32 types), and a generic can
    order its loops any way (`(m, n, b, k)`), split m, n or k over several loops, or carry
    several batch loops. MatmulProblem has one m, n, k, at most one batch, in the named ops'
    loop order, which is what its lowering-config tile lists assume; and its sites are
    functions of the input module, not dispatches. `as_matmul_problem` gives the
    MatmulProblem when the contraction has that form, so today's targets and spaces apply.
    """

    kind: ClassVar[str] = "matmul"  # the root-op kind whose problems it becomes
    op_name: str  # linalg.matmul, linalg.batch_matmul, linalg.contract or linalg.generic
    loops: tuple[str, ...]  # each loop's role in the op's iteration order: "b", "m", "n", "k"
    loop_sizes: tuple[int, ...]
    lhs_type: str
    rhs_type: str
    acc_type: str
    indexing_maps: str  # the op's indexing_maps, as MLIR prints them: what a spec matches
    operand_loops: tuple[tuple[int, ...], ...]  # the same maps: loop positions of lhs, rhs, acc
    zero_init: bool  # the accumulator comes from a linalg.fill inside the dispatch
    sites: list[DispatchSite] = field(default_factory=list)

    def _size(self, role: str) -> int:
        size = 1
        for loop, extent in zip(self.loops, self.loop_sizes, strict=True):
            if loop == role:
                size *= extent
        return size

    @property
    def m(self) -> int:
        return self._size("m")

    @property
    def n(self) -> int:
        return self._size("n")

    @property
    def k(self) -> int:
        return self._size("k")

    @property
    def batch(self) -> int:
        """Product of the batch loops; 0 when there is none (MatmulProblem's convention)."""
        return self._size("b") if "b" in self.loops else 0

    @property
    def occurrences(self) -> int:
        """How many times one run of the model launches a dispatch with this contraction."""
        return sum(site.calls for site in self.sites)

    @property
    def flops(self) -> int:
        return 2 * max(self.batch, 1) * self.m * self.n * self.k

    @property
    def transpose_a(self) -> bool:
        """The lhs is stored m-innermost (k x m), not k-innermost."""
        return self.loops[self.operand_loops[0][-1]] == "m"

    @property
    def transpose_b(self) -> bool:
        """The rhs is stored k-innermost (n x k), as nn.Linear and Gemm(transB=1) weights are."""
        return self.loops[self.operand_loops[1][-1]] == "k"

    @property
    def name(self) -> str:
        kind = self.op_name.split(".")[1]
        if self.op_name not in ("linalg.matmul", "linalg.batch_matmul"):
            kind += "_" + "".join(self.loops)
        if self.transpose_a:
            kind += "_transpose_a"
        if self.transpose_b:
            kind += "_transpose_b"
        shape = "x".join(str(s) for s in self.loop_sizes)
        init = "" if self.zero_init else "_acc"
        return f"{kind}_{shape}_{self.lhs_type}_{self.rhs_type}_{self.acc_type}{init}"

    def as_problem(self) -> MatmulProblem | None:
        """The problem a target tunes for this root (ops/base.py): its matmul form."""
        return self.as_matmul_problem()

    def as_matmul_problem(self) -> MatmulProblem | None:
        """This contraction as a named-op MatmulProblem, or None where it has no such form.

        It has one when its loops are (m, n, k) or (b, m, n, k), one each, and every operand
        keeps batch first: then a linalg.matmul / batch_matmul with the same indexing maps
        computes the same thing, tile lists line up, and a spec's `match.contraction` with
        these maps matches either op.
        """
        if self.loops not in (("m", "n", "k"), ("b", "m", "n", "k")):
            return None
        batched = self.loops[0] == "b"
        lead = [0] if batched else []
        lhs, rhs, acc = (list(loops) for loops in self.operand_loops)
        m, n, k = (1, 2, 3) if batched else (0, 1, 2)
        if acc != [*lead, m, n]:
            return None
        if lhs not in ([*lead, m, k], [*lead, k, m]) or rhs not in ([*lead, k, n], [*lead, n, k]):
            return None
        return MatmulProblem(
            op_name="linalg.batch_matmul" if batched else "linalg.matmul",
            m=self.m,
            n=self.n,
            k=self.k,
            batch=self.batch,
            lhs_type=self.lhs_type,
            rhs_type=self.rhs_type,
            acc_type=self.acc_type,
            transpose_a=self.transpose_a,
            transpose_b=self.transpose_b,
            zero_init=self.zero_init,
            indexing_maps=self.indexing_maps,
            sites=[
                OpSite(function=site.entry_point, index=index, location=site.location)
                for index, site in enumerate(self.sites)
            ],
        )

    def key(self) -> tuple:
        return (
            self.op_name,
            self.loops,
            self.loop_sizes,
            self.lhs_type,
            self.rhs_type,
            self.acc_type,
            self.indexing_maps,
            self.zero_init,
        )


def _dims_of(map_attr: ir.Attribute) -> list[int]:
    """Loop positions of a projected-permutation map's results (ValueError for any other)."""
    affine_map = ir.AffineMapAttr(map_attr).value
    return [ir.AffineDimExpr(expr).position for expr in affine_map.results]


def producer(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    owner = getattr(owner, "operation", owner)
    return owner if isinstance(owner, ir.Operation) else None


def _block_argument(value: ir.Value) -> int | None:
    try:
        return ir.BlockArgument(value).arg_number
    except ValueError:
        return None


_CASTS = ("arith.extf", "arith.extsi", "arith.extui", "arith.truncf", "arith.sitofp")


def is_multiply_add(op: ir.Operation) -> bool:
    """The body is acc + lhs * rhs, the inputs possibly cast, and nothing else."""
    block = op.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    if len(body) < 3 or body[-1].name != "linalg.yield" or len(body[-1].operands) != 1:
        return False
    allowed = (*_CASTS, "arith.mulf", "arith.muli", "arith.addf", "arith.addi")
    if any(o.name not in allowed for o in body[:-1]):
        return False
    add = producer(body[-1].operands[0])
    if add is None or add.name not in ("arith.addf", "arith.addi"):
        return False
    sides = list(add.operands)
    if _block_argument(sides[0]) != 2:
        sides.reverse()
    if _block_argument(sides[0]) != 2:
        return False
    multiply = producer(sides[1])
    if multiply is None or multiply.name not in ("arith.mulf", "arith.muli"):
        return False
    inputs = set()
    for value in multiply.operands:
        while (cast := producer(value)) is not None and cast.name in _CASTS:
            value = cast.operands[0]
        inputs.add(_block_argument(value))
    return inputs == {0, 1}


def _loop_roles(maps: list[list[int]], loops: int) -> list[str] | None:
    """Each loop's role (b, m, n, k) from where it appears, or None if it has none."""
    lhs, rhs, acc = (set(m) for m in maps)
    roles = []
    for loop in range(loops):
        where = (loop in lhs, loop in rhs, loop in acc)
        role = {
            (True, True, True): "b",
            (True, False, True): "m",
            (False, True, True): "n",
            (True, True, False): "k",
        }.get(where)
        if role is None:
            return None
        roles.append(role)
    return roles


def _contraction_form(op: ir.Operation) -> tuple[list[str], list[list[int]]] | None:
    """(loop roles, per-operand loop lists) when the op is a two-input contraction."""
    if op.name in MATVEC_OPS or op.name not in CONTRACTION_OPS:
        return None
    if "indexing_maps" not in op.attributes or len(op.operands) != 3:
        return None
    if op.name == "linalg.generic" and not is_multiply_add(op):
        return None
    try:
        maps = [_dims_of(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    except ValueError:  # not projected permutations (a convolution written as a generic, ...)
        return None
    loops = ir.AffineMapAttr(ir.ArrayAttr(op.attributes["indexing_maps"])[0]).value.n_dims
    roles = _loop_roles(maps, loops)
    if roles is None:
        return None
    if op.name == "linalg.generic":
        iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
        expected = ["reduction" if r == "k" else "parallel" for r in roles]
        if [i.split("<")[-1].rstrip(">") for i in iterators] != expected:
            return None
    return roles, maps


def static_types(op: ir.Operation) -> list[ir.RankedTensorType] | str:
    """The operands' ranked tensor types, or why they are not all static."""
    types = []
    for index, operand in enumerate(op.operands):
        try:
            tensor = ir.RankedTensorType(operand.type)
        except ValueError:
            if isinstance(operand.type, ir.ShapedType):  # unranked tensor, memref
                return f"operand {index} is {operand.type}"
            continue  # a scalar (attention's scale)
        if not tensor.has_static_shape:
            return f"operand {index} is {tensor}"
        types.append(tensor)
    return types


def recognise_contraction(op: ir.Operation, site: DispatchSite) -> Contraction | SkippedRoot | None:
    """A dispatch op as a contraction, a matmul-family root that is not tuned (and why), or
    None when it is no contraction."""
    if op.name in MATVEC_OPS:
        return SkippedRoot(op.name, "matrix-vector", "no m or no n dimension", site)
    if op.name == "linalg.dot":  # a 1-D x 1-D MatMul
        return SkippedRoot(op.name, "dot product", "vector x vector: no m and no n", site)
    form = _contraction_form(op)
    if form is None:
        return None
    roles, maps = form
    if not {"m", "n", "k"} <= set(roles):
        return SkippedRoot(op.name, "matrix-vector", f"loops {''.join(roles)}", site)
    types = static_types(op)
    if isinstance(types, str):
        return SkippedRoot(op.name, "dynamic shape", types, site)
    lhs, rhs, acc = types
    sizes: dict[int, int] = {}
    for dims, tensor in zip(maps, (lhs, rhs, acc), strict=True):
        for dim, size in zip(dims, tensor.shape, strict=True):
            sizes[dim] = size
    element_types = [str(t.element_type) for t in (lhs, rhs, acc)]
    unsupported = sorted(set(element_types) - set(SUPPORTED_TYPES))
    if unsupported:
        return SkippedRoot(
            op.name, "element type", f"{' x '.join(element_types)}: {unsupported}", site
        )
    init = producer(op.operands[2])
    return Contraction(
        op_name=op.name,
        loops=tuple(roles),
        loop_sizes=tuple(sizes[d] for d in range(len(roles))),
        lhs_type=element_types[0],
        rhs_type=element_types[1],
        acc_type=element_types[2],
        indexing_maps=str(op.attributes["indexing_maps"]),
        operand_loops=tuple(tuple(dims) for dims in maps),
        zero_init=init is not None and init.name == "linalg.fill",
        sites=[site],
    )


def contraction_matcher(
    problem, handle: str, dims: dict[str, list[int]], free: frozenset[str] = frozenset()
) -> str:
    """Transform ops that match `handle` to a contraction of the problem's element types and
    indexing maps whose batch, m, n and k dims (`dims`, each a list of sizes in loop order)
    are those given; the roles in `free` are not checked (a dynamic model's length: one
    entry serves every size)."""
    checks = "".join(
        f"    transform.iree.match.dims_equal %{name}, {dims.get(name, [])} : {PARAM}\n"
        for name in ("batch", "m", "n", "k")
        if name not in free
    )
    return (
        f"    %batch, %m, %n, %k = transform.iree.match.contraction {handle},"
        f" lhs_type = {problem.lhs_type}, rhs_type = {problem.rhs_type},"
        f" output_type = {problem.acc_type}, indexing_maps = {problem.indexing_maps}"
        f" : {ANY_OP} -> {PARAM}\n"
        f"{checks}"
    )


ROLE_NAMES = {"b": "batch", "m": "m", "n": "n", "k": "k"}  # a loop role as a matcher names it


@dataclass(frozen=True)
class ContractionPattern:
    """A contraction root of a dynamic model: its maps, element types, loop roles and sizes,
    None where a loop is of dynamic size. The bucket roots it came from match it."""

    indexing_maps: str
    element_types: tuple[str, str, str]
    loops: tuple[str, ...]
    sizes: tuple[int | None, ...]

    def matches(self, root: Contraction) -> bool:
        """`root` (a static root) is this op at some sizes of its dynamic loops."""
        types = (root.lhs_type, root.rhs_type, root.acc_type)
        same = (root.indexing_maps, types, root.loops) == (
            self.indexing_maps,
            self.element_types,
            self.loops,
        )
        sizes = zip(self.sizes, root.loop_sizes, strict=True) if same else ()
        return same and all(mine is None or mine == size for mine, size in sizes)

    @property
    def dynamic(self) -> bool:
        return None in self.sizes

    def free_roles(self) -> frozenset[str]:
        """The roles (as a matcher names them) with a loop of dynamic size."""
        return frozenset(
            ROLE_NAMES[role]
            for role, size in zip(self.loops, self.sizes, strict=True)
            if size is None
        )


def contraction_pattern(op: ir.Operation) -> ContractionPattern | None:
    """The op as a ContractionPattern, dynamic sizes and all; None for no contraction."""
    form = _contraction_form(op)
    if form is None:
        return None
    roles, maps = form
    try:
        tensors = [ir.RankedTensorType(operand.type) for operand in op.operands]
    except ValueError:
        return None
    sizes: dict[int, int | None] = {}
    for dims, tensor in zip(maps, tensors, strict=True):
        for position, dim in enumerate(dims):
            sizes[dim] = None if tensor.is_dynamic_dim(position) else tensor.shape[position]
    types = tuple(str(t.element_type) for t in tensors)
    return ContractionPattern(
        str(op.attributes["indexing_maps"]),
        (types[0], types[1], types[2]),
        tuple(roles),
        tuple(sizes[d] for d in range(len(roles))),
    )
