"""A model exported with dynamic dimensions (a causal LM's sequence length) fixed to the
lengths of the user's inputs, so that it can be tuned at those lengths.

IREE forms dispatches of dynamic size from a dynamic export, and autosched tunes static
problems: every root of such a model was "dynamic shape", and its whole-model proof could not
draw inputs of an unknown length. Given `--inputs FILE.npz`, each dynamic argument of the
model's function takes the shape of its array: the argument's type becomes static and a
`torch.tensor_static_info_cast` back to the dynamic type feeds the body, so IREE propagates
the length through the whole model. The results' static types are read from the model so
compiled (IREE's `abi` phase: each exported result is a `tensor.cast` of a static tensor) and
cast the same way. The tuned spec then serves that length only, and the run says so.
Without inputs, the run stops with one line that says what to give; inputs given to a model
of several functions (a causal LM's prefill and decode) are refused the same way, before
anything is measured, since they can be one function's only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from iree.compiler import ir

from autosched.errors import UserError
from autosched.ir_walk import symbol
from autosched.measure.input_files import given_arrays
from autosched.model.configured import ELIDE_FLAGS, compile_and_parse
from autosched.model.lowering import LOWERING_TIMEOUT, parse_prepared
from autosched.model.torch_ops import VTensor

CAST = "torch.tensor_static_info_cast"


SIZE_HINT = (  # what tunes a model exported with dynamic sizes
    "give --inputs FILE.npz with arrays of the size to tune at (np.savez, in argument order), "
    "or export the model at a fixed size"
)


def public_functions(module: ir.Module) -> list[ir.Operation]:
    return [
        op.operation
        for op in module.body.operations
        if op.operation.name == "func.func"
        and "sym_visibility" not in op.operation.attributes
        and op.operation.regions[0].blocks
    ]


def _torch_type(value: ir.Value) -> VTensor | None:
    try:
        return VTensor.of(value)
    except ValueError:
        return None


def dynamic_arguments(function: ir.Operation) -> list[tuple[int, VTensor]]:
    """(index, type) of each argument of a torch function with a dynamic dimension."""
    found = []
    for index, argument in enumerate(function.regions[0].blocks[0].arguments):
        tensor = _torch_type(argument)
        if tensor is not None and None in tensor.shape:
            found.append((index, tensor))
    return found


def _fixed(tensor: VTensor, shape: Sequence[int]) -> VTensor | None:
    """`tensor` with each dynamic size taken from `shape`; None where they disagree."""
    if len(shape) != len(tensor.shape):
        return None
    if any(d is not None and d != s for d, s in zip(tensor.shape, shape, strict=True)):
        return None
    return VTensor(tuple(int(s) for s in shape), tensor.dtype)


def _retype(function: ir.Operation, arguments: dict[int, ir.Type]) -> None:
    """Each argument in `arguments` given its static type, cast back to its old type for
    the body (the function's type updated)."""
    block = function.regions[0].blocks[0]
    first = list(block.operations)[0]
    for index, static in arguments.items():
        argument = block.arguments[index]
        uses = [(use.owner, use.operand_number) for use in argument.uses]
        dynamic = argument.type
        argument.set_type(static)
        with ir.InsertionPoint(first), first.location:
            cast = ir.Operation.create(CAST, results=[dynamic], operands=[argument])
        for owner, number in uses:
            owner.operands[number] = cast.result
    _update_type(function)


def _update_type(function: ir.Operation) -> None:
    block = function.regions[0].blocks[0]
    terminator = list(block.operations)[-1].operation
    inputs = [argument.type for argument in block.arguments]
    results = [value.type for value in terminator.operands]
    function.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, results))


def _retype_results(function: ir.Operation, shapes: dict[int, tuple[int, ...]]) -> None:
    """Each result in `shapes` cast to its static type before the return."""
    block = function.regions[0].blocks[0]
    terminator = list(block.operations)[-1].operation
    for index, shape in shapes.items():
        value = terminator.operands[index]
        static = VTensor(shape, VTensor.of(value).dtype).type()
        with ir.InsertionPoint(terminator), terminator.location:
            cast = ir.Operation.create(CAST, results=[static], operands=[value])
        terminator.operands[index] = cast.result
    _update_type(function)


def _static_source(value: ir.Value) -> tuple[int, ...] | None:
    """The static shape behind an exported value of the `abi` phase: through a
    `hal.tensor.barrier` (its operand of the same number) and `tensor.cast`s."""
    for _ in range(8):
        tensor = ir.RankedTensorType(value.type)
        if tensor.has_static_shape:
            return tuple(tensor.shape)
        owner = value.owner
        owner = getattr(owner, "operation", owner)
        if not isinstance(owner, ir.Operation):
            return None
        if owner.name == "tensor.cast":
            value = owner.operands[0]
        elif owner.name == "hal.tensor.barrier":
            value = owner.operands[ir.OpResult(value).result_number]
        else:
            return None
    return None


def _result_shapes(abi: ir.Module, name: str) -> dict[int, tuple[int, ...]] | None:
    """Result index -> static shape of the function's dynamic results in its `abi` form."""
    functions = {}
    for op in abi.body.operations:
        op = op.operation
        if op.name in ("util.func", "func.func") and "sym_name" in op.attributes:
            functions[symbol(op)] = op
    body = functions.get(name + "$async", functions.get(name))
    if body is None:
        return None
    terminator = list(body.regions[0].blocks[0].operations)[-1].operation
    shapes = {}
    for index, value in enumerate(terminator.operands):
        owner = value.owner
        owner = getattr(owner, "operation", owner)
        if not isinstance(owner, ir.Operation) or owner.name != "hal.tensor.export":
            continue
        exported = ir.RankedTensorType(owner.operands[0].type)
        if not exported.has_static_shape:
            shape = _static_source(owner.operands[0])
            if shape is None:
                return None
            shapes[index] = shape
    return shapes


