"""`autosched compile MODEL -o model.vmfb`: the tuned module, built as the whole-model proof
builds it (the spec, and the custom kernels in place of their contractions), and the
commands the tool prints for the same builds, each path quoted so they work as pasted.

A run leaves its spec and custom-kernel spec in the model's work folder; without `--spec`
and `--custom`, those are the ones built (and IREE's default build where the run wrote
neither).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shlex
import shutil
from dataclasses import dataclass

import click
import iree.runtime as runtime
import numpy as np

from autosched.config import RunConfig
from autosched.drivers.model_stages.prepare import laid_out, model_for_target, typed_flags
from autosched.drivers.proof import custom_build
from autosched.errors import UserError
from autosched.measure.module_io import (
    RunFailed,
    argument_names,
    compare_outputs,
    entry_function,
    load_inputs,
    non_finite,
    run_outputs,
)
from autosched.model.configured import compile_model, tuning_spec_flags
from autosched.model.fixed_lengths import model_at_input_sizes
from autosched.model.lowering import prepare_model
from autosched.model.model_build import build_cache, model_build
from autosched.outputs.commands import TUNED_VMFB
from autosched.outputs.paths import RunPaths
from autosched.rewrite.spec import check_custom_spec
from autosched.targets import make_target


@dataclass
class CompiledModel:
    """What `compile_tuned` built: the module, and what went into it."""

    vmfb: str
    spec: str | None  # the tuning spec applied (None: IREE's configurations)
    custom: str | None  # the custom-kernel spec applied
    replaced: int = 0  # contractions that run a custom kernel

    def describe(self) -> str:
        parts = [f"the spec {self.spec}" if self.spec else "IREE's default configurations"]
        if self.custom:
            parts.append(f"{self.replaced} custom kernel(s) of {self.custom}")
        return f"wrote {self.vmfb}: the model with {' and '.join(parts)}"


def run_files(config: RunConfig, spec: str | None, custom: str | None) -> tuple[str | None, ...]:
    """The spec and custom-kernel spec to build with: the given ones (each must exist),
    else those the model's run left in its work folder, where it wrote them."""
    paths = RunPaths.of(config)
    chosen = []
    for given, left, what in (
        (spec, paths.spec, "tuning spec"),
        (custom, paths.custom_spec, "custom-kernel spec"),
    ):
        if given and not os.path.isfile(given):
            raise UserError(f"{given}: no such {what}")
        chosen.append(given or (left if os.path.isfile(left) else None))
    return tuple(chosen)


def run_build_flags(config: RunConfig, build: str) -> list[str]:
    """The compile flags the model's run chose for its `build` (custom or tuned: its
    summary's `build_flags`, such as IREE's aggressive fusion, where they were chosen for
    that build); none without a run's summary."""
    path = RunPaths.of(config).summary
    try:
        with open(path) as handle:
            proof = json.load(handle).get("model") or {}
    except (OSError, ValueError):
        return []
    if proof.get("build_flags_of") != build:
        return []
    return shlex.split(proof.get("build_flags") or "")


def compile_tuned(config: RunConfig, spec: str | None, custom: str | None, out: str):
    """Builds `config.input_file` for the target with the spec and custom kernels into `out`
    (a CompiledModel): the model as the run tuned it (its target attributes, its types'
    flags, its layout), compiled as the proof compiles its tuned build, with the compile
    flags the run's proof chose for it (`run_build_flags`)."""
    target = make_target(config)
    if custom:
        check_custom_spec(custom)
    work = os.path.join(config.work_dir, "compile", str(os.getpid()))
    try:
        sized = model_at_input_sizes(config.input_file, config.inputs, target.compile_flags(), work)
        model_path = model_for_target(sized, target, work)
        flags, _, _ = typed_flags(target, model_path, work)
        layout, _ = laid_out(config, target, model_path, flags, work)
        source = layout.source
        if not custom and not spec:  # IREE's default: the build the layout's analysis made
            built = model_build(source, flags, build_cache(work), config.compile_timeout)
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            shutil.copyfile(built.vmfb, out)
            return CompiledModel(out, None, None)
        chosen = run_build_flags(config, "custom" if custom else "tuned")
        if not custom:
            compile_model(source, [*flags, *chosen], spec, out_path=out,
                          spec_flag=target.tuning_spec_flag,
                          timeout=config.compile_timeout)  # fmt: skip
            return CompiledModel(out, spec, None)
        spec_flags = [*tuning_spec_flags(spec, target.tuning_spec_flag), *chosen]
        prepared = prepare_model(source, work)
        build, replaced = custom_build(prepared, custom, flags, spec_flags, work,
                                       config.compile_timeout)  # fmt: skip
        if not build.runs and not replaced:
            raise UserError(f"{custom}: {build.message}")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        shutil.copyfile(build.vmfb, out)
        return CompiledModel(out, spec, custom, replaced)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):  # another compile's folder may be beside it
            os.rmdir(os.path.dirname(work))


