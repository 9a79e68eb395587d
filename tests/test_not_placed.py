"""No winner silently left out (issue 51 item 3): the tiny timm ViT (37 tokens, an odd count
no IREE attention tile divides) has its flash winner replace its attentions in the model the
run builds, the custom build's ops are counted per winner and per kind, and a winner that
cannot be placed is named, with why, on the console and in the summary's `not_placed`.

The kernels compile to PTX with Triton and no GPU; the model is rewritten with IREE's own
tools for sm_90, as the run's proof rewrites it."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter

import pytest

from autosched.config import RunConfig
from autosched.drivers.campaign import CampaignReport, write_summary
from autosched.drivers.custom_route import write_custom_substitution
from autosched.drivers.model_stages import report
from autosched.drivers.model_stages.decide import not_placed, placed_by_kind
from autosched.drivers.model_stages.prepare import prepare
from autosched.kernels.flash_attention.family import FLASH
from autosched.kernels.registry import family
from autosched.outputs.records import Trial
from autosched.outputs.report import RunLog
from autosched.rewrite.apply import rewrite_model
from autosched.rewrite.attention_ops import model_attentions, paired
from autosched.rewrite.placement import (
    CUSTOM_ROUTE,
    IREE_ROUTE,
    check_placed,
    placed_kernels,
    replaced_by_kind,
    replaced_line,
)
from autosched.run.problem import ProblemResult

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
VIT_F16 = os.path.join(MODELS, "timm_vit_tiny_f16.mlirbc")
FLASH_POINT = {"kernel": FLASH, "q_tile": 64, "kv_tile": 64, "q_warps": 4, "kv_stages": 3}
MATMUL_POINT = {"pipeline": "Custom", "tile_m": 64, "tile_n": 64, "tile_k": 64, "warps": 4}
MATMUL_POINT |= {"pipeline_depth": 3, "group_m": 8, "split_k": 1}


def _won(entry, problem, point):
    """The entry with IREE's default at 1 ms, and the custom search on `problem` whose best
    is `point` at 0.01 ms (what the run's search stage hands the decide stage)."""
    best = Trial(problem.name, "cuda", "sm_90", "custom", point, False, "ok", median_ms=0.01)
    found = ProblemResult(problem, None, [best], best=best, best_ms=0.01, baseline_ms=1.0)
    campaign = ProblemResult(entry.problem, None, [], baseline_ms=1.0)
    return dataclasses.replace(entry, result=campaign), found


def _vit_run(tmp_path, model: str, extra=(), attention_form=lambda op: op):
    """The run's prepare stage on the ViT for sm_90, every problem won by a custom kernel
    (the families' first points: flash on the attention's op form, Triton on the patch
    convolution's, the matmul family elsewhere), the spec written by the run's own writer
    and the model rewritten as the proof does: (prepared, spec, rewritten model)."""
    pytest.importorskip("triton")
    config = RunConfig(target="cuda", arch="sm_90", work_dir=str(tmp_path), input_file=model)
    prepared = prepare(config)
    target, source = prepared.target, prepared.layout.source
    ops = model_attentions(source, target.compile_flags(), str(tmp_path / "model" / "attention"))
    entries, custom = [], {}
    for entry in [*prepared.problems, *extra]:
        problem, point = entry.problem, MATMUL_POINT
        if problem.kind == "attention":
            problem, point = attention_form(paired(problem, ops)), FLASH_POINT
        elif problem.kind == "convolution":
            continue  # the patch embedding: IREE's (its Triton kernel is tested elsewhere)
        entry, custom[entry.problem.name] = _won(entry, problem, point)
        entries.append(entry)
    log = RunLog(str(tmp_path / "run.log"))
    spec = write_custom_substitution(
        str(tmp_path / "results.custom.mlir"), target, entries, custom, log,
        (source, str(tmp_path / "model")),
    )  # fmt: skip
    rewritten = None
    if spec.path:
        rewritten, _ = rewrite_model(
            source, spec.path, target.compile_flags(), str(tmp_path / "custom.mlir"), 300
        )
    return prepared, spec, rewritten


@pytest.fixture(scope="module")
def vit_f16(tmp_path_factory):
    return _vit_run(tmp_path_factory.mktemp("vit"), VIT_F16)


def test_the_vits_attention_is_replaced_by_its_flash_winner(vit_f16):
    """Both blocks' attentions (2 heads x 37 rows, head dim 32, no mask) run the flash
    kernel in the model the run builds, beside the 9 matmuls; every winner is placed."""
    _, spec, rewritten = vit_f16
    placed = placed_kernels(rewritten)
    assert {w.kind for w in spec.winners} == {"attention", "matmul"}
    assert spec.not_placed == []
    assert check_placed(spec.winners, placed) == []
    assert replaced_by_kind(spec.winners, placed) == {"attention": 2, "matmul": 9}
    (attention,) = [w for w in spec.winners if w.kind == "attention"]
    assert attention.problem == "attention_2x2x37x32x37x32_f16"
    assert placed[attention.kernel] == 2
    assert sum(placed.values()) == 11  # one kernel per extern: nothing counted twice


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_a_winner_no_op_matches_is_not_placed(vit_f16, tmp_path):
    """A matmul winner of a shape the model does not have (its spec arm matches nothing):
    no op runs its kernel, and the check names it, with its route and why, while the
    others stay placed."""
    prepared, _, _ = vit_f16
    entry = next(e for e in prepared.problems if e.problem.kind == "matmul")
    stranger = dataclasses.replace(entry, problem=dataclasses.replace(entry.problem, m=96))
    _, spec, rewritten = _vit_run(tmp_path, VIT_F16, [stranger])
    (missing,) = check_placed(spec.winners, placed_kernels(rewritten))
    assert (missing.problem, missing.route) == (stranger.problem.name, CUSTOM_ROUTE)
    assert "no matmul op of the model matched its kernel" in missing.reason
    assert replaced_by_kind(spec.winners, placed_kernels(rewritten))["attention"] == 2


def test_a_winner_its_family_refuses_is_reported_on_the_console_and_in_the_summary(
    tmp_path, capsys
):
    """A flash winner for an attention of head dim 48 (the family takes 64, 128 and the
    like): the spec writer refuses it, and the run says which problem, which route and why,
    in red on the console, in run.log and in the summary's `not_placed`; a summary with
    every winner placed still holds `not_placed`, empty."""

    def head_dim_48(op):
        sizes = [
            48 if role in ("n", "k1") else s
            for role, s in zip(op.loops, op.loop_sizes, strict=True)
        ]
        return dataclasses.replace(op, loop_sizes=tuple(sizes))

    _, spec, rewritten = _vit_run(tmp_path, VIT_F16, attention_form=head_dim_48)
    (refused,) = spec.not_placed
    assert refused.problem == "attention_2x2x37x32x37x32_f16"
    assert refused.route == CUSTOM_ROUTE and "head dim 48" in refused.reason
    assert "attention" not in {w.kind for w in spec.winners}
    proof = {"custom": {"placed": dict(placed_kernels(rewritten)), "message": ""}}
    applied = {"matmul_not_configured": False}
    missing = not_placed(spec, applied, proof)
    assert [(m.problem, m.route) for m in missing] == [
        (refused.problem, CUSTOM_ROUTE),
        ("matmul_not_configured", IREE_ROUTE),
    ]
    log = RunLog(str(tmp_path / "run.log"))
    report.placement(log, missing, placed_by_kind(spec, proof))
    out, err = capsys.readouterr()
    assert "custom kernels: 9 matmul replaced" in out
    assert f"NOT PLACED: {refused.problem}'s custom kernel winner: " in err
    assert "head dim 48" in (tmp_path / "run.log").read_text()
    summary = str(tmp_path / "results.summary.json")
    rows = [m.row() for m in missing]
    write_summary(summary, None, CampaignReport(1, 1, "fast", 0.0, not_placed=rows))
    assert json.load(open(summary))["not_placed"][0] == {
        "problem": refused.problem, "route": CUSTOM_ROUTE, "reason": refused.reason,
    }  # fmt: skip
    write_summary(summary, None, CampaignReport(1, 1, "fast", 0.0))
    assert json.load(open(summary))["not_placed"] == []


def test_a_build_that_does_not_compile_leaves_every_custom_winner_out(vit_f16):
    """Where the custom build does not compile, none of its winners is in a model: each is
    named with the build's message."""
    _, spec, _ = vit_f16
    proof = {"custom": {"placed": {}, "message": "does not compile: iree-opt: boom"}}
    missing = not_placed(spec, {}, proof)
    assert {m.problem for m in missing} == {w.problem for w in spec.winners}
    assert all("does not compile: iree-opt: boom" in m.reason for m in missing)


def test_the_replaced_line_counts_per_kind():
    assert replaced_line({"matmul": 6, "attention": 2}) == (
        "custom kernels: 2 attention, 6 matmul replaced"
    )
    assert replaced_line({}) == "custom kernels: none replaced"
    assert check_placed([], Counter()) == []
    assert family("flash_attention").unsupported is not None
