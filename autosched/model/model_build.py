"""One iree-compile of a whole model that writes everything a run reads of it, kept for the
rest of the run (and the next run in the same folder).

A model run used to compile the same model to the same phases several times: to `flow` for
its dispatches (twice), to `executable-configurations` for the form IREE configures
(twice: again as the spec check's baseline), to a module for the dispatch benchmarks (its
output thrown away), and again to a module for the proof's baseline. One full compile gives
all of them: `--dump-compilation-phases-to` writes the module at the end of every phase
(`flow` and `executable-configurations` among them, printed elided and with the model's
locations, as the separate compiles printed them), `--iree-hal-dump-executable-benchmarks-to`
writes the dispatch benchmarks (printed in full whatever the elision flags say), and `-o`
writes IREE's default module. None of these flags changes the module's bytes (a plain
`iree-compile` writes the same file; tests/test_model_build.py checks it), so the proof's
baseline is still IREE's default build.

Builds are kept under a cache folder, one folder per (source bytes, flags, compiler), and
a folder counts only once its build finished (`DONE` is written last).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass

from iree.compiler import ir

from autosched import processes
from autosched.compile import compiler_path, unloaded_spec
from autosched.errors import UserError
from autosched.model.configured import in_configured_form, iree_compile
from autosched.model.lowering import ModelAnalysis, find_contractions, prepare_model
from autosched.outputs.spec_flags import SPEC_SAFE_FLAGS

BUILD_TIMEOUT = 1800.0  # one full compile of the model
PHASES_FLAG = "--dump-compilation-phases-to"
BENCHMARKS_FLAG = "--iree-hal-dump-executable-benchmarks-to"
# How the phases are printed: weights elided (the phases are read, never compiled on) and
# every op with the model's location (a root is named by its line in the user's model).
PRINT_FLAGS = (
    "--mlir-elide-elementsattrs-if-larger=64",
    "--mlir-elide-resource-strings-if-larger=64",
    "--mlir-print-debuginfo",
)
DONE = "DONE"
SECONDS = "seconds"  # DONE's second line: how long the build took
# A spec's whole-model build on every thread stops after this many times the model's build
# without the spec, at least HANG_FLOOR seconds (then one thread: `threaded_first`).
HANG_FACTOR, HANG_FLOOR = 4.0, 30.0
FLOW, CONFIGURED = "flow", "executable-configurations"  # the phases a run reads


def build_cache(work: str) -> str:
    """The cache folder of the builds of a run (or an apply, a compile) working in `work`."""
    return os.path.join(work, "builds")


@dataclass(frozen=True)
class ModelBuild:
    """The files one full compile of a model wrote (`model_build`)."""

    folder: str
    source: str  # the file iree-compile read (the model, or its import / rewrite)

    @property
    def vmfb(self) -> str:
        """IREE's default module of the model."""
        return os.path.join(self.folder, "model.vmfb")

    @property
    def benchmarks(self) -> str:
        """The folder of IREE's dispatch benchmarks, as IREE wrote them (with their
        configurations: dispatch_benchmarks.strip_benchmarks strips them)."""
        return os.path.join(self.folder, "benchmarks")

    @property
    def phases(self) -> str:
        return os.path.join(self.folder, "phases")

    def phase(self, name: str) -> str:
        """The module at the end of phase `name` (`flow`, `executable-configurations`,
        ...): IREE names it `<module>.<index>.<phase>.mlir`."""
        for entry in sorted(os.listdir(self.phases)):
            parts = entry.split(".")
            if len(parts) >= 4 and parts[-1] == "mlir" and ".".join(parts[2:-1]) == name:
                return os.path.join(self.phases, entry)
        raise UserError(f"{self.source}: iree-compile wrote no `{name}` phase to {self.phases}")

    def parse(self, name: str, context: ir.Context | None = None) -> ir.Module:
        """The module at the end of phase `name`, read with the bindings."""
        path = self.phase(name)
        try:
            return ir.Module.parseFile(path, context or ir.Context())
        except ir.MLIRError as error:
            message = str(error).splitlines()[0]
            raise UserError(f"{self.source}: the {name} phase does not parse: {message}") from None


def _digest_file(digest, path: str) -> None:
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def build_key(source: str, flags: Sequence[str]) -> str:
    """What decides a build: the source's bytes, the flags and the bytes of every file a
    flag names (a tuning spec is rewritten in place between proofs), and which
    iree-compile."""
    digest = hashlib.sha256()
    _digest_file(digest, source)
    for flag in flags:
        value = flag.partition("=")[2]
        if value and os.path.isfile(value):
            _digest_file(digest, value)
    tool = compiler_path()
    stat = os.stat(tool) if os.path.exists(tool) else None
    identity = (tool, stat.st_size, stat.st_mtime_ns) if stat else (tool,)
    digest.update(repr((tuple(flags), identity)).encode())
    return digest.hexdigest()[:20]