def compile_command(config: RunConfig, spec: str | None, custom: str | None, out: str | None):
    """`autosched compile`: the files chosen, the module written, one line saying what."""
    spec, custom = run_files(config, spec, custom)
    out = out or os.path.join(config.work_dir, TUNED_VMFB)
    compiled = compile_tuned(config, spec, custom, out)
    click.echo(compiled.describe())
    if config.inputs:
        matches, line = outputs_on_inputs(config, compiled.vmfb)
        click.echo(line)
        if not matches:
            raise SystemExit(1)
    return compiled


def outputs_on_inputs(config: RunConfig, vmfb: str) -> tuple[bool, str]:
    """(not differing, the line saying so): the module's outputs against IREE's default
    build's on the user's inputs (`config.inputs`), as the proof compares them."""
    target = make_target(config)
    work = os.path.join(config.work_dir, "compile", f"{os.getpid()}-check")
    try:
        default = compile_tuned(config, None, None, os.path.join(work, "default.vmfb")).vmfb
        sized = model_at_input_sizes(config.input_file, config.inputs, target.compile_flags(), work)
        model_path = model_for_target(sized, target, work)
        flags, _, _ = typed_flags(target, model_path, work)
        entry = entry_function(model_path, flags, timeout=config.compile_timeout)
        names = argument_names(config.input_file)
        inputs = load_inputs(config.inputs, entry, os.path.join(work, "inputs"), names)
        try:
            outputs = [
                run_outputs(
                    module,
                    target.device,
                    entry,
                    inputs,
                    os.path.join(work, name),
                    config.run_timeout,
                )  # fmt: skip
                for module, name in ((default, "default"), (vmfb, "tuned"))
            ]
        except RunFailed as error:
            raise UserError(
                f"{config.input_file}: running it on {config.inputs}: {error}"
            ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    unusable = non_finite(outputs[0], entry, config.inputs)
    if unusable:
        return True, f"outputs could not be compared: {unusable}"
    match, error, why = compare_outputs(outputs[1], outputs[0], entry)
    if match:
        return (
            True,
            f"outputs match IREE's default build's on {config.inputs} (max error {error:.2g})",
        )
    return False, f"OUTPUTS DIFFER from IREE's default build's on {config.inputs}: {why}"


class LoadedModule:
    """A compiled module on its device, called with numpy arrays (iree.runtime)."""

    def __init__(self, vmfb: str, device: str, function: str | None = None):
        config = runtime.Config(device=runtime.get_device(device))
        with open(vmfb, "rb") as handle:
            module = runtime.VmModule.copy_buffer(config.vm_instance, handle.read())
        context = runtime.SystemContext(config=config)
        context.add_vm_module(module)
        names = [n for n in module.function_names if not n.startswith("__") and "$" not in n]
        if function is None and not names:
            raise UserError(f"{vmfb}: the module exports no function")
        self.name = function or names[0]
        self.config, self.functions = config, context.modules[module.name]
        self.function = self.functions[self.name]

    def sibling(self, function: str) -> LoadedModule:
        """Another function of the same loaded module, on the same device (an array one
        writes in place is the array the other reads)."""
        other = copy.copy(self)
        other.name, other.function = function, self.functions[function]
        return other

    def on_device(self, array: np.ndarray):
        """`array` copied to this module's device once, for calls that write it in place."""
        return runtime.asdevicearray(self.config.device, array)

    def __call__(self, *arrays) -> list[np.ndarray]:
        result = self.function(*arrays)
        results = result if isinstance(result, (list, tuple)) else [result]
        return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
