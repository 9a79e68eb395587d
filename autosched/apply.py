"""The whole-model proof: a tuning spec reaches its dispatches, keeps the answers, and helps.

Three questions, each answered with the real iree-compile and the real runtime:

- `compile_model`: does the model compile with the spec? (a vmfb, or a one-line UserError)
- `spec_coverage`: which configuration does each dispatch's contraction root carry with the
  spec, and which without it (IREE's default)? Read from `--compile-to=executable-configurations`
  with IREE's MLIR bindings, so a caller can check that every tuned dispatch got its config.
- `prove`: compiled with and without the spec, do both modules give the same outputs on
  seeded random inputs (a tolerance per element type), and how long does one call of the
  model's entry function take with each, timed interleaved over several rounds?

Why the entry function's types come from the `abi` phase and not from the vmfb: IREE 3.13
puts no `iree.abi.declaration` reflection into the compiled module (`VmFunction.reflection`
is empty and every argument is a `!hal.buffer_view`). At `--compile-to=abi` the exported
function's `hal.tensor.import` / `hal.tensor.export` ops carry the plain tensor types the
compiled module takes and returns, whatever the source's types were (`!torch.vtensor`, ...).
That compile stops after input conversion and takes about 0.1 s.

Every tool runs through `processes.run`: a timeout or an interrupt kills it. Outputs are read
with iree-run-module (a tuned module that crashes is a finding, not the end of the caller).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from iree.compiler import ir

from autosched import processes
from autosched.bench import time_module
from autosched.compile import compiler_path
from autosched.errors import UserError
from autosched.model import (
    Contraction,
    DispatchSite,
    classify_root,
    is_linalg_op,
    prepare_model,
    walk_ops,
)
from autosched.spec_flags import SPEC_SAFE_FLAGS
from autosched.targets.base import Target
from autosched.verify import TOLERANCE, compare, run_tool

DEFAULT_TIMEOUT = 600.0  # seconds for one compile or one tool run
CONFIG_PHASE = "executable-configurations"
# Weights are printed elided: the configurations are all that is read, and the text stays small.
_ELIDE_FLAGS = (
    "--mlir-elide-elementsattrs-if-larger=64",
    "--mlir-elide-resource-strings-if-larger=64",
)
INTEGER_HIGH = 8  # integer inputs are drawn from [0, 8): valid as small indices and counts


# ---------------------------------------------------------------------------------------------
# Compiling


def _spec_flags(spec_path: str | None, spec_flag: str) -> list[str]:
    if spec_path is None:
        return []
    if not os.path.isfile(spec_path):
        raise UserError(f"{spec_path}: no such tuning spec")
    return [f"{spec_flag}={os.path.abspath(spec_path)}", *SPEC_SAFE_FLAGS]


def _iree_compile(
    source: str, flags: Sequence[str], out_path: str, timeout: float, model_path: str
) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    finished = processes.run([compiler_path(), source, "-o", out_path, *flags], timeout)
    if finished.timed_out:
        raise UserError(f"{model_path}: iree-compile took over {timeout:g} s")
    if finished.returncode != 0:
        reason = processes.describe_failure(finished, "iree-compile")
        raise UserError(f"{model_path}: iree-compile failed: {reason}")
    return out_path


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
    spec = _spec_flags(spec_path, spec_flag)
    with tempfile.TemporaryDirectory(prefix="autosched-apply-") as work:
        source = prepare_model(model_path, work)
        return _iree_compile(source, [*flags, *spec, *extra_flags], out_path, timeout, model_path)


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
        from iree.compiler.dialects import iree_codegen

        with ir.Context():
            expected = ir.Attribute.parse(compilation_info)
            if self.compilation_info is not None:
                return str(expected) == str(ir.Attribute.parse(self.compilation_info))
            info = iree_codegen.CompilationInfoAttr(expected)
            return (str(info.lowering_config), str(info.translation_info)) == (
                self.lowering_config,
                self.translation_info,
            )


def _children(operation: ir.Operation):
    for region in operation.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation


def _symbol(operation: ir.Operation) -> str:
    return ir.StringAttr(operation.attributes["sym_name"]).value


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
    for executable in _children(module.operation):
        if executable.name != "hal.executable":
            continue
        for variant in _children(executable):
            if variant.name != "hal.executable.variant":
                continue
            for inner in _children(variant):
                if inner.name != "builtin.module":
                    continue
                for function in _children(inner):
                    if function.name != "func.func":
                        continue
                    found.extend(_function_configs(_symbol(executable), function, calls))
    return found


def _function_configs(executable: str, function: ir.Operation, calls: Counter):
    entry_point = _symbol(function)
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
        if not isinstance(result, Contraction):
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
        )


def _configs(
    source: str, flags: Sequence[str], work: str, name: str, timeout: float, model_path: str
) -> list[DispatchConfig]:
    out = os.path.join(work, name)
    extra = [f"--compile-to={CONFIG_PHASE}", *_ELIDE_FLAGS]
    module = _compile_and_parse(source, [*flags, *extra], out, timeout, model_path, "configured")
    return read_dispatch_configs(module)


def _compile_and_parse(
    source: str, flags: Sequence[str], out: str, timeout: float, model_path: str, what: str
) -> ir.Module:
    """iree-compile to an MLIR phase, read back with the bindings."""
    _iree_compile(source, flags, out, timeout, model_path)
    with open(out, "rb") as file:
        text = file.read()
    try:
        return ir.Module.parse(text, ir.Context())
    except ir.MLIRError as error:
        message = str(error).splitlines()[0]
        raise UserError(f"{model_path}: the {what} model does not parse: {message}") from None


def dispatch_configs(
    model_path: str,
    flags: Sequence[str],
    spec_path: str | None = None,
    *,
    spec_flag: str = Target.tuning_spec_flag,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[DispatchConfig]:
    """Each dispatch's contraction root and its configuration, with the spec if one is given."""
    spec = _spec_flags(spec_path, spec_flag)
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
) -> list[DispatchConfig]:
    """`dispatch_configs` with the spec, each paired with IREE's default for the same root.

    Two compiles to `executable-configurations`, with and without the spec. A dispatch the
    spec configured has `changed` set and `carries(...)` its configuration; one it missed
    carries the default.
    """
    spec = _spec_flags(spec_path, spec_flag)
    with tempfile.TemporaryDirectory(prefix="autosched-apply-") as work:
        source = prepare_model(model_path, work)
        tuned = _configs(source, [*flags, *spec], work, "tuned.mlir", timeout, model_path)
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


