"""IREE's own dispatches as standalone benchmarks, to time a model's candidates on.

A contraction rebuilt as a bare kernel is not what the model runs: IREE fuses the bias add,
SiLU or `truncf` into the matmul's dispatch, and on the H200 per-problem speedups of
1.11-3.30x on bare kernels became 1.41x on the whole decoder layer. IREE can write each
dispatch of a compiled model as a module of its own
(`--iree-hal-dump-executable-benchmarks-to`): the dispatch exactly as formed, with a
function that runs it `--batch_size` times on scratch buffers. With IREE's chosen
configuration stripped (`--iree-codegen-strip-compilation-info`), compiling that module
alone gives IREE's default again, and compiling it with a one-candidate spec gives the
candidate, fused consumers and all. Its buffers hold no chosen data, so answers are checked
on a module of its own (`dispatch_check_modules`).

The benchmark is compiled from `executable-sources` on (`BENCHMARK_FLAGS`), never from the
input phase: compiled from the start, dispatch creation runs a second time on the dumped
dispatch, and on CUDA `FoldUnitExtentDims` turns a unit-batch `batch_matmul` (every 3-D
`nn.Linear`) into a 5-loop generic that no spec written for the model's 4-loop form
matches, so every candidate was IREE's default (issue 22). From executable sources the
root keeps the form it has in the model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from iree.compiler import ir

from autosched import processes
from autosched.compile import compiler_path, opt_path
from autosched.errors import UserError
from autosched.ir_walk import walk_ops

DUMP_TIMEOUT = 1800.0  # one full compile of the model
# How a dumped benchmark is compiled: its dispatch as the model formed it (see above).
BENCHMARK_FLAGS = ("--compile-from=executable-sources",)
STRIP_FLAG = "--iree-codegen-strip-compilation-info"  # IREE's configuration, left out


@dataclass(frozen=True)
class DispatchBenchmark:
    """One dispatch of the model as a benchmark module with no configuration."""

    entry_point: str  # the dispatch function, as model.analyze_model names its sites
    source: str  # the stripped benchmark module (.mlir)
    function: str  # its entry, which runs the dispatch --batch_size times
    check_source: str = ""  # the dispatch alone behind a function of its operands (.mlir)
    check_inputs: tuple[tuple[tuple[int, ...], str], ...] = ()  # (shape, element) per operand
    check_outputs: tuple[tuple[tuple[int, ...], str], ...] = ()  # (shape, element) per result
    flags: tuple[str, ...] = BENCHMARK_FLAGS  # iree-compile flags the source is built with
    check_function: str = "dispatch"  # the check module's function (CHECK_FUNCTION)
    # The check module is the whole model (a kind whose dispatch alone is out of a spec's
    # reach): its build is checked for the problem's own roots, not for every root.
    checks_model: bool = False
    # A kind whose dispatch check a spec may miss (`RootOpKind.checks_model`): the whole
    # model's check fields, taken (`on_whole_model`) where a one-point spec does not reach
    # the root of the dispatch's own check module.
    model_check: dict | None = field(default=None, compare=False)

    def on_whole_model(self) -> DispatchBenchmark:
        return replace(self, **(self.model_check or {}), model_check=None)


def _entries(path: str) -> tuple[str, str, bool] | None:
    """(dispatch entry point, benchmark function, whether it holds resource constants) of
    one dumped module, read with the bindings."""
    module = ir.Module.parseFile(path, ir.Context())
    function = entry = None
    resources = False
    for op in module.body.operations:
        op = op.operation
        if op.name == "util.func" and "iree.reflection" in op.attributes:
            if "iree.benchmark" in str(op.attributes["iree.reflection"]):
                function = ir.StringAttr(op.attributes["sym_name"]).value
        if op.name == "hal.executable":
            executable = ir.StringAttr(op.attributes["sym_name"]).value
            for inner in walk_ops(op):
                if inner.name == "hal.executable.export":
                    entry = ir.StringAttr(inner.attributes["sym_name"]).value
                    # IREE names a dispatch's export after its executable; a custom kernel's
                    # export is the kernel's name (every matmul one "matmul"): its executable.
                    entry = entry if entry.startswith(executable) else executable
                resources = resources or _holds_resource(inner)
    return (entry, function, resources) if entry and function else None


def _holds_resource(op: ir.Operation) -> bool:
    """Whether a constant of the op is a `dense_resource` (its data kept outside the IR)."""
    for name in op.attributes:
        try:
            ir.DenseResourceElementsAttr(op.attributes[name])
            return True
        except ValueError:  # the bindings cast, or refuse an attribute of another kind
            continue
    return False


def resource_section(model_path: str) -> str:
    """The model's resources (`{-# dialect_resources ... #-}`, the data of its
    `dense_resource` constants) as the printer writes them after the module, or "".

    IREE writes a dispatch's benchmark without them: on CUDA a small constant (a folded batch
    norm's scale) is inlined into the dispatch, and its benchmark then fails to build
    ("resource does not exist"). Appended, the benchmark names the same data again."""
    text = str(ir.Module.parseFile(model_path, ir.Context()))
    start = text.rfind("\n{-#")
    return text[start:] if start >= 0 else ""


def _holds_any_resource(op: ir.Operation) -> bool:
    return any(_holds_resource(inner) for inner in walk_ops(op))


def _tied_operands(op: ir.Operation) -> list[int]:
    """Per result of a `flow.dispatch`, the operand it is written into, or -1."""
    if "tied_operands" not in op.attributes:
        return [-1] * len(op.results)
    return [ir.IntegerAttr(t).value for t in ir.ArrayAttr(op.attributes["tied_operands"])]


def dump_dispatch_benchmarks(
    model_path: str, flags: Sequence[str], folder: str
) -> dict[str, DispatchBenchmark]:
    """Entry point -> benchmark, for every dispatch IREE could write one for.

    Dispatches with dynamic shapes get none (IREE writes no benchmark for them); their
    problems are timed on the bare kernel.
    """
    raw = os.path.join(folder, "raw")
    os.makedirs(raw, exist_ok=True)
    command = [
        compiler_path(),
        model_path,
        *flags,
        f"--iree-hal-dump-executable-benchmarks-to={raw}",
        "-o",
        os.devnull,
    ]
    finished = processes.run(command, DUMP_TIMEOUT)
    if finished.timed_out or finished.returncode != 0:
        reason = processes.describe_failure(finished, "iree-compile")
        raise UserError(f"{model_path}: writing the dispatch benchmarks failed: {reason}")
    return strip_benchmarks(raw, folder, model_path)


def strip_benchmarks(raw: str, folder: str, model_path: str) -> dict[str, DispatchBenchmark]:
    """Entry point -> benchmark, for every benchmark IREE wrote to `raw` (from the model at
    `model_path`): each written to `folder` with IREE's configuration stripped (one iree-opt
    a benchmark, on every core: a model has tens of dispatches)."""
    os.makedirs(folder, exist_ok=True)
    found: dict[str, DispatchBenchmark] = {}
    if not os.path.isdir(raw):  # no dispatch IREE could write one for
        return found
    dumped = {}
    for name in sorted(os.listdir(raw)):
        entries = _entries(os.path.join(raw, name))
        if entries is not None:
            dumped[name] = entries

    def strip(name: str) -> bool:
        command = [
            opt_path(),
            os.path.join(raw, name),
            STRIP_FLAG,
            "-o",
            os.path.join(folder, name),
        ]
        done = processes.run(command, DUMP_TIMEOUT)
        return done.returncode == 0 and not done.timed_out

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        stripped = dict(zip(dumped, pool.map(strip, dumped), strict=True))
    resources = None  # the model's, read once and only when a benchmark needs them
    for name, (entry, function, needs_resources) in dumped.items():
        if not stripped[name]:
            continue
        path = os.path.join(folder, name)
        if needs_resources:
            resources = resource_section(model_path) if resources is None else resources
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(resources)
        found[entry] = DispatchBenchmark(entry, path, function)
    return found


CHECK_FUNCTION = "dispatch"


def _tensor(value_type: ir.Type) -> tuple[tuple[int, ...], str] | None:
    try:
        tensor = ir.RankedTensorType(value_type)
    except ValueError:
        return None
    if not tensor.has_static_shape:
        return None
    return tuple(tensor.shape), str(tensor.element_type)


def dispatch_check_modules(
    flow_module: ir.Module, entry_points: set[str], folder: str, model_path: str
) -> dict[str, tuple[str, tuple, tuple]]:
    """Entry point -> (module, operand types, result types) that runs that one dispatch.

    The module holds the dispatch's `flow.executable` and a function `@dispatch` that takes
    the dispatch's operands as arguments and returns its results, so a candidate's answer
    on the dispatch itself, fused consumers included, can be compared with the default's on
    the same inputs. Built from the model lowered to `flow`; dispatches whose shapes are
    dynamic get none. A result tied to an operand (a convolution written into the padded
    input of the next one) stays tied: that operand is an argument too, and the parts the
    dispatch does not write keep its values in every build.
    """
    executables, devices = {}, []
    for op in flow_module.body.operations:
        op = op.operation
        if op.name == "flow.executable":
            executables[ir.StringAttr(op.attributes["sym_name"]).value] = op
        elif op.name == "util.global" and str(ir.TypeAttr(op.attributes["type"]).value) == (
            "!hal.device"
        ):
            devices.append(str(op))  # the device the dispatch is built for
    # The model's devices (globals at this phase) and module attributes (which device is the
    # default) go with the dispatch, or it would be built for a default GPU: an sm_90 target
    # exists only as such an attribute.
    own = flow_module.operation.attributes
    named = [f"{name} = {own[name]}" for name in own if name not in ("sym_name", "sym_visibility")]
    attributes = f" attributes {{{', '.join(named)}}}" if named else ""
    found = {}
    resources = None  # the module's resource section, printed once and only when needed
    for op in walk_ops(flow_module.operation):
        if op.name != "flow.dispatch":
            continue
        (entry_ref,) = ir.ArrayAttr(op.attributes["entry_points"])
        reference = ir.SymbolRefAttr(entry_ref)
        executable, entry = reference.value[0], reference.value[-1]
        if entry not in entry_points or entry in found or executable not in executables:
            continue
        inputs = [_tensor(v.type) for v in op.operands]
        outputs = [_tensor(r.type) for r in op.results]
        if None in inputs or None in outputs or not outputs:
            continue
        in_types = [str(v.type) for v in op.operands]
        out_types = [str(r.type) for r in op.results]
        tied = _tied_operands(op)
        written = [f"%a{t}" if t >= 0 else out_types[i] for i, t in enumerate(tied)]
        arguments = ", ".join(f"%a{i}: {t}" for i, t in enumerate(in_types))
        names = ", ".join(f"%a{i}" for i in range(len(in_types)))
        results = ", ".join(f"%r#{i}" for i in range(len(out_types)))
        text = (
            f"module{attributes} {{\n"
            + "".join(f"{device}\n" for device in devices)
            + f"{executables[executable]}\n"
            f"util.func public @{CHECK_FUNCTION}({arguments}) -> ({', '.join(out_types)}) {{\n"
            f"  %r:{len(out_types)} = flow.dispatch {entry_ref}({names}) : "
            f"({', '.join(in_types)}) -> ({', '.join(written)})\n"
            f"  util.return {results} : {', '.join(out_types)}\n"
            "}\n}\n"
        )
        if _holds_any_resource(executables[executable]):
            # `flow_module` was printed with its resources elided; the model's hold the data.
            resources = resource_section(model_path) if resources is None else resources
            text += resources
        ir.Module.parse(text, flow_module.context)  # what is written is valid MLIR
        path = os.path.join(folder, f"{entry}.check.mlir")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        found[entry] = (path, tuple(inputs), tuple(outputs))
    return found
