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
from dataclasses import dataclass, field

from iree.compiler import ir

from autosched import processes
from autosched.analysis import SUPPORTED_TYPES, MatmulProblem, OpSite
from autosched.compile import compiler_path, first_error_line
from autosched.errors import UserError

PHASE = "flow"
MODEL_SUFFIXES = (".onnx", ".mlir", ".mlirbc")

# Contraction roots: the named matmuls and any op whose maps and body make it one.
CONTRACTION_OPS = ("linalg.matmul", "linalg.batch_matmul", "linalg.contract", "linalg.generic")
MATVEC_OPS = ("linalg.matvec", "linalg.vecmat", "linalg.batch_matvec", "linalg.batch_vecmat")
ATTENTION_OPS = ("iree_linalg_ext.attention", "iree_linalg_ext.online_attention")

# Constants above this many elements (the weights) are printed as `dense_resource<__elided__>`:
# the analysis needs their types, never their values, and the text stays small.
_ELIDE_ABOVE = 64
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
        import onnx  # noqa: F401  (the importer needs it; say so before it fails deeper down)
    except ImportError:
        raise UserError(
            f"{path}: reading ONNX models needs the onnx package: pip install 'autosched[onnx]'"
        ) from None
    from iree.compiler.extras import onnx_importer
    from iree.compiler.tools.import_onnx import __main__ as tool

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


def _compile_to_dispatches(path: str, compile_flags: Sequence[str], timeout: float) -> bytes:
    """iree-compile to `flow`, through `processes.run` so that a signal or a timeout kills it."""
    command = [
        compiler_path(),
        path,
        *compile_flags,
        f"--compile-to={PHASE}",
        f"--mlir-elide-elementsattrs-if-larger={_ELIDE_ABOVE}",
        f"--mlir-elide-resource-strings-if-larger={_ELIDE_ABOVE}",
        "--mlir-print-debuginfo",  # the dispatch roots' locations: the model's own lines
        "-o",
        "-",
    ]
    finished = processes.run(command, timeout, binary_output=True)
    if finished.timed_out:
        raise UserError(f"{path}: iree-compile took over {timeout:g} s to form the dispatches")
    if finished.returncode != 0:
        raise UserError(f"{path}: iree-compile failed: {first_error_line(finished.stderr)}")
    return finished.output


def prepare_model(model_path: str, work_dir: str) -> str:
    """A file iree-compile takes for the model: the model itself, or its ONNX import.

    `.onnx` is imported with IREE's ONNX importer (`import_onnx`) into `work_dir`;
    `.mlir` and `.mlirbc` are returned as they are. Every failure is a one-line UserError.
    """
    if not os.path.isfile(model_path):
        raise UserError(f"{model_path}: no such file")
    stem, suffix = os.path.splitext(os.path.basename(model_path))
    suffix = suffix.lower()
    if suffix not in MODEL_SUFFIXES:
        raise UserError(
            f"{model_path}: a model is one of {', '.join(MODEL_SUFFIXES)}, "
            f"not {suffix or 'no suffix'}"
        )
    if suffix != ".onnx":
        return model_path
    os.makedirs(work_dir, exist_ok=True)
    imported = os.path.join(work_dir, stem + ".mlirbc")
    import_onnx(model_path, imported)
    return imported


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
        lowered = _compile_to_dispatches(source, compile_flags, timeout)
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


@dataclass(frozen=True)
class DispatchSite:
    """One dispatch that holds an op: its executable, entry point, launches and neighbours."""

    executable: str  # the flow.executable symbol
    entry_point: str  # its export: the dispatch function, named by IREE after its root op
    calls: int  # flow.dispatch ops of the model that launch it
    fused_ops: tuple[str, ...]  # the dispatch's other linalg / linalg_ext ops, in walk order
    location: str  # the op's location, as IREE carried it from the source

    @property
    def fuses(self) -> bool:
        return bool(self.fused_ops)


