"""A model's entry function, seeded inputs for it, and its outputs compared across builds.

The measuring path checks a candidate on the dispatch against IREE's default build, and the
whole-model proof checks the tuned model against the default one: both run a module with
iree-run-module (a module that crashes is a finding, not the end of the caller) on inputs
made here and compare the outputs with a tolerance per element type.

Why the entry function's types come from the `abi` phase and not from the vmfb: IREE 3.13
puts no `iree.abi.declaration` reflection into the compiled module (`VmFunction.reflection`
is empty and every argument is a `!hal.buffer_view`). At `--compile-to=abi` the exported
function's `hal.tensor.import` / `hal.tensor.export` ops carry the plain tensor types the
compiled module takes and returns, whatever the source's types were (`!torch.vtensor`, ...).
That compile stops after input conversion and takes about 0.1 s.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from iree.compiler import ir

from autosched import processes
from autosched.errors import UserError, require_file
from autosched.ir_walk import children, symbol, walk_ops
from autosched.measure.input_files import in_argument_order, input_files, npy_array, npz_arrays
from autosched.measure.random_inputs import FLOATS, drawn_after, integer_type, random_values
from autosched.measure.worker import compare, run_tool
from autosched.model.configured import (
    DEFAULT_TIMEOUT,
    ELIDE_FLAGS,
    compile_and_parse,
)
from autosched.model.lowering import prepare_model
from autosched.ops.base import TOLERANCE

# One input may take at most this share of the machine's memory: it is drawn in float64 (8
# bytes an element, twice over while scaled) before it is converted and written, and
# iree-run-module then holds it again beside the model's own buffers.
INPUT_MEMORY_SHARE = 16
GIB = 1 << 30
# Random inputs are drawn again this many times where IREE's default build gives NaN or inf
# on them (`checked_inputs`; random_inputs.random_values says how each redraw draws).
REDRAWS = 2


# ---------------------------------------------------------------------------------------------
# The entry function and its inputs


# A dynamic dim of the model's arguments is this long in its random inputs (the user's
# inputs give their own sizes): the whole model can then be checked and timed, its static
# roots tuned and its dynamic ones listed as not tuned (issue 50).
DYNAMIC_EXTENT = 16


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]  # a dynamic dim (`dynamic`) as DYNAMIC_EXTENT
    element: str  # f32, f16, bf16, i64, i1, ...
    dynamic: tuple[int, ...] = ()  # the dims the model leaves dynamic

    @property
    def declared(self) -> str:
        """The type as the model declares it, `?` for a dynamic dim: ?x32xf32."""
        dims = ["?" if i in self.dynamic else str(d) for i, d in enumerate(self.shape)]
        return "x".join([*dims, self.element])

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether an array of `shape` is this tensor (any extent in a dynamic dim)."""
        return len(shape) == len(self.shape) and all(
            i in self.dynamic or a == b
            for i, (a, b) in enumerate(zip(shape, self.shape, strict=True))
        )

    @property
    def text(self) -> str:
        """The type as iree-run-module's --input takes it: 2x3xf32 (a scalar tensor: f32)."""
        return "x".join([*(str(d) for d in self.shape), self.element])

    @property
    def bytes(self) -> int:
        """The tensor's size in memory (i1 and other sub-byte types take a byte)."""
        return math.prod(self.shape) * _element_bytes(self.element)


@dataclass(frozen=True)
class EntryFunction:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # Inputs the function writes in place (an export's mutated argument, such as a KV cache
    # StaticCache updates: `hal.tensor.alias` onto the caller's buffer).
    written: tuple[int, ...] = ()


def _tensor_spec(value_type: ir.Type, function: str, what: str) -> TensorSpec:
    try:
        tensor = ir.RankedTensorType(value_type)
    except ValueError:
        raise UserError(f"{function}: {what} is {value_type}, not a ranked tensor") from None
    dynamic = tuple(i for i in range(tensor.rank) if tensor.is_dynamic_dim(i))
    shape = tuple(DYNAMIC_EXTENT if i in dynamic else d for i, d in enumerate(tensor.shape))
    return TensorSpec(shape, str(tensor.element_type), dynamic)


def dynamic_line(entry: EntryFunction) -> str:
    """What the model's random inputs make of its dynamic dims ('' when it has none)."""
    dynamic = [(i, spec) for i, spec in enumerate(entry.inputs) if spec.dynamic]
    if not dynamic:
        return ""
    listed = ", ".join(f"input {i} is {spec.declared}" for i, spec in dynamic)
    return (
        f"{listed}: its dynamic dims are {DYNAMIC_EXTENT} in the random inputs that check and "
        "time the whole model (--inputs gives yours); the roots of dynamic shape are not tuned"
    )


