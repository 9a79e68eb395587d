"""Whether a built module carries the configuration it was built for.

A successful compile proves nothing about a spec: one whose matcher misses the root op IREE
configures leaves IREE's default in place and says nothing. On CUDA that happened to every
unit-batch matmul of a transformers model (issue 22): IREE's dumped dispatch benchmark,
compiled again from the input phase, ran dispatch creation a second time, the root became a
5-loop generic, and the 4-loop matcher matched nothing, so every candidate timed IREE's
default. So every build dumps the configurations IREE chose
(`--iree-hal-dump-executable-configurations-to`, written after strategy selection), and they
are read back with the bindings: the configured root's form, and whether it carries the
candidate's `compilation_info`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from iree.compiler import ir

from autosched.apply import DispatchConfig, read_dispatch_configs

CONFIGS_FLAG = "--iree-hal-dump-executable-configurations-to"


def configs_folder(output: str) -> str:
    """Where the build of `output` writes its configured executables."""
    return output + ".configs"


def dump_flag(output: str) -> str:
    """The flag that makes the build of `output` write its configured executables; the
    folder is emptied first, so that what is read back is this build's."""
    folder = configs_folder(output)
    shutil.rmtree(folder, ignore_errors=True)
    return f"{CONFIGS_FLAG}={folder}"


def roots_in(path: str) -> list[DispatchConfig]:
    """The contraction roots of a module at `executable-configurations` (or of one dumped
    configured executable), read with the bindings."""
    return read_dispatch_configs(ir.Module.parseFile(path, ir.Context()))


def configured_roots(folder: str) -> list[DispatchConfig]:
    """The contraction roots of every executable a build configured, as IREE configured them."""
    if not os.path.isdir(folder):
        return []
    return [root for name in sorted(os.listdir(folder)) for root in roots_in(f"{folder}/{name}")]


def form_of(root: DispatchConfig) -> str:
    """The root op's form as IREE configured it: op, loop roles and sizes, maps."""
    return f"{root.op_name} {root.contraction} {root.indexing_maps}"


@dataclass(frozen=True)
class Applied:
    """What a build's configured roots say about the configuration it was built for."""

    ok: bool  # every root carries it (or nothing was expected)
    form: str  # the configured root's form ("" without a contraction root, e.g. custom)
    message: str = ""


def check_build(output: str, expected: str | None) -> Applied:
    """Whether the build of `output` carries `expected` (compilation_info text; None for
    IREE's default, whose form alone is read)."""
    return check_roots(configured_roots(configs_folder(output)), expected)


def check_roots(roots: list[DispatchConfig], expected: str | None) -> Applied:
    """Whether every configured root carries `expected` (None: nothing is expected)."""
    form = form_of(roots[0]) if roots else ""
    if expected is None:
        return Applied(True, form)
    if not roots:
        return Applied(False, form, "the build has no configured contraction root")
    missed = [root for root in roots if not root.carries(expected)]
    if not missed:
        return Applied(True, form)
    got = missed[0].lowering_config or missed[0].compilation_info or "no configuration"
    return Applied(
        False,
        form,
        f"the configured root ({form_of(missed[0])}) carries {got}, not the candidate's",
    )
