"""The module timed is the candidate's (issue 22).

transformers' own LlamaMLP (3-D `nn.Linear`s: unit-batch `batch_matmul`s where IREE forms its
dispatches), in f32 and bf16, committed as exports. On CUDA (compiled here, no GPU needed) the
dispatch benchmark compiled again from the input phase re-forms its root into a 5-loop generic
that no spec matches; compiled from executable sources it keeps the model's form and carries
the candidate. Every build is checked for its configuration, and a candidate that does not
carry it is recorded `not_applied`, never timed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG, attach_dispatches

from autosched.cli import cli
from autosched.compile import compile_one
from autosched.config import RunConfig
from autosched.drivers.model_stages.prepare import model_problems
from autosched.model.configured import check_build, dispatch_configs, form_of
from autosched.model.lowering import analyze_model
from autosched.outputs import spec
from autosched.run.builds import CandidateBuilds, dispatch_job, expected_config
from autosched.search.space import build_space
from autosched.targets.cuda import CudaTarget

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
CFG = MODEL_CFG  # small and fast: a few trials, short timings


def cuda_problems(tmp_path, element: str):
    """The bf16/f32 model's problems for sm_80, each with IREE's dispatch benchmark."""
    target = CudaTarget(RunConfig(target="cuda", arch="sm_80"))
    model = os.path.join(MODELS, f"hf_llama_mlp_{element}.mlirbc")
    flags = target.compile_flags()
    problems, _ = model_problems(analyze_model(model, flags), target)
    attach_dispatches(problems, model, flags, str(tmp_path / "dispatches"))
    return target, model, problems


def first_point(problem, target):
    return next(p for p in build_space(problem, target, {}).points if target.in_spec(p))


@pytest.mark.parametrize("element", ["f32", "bf16"])
def test_cuda_timed_dispatch_carries_the_candidate(tmp_path, element):
    target, model, problems = cuda_problems(tmp_path, element)
    assert len(problems) == 2 and all(p.problem.batch == 1 for p in problems)
    model_forms = {
        c.entry_point: form_of(c) for c in dispatch_configs(model, target.compile_flags())
    }
    for entry in problems:
        problem, point = entry.problem, first_point(entry.problem, target)
        stem = str(tmp_path / problem.name)
        timed = dispatch_job(entry.benchmark, problem, target, point, stem)
        assert compile_one(timed, 300).status == "ok"
        verdict = check_build(timed.output, expected_config(problem, target, point))
        assert verdict.ok, verdict.message
        # The default is IREE's default of the same form as the model's dispatch.
        default = dispatch_job(entry.benchmark, problem, target, None, stem + "_default")
        assert compile_one(default, 300).status == "ok"
        form = check_build(default.output, None).form
        assert form == verdict.form == model_forms[entry.benchmark.entry_point]


def test_cuda_dispatch_re_formed_from_the_input_phase_is_caught(tmp_path):
    """The old path (no `--compile-from`): the candidate's spec misses the re-formed root,
    and the check says so, naming the 5-loop form."""
    target, _, problems = cuda_problems(tmp_path, "bf16")
    entry = problems[0]
    point = first_point(entry.problem, target)
    old = replace(entry.benchmark, flags=())
    job = dispatch_job(old, entry.problem, target, point, str(tmp_path / "old"))
    assert compile_one(job, 300).status == "ok"
    verdict = check_build(job.output, expected_config(entry.problem, target, point))
    assert not verdict.ok
    assert "generic_mmnkk_1x32x" in verdict.form and "not the candidate's" in verdict.message


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(CFG)
    for element in ("f32", "bf16"):
        name = f"hf_llama_mlp_{element}.mlirbc"
        shutil.copy(os.path.join(MODELS, name), tmp_path / name)
    return tmp_path


def records(folder, model: str = "hf_llama_mlp_f32") -> list[dict]:
    return [json.loads(line) for line in (folder / f"generated/{model}/tuning.jsonl").open()]


def summary(folder, model: str = "hf_llama_mlp_f32") -> dict:
    return json.loads((folder / f"generated/{model}/results.summary.json").read_text())


@pytest.mark.parametrize("element", ["f32", pytest.param("bf16", marks=pytest.mark.slow)])
def test_unit_batch_model_on_cpu_times_applied_candidates(folder, element):
    result = CliRunner().invoke(cli, ["run", f"hf_llama_mlp_{element}.mlirbc", "--budget", "8"])
    assert result.exit_code == 0, result.output
    model = f"hf_llama_mlp_{element}"
    problems = summary(folder, model)["problems"]
    assert len(problems) == 2
    for problem in problems:
        assert problem["not_applied"] == 0 and not problem["stopped"]
        assert problem["timed_form"].startswith("linalg.batch_matmul batch_matmul_1x32x")
    # The default is timed again before each batch after the first; candidates are scored
    # against the latest timing.
    assert any(len(p["default_timings_ms"]) >= 2 for p in problems)
    measured = [r for r in records(folder, model) if not r["baseline"] and r["status"] == "ok"]
    assert measured and all(r["reference_ms"] > 0 for r in measured)
    assert "IREE default re-timed" in (folder / "generated" / model / "run.log").read_text()
    # The run ends with the model's line, a spec or not, and every dispatch of the model
    # (the weights' transposes too) timed before and after, largest first.
    assert "model: " in result.output
    dispatches = summary(folder, model)["dispatches"]
    assert len(dispatches) == 5 and all(d["default_ms"] > 0 for d in dispatches)
    assert sum("transpose" in d["entry_point"] for d in dispatches) == 2
    totals = [d["default_total_ms"] for d in dispatches]
    assert totals == sorted(totals, reverse=True)
    assert "all dispatches:" in (folder / "generated" / model / "run.log").read_text()
    # and what a call spends beside its dispatches: the whole model's time less their sum
    beside = re.search(
        r"model: ([\d.]+) ms a call, its dispatches timed alone ([\d.]+)", result.output
    )
    assert beside and float(beside[1]) > 0 and float(beside[2]) > 0


def test_a_spec_that_misses_the_root_stops_the_search_loudly(folder, monkeypatch):
    """A matcher that cannot match (its m is off by one): the probe before the search sees
    IREE's default on the root, and the problem stops with a warning naming both."""
    real = spec.match_contraction
    monkeypatch.setattr(
        spec,
        "match_contraction",
        lambda p, h="%op", free=frozenset(): real(replace(p, m=p.m + 1), h, free),
    )
    result = CliRunner().invoke(cli, ["run", "hf_llama_mlp_f32.mlirbc", "--budget", "4"])
    assert result.exit_code == 0, result.output
    assert "does not reach the root op IREE configures" in result.output
    assert "dims_equal %m, [32]" in result.output  # the matcher (as the spec should have it)
    assert all(r["baseline"] for r in records(folder))  # nothing timed as a candidate
    assert all(p["stopped"] for p in summary(folder)["problems"])


