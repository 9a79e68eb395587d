"""One model build with custom kernels, timed whole under IREE's compile and runtime settings
that change what a call costs beside its kernels (issue 24).

On the H200 the Llama-3-8B layer's custom build ran 1.76-1.85 ms a call, 0.2-0.3 ms more
than its kernels; `model_timeline.py` put that time before the first kernel (the host
handing the submission to IREE's queue thread) and after the last (the completion reaching
the waiting caller), not between kernels. This builds the same custom kernels with IREE's
compile settings (command-buffer memoization, indirect bindings, the execution model) and
times each build with each runtime setting (allocator, streams or graphs, inline execution)
as the proof does: iree-benchmark-module, median of 5 and CV.

    python3 benchmarks/runtime_settings.py --model llama3_bf16 --spec results.spec.mlir \
        --custom-spec results.custom.mlir --out DIR

`--model` is a model of `model_campaign.py` (exported here, weights as arguments) or an
.mlir file. The compile and runtime settings are lists of `name=flags` joined by `;`.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

# The model's intermediates in one buffer the caller allocates once and passes to every call
# (IREE's external transients, `samples/external_transients`), not allocated per call.
EXTERNAL_TRANSIENTS = "--iree-torch-externalize-transients"
# Flags that act where the model is imported: the rewrite's first compile takes them too.
INPUT_FLAGS = (EXTERNAL_TRANSIENTS,)
BUILDS = (
    "memoized=;"
    "one-shot=--iree-hal-memoization=false;"
    "direct=--iree-hal-memoization=false --iree-hal-indirect-command-buffers=false;"
    "async-internal=--iree-execution-model=async-internal;"
    f"external-transients={EXTERNAL_TRANSIENTS}"
)
CACHING = "--cuda_async_allocations=false --device_allocator=caching"
SETTINGS = (
    f"caching={CACHING};"
    "defaults=;"
    "caching, async allocations=--device_allocator=caching;"
    f"caching, inline={CACHING} --cuda_allow_inline_execution=true;"
    f"caching, graphs={CACHING} --cuda_use_streams=false"
)


DEFAULT = "iree-default"  # IREE's own build of the model: no custom kernels, no spec


def named(text: str) -> list[tuple[str, list[str]]]:
    """`name=flags;name=flags` as (name, flags) pairs."""
    pairs = []
    for item in filter(None, text.split(";")):
        name, _, flags = item.partition("=")
        pairs.append((name.strip(), flags.split()))
    return pairs


def transient_inputs(vmfb: str, function: str) -> list[str]:
    """The argument a build with external transients takes last (a device buffer of the
    size its reflection gives), or none."""
    from iree.runtime import VmInstance, VmModule

    module = VmModule.mmap(VmInstance(), vmfb)
    reflection = module.lookup_function(f"{function}$async").reflection or {}
    size = reflection.get("iree.abi.transients.size.constant")
    return [f"&{size}xi8"] if size else []


def model_file(name: str, work: str) -> str:
    """`name` itself where it is a file; else model_campaign's model of that name, exported."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    import model_campaign

    model, args, _ = model_campaign.build(name, 1.0, "cuda")
    path = os.path.join(work, f"{name}.mlir")
    model_campaign.export(model, args, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--spec", required=True, help="the run's tuning spec")
    parser.add_argument("--custom-spec", required=True, help="the run's results.custom.mlir")
    parser.add_argument("--out", required=True)
    parser.add_argument("--builds", default=BUILDS, help="compile settings, name=flags;...")
    parser.add_argument("--settings", default=SETTINGS, help="runtime settings, name=flags;...")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--default", action="store_true", help="IREE's default build too")
    options = parser.parse_args()

    from autosched.config import RunConfig
    from autosched.drivers.model_run import model_for_target
    from autosched.measure.benchmark_tool import time_module
    from autosched.measure.module_io import make_inputs, source_entry_function
    from autosched.model.configured import iree_compile, tuning_spec_flags
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    work = os.path.abspath(options.out)
    os.makedirs(work, exist_ok=True)
    target = CudaTarget(RunConfig(target="cuda", arch=options.arch), Machine())
    flags = target.compile_flags()
    model = model_file(options.model, work)
    # sm_90 is set on the model as the run sets it (iree-compile cannot name it): without
    # it IREE's own dispatches are built for its default CUDA target (138 ms for Llama).
    source = model_for_target(model, target, work)
    spec = tuning_spec_flags(options.spec, target.tuning_spec_flag)
    builds = named(options.builds)

    def imported(extra: list[str]) -> tuple[str, ...]:
        return tuple(f for f in extra if f in INPUT_FLAGS)

    # One rewrite of the model for each set of import flags the builds name.
    rewrites = {}
    for index, flagged in enumerate(sorted({imported(extra) for _, extra in builds})):
        out = os.path.join(work, f"custom{index}.mlir")
        rewrites[flagged] = rewrite_model(source, options.custom_spec, [*flags, *flagged], out, 900)

    def compile_build(build: tuple[str, list[str]]) -> str | Exception:
        name, extra = build
        out = os.path.join(work, f"custom.{name}.vmfb")
        try:
            if name == DEFAULT:
                return iree_compile(source, [*flags, *extra], out, 900, model)
            rewritten = rewrites[imported(extra)][0]
            return iree_compile(rewritten, [*flags, *spec, RESUME_FLAG, *extra], out, 900, model)
        except Exception as error:  # noqa: BLE001 - a build that fails is a row that says so
            return error

    if options.default:  # the settings on IREE's default build too (the proof's baseline)
        builds.append((DEFAULT, []))

    with ThreadPoolExecutor(len(builds)) as pool:
        vmfbs = list(pool.map(compile_build, builds))
    entry = source_entry_function(source, flags, None, work, 600, model)
    inputs = make_inputs(entry, os.path.join(work, "inputs"))
    settings = named(options.settings)
    replaced = max(count for _, count in rewrites.values())
    print(f"`{options.model}` with custom kernels ({replaced} ops replaced), {target.describe()}")
    print(f"\n| build (compile flags) | {' | '.join(name for name, _ in settings)} |")
    print("| --- |" + " --- |" * len(settings))
    for (name, extra), vmfb in zip(builds, vmfbs, strict=True):
        if isinstance(vmfb, Exception):
            print(f"| {name} | does not compile: {str(vmfb).splitlines()[0][:80]} |", flush=True)
            continue
        cells, called = [], [*inputs, *transient_inputs(vmfb, entry.name)]
        for _, runtime_flags in settings:
            timing = time_module(
                vmfb, "cuda", called, 1, 5, 0.2, 300, entry.name, tuple(runtime_flags)
            )
            ok = timing.median_ms is not None
            cells.append(f"{timing.median_ms:.3f} ({timing.cv:.1%})" if ok else timing.message[:40])
        print(f"| {name} (`{' '.join(extra) or 'none'}`) | {' | '.join(cells)} |", flush=True)
    print(
        "\nruntime settings: " + "; ".join(f"{n}: `{' '.join(f) or 'none'}`" for n, f in settings)
    )


if __name__ == "__main__":
    main()
