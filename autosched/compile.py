"""Runs iree-compile on many variants at once, each with its own timeout.

CUDA builds that name a ptxas (`--iree-cuda-use-ptxas-from=`) get their kernels assembled
here: iree-compile 3.13 accepts that flag but still embeds PTX (the same bytes with or
without it), and the driver then compiles each kernel when the module is loaded, 0.03 to
0.6 s per candidate on the H200. So the build dumps its PTX, ptxas assembles each kernel, and
a second build takes the cubins in place of the PTX
(`--iree-hal-substitute-executable-objects-from`); if any step fails, the PTX build stands.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from iree.compiler.tools.binaries import find_tool

from autosched import processes
from autosched.errors import UserError


@dataclass
class CompileJob:
    source: str  # .mlir
    output: str  # .vmfb
    flags: list[str]
    before: list[str] = field(default_factory=list)  # a command that writes `source` first
    built: bool = False  # compiled already by this run (a build problems share): reused
    built_s: float = 0.0  # ... and the seconds that compile took, for the record
    # A candidate's own limit, shorter than the pool's (run/limits.compile_limit): IREE
    # 3.13 compiles some implicit-GEMM points for sm_90 for minutes, or for ever.
    timeout: float | None = None


@dataclass
class CompileResult:
    job: CompileJob
    status: str  # ok, compile_error, timeout
    seconds: float
    message: str = ""


def first_error_line(stderr: str) -> str:
    """The first `error:` line of iree-compile's diagnostics, else its first line."""
    for line in stderr.splitlines():
        if "error:" in line:
            return line.strip()[:300]
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[0][:300] if lines else "iree-compile failed without a message"


# What iree-compile 3.13 prints when a transform library (a CUDA tuning spec) does not load;
# it then exits 0 with IREE's own configurations, as if no spec had been given.
SPEC_NOT_LOADED = "Failed to load transform library module"


def unloaded_spec(stderr: str) -> str:
    """The error line of a tuning spec iree-compile could not load, or "" (it loaded, or
    none was given): such a build is IREE's default, whatever its exit code says."""
    lines = [line.strip() for line in stderr.splitlines()]
    found = [i for i, line in enumerate(lines) if SPEC_NOT_LOADED in line]
    if not found:
        return ""
    why = [line for line in lines[: found[0]] if "error:" in line]  # the spec's own error
    return (why[0] if why else lines[found[0]])[:300]


def compiler_path() -> str:
    return processes.tool_path("iree-compile", find_tool("iree-compile"))


def opt_path() -> str:
    return processes.tool_path("iree-opt", find_tool("iree-opt"))


TEMP_ROOM = 64 * 2**20  # free bytes the compiles' temporaries need at least (objects, .so)
TEMP_VARIABLES = ("TMPDIR", "TMP", "TEMP", "TEMPDIR")  # LLVM's order


def compiler_temp_dir() -> tuple[str, str]:
    """The folder iree-compile writes its temporaries to (the objects iree-lld links) and
    the variable that named it, picked as LLVM picks it: the first of TEMP_VARIABLES that
    is set, else /tmp. Not `tempfile.gettempdir()`: that skips a folder it cannot write,
    which iree-compile would still use."""
    for variable in TEMP_VARIABLES:
        if variable in os.environ:
            return os.environ[variable] or os.getcwd(), variable
    return "/tmp", ""


def check_temp_dir() -> None:
    """One UserError naming the temporary folder when it is unusable or nearly full: every
    compile would fail there with a linker error that hides the cause (a full folder shows
    up as `iree-lld: error: target emulation unknown`), and each candidate would be
    recorded as a compile error. A probe file and one statvfs: cheap, once a run."""
    folder, variable = compiler_temp_dir()
    named = f"{folder} (${variable})" if variable else folder
    advice = (
        "iree-compile writes each build's objects there: free some space, or set TMPDIR "
        "to a folder with room"
    )
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".autosched-probe-") as probe:
            probe.write(bytes(4096))
            probe.flush()
            os.fsync(probe.fileno())
        free = shutil.disk_usage(folder).free
    except OSError as error:
        reason = error.strerror or str(error)
        message = f"the temporary folder {named} cannot be written ({reason}); {advice}"
        raise UserError(message) from None
    if free < TEMP_ROOM:
        raise UserError(
            f"the temporary folder {named} has {free / 2**20:.1f} MiB free, less than the "
            f"{TEMP_ROOM // 2**20} MiB the compiles need; {advice}"
        )


# Compiles run well below normal priority: a pool that fills every core must not keep the
# CPU from the measuring worker, whose timings count the host's time between calls (on the
# H200, with 16 compiles beside it, IREE's default re-timed 45 % slower at 1024^3 f16).
COMPILE_NICENESS = 15


PTXAS_FLAG = "--iree-cuda-use-ptxas-from="
# A build's configured executables go to this flag's folder (model/configured.py reads them).
CONFIGS_FLAG = "--iree-hal-dump-executable-configurations-to"
DUMPED_SUFFIX = "_cuda_nvptx_fb.ptx"  # IREE's dump: {module}_{executable}_{variant}.ptx


