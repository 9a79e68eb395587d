"""Weights as `nn.Linear` stores them: the transpose a custom matmul kernel absorbs (issue 24).

torch exports `x @ W.T` of a 3-D `x` as a transpose of the weight (N x K, as stored) into
K x N, then a batch matmul of batch 1. With the weights as function arguments nothing can
fold that transpose at compile time, so IREE writes every weight transposed on every call
(0.03-0.09 ms each on a Llama-3-8B layer on the H200). A custom kernel reads B through its
strides, so the substitution matches the contraction together with the transpose that makes
its B, and calls the kernel built for B stored as N x K on the transpose's input: the
transpose is left dead and removed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from autosched.kernels.matmul_triton.kernel import operand_types
from autosched.ops.base import ANY_OP
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kernel import tensor_type
from autosched.outputs.records import problem_from_shape, problem_shape
from autosched.rewrite.builders import call, collapse, copy_dag, expand, util_function


@dataclass(frozen=True)
class StoredLayout:
    """How a transposed B is stored: the transpose's input shape and input map."""

    shape: list[int]  # the stored weight, as the transpose reads it
    results: str  # the transpose's input map results, e.g. "d2, d0, d1"
    rank: int

    def map(self) -> str:
        dims = ", ".join(f"d{i}" for i in range(self.rank))
        return f"affine_map<({dims}) -> ({self.results})>"


def stored_layout(problem: MatmulProblem) -> StoredLayout | None:
    """The stored form of B a transpose may make it from (N x K; for batch 1 as torch
    leaves it, N x 1 x K), or None where B is not plain K x N."""
    if problem.transpose_a or problem.transpose_b:
        return None
    n, k = problem.n, problem.k
    if not problem.batch:
        return StoredLayout([n, k], "d1, d0", 2)
    if problem.batch == 1:
        return StoredLayout([n, 1, k], "d2, d0, d1", 3)
    return StoredLayout([problem.batch, n, k], "d0, d2, d1", 3)


def stored_problem(problem: MatmulProblem) -> MatmulProblem:
    """The same contraction with B read as stored (N x K): the kernel the absorbed form
    calls."""
    shape = {**problem_shape(problem), "transpose_b": True}
    stored = problem_from_shape(shape)
    return dataclasses.replace(stored, acc_type=problem.acc_type, norm=problem.norm)


def transpose_matcher(handle: str, problem: MatmulProblem, layout: StoredLayout) -> list[str]:
    """Transform lines that match the producer of `handle`'s B as the transpose of a stored
    weight (a linalg.generic that only copies, its input map `layout`), bound to `%t`."""
    element = problem.rhs_type
    stored = tensor_type(layout.shape, element)
    made = tensor_type(problem.rhs_shape, element)
    return [
        f"    %t = transform.get_producer_of_operand {handle}[1] : ({ANY_OP}) -> {ANY_OP}",
        *copy_dag("%stored, %made", "%t", stored, made, layout.map()),
    ]


def wrapper_function(
    name: str,
    kernel: str,
    problem: MatmulProblem,
    layout: StoredLayout,
    out_type: str,
    extras: Sequence[str] = (),
    result: str | None = None,
) -> str:
    """`name(A, W, extras...) -> C`: the weight W as stored, reshaped (no copy) to the
    kernel's batch x N x K and passed to `kernel` with the epilogue's `extras` (their
    types); C of `out_type` elements, or of the full type `result`. A normed form takes x
    for A and g before the extras (`operand_types`)."""
    element = problem.rhs_type
    lhs, after_b = operand_types(problem)
    extras = [*after_b, *extras]
    stored = tensor_type(layout.shape, element)
    out = result or tensor_type(problem.acc_shape, out_type)

    def body(args):
        weight = args[1]
        if problem.batch == 1:  # N x 1 x K is 1 x N x K in memory
            n, k = problem.n, problem.k
            flat = collapse(weight, [[0, 1], [2]], tensor_type([n, k], element))
            weight = expand(flat, [[0, 1], [2]], tensor_type([1, n, k], element))
        return call(kernel, [args[0], weight, *args[2:]], out)

    return util_function(name, [lhs, stored, *extras], out, body) + "\n"
