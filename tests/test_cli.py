"""The command line, through click's test runner and as a real subprocess."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import BATCH, DYNAMIC, NO_MATMUL, TRANSPOSED_B, matmul_function
from iree.compiler import ir

from autosched.cli import cli
from autosched.ops.matmul import walk_matmuls

FAST_CFG = """
[Env]
target = cpu
jobs = 2
[SearchSpace]
tile_m = [16, 32]
tile_n = [16, 32]
vec_m = [4, 8]
vec_n = [8, 16]
vec_k = [1, 4]
[SearchStrategy]
tuner = {tuner}
n_trial = {n_trial}
batch_size = 2
[Benchmark]
repetitions = 2
min_time = 0.005
retime_top = 2
{extra}
"""


class Workdir:
    """A test's own folder, holding a fast cfg as ./auto-scheduler.cfg."""

    def __init__(self, path):
        self.path = path
        self.configure()

    def __truediv__(self, name: str):
        return self.path / name

    def glob(self, pattern: str):
        return self.path.glob(pattern)

    def configure(self, tuner: str = "grid", n_trial: int = 3, extra: str = "") -> None:
        text = FAST_CFG.format(tuner=tuner, n_trial=n_trial, extra=extra)
        (self.path / "auto-scheduler.cfg").write_text(text)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return Workdir(tmp_path)


