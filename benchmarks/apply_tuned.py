"""Checks that a tuned result speeds up the whole model, in both forms a run leaves.

After `autosched run MODEL.mlir`, this compiles MODEL three ways with iree-compile and times
every function with iree-benchmark-module on the same device:
the default (IREE's own choices), `*.best.mlir` (the winners attached to the ops), and
MODEL with `*.spec.mlir` passed as a tuning spec. Both tuned builds should match, and both
should beat the default by about the speedup the run reported.

    python benchmarks/apply_tuned.py MODEL.mlir --config auto-scheduler.cfg [--target cuda]
"""

from __future__ import annotations

import argparse
import os
import sys

from iree.compiler import ir


def function_inputs(path: str) -> dict[str, list[str]]:
    """Each public function's argument types, as iree-benchmark-module inputs (zero-filled)."""
    from autosched.ops.matmul import parse_module

    context = ir.Context()
    module = parse_module(path, context)
    functions = {}
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        kind = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        name = ir.StringAttr(op.attributes["sym_name"]).value
        functions[name] = [str(t).removeprefix("tensor<").removesuffix(">") for t in kind.inputs]
    return functions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the MLIR module that was tuned")
    parser.add_argument("--config", default="auto-scheduler.cfg")
    parser.add_argument("--target", default=None)
    parser.add_argument("--arch", default=None)
    parser.add_argument("--results", default=None, help="the run's CSV (default: the cfg's)")
    parser.add_argument("--repeat", type=int, default=20, help="dispatches per timed call")
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--out", default=None, help="markdown file to write the table to")
    args = parser.parse_args()

    from autosched.compile import CompileJob, compile_one
    from autosched.config import load_config, with_overrides
    from autosched.measure.benchmark_tool import time_module
    from autosched.ops.matmul_kernel import tuned_input_module, write_text
    from autosched.targets import make_target

    config = with_overrides(load_config(args.config), target=args.target, arch=args.arch)
    target = make_target(config)
    stem = os.path.splitext(args.results or config.output_file)[0]
    best, spec = stem + ".best.mlir", stem + ".spec.mlir"
    if not os.path.isfile(best):
        sys.exit(f"{best}: no such file; run `autosched run {args.model}` first")
    work = os.path.join(config.work_dir, "apply_tuned")
    # The default build gets the same target attribute the tuned module carries (sm_90).
    default = write_text(os.path.join(work, "default.mlir"), tuned_input_module(args.model, []))
    flags = [*target.compile_flags(), f"--iree-hal-benchmark-dispatch-repeat-count={args.repeat}"]
    builds = {"IREE default": (default, flags), "*.best.mlir": (best, flags)}
    if os.path.isfile(spec):
        builds["default + *.spec.mlir"] = (default, [*flags, *target.spec_flags(spec)])

    functions = function_inputs(args.model)
    rows: dict[str, dict[str, float | str]] = {name: {} for name in functions}
    for label, (source, build_flags) in builds.items():
        vmfb = os.path.join(
            work, label.replace(" ", "_").replace("*", "").replace("+", "") + ".vmfb"
        )
        compiled = compile_one(CompileJob(source, vmfb, build_flags), config.compile_timeout)
        if compiled.status != "ok":
            sys.exit(f"{label}: {compiled.status}: {compiled.message}")
        for name, inputs in functions.items():
            timing = time_module(
                vmfb,
                target.device,
                inputs,
                args.repeat,
                args.repetitions,
                0.05,
                300,
                function=name,
            )
            rows[name][label] = timing.median_ms if timing.status == "ok" else timing.status

    lines = [
        f"Applying the tuned result of `{args.model}` on {target.describe()} "
        f"(ms per call of each function, median of {args.repetitions}; each dispatch is "
        f"repeated {args.repeat} times per call and the time divided by {args.repeat})",
        "",
        "| function | " + " | ".join(builds) + " | speedup (best.mlir) | speedup (spec) |",
        "| --- | " + " | ".join("---" for _ in builds) + " | --- | --- |",
    ]
    for name, times in rows.items():
        base = times.get("IREE default")

        def ratio(label: str, base=base, times=times) -> str:
            value = times.get(label)
            if isinstance(base, float) and isinstance(value, float):
                return f"{base / value:.2f}x"
            return "-"

        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in times.values()]
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {ratio('*.best.mlir')} | {ratio('default + *.spec.mlir')} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_text(args.out, text)


if __name__ == "__main__":
    main()
