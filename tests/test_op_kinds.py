"""Root-op kinds are plug-ins: the registry offers every dispatch op to each kind in turn,
so a kind registered from here is consulted on a real model's dispatches like the shipped
ones (attention, convolution, gather, matmul)."""

from __future__ import annotations

import os

import numpy as np
from iree.compiler import ir

from autosched.config import RunConfig
from autosched.measure.worker import make_problem_data
from autosched.model.lowering import analyze_model
from autosched.ops import registry
from autosched.ops.attention import AttentionProblem
from autosched.ops.base import DispatchSite, RootOpKind, SkippedRoot
from autosched.ops.convolution import nchw_problem
from autosched.ops.gather import GatherProblem
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kind import MatmulKind
from autosched.outputs.records import problem_from_shape
from autosched.outputs.spec import match_contraction
from autosched.rewrite.common import problem_key
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
    names = ["attention", "convolution", "gather", "matmul"]
    assert [k.name for k in registry.root_kinds()] == names
    assert registry.kind("attention").tuned and registry.kind("convolution").tuned


def _attention(form: str) -> AttentionProblem:
    """A 2-head attention of 4 query rows over 3 keys: q (b, m, k1), k (b, k2, k1), v (b, k2, n)."""
    return AttentionProblem(
        loops=("b", "m", "k1", "k2", "n"),
        loop_sizes=(2, 4, 8, 3, 5),
        query_type="f32",
        key_type="f32",
        value_type="f32",
        mask_type="",
        operand_loops=((0, 1, 2), (0, 3, 2), (0, 3, 4), (0, 1, 4)),
        scale=0.5,
        form=form,
        output_type="f32",
    )


def test_each_kind_answers_for_its_record_and_its_check(tmp_path):
    """Records and checks ask the problem, never its kind: each shipped kind's problem reads
    back from its record as itself and makes its own check's inputs and reference."""
    matmul = MatmulProblem.from_shape(
        {
            "op": "linalg.matmul",
            **{"m": 6, "n": 5, "k": 4, "batch": 0},
            **{"lhs_type": "f16", "rhs_type": "f16", "acc_type": "f32"},
            **{"transpose_a": False, "transpose_b": True, "zero_init": False},
        }
    )
    convolution = nchw_problem(1, 3, 6, 4, 3, element="f32", acc="f32")
    problems = [matmul, convolution, _attention("op")]
    for problem in problems:
        again = problem_from_shape(problem.record_shape())
        assert type(again) is type(problem) and again.key() == problem.key()
        data = make_problem_data(problem, str(tmp_path / problem.kind))
        assert len(data.inputs) == len(problem.check_operands())
        assert data.reference.shape == tuple(problem.output_shape)
        assert problem.reference_bytes() >= 0
        assert problem_key(problem) in (problem.name, problem.key())  # the rewrite's name
    assert matmul.tolerance() == 1e-3 and convolution.tolerance() == 1e-4  # mixed, f32
    # Attention over one key is that key's value, whatever the scores.
    one_key = _attention("op")
    one_key.loop_sizes = (2, 4, 8, 1, 5)
    q, k, v = (np.random.default_rng(0).uniform(size=o.shape) for o in one_key.check_operands())
    assert np.allclose(one_key.reference(q, k, v), np.broadcast_to(v, (2, 4, 5)))
    # A problem checked only on IREE's dispatch makes no inputs.
    flow = _attention("flow")
    assert flow.check_operands() is None and flow.reference_bytes() == 0
    assert make_problem_data(flow, str(tmp_path / "flow")).inputs == []
    # A gather (an embedding's lookup) too: read back from its record, checked on IREE's
    # dispatch only, exactly (a copy).
    gather = GatherProblem(tokens=16, width=64, rows=256, element="f16", index_type="i64")
    again = problem_from_shape(gather.record_shape())
    assert type(again) is GatherProblem and again.key() == gather.key()
    assert gather.check_operands() is None and gather.tolerance() == 0.0
    assert make_problem_data(gather, str(tmp_path / "gather")).inputs == []
