"""A whole model: lowered with IREE's own pipeline, then the contractions of its dispatches.

A model comes as ONNX, as torch-dialect MLIR (iree-turbine, or ONNX already imported), or as
MLIR at any later level (linalg, ...). Tuning the input ops would miss what IREE really runs:
IREE transposes, hoists, collapses dims and fuses producers and consumers before it forms
dispatches, so the op a tuning spec must match is the dispatch's root, in the layout IREE chose.
`lower_to_dispatches` runs `iree-compile --compile-to=flow`; `find_contractions` reads the
contraction roots of the dispatches it formed, with the bindings.

Why `flow` and not `dispatch-creation`: both phases hold the same dispatch bodies (the same
root ops, layouts and fused ops), but at `dispatch-creation` a dispatch is an anonymous
`flow.dispatch.workgroups` region inside the host function, while at `flow` each is outlined
into a `flow.executable` whose export IREE names after its root
(`main$async_dispatch_1_batch_matmul_1x8x128x64_f32`), called by `flow.dispatch` ops that name
it. Those names are the ones `--iree-hal-dump-executable-benchmarks-to` and IREE's profiles use,
and counting the `flow.dispatch` ops that name an export says how often the model runs it.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from iree.compiler import ir

from autosched import processes
from autosched.compile import compiler_path, first_error_line, opt_path
from autosched.errors import UserError, require_file
from autosched.ir_walk import children, symbol, walk_ops
from autosched.model.torch_ops import UnloweredOp, rewrite_model
from autosched.ops.base import DispatchSite, SkippedRoot
from autosched.ops.contraction import Contraction, producer
from autosched.ops.matmul import MatmulProblem, parse_module
from autosched.ops.registry import classify_root

PHASE = "flow"
MODEL_SUFFIXES = (".onnx", ".mlir", ".mlirbc")

# Constants above this many elements (the weights) are printed as `dense_resource<__elided__>`:
# the analysis needs their types, never their values, and the text stays small. (The same
# number bounds a resource's printed hex string, in characters.)
ELIDE_ABOVE = 64
LOWERING_TIMEOUT = 600.0  # seconds for iree-compile to form a model's dispatches


# Ops a module of bare matmuls holds; anything else makes it a model, tuned as IREE forms its
# dispatches (a fused bias add changes what the matmul's dispatch is).
KERNEL_MODULE_OPS = {
    "builtin.module",
    "func.func",
    "func.return",
    "util.func",
    "util.return",
    "arith.constant",
    "tensor.empty",
    "tensor.dim",  # a dynamic dim's size, for its tensor.empty: a bare matmul of dynamic shape
    "linalg.fill",
    "linalg.matmul",
    "linalg.batch_matmul",
}


def is_model(path: str) -> bool:
    """Whether `path` is a model rather than a module of bare matmuls.

    ONNX and bytecode are models; an MLIR text file is one when it holds any op besides
    matmuls, fills, constants and functions (torch, StableHLO, TOSA, or linalg with other
    ops). A file that does not parse is left to the matmul path, which reports why.
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix in (".onnx", ".mlirbc"):
        return True
    try:
        module = ir.Module.parseFile(path, ir.Context())
    except (ir.MLIRError, OSError, ValueError, RuntimeError):
        return False
    found = False

    def visit(operation) -> None:
        nonlocal found
        for region in operation.regions:
            for block in region.blocks:
                for child in block.operations:
                    name = child.operation.name
                    if name not in KERNEL_MODULE_OPS:
                        found = True
                        return
                    if not name.startswith("linalg."):  # a named op's body is its own
                        visit(child.operation)

    visit(module.operation)
    return found


# ---------------------------------------------------------------------------------------------
# Lowering


