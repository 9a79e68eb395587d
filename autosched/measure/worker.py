"""Checks a compiled kernel's answer against numpy on random inputs.

The kernel runs in iree-run-module, a separate process, so a crashing candidate is a
recorded outcome rather than the end of the run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import iree.runtime as runtime
import ml_dtypes  # comes with iree-base-runtime
import numpy as np
from iree import _runtime_libs

from autosched import processes
from autosched.measure.benchmark_tool import Timing, summarize
from autosched.measure.timed_calls import fitted_count, time_calls
from autosched.ops.base import Operand, Problem
from autosched.ops.matmul import FP8_TYPES
from autosched.ops.matmul_kernel import KERNEL_FUNCTION
from autosched.targets.host import physical_memory


def _fp8(element: str):
    """The ml_dtypes type of an fp8 element type."""
    return {"f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2}[element]


RAW_TYPES = ("bf16", *FP8_TYPES)  # types numpy's .npy cannot carry to IREE: raw bytes instead


def _round_to(values: np.ndarray, element: str) -> np.ndarray:
    """Values as the device will see them, in float64 for the reference."""
    if element in FP8_TYPES:
        return values.astype(_fp8(element)).astype(np.float64)
    if element == "f16":
        return values.astype(np.float16).astype(np.float64)
    if element == "bf16":
        bits = values.astype(np.float32).view(np.uint32) & 0xFFFF0000
        return bits.view(np.float32).astype(np.float64)
    if element == "f64":
        return values.astype(np.float64)
    if element == "i1":  # a mask: about 4 in 5 true (keys kept)
        return (values > -0.6).astype(np.float64)
    return values.astype(np.float32).astype(np.float64)


def _write(path: str, values: np.ndarray, element: str, shape: list[int]) -> str:
    """Writes one input; returns its iree-run-module --input flag value."""
    if element == "bf16":
        bits = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        bits.tofile(path)
        return f"{'x'.join(map(str, shape))}xbf16=@{path}"
    if element in FP8_TYPES:
        values.astype(_fp8(element)).view(np.uint8).tofile(path)
        return f"{'x'.join(map(str, shape))}x{element}=@{path}"
    kept = {"f16": np.float16, "f64": np.float64, "i1": np.bool_}.get(element, np.float32)
    np.save(path, values.astype(kept))
    return f"@{path}"


@dataclass
class ProblemData:
    """Random inputs on disk and the float64 reference answer."""

    inputs: list[str]  # --input flag values
    reference: np.ndarray
    input_paths: list[str]  # the .npy files, for the in-process verifier (none for bf16)
    reference_path: str  # the reference as .npy (float32), read once by the verifier


def memory_problem(problem: Problem) -> str | None:
    """Why a problem's random inputs and reference will not fit in memory, if they will not."""
    needed, memory = problem.reference_bytes(), physical_memory()
    if memory and needed > memory // 2:
        return (
            f"its inputs and reference need {needed / 1e9:.1f} GB, more than half of this "
            f"machine's {memory / 1e9:.1f} GB"
        )
    return None


def make_problem_data(problem: Problem, directory: str, seed: int = 0) -> ProblemData:
    """Seeded inputs of the problem's check and its reference (`Problem.check_operands`,
    `Problem.reference`) under `directory`, named by absolute paths (a Ray actor need not
    share the driver's working folder); none for a problem checked on IREE's dispatch."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    operands = problem.check_operands()
    if operands is None:
        return dispatch_only_data(directory)
    values, flags = _random_inputs(operands, directory, np.random.default_rng(seed))
    return _problem_data(directory, flags, problem.reference(*values))


def _random_inputs(
    operands: list[Operand], directory: str, rng
) -> tuple[list[np.ndarray], list[str]]:
    """Seeded uniform values in [-1, 1) rounded to each operand's type, written for
    iree-run-module: (the values in float64, the --input flags)."""
    values, flags = [], []
    for name, shape, element in operands:
        array = _round_to(rng.uniform(-1.0, 1.0, size=shape), element)
        values.append(array)
        extension = ".bin" if element in RAW_TYPES else ".npy"
        flags.append(_write(os.path.join(directory, name + extension), array, element, shape))
    return values, flags


def _problem_data(directory: str, flags: list[str], reference: np.ndarray) -> ProblemData:
    reference_path = os.path.join(directory, "reference.npy")
    np.save(reference_path, reference.astype(np.float32))
    paths = [flag.removeprefix("@") for flag in flags if flag.startswith("@")]
    return ProblemData(flags, reference, paths, reference_path)


def dispatch_only_data(directory: str) -> ProblemData:
    """A problem checked and timed only on IREE's dispatch (its benchmark takes no inputs,
    its check compares with the default build's outputs): no inputs, an empty reference."""
    reference_path = os.path.join(directory, "reference.npy")
    np.save(reference_path, np.zeros(1, dtype=np.float32))
    return ProblemData([], np.zeros(1), [], reference_path)