def test_a_candidate_that_does_not_apply_is_recorded_not_timed(folder, monkeypatch):
    """Without the probe, each candidate's build is checked: all are `not_applied`, none
    timed, the search stops after its first batch, and the summary counts them."""
    real = spec.match_contraction
    monkeypatch.setattr(
        spec,
        "match_contraction",
        lambda p, h="%op", free=frozenset(): real(replace(p, m=p.m + 1), h, free),
    )
    monkeypatch.setattr(CandidateBuilds, "probe", lambda self, search: None)
    result = CliRunner().invoke(cli, ["run", "hf_llama_mlp_f32.mlirbc", "--budget", "8"])
    assert result.exit_code == 0, result.output
    tuned = [r for r in records(folder) if not r["baseline"]]
    assert tuned and {r["status"] for r in tuned} == {"not_applied"}
    assert all(r["median_ms"] is None for r in tuned)
    assert all("carries" in r["message"] for r in tuned)
    problems = summary(folder)["problems"]
    assert sum(p["not_applied"] for p in problems) == len(tuned)
    assert len(tuned) == 2 * len(problems)  # one batch of two each, then stopped
    assert "not applied" in result.output


def test_fast_mode_builds_no_probe_and_stops_where_a_batch_does_not_apply(folder, monkeypatch):
    """Fast mode builds no probe (its first batch of known points tells as much): with a
    matcher that cannot match, each problem's first batch is recorded `not_applied`, none
    timed, and its search stops there with the same warning."""
    real = spec.match_contraction
    monkeypatch.setattr(
        spec,
        "match_contraction",
        lambda p, h="%op", free=frozenset(): real(replace(p, m=p.m + 1), h, free),
    )
    command = ["run", "hf_llama_mlp_f32.mlirbc", "--mode", "fast", "--budget", "16"]
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 0, result.output
    assert not list((folder / "generated").rglob("spec_probe.dispatch*"))
    tuned = [r for r in records(folder) if not r["baseline"]]
    assert tuned and {r["status"] for r in tuned} == {"not_applied"}
    assert "does not reach the root op IREE configures" in result.output
    assert all(p["stopped"] for p in summary(folder)["problems"])