def import_onnx(path: str, output: str) -> None:
    """IREE's own ONNX importer (the code behind `iree-import-onnx`), run in this process.

    The tool's loading (shape inference, external data) is reused as is; its printing is not:
    it writes text without locations, and the importer names every op after its ONNX node,
    which is the best location a dispatch can report. Bytecode keeps those names.
    """
    try:
        import onnx  # noqa: F401, PLC0415  (the importer needs it; say so before it fails deeper down)
    except ImportError:
        raise UserError(
            f"{path}: reading ONNX models needs the onnx package: pip install '.[onnx]'"
        ) from None
    from iree.compiler.extras import onnx_importer  # noqa: PLC0415 - an optional extra, imported where it is used
    from iree.compiler.tools.import_onnx import __main__ as tool  # noqa: PLC0415 - needs onnx

    try:
        model = tool.load_onnx_model(tool.parse_arguments([path]))
        info = onnx_importer.ModelInfo(model)
        module = info.create_module(context=ir.Context())
        onnx_importer.NodeImporter.define_function(info.main_graph, module.operation).import_all()
        module.operation.verify()
        with open(output, "wb") as file:
            module.operation.write_bytecode(file)
    except Exception as error:  # the importer raises whatever onnx or MLIR raised
        text = str(error).strip()
        message = text.splitlines()[0] if text else type(error).__name__
        raise UserError(f"{path}: iree-import-onnx failed: {message}") from None


def _compile_to_dispatches(
    path: str,
    compile_flags: Sequence[str],
    timeout: float,
    named: str,
    phase: str = PHASE,
    elide_above: int | None = ELIDE_ABOVE,
) -> bytes:
    """iree-compile to `phase` (`flow`: the dispatches), through `processes.run` so that a
    signal or a timeout kills it; errors name `named`, the user's file (`path` may be a
    temporary import of it). Constants larger than `elide_above` are left out (to be read,
    not compiled on); None keeps them all."""
    elided = [
        f"--mlir-elide-elementsattrs-if-larger={elide_above}",
        f"--mlir-elide-resource-strings-if-larger={elide_above}",
    ]
    command = [
        compiler_path(),
        path,
        *compile_flags,
        f"--compile-to={phase}",
        *(elided if elide_above is not None else []),
        "--mlir-print-debuginfo",  # the dispatch roots' locations: the model's own lines
        "-o",
        "-",
    ]
    finished = processes.run(command, timeout, binary_output=True)
    if finished.timed_out:
        raise UserError(f"{named}: iree-compile took over {timeout:g} s to lower it to {phase}")
    if finished.returncode != 0:
        reason = first_error_line(finished.stderr).replace(path, named)
        raise UserError(f"{named}: iree-compile failed: {reason}")
    return finished.output


def prepare_model(model_path: str, work_dir: str) -> str:
    """A file iree-compile takes for the model: the model itself, or its ONNX import.

    `.onnx` is imported with IREE's ONNX importer (`import_onnx`) into `work_dir`;
    `.mlir` and `.mlirbc` are returned as they are, or with the torch ops IREE does not lower
    rewritten (`torch_ops.rewrite_model`) into `work_dir`. Every failure is a one-line
    UserError.
    """
    require_file(model_path)
    stem, suffix = os.path.splitext(os.path.basename(model_path))
    suffix = suffix.lower()
    if suffix not in MODEL_SUFFIXES:
        raise UserError(
            f"{model_path}: a model is one of {', '.join(MODEL_SUFFIXES)}, "
            f"not {suffix or 'no suffix'}"
        )
    if suffix != ".onnx":
        try:
            return rewrite_model(model_path, work_dir)
        except UnloweredOp as op:
            raise UserError(
                f"{model_path}: {op.name} ({source_location(op.location)}) {op.why}"
            ) from None
    os.makedirs(work_dir, exist_ok=True)
    imported = os.path.join(work_dir, stem + ".mlirbc")
    import_onnx(model_path, imported)
    return imported


def parse_prepared(model_path: str, work_dir: str, context: ir.Context | None = None) -> ir.Module:
    """The model at `model_path` prepared (`prepare_model`) and parsed; a file MLIR does not
    parse (a corrupt `.mlirbc`, say) is one UserError naming where (`parse_module`)."""
    return parse_module(prepare_model(model_path, work_dir), context or ir.Context())


def run_passes(path: str, pipeline: str, out: str) -> None:
    """IREE's passes `pipeline` on the module at `path` with iree-opt, written to `out` with
    the ops' locations (the run names a root by its line in the user's model); a failure is
    a RuntimeError with iree-opt's telling line."""
    command = [opt_path(), path, f"--pass-pipeline={pipeline}", "--mlir-print-debuginfo"]
    finished = processes.run([*command, "-o", out], LOWERING_TIMEOUT)
    if finished.timed_out:
        raise RuntimeError(f"iree-opt took over {LOWERING_TIMEOUT:g} s")
    if finished.returncode != 0:
        raise RuntimeError(processes.describe_failure(finished, "iree-opt"))


