"""Gather roots: an embedding's lookup, the first dispatch of every causal LM.

Where IREE forms its dispatches, torch's `embedding` (an `index_select` of a weight table by
token ids) is a `linalg.generic` of parallel loops over (tokens, width): its one input is
the token ids, and its body reads the table, a tensor from outside the op, at (the token's
id, the width's index) with `tensor.extract`. IREE's llvm-cpu backend configures it as any
elementwise op (`DoubleTilingExpert`: `distribution = [16, 64]`, `vector_common_parallel =
[1, 16]` for 16 tokens of width 64): tokens and width per workgroup, and the width of the
vector each copy moves. Those are the knobs (targets/cpu_gather.py).

A gather does no arithmetic: its `flops` are the elements it copies (one a token and column),
so the run's GFLOP/s of a gather read as billions of elements copied a second. Its answer
is a copy, checked on IREE's dispatch against the default build's outputs, exactly.

A spec finds the gather again by its op name and its operands' exact types (the ids and the
output): MLIR's `cast_compatible_dag_from_root` does not match a body that reads a tensor
from outside the op (tried on IREE 3.13: the configuration stayed IREE's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from iree.compiler import ir

from autosched.ops.base import ANY_OP, ANY_VALUE, DispatchSite, Operand, RootOpKind
from autosched.ops.contraction import static_types

INDEX_TYPES = ("i32", "i64")
GATHER_TYPES = ("f32", "f16", "bf16")
LOOPS = ("t", "d")  # tokens (the ids), and the width of each row copied


@dataclass
class GatherProblem:
    """One gather signature of the model's dispatches: `tokens` rows of `width` elements
    read from a table of `rows` rows, with every dispatch holding it."""

    kind: ClassVar[str] = "gather"
    zero_init: ClassVar[bool] = True  # it writes every element of its output
    loops: ClassVar[tuple[str, ...]] = LOOPS
    op_name: ClassVar[str] = "linalg.generic"
    # The op's maps: each token's id, and the output's (token, column).
    indexing_maps: ClassVar[str] = (
        "[affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>]"
    )
    tokens: int
    width: int
    rows: int  # the table's rows (the vocabulary)
    element: str  # the table's (and the output's) element type
    index_type: str  # the ids' element type
    sites: list[DispatchSite] = field(default_factory=list)

    def size(self, role: str) -> int:
        return {"t": self.tokens, "d": self.width}[role]

    @property
    def name(self) -> str:
        types = f"{self.element}_{self.index_type}"
        return f"gather_{self.tokens}x{self.width}_from_{self.rows}_{types}"

    @property
    def occurrences(self) -> int:
        return sum(site.calls for site in self.sites)

    @property
    def flops(self) -> int:
        return self.tokens * self.width  # elements copied (see the module docstring)

    @property
    def output_shape(self) -> list[int]:
        return [self.tokens, self.width]

    @property
    def out_type(self) -> str:
        return self.element

    @property
    def ids_tensor(self) -> str:
        return f"tensor<{self.tokens}x{self.index_type}>"

    @property
    def output_tensor(self) -> str:
        return f"tensor<{self.tokens}x{self.width}x{self.element}>"

    def key(self) -> str:
        return self.name

    def as_problem(self) -> GatherProblem:
        return self

    def record_shape(self) -> dict:
        return {
            "kind": self.kind,
            "loop_sizes": [self.tokens, self.width],
            "rows": self.rows,
            "element": self.element,
            "index_type": self.index_type,
        }

    @classmethod
    def from_shape(cls, shape: dict) -> GatherProblem:
        tokens, width = shape["loop_sizes"]
        return cls(tokens, width, shape["rows"], shape["element"], shape["index_type"])

    def csv_shape(self) -> dict:
        """M tokens, N the width, K the table's rows (no reduction: what the rows index)."""
        return {
            "M": self.tokens,
            "N": self.width,
            "K": self.rows,
            "batch": 0,
            "lhs_type": self.element,
            "rhs_type": self.index_type,
            "acc_type": self.element,
        }

    def tolerance(self) -> float:
        return 0.0  # a copy: every element exactly

    def check_operands(self) -> list[Operand] | None:
        return None  # checked on IREE's dispatch, against the default build's outputs

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        raise NotImplementedError("a gather is checked on IREE's dispatch")

    def reference_bytes(self) -> int:
        return 0


def _table_read(op: ir.Operation) -> ir.RankedTensorType | None:
    """The type of the 2-D tensor the body reads with `tensor.extract` from outside the op
    (the table), or None."""
    for inner in op.regions[0].blocks[0].operations:
        if inner.operation.name != "tensor.extract":
            continue
        table = inner.operands[0]
        if isinstance(table.owner, ir.Block):  # one of the op's own block arguments
            continue
        tensor = ir.RankedTensorType(table.type)
        if tensor.rank == 2 and tensor.has_static_shape:
            return tensor
    return None


def read_gather(op: ir.Operation, site: DispatchSite) -> GatherProblem | None:
    """An embedding's lookup (see the module docstring) as a problem, or None."""
    if op.name != "linalg.generic" or len(op.operands) != 2:
        return None
    iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
    if len(iterators) != 2 or any("parallel" not in i for i in iterators):
        return None
    if str(op.attributes["indexing_maps"]) != GatherProblem.indexing_maps:
        return None  # a token per row of the output, its columns in order
    table = _table_read(op)
    types = static_types(op)
    if table is None or isinstance(types, str) or len(types) != 2:
        return None
    ids, output = types
    index_type, element = str(ids.element_type), str(output.element_type)
    if index_type not in INDEX_TYPES or element not in GATHER_TYPES or ids.rank != 1:
        return None
    rows, width = table.shape
    if list(output.shape) != [ids.shape[0], width] or str(table.element_type) != element:
        return None
    return GatherProblem(ids.shape[0], width, rows, element, index_type, [site])


class GatherKind(RootOpKind):
    name = "gather"
    problem_type = GatherProblem
    tuned = True
    needs_dispatch = True  # timed and checked on IREE's dispatch (no kernel of its own)

    def recognise(self, op: ir.Operation, site: DispatchSite):
        return read_gather(op, site)

    def spec_matcher(self, problem: GatherProblem, handle: str = "%op") -> str:
        """Transform ops that match `handle` to the problem's gathers: a `linalg.generic`
        whose first operand is the ids and second the output, each of its exact type."""
        lines = [f'    transform.match.operation_name {handle} ["linalg.generic"] : {ANY_OP}']
        for position, tensor in enumerate((problem.ids_tensor, problem.output_tensor)):
            lines += [
                f"    %gathered{position} = transform.get_operand {handle}[{position}]"
                f" : ({ANY_OP}) -> {ANY_VALUE}",
                f"    transform.iree.match.cast_compatible_type %gathered{position} = {tensor}"
                f" : {ANY_VALUE}",
            ]
        return "\n".join(lines) + "\n"
