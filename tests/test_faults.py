"""Faults, signals, neighbours and full disks, on real runs of the installed command.

Tools are swapped for failing wrappers through the environment (AUTOSCHED_IREE_COMPILE,
AUTOSCHED_IREE_BENCHMARK_MODULE) and the verifier's worker is told to hang or crash
(AUTOSCHED_VERIFY_FAULT); IREE itself is never edited. Every case checks the exit code,
the message, that no child process outlives the run, and that the database and the CSV
hold every measured record exactly once.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from conftest import matmul_function

from autosched.outputs.records import trial_from_record
from autosched.run.limits import OVER_LIMIT

CFG = """
[Env]
target = cpu
jobs = 2
compile_timeout = {compile_timeout}
run_timeout = {run_timeout}
{env}
[SearchSpace]
tile_m = [8, 16, 32, 64]
tile_n = [16, 32]
vec_m = [4]
vec_n = [8]
vec_k = [1]
[SearchStrategy]
tuner = grid
n_trial = {n_trial}
batch_size = 2
[Benchmark]
repetitions = 1
min_time = 0.005
retime_top = 1
"""

# Wrappers: the real tool for IREE's default, a fault for every tuned variant.
HANG_COMPILE = """#!/bin/sh
case "$*" in *iree_default*) exec "{real}" "$@";; esac
sh -c 'sleep 1000; :' "$0" &
sleep 1000
"""  # the child, like iree-lld under iree-compile, names the wrapper so a test can find it
CRASH_COMPILE = """#!/bin/sh
case "$*" in *iree_default*) exec "{real}" "$@";; esac
echo "about to crash" >&2
kill -SEGV $$
"""
TRUNCATED_REPORT = """#!/bin/sh
"{real}" "$@" || exit $?
case "$*" in *iree_default*) exit 0;; esac
for arg in "$@"; do
  case "$arg" in --benchmark_out=*) out="${{arg#--benchmark_out=}}";; esac
done
head -c 100 "$out" > "$out.cut" && mv "$out.cut" "$out"
exit 0
"""
CRASH_BENCHMARK = """#!/bin/sh
case "$*" in *iree_default*) exec "{real}" "$@";; esac
echo "Running iree-benchmark-module"
echo "INTERNAL; device lost while dispatching" >&2
kill -ABRT $$
"""
HANG_BENCHMARK = """#!/bin/sh
case "$*" in *iree_default*) exec "{real}" "$@";; esac
sleep 1000
"""


def real_compiler() -> str:
    from iree.compiler.tools.binaries import find_tool

    return find_tool("iree-compile")


def real_benchmark() -> str:
    from iree.runtime.benchmark import benchmark_exe

    return os.path.normpath(benchmark_exe())


class Run:
    """A folder with a module and a cfg, and helpers to run autosched there."""

    def __init__(self, folder, **cfg):
        self.folder = folder
        self.outputs = "generated/mm"  # the run's work folder: generated/<the input's stem>
        (folder / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
        self.configure(**cfg)
        self.env = dict(os.environ)

    def configure(self, n_trial=4, compile_timeout=60, run_timeout=30, env=""):
        (self.folder / "auto-scheduler.cfg").write_text(
            CFG.format(
                n_trial=n_trial, compile_timeout=compile_timeout, run_timeout=run_timeout, env=env
            )
        )

    def wrap(self, variable: str, script: str, real: str) -> None:
        path = self.folder / f"{variable.lower()}.sh"
        path.write_text(script.format(real=real))
        path.chmod(0o755)
        self.env[variable] = str(path)

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "autosched", "run", "mm.mlir", *args],
            cwd=self.folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own group: a terminal's Ctrl-C goes to the group
        )

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        process = self.start(*args)
        stdout, stderr = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def path(self, name: str):
        return self.folder / name

    def records(self, database: str | None = None) -> list[dict]:
        """Readable records; torn and foreign lines are left out, as the tool does."""
        path = self.path(database or f"{self.outputs}/tuning.jsonl")
        if not path.exists():
            return []
        out = []
        for line in path.read_bytes().splitlines():
            try:
                record = json.loads(line)
                trial_from_record(record)
            except (UnicodeDecodeError, ValueError, TypeError):
                continue
            out.append(record)
        return out

    def rows(self, output: str | None = None) -> list[dict]:
        path = self.path(output or f"{self.outputs}/results.csv")
        if not path.exists():
            return []
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle))

    def wait_for_records(self, process, count: int, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while len(self.records()) < count and time.time() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        assert len(self.records()) >= count, "the run never got that far"

    def leftovers(self) -> list[str]:
        """Processes still running whose command line names this test's folder."""
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    command = handle.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{pid}/stat") as handle:
                    state = handle.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if str(self.folder) in command and state != "Z":
                found.append(f"{pid}: {command[:200]}")
        return found

    def assert_no_leftovers(self) -> None:
        deadline = time.time() + 3
        while self.leftovers() and time.time() < deadline:
            time.sleep(0.1)
        assert not self.leftovers()


