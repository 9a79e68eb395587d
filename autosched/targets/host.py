"""What this machine has: memory, GPUs, ptxas, and whether an IREE device URI opens here.

Kept out of the targets: a target says what it needs, this module says what is here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autosched import processes
from autosched.errors import UserError

if TYPE_CHECKING:
    from autosched.config import RunConfig

DEVICE_PROBE = """
import sys
import iree.runtime as runtime
try:
    runtime.get_device(sys.argv[1])
except Exception as error:
    print(str(error).splitlines()[0] if str(error) else repr(error))
    sys.exit(3)
"""
PROBE_TIMEOUT = 120.0


def physical_memory() -> int:
    """Bytes of RAM, or 0 when the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def device_problem(uri: str) -> str | None:
    """None when IREE opens the device `uri` here, else why not (one line).

    The probe runs in its own process so that a GPU context is not held by this one for
    the whole run.
    """
    finished = processes.run([sys.executable, "-c", DEVICE_PROBE, uri], PROBE_TIMEOUT)
    if finished.timed_out:
        return f"opening it took over {PROBE_TIMEOUT:g} s"
    if finished.returncode == 0:
        return None
    return processes.describe_failure(finished, "the device probe")


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as nvidia-smi lists it."""

    index: int
    name: str
    compute_capability: str  # "9.0"


@dataclass(frozen=True)
class Machine:
    """What discovery found on this host, handed to a target (which runs no process)."""

    gpus: tuple[Gpu, ...] = ()
    ptxas: str = ""  # the ptxas that assembles CUDA kernels at compile time, or ""
    triton: bool = False  # Triton is installed: custom CUDA kernels can be compiled


def nvidia_gpus() -> tuple[Gpu, ...]:
    """The GPUs nvidia-smi lists here; none without nvidia-smi or a driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        listed = subprocess.run(
            [smi, "--query-gpu=index,name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    if listed.returncode != 0:
        return ()
    gpus = []
    for line in listed.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            gpus.append(Gpu(int(parts[0]), parts[1], parts[2]))
    return tuple(gpus)


PTXAS_OFF = "none"
PTXAS_PLACES = ("/usr/local/cuda/bin/ptxas",)


def find_ptxas(config: RunConfig) -> str:
    """The ptxas that turns each kernel's PTX into machine code at compile time, or "".

    With PTX in the module the driver compiles each candidate when it is loaded, on the
    measuring path (0.03-0.6 s of a check on the H200). ptxas runs in the parallel compiles
    instead (compile.py: iree-compile 3.13 ignores its own ptxas flag). No ptxas: PTX, as
    IREE does by default.
    """
    if config.ptxas == PTXAS_OFF:
        return ""
    if config.ptxas:
        if not (os.path.isfile(config.ptxas) and os.access(config.ptxas, os.X_OK)):
            raise UserError(
                f"{config.source}: [Env] ptxas = {config.ptxas}: not an executable file "
                f"(leave it empty to look for one, or {PTXAS_OFF} to embed PTX)"
            )
        return config.ptxas
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    places = [os.path.join(home, "bin", "ptxas")] if home else []
    found = shutil.which("ptxas")
    return found or next((p for p in [*places, *PTXAS_PLACES] if os.access(p, os.X_OK)), "")


def discover(config: RunConfig) -> Machine:
    """What the configured target needs to know about this host."""
    if config.target != "cuda":
        return Machine()
    return Machine(
        nvidia_gpus(), find_ptxas(config), importlib.util.find_spec("triton") is not None
    )


def measuring_devices(config: RunConfig, default_device: str, machine: Machine) -> list[str]:
    """The device URIs to measure on: `[Env] devices` (a comma list, or `all`), else the
    one device of the run. Devices of different models are refused: their timings would
    not rank candidates on one scale."""
    if not config.devices:
        return [default_device]
    if config.devices == "all":
        if config.target == "cuda":
            if not machine.gpus:
                raise UserError("--devices all: nvidia-smi lists no GPU here")
            return [f"cuda://{gpu.index}" for gpu in machine.gpus]
        return [default_device]
    devices = [d.strip() for d in config.devices.split(",") if d.strip()]
    if not devices:
        raise UserError(
            f"--devices {config.devices!r} names no device: give a comma list of device "
            "URIs (cuda://0,cuda://1, local-task,local-sync), or all"
        )
    repeated = sorted({d for d in devices if devices.count(d) > 1})
    if repeated:
        raise UserError(f"--devices lists {', '.join(repeated)} more than once")
    if config.target == "cuda":
        by_index = {gpu.index: gpu for gpu in machine.gpus}
        models = {}
        for device in devices:
            driver, _, path = device.partition("://")
            if driver != "cuda" or (path and not path.isdigit()):
                raise UserError(
                    f"--devices {device}: give CUDA devices as cuda://N (N from nvidia-smi), or all"
                )
            gpu = by_index.get(int(path or 0))
            if gpu is None:
                raise UserError(
                    f"--devices {device}: no such GPU here (nvidia-smi lists "
                    f"{', '.join(str(g.index) for g in machine.gpus) or 'none'})"
                )
            models[device] = gpu.name
        if len(set(models.values())) > 1:
            listed = "; ".join(f"{d}: {name}" for d, name in models.items())
            raise UserError(
                f"--devices mixes GPU models ({listed}): timings of different models do not "
                "rank candidates on one scale; list devices of one model"
            )
    return devices