def _read_output(path: str, problem: Problem) -> np.ndarray:
    if problem.out_type == "bf16":
        bits = np.fromfile(path, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(problem.output_shape).astype(np.float64)
    return np.load(path).astype(np.float64)


@dataclass
class Verification:
    status: str  # correct, wrong_answer, runtime_error, timeout
    max_error: float | None = None  # relative to the reference's largest magnitude
    message: str = ""
    # Seconds of each step of a check in the worker (CHECK_PHASES), to see where a check's
    # time goes on the device; empty where the check ran elsewhere.
    phases: dict[str, float] = field(default_factory=dict)


CHECK_PHASES = ("load", "run", "to_host", "compare")  # a worker check's steps, in order


def run_tool() -> str:
    return processes.tool_path(
        "iree-run-module", os.path.join(_runtime_libs.__path__[0], "iree-run-module")
    )


CHUNK = 1 << 20  # elements per step of the error scan: temporaries stay in cache


def max_abs_difference(output: np.ndarray, reference: np.ndarray | None = None) -> float:
    """max |output - reference| (or max |output|), in chunks: 5x faster at 4096x11008."""
    flat = output.reshape(-1)
    other = None if reference is None else reference.reshape(-1)
    largest = 0.0
    for start in range(0, flat.size, CHUNK):
        part = flat[start : start + CHUNK].astype(np.float64 if other is None else other.dtype)
        if other is not None:
            np.subtract(part, other[start : start + CHUNK], out=part)
        np.abs(part, out=part)
        value = float(part.max())
        if value != value:  # NaN: the builtin max below would drop it
            return value
        largest = max(largest, value)
    return largest


def compare(
    output: np.ndarray, reference: np.ndarray, allowed: float, scale: float | None = None
) -> Verification:
    """Largest error relative to the reference's largest magnitude (`scale`), against `allowed`.

    Computed in the reference's precision: float32 differences of values this close are
    exact enough for tolerances of 1e-4 and up.
    """
    if output.shape != reference.shape:
        return Verification(
            "wrong_answer", None, f"shape {output.shape}, expected {reference.shape}"
        )
    scale = scale or max_abs_difference(reference) or 1.0
    error = max_abs_difference(output, reference) / scale
    if not np.isfinite(error) or error > allowed:
        return Verification("wrong_answer", error, f"relative error {error:.3g} > {allowed:g}")
    return Verification("correct", error)


def verify_module(
    vmfb: str, device: str, data: ProblemData, problem: Problem, timeout: float
) -> Verification:
    output_path = vmfb + (".out.bin" if problem.out_type == "bf16" else ".out.npy")
    command = [
        run_tool(),
        f"--module={vmfb}",
        f"--device={device}",
        f"--function={KERNEL_FUNCTION}",
        *[f"--input={flag}" for flag in data.inputs],
        f"--output=@{output_path}",
    ]
    finished = processes.run(command, timeout)
    if finished.timed_out:
        return Verification("timeout", message=f"over {timeout:g} s")
    if finished.returncode != 0:
        return Verification(
            "runtime_error", message=processes.describe_failure(finished, "iree-run-module")
        )
    try:
        output = _read_output(output_path, problem)
    except (OSError, ValueError, EOFError) as error:  # EOFError: an empty file (a full disk)
        return Verification("runtime_error", message=f"unreadable output: {error}"[:300])
    finally:
        if os.path.exists(output_path):
            os.remove(output_path)
    return compare(output, data.reference, problem.tolerance())


UNAVAILABLE = "unavailable: "  # the worker's answer when it cannot open the device
READY = "ready"  # the worker's first message once the device is open
STARTUP_TIMEOUT = 60.0  # importing IREE and opening the device, once per worker
# Tests inject a hung or crashing verification through the environment (never in IREE):
FAULT_VARIABLE = "AUTOSCHED_VERIFY_FAULT"  # "hang" or "crash"


def _injected_fault() -> None:
    fault = os.environ.get(FAULT_VARIABLE, "")
    if fault == "hang":
        time.sleep(3600)
    elif fault == "crash":
        os.abort()


TIME = "time"  # a timing request's tag (a check request is a plain tuple)
KEPT_PROBLEMS = 4  # problems whose inputs a worker keeps (problems searched at once share it)


def _serve(connection, device: str, runtime_flags: list[str]) -> None:
    """The verifier process: one IREE device for its whole life, inputs cached per problem.

    It runs in a session of its own, so a Ctrl-C to the terminal never reaches it (not even
    while it starts); it ignores SIGINT anyway (the parent decides when it ends) and leaves
    quietly when the parent goes away, so an interrupted run prints no traceback from here.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _serve_requests(connection, device, runtime_flags)
    except (EOFError, OSError, KeyboardInterrupt):
        return


WORKER = (
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "from autosched.measure.worker import _serve\n"
    "_serve(Connection(int(sys.argv[1])), sys.argv[2], sys.argv[3:])\n"
)


def _serve_requests(connection, device: str, runtime_flags: list[str]) -> None:
    session = _open_device(device, runtime_flags)
    if isinstance(session, str):
        connection.send(session)
        return
    connection.send(READY)
    while True:
        request = connection.recv()
        if request is None:
            return
        connection.send(
            session.answer_time(request) if request[0] == TIME else session.answer_check(request)
        )


def _open_device(device: str, runtime_flags: list[str]) -> _Session | str:
    """The worker's session on `device`, or why the device cannot be opened."""
    try:
        if runtime_flags:  # the driver's flags (such as --cuda_use_streams) come first
            runtime.flags.parse_flags(*runtime_flags)
        config = runtime.Config(device=runtime.get_device(device))  # a URI: cuda, cuda://1, ...
    except Exception as error:  # noqa: BLE001 - reported to the parent, which falls back
        return UNAVAILABLE + str(error).splitlines()[0][:200]
    return _Session(runtime, config)


def _first_line(error: Exception) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else repr(error))[:300]


