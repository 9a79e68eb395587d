"""Which configuration each dispatch's contraction root carries, read back with the bindings.

A successful compile proves nothing about a spec: one whose matcher misses the root op IREE
configures leaves IREE's default in place and says nothing. On CUDA that happened to every
unit-batch matmul of a transformers model (issue 22): IREE's dumped dispatch benchmark,
compiled again from the input phase, ran dispatch creation a second time, the root became a
5-loop generic, and the 4-loop matcher matched nothing, so every candidate timed IREE's
default. So configurations are read, never assumed: from a compile to
`executable-configurations` (`dispatch_configs`, and `spec_coverage` against IREE's default),
or from what a build dumped (`--iree-hal-dump-executable-configurations-to`, written after
strategy selection: `check_build`), for the configured root's form and whether it carries
the candidate's `compilation_info`.

The compile helpers live here, the lowest layer that compiles a model: the module I/O and the
proof build on them.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import iree_codegen

from autosched import processes
from autosched.compile import CONFIGS_FLAG, compiler_path, unloaded_spec
from autosched.errors import UserError
from autosched.interrupts import critical
from autosched.ir_walk import children, scratch_context, symbol, walk_ops
from autosched.model.lowering import ModelAnalysis, is_linalg_op, prepare_model
from autosched.ops.base import DispatchSite, SkippedRoot
from autosched.ops.registry import classify_root, kind_of
from autosched.outputs.spec_flags import SPEC_SAFE_FLAGS
from autosched.targets.base import Target

DEFAULT_TIMEOUT = 600.0  # seconds for one compile or one tool run
CONFIG_PHASE = "executable-configurations"
# Weights are printed elided: the configurations are all that is read, and the text stays small.
ELIDE_FLAGS = (
    "--mlir-elide-elementsattrs-if-larger=64",
    "--mlir-elide-resource-strings-if-larger=64",
)


# ---------------------------------------------------------------------------------------------
# Compiling


def tuning_spec_flags(spec_path: str | None, spec_flag: str) -> list[str]:
    """The iree-compile flags that apply the spec at `spec_path` (none without one)."""
    if spec_path is None:
        return []
    if not os.path.isfile(spec_path):
        raise UserError(f"{spec_path}: no such tuning spec")
    return [f"{spec_flag}={os.path.abspath(spec_path)}", *SPEC_SAFE_FLAGS]


def iree_compile(
    source: str, flags: Sequence[str], out_path: str, timeout: float, model_path: str
) -> str:
    """iree-compile `source` to `out_path`; a failure or a timeout is a one-line UserError."""
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    finished = processes.run([compiler_path(), source, "-o", out_path, *flags], timeout)
    if finished.timed_out:
        raise UserError(f"{model_path}: iree-compile took over {timeout:g} s")
    if finished.returncode != 0:
        reason = processes.describe_failure(finished, "iree-compile")
        raise UserError(f"{model_path}: iree-compile failed: {reason}")
    unloaded = unloaded_spec(finished.stderr)
    if unloaded:
        raise UserError(f"{model_path}: iree-compile could not load the tuning spec: {unloaded}")
    return out_path


def compile_and_parse(
    source: str, flags: Sequence[str], out: str, timeout: float, model_path: str, what: str
) -> ir.Module:
    """iree-compile to an MLIR phase, read back with the bindings."""
    iree_compile(source, flags, out, timeout, model_path)
    with open(out, "rb") as file:
        text = file.read()
    try:
        return ir.Module.parse(text, ir.Context())
    except ir.MLIRError as error:
        message = str(error).splitlines()[0]
        raise UserError(f"{model_path}: the {what} model does not parse: {message}") from None


# ---------------------------------------------------------------------------------------------
# Which configuration each dispatch carries


@dataclass(frozen=True)
class DispatchConfig:
    """A dispatch's contraction root and the configuration it carries after configuration.

    `lowering_config` is the root op's attribute and `translation_info` its dispatch
    function's, as MLIR prints them (None where absent); `compilation_info` is set only when
    the op still carries the combined attribute. The `default_*` fields are what the same
    compile without the spec gave (filled in by `spec_coverage`).
    """

    executable: str  # the hal.executable symbol
    entry_point: str  # the dispatch function, named as in model.analyze_model's sites
    calls: int  # stream.cmd.dispatch ops that launch it
    op_name: str  # the root: linalg.matmul, linalg.batch_matmul, linalg.generic, ...
    contraction: str  # model.Contraction.name: the signature a spec's matcher targets
    indexing_maps: str
    lowering_config: str | None
    translation_info: str | None
    compilation_info: str | None = None
    default_lowering_config: str | None = None
    default_translation_info: str | None = None
    root: object = dataclasses.field(default=None, compare=False)  # the kind's problem of it

    @property
    def changed(self) -> bool:
        """The spec changed this dispatch's configuration from IREE's default.

        A spec that gives exactly IREE's default configuration reads as unchanged: use
        `carries` to check a given configuration.
        """
        return (self.lowering_config, self.translation_info) != (
            self.default_lowering_config,
            self.default_translation_info,
        )

    def carries(self, compilation_info: str) -> bool:
        """The dispatch carries this `#iree_codegen.compilation_info<...>` (attribute text).

        Compared as parsed attributes, so spacing and aliases in the text do not matter.
        """
        with scratch_context():
            expected = ir.Attribute.parse(compilation_info)
            if self.compilation_info is not None:
                return str(expected) == str(ir.Attribute.parse(self.compilation_info))
            info = iree_codegen.CompilationInfoAttr(expected)
            return (str(info.lowering_config), str(info.translation_info)) == (
                self.lowering_config,
                self.translation_info,
            )


def _attribute(operation: ir.Operation, name: str) -> str | None:
    return str(operation.attributes[name]) if name in operation.attributes else None


def _stream_calls(module: ir.Module) -> Counter:
    """(executable, entry point) -> how many stream.cmd.dispatch ops launch it."""
    calls: Counter = Counter()
    for op in walk_ops(module.operation):
        if op.name == "stream.cmd.dispatch" and "entry_points" in op.attributes:
            for entry in ir.ArrayAttr(op.attributes["entry_points"]):
                path = ir.SymbolRefAttr(entry).value  # [executable, variant, export]
                calls[(path[0], path[-1])] += 1
    return calls


def read_dispatch_configs(module: ir.Module) -> list[DispatchConfig]:
    """The contraction roots of a module compiled to `executable-configurations`.

    One entry per contraction root per dispatch function, in the module's order (a function
    appears once per executable variant). Roots that are not contractions (attention,
    element-wise dispatches, ...) are left out.
    """
    calls = _stream_calls(module)
    found = []
    for executable in children(module.operation):
        if executable.name != "hal.executable":
            continue
        for variant in children(executable):
            if variant.name != "hal.executable.variant":
                continue
            for inner in children(variant):
                if inner.name != "builtin.module":
                    continue
                for function in children(inner):
                    if function.name != "func.func":
                        continue
                    found.extend(_function_configs(symbol(executable), function, calls))
    return found


def _function_configs(executable: str, function: ir.Operation, calls: Counter):
    entry_point = symbol(function)
    site = DispatchSite(
        executable=executable,
        entry_point=entry_point,
        calls=calls[(executable, entry_point)],
        fused_ops=(),
        location="",
    )
    for op in walk_ops(function):
        if not is_linalg_op(op):
            continue
        result = classify_root(op, site)
        if result is None or isinstance(result, SkippedRoot):
            continue
        yield DispatchConfig(
            executable=executable,
            entry_point=entry_point,
            calls=site.calls,
            op_name=op.name,
            contraction=result.name,
            indexing_maps=result.indexing_maps,
            lowering_config=_attribute(op, "lowering_config"),
            translation_info=_attribute(function, "translation_info"),
            compilation_info=_attribute(op, "compilation_info"),
            root=result,
        )


def _configs(
    source: str, flags: Sequence[str], work: str, name: str, timeout: float, model_path: str
) -> list[DispatchConfig]:
    out = os.path.join(work, name)
    extra = [f"--compile-to={CONFIG_PHASE}", *ELIDE_FLAGS]
    module = compile_and_parse(source, [*flags, *extra], out, timeout, model_path, "configured")
    return read_dispatch_configs(module)


def dispatch_configs(
    model_path: str,
    flags: Sequence[str],
    spec_path: str | None = None,
    *,
    spec_flag: str = Target.tuning_spec_flag,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[DispatchConfig]:
    """Each dispatch's contraction root and its configuration, with the spec if one is given."""
    spec = tuning_spec_flags(spec_path, spec_flag)
    with tempfile.TemporaryDirectory(prefix="autosched-apply-") as work:
        source = prepare_model(model_path, work)
        return _configs(source, [*flags, *spec], work, "configured.mlir", timeout, model_path)


