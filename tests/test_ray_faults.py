"""`--executor ray` under faults (issue 27 items 4 and 10), on real local Ray clusters: a
SIGTERM ends the run as it ends a local one, and a measuring actor or the raylet lost in a
late phase (the final re-timing, the defaults' compiles) is queued again or ends the run
with one error line, never a lost round or an environment failure recorded for good."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import run_folder
from test_faults import roomy_disk, signal_the_starting_command
from test_ray_executor import (
    MODEL_CFG,
    MODELS,
    TWO_ACTORS,
    _autosched,
    _free_port,
    _project,
    _records,
    cluster,
    no_token_auth,
)

pytest.importorskip("ray")

__all__ = ["cluster", "no_token_auth", "roomy_disk"]  # fixtures shared with other tests

# Appended to the cfg's [Benchmark]: the re-timing takes seconds (three finalists and the
# default, three rounds), long enough to kill its actor in the middle.
RETIME_TOP = "retime_top = 3\n"
HANG_DEFAULT_COMPILE = """#!/bin/sh
case "$*" in *iree_default*) sleep 60;; esac
exec "{real}" "$@"
"""


def _rows(folder) -> list[dict]:
    path = run_folder(folder) / "results.csv"
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _assert_once_each(folder) -> None:
    """Every record in the database once, and the CSV holding exactly those."""
    keys = [(r["problem"], r["config"]) for r in _records(folder)]
    assert len(keys) == len(set(keys)), f"recorded twice: {keys}"
    rows = [(r["problem"], r["config"]) for r in _rows(folder)]
    assert sorted(rows) == sorted(keys), (rows, keys)


def _wait_for(condition, run: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline and run.poll() is None:
        time.sleep(0.05)
    assert condition(), "the run never got that far"


def _pids(pattern: str, parent: int | None = None) -> list[int]:
    command = ["pgrep", "-f", pattern] + (["-P", str(parent)] if parent else [])
    return [
        int(pid) for pid in subprocess.run(command, capture_output=True, text=True).stdout.split()
    ]


@pytest.mark.slow  # about 5 s or more on two cores: the README's command stays under 10 minutes
def test_sigterm_under_ray_ends_like_a_local_run(tmp_path, cluster):
    """Item 4: `ray.init` puts in its own SIGTERM handlers (Python's exits 15, the C++ one
    dumps its stack and dies by the signal); the run keeps its own: 143 and one line."""
    folder = _project(tmp_path / "term", min_time=0.2)
    run = _autosched(folder, "--executor", "ray", "--ray-address", cluster, wait=False)
    try:
        _wait_for(lambda: len(_records(folder)) >= 2, run)  # the default and one candidate
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=60)
    finally:
        run.kill() if run.poll() is None else None
    assert run.returncode == 143, output[-3000:]
    assert output.strip().splitlines()[-1].startswith("SIGTERM: measurements kept in"), output
    for noise in ("Traceback", "SIGTERM received", "logging.cc", "KeyboardInterrupt"):
        assert noise not in output, output[-3000:]
    _assert_once_each(folder)


@pytest.mark.slow
def test_an_actor_killed_during_the_final_re_timing_loses_no_round(tmp_path, cluster):
    """Item 10: the re-timing's actor killed mid-round: its round is timed again on the
    replacement actor, so the verdict still pairs three rounds, and the log says so."""
    folder = _project(tmp_path / "retime", min_time=0.2)
    with open(folder / "auto-scheduler.cfg", "a") as cfg:
        cfg.write(RETIME_TOP)
    run = _autosched(folder, "--executor", "ray", "--ray-address", cluster, wait=False)

    def log_text() -> str:  # the run's own folder exists once the run has started
        log = run_folder(folder) / "run.log"
        return log.read_text() if log.exists() else ""

    try:
        _wait_for(lambda: "re-timed beside the default" in log_text(), run)
        (actor,) = _pids("ray::MeasuringActor")  # one node, one slot
        os.kill(actor, signal.SIGKILL)
        output, _ = run.communicate(timeout=300)
    finally:
        run.kill() if run.poll() is None else None
    assert run.returncode == 0, output[-3000:]
    text = log_text()
    assert "died timing" in text and "queued again, actor replaced" in text, text[-3000:]
    (verdict,) = [line for line in text.splitlines() if "paired speedups" in line]
    assert verdict.split("paired speedups")[1].split("(")[0].count("x") == 3, verdict
    _assert_once_each(folder)
    assert len(_records(folder)) == 7


def _hanging_compiler(temp) -> str:
    """A compiler under `temp` that takes a minute over IREE's default, so a test can kill
    the raylet while the default compiles (its processes name `temp`)."""
    from test_faults import real_compiler

    wrapper = temp / "compile.sh"
    wrapper.write_text(HANG_DEFAULT_COMPILE.format(real=real_compiler()))
    wrapper.chmod(0o755)
    return str(wrapper)


def _command_line(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:  # gone
        return b""


def _family(pid: int) -> dict[int, bytes]:
    """Every descendant of `pid` with its command line (to tell it from a reused pid)."""
    found, parents = {}, [pid]
    while parents:
        children = _pids(".", parent=parents.pop())
        found.update({child: _command_line(child) for child in children})
        parents += children
    return found


def _kill_raylet_during_the_default(
    run: subprocess.Popen, temp: str, timeout: float = 300, family: dict | None = None
) -> str:
    """SIGKILL to the raylet whose command names `temp`, once the default compiles; what
    the run then printed, once it ended (within `timeout` seconds). `family` gets the
    run's descendants as they were just before the kill (its cluster's, when it started
    one: the raylet's workers are orphaned by the kill)."""
    sleeps: list[int] = []  # the wrapper's own child, which outlives the wrapper
    try:
        _wait_for(lambda: _pids(f"{temp}/compile.sh.*iree_default"), run)
        (wrapper,) = _pids(f"{temp}/compile.sh.*iree_default")
        _wait_for(lambda: sleeps.extend(_pids("sleep", parent=wrapper)) or sleeps, run)
        (raylet,) = _pids(f"raylet/raylet.*{temp}")
        if family is not None:
            family.update(_family(run.pid))
        os.kill(raylet, signal.SIGKILL)
        output, _ = run.communicate(timeout=timeout)
    finally:
        run.kill() if run.poll() is None else None
        for pid in sleeps:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return output