def lower_to_phase(
    model_path: str,
    compile_flags: Sequence[str],
    phase: str,
    save_to: str,
    work_dir: str,
    elide_above: int | None = ELIDE_ABOVE,
) -> str:
    """The model lowered to `phase` (its ops keep the model's locations), written to
    `save_to` as text; returns that path. `elide_above = None` keeps every constant, for a
    module that is compiled on."""
    source = prepare_model(model_path, work_dir)
    lowered = _compile_to_dispatches(
        source,
        compile_flags,
        LOWERING_TIMEOUT,
        named=model_path,
        phase=phase,
        elide_above=elide_above,
    )
    with open(save_to, "wb") as file:
        file.write(lowered)
    return save_to


def lower_to_dispatches(
    path: str,
    compile_flags: Sequence[str],
    context: ir.Context | None = None,
    save_to: str | None = None,
    timeout: float = LOWERING_TIMEOUT,
) -> ir.Module:
    """The model at `path` lowered by iree-compile to `flow`: one `flow.executable` a dispatch.

    `path` is `.onnx` (imported with IREE's ONNX importer, which needs the `onnx` package),
    `.mlir` or `.mlirbc` at any level IREE takes as input. `compile_flags` choose the target
    (for the CPU: `CpuTarget(config).compile_flags()`); dispatch formation depends on it. `save_to`
    keeps the lowered text for a person to read. Every failure is a one-line UserError.
    """
    with tempfile.TemporaryDirectory(prefix="autosched-model-") as work:
        source = prepare_model(path, work)
        lowered = _compile_to_dispatches(source, compile_flags, timeout, named=path)
    if save_to:
        with open(save_to, "wb") as file:
            file.write(lowered)
    context = context or ir.Context()
    try:
        return ir.Module.parse(lowered, context)
    except ir.MLIRError as error:  # iree-compile printed something its own bindings refuse
        raise UserError(
            f"{path}: the lowered model does not parse: {error}".splitlines()[0]
        ) from None


# ---------------------------------------------------------------------------------------------
# What the analysis returns


@dataclass
class ModelAnalysis:
    # Every root a kind tunes (contractions, attention), one per signature, in the order
    # the model first runs them.
    roots: list
    skipped: list[SkippedRoot]
    dispatches: int  # dispatch entry points in the model, tuned or not

    @property
    def contractions(self) -> list[Contraction]:
        return [r for r in self.roots if isinstance(r, Contraction)]

    def skipped_counts(self) -> dict[str, int]:
        """Reason -> how many dispatch roots were skipped for it."""
        return dict(Counter(s.reason for s in self.skipped))

    def matmul_problems(self) -> list[MatmulProblem]:
        """The contractions that today's matmul targets can tune, as MatmulProblems."""
        found = (c.as_matmul_problem() for c in self.contractions)
        return [p for p in found if p is not None]


# ---------------------------------------------------------------------------------------------
# Walking the dispatches


def source_location(location: ir.Location) -> str:
    """Where in the user's source an op came from: an ONNX node's name, a Python line, ...

    A torch export gives call sites (the model's line, called from torch's tracer: the callee
    is the model's line); the ONNX importer names each op after its node; IREE fuses the
    locations of ops it merged.
    """
    if isinstance(location, ir.FileLineColLoc):
        return f"{location.filename}:{location.start_line}:{location.start_col}"
    if isinstance(location, ir.CallSiteLoc):
        return source_location(location.callee)
    if isinstance(location, ir.NameLoc):
        child = location.child_loc
        if isinstance(child, ir.UnknownLoc):
            return location.name_str
        return f"{location.name_str} ({source_location(child)})"
    if isinstance(location, ir.FusedLoc):
        parts = dict.fromkeys(source_location(part) for part in location.locations)
        return "; ".join(part for part in parts if part != "unknown")
    if isinstance(location, ir.UnknownLoc):
        return "unknown"
    return str(location)


