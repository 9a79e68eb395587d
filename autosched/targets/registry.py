"""Every backend by name: the one list the cfg, the command line and `make_target` read.

A module of its own, with no imports, so that `config` can read the names without a cycle
(the targets themselves read `config`).
"""

TARGETS = {
    "cpu": ("autosched.targets.cpu", "CpuTarget"),
    "cuda": ("autosched.targets.cuda", "CudaTarget"),
}
TARGET_NAMES = tuple(TARGETS)
