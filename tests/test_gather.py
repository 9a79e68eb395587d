"""An embedding's lookup as a root op: found in transformers' causal LM where IREE forms its
dispatches, tuned on the CPU over its tokens and width per workgroup and its vector width,
and a point's spec carried by IREE's own dispatch of it (the whole model with it: the
end-to-end test in test_torch_ops.py)."""

from __future__ import annotations

import os

import pytest
from conftest import attach_dispatches

from autosched.compile import compile_one
from autosched.config import RunConfig
from autosched.drivers.campaign import ModelProblem
from autosched.model.configured import check_build
from autosched.model.lowering import analyze_model
from autosched.ops.gather import GatherProblem
from autosched.outputs.dispatch_labels import dispatch_label
from autosched.run.builds import dispatch_job, expected_config
from autosched.search.space import build_space
from autosched.targets import make_target
from autosched.targets.cpu import CpuTarget

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
TINY_LM = os.path.join(MODELS, "hf_tiny_causal_lm_f32.mlirbc")
CACHED_BF16 = os.path.join(MODELS, "hf_tiny_llama_cached_bf16.mlirbc")
EMBEDDING = "gather_16x64_from_256_f32_i64"  # 16 token ids, rows of 64 from a vocabulary of 256


@pytest.mark.slow  # about 5 s or more on two cores: the README's command stays under 10 minutes
def test_the_embedding_of_a_causal_lm_is_a_gather_tuned_on_its_dispatch(tmp_path):
    """The lookup of 16 ids in the 256 x 64 table is the gather root of IREE's first
    dispatch; its space is tokens and width per workgroup and the vector width; a point's
    one-point spec reaches its root in IREE's own dispatch (compiled and configured so)."""
    target = CpuTarget(RunConfig())
    analysis = analyze_model(TINY_LM, target.compile_flags())
    (gather,) = [r for r in analysis.roots if r.kind == "gather"]
    assert isinstance(gather, GatherProblem) and gather.name == EMBEDDING
    assert (gather.tokens, gather.width, gather.rows) == (16, 64, 256)
    assert gather.occurrences == 1 and gather.flops == 16 * 64  # elements copied
    assert GatherProblem.from_shape(gather.record_shape()).name == EMBEDDING
    space = build_space(gather, target, {})
    assert {p["t_tile"] for p in space.points} == {1, 2, 4, 8, 16}
    assert all(p["d_tile"] % p["d_vec"] == 0 for p in space.points)
    point = {"t_tile": 4, "d_tile": 32, "d_vec": 8}
    entry, config = _configured_dispatch(TINY_LM, gather, target, point, tmp_path)
    assert entry.benchmark.check_source
    assert dispatch_label(entry.benchmark.check_source) == "gather 16x64"  # the table's label
    assert "distribution = [4, 32]" in config


def _configured_dispatch(model, gather, view, point, tmp_path) -> tuple[ModelProblem, str]:
    """The gather's entry with IREE's own dispatch of it, and the configuration a point's
    spec put there (checked in the built dispatch)."""
    entry = ModelProblem(gather, gather)
    attach_dispatches([entry], model, view.compile_flags(), str(tmp_path / "d"))
    assert entry.benchmark is not None
    timed = dispatch_job(entry.benchmark, gather, view, point, str(tmp_path / "timed"))
    assert compile_one(timed, 300).status == "ok"
    config = expected_config(gather, view, point)
    applied = check_build(timed.output, config)
    assert applied.ok, applied.message
    return entry, config


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_the_embedding_is_tuned_on_cuda_through_iree_s_own_dispatch(tmp_path):
    """On sm_90 the bf16 cached Llama's embedding (8 ids, rows of 64) is a gather problem
    too: TileAndFuse over tokens and width, IREE's default (4 tokens of 32 columns, 4
    columns a thread) among its starting points, and a point's spec reaches IREE's own
    dispatch of it, built for sm_90 (no GPU needed to build)."""
    target = make_target(RunConfig(target="cuda", arch="sm_90"))
    assert target.tunes("gather")
    analysis = analyze_model(CACHED_BF16, target.compile_flags())
    gathers = {r.name: r for r in analysis.roots if r.kind == "gather"}
    gather = gathers["gather_8x64_from_256_bf16_i64"]
    view = target.for_problem(gather)
    assert view.supports(gather) is None
    space = build_space(gather, target, {})
    assert {"t_tile": 4, "d_tile": 32, "d_vec": 4} in space.points  # IREE's default
    assert all((p["t_tile"] * p["d_tile"] // p["d_vec"]) % 32 == 0 for p in space.points)
    assert view.starting_points(gather)[0] in space.points
    point = {"t_tile": 8, "d_tile": 64, "d_vec": 8}
    _, config = _configured_dispatch(CACHED_BF16, gather, view, point, tmp_path)
    assert "workgroup_size = [64, 1, 1]" in config