def _abi_functions(module: ir.Module) -> dict[str, ir.Operation]:
    """Name -> op of every public function IREE's ABI pass exported (`iree.abi.stub`)."""
    found = {}
    for op in children(module.operation):
        if op.name in ("util.func", "func.func") and "iree.abi.stub" in op.attributes:
            found[symbol(op)] = op
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
    written = set()
    for op in walk_ops(function):
        if op.name == "hal.tensor.import":
            number = _argument_of(op.operands[0], body)
            if number is not None:
                arguments[number] = _tensor_spec(op.results[0].type, name, f"input {number}")
        elif op.name == "hal.tensor.alias":  # the result stored into an argument's buffer
            numbers = (_argument_of(operand, body) for operand in op.operands)
            written |= {n for n in numbers if n is not None and _is_buffer_view(body, n)}
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
        written=tuple(sorted(written)),
    )


def _is_buffer_view(body: ir.Block, number: int) -> bool:
    return str(body.arguments[number].type) == "!hal.buffer_view"


def entry_names(module: ir.Module) -> list[str]:
    """The names of the functions a module compiled to `abi` exports, in module order (each
    `$async` twin and `__init` aside)."""
    return [
        n for n in _abi_functions(module) if not n.endswith("$async") and not n.startswith("__")
    ]


def read_entry_function(module: ir.Module, function: str | None = None) -> EntryFunction:
    """The entry function of a module compiled to `abi`, with its tensor types.

    Without `function`, the one exported function (its `$async` twin and `__init` aside);
    a UserError names them when there are several.
    """
    functions = _abi_functions(module)
    names = entry_names(module)
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
        return source_entry_function(source, flags, function, work, timeout, model_path)


def source_entry_function(
    source: str,
    flags: Sequence[str],
    function: str | None,
    work: str,
    timeout: float,
    model_path: str,
) -> EntryFunction:
    """`entry_function` of a model already prepared as `source` in `work` (errors name
    `model_path`)."""
    module = _abi_module(source, flags, work, timeout, model_path)
    try:
        return read_entry_function(module, function)
    except UserError as error:
        raise UserError(f"{model_path}: {error.message}") from None


def _numpy_dtype(element: str):
    if element in FLOATS:
        return FLOATS[element]
    integer = integer_type(element)
    if integer is None:
        return None  # bf16, f8 types: no numpy dtype, written as raw bits
    signed, bits = integer
    if bits == 1:
        return np.bool_
    return np.dtype(f"{'i' if signed else 'u'}{max(bits, 8) // 8}")


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 by truncation, as raw uint16 bits."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _element_bytes(element: str) -> int:
    """Bytes of one element: the width in the type's name (f16, bf16, i1, f8E4M3FN, ...)
    rounded up to a byte; 4 when the name has none."""
    bits = re.search(r"\d+", element)
    return max(8, int(bits.group())) // 8 if bits else 4


def physical_memory() -> int:
    """The machine's memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_input_sizes(entry: EntryFunction, where: str) -> None:
    """A UserError naming the first input too large to make here (see INPUT_MEMORY_SHARE),
    before any work: numpy's MemoryError would come only after the tuning."""
    memory = physical_memory()
    limit = memory // INPUT_MEMORY_SHARE
    for index, spec in enumerate(entry.inputs):
        if spec.bytes > limit:
            raise UserError(
                f"{where}: input {index} is {spec.text}, {spec.bytes / GIB:.1f} GiB: more than "
                f"1/{INPUT_MEMORY_SHARE} of this machine's {memory / GIB:.1f} GiB of memory "
                "(the limit on one input, which is made here as random numbers)"
            )


def make_inputs(entry: EntryFunction, directory: str, seed: int = 0, draw: int = 0) -> list[str]:
    """Seeded random inputs written under `directory`; returns their --input flag values.

    Floats are uniform in [-s, s) with s = 1/sqrt(largest dimension), at most 1: a model's
    activations stay in range whatever its depth of dot products (uniform [-1, 1) weights
    overflowed a 4096-wide f16 decoder layer to inf in IREE's own default build). Integers
    are in [0, 8) (valid as small indices); i1 is 0 or 1.
    A redraw (`draw` > 0, after IREE's default gave NaN or inf) draws every 1-D float
    argument in STATISTICS_RANGE, positive as a batch norm's variance must be (a bias or a
    norm's scale takes that as well as any value), and the others SHRINK**draw times smaller.
    f16/f32/f64 and integers go to `.npy` (`@file.npy`); bf16 goes to raw `.bin` with its type
    (`2x3xbf16=@file.bin`), since numpy has no bf16. Paths are absolute.
    """
    check_input_sizes(entry, entry.name)
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed + draw)
    flags = []
    for index, spec in enumerate(entry.inputs):
        values = random_values(rng, spec, draw, f"{entry.name}: input {index}")
        flags.append(_write_input(directory, index, spec, values))
    return flags