# ---------------------------------------------------------------------------------------------
# The entry function and its inputs


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    element: str  # f32, f16, bf16, i64, i1, ...

    @property
    def text(self) -> str:
        """The type as iree-run-module's --input takes it: 2x3xf32 (a scalar tensor: f32)."""
        return "x".join([*(str(d) for d in self.shape), self.element])


@dataclass(frozen=True)
class EntryFunction:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def _tensor_spec(value_type: ir.Type, function: str, what: str) -> TensorSpec:
    try:
        tensor = ir.RankedTensorType(value_type)
    except ValueError:
        raise UserError(f"{function}: {what} is {value_type}, not a ranked tensor") from None
    if not tensor.has_static_shape:
        raise UserError(f"{function}: {what} is {tensor}: dynamic shapes are not supported")
    return TensorSpec(tuple(tensor.shape), str(tensor.element_type))


def _abi_functions(module: ir.Module) -> dict[str, ir.Operation]:
    """Name -> op of every public function IREE's ABI pass exported (`iree.abi.stub`)."""
    found = {}
    for op in _children(module.operation):
        if op.name in ("util.func", "func.func") and "iree.abi.stub" in op.attributes:
            found[_symbol(op)] = op
    return found


def _argument_of(value: ir.Value, block: ir.Block) -> int | None:
    """The argument number when `value` is an argument of `block`."""
    try:
        argument = ir.BlockArgument(value)
    except ValueError:
        return None
    return argument.arg_number if argument.owner == block else None


UNUSED_INPUT = TensorSpec((1,), "f32")


