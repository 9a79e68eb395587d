"""`--executor ray` on a real local Ray cluster (`ray start --head`), with CPU measuring
actors: results agree with the local executor, a killed actor loses nothing, and a missing
`ray` is one clear error."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import matmul_function, run_folder

ray = pytest.importorskip("ray")

CFG = (
    "[SearchSpace]\ntile_m = [8, 16, 32]\ntile_n = [16, 32]\nvec_m = [4]\nvec_n = [8]\n"
    "vec_k = [1]\n[SearchStrategy]\nn_trial = 6\nbatch_size = 3\n"
    "[Benchmark]\nrepetitions = 2\nmin_time = {min_time}\ntimer = worker\n"
)
TWO_ACTORS = ["--devices", "local-task,local-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def no_token_auth():
    """Ray 2.60 turns token authentication on for a cluster once a token exists in
    ~/.ray (a `ray.init()` cluster writes one), and a client then needs RAY_AUTH_MODE=token.
    These tests run their clusters without it, whatever earlier runs left in ~/.ray."""
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    yield
    if saved is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = saved


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, no_token_auth):
    """A Ray head on this host, as the README starts one; its address."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    port = _free_port()
    temp = tmp_path_factory.mktemp("r")  # short: Ray's socket paths have a length limit
    started = subprocess.run(
        [
            ray_cli,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",  # as many as the two measuring actors: compiles must still run
            f"--temp-dir={temp}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert started.returncode == 0, started.stderr[-2000:]
    yield f"127.0.0.1:{port}"
    subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120)


def _autosched(folder, *arguments, wait=True, **kwargs):
    command = [sys.executable, "-m", "autosched", "run", "mm.mlir", *arguments]
    if wait:
        return subprocess.run(
            command, cwd=folder, capture_output=True, text=True, timeout=600, **kwargs
        )
    return subprocess.Popen(
        command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _project(folder, min_time=0.01):
    folder.mkdir(exist_ok=True)
    (folder / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    (folder / "auto-scheduler.cfg").write_text(CFG.format(min_time=min_time))
    return folder


def _records(folder) -> list[dict]:
    path = run_folder(folder) / "tuning.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_ray_run_agrees_with_the_local_executor(tmp_path, cluster):
    on_ray = _project(tmp_path / "ray")
    local = _project(tmp_path / "local")
    ran = _autosched(on_ray, "--executor", "ray", "--ray-address", cluster, *TWO_ACTORS)
    assert ran.returncode == 0, ran.stderr[-3000:]
    ran_local = _autosched(local, *TWO_ACTORS)
    assert ran_local.returncode == 0, ran_local.stderr[-3000:]
    ray_records, local_records = _records(on_ray), _records(local)
    # The same points, each measured once, with the same outcomes; only times differ.
    assert sorted((r["config"], r["status"]) for r in ray_records) == sorted(
        (r["config"], r["status"]) for r in local_records
    )
    assert len(ray_records) == 7 and all(r["status"] == "ok" for r in ray_records)
    devices = {r["device"] for r in ray_records if not r["baseline"]}
    assert len(devices) == 2, devices  # both actors measured
    assert "ray:local-sync#1" in devices
    rows = (run_folder(on_ray) / "results.csv").read_text().splitlines()
    assert len(rows) == 8


@pytest.mark.slow
def test_a_models_problems_run_at_the_same_time_on_the_cluster(tmp_path, cluster):
    """Two problems searched at once, both handing candidates to the cluster's actors:
    every point of each measured once, and the database and the CSV agree."""
    folder = _project(tmp_path / "two")
    (folder / "mm.mlir").write_text(
        matmul_function("mm", 64, 64, 64) + matmul_function("other", 64, 32, 128)
    )
    options = ("--executor", "ray", "--ray-address", cluster, "--parallel-problems", "2")
    ran = _autosched(folder, *options, *TWO_ACTORS)
    assert ran.returncode == 0, ran.stderr[-3000:]
    records = _records(folder)
    keys = [(r["problem"], r["config"]) for r in records]
    assert len(keys) == 14 and len(set(keys)) == 14, keys  # per problem, default and 6 points
    assert all(r["status"] == "ok" for r in records), [r["message"] for r in records]
    rows = (run_folder(folder) / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 14


MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
MODEL_CFG = (
    "[Env]\njobs = 2\n[SearchStrategy]\ntuner = random\nn_trial = 2\nbatch_size = 2\n"
    "[Benchmark]\nrepetitions = 1\nmin_time = 0.005\nretime_top = 1\ntimer = worker\n"
)


@pytest.mark.slow
def test_a_models_dispatch_check_runs_on_the_actor(tmp_path, cluster):
    """A model timed on its dispatches (`time_on = dispatch`) checks candidates against IREE's
    default on the dispatch: that reference is computed by the measuring actor, whose slot
    name (`ray:local-task#0`) is no IREE device the driver could run it on."""
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(os.path.join(MODELS, "gemm_matmul_transpose.onnx"), folder)
    (folder / "auto-scheduler.cfg").write_text(MODEL_CFG)
    command = [sys.executable, "-m", "autosched", "run", "gemm_matmul_transpose.onnx"]
    options = ["--executor", "ray", "--ray-address", cluster, "--budget", "2"]
    ran = subprocess.run(command + options, cwd=folder, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    log = (run_folder(folder) / "run.log").read_text()
    assert "answers checked on the dispatch against IREE's default" in log, log[-3000:]
    assert "the dispatch check could not run" not in log, log[-3000:]
    records = _records(folder)
    assert records and all(r["status"] == "ok" for r in records), records


@pytest.mark.slow
def test_a_killed_actor_loses_nothing(tmp_path, cluster):
    folder = _project(tmp_path / "kill", min_time=0.2)  # slow enough to kill one mid-run
    run = _autosched(folder, "--executor", "ray", "--ray-address", cluster, *TWO_ACTORS, wait=False)
    killed = None
    deadline = time.time() + 300
    while killed is None and time.time() < deadline and run.poll() is None:
        if len(_records(folder)) >= 2:  # the default and one candidate: the search is on
            found = subprocess.run(
                ["pgrep", "-f", "ray::MeasuringActor"], capture_output=True, text=True
            ).stdout.split()
            if found:
                killed = int(found[-1])
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.2)
    output, _ = run.communicate(timeout=600)
    assert killed is not None, "no actor was running to be killed"
    assert run.returncode == 0, output[-3000:]
    records = _records(folder)
    configs = [r["config"] for r in records]
    assert len(configs) == 7 and len(set(configs)) == 7, configs  # none lost, none twice
    log = (run_folder(folder) / "run.log").read_text()
    assert "died measuring" in log and "queued again" in log


@pytest.mark.slow  # 12-16 s: run after the README's test command
def test_a_private_cluster_of_this_host(tmp_path):
    """`--ray-address local`: Ray starts a cluster for this run alone and stops it after."""
    folder = _project(tmp_path / "private")
    ran = _autosched(folder, "--executor", "ray", "--ray-address", "local", "--n-trial", "2")
    assert ran.returncode == 0, ran.stderr[-3000:]
    records = _records(folder)
    assert len(records) == 3 and all(r["status"] == "ok" for r in records)


def test_no_cluster_at_the_address_is_one_error_line(tmp_path):
    folder = _project(tmp_path / "nocluster")
    ran = _autosched(folder, "--executor", "ray", "--ray-address", f"127.0.0.1:{_free_port()}")
    assert ran.returncode == 2, ran.stderr[-3000:]
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --executor ray: cannot join the Ray cluster at 127.0.0.1:")
    assert "Traceback" not in ran.stderr


def test_a_missing_ray_is_one_clear_error(tmp_path):
    folder = _project(tmp_path / "noray")
    hide_ray = (
        "import sys; sys.modules['ray'] = None; "
        "from autosched.cli import main; sys.argv = ['autosched'] + sys.argv[1:]; main()"
    )
    ran = subprocess.run(
        [sys.executable, "-c", hide_ray, "run", "mm.mlir", "--executor", "ray"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.strip().splitlines()[-1] == (
        "Error: --executor ray needs Ray, an optional extra: pip install '.[ray]'"
    )
    assert "Traceback" not in ran.stderr
