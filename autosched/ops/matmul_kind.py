"""The matmul family as a root-op kind: contraction roots recognised in dispatches, the spec
matcher that finds them again in any module (`transform.iree.match.contraction` with the
dispatch's own maps and every dimension), and the kernel module that rebuilds one alone."""

from __future__ import annotations

from iree.compiler import ir

from autosched.ops.base import DispatchSite, RootOpKind
from autosched.ops.contraction import contraction_matcher, recognise_contraction
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kernel import kernel_variant


class MatmulKind(RootOpKind):
    name = "matmul"
    problem_type = MatmulProblem
    tuned = True

    def recognise(self, op: ir.Operation, site: DispatchSite):
        return recognise_contraction(op, site)

    def spec_matcher(
        self, problem: MatmulProblem, handle: str = "%op", free: frozenset[str] = frozenset()
    ) -> str:
        """Transform ops that match `handle` to the problem's contractions, in whatever form
        (named op or linalg.generic): element types, indexing maps and every dimension but
        the `free` ones (batch, m, n, k: a dynamic model's lengths; m where the problem's
        M is DYNAMIC)."""
        free = free | {"m"} if problem.any_rows else free
        dims = {"m": [problem.m], "n": [problem.n], "k": [problem.k]}
        return contraction_matcher(
            problem, handle, dims | ({"batch": [problem.batch]} if problem.batch else {}), free
        )

    def kernel_module(self, problem: MatmulProblem, target, point) -> str:
        return kernel_variant(problem, target, point)
