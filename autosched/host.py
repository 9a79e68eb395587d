"""What this machine has: memory, and whether an IREE device URI opens here.

Kept out of the targets: a target says what it needs, this module says what is here.
"""

from __future__ import annotations

import os
import sys

from autosched import processes

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
