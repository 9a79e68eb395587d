"""Where one whole-model call's time goes: the GPU's kernels, the gaps between them, and the
host's time before the first kernel and after the last (issue 24).

On the H200 the Llama-3-8B layer's custom build took 1.85 ms a call while Nsight Compute
found its kernels in one call summing to 1.56 ms; IREE's default build showed the same
0.26 ms beside 8.9 ms of kernels. ncu serializes the kernels, so it cannot say where that
time is. This loads a build of the proof with IREE's Python runtime in the same process as
torch's profiler, whose CUPTI trace records every kernel on the GPU (IREE's too) and every
CUDA driver call, and splits each steady call into:

- head: from the call's start on the host to its first kernel's start on the GPU;
- kernels: the sum of the call's kernel times;
- gaps: the GPU idle between its first kernel's start and its last kernel's end;
- tail: from the last kernel's end to the call's return on the host;

and lists the driver calls the host made during the calls (count and time per call).

    python3 benchmarks/model_timeline.py MODEL.mlir --proof generated/model/proof \
        --builds custom,default [--flags "--cuda_async_allocations=false ..."] [--calls 20] \
        [--sched spin]

`--sched` sets how the host waits for the GPU (CUDA's scheduling flags of the primary
context, which IREE's runtime uses) before anything creates it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

ANNOTATION = "iree_call"


def device_inputs(runtime, device, flags: list[str]) -> list:
    """The model's inputs (make_inputs' --input values) as buffer views on `device`."""
    views = []
    for flag in flags:
        if "=@" in flag:  # bf16: raw bits with their type, `2x3xbf16=@file.bin`
            text, path = flag.split("=@")
            shape = [int(d) for d in text.split("x")[:-1]]
            array, element = np.fromfile(path, dtype=np.uint16).reshape(shape), "bf16"
        else:
            array, element = np.load(flag.removeprefix("@")), None
        element_type = (
            runtime.HalElementType.BFLOAT_16
            if element == "bf16"
            else runtime.array_interop.map_dtype_to_element_type(array.dtype)
        )
        views.append(
            device.allocator.allocate_buffer_copy(
                memory_type=runtime.MemoryType.DEVICE_LOCAL,
                allowed_usage=runtime.BufferUsage.DEFAULT,
                device=device,
                buffer=array,
                element_type=element_type,
            )
        )
    return views


# CUDA's scheduling of a host thread that waits for the GPU (cuCtxCreate's CU_CTX_SCHED_*):
# IREE's waits run cuEventSynchronize in the context it retains, the device's primary one.
SCHEDULING = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}


def set_scheduling(name: str) -> None:
    """Sets how the primary context's waits wait, before IREE or torch create it."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    device = ctypes.c_int()
    for call, status in (
        ("cuInit", cuda.cuInit(0)),
        ("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0)),
        ("cuDevicePrimaryCtxSetFlags", cuda.cuDevicePrimaryCtxSetFlags(device, SCHEDULING[name])),
    ):
        if status != 0:
            raise RuntimeError(f"{call} failed: CUDA error {status}")


def model_call(vmfb: str, function: str, inputs: list[str], device_uri: str, flags: list[str]):
    """A no-argument callable running the model once, synchronously, with IREE's runtime."""
    import iree.runtime as runtime

    # `--device_allocator` is a flag of IREE's tools, not of its Python runtime: the
    # runtime takes the allocators when it creates the device.
    allocators = [f.split("=", 1)[1] for f in flags if f.startswith("--device_allocator=")]
    flags = [f for f in flags if not f.startswith("--device_allocator=")]
    if flags:
        runtime.flags.parse_flags(*flags)
    if allocators:
        driver = runtime.get_driver(device_uri.split(":")[0])
        device = driver.create_device_by_uri(device_uri, allocators=allocators)
    else:
        device = runtime.get_device(device_uri)
    config = runtime.Config(device=device)
    context = runtime.SystemContext(config=config)
    module = runtime.VmModule.mmap(config.vm_instance, vmfb)
    context.add_vm_module(module)
    entry = module.lookup_function(function)
    views = device_inputs(runtime, config.device, inputs)

    def call() -> None:
        arguments, results = runtime.VmVariantList(len(views)), runtime.VmVariantList(1)
        for view in views:
            arguments.push_ref(view)
        context.vm_context.invoke(entry, arguments, results)

    return call


def split_calls(events: list[dict]) -> dict:
    """Each annotated call's head, kernels, gaps and tail (us, medians over the calls), and
    the driver calls made inside them (pure: `events` is a Chrome trace's event list)."""
    calls = sorted(
        (e for e in events if e.get("name") == ANNOTATION and e.get("cat") == "user_annotation"),
        key=lambda e: e["ts"],
    )
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    host = [e for e in events if e.get("cat") in ("cuda_driver", "cuda_runtime")]
    parts: dict[str, list[float]] = defaultdict(list)
    api: dict[str, list[float]] = defaultdict(list)
    for index, call in enumerate(calls):
        start, end = call["ts"], call["ts"] + call["dur"]
        # a call's kernels: those starting after it starts and before the next call starts
        limit = calls[index + 1]["ts"] if index + 1 < len(calls) else float("inf")
        mine = [k for k in kernels if start <= k["ts"] < limit]
        if not mine:
            continue
        first, last = mine[0]["ts"], max(k["ts"] + k["dur"] for k in mine)
        busy = sum(k["dur"] for k in mine)
        parts["call"].append(call["dur"])
        parts["head"].append(first - start)
        parts["kernels"].append(busy)
        parts["gaps"].append(last - first - busy)
        parts["tail"].append(end - last)
        parts["count"].append(len(mine))
        for e in host:
            if start <= e["ts"] < end:
                api[e["name"]].append(e["dur"])
    count = max(len(parts["call"]), 1)
    return {
        "calls": len(parts["call"]),
        "parts": {name: statistics.median(values) for name, values in parts.items()},
        "api": {name: (len(values) / count, sum(values) / count) for name, values in api.items()},
    }


def profile(call, calls: int, trace: str) -> dict:
    """Runs `call` warm, then `calls` times under torch's profiler; the split of each."""
    import torch
    from torch.profiler import ProfilerActivity, record_function

    torch.cuda.init()
    for _ in range(10):
        call()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    plain_us = (time.perf_counter() - began) * 1e6 / calls  # the mean call, not profiled
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(calls):
            with record_function(ANNOTATION):
                call()
    profiler.export_chrome_trace(trace)
    with open(trace) as handle:
        split = split_calls(json.load(handle)["traceEvents"])
    split["parts"]["call, not profiled (mean)"] = plain_us
    return split


def report(build: str, split: dict) -> list[str]:
    parts = split["parts"]
    lines = [f"### {build} ({split['calls']} calls, medians)", "", "| part | us |", "| --- | --- |"]
    for name in ("call, not profiled (mean)", "call", "head", "kernels", "gaps", "tail"):
        lines.append(f"| {name} | {parts.get(name, float('nan')):.1f} |")
    lines += [f"| kernels per call | {parts.get('count', 0):.0f} |", ""]
    lines += ["| host driver call | per model call | us per model call |", "| --- | --- | --- |"]
    heaviest = sorted(split["api"].items(), key=lambda item: -item[1][1])[:12]
    lines += [f"| `{name}` | {count:.1f} | {us:.1f} |" for name, (count, us) in heaviest]
    return [*lines, ""]


def main() -> None:
    from model_kernels import proof_model, proof_parser

    parser = proof_parser(__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=".", help="where the Chrome traces go")
    parser.add_argument(
        "--sched", choices=sorted(SCHEDULING), help="how a host wait for the GPU waits"
    )
    options = parser.parse_args()
    if options.sched:
        set_scheduling(options.sched)
    flags = options.flags.split()
    with tempfile.TemporaryDirectory() as work:
        entry, inputs = proof_model(options.model, options.arch, work)
        sched = f", waits `{options.sched}`" if options.sched else ""
        print(f"`{options.model}`, function `{entry.name}`, flags `{options.flags}`{sched}\n")
        for build in options.builds.split(","):
            vmfb = os.path.join(options.proof, f"{build}.vmfb")
            call = model_call(vmfb, entry.name, inputs, "cuda", flags)
            flags = []  # the runtime's flags are parsed once a process
            trace = os.path.join(options.out, f"timeline_{build}.json")
            print("\n".join(report(build, profile(call, options.calls, trace))), flush=True)


if __name__ == "__main__":
    main()