def _imports_exports(function: ir.Operation, name: str) -> EntryFunction:
    """Input types from the function's hal.tensor.import ops (by argument), outputs from its
    hal.tensor.export ops (by returned value)."""
    body = function.regions[0].blocks[0]
    arguments = {}
    for op in walk_ops(function):
        if op.name == "hal.tensor.import":
            number = _argument_of(op.operands[0], body)
            if number is not None:
                arguments[number] = _tensor_spec(op.results[0].type, name, f"input {number}")
    terminator = list(body.operations)[-1].operation
    returned = list(terminator.operands)
    exported: dict[int, TensorSpec] = {}  # result index -> type
    buffer_views = [
        index
        for index, argument in enumerate(body.arguments)
        if str(argument.type) == "!hal.buffer_view"
    ]
    for index in buffer_views:
        # An argument the model never reads has no import (torch.export drops a repeated
        # argument's uses, for one): any small tensor will do for it.
        arguments.setdefault(index, UNUSED_INPUT)
    for index, value in enumerate(returned):
        owner = value.owner
        owner = getattr(owner, "operation", owner)
        if isinstance(owner, ir.Operation) and owner.name == "hal.tensor.export":
            exported[index] = _tensor_spec(owner.operands[0].type, name, f"output {index}")
        else:
            raise UserError(f"{name}: output {index} is {value.type}, not an exported tensor")
    return EntryFunction(
        name=name,
        inputs=tuple(arguments[i] for i in sorted(arguments)),
        outputs=tuple(exported[i] for i in sorted(exported)),
    )


def read_entry_function(module: ir.Module, function: str | None = None) -> EntryFunction:
    """The entry function of a module compiled to `abi`, with its tensor types.

    Without `function`, the one exported function (its `$async` twin and `__init` aside);
    a UserError names them when there are several.
    """
    functions = _abi_functions(module)
    names = [n for n in functions if not n.endswith("$async") and not n.startswith("__")]
    if function is None:
        if len(names) != 1:
            listed = ", ".join(names) or "none"
            raise UserError(f"the model exports {len(names)} functions ({listed}): name one")
        function = names[0]
    if function not in functions:
        raise UserError(f"the model has no function {function!r} (it has {', '.join(names)})")
    # The synchronous function calls its `$async` twin, which imports and exports the tensors.
    body = functions.get(function + "$async", functions[function])
    return _imports_exports(body, function)


