"""Root-op kinds are plug-ins: the registry offers every dispatch op to each kind in turn,
so a kind registered from here is consulted on a real model's dispatches like the shipped
ones (attention, convolution, matmul)."""

from __future__ import annotations

import os

from iree.compiler import ir

from autosched.config import RunConfig
from autosched.model.lowering import analyze_model
from autosched.ops import registry
from autosched.ops.base import DispatchSite, RootOpKind, SkippedRoot
from autosched.ops.matmul_kind import MatmulKind
from autosched.outputs.spec import match_contraction
from autosched.targets.cpu import CpuTarget

MODEL = os.path.join(os.path.dirname(__file__), "data", "models", "llama_mlp.mlirbc")


class SigmoidKind(RootOpKind):
    """Claims the elementwise generics that compute a sigmoid (SiLU's, fused into the gate
    projection's dispatch): recognised, not tuned."""

    name = "sigmoid"

    def recognise(self, op: ir.Operation, site: DispatchSite) -> SkippedRoot | None:
        if op.name != "linalg.generic":
            return None
        body = [o.operation.name for o in op.regions[0].blocks[0].operations]
        if "math.exp" not in body:
            return None
        return SkippedRoot(op.name, "sigmoid", "a test kind", site)


def test_a_kind_registered_from_a_test_is_offered_every_dispatch_op(monkeypatch):
    flags = CpuTarget(RunConfig()).compile_flags()
    before = analyze_model(MODEL, flags)
    assert "sigmoid" not in before.skipped_counts()
    kinds = {"sigmoid": (__name__, "SigmoidKind"), **registry.KINDS}
    monkeypatch.setattr(registry, "KINDS", kinds)
    registry.kind.cache_clear()
    try:
        after = analyze_model(MODEL, flags)
    finally:
        registry.kind.cache_clear()
    assert after.skipped_counts()["sigmoid"] == 1  # the gate's SiLU, in one dispatch
    # The matmul kind still finds every contraction (gate and up as one problem, down).
    assert sorted(c.name for c in after.contractions) == sorted(c.name for c in before.contractions)


def test_a_problem_names_its_kind_and_the_spec_uses_its_matcher():
    analysis = analyze_model(MODEL, CpuTarget(RunConfig()).compile_flags())
    problem = analysis.matmul_problems()[0]
    kind = registry.kind_of(problem)
    assert isinstance(kind, MatmulKind) and kind.tuned
    assert match_contraction(problem) == kind.spec_matcher(problem)
    assert "transform.iree.match.contraction" in kind.spec_matcher(problem)
    assert [k.name for k in registry.root_kinds()] == ["attention", "convolution", "matmul"]
    assert registry.kind("attention").tuned and registry.kind("convolution").tuned