class _Session:
    """The worker's open device, the inputs of its last few problems and its last module."""

    def __init__(self, runtime, config):
        self.runtime, self.config = runtime, config
        # The inputs (on the device) and reference of the last few problems, by the problem's
        # reference path: problems searched at the same time take turns on one worker.
        self.problems: dict[str, dict] = {}
        self.cached: dict = {}  # the current problem's arrays; "scale": its reference's magnitude
        # The module loaded last: a candidate's timing follows its check, on the same module
        # when the checked build is the timed one, and need not load it again.
        self.last: dict = {}

    def use(self, reference_path: str) -> None:
        """Makes the problem of `reference_path` the current one (and the most recent)."""
        arrays = self.problems.pop(reference_path, None) or {}
        self.problems[reference_path] = arrays  # now the most recent
        while len(self.problems) > KEPT_PROBLEMS:
            del self.problems[next(iter(self.problems))]
        self.cached = arrays

    def on_device(self, path: str):
        if ("device", path) not in self.cached:
            array = self.runtime.asdevicearray(self.config.device, np.load(path))
            self.cached[("device", path)] = array
        return self.cached[("device", path)]

    def on_host(self, path: str) -> np.ndarray:
        if ("host", path) not in self.cached:
            self.cached[("host", path)] = np.load(path)
        return self.cached[("host", path)]

    def load(self, vmfb: str, name: str = KERNEL_FUNCTION):
        """(the function, whether it is the one loaded last)"""
        info = os.stat(vmfb)  # a module rebuilt at the same path is loaded again
        key = (vmfb, info.st_ino, info.st_size, info.st_mtime_ns, name)
        last = self.last
        if last.get("key") == key:
            return last["function"], True
        last.clear()
        context = self.runtime.SystemContext(config=self.config)
        module = self.runtime.VmModule.mmap(self.config.vm_instance, vmfb)
        context.add_vm_module(module)
        last.update(key=key, context=context, function=context.modules[module.name][name])
        return last["function"], False

    def answer_time(self, request) -> tuple:
        """(TIME, ms per call of each repetition), or ("runtime_error", why)."""
        _, vmfb, input_paths, reference_path, repetitions, min_time, benchmark, slow = request
        self.use(reference_path)
        try:
            _injected_fault()
            if benchmark is not None:
                # IREE's dispatch benchmark: its one argument is how often to dispatch.
                name, count = benchmark
                function, warm = self.load(vmfb, name)
                fitted = fitted_count(function, count)
                slow = slow * fitted / count if slow else None
                samples = time_calls(function, [fitted], repetitions, min_time, warm, slow)
                return (TIME, [ms / fitted for ms in samples])  # per dispatch
            function, warm = self.load(vmfb)
            # Every input stays on the device, the accumulator too: timing an in-place
            # kernel on its own output changes its values, not its speed.
            arguments = [self.on_device(p) for p in input_paths]
            samples = time_calls(function, arguments, repetitions, min_time, warm, slow)
            return (TIME, samples)
        except Exception as error:  # noqa: BLE001 - a failed timing is the outcome
            self.last.clear()
            return ("runtime_error", _first_line(error))

    def answer_check(self, request) -> Verification:
        """The candidate's answer against the reference, with the time of each phase."""
        vmfb, input_paths, reference_path, allowed = request
        self.use(reference_path)
        try:
            _injected_fault()
            marks = [time.perf_counter()]
            function, _ = self.load(vmfb)
            # A kernel that accumulates into its third input writes that buffer in place:
            # only lhs and rhs stay on the device, the accumulator is copied in every time.
            lhs_rhs = [self.on_device(p) for p in input_paths[:2]]
            marks.append(time.perf_counter())
            result = function(*lhs_rhs, *[self.on_host(p) for p in input_paths[2:]])
            marks.append(time.perf_counter())
            output = result.to_host()
            del result
            marks.append(time.perf_counter())
            reference = self.on_host(reference_path)
            if "scale" not in self.cached:
                self.cached["scale"] = max_abs_difference(reference)
            answer = compare(output, reference, allowed, self.cached["scale"])
            marks.append(time.perf_counter())
            answer.phases = {
                phase: round(end - start, 4)
                for phase, start, end in zip(CHECK_PHASES, marks[:-1], marks[1:], strict=True)
            }
        except Exception as error:  # noqa: BLE001 - any failure of a candidate is its outcome
            self.last.clear()
            answer = Verification("runtime_error", message=_first_line(error))
        return answer


