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

from autosched.kernels.base import KernelBinary


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
) -> str:
    """A function `name(inputs...) -> out` that launches `binary` on `workgroups` as a
    `hal.dispatch.extern`: the inputs read-only, then the output and `zeroed` tensors
    (written; they start at zero), `workspaces` (written, undefined at the start), then
    Triton's scratch pointers: its global scratch, where the kernel uses one, written
    (each workgroup's share, undefined at the start), and small placeholders for the
    rest."""
    x, y, z = workgroups
    # Triton's scratch pointers, after the operands named here.
    hidden = binary.pointers - len(inputs) - 1 - len(zeroed) - len(workspaces)
    global_bytes = binary.scratch_bytes * x * y * z
    global_scratch = [f"tensor<{global_bytes}xi8>"] if global_bytes else []
    scratch_values = [f"%s{i}" for i in range(hidden - len(global_scratch))]
    arguments = [f"%a{i}" for i in range(len(inputs))]
    zero_values = [f"%z{i}" for i in range(len(zeroed))]
    work_values = [f"%w{i}" for i in range(len(workspaces))]
    allocated = [*zip(work_values, workspaces, strict=True)]
    allocated += [("%g", t) for t in global_scratch]
    written_values = ["%out", *zero_values, *(value for value, _ in allocated)]
    operand_types = [*inputs, out, *zeroed, *workspaces, *global_scratch]
    operand_types += ["tensor<256xi8>"] * len(scratch_values)
    operands = [*arguments, *written_values, *scratch_values]
    # Indirect: the buffers come from the call's binding table, so IREE records the command
    # buffer once and replays it. Without the flag an extern dispatch binds its buffers
    # directly and the command buffer (every repeat of the dispatch) is recorded on every
    # call, as IREE's own dispatches are not.
    read_only = '#hal.pipeline.binding<storage_buffer, "ReadOnly|Indirect">'
    written = "#hal.pipeline.binding<storage_buffer, Indirect>"
    bindings = [read_only] * len(inputs) + [written] * len(written_values)
    bindings += [read_only] * len(scratch_values)
    returns = "util.return" if kind == "util.func" else "return"
    visibility = " private" if kind == "util.func" else ""
    several = len(written_values) > 1
    results = f"({', '.join(written_values)})" if several else "%out"
    count = f":{len(written_values)}" if several else ""
    result = "%r#0" if several else "%r"
    signature = ", ".join(f"{a}: {t}" for a, t in zip(arguments, inputs, strict=True))
    zeros = zip(zero_values, zeroed, strict=True)
    lines = [
        f"  {kind}{visibility} @{name}({signature}) -> {out} {{",
        f"    %out = flow.tensor.alloca : {out}",
        *[f"    {v} = flow.tensor.alloca : {t}" for v, t in allocated],
        *[f"    {v} = arith.constant dense<{zero_of(t)}> : {t}" for v, t in zeros],
        *[f"    {v} = arith.constant dense<0> : tensor<256xi8>" for v in scratch_values],
        f'    %r{count} = hal.dispatch.extern "{binary.entry}"'
        f"({', '.join(operands)}) : ({', '.join(operand_types)}) -> {results}",
        "      count(%device: !hal.device) -> (index, index, index) {",
        f"        %x = arith.constant {x} : index",
        f"        %y = arith.constant {y} : index",
        f"        %z = arith.constant {z} : index",
        "        hal.return %x, %y, %z : index, index, index",
        "      }",
        f"      layout(#hal.pipeline.layout<bindings = [{', '.join(bindings)}]>)",
        "      objects({",
        f"        {executable_target} ordinal(0) = [{object_attribute(binary)}]",
        "      })",
        f"      <{{workgroup_size = [{binary.threads} : index, 1 : index, 1 : index], "
        f"subgroup_size = 32 : index, workgroup_local_memory = {binary.shared_bytes} : index}}>",
        f"    {returns} {result} : {out}",
        "  }",
    ]
    return "\n".join(lines) + "\n"


def zero_of(tensor: str) -> str:
    """Zero as a dense attribute of `tensor`'s element type writes it (0.0 for a float)."""
    element = tensor.removesuffix(">").rsplit("x", 1)[1]
    return "0.0" if element.startswith(("f", "bf")) else "0"


def extern_module_text(executable_target: str, body: str) -> str:
    """A module around extern functions, its device target named (any family's)."""
    device = f'[#hal.device.target<"cuda", [{executable_target}]> : !hal.device]'
    return f"module attributes {{hal.device.targets = {device}}} {{\n{body}}}\n"
