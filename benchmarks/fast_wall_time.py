"""How long `autosched run MODEL --mode fast` takes against one plain `iree-compile` of the
same model, measured in one call (issue 49: at most 8x on the CPU for torchvision's resnet18
at batch 2, 64x64); writes a markdown table.

    python benchmarks/fast_wall_time.py --out benchmarks/results/cpu_resnet18_fast_wall_time.md
    python benchmarks/fast_wall_time.py --repo /path/to/other/checkout --label before --out ...
    python benchmarks/fast_wall_time.py MODEL --target cuda --arch sm_90 --mode normal ...

One plain `iree-compile` of the model (the target's flags, as the run's printed
commands use them) is timed before the run and again after it; the ratio is the run's wall
time over the mean of the two, so that a change of the machine's load during the run
touches both sides. The run starts in a fresh work folder (no database, no build cache),
with the checkout `--repo` on PYTHONPATH (this one by default), and its closing block
(`where the time went`) is copied into the table. The machine's load average is recorded
at the start and the end: on a shared machine both numbers grow with it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from autosched.compile import compiler_path  # noqa: E402
from autosched.config import RunConfig  # noqa: E402
from autosched.targets import make_target  # noqa: E402

DEFAULT_MODEL = os.path.join(HERE, "tests", "data", "models", "tv_resnet18_f32.mlirbc")
TARGET_RATIO = 8.0  # issue 49's CPU target


def plain_compile(model: str, folder: str, target: list[str]) -> tuple[float, list[str]]:
    """Seconds of one `iree-compile MODEL <the target's flags> -o model.vmfb`, and the
    command (`target`: the run's `--target`/`--arch` options, none for the CPU)."""
    options = dict(zip(target[::2], target[1::2], strict=True))
    config = RunConfig(target=options.get("--target", "cpu"), arch=options.get("--arch", ""))
    flags = make_target(config).compile_flags()
    command = [compiler_path(), model, *flags, "-o", os.path.join(folder, "model.vmfb")]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start, command


def fast_run(
    model: str, folder: str, repo: str, mode: str, target: list[str]
) -> tuple[float, str, list[str]]:
    """Seconds of `autosched run MODEL --mode MODE [--target ...]` in `folder` (fresh), its
    output, and the command."""
    env = {**os.environ, "PYTHONPATH": repo}
    command = [sys.executable, "-m", "autosched", "run", model, "--mode", mode, *target]
    start = time.perf_counter()
    finished = subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    output = finished.stdout + finished.stderr
    if finished.returncode != 0:
        raise SystemExit(f"the run failed ({finished.returncode}):\n{output[-3000:]}")
    return seconds, output, command


def time_block(output: str) -> list[str]:
    """The run's `where the time went` block, as it printed it."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("where the time went")]
    if not starts:
        return []
    block = [lines[starts[-1]]]
    for line in lines[starts[-1] + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def model_line(output: str) -> str:
    found = [line for line in output.splitlines() if line.startswith("model: ")]
    return found[-1] if found else ""


def load() -> str:
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if "model name" in line]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{platform.node()}: {os.cpu_count()} cores, {cpu}"


def measure(model: str, repo: str, mode: str, target: list[str]) -> dict:
    """Compile, run, compile again: every number of one table."""
    with tempfile.TemporaryDirectory(prefix="fast-wall-time-") as scratch:
        started_load = load()
        compile_before, compile_command = plain_compile(model, scratch, target)
        work = os.path.join(scratch, "run")
        os.makedirs(work)
        run_s, output, run_command = fast_run(os.path.abspath(model), work, repo, mode, target)
        compile_after, _ = plain_compile(model, scratch, target)
        ended_load = load()
        shutil.rmtree(work, ignore_errors=True)
    compile_s = (compile_before + compile_after) / 2
    return {
        "compile_command": " ".join(compile_command),
        "options": " ".join(["autosched run MODEL --mode", mode, *target]),
        "run_command": " ".join(run_command[1:]).replace("-m autosched", "autosched", 1),
        "compile_before": compile_before,
        "compile_after": compile_after,
        "compile_s": compile_s,
        "run_s": run_s,
        "ratio": run_s / compile_s,
        "load": f"{started_load} at the start, {ended_load} at the end (1/5/15 min)",
        "phases": time_block(output),
        "model_line": model_line(output),
    }


def table(numbers: dict, label: str, repo: str) -> str:
    """One markdown section: the machine, the commands, the numbers, the run's phases."""
    lines = [
        f"## {label}",
        "",
        f"Machine: {machine()}; load average {numbers['load']}. Code: `{repo}`.",
        "",
        f"    {numbers['compile_command']}",
        f"    {numbers['run_command']}",
        "",
        "| machine | command | iree-compile s | run s | ratio |",
        "| --- | --- | --- | --- | --- |",
        f"| {platform.node()} ({os.cpu_count()} cores) | `{numbers['options']}` | "
        f"{numbers['compile_s']:.1f} ({numbers['compile_before']:.1f} before, "
        f"{numbers['compile_after']:.1f} after) | {numbers['run_s']:.1f} | "
        f"**{numbers['ratio']:.1f}x** (target {TARGET_RATIO:g}x) |",
        "",
        "The run's phases, as it printed them:",
        "",
        *[f"    {line}" for line in numbers["phases"]],
        "",
    ]
    if numbers["model_line"]:
        lines += [f"    {numbers['model_line']}", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--repo", default=HERE, help="the checkout whose autosched runs")
    parser.add_argument("--mode", default="fast")
    parser.add_argument("--target", default="cpu", help="cpu, or cuda (on a GPU machine)")
    parser.add_argument("--arch", default="", help="with --target cuda: sm_90 ...")
    parser.add_argument("--label", default="measured", help="the section's heading")
    parser.add_argument("--out", help="a markdown file to append the section to")
    args = parser.parse_args()
    target = [] if args.target == "cpu" else ["--target", args.target]
    target += ["--arch", args.arch] if args.arch else []
    numbers = measure(args.model, os.path.abspath(args.repo), args.mode, target)
    section = table(numbers, args.label, os.path.abspath(args.repo))
    print(section)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write(section + "\n")


if __name__ == "__main__":
    main()