class Verifier:
    """Checks answers in one long-lived worker process that keeps the device open.

    A fresh iree-run-module per candidate spent about 0.5 s on the H200 creating a CUDA
    context and reading the inputs; the worker pays that once per run. The worker is a
    separate process, so a candidate that crashes it is a runtime_error, not the end of the
    run: the worker is started again for the next one. It says when its device is open, so
    a check waits `run_timeout` for the candidate alone, never for the start-up. bf16
    problems, which numpy cannot hold, go through iree-run-module.
    """

    def __init__(self, device: str, runtime_flags: tuple[str, ...] = ()):
        self.device = device
        self.runtime_flags = runtime_flags  # IREE runtime flags, as iree-run-module takes them
        self.unavailable = ""  # why the worker could not open the device, if it could not
        self.process = None
        self.connection = None
        # One request at a time: a bench's thread checks and times while the main thread
        # may close the worker (an interrupt of a run on several devices).
        self.lock = threading.RLock()

    def _start(self) -> None:
        """Starts the worker and waits until its device is open (or it says it cannot).

        A fresh interpreter (no forked copy of a live device) in its own session, speaking
        multiprocessing's pickled messages over a socket pair.
        """
        if processes.stopping():  # the run is being interrupted: no new worker
            self.unavailable = f"{UNAVAILABLE}the run is stopping"
            return
        mine, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WORKER,
                    str(theirs.fileno()),
                    self.device,
                    *self.runtime_flags,
                ],
                pass_fds=[theirs.fileno()],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.connection = Connection(mine.detach())
        processes.track(self.process.pid)
        try:
            ready = self.connection.recv() if self.connection.poll(STARTUP_TIMEOUT) else None
        except (EOFError, OSError):
            ready = None
        if ready != READY:
            self.unavailable = (
                ready
                if isinstance(ready, str)
                else f"{UNAVAILABLE}the worker did not start in {STARTUP_TIMEOUT:g} s"
            )
            self._stop()

    def _stop(self) -> None:
        process, connection = self.process, self.connection
        self.process = self.connection = None
        if process is not None:
            process.kill()
            process.wait()
            processes.untrack(process.pid)
        if connection is not None:
            connection.close()

    def _alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _usable(self, data: ProblemData | None) -> bool:
        """Starts the worker if needed; False where it cannot serve (no device, or inputs
        numpy cannot hold); `data` None: no inputs needed."""
        if not self.unavailable and not self._alive():
            self._start()
        if data is None:
            return not self.unavailable
        return not self.unavailable and len(data.input_paths) == len(data.inputs)

    def _ask(self, request, timeout: float) -> tuple[str, object]:
        """("answer", the worker's reply), or ("runtime_error" | "timeout", why): a worker
        that crashed or hung is stopped, to be started again for the next request."""
        try:
            self.connection.send(request)
            if self.connection.poll(timeout):
                return "answer", self.connection.recv()
        except (EOFError, OSError):
            try:
                code = self.process.wait(1)
            except subprocess.TimeoutExpired:
                code = None
            self._stop()
            return "runtime_error", f"the run crashed (exit {code})"
        self._stop()
        return "timeout", f"over {timeout:g} s"

    def check(self, vmfb: str, data: ProblemData, problem: Problem, timeout: float) -> Verification:
        with self.lock:
            if not self._usable(data):
                return verify_module(vmfb, self.device, data, problem, timeout)
            request = (
                os.path.abspath(vmfb),
                data.input_paths,
                data.reference_path,
                problem.tolerance(),
            )
            kind, answer = self._ask(request, timeout)
        return answer if kind == "answer" else Verification(kind, message=answer)

    def time(
        self,
        vmfb: str,
        data: ProblemData,
        dispatch_repeat: int,
        repetitions: int,
        min_time: float,
        timeout: float,
        benchmark_function: str | None = None,
        slow_ms: float | None = None,
    ):
        """Time per dispatch, measured in the worker that keeps the device and the inputs
        open (no new process per candidate); None where the worker cannot (bf16 or fp8
        inputs, no device), so that the caller falls back to iree-benchmark-module.

        With `benchmark_function`, the module is one of IREE's dispatch benchmarks: that
        function is called with the dispatch count, on no inputs. A dispatch slower than
        `slow_ms` is timed once (see `time_calls`)."""
        benchmark = (benchmark_function, dispatch_repeat) if benchmark_function else None
        with self.lock:
            if not self._usable(None if benchmark else data):  # a benchmark takes no inputs
                return None
            request = (TIME, os.path.abspath(vmfb), data.input_paths, data.reference_path)
            slow = slow_ms * dispatch_repeat if slow_ms else None  # per call
            kind, answer = self._ask((*request, repetitions, min_time, benchmark, slow), timeout)
        if kind != "answer":
            return Timing(kind, message=answer)
        status, value = answer
        if status != TIME:
            return Timing(status, message=value)
        if benchmark:  # the worker gives a dispatch benchmark's times per dispatch
            return summarize(value)
        return summarize([ms / dispatch_repeat for ms in value])

    def close(self) -> None:
        with self.lock:  # after the request in flight, which an interrupt cuts short
            if self._alive():
                try:
                    self.connection.send(None)
                    self.process.wait(2)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._stop()
