"""One verdict (issue 47, item 3): the whole model's paired statistic decides, and the
console, the summary, the spec written, the printed commands and the CSV's ranks follow it."""

from __future__ import annotations

import csv
import json
import os

import pytest
from click.testing import CliRunner
from conftest import matmul_function

from autosched.cli import cli
from autosched.config import RunConfig
from autosched.drivers.model_stages.report import model_line
from autosched.drivers.proof import FASTER, NO_CHANGE, SLOWER, ModelProof, model_verdict
from autosched.ops.matmul import analyze_file
from autosched.outputs.report import mark_chosen, rechoose_csv
from autosched.outputs.spec import tuning_spec
from autosched.targets.cpu import CpuTarget

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")


def test_the_verdict_needs_the_whole_interval_beyond_noise():
    assert model_verdict([1.0] * 5, [0.8, 0.85, 0.9, 0.82, 0.88]).verdict == FASTER
    assert model_verdict([1.0] * 5, [1.2, 1.1, 1.3, 1.25, 1.15]).verdict == SLOWER
    # The case: a median of 0.73x whose rounds straddle 1 is no change, not slower.
    mixed = model_verdict([1.0] * 5, [1.37, 1.6, 0.9, 1.2, 1.5])
    assert mixed.verdict == NO_CHANGE
    assert "no change within noise" in mixed.describe()
    assert model_verdict([1.0] * 2, [0.5, 0.5]).verdict == NO_CHANGE  # too few rounds
    assert model_verdict([1.0] * 5, [0.99] * 5).verdict == NO_CHANGE  # under the noise floor


def test_the_model_line_says_what_the_verdict_says():
    proof = ModelProof(
        "main", 0.5264, 0.7239, 0.1, 0.1, None, True, 0.0,
        default_rounds_ms=[0.5, 0.6, 0.5, 0.55, 0.52],
        tuned_rounds_ms=[0.72, 0.4, 0.9, 0.5, 0.73],
    )  # fmt: skip
    line = model_line(proof)
    assert "no change within noise" in line and "SLOWER" not in line
    proof.outputs_compared, proof.outputs_match = False, False
    proof.message = "IREE's default build gives NaN or inf in output 0"
    line = model_line(proof)
    assert "outputs could not be compared" in line and "DIFFER" not in line


def test_the_chosen_row_ranks_first():
    """Rows faster at their first measurement do not outrank a chosen iree_default."""
    rows = [
        {"problem": "p", "config": "iree_default", "status": "ok", "median_ms": "2.0",
         "retimed_ms": "1.9", "rank": "", "chosen": ""},
        {"problem": "p", "config": "a", "status": "ok", "median_ms": "1.0",
         "retimed_ms": "1.95", "rank": "", "chosen": ""},
        {"problem": "p", "config": "b", "status": "ok", "median_ms": "1.5",
         "retimed_ms": "", "rank": "", "chosen": ""},
        {"problem": "p", "config": "c", "status": "wrong_answer", "median_ms": "",
         "retimed_ms": "", "rank": "", "chosen": ""},
    ]  # fmt: skip
    mark_chosen(rows, {("p", "iree_default")})
    assert [(r["config"], r["rank"], r["chosen"]) for r in rows] == [
        ("iree_default", "1", "yes"), ("a", "2", ""), ("b", "3", ""), ("c", "", ""),
    ]  # fmt: skip


def _no_op_starter(tmp_path) -> str:
    """A tuning spec for a matmul the model does not have: the 'tuned' build is IREE's
    default, so the model cannot be faster with it."""
    module = tmp_path / "other.mlir"
    module.write_text("module {\n" + matmul_function("other", 8, 8, 8) + "}\n")
    (problem,) = analyze_file(str(module)).problems
    point = {"tile_m": 8, "tile_n": 8, "vec_m": 4, "vec_n": 4, "vec_k": 1}
    starter = tmp_path / "starter.mlir"
    starter.write_text(tuning_spec([(problem, CpuTarget(RunConfig()), point)]))
    return str(starter)


@pytest.mark.slow
def test_a_model_not_faster_writes_no_spec_and_prints_no_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    starter = _no_op_starter(tmp_path)
    model = os.path.join(MODELS, "llama_mlp.mlirbc")
    result = CliRunner().invoke(
        cli, ["run", model, "--budget", "1", "--starter-spec", starter, "--fresh"]
    )
    assert result.exit_code == 0, result.output
    folder = tmp_path / "generated" / "llama_mlp"
    summary = json.loads((folder / "results.summary.json").read_text())
    # The same module twice (the starter configures none of the model's dispatches): no
    # change, whatever noise the rounds saw (one CI run's 5 rounds were all 1.03x-1.28x).
    assert summary["model"]["verdict"] == NO_CHANGE, result.output
    assert not (folder / "results.spec.mlir").exists()
    assert "tuned model:" not in result.output
    assert summary["model"]["spec_written"] is False
    assert summary["model"]["no_spec"].startswith("no tuning spec: "), summary["model"]
    assert not summary["model"]["outputs_compared"] or summary["model"]["tuned_ms"]
    model_lines = [line for line in result.output.splitlines() if line.startswith("model:")]
    # The one trial can win its re-timing by noise on a loaded machine (one CI run): then
    # the tuned build carries it and is no longer the default's bytes.
    if not any(row["speedup"] for row in summary["problems"]):
        assert "the tuned build is IREE's default byte for byte" in model_lines[0]
        assert summary["model"]["ratio_rounds"] == [1.0] * 5
    else:
        assert "byte for byte" not in model_lines[0]
        assert len(summary["model"]["ratio_rounds"]) == 5
    assert all(not row["in_spec"] for row in summary["problems"])
    with open(folder / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    chosen = [row for row in rows if row["chosen"] == "yes"]
    assert chosen and all(row["config"] == "iree_default" for row in chosen)
    assert all(row["rank"] == "1" for row in chosen)


@pytest.mark.parametrize("chosen", ["iree_default", "a"])
def test_the_csv_is_chosen_again_after_the_verdict(tmp_path, chosen):
    path = tmp_path / "results.csv"
    columns = ["problem", "config", "status", "median_ms", "retimed_ms", "rank", "chosen"]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        writer.writerow(
            dict(zip(columns, ["p", "iree_default", "ok", "2", "", "2", ""], strict=True))
        )
        writer.writerow(dict(zip(columns, ["p", "a", "ok", "1", "", "1", "yes"], strict=True)))
    rechoose_csv(str(path), {("p", chosen)})
    with open(path, newline="") as handle:
        rows = {row["config"]: row for row in csv.DictReader(handle)}
    assert rows[chosen]["chosen"] == "yes" and rows[chosen]["rank"] == "1"