def _assert_lost_and_nothing_recorded(run: subprocess.Popen, output: str, folder) -> None:
    """Exit 2, the cluster's loss as the last line, and no record of the lost default."""
    assert run.returncode == 2, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("Error: --executor ray: the Ray cluster lost"), output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert _records(folder) == [], _records(folder)


@pytest.fixture
def hanging_cluster(tmp_path_factory, no_token_auth):
    """A Ray head of this test alone, whose workers compile IREE's default for a minute
    (the wrapper is in their environment); its address and temp folder."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    port, temp = _free_port(), tmp_path_factory.mktemp("o")
    wrapper = _hanging_compiler(temp)
    head = [ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2", f"--temp-dir={temp}"]
    quiet = ["--include-dashboard=false", "--disable-usage-stats"]
    env = {**os.environ, "AUTOSCHED_IREE_COMPILE": wrapper}
    started = subprocess.run(head + quiet, capture_output=True, text=True, timeout=180, env=env)
    assert started.returncode == 0, started.stderr[-2000:]
    yield f"127.0.0.1:{port}", str(temp)
    for pid in _pids(str(temp)):  # this cluster's processes alone (`ray stop` ends all)
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_the_raylet_lost_during_the_defaults_compile_records_nothing(
    tmp_path, hanging_cluster, cluster
):
    """Item 10: the cluster's raylet killed while IREE's default compiles: the lost compile
    is queued again, then the run ends with one error line; no `compile_error` default is
    recorded, so the rerun (on a live cluster) measures it once."""
    address, temp = hanging_cluster
    folder = _project(tmp_path / "raylet")
    run = _autosched(folder, "--executor", "ray", "--ray-address", address, wait=False)
    output = _kill_raylet_during_the_default(run, temp)
    _assert_lost_and_nothing_recorded(run, output, folder)
    again = _autosched(folder, "--executor", "ray", "--ray-address", cluster)
    assert again.returncode == 0, again.stderr[-3000:]
    _assert_once_each(folder)
    assert len(_records(folder)) == 7


@pytest.mark.slow
def test_the_raylet_of_a_local_cluster_lost_during_the_defaults_compile_ends_the_run(
    tmp_path, tmp_path_factory, monkeypatch, no_token_auth
):
    """Item 10 on `--ray-address local`: the run's private cluster loses its raylet while
    IREE's default compiles. No error ever comes back for the lost compile (Ray waits for
    ever); the run sees that no node is alive and ends with one error line, recording
    nothing, and leaves no process of that cluster behind."""
    temp = tmp_path_factory.mktemp("p")  # short: Ray's socket paths have a length limit
    monkeypatch.setenv("RAY_TMPDIR", str(temp))  # the private cluster's session folder
    monkeypatch.setenv("AUTOSCHED_IREE_COMPILE", _hanging_compiler(temp))  # its workers' too
    folder = _project(tmp_path / "local")
    run = _autosched(folder, "--executor", "ray", "--ray-address", "local", wait=False)
    family: dict[int, bytes] = {}  # the run's cluster: GCS, raylet, workers, actors
    try:
        output = _kill_raylet_during_the_default(run, str(temp), 120, family)  # ends in ~20 s
        _assert_lost_and_nothing_recorded(run, output, folder)
        _assert_once_each(folder)
        assert "lost every node" in output.strip().splitlines()[-1], output[-3000:]
    finally:
        time.sleep(2)  # what the run's shutdown stopped has exited
        left = [pid for pid, line in family.items() if line and _command_line(pid) == line]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert any(b"raylet" in line for line in family.values()), family  # the snapshot held
    assert left == [], [family[pid] for pid in left]


# The first call of a tool that matches PATTERN waits a minute before it runs (`mkdir` is
# atomic: one call alone waits), so a test can kill the actor that is waiting on it.
HOLD_FIRST_CALL = """#!/bin/sh
case "$*" in {pattern}) mkdir "{marker}" 2>/dev/null && sleep 60;; esac
exec "{real}" "$@"
"""


def _hold_first_call(temp, variable: str, pattern: str, real: str, monkeypatch) -> str:
    """The tool `variable` names, wrapped by HOLD_FIRST_CALL, in the run's environment (a
    private cluster's actors inherit it); the wrapper's path."""
    wrapper = temp / f"{variable.lower()}.sh"
    marker = temp / "held"
    wrapper.write_text(HOLD_FIRST_CALL.format(pattern=pattern, marker=marker, real=real))
    wrapper.chmod(0o755)
    monkeypatch.setenv(variable, str(wrapper))
    return str(wrapper)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def _kill_the_actor_holding(run: subprocess.Popen, wrapper_path: str) -> None:
    """SIGKILL to the measuring actor whose tool call is held, then to the held call."""
    _wait_for(lambda: _pids(f"sh {wrapper_path}"), run)
    (wrapper,) = _pids(f"sh {wrapper_path}")
    actor = _parent(wrapper)
    assert b"MeasuringActor" in _command_line(actor), _command_line(actor)
    held = _pids("sleep", parent=wrapper)
    os.kill(actor, signal.SIGKILL)
    for pid in [wrapper, *held]:  # the orphaned call would write its outputs a minute late
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _run_with_the_held_actor_killed(run: subprocess.Popen, wrapper: str, folder) -> str:
    """The run's log, once it has ended (exit 0) after its held actor was killed."""
    try:
        _kill_the_actor_holding(run, wrapper)
        output, _ = run.communicate(timeout=300)
    finally:
        run.kill() if run.poll() is None else None
    assert run.returncode == 0, output[-3000:]
    return (run_folder(folder) / "run.log").read_text()