@pytest.mark.slow
def test_a_tuned_model_slower_than_the_default_gets_no_spec(folder):
    """A starter spec that configures every matmul with 1x1 tiles makes the tuned model
    slower: the run says so, leaves winners out, writes no spec, and still ends with the
    default model's line."""
    from autosched.outputs.spec import tuning_spec
    from autosched.targets.cpu import CpuTarget

    target = CpuTarget(RunConfig())
    model = str(folder / "hf_llama_mlp_f32.mlirbc")
    problems, _ = model_problems(analyze_model(model, target.compile_flags()), target)
    slow = {"tile_m": 1, "tile_n": 1, "vec_m": 1, "vec_n": 1, "vec_k": 1}
    starter = folder / "slow.spec.mlir"
    starter.write_text(tuning_spec([(p.problem, target, slow) for p in problems]))
    result = CliRunner().invoke(
        cli, ["run", "hf_llama_mlp_f32.mlirbc", "--budget", "4", "--starter-spec", str(starter)]
    )
    assert result.exit_code == 0, result.output
    assert "the tuned model is SLOWER than IREE's default" in result.output
    assert "no spec is written" in result.output
    assert not (folder / "generated/hf_llama_mlp_f32/results.spec.mlir").exists()
    assert result.output.strip().count("(IREE default; nothing faster)") == 1
    assert summary(folder)["model"]["default_only"]


def test_the_dispatch_picture_is_drawn_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    from autosched.drivers.dispatch_table import DispatchRow, plot_dispatches

    rows = [
        DispatchRow("main$async_dispatch_0_attention", 1, 1.5, 1.5),
        DispatchRow("b", 2, 0.5, 0.2),
    ]
    path = plot_dispatches(rows, str(tmp_path / "d.png"))
    assert path and (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # With the custom build, a second panel of its dispatches makes a taller picture.
    custom = [DispatchRow("extern_dispatch_0", 1, 0.1, 0.1), DispatchRow("b", 2, 0.5, 0.2)]
    both = plot_dispatches(rows, str(tmp_path / "both.png"), custom=custom)
    from PIL import Image

    heights = [Image.open(tmp_path / name).size[1] for name in ("d.png", "both.png")]
    assert both and heights[1] > 1.5 * heights[0]


def test_the_dispatch_tables_say_what_the_layout_ops_left_cost():
    """Issue 24 item 2: where a transpose or a broadcast stays, the table says what it costs;
    a model without one gets no such line."""
    from autosched.drivers.dispatch_table import DispatchRow, custom_build_lines, dispatch_lines

    rows = [
        DispatchRow("extern_dispatch_4", 2, 0.4, 0.4),
        DispatchRow("main$async_dispatch_5_transpose_32x2048x128_bf16", 1, 0.05, 0.05),
        DispatchRow("main$async_dispatch_4_elementwise_broadcast_8x4x128x2048_bf16", 1, 0.1, 0.1),
        DispatchRow("main$async_dispatch_0_reduction_2048x4096_f32", 2, 0.025, 0.025),
    ]
    line = "layout ops left (transposes, broadcasts): 2 dispatch(es), 0.15 ms (15.0%)"
    assert line in custom_build_lines(rows)
    assert line in dispatch_lines(rows)
    assert "layout ops" not in dispatch_lines([rows[0], rows[3]])
