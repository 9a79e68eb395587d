"""Each kernel's time inside a whole-model call, by Nsight Compute (issue 24).

The dispatch table times each dispatch alone (IREE's dumped dispatch benchmarks, repeated),
and on the H200 the whole Llama-3-8B layer with its custom kernels took 0.19 ms more than
their sum. This runs a build of the proof (its vmfb, as `autosched run` left it) under ncu
and lists the kernels of one steady call with their GPU times, so that the kernels' sum in
the model can be set against the model's time and against the dispatch table: a gap between
the two sums is the kernels running slower in the model (caches, clocks), and what is left
of the model's time is time between kernels.

ncu runs with `--cache-control none --clock-control none`: the caches as the model leaves
them, the clocks as the GPU sets them. It serializes the kernels, so it times no gaps.

    python3 benchmarks/model_kernels.py MODEL.mlir --proof generated/model/proof \
        --builds custom,default [--flags "--device_allocator=caching"] \
        [--settings "--cuda_use_streams=false"]

Prints a markdown table per build; with `--settings`, also each build's whole-model time
(as the proof times it: iree-benchmark-module, median of 5 and CV) with `--flags` alone and
with each setting added (`;`-separated), such as IREE's CUDA graph command buffers.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from autosched.measure.benchmark_tool import benchmark_tool, time_module  # noqa: E402

NCU = ["--cache-control", "none", "--clock-control", "none", "--csv", "--print-units", "base"]
METRIC = "gpu__time_duration.sum"


def kernel_times(command: list[str]) -> list[tuple[str, float]]:
    """(kernel, ns) of every kernel `command` launches, in launch order, by ncu."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    done = subprocess.run(
        [ncu, *NCU, "--metrics", METRIC, *command], capture_output=True, text=True, timeout=600
    )
    header = done.stdout.find('"ID"')
    if done.returncode != 0 or header < 0:
        raise RuntimeError(f"ncu failed ({done.returncode}): {done.stderr[-800:]}")
    rows = csv.DictReader(io.StringIO(done.stdout[header:]))
    timed = [r for r in rows if r["Metric Name"] == METRIC]
    # ncu writes its numbers with thousands separators ("1,957,184")
    return [(r["Kernel Name"], float(r["Metric Value"].replace(",", ""))) for r in timed]


def calls_command(vmfb: str, function: str, inputs: list[str], flags: list[str], calls: int):
    """iree-benchmark-module running `calls` calls of the build on the GPU, no warm-up."""
    command = [benchmark_tool(), f"--module={vmfb}", f"--function={function}"]
    command += ["--device=cuda", *[f"--input={x}" for x in inputs], *flags]
    command += ["--benchmark_repetitions=1", f"--benchmark_min_time={calls}x"]
    return [*command, "--benchmark_min_warmup_time=0"]


def one_call(vmfb: str, function: str, inputs: list[str], flags: list[str]) -> list:
    """The kernels of one steady call: the last calls' launches of a run of two calls past
    those of a run of one (the module's own start-up launches are in both)."""
    runs = [kernel_times(calls_command(vmfb, function, inputs, flags, calls)) for calls in (1, 2)]
    per_call = len(runs[1]) - len(runs[0])
    if per_call <= 0:
        raise RuntimeError("a second call launched no kernels")
    return runs[1][-per_call:]


def table(build: str, kernels: list[tuple[str, float]]) -> list[str]:
    lines = [f"### {build}", "", "| kernel | us |", "| --- | --- |"]
    lines += [f"| `{name[:90]}` | {ns / 1e3:.1f} |" for name, ns in kernels]
    lines += [f"| **all {len(kernels)} kernels** | **{sum(ns for _, ns in kernels) / 1e3:.1f}** |"]
    return [*lines, ""]


def whole_times(vmfb: str, function: str, inputs: list[str], flags: str, settings: str):
    """Rows of the build's whole-model time with `flags`, then with each setting added."""
    rows = ["| runtime flags | ms (cv) |", "| --- | --- |"]
    for setting in ["", *filter(None, settings.split(";"))]:
        used = f"{flags} {setting}".split()
        timing = time_module(vmfb, "cuda", inputs, 1, 5, 0.2, 300, function, tuple(used))
        cell = f"{timing.median_ms:.3f} ({timing.cv:.1%})" if timing.median_ms else timing.message
        rows.append(f"| `{' '.join(used) or 'none'}` | {cell} |")
    return [*rows, ""]


def tool_timing(
    vmfb: str, function: str, inputs: list[str], flags: list[str], env: dict, repetitions: int = 5
):
    """iree-benchmark-module's timing of a build (as the proof times it) with `env` added
    to the tool's environment (a preloaded library and its settings)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        return time_module(vmfb, "cuda", inputs, 1, repetitions, 0.2, 300, function, tuple(flags))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def proof_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a script that runs the builds a run's proof left behind."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model", help="the model the proof built (.mlir)")
    parser.add_argument("--proof", required=True, help="the proof's folder (its vmfbs)")
    parser.add_argument("--builds", default="custom,default")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--flags", default="", help="IREE runtime flags, as the proof used")
    return parser


def proof_model(model_path: str, arch: str, work: str):
    """(entry function, --input values) of the model, as its proof ran it."""
    from autosched.config import RunConfig
    from autosched.measure.module_io import make_inputs, source_entry_function
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch=arch), Machine())
    model = os.path.abspath(model_path)
    entry = source_entry_function(model, target.compile_flags(), None, work, 600, model)
    return entry, make_inputs(entry, os.path.join(work, "inputs"))


def main() -> None:
    parser = proof_parser(__doc__.splitlines()[0])
    parser.add_argument("--settings", default="", help="flags to add, `;`-separated")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        entry, inputs = proof_model(options.model, options.arch, work)
        print(f"`{options.model}`, function `{entry.name}`, flags `{options.flags}`\n")
        for build in options.builds.split(","):
            vmfb = os.path.join(options.proof, f"{build}.vmfb")
            kernels = one_call(vmfb, entry.name, inputs, options.flags.split())
            print("\n".join(table(build, kernels)), flush=True)
            if options.settings:
                rows = whole_times(vmfb, entry.name, inputs, options.flags, options.settings)
                print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