@dataclass
class Contraction:
    """One contraction signature found in the dispatches, with every dispatch that holds it.

    Why not `analysis.MatmulProblem`: a dispatch's root is often a `linalg.generic` that IREE
    made from a matmul (collapsed batch dims, mixed f16 x f16 -> f32 types), and a generic can
    order its loops any way (`(m, n, b, k)`), split m, n or k over several loops, or carry
    several batch loops. MatmulProblem has one m, n, k, at most one batch, in the named ops'
    loop order, which is what its lowering-config tile lists assume; and its sites are
    functions of the input module, not dispatches. `as_matmul_problem` gives the
    MatmulProblem when the contraction has that form, so today's targets and spaces apply.
    """

    op_name: str  # linalg.matmul, linalg.batch_matmul, linalg.contract or linalg.generic
    loops: tuple[str, ...]  # each loop's role in the op's iteration order: "b", "m", "n", "k"
    loop_sizes: tuple[int, ...]
    lhs_type: str
    rhs_type: str
    acc_type: str
    indexing_maps: str  # the op's indexing_maps, as MLIR prints them: what a spec matches
    operand_loops: tuple[tuple[int, ...], ...]  # the same maps: loop positions of lhs, rhs, acc
    zero_init: bool  # the accumulator comes from a linalg.fill inside the dispatch
    sites: list[DispatchSite] = field(default_factory=list)

    def _size(self, role: str) -> int:
        size = 1
        for loop, extent in zip(self.loops, self.loop_sizes, strict=True):
            if loop == role:
                size *= extent
        return size

    @property
    def m(self) -> int:
        return self._size("m")

    @property
    def n(self) -> int:
        return self._size("n")

    @property
    def k(self) -> int:
        return self._size("k")

    @property
    def batch(self) -> int:
        """Product of the batch loops; 0 when there is none (MatmulProblem's convention)."""
        return self._size("b") if "b" in self.loops else 0

    @property
    def occurrences(self) -> int:
        """How many times one run of the model launches a dispatch with this contraction."""
        return sum(site.calls for site in self.sites)

    @property
    def flops(self) -> int:
        return 2 * max(self.batch, 1) * self.m * self.n * self.k

    @property
    def transpose_a(self) -> bool:
        """The lhs is stored m-innermost (k x m), not k-innermost."""
        return self.loops[self.operand_loops[0][-1]] == "m"

    @property
    def transpose_b(self) -> bool:
        """The rhs is stored k-innermost (n x k), as nn.Linear and Gemm(transB=1) weights are."""
        return self.loops[self.operand_loops[1][-1]] == "k"

    @property
    def name(self) -> str:
        kind = self.op_name.split(".")[1]
        if self.op_name not in ("linalg.matmul", "linalg.batch_matmul"):
            kind += "_" + "".join(self.loops)
        if self.transpose_a:
            kind += "_transpose_a"
        if self.transpose_b:
            kind += "_transpose_b"
        shape = "x".join(str(s) for s in self.loop_sizes)
        init = "" if self.zero_init else "_acc"
        return f"{kind}_{shape}_{self.lhs_type}_{self.rhs_type}_{self.acc_type}{init}"

    def as_matmul_problem(self) -> MatmulProblem | None:
        """This contraction as a named-op MatmulProblem, or None where it has no such form.

        It has one when its loops are (m, n, k) or (b, m, n, k), one each, and every operand
        keeps batch first: then a linalg.matmul / batch_matmul with the same indexing maps
        computes the same thing, tile lists line up, and a spec's `match.contraction` with
        these maps matches either op.
        """
        if self.loops not in (("m", "n", "k"), ("b", "m", "n", "k")):
            return None
        batched = self.loops[0] == "b"
        lead = [0] if batched else []
        lhs, rhs, acc = (list(loops) for loops in self.operand_loops)
        m, n, k = (1, 2, 3) if batched else (0, 1, 2)
        if acc != [*lead, m, n]:
            return None
        if lhs not in ([*lead, m, k], [*lead, k, m]) or rhs not in ([*lead, k, n], [*lead, n, k]):
            return None
        return MatmulProblem(
            op_name="linalg.batch_matmul" if batched else "linalg.matmul",
            m=self.m,
            n=self.n,
            k=self.k,
            batch=self.batch,
            lhs_type=self.lhs_type,
            rhs_type=self.rhs_type,
            acc_type=self.acc_type,
            transpose_a=self.transpose_a,
            transpose_b=self.transpose_b,
            zero_init=self.zero_init,
            indexing_maps=self.indexing_maps,
            sites=[
                OpSite(function=site.entry_point, index=index, location=site.location)
                for index, site in enumerate(self.sites)
            ],
        )

    def _key(self) -> tuple:
        return (
            self.op_name,
            self.loops,
            self.loop_sizes,
            self.lhs_type,
            self.rhs_type,
            self.acc_type,
            self.indexing_maps,
            self.zero_init,
        )


@dataclass(frozen=True)
class SkippedRoot:
    """A dispatch root that is not tuned, and why.

    `reason` is one of: "attention", "dynamic shape", "element type", "convolution",
    "matrix-vector"; `detail` says what exactly.
    """

    op_name: str
    reason: str
    detail: str
    site: DispatchSite


@dataclass
class ModelAnalysis:
    contractions: list[Contraction]  # one per signature, in the order the model first runs them
    skipped: list[SkippedRoot]
    dispatches: int  # dispatch entry points in the model, tuned or not

    def skipped_counts(self) -> dict[str, int]:
        """Reason -> how many dispatch roots were skipped for it."""
        return dict(Counter(s.reason for s in self.skipped))

    def matmul_problems(self) -> list[MatmulProblem]:
        """The contractions that today's matmul targets can tune, as MatmulProblems."""
        found = (c.as_matmul_problem() for c in self.contractions)
        return [p for p in found if p is not None]


