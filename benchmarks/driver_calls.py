"""Every CUDA driver call a whole-model call makes, in order, with its time (issue 24).

The Llama-3-8B layer's custom build spends 0.2-0.3 ms a call beside its kernels on the
H200 (session 26), while a module of a few chained matmuls spends 20 us. torch's profiler
(model_timeline.py) lists only the kernel launches among the driver calls, so what the
host does in that time was not seen. CUPTI's callback API sees every driver entry point,
whoever calls it: `cupti_trace.c` records each one (thread, name, times) from a callback
in C, so that IREE's own threads never wait for Python.

- By default the build runs in IREE's Python runtime, warm, and the median call's driver
  calls are listed in order (thread, start after the call's start, time in the driver),
  then summed by name, with the caller's time outside the driver.
- `--tool N` preloads the trace into iree-benchmark-module timing the build as the proof
  does, and lists the driver calls from the host's wait for one call returning to the next
  call's (calls of N kernel launches; 0: the usual count): a call's cost beside its
  kernels when calls follow each other.

    python3 benchmarks/driver_calls.py MODEL.mlir --proof generated/model/proof \
        --builds custom [--flags "--cuda_async_allocations=false ..."] [--calls 20] \
        [--tool 0] [--trace cupti_trace.so]
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

DRIVER_DOMAIN = 1  # CUPTI_CB_DOMAIN_DRIVER_API
TRACE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cupti_trace.c")


class DriverCall(ctypes.Structure):
    """cupti_trace.c's record of one driver call."""

    _fields_ = [
        ("thread", ctypes.c_int32),
        ("cbid", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("enter_ns", ctypes.c_int64),
        ("exit_ns", ctypes.c_int64),
    ]


def load_cupti() -> ctypes.CDLL:
    """libcupti from torch's CUDA wheels or a CUDA toolkit."""
    roots = [p for p in sys.path if p.endswith("site-packages")]
    patterns = [f"{r}/nvidia/**/libcupti.so*" for r in roots]
    patterns += ["/usr/local/cuda*/**/libcupti.so*", "/usr/lib/x86_64-linux-gnu/libcupti.so*"]
    for pattern in patterns:
        for path in sorted(glob.glob(pattern, recursive=True)):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    raise SystemExit("Error: no libcupti found (torch's nvidia wheels or a CUDA toolkit)")


def build_trace(folder: str) -> str:
    """cupti_trace.c compiled into `folder`."""
    path = os.path.join(folder, "cupti_trace.so")
    command = ["cc", "-shared", "-fPIC", "-O2", "-o", path, TRACE_SOURCE, "-ldl"]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return path


class DriverTrace:
    """The driver calls (thread, name, enter ns, exit ns) made while recording, from a
    CUPTI callback in C (`cupti_trace.c`)."""

    def __init__(self, library: str) -> None:
        self._trace = ctypes.CDLL(library)
        self._cupti = load_cupti()
        self._subscriber = ctypes.c_void_p()
        callback = ctypes.cast(self._trace.autosched_driver_callback, ctypes.c_void_p)
        self._check("cuptiSubscribe", self._cupti.cuptiSubscribe(
            ctypes.byref(self._subscriber), callback, None))  # fmt: skip
        self._check("cuptiEnableDomain", self._cupti.cuptiEnableDomain(
            1, self._subscriber, DRIVER_DOMAIN))  # fmt: skip
        self._count = ctypes.c_int.in_dll(self._trace, "autosched_call_count")
        self._recording = ctypes.c_int.in_dll(self._trace, "autosched_recording")
        self._calls = (DriverCall * (1 << 20)).in_dll(self._trace, "autosched_calls")

    @staticmethod
    def _check(name: str, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"{name} failed: CUPTI error {status}")

    def record(self, on: bool) -> None:
        if on:
            self._count.value = 0
        self._recording.value = int(on)

    @property
    def events(self) -> list[tuple[int, str, int, int]]:
        count = min(self._count.value, len(self._calls))
        return [
            (c.thread, (c.name or b"?").decode(), c.enter_ns, c.exit_ns)
            for c in self._calls[:count]
        ]

    def close(self) -> None:
        self._cupti.cuptiUnsubscribe(self._subscriber)


def traced_calls(call, calls: int, trace: DriverTrace) -> list[tuple[int, int, list]]:
    """(start ns, end ns, driver calls) of each of `calls` calls, after warm ones."""
    for _ in range(5):
        call()
    spans = []
    for _ in range(calls):
        trace.record(True)
        start = time.monotonic_ns()
        call()
        end = time.monotonic_ns()
        trace.record(False)
        spans.append((start, end, trace.events))
    return spans


def report(build: str, spans: list) -> list[str]:
    """The median call's driver calls in order, and every call's calls summed by name."""
    spans = sorted(spans, key=lambda s: s[1] - s[0])
    start, end, events = spans[len(spans) // 2]
    caller = threading.get_native_id()
    lines = [f"### {build}: median call {(end - start) / 1e3:.1f} us ({len(spans)} calls)", ""]
    lines += [
        "| # | thread | driver call | starts at us | us in it |",
        "| --- | --- | --- | --- | --- |",
    ]
    for i, (thread, name, enter, leave) in enumerate(sorted(events, key=lambda e: e[2])):
        who = "caller" if thread == caller else f"other {thread}"
        at, took = (enter - start) / 1e3, (leave - enter) / 1e3
        lines.append(f"| {i} | {who} | `{name}` | {at:.1f} | {took:.1f} |")
    in_driver = sum(e[3] - e[2] for e in events if e[0] == caller)
    lines += ["", f"caller's time outside the driver: {(end - start - in_driver) / 1e3:.1f} us", ""]
    totals: dict[str, list[float]] = defaultdict(list)
    for _, _, events in spans:
        per_name: dict[str, float] = defaultdict(float)
        for _, name, enter, leave in events:
            per_name[name] += (leave - enter) / 1e3
        for name, us in per_name.items():
            totals[name].append(us)
    lines += [
        "| driver call | calls a model call | us a model call (median) |",
        "| --- | --- | --- |",
    ]
    for name, values in sorted(totals.items(), key=lambda kv: -statistics.median(kv[1])):
        count = sum(1 for e in spans[0][2] if e[1] == name)
        lines.append(f"| `{name}` | {count} | {statistics.median(values):.1f} |")
    return lines


def tool_calls(vmfb: str, function: str, inputs: list[str], flags: list[str], library: str):
    """The driver calls of iree-benchmark-module timing the build as the proof does, with
    the trace preloaded: (median ms a call, [(thread, name, enter ns, exit ns)...])."""
    from model_kernels import tool_timing

    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        env = {"LD_PRELOAD": library, "AUTOSCHED_CUPTI_LIB": load_cupti()._name}
        env["AUTOSCHED_CUPTI_OUT"] = out.name
        timing = tool_timing(vmfb, function, inputs, flags, env, repetitions=3)
        events = []
        for line in open(out.name, encoding="utf-8"):
            thread, name, enter, leave = line.split()
            events.append((int(thread), name, int(enter), int(leave)))
    return timing.median_ms, events


def between_calls(events: list, launches: int) -> list[str]:
    """The driver calls from the host's wait for one call returning (its long
    cuEventSynchronize) to the next call's, for the median of the tool's steady calls (by
    the time to the next call's first launch): what a call spends beside its kernels, host
    side, when calls follow each other."""
    events = sorted(events, key=lambda e: e[2])
    waits = [
        i for i, e in enumerate(events) if e[1] == "cuEventSynchronize" and e[3] - e[2] > 200_000
    ]
    spans = [events[first + 1 : last + 1] for first, last in zip(waits, waits[1:], strict=False)]
    counts = [sum(e[1].startswith("cuLaunchKernel") for e in span) for span in spans]
    launches = launches or max(set(counts), key=counts.count, default=0)  # the usual count
    windows = []
    for first, window, count in zip(waits, spans, counts, strict=False):
        kernel_launches = [e for e in window if e[1].startswith("cuLaunchKernel")]
        if count == launches and kernel_launches:
            start = events[first][3]
            windows.append((kernel_launches[0][2] - start, start, window))
    if not windows:
        return [f"no steady window of {launches} launches between two long waits"]
    windows.sort(key=lambda w: w[0])
    gap, start, window = windows[len(windows) // 2]
    lines = [
        f"median of {len(windows)} calls: {gap / 1e3:.1f} us from the host's wait for one "
        "call returning to the next call's first launch",
        "",
        "| driver call | thread | starts at us | us in it |",
        "| --- | --- | --- | --- |",
    ]
    threads = {}
    for thread, name, enter, leave in window:
        label = threads.setdefault(thread, f"t{len(threads)}")
        lines.append(
            f"| `{name}` | {label} | {(enter - start) / 1e3:.1f} | {(leave - enter) / 1e3:.1f} |"
        )
    return lines


def main() -> None:
    from model_kernels import proof_model, proof_parser
    from model_timeline import model_call

    parser = proof_parser(__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--trace", help="cupti_trace.so, built (default: built here with cc)")
    parser.add_argument(
        "--tool", type=int, metavar="LAUNCHES",
        help="trace iree-benchmark-module instead, whose calls launch LAUNCHES kernels each "
        "(0: the usual count)",
    )  # fmt: skip
    options = parser.parse_args()
    flags = options.flags.split()
    with tempfile.TemporaryDirectory() as work:
        library = os.path.abspath(options.trace) if options.trace else build_trace(work)
        if options.tool is not None:
            entry, inputs = proof_model(options.model, options.arch, work)
            print(f"`{options.model}`, iree-benchmark-module, flags `{options.flags}`\n")
            for build in options.builds.split(","):
                vmfb = os.path.join(options.proof, f"{build}.vmfb")
                ms, events = tool_calls(vmfb, entry.name, inputs, flags, library)
                print(f"### {build}: {ms:.3f} ms a call\n")
                print("\n".join(between_calls(events, options.tool)), flush=True)
            return
        trace = DriverTrace(library)
        entry, inputs = proof_model(options.model, options.arch, work)
        print(f"`{options.model}`, function `{entry.name}`, flags `{options.flags}`\n")
        for build in options.builds.split(","):
            vmfb = os.path.join(options.proof, f"{build}.vmfb")
            call = model_call(vmfb, entry.name, inputs, "cuda", flags)
            flags = []  # the runtime's flags are parsed once a process
            print("\n".join(report(build, traced_calls(call, options.calls, trace))), flush=True)
        trace.close()


if __name__ == "__main__":
    main()
