"""Where a compiled model's time goes, read by IREE's own HAL profiler on the real build.

Times each vmfb of a proof folder (`generated/model/proof/`: default, tuned, custom) with
iree-benchmark-module under a few CUDA runtime settings, then records one profiled run of each
(`--device_profiling_mode`) and reduces it with `iree-profile`: every dispatch of the build
as it runs (custom kernels included), and the busy time against the call's wall time.

    python3 benchmarks/profile_model.py --model MODEL.mlir --proof generated/model/proof \
        --device cuda --out DIR

Writes `DIR/profile.md` (the tables) and `DIR/NAME.explain.txt` (iree-profile's own summary).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from autosched.measure.benchmark_tool import benchmark_tool, time_module  # noqa: E402
from autosched.measure.module_io import make_inputs, source_entry_function  # noqa: E402
from autosched.processes import tool_path  # noqa: E402

# Runtime settings compared on CUDA (iree-benchmark-module --help, IREE 3.13's CUDA driver).
CUDA_SETTINGS = {
    "streams (default)": (),
    "graphs": ("--cuda_use_streams=false",),
    "streams, inline": ("--cuda_allow_inline_execution=true",),
}
# Profiling families tried in order: the first the driver takes is used.
MODES = ("dispatch-events,queue-events", "dispatch-events", "host-execution")


def profile_tool() -> str:
    beside = os.path.join(os.path.dirname(benchmark_tool()), "iree-profile")
    return tool_path("iree-profile", beside)


def profiled_run(vmfb, device, inputs, function, out_path) -> str | None:
    """Records one profiled benchmark run; the mode that worked (None: none did)."""
    for mode in MODES:
        command = [
            benchmark_tool(),
            f"--module={vmfb}",
            f"--function={function}",
            f"--device={device}",
            *[f"--input={value}" for value in inputs],
            "--benchmark_min_time=20x",
            f"--device_profiling_mode={mode}",
            f"--device_profiling_output={out_path}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            return mode
        print(f"  mode {mode}: {done.stderr.strip()[-300:]}", flush=True)
    return None


def dispatch_rows(profile: str) -> list[dict]:
    """iree-profile's per-function aggregates (jsonl), largest total first."""
    done = subprocess.run(
        [profile_tool(), "dispatch", "--format=jsonl", profile],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    rows = [r for r in rows if "total_ns" in r or "avg_ns" in r]
    return sorted(rows, key=lambda r: -float(r.get("total_ns", 0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--proof", required=True, help="folder holding the build vmfbs")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True)
    parser.add_argument("--flags", default="", help="compile flags of the target (for the ABI)")
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    flags = options.flags.split() or [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
    ]
    work = os.path.join(options.out, "work")
    entry = source_entry_function(options.model, flags, None, work, 600, options.model)
    inputs = make_inputs(entry, os.path.join(work, "inputs"))
    vmfbs = sorted(f for f in os.listdir(options.proof) if f.endswith(".vmfb"))
    settings = CUDA_SETTINGS if options.device.startswith("cuda") else {"default": ()}
    lines = ["# Model builds: runtime settings and IREE's HAL profile", ""]
    lines += ["| build | " + " | ".join(settings) + " |", "| --- " * (len(settings) + 1) + "|"]
    for name in vmfbs:
        vmfb = os.path.join(options.proof, name)
        cells = []
        for extra in settings.values():
            timing = time_module(vmfb, options.device, inputs, 1, 5, 0.1, 600, entry.name, extra)
            cells.append(f"{timing.median_ms:.4g} ({timing.cv:.1%})" if timing.median_ms else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    for name in vmfbs:
        path = os.path.join(work, name.replace(".vmfb", ".ireeprof"))
        mode = profiled_run(
            os.path.join(options.proof, name), options.device, inputs, entry.name, path
        )
        if mode is None:
            lines += ["", f"{name}: no profiling mode was accepted"]
            continue
        explain = subprocess.run([profile_tool(), "explain", path], capture_output=True, text=True)
        with open(os.path.join(options.out, name.replace(".vmfb", ".explain.txt")), "w") as f:
            f.write(explain.stdout + explain.stderr)
        lines += [
            "",
            f"## {name} ({mode})",
            "",
            "| function | count | avg us | total us |",
            "| --- | --- | --- | --- |",
        ]
        for row in dispatch_rows(path):
            key = row.get("key") or row.get("function") or row.get("name")
            lines.append(
                f"| {key} | {row.get('count')} | {float(row.get('avg_ns', 0)) / 1e3:.1f} "
                f"| {float(row.get('total_ns', 0)) / 1e3:.1f} |"
            )
    with open(os.path.join(options.out, "profile.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