# ---------------------------------------------------------------------------------------------
# Walking the dispatches


def _source_location(location: ir.Location) -> str:
    """Where in the user's source an op came from: an ONNX node's name, a Python line, ...

    A torch export gives call sites (the model's line, called from torch's tracer: the callee
    is the model's line); the ONNX importer names each op after its node; IREE fuses the
    locations of ops it merged.
    """
    if isinstance(location, ir.FileLineColLoc):
        return f"{location.filename}:{location.start_line}:{location.start_col}"
    if isinstance(location, ir.CallSiteLoc):
        return _source_location(location.callee)
    if isinstance(location, ir.NameLoc):
        child = location.child_loc
        if isinstance(child, ir.UnknownLoc):
            return location.name_str
        return f"{location.name_str} ({_source_location(child)})"
    if isinstance(location, ir.FusedLoc):
        parts = dict.fromkeys(_source_location(part) for part in location.locations)
        return "; ".join(part for part in parts if part != "unknown")
    if isinstance(location, ir.UnknownLoc):
        return "unknown"
    return str(location)


def _children(operation: ir.Operation):
    for region in operation.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation


def walk_ops(operation: ir.Operation):
    for child in _children(operation):
        yield child
        yield from walk_ops(child)


def _symbol(operation: ir.Operation) -> str:
    return ir.StringAttr(operation.attributes["sym_name"]).value


def _dims_of(map_attr: ir.Attribute) -> list[int]:
    """Loop positions of a projected-permutation map's results (ValueError for any other)."""
    affine_map = ir.AffineMapAttr(map_attr).value
    return [ir.AffineDimExpr(expr).position for expr in affine_map.results]