def spec_coverage(
    model_path: str,
    flags: Sequence[str],
    spec_path: str,
    *,
    spec_flag: str = Target.tuning_spec_flag,
    timeout: float = DEFAULT_TIMEOUT,
    default: list[DispatchConfig] | None = None,
    tuned: list[DispatchConfig] | None = None,
) -> list[DispatchConfig]:
    """`dispatch_configs` with the spec, each paired with IREE's default for the same root.

    Two compiles to `executable-configurations`, with and without the spec, less those
    given: `default` and `tuned` are the roots of such compiles done already (a run's
    builds, model_build.py). A dispatch the spec configured has `changed` set and
    `carries(...)` its configuration; one it missed carries the default.
    """
    spec = tuning_spec_flags(spec_path, spec_flag)
    with tempfile.TemporaryDirectory(prefix="autosched-apply-") as work:
        if tuned is None or default is None:
            source = prepare_model(model_path, work)
        if tuned is None:
            tuned = _configs(source, [*flags, *spec], work, "tuned.mlir", timeout, model_path)
        if default is None:
            default = _configs(source, flags, work, "default.mlir", timeout, model_path)
    defaults: dict[tuple[str, str], list[DispatchConfig]] = {}
    for config in default:
        defaults.setdefault((config.entry_point, config.contraction), []).append(config)
    paired = []
    for config in tuned:
        same = defaults.get((config.entry_point, config.contraction))
        base = same.pop(0) if same else None
        paired.append(
            dataclasses.replace(
                config,
                default_lowering_config=base.lowering_config if base else None,
                default_translation_info=base.translation_info if base else None,
            )
        )
    return paired