def _is_elf(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == b"\x7fELF"


def _ptx_target(path: str) -> str | None:
    """The `.target` directive of a PTX file (sm_90, sm_90a, ...)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            words = line.split()
            if words[:1] == [".target"] and len(words) > 1:
                return words[1].split(",")[0]
    return None


def _assemble(build: list[str], job: CompileJob, timeout: float, folder: str) -> float:
    """Rebuilds `job.output` with the PTX its build dumped under `folder` assembled by
    ptxas; the seconds it took. On any failure the PTX build at `job.output` stands."""
    ptxas = next(f.removeprefix(PTXAS_FLAG) for f in job.flags if f.startswith(PTXAS_FLAG))
    cubins = os.path.join(folder, "cubin")
    seconds = 0.0
    try:
        dumped = sorted(glob.glob(os.path.join(folder, "ptx", "*" + DUMPED_SUFFIX)))
        # A custom kernel's executable holds a cubin already (its dump is an ELF file).
        ptx_files = [path for path in dumped if not _is_elf(path)]
        if not ptx_files:
            return seconds
        os.makedirs(cubins, exist_ok=True)
        for ptx in ptx_files:
            # module_<executable>_cuda_nvptx_fb.ptx: the substitution finds <executable>.cubin
            name = os.path.basename(ptx).removeprefix("module_").removesuffix(DUMPED_SUFFIX)
            arch = _ptx_target(ptx)
            if arch is None:
                return seconds
            out = os.path.join(cubins, name + ".cubin")
            made = processes.run(
                [ptxas, f"-arch={arch}", ptx, "-o", out], timeout, niceness=COMPILE_NICENESS
            )
            seconds += made.seconds
            if made.returncode != 0:
                return seconds
        staged = job.output + ".cubin.vmfb"
        substitute = f"--iree-hal-substitute-executable-objects-from={cubins}"
        rebuilt = processes.run(
            [*build, substitute, "-o", staged], timeout, niceness=COMPILE_NICENESS
        )
        seconds += rebuilt.seconds
        substituted = rebuilt.stderr.count("substituted with object file")
        if rebuilt.returncode == 0 and substituted == len(ptx_files):
            os.replace(staged, job.output)
        elif os.path.exists(staged):
            os.remove(staged)
        return seconds
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _empty_config_dumps(flags: list[str]) -> None:
    """Empties the folder a build dumps its configured executables to, just before the
    build, so that what is read back is this build's. (Emptied when the job was written
    instead, a build compiled ahead lost its dumps when its job was written again.)"""
    for flag in flags:
        if flag.startswith(CONFIGS_FLAG + "="):
            shutil.rmtree(flag.split("=", 1)[1], ignore_errors=True)


def compile_one(job: CompileJob, timeout: float) -> CompileResult:
    """iree-compile on one variant (after the command that writes it, if it has one)."""
    if job.built and os.path.exists(job.output):
        return CompileResult(job, "ok", job.built_s)
    if job.timeout is not None and job.timeout < timeout:
        timeout = job.timeout
    os.makedirs(os.path.dirname(job.output) or ".", exist_ok=True)
    _empty_config_dumps(job.flags)
    seconds = 0.0
    if job.before:
        made = processes.run(job.before, timeout, niceness=COMPILE_NICENESS)
        seconds = made.seconds
        if made.timed_out:
            return CompileResult(job, "timeout", seconds, f"writing the module: over {timeout:g} s")
        if made.returncode != 0:
            why = processes.describe_failure(made, "writing the module")
            return CompileResult(job, "compile_error", seconds, why)
    build = [compiler_path(), job.source, *job.flags]
    assemble = any(flag.startswith(PTXAS_FLAG) for flag in job.flags)
    folder = job.output + ".kernels"  # the build's PTX, and ptxas's cubins
    if assemble:
        shutil.rmtree(folder, ignore_errors=True)
    dump = [f"--iree-hal-dump-executable-binaries-to={os.path.join(folder, 'ptx')}"]
    command = [*build, *(dump if assemble else []), "-o", job.output]
    finished = processes.run(command, timeout, niceness=COMPILE_NICENESS)
    finished.seconds += seconds
    if assemble and (finished.timed_out or finished.returncode != 0):
        shutil.rmtree(folder, ignore_errors=True)
    if finished.timed_out:
        return CompileResult(job, "timeout", finished.seconds, f"over {timeout:g} s")
    if finished.returncode != 0:
        if finished.returncode < 0:
            message = processes.describe_failure(finished, "iree-compile")
        else:
            message = first_error_line(finished.stderr)
        return CompileResult(job, "compile_error", finished.seconds, message)
    unloaded = unloaded_spec(finished.stderr)
    if unloaded:
        return CompileResult(job, "compile_error", finished.seconds, f"spec not loaded: {unloaded}")
    if assemble:
        finished.seconds += _assemble(build, job, timeout, folder)
    return CompileResult(job, "ok", finished.seconds)


def compile_all(
    jobs: list[CompileJob],
    timeout: float,
    workers: int,
    on_done: Callable[[CompileResult], None] | None = None,
) -> Iterator[CompileResult]:
    """Yields results as they finish; a failure is a result, never an exception.

    When the caller stops early (an interrupt), compiles not yet started are cancelled and
    running ones are killed by `processes.stop_all`, so leaving the pool does not wait.
    """
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = [pool.submit(compile_one, job, timeout) for job in jobs]
        for future in as_completed(futures):
            result = future.result()
            if result.status == "compile_error":
                # A folder that filled up mid-run fails every build from then on: that is
                # the run's end (one Error: line), not a failure of this candidate's.
                check_temp_dir()
            if on_done:
                on_done(result)
            yield result
    finally:
        pool.shutdown(wait=not processes.stopping(), cancel_futures=True)
