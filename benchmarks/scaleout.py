"""Candidates per second on one GPU, on every GPU of the host, and through Ray: the same
suite, trials and seed each way; writes a markdown table from cuda_suite.py's JSON sidecars.

    python3 benchmarks/scaleout.py --out DIR --modes serial,one,all[,ray] [--n-trial 40]

Each mode is one `benchmarks/cuda_suite.py` run (xgboost, batch 16, timer worker):
- serial: `--devices cuda://0 --parallel-problems 1` (one problem at a time, as before);
- one: `--devices cuda://0` (problems searched two at a time by default);
- all: `--devices all` (the local multi-device executor);
- ray: `--executor ray --ray-address ADDRESS` (one measuring actor per GPU of the cluster;
  start it first with `ray start --head`).
A mode whose run fails is listed with its exit code; the others still get their row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = {
    "serial": ["--devices", "cuda://0", "--parallel-problems", "1"],
    "one": ["--devices", "cuda://0"],
    "all": ["--devices", "all"],
    "ray": ["--executor", "ray"],
}


def stage_medians(rows: list[dict]) -> str:
    """The median over problems of each stage's per-trial median (compile / verify / time)."""
    stages = list(zip(*(r["stage_s"].split(" / ") for r in rows), strict=True))
    return " / ".join(
        f"{statistics.median(float(v) for v in values if v != '-'):.2f}" for values in stages
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--modes", default="one,all")
    parser.add_argument("--n-trial", type=int, default=40)
    parser.add_argument("--only", default="")
    parser.add_argument("--ray-address", default="auto")
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    results = {}
    for mode in options.modes.split(","):
        extra = MODES[mode] + (["--ray-address", options.ray_address] if mode == "ray" else [])
        table = os.path.join(options.out, f"suite_{mode}.md")
        command = [
            sys.executable,
            os.path.join(here, "cuda_suite.py"),
            "--out",
            table,
            "--n-trial",
            str(options.n_trial),
            "--timer",
            "worker",
            "--work-dir",
            f"generated/scaleout_{mode}",
            *(["--only", options.only] if options.only else []),
            *extra,
        ]
        started = time.perf_counter()
        with open(os.path.join(options.out, f"suite_{mode}.log"), "w") as log:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
        sidecar = os.path.splitext(table)[0] + ".json"
        if code == 0 and os.path.exists(sidecar):
            with open(sidecar) as handle:
                results[mode] = json.load(handle)
        else:
            results[mode] = {"failed": code, "seconds": time.perf_counter() - started}
        print(mode, results[mode].get("failed", "ok"), flush=True)

    base = results.get("one", {})
    base_rate = base["trials"] / base["wall_s"] if "trials" in base else None
    lines = [
        "# Scale-out: candidates per second by executor and device count",
        "",
        f"Command: `python3 benchmarks/scaleout.py --out DIR --modes {options.modes} "
        f"--n-trial {options.n_trial}"
        + (f" --only {options.only}" if options.only else "")
        + "`; each mode is one cuda_suite.py run (its own table beside this one).",
        "",
        "| mode | devices | problems at once | trials | tuning wall s | candidates/s | "
        "s per candidate | vs one GPU | geomean speedup | compile / verify / time s "
        "(median per trial) | GPUs busy measuring |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode, result in results.items():
        if "failed" in result:
            lines.append(
                f"| {mode} | - | - | - | - | - | - | - | - | - | exit {result['failed']} |"
            )
            continue
        rate = result["trials"] / result["wall_s"]
        lines.append(
            f"| {mode} | {len(result['devices'])} | {result.get('parallel_problems', 1)} | "
            f"{result['trials']} | "
            f"{result['wall_s']:.0f} | {rate:.2f} | {1 / rate:.2f} | "
            + (f"{rate / base_rate:.2f}x" if base_rate else "-")
            + f" | {result['geomean']:.2f}x | {stage_medians(result['rows'])} | "
            + ", ".join(f"{share:.0%}" for share in result.get("busy", {}).values())
            + " |"
        )
    with open(os.path.join(options.out, "scaleout.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