def in_configured_form(
    analysis: ModelAnalysis, model_path: str, flags: Sequence[str], configured: str | None = None
):
    """The analysis with each root of a kind that IREE re-forms before configuring it
    (`RootOpKind.configured_form`) replaced by its root as configured, with the same sites.

    On the CPU a convolution's dispatch at `flow` has its unit batch folded away, and gets it
    back by the time it is configured: a spec written from the `flow` form matches nothing.
    One compile to `executable-configurations` (without a spec) gives the configured form,
    unless `configured` names the module such a compile wrote already.
    """
    if not any(kind_of(r).configured_form for r in analysis.roots):
        return analysis
    found = roots_in(configured) if configured else dispatch_configs(model_path, flags)
    configured_roots = {c.entry_point: c.root for c in found}
    roots: dict = {}
    for root in analysis.roots:
        if kind_of(root).configured_form:
            same = configured_roots.get(root.sites[0].entry_point)
            if same is not None and same.kind == root.kind:
                root = dataclasses.replace(same, sites=list(root.sites))
        key = (type(root).__name__, root.key())
        if key in roots:
            roots[key].sites.extend(root.sites)
        else:
            roots[key] = root
    return dataclasses.replace(analysis, roots=list(roots.values()))


# ---------------------------------------------------------------------------------------------
# What a build dumped


def configs_folder(output: str) -> str:
    """Where the build of `output` writes its configured executables."""
    return output + ".configs"


def dump_flag(output: str) -> str:
    """The flag that makes the build of `output` write its configured executables (the
    folder is emptied as the build starts: `compile.compile_one`)."""
    return f"{CONFIGS_FLAG}={configs_folder(output)}"


def roots_in(path: str) -> list[DispatchConfig]:
    """The contraction roots of a module at `executable-configurations` (or of one dumped
    configured executable), read with the bindings."""
    return read_dispatch_configs(ir.Module.parseFile(path, scratch_context()))


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


def check_build(output: str, expected: str | Sequence[str] | None, only: str = "") -> Applied:
    """Whether the build of `output` carries `expected` (compilation_info text, or several
    of which a root may carry any: a problem's forms; None for IREE's default, whose form
    alone is read); with `only`, on the roots of that problem
    name alone (a whole model's build).

    A signal waits for the end: the bindings' first use of an attribute class imports
    Python code from inside a C++ call, and an interrupt raised there aborted the process
    (SIGABRT, its records' clean-up skipped) instead of ending the run as Ctrl-C."""
    with critical():
        roots = configured_roots(configs_folder(output))
        if only:
            roots = [root for root in roots if root.contraction == only]
        return check_roots(roots, expected)


def check_roots(roots: list[DispatchConfig], expected: str | Sequence[str] | None) -> Applied:
    """Whether every configured root carries `expected` (or one of them; None: nothing is
    expected)."""
    form = form_of(roots[0]) if roots else ""
    if expected is None:
        return Applied(True, form)
    if not roots:
        return Applied(False, form, "the build has no configured contraction root")
    options = (expected,) if isinstance(expected, str) else tuple(expected)
    missed = [root for root in roots if not any(root.carries(e) for e in options)]
    if not missed:
        return Applied(True, form)
    got = missed[0].lowering_config or missed[0].compilation_info or "no configuration"
    return Applied(
        False,
        form,
        f"the configured root ({form_of(missed[0])}) carries {got}, not the candidate's",
    )


def compile_model(
    model_path: str,
    flags: Sequence[str],
    spec_path: str | None = None,
    *,
    out_path: str,
    spec_flag: str = Target.tuning_spec_flag,
    timeout: float = DEFAULT_TIMEOUT,
    extra_flags: Sequence[str] = (),
) -> str:
    """Compiles the model to `out_path` (a vmfb unless `extra_flags` stop earlier); returns it.

    `flags` choose the target (`CpuTarget.compile_flags()`); with `spec_path` the spec is
    passed as `{spec_flag}={spec_path}` (the target's `tuning_spec_flag`: on CUDA that is
    `--iree-codegen-transform-dialect-library`). A failure or a timeout is a one-line UserError.
    """
    spec = tuning_spec_flags(spec_path, spec_flag)
    with tempfile.TemporaryDirectory(prefix="autosched-apply-") as work:
        source = prepare_model(model_path, work)
        return iree_compile(source, [*flags, *spec, *extra_flags], out_path, timeout, model_path)