def cached_build(source: str, flags: Sequence[str], cache: str) -> ModelBuild | None:
    """The finished build of the prepared `source` with `flags` under `cache`, or None."""
    folder = os.path.join(cache, build_key(source, flags))
    if os.path.isfile(os.path.join(folder, DONE)):
        return ModelBuild(folder, source)
    return None


def model_build(
    model_path: str,
    flags: Sequence[str],
    cache: str,
    timeout: float = BUILD_TIMEOUT,
    named: str = "",
) -> ModelBuild:
    """The model at `model_path` compiled once with `flags` (see the module docstring),
    reused when `cache` holds that build already. Errors are one-line UserErrors naming
    `named` (by default `model_path`)."""
    named = named or model_path
    source = prepare_model(model_path, os.path.join(cache, "sources"))
    found = cached_build(source, flags, cache)
    if found is not None:
        return found
    build = ModelBuild(os.path.join(cache, build_key(source, flags)), source)
    shutil.rmtree(build.folder, ignore_errors=True)
    os.makedirs(build.folder)
    command = [
        compiler_path(),
        source,
        *flags,
        f"{BENCHMARKS_FLAG}={build.benchmarks}",
        f"{PHASES_FLAG}={build.phases}",
        *PRINT_FLAGS,
        "-o",
        build.vmfb,
    ]
    started = time.perf_counter()
    ran = threaded_first(command, known_seconds(source, cache))
    finished, command = ran or (processes.run(command, timeout), command)
    if finished.timed_out:
        raise UserError(f"{named}: iree-compile took over {timeout:g} s")
    if finished.returncode != 0:
        reason = processes.describe_failure(finished, "iree-compile").replace(source, named)
        raise UserError(f"{named}: iree-compile failed: {reason}")
    unloaded = unloaded_spec(finished.stderr)
    if unloaded:
        raise UserError(f"{named}: iree-compile could not load the tuning spec: {unloaded}")
    with open(os.path.join(build.folder, DONE), "w", encoding="utf-8") as handle:
        handle.write(" ".join(command) + f"\n{SECONDS} {time.perf_counter() - started:.3f}\n")
    return build


def compiled_once(source: str, flags: Sequence[str], cache: str, timeout: float, named: str) -> str:
    """The module of `source` built with `flags`, compiled once under `cache` (a plain
    build, no dumps: the model with custom kernels that each bucket's proof runs)."""
    folder = os.path.join(cache, "modules", build_key(source, flags))
    vmfb = os.path.join(folder, "model.vmfb")
    if not os.path.isfile(vmfb):
        partial = iree_compile(source, flags, vmfb + ".partial", timeout, named)
        os.replace(partial, vmfb)  # whole, or not there
    return vmfb


def threaded_first(
    command: list[str], seconds: float | None
) -> tuple[processes.Finished, list[str]] | None:
    """A spec's whole-model build compiled on every thread, stopped at HANG_FACTOR times
    the model's build without the spec (`seconds`, at least HANG_FLOOR): iree-compile 3.13
    with a spec hangs in about 1 compile in 200 on several threads (spec_flags.py), and one
    thread took resnet18 8.1 s against 6.1 s on two cores (more cores, more to gain). None
    where the command is no spec build, no build of the model is known to time it by, or
    the threaded compile hung or failed: the caller compiles on one thread, as before.
    Else the compile's result and the command that made it."""
    if seconds is None or not set(SPEC_SAFE_FLAGS) <= set(command):
        return None
    threaded = [part for part in command if part not in SPEC_SAFE_FLAGS]
    finished = processes.run(threaded, max(HANG_FLOOR, HANG_FACTOR * seconds))
    ok = not finished.timed_out and finished.returncode == 0
    return (finished, threaded) if ok else None


def known_seconds(source: str, cache: str) -> float | None:
    """The fastest finished build of `source` under `cache` (its DONE file's seconds)."""
    found = []
    for folder in os.listdir(cache) if os.path.isdir(cache) else []:
        try:
            with open(os.path.join(cache, folder, DONE), encoding="utf-8") as handle:
                command, _, timed = handle.read().partition(f"\n{SECONDS} ")
        except OSError:
            continue
        if timed and command.split(" ")[1:2] == [source]:
            found.append(float(timed.split()[0]))
    return min(found, default=None)


def analyze_build(build: ModelBuild, flags: Sequence[str]) -> ModelAnalysis:
    """lowering.analyze_model on a build's `flow` phase, with each root in the form IREE
    configures it (configured.in_configured_form, from its `executable-configurations`
    phase)."""
    analysis = find_contractions(build.parse(FLOW))
    return in_configured_form(analysis, build.source, flags, build.phase(CONFIGURED))


def linked(build_file: str, out: str) -> str:
    """`build_file` (a cached build's module) also at `out`, where the caller keeps its
    files: a hard link where the file system allows one, else a copy; returns `out`."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if os.path.lexists(out):
        os.remove(out)
    try:
        os.link(build_file, out)
    except OSError:
        shutil.copyfile(build_file, out)
    return out