def fixed_arguments(
    function: ir.Operation, arguments: list[tuple[int, VTensor]], inputs: str
) -> dict[int, VTensor]:
    """Each dynamic argument (`arguments`, from `dynamic_arguments`) typed at the size of
    its array in the `inputs` file; a UserError naming the file where they do not fit."""
    name = symbol(function)
    count = len(function.regions[0].blocks[0].arguments)
    arrays = given_arrays(inputs, count)
    # The arguments after the dynamic ones may be left out (random_inputs.drawn_after).
    if len(arrays) > count or any(index >= len(arrays) for index, _ in arguments):
        raise UserError(f"{inputs}: {len(arrays)} array(s), but {name} takes {count} argument(s)")
    fixed = {}
    for index, tensor in arguments:
        fixed[index] = _fixed(tensor, arrays[index].shape)
        if fixed[index] is None:
            shape = "x".join(str(d) for d in arrays[index].shape)
            raise UserError(f"{inputs}: array {index} is {shape}, not {tensor.type_text()}")
    return fixed


def retype_arguments(function: ir.Operation, fixed: dict[int, VTensor]) -> None:
    """The function's arguments in `fixed` made static (cast back for the body)."""
    with function.context, ir.Location.unknown():
        _retype(function, {index: tensor.type() for index, tensor in fixed.items()})


def static_results(
    module: ir.Module, names: Sequence[str], typed: str, build: tuple, where: str
) -> None:
    """The named functions' dynamic results made static (cast before the return), their
    sizes read from IREE's `abi` phase of `typed` (the module with static arguments);
    `build` is (flags, work folder, the model's path for messages)."""
    flags, work, model_path = build
    abi_flags = [*flags, "--compile-to=abi", *ELIDE_FLAGS]
    out = os.path.join(work, "fixed-abi.mlir")
    abi = compile_and_parse(typed, abi_flags, out, LOWERING_TIMEOUT, model_path, "ABI of the")
    functions = {symbol(f): f for f in public_functions(module)}
    for name in names:
        shapes = _result_shapes(abi, name)
        if shapes is None:
            raise UserError(f"{where}: its outputs' sizes do not follow from the inputs' sizes")
        with module.context, ir.Location.unknown():
            _retype_results(functions[name], shapes)


def write_module(module: ir.Module, path: str) -> str:
    """The module as bytecode at `path`."""
    with open(path, "wb") as handle:
        module.operation.write_bytecode(handle)
    return path


def fixed_length_model(
    model_path: str, inputs: str, flags: Sequence[str], work: str
) -> tuple[str, str]:
    """(the model to tune, the line that says at which lengths): `model_path` itself and ''
    when no argument is dynamic; else the model fixed to the shapes of the `inputs` arrays,
    written in `work`. A dynamic model without inputs (or of several functions, or whose
    inputs do not fit) is one UserError that says what to give."""
    if not model_path.endswith((".mlir", ".mlirbc")):  # ONNX: IREE's importer's own types
        return model_path, ""
    os.makedirs(work, exist_ok=True)
    context = ir.Context()
    module = parse_prepared(model_path, work, context)
    functions = public_functions(module)
    if len(functions) > 1 and inputs:
        names = ", ".join(symbol(f) for f in functions)
        raise UserError(
            f"{model_path}: --inputs {inputs} holds one function's inputs, but the model "
            f"exports {len(functions)} functions ({names}): leave --inputs out (each function "
            "is proved on seeded inputs)"
        )
    dynamic = [(f, dynamic_arguments(f)) for f in functions]
    dynamic = [(f, arguments) for f, arguments in dynamic if arguments]
    if not dynamic:
        return model_path, ""
    function, arguments = dynamic[0]
    name = symbol(function)
    described = ", ".join(f"input {i} ({t.type_text()})" for i, t in arguments)
    where = f"{model_path}: {name}: {described} of dynamic size"
    if not inputs and len(functions) == 1:  # its static roots tuned, the dynamic ones not
        return model_path, f"{where}: its dynamic roots are not tuned ({SIZE_HINT})"
    if len(functions) > 1:
        raise UserError(
            f"{where}: a model of several functions is tuned at fixed sizes only: export "
            "it at the size to tune at"
        )
    fixed = fixed_arguments(function, arguments, inputs)
    stem = os.path.splitext(os.path.basename(model_path))[0]
    retype_arguments(function, fixed)
    typed = write_module(module, os.path.join(work, f"{stem}.fixed-inputs.mlirbc"))
    static_results(module, [name], typed, (flags, work, model_path), where)
    path = write_module(module, os.path.join(work, f"{stem}.fixed.mlirbc"))
    sizes = ", ".join(f"input {i} at {t.type_text()}" for i, t in fixed.items())
    line = f"{where}: tuned at the sizes of {inputs} ({sizes}); the spec serves these sizes"
    return path, line


def model_at_input_sizes(model_path: str, inputs: str, flags: Sequence[str], work: str) -> str:
    """The model as a run with these `inputs` tuned it (`fixed_length_model`), for commands
    that build it again (`autosched compile`); without inputs, the model as it is."""
    if not inputs:
        return model_path
    return fixed_length_model(model_path, inputs, flags, work)[0]
