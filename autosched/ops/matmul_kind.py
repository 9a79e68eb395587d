"""The matmul family as a root-op kind: contraction roots recognised in dispatches, the spec
matcher that finds them again in any module (`transform.iree.match.contraction` with the
dispatch's own maps and every dimension), and the kernel module that rebuilds one alone."""

from __future__ import annotations

from iree.compiler import ir

from autosched.ops.base import ANY_OP, PARAM, DispatchSite, RootOpKind
from autosched.ops.contraction import recognise_contraction
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kernel import kernel_variant


class MatmulKind(RootOpKind):
    name = "matmul"
    tuned = True

    def recognise(self, op: ir.Operation, site: DispatchSite):
        return recognise_contraction(op, site)

    def spec_matcher(self, problem: MatmulProblem, handle: str = "%op") -> str:
        """Transform ops that match `handle` to the problem's contractions, in whatever form
        (named op or linalg.generic): element types, indexing maps and every dimension."""
        batch = f"[{problem.batch}]" if problem.batch else "[]"
        dims = [
            ("%batch", batch),
            ("%m", f"[{problem.m}]"),
            ("%n", f"[{problem.n}]"),
            ("%k", f"[{problem.k}]"),
        ]
        checks = "".join(
            f"    transform.iree.match.dims_equal {v}, {d} : {PARAM}\n" for v, d in dims
        )
        return (
            f"    %batch, %m, %n, %k = transform.iree.match.contraction {handle},"
            f" lhs_type = {problem.lhs_type}, rhs_type = {problem.rhs_type},"
            f" output_type = {problem.acc_type}, indexing_maps = {problem.indexing_maps}"
            f" : {ANY_OP} -> {PARAM}\n"
            f"{checks}"
        )

    def kernel_module(self, problem: MatmulProblem, target, point) -> str:
        return kernel_variant(problem, target, point)