def _producer(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    owner = getattr(owner, "operation", owner)
    return owner if isinstance(owner, ir.Operation) else None


def _block_argument(value: ir.Value) -> int | None:
    try:
        return ir.BlockArgument(value).arg_number
    except ValueError:
        return None


_CASTS = ("arith.extf", "arith.extsi", "arith.extui", "arith.truncf", "arith.sitofp")


def _is_multiply_add(op: ir.Operation) -> bool:
    """The body is acc + lhs * rhs, the inputs possibly cast, and nothing else."""
    block = op.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    if len(body) < 3 or body[-1].name != "linalg.yield" or len(body[-1].operands) != 1:
        return False
    allowed = (*_CASTS, "arith.mulf", "arith.muli", "arith.addf", "arith.addi")
    if any(o.name not in allowed for o in body[:-1]):
        return False
    add = _producer(body[-1].operands[0])
    if add is None or add.name not in ("arith.addf", "arith.addi"):
        return False
    sides = list(add.operands)
    if _block_argument(sides[0]) != 2:
        sides.reverse()
    if _block_argument(sides[0]) != 2:
        return False
    multiply = _producer(sides[1])
    if multiply is None or multiply.name not in ("arith.mulf", "arith.muli"):
        return False
    inputs = set()
    for value in multiply.operands:
        while (producer := _producer(value)) is not None and producer.name in _CASTS:
            value = producer.operands[0]
        inputs.add(_block_argument(value))
    return inputs == {0, 1}


def _loop_roles(maps: list[list[int]], loops: int) -> list[str] | None:
    """Each loop's role (b, m, n, k) from where it appears, or None if it has none."""
    lhs, rhs, acc = (set(m) for m in maps)
    roles = []
    for loop in range(loops):
        where = (loop in lhs, loop in rhs, loop in acc)
        role = {
            (True, True, True): "b",
            (True, False, True): "m",
            (False, True, True): "n",
            (True, True, False): "k",
        }.get(where)
        if role is None:
            return None
        roles.append(role)
    return roles


def _contraction_form(op: ir.Operation) -> tuple[list[str], list[list[int]]] | None:
    """(loop roles, per-operand loop lists) when the op is a two-input contraction."""
    if op.name in MATVEC_OPS:
        return None
    if "indexing_maps" not in op.attributes or len(op.operands) != 3:
        return None
    if op.name == "linalg.generic" and not _is_multiply_add(op):
        return None
    try:
        maps = [_dims_of(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    except ValueError:  # not projected permutations (a convolution written as a generic, ...)
        return None
    loops = ir.AffineMapAttr(ir.ArrayAttr(op.attributes["indexing_maps"])[0]).value.n_dims
    roles = _loop_roles(maps, loops)
    if roles is None:
        return None
    if op.name == "linalg.generic":
        iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
        expected = ["reduction" if r == "k" else "parallel" for r in roles]
        if [i.split("<")[-1].rstrip(">") for i in iterators] != expected:
            return None
    return roles, maps


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


def _dispatch_functions(module: ir.Module):
    """(executable name, entry point name, func op) for every dispatch function."""
    for executable in _children(module.operation):
        if executable.name != "flow.executable":
            continue
        exports = [
            _symbol(op) for op in _children(executable) if op.name == "flow.executable.export"
        ]
        for inner in _children(executable):
            if inner.name != "builtin.module":
                continue
            for function in _children(inner):
                if function.name == "func.func" and _symbol(function) in exports:
                    yield _symbol(executable), _symbol(function), function


def _static_types(op: ir.Operation) -> list[ir.RankedTensorType] | str:
    """The operands' ranked tensor types, or why they are not all static."""
    types = []
    for index, operand in enumerate(op.operands):
        try:
            tensor = ir.RankedTensorType(operand.type)
        except ValueError:
            if isinstance(operand.type, ir.ShapedType):  # unranked tensor, memref
                return f"operand {index} is {operand.type}"
            continue  # a scalar (attention's scale)
        if not tensor.has_static_shape:
            return f"operand {index} is {tensor}"
        types.append(tensor)
    return types


def classify_root(op: ir.Operation, site: DispatchSite) -> Contraction | SkippedRoot | None:
    """A dispatch op as a contraction, a skipped root, or None when it is neither."""
    if op.name in ATTENTION_OPS:
        shapes = ", ".join(str(o.type) for o in op.operands)
        return SkippedRoot(op.name, "attention", f"not a matmul: {shapes}", site)
    if op.name.startswith(("linalg.conv", "linalg.depthwise_conv")):
        return SkippedRoot(op.name, "convolution", "convolutions are not tuned", site)
    if op.name in MATVEC_OPS:
        return SkippedRoot(op.name, "matrix-vector", "no m or no n dimension", site)
    if op.name not in CONTRACTION_OPS:
        return None
    form = _contraction_form(op)
    if form is None:
        return None
    roles, maps = form
    if not {"m", "n", "k"} <= set(roles):
        return SkippedRoot(op.name, "matrix-vector", f"loops {''.join(roles)}", site)
    types = _static_types(op)
    if isinstance(types, str):
        return SkippedRoot(op.name, "dynamic shape", types, site)
    lhs, rhs, acc = types
    sizes: dict[int, int] = {}
    for dims, tensor in zip(maps, (lhs, rhs, acc), strict=True):
        for dim, size in zip(dims, tensor.shape, strict=True):
            sizes[dim] = size
    element_types = [str(t.element_type) for t in (lhs, rhs, acc)]
    unsupported = sorted(set(element_types) - set(SUPPORTED_TYPES))
    if unsupported:
        return SkippedRoot(
            op.name, "element type", f"{' x '.join(element_types)}: {unsupported}", site
        )
    init = _producer(op.operands[2])
    return Contraction(
        op_name=op.name,
        loops=tuple(roles),
        loop_sizes=tuple(sizes[d] for d in range(len(roles))),
        lhs_type=element_types[0],
        rhs_type=element_types[1],
        acc_type=element_types[2],
        indexing_maps=str(op.attributes["indexing_maps"]),
        operand_loops=tuple(tuple(dims) for dims in maps),
        zero_init=init is not None and init.name == "linalg.fill",
        sites=[site],
    )


def find_contractions(module: ir.Module) -> ModelAnalysis:
    """The contraction roots of every dispatch of a module lowered to `flow`.

    Identical contractions (op, loops, sizes, element types, maps, init) become one, with
    every dispatch that holds it; attention, convolutions, matrix-vector products, dynamic
    shapes and unsupported element types are listed in `skipped` with their reason.
    """
    calls = _calls(module)
    found: dict[tuple, Contraction] = {}
    skipped: list[SkippedRoot] = []
    dispatches = 0
    for executable, entry_point, function in _dispatch_functions(module):
        dispatches += 1
        ops = [op for op in walk_ops(function) if is_linalg_op(op)]
        for op in ops:
            init = _producer(op.operands[-1]) if len(op.operands) else None
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
                location=_source_location(op.location),
            )
            result = classify_root(op, site)
            if isinstance(result, SkippedRoot):
                skipped.append(result)
            elif isinstance(result, Contraction):
                key = result._key()
                if key in found:
                    found[key].sites.extend(result.sites)
                else:
                    found[key] = result
    return ModelAnalysis(contractions=list(found.values()), skipped=skipped, dispatches=dispatches)


def analyze_model(
    path: str, compile_flags: Sequence[str], context: ir.Context | None = None
) -> ModelAnalysis:
    """lower_to_dispatches, then find_contractions."""
    return find_contractions(lower_to_dispatches(path, compile_flags, context))
