"""The `hal.dispatch.extern` every family's kernel runs as, and the module around it.

A family's `extern_function` names its operands' tensor types and launch grid; this writes
the function that allocates the output, binds the operands (indirectly, so that IREE records
the command buffer once), embeds the cubin and launches it. Facts the text relies on
(../shared/probes/README.md, measured on the H200): launch settings go in the extern op's
properties; dynamic shared memory beyond 48 KB is granted through `workgroup_local_memory`;
bindings are the kernel's pointer parameters in operand order, the output after the inputs;
Triton's hidden scratch pointers are extra small operands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autosched.kernels.base import KernelBinary, KernelDoesNotFit


def object_attribute(binary: KernelBinary) -> str:
    """The kernel's cubin as IREE embeds it: its bytes in the attribute itself (`data`), so
    that a custom spec or module builds wherever it is copied; `path` names where it was
    built (IREE reads the bytes, not the file)."""
    with open(binary.cubin_path, "rb") as handle:
        data = handle.read()
    return (
        f'#hal.executable.object<{{path = "{binary.cubin_path}", '
        f'data = dense<"0x{data.hex().upper()}"> : vector<{len(data)}xi8>}}>'
    )


@dataclass(frozen=True)
class DynamicRows:
    """A launch for any count of rows: input `operand`'s dimension `dim` holds it (a `?` in
    every tensor type of the call is that count), each workgroup takes `block` rows and
    `across` workgroups share a block of rows; the kernel takes the count as a 32-bit value
    after its pointers, which IREE passes as a push constant after every binding."""

    operand: int
    dim: int
    block: int
    across: int = 1
    y: int = 1  # workgroups along y (an attention's batch entries)

    def count_region(self) -> list[str]:
        """The workgroup count of `rows` rows: x = ceil(rows / block) * across, then y."""
        grid = f"affine_map<()[s0] -> ((s0 ceildiv {self.block}) * {self.across})>"
        return [
            "      count(%device: !hal.device, %rows: index) -> (index, index, index) {",
            f"        %x = affine.apply {grid}()[%rows]",
            f"        %y = arith.constant {self.y} : index",
            "        %one = arith.constant 1 : index",
            "        hal.return %x, %y, %one : index, index, index",
            "      }",
        ]


def _sized(tensor: str, rows: DynamicRows | None) -> str:
    """A tensor type as the call names it: with its sizes, each the rows, where it is
    dynamic (a mask over query rows and keys of one length has two)."""
    dynamic = tensor.count("?") if rows else 0
    return f"{tensor}{{{', '.join(['%m'] * dynamic)}}}" if dynamic else tensor


def _fixed_count(workgroups: tuple[int, int, int]) -> list[str]:
    x, y, z = workgroups
    return [
        "      count(%device: !hal.device) -> (index, index, index) {",
        f"        %x = arith.constant {x} : index",
        f"        %y = arith.constant {y} : index",
        f"        %z = arith.constant {z} : index",
        "        hal.return %x, %y, %z : index, index, index",
        "      }",
    ]


def dispatch_extern_function(
    name: str,
    kind: str,
    inputs: list[str],
    out: str,
    binary: KernelBinary,
    executable_target: str,
    workgroups: tuple[int, int, int],
    zeroed: list[str] = (),
    workspaces: list[str] = (),
    rows: DynamicRows | None = None,
) -> str:
    """A function `name(inputs...) -> out` that launches `binary` on `workgroups` as a
    `hal.dispatch.extern`: the inputs read-only, then the output and `zeroed` tensors
    (written; they start at zero), `workspaces` (written, undefined at the start), then
    Triton's scratch pointers: its global scratch, where the kernel uses one, written
    (each workgroup's share, undefined at the start), and small placeholders for the
    rest. With `rows` the tensors' `?` is a count of rows known at run time: the grid
    follows it, and the kernel takes it as a value after its operands; its scratch
    pointers then come after that value, as IREE's push constants do (zeros: such a
    kernel may have no global scratch)."""
    # Triton's scratch pointers, after the operands named here.
    hidden = binary.pointers - binary.scalars - len(inputs) - 1 - len(zeroed) - len(workspaces)
    global_bytes = binary.scratch_bytes * math.prod(workgroups)
    if rows and global_bytes:
        raise KernelDoesNotFit("a kernel for any count of rows may not use global scratch")
    global_scratch = [f"tensor<{global_bytes}xi8>"] if global_bytes else []
    scratch_values = [] if rows else [f"%s{i}" for i in range(hidden - len(global_scratch))]
    arguments = [f"%a{i}" for i in range(len(inputs))]
    zero_values = [f"%z{i}" for i in range(len(zeroed))]
    work_values = [f"%w{i}" for i in range(len(workspaces))]
    allocated = [*zip(work_values, workspaces, strict=True)]
    allocated += [("%g", t) for t in global_scratch]
    written_values = ["%out", *zero_values, *(value for value, _ in allocated)]
    operand_types = [*inputs, out, *zeroed, *workspaces, *global_scratch]
    operand_types = [_sized(t, rows) for t in operand_types]
    operand_types += ["tensor<256xi8>"] * len(scratch_values)
    operands = [*arguments, *written_values, *scratch_values]
    values = ["%m32", *(["%pad"] * hidden)] if rows else []
    # Indirect: the buffers come from the call's binding table, so IREE records the command
    # buffer once and replays it. Without the flag an extern dispatch binds its buffers
    # directly and the command buffer (every repeat of the dispatch) is recorded on every
    # call, as IREE's own dispatches are not.
    read_only = '#hal.pipeline.binding<storage_buffer, "ReadOnly|Indirect">'
    written = "#hal.pipeline.binding<storage_buffer, Indirect>"
    bindings = [read_only] * len(inputs) + [written] * len(written_values)
    bindings += [read_only] * len(scratch_values)
    constants = f"constants = {len(values)}, " if values else ""
    returns = "util.return" if kind == "util.func" else "return"
    visibility = " private" if kind == "util.func" else ""
    several = len(written_values) > 1
    tied = "%out" + _sized(out, rows).removeprefix(out)
    results = f"({', '.join(written_values)})" if several else tied
    count = f":{len(written_values)}" if several else ""
    result = "%r#0" if several else "%r"
    signature = ", ".join(f"{a}: {t}" for a, t in zip(arguments, inputs, strict=True))
    zeros = zip(zero_values, zeroed, strict=True)
    workload = "[%m]" if rows else ""
    lines = [
        f"  {kind}{visibility} @{name}({signature}) -> {out} {{",
        *(_row_values(rows, inputs) if rows else []),
        f"    %out = flow.tensor.alloca : {_sized(out, rows)}",
        *[f"    {v} = flow.tensor.alloca : {_sized(t, rows)}" for v, t in allocated],
        *[f"    {v} = arith.constant dense<{zero_of(t)}> : {t}" for v, t in zeros],
        *[f"    {v} = arith.constant dense<0> : tensor<256xi8>" for v in scratch_values],
        f'    %r{count} = hal.dispatch.extern "{binary.entry}"{workload}'
        f"({', '.join([*operands, *values])}) : "
        f"({', '.join([*operand_types, *['i32'] * len(values)])}) -> {results}",
        *(rows.count_region() if rows else _fixed_count(workgroups)),
        f"      layout(#hal.pipeline.layout<{constants}bindings = [{', '.join(bindings)}]>)",
        "      objects({",
        f"        {executable_target} ordinal(0) = [{object_attribute(binary)}]",
        "      })",
        f"      <{{workgroup_size = [{binary.threads} : index, 1 : index, 1 : index], "
        f"subgroup_size = 32 : index, workgroup_local_memory = {binary.shared_bytes} : index}}>",
        f"    {returns} {result} : {out}",
        "  }",
    ]
    return "\n".join(lines) + "\n"


def _row_values(rows: DynamicRows, inputs: list[str]) -> list[str]:
    """The count of rows read from its input, as an index and as the kernel's i32, and the
    zero that stands for each scratch pointer after it."""
    return [
        f"    %row_dim = arith.constant {rows.dim} : index",
        f"    %m = tensor.dim %a{rows.operand}, %row_dim : {inputs[rows.operand]}",
        "    %m32 = arith.index_cast %m : index to i32",
        "    %pad = arith.constant 0 : i32",
    ]


def zero_of(tensor: str) -> str:
    """Zero as a dense attribute of `tensor`'s element type writes it (0.0 for a float)."""
    element = tensor.removesuffix(">").rsplit("x", 1)[1]
    return "0.0" if element.startswith(("f", "bf")) else "0"


def extern_module_text(executable_target: str, body: str) -> str:
    """A module around extern functions, its device target named (any family's)."""
    device = f'[#hal.device.target<"cuda", [{executable_target}]> : !hal.device]'
    return f"module attributes {{hal.device.targets = {device}}} {{\n{body}}}\n"