def entry_function(
    model_path: str,
    flags: Sequence[str],
    function: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> EntryFunction:
    """The model's entry function and the plain tensor types its compiled form takes."""
    with tempfile.TemporaryDirectory(prefix="autosched-apply-") as work:
        source = prepare_model(model_path, work)
        return _entry_function(source, flags, function, work, timeout, model_path)


def _entry_function(
    source: str,
    flags: Sequence[str],
    function: str | None,
    work: str,
    timeout: float,
    model_path: str,
) -> EntryFunction:
    out = os.path.join(work, "abi.mlir")
    flags = [*flags, "--compile-to=abi", *_ELIDE_FLAGS]
    module = _compile_and_parse(source, flags, out, timeout, model_path, "ABI of the")
    try:
        return read_entry_function(module, function)
    except UserError as error:
        raise UserError(f"{model_path}: {error.message}") from None


def _integer(element: str) -> tuple[bool, int] | None:
    """(signed, bits) for i8, si32, ui16, ...; None for a float type."""
    for prefix, signed in (("ui", False), ("si", True), ("i", True)):
        if element.startswith(prefix) and element[len(prefix) :].isdigit():
            return signed, int(element[len(prefix) :])
    return None


_FLOATS = {"f16": np.float16, "f32": np.float32, "f64": np.float64}


def _numpy_dtype(element: str):
    if element in _FLOATS:
        return _FLOATS[element]
    integer = _integer(element)
    if integer is None:
        return None  # bf16, f8 types: no numpy dtype, written as raw bits
    signed, bits = integer
    if bits == 1:
        return np.bool_
    return np.dtype(f"{'i' if signed else 'u'}{max(bits, 8) // 8}")


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 by truncation, as raw uint16 bits."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _scale(spec: TensorSpec) -> float:
    return 1.0 / max(1.0, float(max(spec.shape, default=1))) ** 0.5


def make_inputs(entry: EntryFunction, directory: str, seed: int = 0) -> list[str]:
    """Seeded random inputs written under `directory`; returns their --input flag values.

    Floats are uniform in [-s, s) with s = 1/sqrt(largest dimension), at most 1: a model's
    activations stay in range whatever its depth of dot products (uniform [-1, 1) weights
    overflowed a 4096-wide f16 decoder layer to inf in IREE's own default build). Integers
    are in [0, 8) (valid as small indices); i1 is 0 or 1.
    f16/f32/f64 and integers go to `.npy` (`@file.npy`); bf16 goes to raw `.bin` with its type
    (`2x3xbf16=@file.bin`), since numpy has no bf16. Paths are absolute.
    """
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    flags = []
    for index, spec in enumerate(entry.inputs):
        integer = _integer(spec.element)
        if spec.element == "bf16":
            path = os.path.join(directory, f"input{index}.bin")
            _bf16_bits(rng.uniform(-1.0, 1.0, size=spec.shape) * _scale(spec)).tofile(path)
            flags.append(f"{spec.text}=@{path}")
            continue
        if integer is not None:
            high = 2 if integer[1] == 1 else INTEGER_HIGH
            values = rng.integers(0, high, size=spec.shape)
        elif spec.element in _FLOATS:
            values = rng.uniform(-1.0, 1.0, size=spec.shape) * _scale(spec)
        else:
            raise UserError(f"{entry.name}: input {index} is {spec.text}: no random inputs of it")
        path = os.path.join(directory, f"input{index}.npy")
        np.save(path, np.asarray(values).astype(_numpy_dtype(spec.element)))
        flags.append(f"@{path}")
    return flags


# ---------------------------------------------------------------------------------------------
# Running and comparing


def _output_path(directory: str, index: int, spec: TensorSpec) -> str:
    return os.path.join(directory, f"output{index}" + (".npy" if _npy_type(spec) else ".bin"))


def _npy_type(spec: TensorSpec) -> bool:
    return _numpy_dtype(spec.element) is not None


def _read_output(path: str, spec: TensorSpec) -> np.ndarray:
    """An output as float64 (exact for every type iree-run-module writes)."""
    if _npy_type(spec):
        return np.load(path).astype(np.float64)
    if spec.element == "bf16":
        bits = np.fromfile(path, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(spec.shape).astype(np.float64)
    raise UserError(f"output type {spec.text} cannot be read back")


class RunFailed(Exception):
    """iree-run-module failed on a module; the message is one line."""


def run_outputs(
    vmfb: str,
    device: str,
    entry: EntryFunction,
    inputs: Sequence[str],
    directory: str,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[np.ndarray]:
    """One call of the entry function with iree-run-module; every output as float64.

    Raises RunFailed when the tool fails, times out or writes something unreadable.
    """
    os.makedirs(directory, exist_ok=True)
    paths = [_output_path(directory, i, spec) for i, spec in enumerate(entry.outputs)]
    command = [
        run_tool(),
        f"--module={vmfb}",
        f"--device={device}",
        f"--function={entry.name}",
        *[f"--input={flag}" for flag in inputs],
        *[f"--output=@{path}" for path in paths],
    ]
    finished = processes.run(command, timeout)
    if finished.timed_out:
        raise RunFailed(f"iree-run-module took over {timeout:g} s")
    if finished.returncode != 0:
        raise RunFailed(processes.describe_failure(finished, "iree-run-module"))
    try:
        return [_read_output(p, s) for p, s in zip(paths, entry.outputs, strict=True)]
    except (OSError, ValueError) as error:
        raise RunFailed(f"unreadable output: {error}"[:300]) from None


def output_tolerance(element: str) -> float:
    """Largest error of an output relative to its largest magnitude: 0 for integers."""
    if element in TOLERANCE:
        return TOLERANCE[element]
    if element == "f64":
        return TOLERANCE["f32"]
    return 0.0 if _integer(element) is not None else TOLERANCE["bf16"]


def compare_outputs(
    outputs: Sequence[np.ndarray],
    references: Sequence[np.ndarray],
    entry: EntryFunction,
    tolerance: float | None = None,
) -> tuple[bool, float, str]:
    """(all match, largest relative error, why not) of outputs against references."""
    worst, reasons = 0.0, []
    for index, (output, reference, spec) in enumerate(
        zip(outputs, references, entry.outputs, strict=True)
    ):
        allowed = output_tolerance(spec.element) if tolerance is None else tolerance
        if not np.all(np.isfinite(reference)):
            reasons.append(
                f"output {index} ({spec.text}): IREE's default build gives NaN or inf on these "
                "inputs, so the outputs cannot be compared"
            )
            worst = float("nan")
            continue
        verdict = compare(output, reference, allowed)
        if verdict.max_error is not None and not verdict.max_error <= worst:
            worst = verdict.max_error  # NaN sticks
        if verdict.status != "correct":
            reasons.append(f"output {index} ({spec.text}): {verdict.message}")
    if len(outputs) != len(references):
        reasons.append(f"{len(outputs)} outputs, expected {len(references)}")
    return not reasons, worst, "; ".join(reasons)


# ---------------------------------------------------------------------------------------------
# The proof


@dataclass
class CustomProof:
    """The model with custom kernels in place of contractions (and the spec for the rest),
    against the same default and spec-only builds of the same proof."""

    replaced: int  # contractions that run a custom kernel
    ms: float | None = None
    cv: float | None = None
    speedup: float | None = None  # default over this build
    over_spec: float | None = None  # the spec-only build over this one
    outputs_match: bool = False
    max_error: float | None = None
    rounds_ms: list[float] = dataclasses.field(default_factory=list)
    message: str = ""


@dataclass
class ModelProof:
    """The model compiled without and with the spec: answers compared, calls timed.

    Times are one call of `function` in ms: the median of the rounds' medians, and the
    coefficient of variation of those round medians. `speedup` is default over tuned.
    """

    function: str
    default_ms: float
    tuned_ms: float | None
    default_cv: float
    tuned_cv: float | None
    speedup: float | None
    outputs_match: bool
    max_error: float | None  # largest output error relative to its largest magnitude
    outputs: int = 0
    default_rounds_ms: list[float] = dataclasses.field(default_factory=list)
    tuned_rounds_ms: list[float] = dataclasses.field(default_factory=list)
    message: str = ""  # why the outputs differ, or why the tuned module could not be timed
    custom: CustomProof | None = None  # with `custom_spec`: the build with custom kernels
    default_only: bool = False  # no spec and no custom spec: the default alone was timed


def _summary(rounds: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(rounds)
    cv = statistics.pstdev(rounds) / mean if mean else 0.0
    return statistics.median(rounds), cv


@dataclass
class _Build:
    """One build of the model in a proof: its answers against the default's, its times."""

    name: str
    vmfb: str | None
    runs: bool = True
    match: bool = True
    max_error: float | None = None
    message: str = ""
    rounds: list[float] = dataclasses.field(default_factory=list)


def prove(
    model_path: str,
    flags: Sequence[str],
    spec_path: str | None,
    device: str,
    seed: int = 0,
    rounds: int = 5,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    spec_flag: str = Target.tuning_spec_flag,
    function: str | None = None,
    repetitions: int = 3,
    min_time: float = 0.05,
    tolerance: float | None = None,
    work_dir: str | None = None,
    custom_spec: str | None = None,
) -> ModelProof:
    """Compiles the model without and with the spec, compares outputs, times both.

    Inputs are random with `seed`; outputs are compared per element type (verify.TOLERANCE,
    integers exactly) unless `tolerance` is given. Timing: `rounds` rounds, each timing every
    build with iree-benchmark-module (`repetitions` x `min_time`), in an order that turns
    each round. A compile failure, or a default module that fails to run, is a UserError; a
    tuned module that fails to run or to be timed is a proof with `outputs_match` False or no
    tuned time, and the reason in `message`. `work_dir` keeps the vmfbs, inputs and outputs.
    With `custom_spec` (substitution.py) a third build runs custom kernels in place of the
    contractions it matches, with the spec for the rest (`custom`). With neither spec, the
    default alone is compiled and timed (`default_only`): a run that found nothing faster
    still reports the model's time.
    """
    if rounds < 1:
        raise UserError(f"rounds is {rounds}: at least 1")
    spec = _spec_flags(spec_path, spec_flag)
    with tempfile.TemporaryDirectory(prefix="autosched-proof-") as scratch:
        work = work_dir or scratch
        source = prepare_model(model_path, work)
        default = _Build(
            "default",
            _iree_compile(source, flags, os.path.join(work, "default.vmfb"), timeout, model_path),
        )
        builds, tuned = [default], _Build("tuned", None, runs=False)
        if spec_path is not None or custom_spec:
            out = os.path.join(work, "tuned.vmfb")
            tuned.vmfb = _iree_compile(source, [*flags, *spec], out, timeout, model_path)
            tuned.runs = True
            builds.append(tuned)
        custom = None
        if custom_spec:
            custom = _custom_build(source, custom_spec, flags, spec, work, timeout)
            builds.append(custom[0])
        entry = _entry_function(source, flags, function, work, timeout, model_path)
        inputs = make_inputs(entry, os.path.join(work, "inputs"), seed)
        try:
            expected = run_outputs(
                default.vmfb, device, entry, inputs, os.path.join(work, "default"), timeout
            )
        except RunFailed as error:
            raise UserError(f"{model_path}: the model without the spec fails: {error}") from None
        for build in builds[1:]:
            if not build.runs:
                continue
            try:
                outputs = run_outputs(
                    build.vmfb, device, entry, inputs, os.path.join(work, build.name), timeout
                )
                build.match, build.max_error, build.message = compare_outputs(
                    outputs, expected, entry, tolerance
                )
            except RunFailed as error:
                build.match, build.runs = False, False
                build.message = f"the {build.name} model fails: {error}"
        for round_index in range(rounds):
            shift = round_index % len(builds)
            for build in builds[shift:] + builds[:shift]:
                if not build.runs:
                    continue
                timing = time_module(
                    build.vmfb,
                    device,
                    inputs,
                    dispatch_repeat=1,
                    repetitions=repetitions,
                    min_time=min_time,
                    timeout=timeout,
                    function=entry.name,
                )
                if timing.status == "ok":
                    build.rounds.append(timing.median_ms)
                    continue
                if build is default:
                    raise UserError(
                        f"{model_path}: timing the model without the spec failed: {timing.message}"
                    )
                build.runs, build.rounds = False, []
                build.message = "; ".join(
                    m
                    for m in (build.message, f"timing the {build.name} model: {timing.message}")
                    if m
                )
    default_ms, default_cv = _summary(default.rounds)
    tuned_ms = tuned_cv = speedup = None
    if tuned.rounds:
        tuned_ms, tuned_cv = _summary(tuned.rounds)
        speedup = default_ms / tuned_ms if tuned_ms > 0 else None
    return ModelProof(
        function=entry.name,
        default_ms=default_ms,
        tuned_ms=tuned_ms,
        default_cv=default_cv,
        tuned_cv=tuned_cv,
        speedup=speedup,
        outputs_match=tuned.match,
        max_error=tuned.max_error,
        outputs=len(entry.outputs),
        default_rounds_ms=default.rounds,
        tuned_rounds_ms=tuned.rounds,
        message=tuned.message,
        custom=_custom_proof(custom, default_ms, tuned_ms) if custom else None,
        default_only=len(builds) == 1,
    )


def _custom_build(source, custom_spec, flags, spec, work, timeout) -> tuple[_Build, int]:
    """The model with custom kernels in place of their contractions (a build that does not
    compile is one that does not run: the spec-only proof stands)."""
    from autosched.substitution import RESUME_FLAG, rewrite_model

    build = _Build("custom", None)
    try:
        rewritten, replaced = rewrite_model(
            source, custom_spec, flags, os.path.join(work, "custom.mlir"), timeout
        )
        build.vmfb = _iree_compile(
            rewritten,
            [*flags, *spec, RESUME_FLAG],
            os.path.join(work, "custom.vmfb"),
            timeout,
            source,
        )
    except (RuntimeError, UserError) as error:
        build.runs, build.match, build.message = False, False, f"does not compile: {error}"
        return build, 0
    if not replaced:
        build.runs, build.match = False, False
        build.message = "the custom-kernel spec matched no contraction of the model"
    return build, replaced


def _custom_proof(custom: tuple[_Build, int], default_ms: float, tuned_ms: float | None):
    build, replaced = custom
    proof = CustomProof(
        replaced=replaced,
        outputs_match=build.match and build.runs,
        max_error=build.max_error,
        rounds_ms=build.rounds,
        message=build.message,
    )
    if build.rounds:
        proof.ms, proof.cv = _summary(build.rounds)
        proof.speedup = default_ms / proof.ms
        proof.over_spec = tuned_ms / proof.ms if tuned_ms else None
    return proof
