"""A run killed mid-way loses nothing, and the rerun re-measures nothing it recorded."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import matmul_function

CFG = """
[Env]
target = cpu
jobs = 1
[SearchSpace]
tile_m = [16, 32, 64]
tile_n = [16, 32, 64]
vec_m = [4, 8]
vec_n = [8, 16]
vec_k = [1, 4]
[SearchStrategy]
tuner = random
n_trial = 8
batch_size = 2
[Benchmark]
repetitions = 2
min_time = 0.005
retime_top = 2
"""


def records(path):
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path).read().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line torn by the kill
    return out


def start_run(folder):
    return subprocess.Popen(
        [sys.executable, "-m", "autosched", "run", "mm.mlir"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    "how", [signal.SIGINT, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)]
)
def test_killed_run_resumes_without_remeasuring(tmp_path, how):
    (tmp_path / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    (tmp_path / "auto-scheduler.cfg").write_text(CFG)
    database = tmp_path / "generated/mm/tuning.jsonl"

    run = start_run(tmp_path)
    deadline = time.time() + 120
    while len(records(database)) < 4 and time.time() < deadline and run.poll() is None:
        time.sleep(0.05)
    assert run.poll() is None, "the run ended before it could be interrupted"
    run.send_signal(how)
    _, stderr = run.communicate(timeout=60)
    if how == signal.SIGINT:
        assert run.returncode == 130, stderr  # stderr holds the stacks of a native crash
        assert "interrupted" in stderr and "Traceback" not in stderr
    first = records(database)
    assert 4 <= len(first) < 9
    measured_before = {r["config"] for r in first}

    rerun = start_run(tmp_path)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    after = records(database)[len(first) :]
    assert not {r["config"] for r in after} & measured_before  # nothing measured twice
    with open(tmp_path / "generated/mm/results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    configs = [r["config"] for r in rows]
    assert len(configs) == 9 and len(set(configs)) == 9  # the default and eight points, once each
    assert set(configs) == measured_before | {r["config"] for r in after}