def _write_input(directory: str, index: int, spec: TensorSpec, values: np.ndarray) -> str:
    """One input written under `directory` (bf16 as raw bits); its --input flag value."""
    if spec.element == "bf16":
        path = os.path.join(directory, f"input{index}.bin")
        values = np.asarray(values, dtype=np.float32)
        _bf16_bits(values).tofile(path)
        return f"{TensorSpec(values.shape, spec.element).text}=@{path}"
    path = os.path.join(directory, f"input{index}.npy")
    np.save(path, np.asarray(values).astype(_numpy_dtype(spec.element)))
    return f"@{path}"


def load_inputs(
    path: str, entry: EntryFunction, directory: str, names: Sequence[str] = ()
) -> list[str]:
    """The user's inputs (`input_files(path)`): the arrays of an `.npz` file in argument
    order, as np.savez writes them (`arr_0`, `arr_1`, ...) or named like the arguments
    (`names`, an ONNX model's inputs), else in the file's own order; or one `.npy` file per
    argument, in argument order, as iree-run-module takes them. Each array is checked
    against the entry function's type and written under `directory` as `make_inputs` writes
    its own. A file that does not fit is one UserError naming it, the argument and what was
    expected."""
    files = input_files(path)
    for name in files:
        require_file(name)
    archive = len(files) == 1 and not files[0].endswith(".npy")
    if archive:
        arrays = npz_arrays(files[0])
        ordered = in_argument_order(arrays, names, len(entry.inputs))
        where = [files[0]] * len(ordered)
    else:
        ordered = [("", npy_array(name)) for name in files]
        where = files
    expected = len(entry.inputs)
    if len(ordered) != expected and not drawn_after(len(ordered), entry.inputs):
        what = "array(s)" if archive else ".npy file(s)"
        raise UserError(
            f"{path}: {len(ordered)} {what}, but {entry.name} takes {expected} argument(s)"
        )
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    flags = []
    for index, ((key, array), spec) in enumerate(zip(ordered, entry.inputs, strict=False)):
        _check_array(where[index], index, key, array, spec)
        flags.append(_write_input(directory, index, spec, array))
    rng = np.random.default_rng(0)  # the same draw in every proof and bucket
    for index in range(len(ordered), expected):
        values = random_values(rng, entry.inputs[index], 0, f"{path}: input {index}")
        flags.append(_write_input(directory, index, entry.inputs[index], values))
    return flags


def check_given_inputs(given: str, entry: EntryFunction, model_path: str, directory: str):
    """The user's inputs (none: nothing to check) read and checked against the model's
    arguments before any work: a file that does not fit is its UserError at once, not when
    the whole-model proof first reads it after the search."""
    if given:
        load_inputs(given, entry, directory, argument_names(model_path))


def _check_array(path: str, index: int, key: str, array: np.ndarray, spec: TensorSpec) -> None:
    """A UserError when `array` is not what argument `index` takes."""
    wanted = _numpy_dtype(spec.element)
    if spec.element == "bf16":  # numpy has no bf16: float32 (or ml_dtypes' bfloat16) is taken
        fits = array.dtype == np.float32 or array.dtype.name == "bfloat16"
        wanted_name = "float32 (for bf16)"
    else:
        fits = wanted is not None and array.dtype == np.dtype(wanted)
        wanted_name = np.dtype(wanted).name if wanted is not None else spec.element
    shape = tuple(array.shape)
    if not spec.fits(shape) or not fits:
        raise UserError(
            f"{path}: argument {index}{f' ({key})' if key else ''} is "
            f"{'x'.join(map(str, shape)) or 'a scalar'} "
            f"{array.dtype.name}, expected {spec.declared} ({wanted_name})"
        )


@dataclass
class CheckedInputs:
    """Inputs and IREE's default answer on them; `unusable` says why that answer cannot be
    compared with (NaN or inf on every draw), empty when it can."""

    flags: list[str]
    reference: list[np.ndarray]
    unusable: str = ""
    draws: int = 1  # random draws made (0: the user's inputs)