def _private_run(folder, *arguments) -> subprocess.Popen:
    command = [sys.executable, "-m", "autosched", "run", *arguments]
    return subprocess.Popen(
        command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.slow
def test_an_actor_killed_computing_a_dispatchs_answer_is_replaced(
    tmp_path, tmp_path_factory, monkeypatch, no_token_auth
):
    """Item 10, the model path: the actor computing IREE's default answer on a dispatch
    (the reference every candidate is checked against) is killed. The reference is
    computed again on its replacement; no problem falls back to the kernel's check."""
    from test_faults import real_benchmark

    temp = tmp_path_factory.mktemp("q")  # short: Ray's socket paths have a length limit
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    run_module = os.path.join(os.path.dirname(real_benchmark()), "iree-run-module")
    wrapper = _hold_first_call(
        temp, "AUTOSCHED_IREE_RUN_MODULE", "*/dispatch/*", run_module, monkeypatch
    )
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(os.path.join(MODELS, "gemm_matmul_transpose.onnx"), folder)
    (folder / "auto-scheduler.cfg").write_text(MODEL_CFG)
    options = ["--executor", "ray", "--ray-address", "local", "--budget", "2"]
    run = _private_run(folder, "gemm_matmul_transpose.onnx", *options)
    log = _run_with_the_held_actor_killed(run, wrapper, folder)
    assert "died computing the dispatch's answer: queued again" in log, log[-3000:]
    assert log.count("answers checked on the dispatch against IREE's default") == 2, log
    assert "the dispatch check could not run" not in log, log[-3000:]
    assert all(r["status"] == "ok" for r in _records(folder)), _records(folder)
    _assert_once_each(folder)


@pytest.mark.slow
def test_an_actor_killed_timing_its_default_is_replaced(
    tmp_path, tmp_path_factory, monkeypatch, no_token_auth
):
    """Item 10: with two devices, the second actor times its own default (each device's
    candidates are weighed against it). Killed there, the default is timed again on the
    replacement, not recorded as a runtime error."""
    from test_faults import real_benchmark

    temp = tmp_path_factory.mktemp("d")
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    held = "*iree_default*local-sync*|*local-sync*iree_default*"
    wrapper = _hold_first_call(
        temp, "AUTOSCHED_IREE_BENCHMARK_MODULE", held, real_benchmark(), monkeypatch
    )
    folder = _project(tmp_path / "others")
    cfg = folder / "auto-scheduler.cfg"
    cfg.write_text(cfg.read_text().replace("timer = worker", "timer = tool"))
    run = _private_run(
        folder, "mm.mlir", "--executor", "ray", "--ray-address", "local", *TWO_ACTORS
    )
    log = _run_with_the_held_actor_killed(run, wrapper, folder)
    assert "local-sync#1 died timing the default: queued again" in log, log[-3000:]
    records = _records(folder)
    assert len(records) == 7 and all(r["status"] == "ok" for r in records), records
    _assert_once_each(folder)


@pytest.mark.slow
def test_a_nodes_temporary_folder_that_fills_ends_the_run(
    tmp_path, tmp_path_factory, monkeypatch, no_token_auth, roomy_disk
):
    """Issue 27 item 13 under Ray: the compile tasks' temporary folder fills after two
    builds. The build that fails there is the node's fault, not the candidate's: the run
    ends with one Error: line naming the folder, and records no compile error."""
    from test_faults import FILL_TEMP_COMPILE, real_compiler

    temp = tmp_path_factory.mktemp("t")
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    monkeypatch.setenv("TMPDIR", str(roomy_disk))
    wrapper = temp / "compile.sh"
    wrapper.write_text(FILL_TEMP_COMPILE.format(real=real_compiler()))
    wrapper.chmod(0o755)
    monkeypatch.setenv("AUTOSCHED_IREE_COMPILE", str(wrapper))
    folder = _project(tmp_path / "full")
    run = _private_run(folder, "mm.mlir", "--executor", "ray", "--ray-address", "local")
    try:
        output, _ = run.communicate(timeout=300)
    finally:
        run.kill() if run.poll() is None else None
    assert run.returncode == 2, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("Error: --executor ray, a compile task: the temporary folder"), last
    assert "No space left on device" in last and "Traceback" not in output, output[-3000:]
    assert all(r["status"] == "ok" for r in _records(folder)), _records(folder)
    _assert_once_each(folder)


# Joins a `local` cluster as a run does, then prints its line, its nodes' addresses and the
# address of every socket that the driver and the cluster's processes (its children) listen on.
LOOPBACK_PROBE = """
import json, os
import ray
from autosched.measure.ray import describe_cluster, join_cluster

join_cluster(ray, "local")
print(describe_cluster(ray, "local"))
children = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            parent = int(handle.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        continue
    children.setdefault(parent, []).append(int(pid))
tree, todo = [], [os.getpid()]
while todo:
    tree.append(todo.pop())
    todo += children.get(tree[-1], [])
sockets = set()
for pid in tree:
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        continue
    sockets |= {link[8:-1] for link in links if link.startswith("socket:[")}
listening = []
for table in ("tcp", "tcp6"):
    with open(f"/proc/net/{table}") as handle:
        for row in handle.read().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in sockets:  # LISTEN, ours
                listening.append(fields[1].rsplit(":", 1)[0])
print(json.dumps({"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "listening": listening}))
ray.shutdown()
"""
LOOPBACK_HEX = ("0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000")


@pytest.mark.slow  # about 5 s or more on two cores: the README's command stays under 10 minutes
def test_a_local_cluster_listens_on_the_loopback_alone():
    """Issue 50: `--ray-address local` started Ray's servers on every interface (a Ray cluster
    runs any code sent to its ports). Its node address is now 127.0.0.1, every socket of it
    listens there, and the run's line says which cluster it joined."""
    done = subprocess.run(
        [sys.executable, "-c", LOOPBACK_PROBE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line, found = done.stdout.strip().splitlines()[-2:]
    assert line.startswith("ray: joined a private cluster of this host at 127.0.0.1:"), line
    assert "1 node(s) (127.0.0.1)" in line, line
    found = json.loads(found)
    assert found["nodes"] == ["127.0.0.1"]
    assert found["listening"], "no listening socket found: the probe is broken"
    assert all(address in LOOPBACK_HEX for address in found["listening"]), found["listening"]


@pytest.mark.slow  # about 15 s a case
@pytest.mark.parametrize("after", [0.0, 2.0])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_a_local_cluster_starts_ends_the_run_and_the_cluster(
    tmp_path, tmp_path_factory, monkeypatch, no_token_auth, signum, after
):
    """Issue 50: a signal while `ray.init` started the run's private cluster met Ray's own
    handlers (exit 15, or an abort with Python's fatal-error dump) or was lost, and the
    cluster's agents outlived the run. Now: the signal's line and code, no traceback, and
    nothing of the cluster left running."""
    temp = tmp_path_factory.mktemp("s")  # short: Ray's socket paths have a length limit
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    folder = _project(tmp_path / "signal")
    run = _autosched(folder, "--executor", "ray", "--ray-address", "local", wait=False)
    family: dict[int, bytes] = {}
    try:
        _wait_for(lambda: _pids(f"gcs_server.*{temp}"), run, timeout=120)  # Ray is starting
        deadline = time.monotonic() + after
        while time.monotonic() < deadline or not family:
            family.update(_family(run.pid))
            time.sleep(0.05)
        run.send_signal(signum)
        while run.poll() is None:  # the cluster's processes, as they come and go
            family.update(_family(run.pid))
            time.sleep(0.05)
        output, _ = run.communicate(timeout=120)
    finally:
        run.kill() if run.poll() is None else None
    time.sleep(3)  # what the run's shutdown stopped has exited
    left = [pid for pid, line in family.items() if line and _command_line(pid) == line]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert run.returncode == 128 + signum, output[-3000:]
    assert "Traceback" not in output and "Fatal Python error" not in output, output[-3000:]
    name = "interrupted" if signum == signal.SIGINT else "SIGTERM"
    assert output.strip().splitlines()[-1].startswith(f"{name}: "), output[-3000:]
    assert left == [], [family[pid] for pid in left]


def _agents(pid: int) -> list[bytes]:
    return [line for line in _family(pid).values() if line.startswith(b"ray::Dashboard")]


@pytest.mark.slow  # about 20 s
def test_a_run_killed_under_a_local_cluster_leaves_nothing_running(
    tmp_path, tmp_path_factory, monkeypatch, no_token_auth
):
    """Issue 50: a run under `--ray-address local` killed with SIGKILL left the raylet's agents
    (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) running 30-60 s. The run's watchdog now
    kills every process the run started, within seconds of its end."""
    temp = tmp_path_factory.mktemp("k")  # short: Ray's socket paths have a length limit
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    folder = _project(tmp_path / "killed")
    run = _autosched(folder, "--executor", "ray", "--ray-address", "local", wait=False)
    family: dict[int, bytes] = {}
    try:
        _wait_for(lambda: _agents(run.pid), run, timeout=180)
        family.update(_family(run.pid))
        run.kill()
        run.communicate(timeout=60)
    finally:
        run.kill() if run.poll() is None else None
    deadline = time.monotonic() + 10
    left = family
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = {pid: line for pid, line in family.items() if line and _command_line(pid) == line}
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert any(line.startswith(b"ray::") for line in family.values()), family
    assert left == {}, list(left.values())


@pytest.mark.slow  # about 10 s a case
@pytest.mark.parametrize("delay", [0.005, 0.05, 0.5, 1.5])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_as_a_ray_run_starts_ends_it_cleanly(
    tmp_path, tmp_path_factory, monkeypatch, no_token_auth, signum, delay
):
    """Issue 50: from the command's first instruction through importing Ray and starting
    its private cluster: the signal's line and code, no traceback, nothing left running."""
    temp = tmp_path_factory.mktemp("w")  # short: Ray's socket paths have a length limit
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    signal_the_starting_command(
        tmp_path, signum, delay, "--executor", "ray", "--ray-address", "local"
    )
    time.sleep(3)  # what the run's shutdown stopped has exited
    assert _pids(str(temp)) == []