def assert_once_each(run: Run, complete: bool = True, **paths) -> None:
    """Every measured record is in the database once, and in the CSV once.

    `complete=False` (after SIGKILL) allows the CSV to miss the row being written when the
    process died; it never holds a row the database lacks.
    """
    records = run.records(**{k: v for k, v in paths.items() if k == "database"})
    configs = [(r["problem"], r["config"]) for r in records]
    assert len(configs) == len(set(configs)), f"measured twice: {configs}"
    rows = run.rows(**{k: v for k, v in paths.items() if k == "output"})
    rows = [(r["problem"], r["config"]) for r in rows]
    assert len(rows) == len(set(rows)), f"CSV rows twice: {rows}"
    if complete:
        assert set(rows) == set(configs), (rows, configs)
    else:
        assert set(rows) <= set(configs) and len(configs) - len(rows) <= 1, (rows, configs)


def assert_clean_stderr(stderr: str) -> None:
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "EOFError" not in stderr, stderr


@pytest.fixture
def tuning(tmp_path):
    run = Run(tmp_path)
    yield run
    for line in run.leftovers():  # never leave a test's processes behind
        os.kill(int(line.split(":")[0]), signal.SIGKILL)


# ----- signals ---------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_a_hung_compile_stops_at_once_and_kills_the_children(tuning, signum):
    """Ctrl-C (to the process group, as a terminal sends it) or SIGTERM (to the process):
    within 2 s, one line, every child gone, the CSV equal to the database."""
    tuning.wrap("AUTOSCHED_IREE_COMPILE", HANG_COMPILE, real_compiler())
    process = tuning.start()
    tuning.wait_for_records(process, 1)  # the default is measured; the variants now hang
    time.sleep(0.5)
    # A wrapper and its child at least: the spec probe's compile hangs first, alone.
    assert len(tuning.leftovers()) >= 2
    started = time.time()
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    assert time.time() - started < 2.0
    assert process.returncode == 128 + signum
    assert_clean_stderr(stderr)
    name = "interrupted" if signum == signal.SIGINT else "SIGTERM"
    assert stderr.strip().splitlines()[-1].startswith(f"{name}: measurements kept in")
    tuning.assert_no_leftovers()
    assert_once_each(tuning)


