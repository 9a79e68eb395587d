"""Which winners reached the built model, and why the others did not (issue 51).

A custom winner is placed where the rewritten model runs its kernel: each kernel a winner's
arms call is compiled to `{folder}/{winner's problem name}[.form].cubin` and embedded by that
path in its `hal.dispatch.extern`, so the externs of the rewritten model say, winner by
winner, how many of its ops were replaced. A winner with none was silently left out before
this module: the ViT-B/16 of issue 51 searched its flash kernel to 520x on the op and the
build replaced 50 ops, none of them an attention. The run names each such winner, and why,
on the console and in the summary's `not_placed`.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass

from iree.compiler import ir

from autosched.ir_walk import walk_ops

EXTERN = "hal.dispatch.extern"
CUSTOM_ROUTE = "custom kernel"  # the summary's routes (drivers/custom_route.route_of)
IREE_ROUTE = "IREE configuration"


@dataclass(frozen=True)
class NotPlaced:
    """A problem whose winner is not in the built model: the summary's `not_placed` row."""

    problem: str  # the campaign's problem name
    route: str  # CUSTOM_ROUTE or IREE_ROUTE
    reason: str

    def line(self) -> str:
        return f"NOT PLACED: {self.problem}'s {self.route} winner: {self.reason}"

    def row(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CustomWinner:
    """A custom winner written into the substitution spec."""

    problem: str  # the campaign's problem name
    kernel: str  # the name of the problem its kernels were built for (its cubins' stem)
    kind: str  # the root-op kind it replaces


def placed_kernels(path: str) -> Counter:
    """Kernel name (a winner's problem name) -> the externs of the module at `path` that
    run one of its kernels."""
    module = ir.Module.parseFile(path, ir.Context())
    placed: Counter = Counter()
    for op in walk_ops(module.operation):
        if op.name == EXTERN:
            placed.update(set(_kernel_names(op)))
    return placed


def _kernel_names(op: ir.Operation) -> list[str]:
    """The winners whose binaries an extern embeds: each object path's stem."""
    return [
        _file_stem(path).split(".", 1)[0]
        for objects in op.attributes["target_objects"]
        for path in _object_paths(objects)
    ]


def extern_kernels(module: ir.Module) -> dict[str, str]:
    """Executable -> the kernel file its custom dispatch embeds, as `{winner}.{form}` (or
    `{winner}`), in a model lowered to flow, where each `hal.dispatch.extern` is an
    executable of its own (`extern_dispatch_3`, as its dispatch benchmark is named)."""
    found = {}
    for op in walk_ops(module.operation):
        if op.name == "hal.executable.variant" and "objects" in op.attributes:
            paths = _object_paths(op.attributes["objects"])
            name = ir.StringAttr(op.parent.attributes["sym_name"]).value
            if paths:
                found[name] = _file_stem(paths[0])
    return found


def _object_paths(objects) -> list[str]:
    """The paths of an object list's `#hal.executable.object<{path = "...", ...}>`s."""
    found = []
    for embedded in objects:
        text = str(embedded)
        if 'path = "' in text:
            found.append(text.split('path = "', 1)[1].split('"', 1)[0])
    return found


def _file_stem(path: str) -> str:
    """`/x/matmul_8x8x8_f16_f16_f32.epilogue0.cubin` -> `matmul_8x8x8_f16_f16_f32.epilogue0`."""
    return os.path.basename(path).rsplit(".", 1)[0]


def check_placed(winners: list[CustomWinner], placed: Counter) -> list[NotPlaced]:
    """The custom winners of which no op of the built model runs a kernel (empty when all
    are placed): what the run reports and a test asserts empty."""
    missing = []
    for winner in winners:
        if placed.get(winner.kernel, 0) == 0:
            why = f"no {winner.kind} op of the model matched its kernel ({winner.kernel})"
            missing.append(NotPlaced(winner.problem, CUSTOM_ROUTE, why))
    return missing


def replaced_by_kind(winners: list[CustomWinner], placed: Counter) -> dict[str, int]:
    """Root-op kind -> ops of the built model its custom winners replaced."""
    counts: dict[str, int] = {}
    for winner in winners:
        counts[winner.kind] = counts.get(winner.kind, 0) + placed.get(winner.kernel, 0)
    return counts


def replaced_line(counts: dict[str, int]) -> str:
    """`custom kernels: 2 attention, 6 matmul replaced`."""
    parts = [f"{count} {kind}" for kind, count in sorted(counts.items())]
    return f"custom kernels: {', '.join(parts) or 'none'} replaced"