def rows(path="generated/mm/results.csv"):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_run_tunes_and_leaves_csv_log_and_tuned_module(workdir):
    (workdir / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    result = CliRunner().invoke(cli, ["run", "mm.mlir"])
    assert result.exit_code == 0, result.output
    table = rows()
    assert [r["config"] for r in table][0] == "iree_default"
    assert len(table) == 4  # the default and three candidates
    for row in table:
        assert row["status"] == "ok" and row["verification"] == "correct"
        assert float(row["median_ms"]) > 0 and float(row["gflops"]) > 0 and row["rank"]
        assert row["M"] == row["N"] == row["K"] == "64" and row["target"] == "cpu"
    assert sum(r["chosen"] == "yes" for r in table) == 1
    assert {"tile_m", "vec_k", "compile_s", "cv", "speedup"} <= set(table[0])
    log = (workdir / "generated/mm/run.log").read_text()
    assert "space: 32 raw points" in log and "IREE default" in log and "search time" in log
    assert "matmul_64x64x64_f32_f32_f32" in result.output  # the summary table
    tuned = ir.Module.parse((workdir / "generated/mm/results.best.mlir").read_text(), ir.Context())
    assert len(list(walk_matmuls(tuned))) == 1
    chosen = next(r for r in table if r["chosen"] == "yes")
    spec = workdir / "generated/mm/results.spec.mlir"
    assert spec.exists() == (chosen["config"] != "iree_default")
    assert ("iree-codegen-tuning-spec-path" in result.output) == spec.exists()
    assert "writing to CSV generated/mm/results.csv, log generated/mm/run.log" in result.output
    assert "resuming" not in result.output  # nothing to resume yet
    assert not list(workdir.glob("**/*.lock")) and not list(workdir.glob("**/.*.lock"))


@pytest.mark.slow  # 12-17 s: run after the README's test command
def test_module_with_several_matmuls_is_tuned_problem_by_problem(workdir):
    workdir.configure(n_trial=2, extra="dispatch_repeat = 2")
    text = (
        matmul_function("a", 64, 32, 32) + matmul_function("b", 32, 64, 32) + TRANSPOSED_B + BATCH
    )
    (workdir / "multi.mlir").write_text(text)
    result = CliRunner().invoke(cli, ["run", "multi.mlir", "--tuner", "random"])
    assert result.exit_code == 0, result.output
    table = rows("generated/multi/results.csv")
    problems = {r["problem"] for r in table}
    assert len(problems) == 4
    assert any(p.startswith("batch_matmul_2x32x16x64") for p in problems)
    assert any("transpose_b" in p for p in problems)
    # The transposed matmul accumulates into its input: checked without dispatch repeats.
    assert all(r["verification"] == "correct" for r in table if r["compile_status"] == "ok")


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_cfg_lists_with_no_valid_point_give_way_to_generated_knobs(workdir):
    """A cfg list that leaves no point (48 divides no 64) does not empty the search: the knobs
    are generated from the problem, and the console says why (issue 26)."""
    (workdir / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--config", "empty.cfg"])
    assert result.exit_code == 2  # the file does not exist yet: a clear error first
    (workdir / "empty.cfg").write_text(
        "[SearchSpace]\ntile_m = [48]\n[SearchStrategy]\nn_trial = 2\n"
    )
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--config", "empty.cfg"])
    assert result.exit_code == 0, result.output
    assert "tile_m does not divide M" in result.output
    assert "the cfg's lists of tile_m fit none of its sizes" in result.output
    assert "searched with knobs generated from the problem" in result.output
    assert "warning" not in result.output  # an ordinary case, not a fault
    assert len(rows()) == 3  # the default and two generated points


def test_dry_run_writes_variants_and_compiles_nothing(workdir):
    (workdir / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--dry-run", "--n-trial", "5"])
    assert result.exit_code == 0, result.output
    assert "32 points" in result.output
    variants = list(
        (workdir / "generated/mm/linalg/matmul/matmul_64x64x64_f32_f32_f32").glob("*.mlir")
    )
    assert len(variants) == 5
    assert not list(workdir.glob("generated/**/*.vmfb"))


@pytest.mark.slow
def test_rerun_resumes_and_measures_only_new_points(workdir):
    (workdir / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    assert (
        CliRunner().invoke(cli, ["run", "mm.mlir", "--tuner", "random", "--n-trial", "3"]).exit_code
        == 0
    )
    database = workdir / "generated/mm/tuning.jsonl"
    first = [json.loads(line) for line in database.read_text().splitlines()]
    assert len(first) == 4
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--tuner", "random", "--n-trial", "5"])
    assert result.exit_code == 0, result.output
    second = [json.loads(line) for line in database.read_text().splitlines()][len(first) :]
    assert len(second) == 2  # two new points; the default and three old points are reused
    assert not {r["config"] for r in second} & {r["config"] for r in first}
    assert len(rows()) == 6
    resumed = CliRunner().invoke(cli, ["run", "mm.mlir", "--n-trial", "1", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert (
        "resuming 5 trial(s) and 1 timing(s) of IREE's default from generated/mm/tuning.jsonl"
        in resumed.output
    )
    assert len(database.read_text().splitlines()) == 6  # nothing new to measure
    fresh = CliRunner().invoke(cli, ["run", "mm.mlir", "--n-trial", "1", "--fresh"])
    assert fresh.exit_code == 0, fresh.output
    third = [json.loads(line) for line in database.read_text().splitlines()][6:]
    assert len(third) == 2 and sum(r["baseline"] for r in third) == 1  # the default re-measured


@pytest.mark.parametrize(
    "text, args, expected",
    [
        (None, ["run", "absent.mlir"], "absent.mlir: no such file"),
        ("func.func @f( {", ["run", "bad.mlir"], "does not parse"),
        (NO_MATMUL, ["run", "bad.mlir"], "no linalg.matmul"),
        (DYNAMIC, ["run", "bad.mlir"], "dynamic shape"),
        (
            matmul_function("f", 8, 8, 8),
            ["run", "bad.mlir", "--config", "nope.cfg"],
            "no such config file",
        ),
        (
            matmul_function("f", 8, 8, 8),
            ["run", "bad.mlir", "--n-trial", "0"],
            "must be at least 1",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(workdir, text, args, expected):
    if text is not None:
        (workdir / "bad.mlir").write_text(text)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert expected in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_rows_no_power_of_two_tile_divides_are_tuned_with_a_partial_last_tile(workdir):
    """37 rows (a tiny ViT's tokens): no tile from 8 up divides them, so tiles overhang
    (IREE's CPU pipeline runs a partial last tile) where the space used to be empty; each
    candidate checked is right."""
    (workdir / "mm.mlir").write_text(matmul_function("mm", 37, 64, 64))
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--n-trial", "4", "--seed", "1"])
    assert result.exit_code == 0, result.output
    tuned = [r for r in rows() if r["config"] != "iree_default"]
    assert len(tuned) == 4 and all(37 % int(r["tile_m"]) for r in tuned)
    checked = [r for r in tuned if r["verification"] != "unchecked"]
    assert checked and all(r["verification"] == "correct" for r in checked), checked


@pytest.mark.parametrize("content", [b"\x93 not bytecode \x00\xff" * 40, b"ML\xefR\x00\x06"])
def test_a_corrupt_bytecode_model_is_one_line_and_exit_2(workdir, content):
    """A `.mlirbc` that is not MLIR bytecode, or is cut short after its magic, is a model
    file (not a module of bare matmuls): its parse failure names the file, no traceback."""
    (workdir / "model.mlirbc").write_bytes(content)
    result = CliRunner().invoke(cli, ["run", "model.mlirbc", "--mode", "fast"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: model.mlirbc") and "does not parse" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.skipif(__import__("shutil").which("nvidia-smi") is not None, reason="has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error_but_dry_run_works(workdir):
    (workdir / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64, "f16", "f32"))
    (workdir / "cuda.cfg").write_text("[Env]\ntarget = cuda\n")
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--config", "cuda.cfg"])
    assert result.exit_code == 2 and "nvidia-smi finds none" in result.output
    dry = CliRunner().invoke(
        cli, ["run", "mm.mlir", "--config", "cuda.cfg", "--arch", "sm_90", "--dry-run"]
    )
    assert dry.exit_code == 0, dry.output
    assert list(workdir.glob("generated/mm/linalg/matmul/*/*.mlir"))


def test_bad_cfg_key_through_the_installed_command(workdir):
    (workdir / "mm.mlir").write_text(matmul_function("mm", 16, 16, 16))
    (workdir / "auto-scheduler.cfg").write_text("[SearchSpace]\ntile_q = [4]\n")
    finished = subprocess.run(
        [sys.executable, "-m", "autosched", "run", "mm.mlir"], capture_output=True, text=True
    )
    assert finished.returncode == 2
    assert finished.stderr.strip().count("\n") == 0 and "unknown key 'tile_q'" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_subprocess_run_end_to_end(workdir):
    (workdir / "mm.mlir").write_text(matmul_function("mm", 32, 32, 32))
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "autosched",
            "run",
            "mm.mlir",
            "--n-trial",
            "2",
            "--output",
            "out/r.csv",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert finished.returncode == 0, finished.stderr
    assert len(rows("out/r.csv")) == 3
    assert (workdir / "out/r.best.mlir").is_file()


def test_early_stopping_ends_a_problem_without_improvement(workdir):
    workdir.configure(tuner="random", n_trial=8, extra="")
    cfg = (workdir / "auto-scheduler.cfg").read_text().replace("batch_size = 2", "batch_size = 1")
    (workdir / "auto-scheduler.cfg").write_text(cfg)
    (workdir / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--early-stopping", "1"])
    assert result.exit_code == 0, result.output
    # Eight trials in a row would each have to beat all before them (1 chance in 40320).
    assert len(rows()) < 9
    assert (
        "early stop: 1 trials without improvement" in (workdir / "generated/mm/run.log").read_text()
    )


@pytest.mark.slow
def test_a_later_problem_starts_from_the_database_history(workdir):
    """With `history = database` a run's database teaches the cost model of the next
    problem: the second run's problem, a new shape, starts from the first run's records
    (both name one database: each input's own is in its work folder); with the default,
    `history = none`, the third does not."""
    cfg = workdir / "auto-scheduler.cfg"

    def configure(history: str) -> None:
        workdir.configure(tuner="xgboost", n_trial=6, extra="dispatch_repeat = 2")
        text = cfg.read_text().replace("[Env]\n", "[Env]\ndatabase = shared.jsonl\n")
        cfg.write_text(text.replace("batch_size = 2", f"batch_size = 2\n{history}"))

    configure("history = database")
    (workdir / "first.mlir").write_text(matmul_function("first", 64, 64, 32))
    (workdir / "second.mlir").write_text(matmul_function("second", 32, 64, 64))
    assert CliRunner().invoke(cli, ["run", "first.mlir"]).exit_code == 0
    result = CliRunner().invoke(cli, ["run", "second.mlir"])
    assert result.exit_code == 0, result.output
    log = (workdir / "generated" / "second" / "run.log").read_text()
    assert "the cost model starts from 1 other problem(s) of shared.jsonl" in log
    configure("")
    (workdir / "third.mlir").write_text(matmul_function("third", 64, 32, 64))
    assert CliRunner().invoke(cli, ["run", "third.mlir"]).exit_code == 0
    last_run = (workdir / "generated" / "third" / "run.log").read_text().split("\n=====")[-1]
    assert "problem matmul_64x32x64" in last_run and "the cost model starts from" not in last_run


def test_each_input_has_its_own_work_folder_and_nothing_of_one_is_read_by_another(workdir):
    """Two modules tuned one after the other in one folder: each run's files are in its
    own generated/<stem>/, the second run resumes nothing of the first, and the first's
    files are as it left them."""
    (workdir / "first.mlir").write_text(matmul_function("first", 32, 32, 32))
    (workdir / "second.mlir").write_text(matmul_function("second", 64, 32, 32))
    assert CliRunner().invoke(cli, ["run", "first.mlir", "--n-trial", "1"]).exit_code == 0
    first = {p.name: p.read_bytes() for p in (workdir / "generated/first").glob("*.*")}
    result = CliRunner().invoke(cli, ["run", "second.mlir", "--n-trial", "1"])
    assert result.exit_code == 0, result.output
    assert "resuming" not in result.output and "first" not in result.output
    assert {p.name: p.read_bytes() for p in (workdir / "generated/first").glob("*.*")} == first
    problems = {r["problem"] for r in rows("generated/second/results.csv")}
    assert problems == {"matmul_64x32x32_f32_f32_f32"}
    assert "matmul_32x32x32" not in (workdir / "generated/second/tuning.jsonl").read_text()
    assert "matmul_32x32x32" not in (workdir / "generated/second/run.log").read_text()


@pytest.mark.slow  # three model runs
def test_two_models_tuned_one_after_the_other_report_as_each_alone(tmp_path, monkeypatch):
    """Issue 47: the dispatch table of the second model listed the first's dispatches,
    timed again from the shared generated/model/. Run one after the other in one folder,
    the second's problems, dispatches and proof are those it has alone."""
    import shutil

    from conftest import MODEL_CFG

    models = os.path.join(os.path.dirname(__file__), "data", "models")

    def project(folder) -> None:
        folder.mkdir()
        (folder / "auto-scheduler.cfg").write_text(MODEL_CFG)
        for name in ("llama_mlp.mlirbc", "attention.mlirbc"):
            shutil.copy(os.path.join(models, name), folder)

    def tables(folder) -> dict:
        report = json.loads((folder / "generated/attention/results.summary.json").read_text())
        return {
            "problems": sorted(p["problem"] for p in report["problems"]),
            "dispatches": sorted(d["entry_point"] for d in report["dispatches"]),
            "function": report["model"]["function"],
        }

    both, alone = tmp_path / "both", tmp_path / "alone"
    project(both)
    project(alone)
    for folder, names in ((both, ["llama_mlp", "attention"]), (alone, ["attention"])):
        monkeypatch.chdir(folder)
        for name in names:
            result = CliRunner().invoke(cli, ["run", f"{name}.mlirbc", "--budget", "2"])
            assert result.exit_code in (0, 1), result.output
    assert tables(both) == tables(alone)
    mlp = json.loads((both / "generated/llama_mlp/results.summary.json").read_text())
    assert not set(d["entry_point"] for d in mlp["dispatches"]) & set(tables(both)["dispatches"])