@pytest.mark.parametrize(
    "when, exit_code, line",
    [
        ("starting_up", 128 + signal.SIGTERM, "\nSIGTERM: stopped before any measurement; nothing to keep\n"),
        ("shutting_down", 0, ""),
    ],
)  # fmt: skip
def test_sigterm_outside_a_run_ends_the_command_with_its_code(when, exit_code, line):
    """Before a run starts, SIGTERM ends the command with 143 and its line; once its last
    record and line are written (the interpreter shutting down, which puts the default
    handler back), it is ignored and the exit code stands. Never death by the signal (-15),
    and no traceback: CI once caught the random-moment test below in that last window."""
    code = (
        "import os, signal, sys, time\n"
        "from autosched import interrupts\n"
        f"interrupts.{when}()\n"
        "print('started', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.5)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == exit_code, done.stderr
    assert done.stdout == "started\n" and done.stderr == line


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (/proc's SigCgt mask): the
    command's first instruction has run."""
    with open(f"/proc/{pid}/status") as handle:
        caught = next(line for line in handle if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def _session_leftovers(session: int) -> list[int]:
    """Live processes of the session (the run's own children share it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[4]) == session and fields[0] != "Z":
            found.append(int(pid))
    return found


EARLY_DELAYS = [0.0, 0.1, 0.3, 0.6, pytest.param(1.0, marks=pytest.mark.slow)]
EARLY_DELAYS += [pytest.param(2.0, marks=pytest.mark.slow)]


@pytest.mark.parametrize("delay", EARLY_DELAYS)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_starts_ends_it_with_its_line_and_code(tmp_path, signum, delay):
    """Issue 50: Ctrl-C in the first seconds (IREE importing, the starter spec read) ended
    in a KeyboardInterrupt traceback (-2) or an abort, SIGTERM in -15. From the command's
    first instruction (its SIGTERM handler in place, seen in /proc) the signal ends it with
    one line, 130 or 143, nothing left running."""
    signal_the_starting_command(tmp_path, signum, delay)


def signal_the_starting_command(tmp_path, signum: int, delay: float, *arguments: str) -> None:
    """Sends `signum` `delay` s after `autosched run` of the example (with `arguments`) set
    its first handler; asserts its line, its code, a clean stderr and nothing left."""
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "matmul.mlir")
    command = [sys.executable, "-m", "autosched", "run", os.path.abspath(example), *arguments]
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not _catches_sigterm(process.pid):
        assert process.poll() is None and time.monotonic() < deadline, "the command never began"
        time.sleep(0.002)
    time.sleep(delay)
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)  # as a terminal sends Ctrl-C
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert_clean_stderr(stderr)
    name = "interrupted" if signum == signal.SIGINT else "SIGTERM"
    assert stderr.strip().splitlines()[-1].startswith(f"{name}: "), stderr
    time.sleep(0.2)  # a killed child's exit
    assert _session_leftovers(process.pid) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_signal_at_a_random_moment_loses_and_duplicates_nothing(tuning, signum, seed):
    tuning.configure(n_trial=8)
    process = tuning.start()
    time.sleep(random.Random(seed * 31 + signum).uniform(1.0, 6.0))
    if process.poll() is None:
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    if signum != signal.SIGKILL:
        assert_clean_stderr(stderr)
        assert process.returncode in (0, 128 + signum), stderr
    tuning.assert_no_leftovers() if signum != signal.SIGKILL else None
    assert_once_each(tuning, complete=signum != signal.SIGKILL)
    before = {r["config"] for r in tuning.records()}
    rerun = tuning.run()
    assert rerun.returncode == 0, rerun.stderr
    after = tuning.records()
    assert before <= {r["config"] for r in after}
    assert_once_each(tuning)  # the rerun measured only what was missing
    assert len(tuning.rows()) == 9  # the default and 8 points


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("after", [2, 5])
def test_signal_during_a_run_on_two_devices_loses_and_duplicates_nothing(tuning, signum, after):
    """Two measuring threads (local-task and local-sync): a signal while both are busy
    ends the run with its exit code and one line, no process left (a worker a thread was
    starting included), and the database and the CSV agree; the same command resumes."""
    tuning.configure(n_trial=8)
    _interrupt_and_resume(tuning, ("--devices", "local-task,local-sync"), signum, after)
    assert len(tuning.rows()) == 9  # the default and 8 points


def _interrupt_and_resume(tuning, options, signum, after) -> None:
    """A signal after `after` records: the run's exit code and one line, nothing left
    running, the database and the CSV agree; the same command then runs to the end."""
    process = tuning.start(*options)
    tuning.wait_for_records(process, after)
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)  # as a terminal's Ctrl-C: the whole group
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode in (0, 128 + signum), stderr
    assert_clean_stderr(stderr)
    tuning.assert_no_leftovers()
    assert_once_each(tuning)
    rerun = tuning.run(*options)
    assert rerun.returncode == 0, rerun.stderr
    assert_once_each(tuning)


@pytest.mark.slow
@pytest.mark.parametrize("after", [3, 8])
def test_signal_while_problems_are_searched_at_once_loses_and_duplicates_nothing(tuning, after):
    """Two problems searched at the same time, each in its own thread, on two devices: a
    Ctrl-C stops both threads at their next tool or record, nothing is left running, and the
    database and the CSV agree; the same command resumes both problems to the end."""
    tuning.path("mm.mlir").write_text(
        matmul_function("mm", 64, 64, 64) + matmul_function("other", 64, 32, 128)
    )
    tuning.configure(n_trial=8)
    options = ("--devices", "local-task,local-sync", "--parallel-problems", "2")
    _interrupt_and_resume(tuning, options, signal.SIGINT, after)
    assert len(tuning.rows()) == 18  # per problem, the default and 8 points


# ----- tools that hang, crash or lie ------------------------------------------------------


def test_hung_compile_is_a_timeout_and_its_children_die(tuning):
    tuning.configure(n_trial=2, compile_timeout=2)
    tuning.wrap("AUTOSCHED_IREE_COMPILE", HANG_COMPILE, real_compiler())
    done = tuning.run(timeout=120)
    assert done.returncode == 0, done.stderr
    tuned = [r for r in tuning.records() if not r["baseline"]]
    assert [r["status"] for r in tuned] == ["timeout", "timeout"]
    assert all(r["message"] == "over 2 s" for r in tuned)
    tuning.assert_no_leftovers()
    assert_once_each(tuning)


def test_crashing_compile_is_a_compile_error_with_its_signal(tuning):
    tuning.configure(n_trial=2)
    tuning.wrap("AUTOSCHED_IREE_COMPILE", CRASH_COMPILE, real_compiler())
    done = tuning.run()
    assert done.returncode == 0, done.stderr
    tuned = [r for r in tuning.records() if not r["baseline"]]
    assert {r["status"] for r in tuned} == {"compile_error"}
    assert all("SIGSEGV" in r["message"] for r in tuned), tuned[0]["message"]
    assert_once_each(tuning)


@pytest.mark.parametrize(
    "script, status, message",
    [
        (TRUNCATED_REPORT, "runtime_error", "unreadable report"),
        (CRASH_BENCHMARK, "runtime_error", "INTERNAL; device lost while dispatching"),
        # Stopped at 20x the default's time (a second here), not at run_timeout.
        pytest.param(HANG_BENCHMARK, "timeout", OVER_LIMIT, marks=pytest.mark.slow),
    ],
)
def test_benchmark_faults_are_recorded_outcomes(tuning, script, status, message):
    tuning.configure(n_trial=2, run_timeout=3)
    tuning.wrap("AUTOSCHED_IREE_BENCHMARK_MODULE", script, real_benchmark())
    done = tuning.run()
    assert done.returncode == 0, done.stderr
    assert_clean_stderr(done.stderr)
    baseline = [r for r in tuning.records() if r["baseline"]]
    assert baseline and baseline[0]["status"] == "ok"
    tuned = [r for r in tuning.records() if not r["baseline"]]
    assert [r["status"] for r in tuned] == [status, status]
    assert all(message in r["message"] for r in tuned), tuned[0]["message"]
    tuning.assert_no_leftovers()
    assert_once_each(tuning)


@pytest.mark.parametrize(
    "fault, status",
    [pytest.param("hang", "timeout", marks=pytest.mark.slow), ("crash", "runtime_error")],
)
def test_verifier_faults_stay_within_run_timeout(tuning, fault, status):
    tuning.configure(n_trial=2, run_timeout=3)
    tuning.env["AUTOSCHED_VERIFY_FAULT"] = fault
    started = time.time()
    done = tuning.run()
    assert done.returncode == 0, done.stderr
    assert_clean_stderr(done.stderr)
    records = tuning.records()
    assert [r["status"] for r in records] == [status] * 3  # the default and two points
    # Each check waits run_timeout for the candidate, after the worker's own start-up.
    assert all(r["verify_s"] <= 3 + 5 for r in records), [r["verify_s"] for r in records]
    assert time.time() - started < 60
    assert_once_each(tuning)


# ----- neighbours and the database --------------------------------------------------------


@pytest.mark.slow  # 12-16 s: run after the README's test command
def test_second_run_on_the_same_folder_is_refused(tuning):
    tuning.wrap("AUTOSCHED_IREE_COMPILE", HANG_COMPILE, real_compiler())
    first = tuning.start()
    tuning.wait_for_records(first, 1)
    second = tuning.run(timeout=60)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: another autosched run (pid ")
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=30)
    assert_once_each(tuning)
    del tuning.env["AUTOSCHED_IREE_COMPILE"]
    third = tuning.run()  # the lock went with the first run
    assert third.returncode == 0, third.stderr
    assert_once_each(tuning)


def test_corrupt_database_lines_are_skipped_with_a_warning(tuning):
    tuning.configure(n_trial=2)
    first = tuning.run()
    assert first.returncode == 0, first.stderr
    database = tuning.path("generated/mm/tuning.jsonl")
    lines_before = database.read_bytes().count(b"\n")
    good = json.loads(database.read_bytes().splitlines()[-1])
    bad = [
        b"\x80\xff not utf-8",
        json.dumps({**good, "median_ms": "fast"}).encode(),
        json.dumps({**good, "point": None}).encode(),
        json.dumps({**good, "status": "ok", "median_ms": None}).encode(),
        json.dumps({**good, "point": [1, 2]}).encode(),
        b'{"problem": "torn',
    ]
    with open(database, "ab") as handle:
        handle.write(b"\n".join(bad) + b"\n")
    second = tuning.run()
    assert second.returncode == 0, second.stderr
    # The torn and non-UTF-8 lines are compacted away; the readable-but-wrong ones stay,
    # skipped with a warning (a newer version's records must not be deleted).
    assert "removed 2 torn line(s)" in second.stderr
    assert "skipped 4 unreadable line(s)" in second.stderr
    assert database.read_bytes().count(b"\n") == lines_before + len(bad) - 2  # none re-measured
    assert_once_each(tuning)


@pytest.mark.slow  # 15 s: run after the README's test command
def test_torn_last_line_does_not_eat_the_next_record(tuning):
    tuning.configure(n_trial=2)
    assert tuning.run().returncode == 0
    database = tuning.path("generated/mm/tuning.jsonl")
    data = database.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    torn_config = json.loads(data[last_start:])["config"]
    database.write_bytes(data[: last_start + 40])  # a record cut short, no newline
    tuning.configure(n_trial=4)
    done = tuning.run()
    assert done.returncode == 0, done.stderr
    configs = [r["config"] for r in tuning.records()]
    assert len(configs) == 5 and torn_config in configs  # measured again, once
    assert_once_each(tuning)


@pytest.mark.slow  # 12-17 s: run after the README's test command
def test_records_from_another_iree_or_device_are_not_resumed(tuning):
    tuning.configure(n_trial=2)
    assert tuning.run().returncode == 0
    database = tuning.path("generated/mm/tuning.jsonl")
    records = tuning.records()
    fake = {**records[1], "iree_version": "2.0.0", "median_ms": 1e-06, "gflops": 1e9}
    failed = {**records[2], "status": "runtime_error", "device": "bogus://7", "median_ms": None}
    database.write_text(
        "\n".join(json.dumps(r) for r in [records[0], fake, failed]) + "\n", encoding="utf-8"
    )
    done = tuning.run()
    assert done.returncode == 0, done.stderr
    rows = {r["config"]: r for r in tuning.rows()}
    assert rows[fake["config"]]["median_ms"] != "1e-06"
    assert rows[failed["config"]]["status"] == "ok"  # retried on the real device


# ----- full and read-only disks -----------------------------------------------------------


def mount_tmpfs(path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


def mounted_tmpfs(disk, size: str):
    """A fixture's tmpfs of `size` at `disk`, unmounted after (skips where none mounts)."""
    if not mount_tmpfs(disk, size):
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    yield from mounted_tmpfs(tmp_path / "disk", "24k")


@pytest.mark.slow
def test_full_disk_stops_with_one_line_and_loses_nothing(tuning, small_disk):
    env = f"database = {small_disk}/t.jsonl\noutput_file = {small_disk}/r.csv\n"
    env += f"log_file = {small_disk}/run.log"
    tuning.configure(n_trial=8, env=env)
    paths = {"database": f"{small_disk}/t.jsonl", "output": f"{small_disk}/r.csv"}
    done = tuning.run()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "No space left on device" in lines[-1]
    assert_clean_stderr(done.stderr)
    assert not list(small_disk.glob("*.tmp"))
    measured = {r["config"] for r in tuning.records(paths["database"])}
    assert measured
    assert_once_each(tuning, complete=False, **paths)
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    again = tuning.run()
    assert again.returncode == 0, again.stderr
    assert measured <= {r["config"] for r in tuning.records(paths["database"])}
    assert_once_each(tuning, **paths)
    assert len(tuning.rows(paths["output"])) == 9  # the default and all 8 points


def test_read_only_database_is_refused_before_measuring(tuning, small_disk):
    (small_disk / "t.jsonl").write_text("")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    tuning.configure(env=f"database = {small_disk}/t.jsonl")
    done = tuning.run()
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not writable" in lines[0], done.stderr
    assert not tuning.path("generated/mm/results.csv").exists()


def test_read_only_working_folder_is_refused(tuning, small_disk):
    (small_disk / "mm.mlir").write_text(matmul_function("mm", 64, 64, 64))
    (small_disk / "auto-scheduler.cfg").write_text(tuning.path("auto-scheduler.cfg").read_text())
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    tuning.folder = small_disk
    done = tuning.run()
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not writable" in lines[0], done.stderr


def _fill(folder) -> None:
    """Writes into `folder` until its file system is full."""
    descriptor = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(descriptor, bytes(4096)):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(descriptor)


def assert_refused_for_the_temporary_folder(done, folder: str, reason: str) -> None:
    """Exit 2, one Error: line naming the folder and why, and nothing compiled or recorded
    (before the check, every candidate was recorded as a compile error, exit 0)."""
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"Error: the temporary folder {folder} ($TMPDIR)"), lines
    assert reason in lines[0], lines
    assert_clean_stderr(done.stderr)


@pytest.mark.parametrize("full", [True, False], ids=["full", "nearly-full"])
def test_a_full_temporary_folder_is_one_error_line_up_front(tuning, small_disk, full):
    """Issue 27 item 13: with TMPDIR full, iree-compile's objects cannot be written and
    every build fails as `iree-lld: error: target emulation unknown`; with a few KiB left,
    some do. The run refuses at the start instead, naming the folder."""
    if full:
        _fill(small_disk)
    tuning.env["TMPDIR"] = str(small_disk)
    done = tuning.run()
    reason = "No space left on device" if full else "MiB free, less than the 64 MiB"
    assert_refused_for_the_temporary_folder(done, str(small_disk), reason)
    assert tuning.records() == [] and tuning.rows() == []


def test_a_temporary_folder_that_cannot_hold_files_is_one_error_line_up_front(tuning):
    """TMPDIR naming a regular file (as root too, where a read-only folder is writable):
    iree-compile fails every build with `failed to generate temporary file: Not a
    directory`; the run refuses at the start, naming the folder."""
    not_a_folder = tuning.path("not-a-folder")
    not_a_folder.write_text("")
    tuning.env["TMPDIR"] = str(not_a_folder)
    done = tuning.run()
    assert_refused_for_the_temporary_folder(done, str(not_a_folder), "Not a directory")
    assert tuning.records() == [] and tuning.rows() == []


# The third build fills the temporary folder first (as another job on the host might),
# then compiles: that build and every later one would fail for want of room.
FILL_TEMP_COMPILE = """#!/bin/sh
count=$(ls "$TMPDIR" | grep -c '^build-')
touch "$TMPDIR/build-$$"
if [ "$count" -eq 2 ]; then cat /dev/zero > "$TMPDIR/filler" 2>/dev/null; fi
exec "{real}" "$@"
"""


@pytest.fixture
def roomy_disk(tmp_path):
    """A tmpfs just above the room the up-front check asks of the temporary folder."""
    yield from mounted_tmpfs(tmp_path / "roomy", "80m")


@pytest.mark.slow  # 12-16 s: run after the README's test command
def test_a_temporary_folder_that_fills_mid_run_ends_it_recording_nothing_false(tuning, roomy_disk):
    """Issue 27 item 13: TMPDIR fills after two builds. The build that then fails is no
    compile error of its candidate's: the run ends with one Error: line naming the folder,
    keeps what it measured, and the rerun, with room again, measures the rest."""
    tuning.env["TMPDIR"] = str(roomy_disk)
    tuning.wrap("AUTOSCHED_IREE_COMPILE", FILL_TEMP_COMPILE, real_compiler())
    done = tuning.run()
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: the temporary folder {roomy_disk} ($TMPDIR)"), last
    assert "No space left on device" in last, last
    assert_clean_stderr(done.stderr)
    assert all(r["status"] == "ok" for r in tuning.records()), tuning.records()
    assert_once_each(tuning)
    (roomy_disk / "filler").unlink()
    tuning.env.pop("AUTOSCHED_IREE_COMPILE")
    again = tuning.run()
    assert again.returncode == 0, again.stderr[-3000:]
    assert all(r["status"] == "ok" for r in tuning.records()), tuning.records()
    assert_once_each(tuning)
    assert len(tuning.records()) == 5  # the default and the 4 points


def apply_folder(tmp_path) -> None:
    """The ONNX model and a spec of one CPU point for each of its matmuls, for `apply`."""
    import shutil

    from autosched.config import RunConfig
    from autosched.model.lowering import analyze_model
    from autosched.outputs.spec import tuning_spec
    from autosched.targets.cpu import CpuTarget

    models = os.path.join(os.path.dirname(__file__), "data", "models")
    shutil.copy(os.path.join(models, "gemm_matmul_transpose.onnx"), tmp_path / "model.onnx")
    target = CpuTarget(RunConfig())
    problems = analyze_model(str(tmp_path / "model.onnx"), target.compile_flags()).matmul_problems()
    point = {"tile_m": 8, "tile_n": 8, "vec_m": 4, "vec_n": 8, "vec_k": 4}
    (tmp_path / "spec.mlir").write_text(tuning_spec([(p, target, point) for p in problems]))


def test_apply_refuses_an_unusable_temporary_folder_up_front(tuning, tmp_path):
    """`apply` builds the model twice or three times: the same check as a run, first."""
    apply_folder(tmp_path)
    not_a_folder = tmp_path / "not-a-folder"
    not_a_folder.write_text("")
    env = dict(tuning.env, TMPDIR=str(not_a_folder))
    done = subprocess.run(
        [sys.executable, "-m", "autosched", "apply", "model.onnx", "--spec", "spec.mlir"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_refused_for_the_temporary_folder(done, str(not_a_folder), "Not a directory")


def _start_model_run(run: Run, folder, budget: int) -> subprocess.Popen:
    """`autosched run model.onnx` in its own process group, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "autosched", "run", "model.onnx", "--budget", str(budget)],
        cwd=folder,
        env=run.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_sigterm_during_a_model_run_keeps_every_record_once(tuning, tmp_path):
    """A model's campaign under SIGTERM: one line, 143, children gone, CSV equal to the
    database, and the rerun completes the budget without measuring anything twice."""
    import shutil

    run = tuning  # its fixture kills whatever a failed run leaves behind
    run.outputs = "generated/model"  # model.onnx's own work folder
    cfg = run.path("auto-scheduler.cfg")
    # The model's shapes (8x24x32, 2x16x24x32) get knobs generated from them.
    cfg.write_text(cfg.read_text().split("[SearchSpace]")[0] + "[SearchStrategy]\nbatch_size = 2\n")
    models = os.path.join(os.path.dirname(__file__), "data", "models")
    shutil.copy(os.path.join(models, "gemm_matmul_transpose.onnx"), tmp_path / "model.onnx")
    # Lowering the model and writing its dispatches run as usual; the candidates hang.
    hang_candidates = HANG_COMPILE.replace(
        "*iree_default*)", "*iree_default*|*--compile-to*|*benchmarks-to*)"
    )
    run.wrap("AUTOSCHED_IREE_COMPILE", hang_candidates, real_compiler())
    process = _start_model_run(run, tmp_path, budget=4)
    try:
        run.wait_for_records(process, 2)  # both defaults; the candidates' compiles now hang
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 143, stderr
        assert_clean_stderr(stderr)
        assert stderr.strip().splitlines()[-1].startswith("SIGTERM: measurements kept in")
        run.assert_no_leftovers()
        assert_once_each(run)
        del run.env["AUTOSCHED_IREE_COMPILE"]
        again = subprocess.run(
            [sys.executable, "-m", "autosched", "run", "model.onnx", "--budget", "4"],
            cwd=tmp_path,
            env=run.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert again.returncode == 0, again.stderr
        assert_once_each(run)
        assert len(run.records()) == 2 + 4
    finally:
        if process.poll() is None:
            process.kill()


def test_compiles_run_below_the_measuring_workers_priority():
    """A tool started with a niceness runs (with what it starts) at that lower priority."""
    from autosched import processes
    from autosched.compile import COMPILE_NICENESS

    base = os.getpriority(os.PRIO_PROCESS, 0)
    # The shell waits a moment, so the priority set after the start is in place; `nice`
    # is a child of the shell, so the whole group is lowered.
    finished = processes.run(["sh", "-c", "sleep 0.3; nice"], 10, niceness=COMPILE_NICENESS)
    assert finished.returncode == 0
    assert int(finished.stdout) == min(base + COMPILE_NICENESS, 19)
    plain = processes.run(["sh", "-c", "nice"], 10)
    assert int(plain.stdout) == base


HANG_IN_PHASE = """#!/bin/sh
case "$*" in *{marker}*) touch "$0.hung"; sh -c 'sleep 1000; :' "$0" & sleep 1000;; esac
exec "{real}" "$@"
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variable", "marker", "real"),
    [  # the model's one build (its dispatch benchmarks written); the whole model proved
        ("AUTOSCHED_IREE_COMPILE", "benchmarks-to", "compile"),
        ("AUTOSCHED_IREE_RUN_MODULE", "proof", "run"),
    ],
)
def test_sigterm_in_a_model_runs_later_phases_is_143_with_its_line(
    tuning, tmp_path, variable, marker, real
):
    """Issue 27 item 3: SIGTERM while the model is built (its dispatches written) or
    proved (phases outside the search's own handler) ends with 143 and the SIGTERM line,
    not Ctrl-C's 130, and leaves no child behind."""
    import shutil

    from autosched.measure.worker import run_tool

    run = tuning
    cfg = run.path("auto-scheduler.cfg")
    cfg.write_text(cfg.read_text().split("[SearchSpace]")[0] + "[SearchStrategy]\nbatch_size = 2\n")
    models = os.path.join(os.path.dirname(__file__), "data", "models")
    shutil.copy(os.path.join(models, "gemm_matmul_transpose.onnx"), tmp_path / "model.onnx")
    tool = real_compiler() if real == "compile" else run_tool()
    run.wrap(variable, HANG_IN_PHASE.replace("{marker}", marker), tool)
    process = _start_model_run(run, tmp_path, budget=2)
    hung = f"{run.env[variable]}.hung"  # the wrapper's mark: the tool hangs in its phase
    try:
        deadline = time.time() + 240
        while not os.path.exists(hung) and time.time() < deadline and process.poll() is None:
            time.sleep(0.1)
        assert os.path.exists(hung), process.communicate(timeout=30)[1]
        time.sleep(1)  # the hanging tool has started
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 143, stderr
        assert stderr.strip().splitlines()[-1].startswith("SIGTERM"), stderr
        run.assert_no_leftovers()
        assert_once_each(run, complete=False)
    finally:
        if process.poll() is None:
            process.kill()


def test_a_second_run_with_its_own_folders_but_the_same_output_is_refused(tuning):
    """Issue 27 item 2: its own work_dir and database, the first run's --output (named: a
    run's own files follow its work_dir): it would replace the first run's CSV and summary,
    so it is refused while the first one runs."""
    tuning.wrap("AUTOSCHED_IREE_COMPILE", HANG_COMPILE, real_compiler())
    first = tuning.start()
    try:
        tuning.wait_for_records(first, 1)
        cfg = tuning.path("auto-scheduler.cfg")
        text = cfg.read_text()
        cfg.write_text(
            text.replace(
                "[Env]",
                "[Env]\nwork_dir = other\ndatabase = other/db.jsonl\n"
                "output_file = generated/mm/results.csv",
            )
        )
        second = tuning.run(timeout=60)
        cfg.write_text(text)
        assert second.returncode == 2, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith("Error: another autosched run (pid ") and "results.csv" in line
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    assert_once_each(tuning)


@pytest.mark.slow
def test_applies_in_one_folder_keep_their_own_builds(tuning, tmp_path):
    """Issue 27 item 9: `apply` builds in a folder of its own (removed after), so applies
    beside each other never read another's half-written modules, and a run's model/proof
    folder is never written by one."""
    apply_folder(tmp_path)
    command = [sys.executable, "-m", "autosched", "apply", "model.onnx", "--spec", "spec.mlir"]
    applies = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env=tuning.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(3)
    ]
    for process in applies:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stdout + stderr
        assert "outputs match" in stdout
    assert not os.listdir(tmp_path / "generated" / "model" / "apply")
    assert not (tmp_path / "generated" / "model" / "model" / "proof").exists()


@pytest.mark.slow
def test_a_torn_line_is_compacted_away_on_the_next_start(tuning):
    """Issue 27 item 13: a line torn by a full disk used to stay in the database for ever,
    warned about on every run; the next run removes it (once, saying so) and keeps every
    record, in order."""
    tuning.configure(n_trial=2)
    assert tuning.run().returncode == 0
    database = tuning.path("generated/mm/tuning.jsonl")
    lines = database.read_bytes().splitlines(keepends=True)
    database.write_bytes(lines[0] + b'{"problem": "torn", "conf' + b"\n" + b"".join(lines[1:]))
    done = tuning.run()
    assert done.returncode == 0, done.stderr
    assert "removed 1 torn line(s)" in done.stderr and "unreadable" not in done.stderr
    assert database.read_bytes().splitlines(keepends=True)[: len(lines)] == lines
    again = tuning.run()
    assert again.returncode == 0 and "torn" not in again.stderr, again.stderr
    assert_once_each(tuning)


def test_a_sigterm_that_waits_on_a_record_still_ends_as_sigterm():
    """CI saw `--executor ray` end a SIGTERM with "interrupted" and 130: the signal came
    while a record was being written (it waits for the end of that section), and meanwhile
    a tool the clean-up refused to start raised its own interrupt, which left the section
    first. The exit code and the line are the signal's, whichever interrupt arrives."""
    from autosched import interrupts, processes
    from autosched.drivers.guard import signal_name

    interrupts.install()
    try:
        with pytest.raises(processes.Stopped) as stopped:
            with interrupts.critical():
                os.kill(os.getpid(), signal.SIGTERM)  # handled here: it waits on the section
                assert processes.stopping()
                raise processes.Stopped()
        code, name = interrupts.exit_code_of(stopped.value), signal_name(stopped.value)
    finally:
        interrupts.restore()
        interrupts.forget()  # the SIGTERM still waiting must not reach the next test
        processes.reset()
    assert code == 143
    assert name == "SIGTERM"


@pytest.mark.slow  # two model runs, about a minute
def test_a_smaller_budget_on_the_same_folder_agrees_with_the_database(tmp_path, monkeypatch):
    """`--budget 8`, then `--budget 2` in the same folder: the second run said "budget: 4 of
    2 trials used" and "6/4 measured", and rewrote the CSV with 6 rows while the database
    held 10. The budget line, the progress and the CSV must agree with the database: the
    budget counts this run's new trials, the resumed records are said apart."""
    import re
    import shutil

    from click.testing import CliRunner

    from autosched.cli import cli

    models = os.path.join(os.path.dirname(__file__), "data", "models")
    shutil.copy(os.path.join(models, "gemm_matmul_transpose.onnx"), tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(
        # n_trial 8: the grid tuner spreads 8 points a problem, so the second run has new
        # points to measure beside the 8 it resumes.
        CFG.format(compile_timeout=60, run_timeout=30, env="", n_trial=8)
    )
    monkeypatch.chdir(tmp_path)
    first = CliRunner().invoke(cli, ["run", "gemm_matmul_transpose.onnx", "--budget", "8"])
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(cli, ["run", "gemm_matmul_transpose.onnx", "--budget", "2"])
    assert second.exit_code == 0, second.output
    folder = tmp_path / "generated" / "gemm_matmul_transpose"
    records = [json.loads(line) for line in (folder / "tuning.jsonl").read_text().splitlines()]
    with open(folder / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["problem"], r["config"]) for r in rows) == sorted(
        (r["problem"], r["config"]) for r in records
    ), "the CSV does not hold the database's records"
    for done, total in re.findall(r"(\d+)/(\d+) measured", second.output):
        assert int(done) <= int(total), second.output
    line = re.search(r"budget: (\d+) of (\d+) new trials used; (\d+) resumed", second.output)
    assert line, second.output
    used, budget, resumed = map(int, line.groups())
    assert used == budget == 2, second.output
    assert resumed + used == sum(not r.get("baseline") for r in records), second.output


def test_the_commands_first_line_sets_the_handlers_before_any_other_import():
    """Issue 50: the handlers came after `autosched.interrupts` and its imports (20 ms and
    more): a Ctrl-C then was a KeyboardInterrupt traceback from inside an import. Importing
    the command's module sets both handlers and loads nothing else of the package, nor
    Python's `signal` module (its enums alone took milliseconds)."""
    code = (
        "import sys, _signal\n"
        "before = set(sys.modules)\n"
        "import autosched.__main__\n"
        "loaded = sorted(set(sys.modules) - before)\n"
        "handlers = [_signal.getsignal(s).__name__ for s in (_signal.SIGINT, _signal.SIGTERM)]\n"
        "print(loaded, handlers)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "['autosched', 'autosched.__main__', 'autosched.startup_signals'] "
        "['_leave_starting', '_leave_starting']"
    )


@pytest.mark.parametrize("delay", [0.005, 0.02, 0.05])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_commands_first_tenth_of_a_second_ends_it_cleanly(tmp_path, signum, delay):
    """Within the first 0.1 s of the command's own first line (the package's modules and
    click importing, before IREE): its line and 130 or 143, no traceback, nothing left."""
    test_a_signal_while_the_command_starts_ends_it_with_its_line_and_code(tmp_path, signum, delay)