def checked_inputs(
    entry: EntryFunction,
    directory: str,
    seed: int,
    default_outputs: Callable[[list[str]], list[np.ndarray]],
    given: str = "",
    names: Sequence[str] = (),
) -> CheckedInputs:
    """Inputs on which IREE's default build (`default_outputs`, which may raise RunFailed)
    gives finite outputs: the user's `given` .npz file as it is, else seeded random inputs,
    drawn again up to REDRAWS times in a saner range (`make_inputs`) while it gives NaN or
    inf (a random batch-norm variance below zero does). Where every draw fails, the last
    draw with the reason in `unusable`: nothing can be checked on it."""
    if given:
        flags = load_inputs(given, entry, directory, names)
        reference = default_outputs(flags)
        return CheckedInputs(flags, reference, non_finite(reference, entry, given), draws=0)
    for draw in range(REDRAWS + 1):
        flags = make_inputs(entry, directory, seed, draw)
        reference = default_outputs(flags)
        why = non_finite(reference, entry, f"random inputs ({draw + 1} draws)")
        if not why:
            break
    return CheckedInputs(flags, reference, why, draws=draw + 1)


def argument_names(model_path: str) -> list[str]:
    """The names of the model's arguments where its file keeps them (an ONNX graph's inputs
    that are not initializers), else none: how the arrays of an inputs file may be named."""
    if not model_path.endswith(".onnx"):
        return []
    import onnx  # noqa: PLC0415 - an optional extra, imported where it is used

    graph = onnx.load(model_path, load_external_data=False).graph
    stored = {tensor.name for tensor in graph.initializer}
    return [value.name for value in graph.input if value.name not in stored]


def non_finite(outputs: Sequence[np.ndarray], entry: EntryFunction, inputs: str) -> str:
    """Why IREE's default answer cannot be compared with ('' when every value is finite)."""
    for index, (output, spec) in enumerate(zip(outputs, entry.outputs, strict=False)):
        if not np.all(np.isfinite(output)):
            return (
                f"IREE's default build gives NaN or inf in output {index} ({spec.text}) on {inputs}"
            )
    return ""


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
        shape = (-1,) if spec.dynamic else spec.shape  # both builds read back flat alike
        return bits.view(np.float32).reshape(shape).astype(np.float64)
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
    empty = [p for p in paths if os.path.isfile(p) and os.path.getsize(p) == 0]
    if empty:
        raise RunFailed(f"iree-run-module wrote an empty output {empty[0]} (is the disk full?)")
    try:
        return [_read_output(p, s) for p, s in zip(paths, entry.outputs, strict=True)]
    except (OSError, ValueError, EOFError) as error:  # numpy's error for a truncated file
        raise RunFailed(f"unreadable output: {error}"[:300]) from None


def output_tolerance(element: str) -> float:
    """Largest error of an output relative to its largest magnitude: 0 for integers."""
    if element in TOLERANCE:
        return TOLERANCE[element]
    if element == "f64":
        return TOLERANCE["f32"]
    return 0.0 if integer_type(element) is not None else TOLERANCE["bf16"]


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


def source_entry_functions(
    source: str, flags: Sequence[str], work: str, timeout: float, model_path: str
) -> list[EntryFunction]:
    """Every function the model prepared as `source` exports (a causal LM's prefill and
    decode), in module order, with its tensor types."""
    module = _abi_module(source, flags, work, timeout, model_path)
    try:
        return [read_entry_function(module, name) for name in entry_names(module)]
    except UserError as error:
        raise UserError(f"{model_path}: {error.message}") from None


_ABI_MODULES: dict[tuple, object] = {}  # (source, its size and time, flags) -> the parsed phase


def _abi_module(source: str, flags: Sequence[str], work: str, timeout: float, model_path: str):
    """The model compiled to IREE's `abi` phase (its entry functions' plain types), parsed;
    once per source and flags in a process (the types, the proof and each function of a
    model of several read it)."""
    stat = os.stat(source)
    key = (os.path.abspath(source), stat.st_size, stat.st_mtime_ns, tuple(flags))
    if key not in _ABI_MODULES:
        out = os.path.join(work, "abi.mlir")
        abi_flags = [*flags, "--compile-to=abi", *ELIDE_FLAGS]
        _ABI_MODULES[key] = compile_and_parse(
            source, abi_flags, out, timeout, model_path, "ABI of the"
        )
    return _ABI_MODULES[key]
