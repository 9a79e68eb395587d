"""Several measuring devices: which devices a run uses, and a real run on two CPU devices.

The CPU has two IREE devices, `local-task` (a thread pool) and `local-sync` (inline), so a
run on both exercises the multi-device executor without a GPU: candidates go to whichever
bench is free, each device's default is measured on it, and nothing is recorded twice.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import matmul_function

from autosched.cli import cli
from autosched.config import RunConfig
from autosched.errors import UserError
from autosched.targets.host import Gpu, Machine, measuring_devices

H200 = Gpu(0, "NVIDIA H200", "9.0")


def test_devices_default_to_the_run_device():
    assert measuring_devices(RunConfig(), "local-task", Machine()) == ["local-task"]


def test_all_gpus_by_index():
    machine = Machine((H200, Gpu(1, "NVIDIA H200", "9.0")))
    config = RunConfig(target="cuda", devices="all")
    assert measuring_devices(config, "cuda", machine) == ["cuda://0", "cuda://1"]


@pytest.mark.parametrize(
    ("devices", "gpus", "message"),
    [
        ("cuda://0,cuda://1", (H200, Gpu(1, "NVIDIA A100-SXM4-80GB", "8.0")), "mixes GPU models"),
        ("cuda://0,cuda://3", (H200,), "no such GPU here"),
        ("cuda://0,cuda://0", (H200,), "more than once"),
        ("cuda://GPU-abc", (H200,), "cuda://N"),
        ("all", (), "lists no GPU"),
    ],
)
def test_device_lists_that_are_refused(devices, gpus, message):
    with pytest.raises(UserError, match=message):
        measuring_devices(RunConfig(target="cuda", devices=devices), "cuda", Machine(gpus))


@pytest.mark.slow  # 15 s: run after the README's test command
def test_a_run_on_two_devices_measures_each_point_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    (tmp_path / "auto-scheduler.cfg").write_text(
        "[SearchSpace]\ntile_m = [8, 16, 32]\ntile_n = [16, 32]\nvec_m = [4]\nvec_n = [8]\n"
        "vec_k = [1]\n[SearchStrategy]\nn_trial = 6\nbatch_size = 6\n"
        "[Benchmark]\nrepetitions = 2\nmin_time = 0.01\ntimer = worker\n"
    )
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--devices", "local-task,local-sync"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in open("generated/mm/tuning.jsonl")]
    candidates = [r for r in records if not r["baseline"]]
    assert len(candidates) == 6
    assert len({r["config"] for r in candidates}) == 6  # none measured twice
    assert all(r["status"] == "ok" for r in records), [r["message"] for r in records]
    # The primary device's records name the run's device (so a one-device run resumes
    # them); the other device's name it.
    assert {r["device"] for r in candidates} == {"local-task", "local-sync"}
    log = open("generated/mm/run.log").read()
    assert "IREE default on local-sync" in log
    import csv

    rows = list(csv.DictReader(open("generated/mm/results.csv")))
    assert len(rows) == 7  # the default and six candidates, once each
    assert {r["device"] for r in rows if r["config"] != "iree_default"} == {
        "local-task",
        "local-sync",
    }
    # The same command again resumes every record, the second device's too.
    again = CliRunner().invoke(cli, ["run", "mm.mlir", "--devices", "local-task,local-sync"])
    assert again.exit_code == 0, again.output
    assert len(open("generated/mm/tuning.jsonl").read().splitlines()) == len(records)


def test_a_device_that_does_not_open_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.mlir").write_text(matmul_function("mm", 16, 16, 16))
    result = CliRunner().invoke(cli, ["run", "mm.mlir", "--devices", "local-task,nosuch://0"])
    assert result.exit_code == 2
    assert "Error: device 'nosuch://0' cannot be opened here" in result.output


@pytest.mark.slow
def test_problems_searched_at_once_record_each_point_once(tmp_path, monkeypatch):
    """Three problems, two at a time, on two devices: every point once in the database and
    the CSV, each problem's run-log section in one piece, re-timing after every search, and
    a rerun resumes everything."""
    import csv

    monkeypatch.chdir(tmp_path)
    shapes = {"a": (64, 64, 64), "b": (32, 64, 128), "c": (64, 32, 32)}
    (tmp_path / "mm.mlir").write_text(
        "".join(matmul_function(name, *shape) for name, shape in shapes.items())
    )
    (tmp_path / "auto-scheduler.cfg").write_text(
        "[SearchSpace]\ntile_m = [8, 16, 32]\ntile_n = [16, 32]\nvec_m = [4]\nvec_n = [8]\n"
        "vec_k = [1]\n[SearchStrategy]\ntuner = random\nn_trial = 4\nbatch_size = 2\n"
        "[Benchmark]\nrepetitions = 2\nmin_time = 0.01\ntimer = worker\n"
    )
    command = ["run", "mm.mlir", "--devices", "local-task,local-sync", "--parallel-problems", "2"]
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in open("generated/mm/tuning.jsonl")]
    assert all(r["status"] == "ok" for r in records), [r["message"] for r in records]
    by_problem: dict[str, list[str]] = {}
    for record in records:
        by_problem.setdefault(record["problem"], []).append(record["config"])
    assert len(by_problem) == 3
    for configs in by_problem.values():
        assert len(configs) == 5 and len(set(configs)) == 5  # the default and 4 points, once
    rows = list(csv.DictReader(open("generated/mm/results.csv")))
    assert sorted((r["problem"], r["config"]) for r in rows) == sorted(
        (r["problem"], r["config"]) for r in records
    )
    # Each problem's section holds its own trial lines and nothing of the others'.
    log = open("generated/mm/run.log").read()
    sections = log.split("\n--- problem ")[1:]
    assert len(sections) == 3
    for section in sections:
        name = section.split(" ---")[0]
        own = {line.strip().split(":")[0] for line in section.splitlines() if line[:2] == "  "}
        others = {c for p, configs in by_problem.items() if p != name for c in configs}
        assert set(by_problem[name]) - {"iree_default"} <= own
        assert not (own & others) - set(by_problem[name])
    # Re-timing waits for every search to end: no compile runs beside it.
    lines = log.splitlines()
    configs = {c for names in by_problem.values() for c in names}
    trial_lines = [i for i, line in enumerate(lines) if line.strip().split(":")[0] in configs]
    retimes = [i for i, line in enumerate(lines) if "re-timed beside the default" in line]
    assert len(retimes) == 3 and max(trial_lines) < min(retimes)
    # ... and each device re-times problems of its own, one at a time, not the primary alone.
    retimed_on = {lines[i].rsplit(" on ", 1)[1] for i in retimes}
    assert retimed_on == {"local-task", "local-sync"}, [lines[i] for i in retimes]
    assert "re-timing the finalists of" in result.output and "(3/3)" in result.output
    # How much of the run each device spent measuring (issue 11's idle share is the rest).
    (busy,) = [line for line in log.splitlines() if line.startswith("devices busy measuring")]
    shares = dict(part.rsplit(" ", 1) for part in busy.split(": ", 1)[1].split(", "))
    assert set(shares) == {"local-task", "local-sync"}
    assert all(0 < int(share.rstrip("%")) <= 100 for share in shares.values()), busy
    again = CliRunner().invoke(cli, command)
    assert again.exit_code == 0, again.output
    assert len(open("generated/mm/tuning.jsonl").read().splitlines()) == len(records)