def _describe_fused(op: ir.Operation) -> str:
    if op.name != "linalg.generic":
        return op.name
    body = [o.operation.name for o in op.regions[0].blocks[0].operations][:-1]
    return f"linalg.generic ({', '.join(body) if body else 'copy'})"


def is_linalg_op(op: ir.Operation) -> bool:
    return op.name.startswith(("linalg.", "iree_linalg_ext.")) and op.name not in (
        "linalg.yield",
        "linalg.index",
        "iree_linalg_ext.yield",
    )


def _calls(module: ir.Module) -> Counter:
    """(executable, entry point) -> how many flow.dispatch ops launch it."""
    calls: Counter = Counter()
    for op in walk_ops(module.operation):
        if op.name == "flow.dispatch":
            for entry in ir.ArrayAttr(op.attributes["entry_points"]):
                calls[tuple(ir.SymbolRefAttr(entry).value)] += 1
    return calls


def dispatch_calls(module: ir.Module) -> dict[str, int]:
    """Entry point -> how many times one run of the model launches it. A custom kernel
    (`hal.dispatch.extern`: executable::variant::export, its export named by the kernel) is
    keyed by its executable, as its dispatch benchmark is (dispatch_benchmarks._entries)."""
    calls: Counter = Counter()
    for path, count in _calls(module).items():
        calls[path[-1] if len(path) == 2 else path[0]] += count
    return dict(calls)


def dispatch_callers(module: ir.Module) -> dict[str, str]:
    """Entry point -> the exported function whose run launches it (its `$async` twin read
    as the function), for a module of several functions (prefill and decode, ...)."""
    callers: dict[str, str] = {}
    for function in children(module.operation):
        if function.name not in ("util.func", "func.func"):
            continue
        name = symbol(function).removesuffix("$async")
        for op in walk_ops(function):
            if op.name == "flow.dispatch":
                for entry in ir.ArrayAttr(op.attributes["entry_points"]):
                    path = ir.SymbolRefAttr(entry).value
                    callers.setdefault(path[-1] if len(path) == 2 else path[0], name)
    return callers


def dispatch_functions(module: ir.Module):
    """(executable name, entry point name, func op) for every dispatch function."""
    for executable in children(module.operation):
        if executable.name != "flow.executable":
            continue
        exports = [symbol(op) for op in children(executable) if op.name == "flow.executable.export"]
        for inner in children(executable):
            if inner.name != "builtin.module":
                continue
            for function in children(inner):
                if function.name == "func.func" and symbol(function) in exports:
                    yield symbol(executable), symbol(function), function


def find_contractions(module: ir.Module) -> ModelAnalysis:
    """The contraction roots of every dispatch of a module lowered to `flow`.

    Identical contractions (op, loops, sizes, element types, maps, init) and attentions
    become one, with every dispatch that holds it; convolutions, matrix-vector products,
    dynamic shapes and unsupported element types are listed in `skipped` with their reason.
    """
    calls = _calls(module)
    found: dict[tuple, Contraction] = {}
    skipped: list[SkippedRoot] = []
    dispatches = 0
    for executable, entry_point, function in dispatch_functions(module):
        dispatches += 1
        ops = [op for op in walk_ops(function) if is_linalg_op(op)]
        for op in ops:
            init = producer(op.operands[-1]) if len(op.operands) else None
            neighbours = tuple(
                _describe_fused(other)
                for other in ops
                if other != op and not (other.name == "linalg.fill" and other == init)
            )
            site = DispatchSite(
                executable=executable,
                entry_point=entry_point,
                calls=calls[(executable, entry_point)],
                fused_ops=neighbours,
                location=source_location(op.location),
            )
            result = classify_root(op, site)
            if isinstance(result, SkippedRoot):
                skipped.append(result)
            elif result is not None:
                key = (type(result).__name__, result.key())
                if key in found:
                    found[key].sites.extend(result.sites)
                else:
                    found[key] = result
    return ModelAnalysis(roots=list(found.values()), skipped=skipped, dispatches=dispatches)


def analyze_model(
    path: str, compile_flags: Sequence[str], context: ir.Context | None = None
) -> ModelAnalysis:
    """lower_to_dispatches, then find_contractions."""
    return find_contractions(lower_to_dispatches(path, compile_flags, context))
