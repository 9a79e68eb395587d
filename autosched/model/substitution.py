"""Custom-kernel winners as a transform spec: each matched contraction is replaced by a call
to a function that runs the kernel as a `hal.dispatch.extern` (issue 12).

A lowering configuration cannot say "use this PTX", so the winners of the custom family
replace their ops before IREE forms dispatches. The spec matches a contraction as the tuning
spec does (element types, indexing maps, every dimension, in any form: named op or
linalg.generic) whose accumulator is a `linalg.fill` (the family computes C = A·B from
zero), and `cast_and_call`s the kernel's function in its place, as IREE's own custom-kernel
samples do.

A contraction that accumulates in f32 and whose result only goes through a `truncf` to its
input type (what torch exports for f16 and bf16 layers) is replaced together with that
`truncf` by the kernel built to store the narrow type itself: its f32 accumulator is
rounded as `truncf` rounds (to nearest even), and the f32 tensor (537 MB for a decoder's
q·kᵀ) is neither written nor read again.

Two routes apply it:
- a module written by hand: `iree-compile --iree-preprocessing-transform-spec-filename=SPEC`
  (its ops already have their final form when preprocessing runs);
- a model (`rewrite_model`): the model is lowered to global optimization, where each
  contraction has the form its dispatch will have (a torch `nn.Linear` is a broadcast
  batch_matmul of a transposed weight before it, a matmul with a transposed map after), the
  spec is applied there with iree-opt, and iree-compile goes on from that phase.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

from autosched import processes
from autosched.kernels.base import KernelBinary, KernelFamily
from autosched.kernels.flash_attention import kernel as flash
from autosched.kernels.igemm_conv import kernel as igemm
from autosched.kernels.matmul_triton.kernel import MIN_DOT
from autosched.kernels.registry import families_for, family_of
from autosched.model.attention_sources import (
    AbsorbedAttention,
    absorbed_function,
    copy_matcher_lines,
    output_matcher_lines,
)
from autosched.model.conv_padding import PAD, padded_extents, padded_form
from autosched.model.convolution_ops import ELEMENTWISE_FUSION
from autosched.model.epilogues import problem_key
from autosched.model.narrow_reshapes import ReshapeChain, chain_matcher_lines, reshaped_function
from autosched.model.stored_weights import (
    StoredLayout,
    stored_layout,
    stored_problem,
    transpose_matcher,
    wrapper_function,
)
from autosched.ops.base import ANY_OP, ANY_VALUE
from autosched.ops.epilogue import ROTATED, Epilogue
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kernel import tensor_type
from autosched.outputs.spec import match_contraction

SPEC_FLAG = "--iree-preprocessing-transform-spec-filename"
REWRITE_PHASE = "global-optimization"  # where a model's contractions have their dispatch form
RESUME_FLAG = f"--compile-from={REWRITE_PHASE}"  # compiles a rewritten model the rest of the way
FUNCTION_PREFIX = "autosched_custom_"


NARROW_FROM = "f32"  # an accumulator type whose truncf consumer the kernel can take over


@dataclass(frozen=True)
class Substitute:
    """One winner as the spec uses it: its kernel, and the kernel that stores the narrow
    type for the contraction-then-truncf form (None where the output is already narrow)."""

    problem: MatmulProblem
    params: object  # the family's kernel parameters
    binary: KernelBinary
    narrow: tuple[MatmulProblem, KernelBinary] | None = None
    # B made by transposing a stored weight (model/stored_weights.py): the layout, the
    # kernel that reads the weight as stored, and its narrow twin.
    stored: tuple[StoredLayout, MatmulProblem, KernelBinary, KernelBinary | None] | None = None
    # Reshapes between the contraction and its truncf in the model (narrow_reshapes.py).
    chains: tuple[ReshapeChain, ...] = ()
    # Epilogues in the model (model/epilogues.py), each with its kernel, and for a matmul
    # whose B is a stored weight's transpose the kernel that reads the weight as stored.
    epilogues: tuple[tuple[Epilogue, KernelBinary, KernelBinary | None], ...] = ()
    # An attention written over its copied operands' sources (attention_sources.py), each
    # form with its kernel.
    absorbed: tuple[tuple[AbsorbedAttention, KernelBinary], ...] = ()
    family: KernelFamily | None = None  # the kernel family (kernels/) its kernels are of


def narrowed(problem: MatmulProblem) -> MatmulProblem | None:
    """The problem with its output in its input type, when its f32 output may be followed
    by a truncf to that type (and a family of its kind absorbs that truncf); else None."""
    family = next((f for f in families_for(problem.kind) if f.absorbs.narrow_output), None)
    if family is None or problem.acc_type != NARROW_FROM or family.unsupported(problem):
        return None
    narrow = dataclasses.replace(problem, acc_type=problem.lhs_type, sites=[])
    return None if family.unsupported(narrow) else narrow


def substitutable(problem: MatmulProblem) -> str | None:
    """Why no kernel family of the problem's kind can replace it, or None."""
    reasons = [f.unsupported(problem) for f in families_for(problem.kind)]
    if None in reasons:
        return None
    return reasons[0] if reasons else f"no kernel family for {problem.kind} ops"


def _matcher(index: int, problem: MatmulProblem, layout: StoredLayout | None = None) -> str:
    """Matches the problem's zero-filled contractions (with `layout`: only those whose B
    is the transpose of a stored weight, yielded too)."""
    if problem.kind == "attention":
        return _attention_matcher(index, problem)
    name = f"match_stored_{index}" if layout else f"match_custom_{index}"
    transposed = transpose_matcher("%op", problem, layout) if layout else []
    yielded = ["%op", "%t"] if layout else ["%op", *_padded(problem)]
    return "\n".join(
        [
            f"  transform.named_sequence @{name}"
            f"(%op: {ANY_OP} {{transform.readonly}}) -> ({', '.join([ANY_OP] * len(yielded))}) {{",
            match_contraction(problem).rstrip("\n"),
            # The family starts from zero: the accumulator must come from a linalg.fill.
            f"    %init = transform.get_producer_of_operand %op[2] : ({ANY_OP}) -> {ANY_OP}",
            f'    transform.match.operation_name %init ["linalg.fill"] : {ANY_OP}',
            *transposed,
            *_image_matcher(problem, "%op"),
            f"    transform.yield {', '.join(yielded)} : {', '.join([ANY_OP] * len(yielded))}",
            "  }",
        ]
    )


def _image_matcher(problem, handle: str) -> list[str]:
    """A convolution's image type (its padded extents; the spec's sizes are the loops'):
    the kernel's function takes that type alone. Where the kernel pads the image itself,
    the image must be a `tensor.pad` (bound to `%pad`) of the type it takes."""
    if problem.kind != "convolution":
        return []
    (image, _), _ = igemm.operand_tensor_types(problem)
    operand = image
    if problem.padding:
        operand = tensor_type(padded_extents(problem), problem.lhs_type)
    lines = [
        f"    %conv_image = transform.get_operand {handle}[0] : ({ANY_OP}) -> {ANY_VALUE}",
        f"    transform.iree.match.cast_compatible_type %conv_image = {operand} : {ANY_VALUE}",
    ]
    if problem.padding:
        lines += [
            f"    %pad = transform.get_producer_of_operand {handle}[0] : ({ANY_OP}) -> {ANY_OP}",
            f'    transform.match.operation_name %pad ["{PAD}"] : {ANY_OP}',
            f"    %pad_in = transform.get_operand %pad[0] : ({ANY_OP}) -> {ANY_VALUE}",
            f"    transform.iree.match.cast_compatible_type %pad_in = {image} : {ANY_VALUE}",
        ]
    return lines


def _padded(problem) -> list[str]:
    """The handle a matcher yields for the pad a convolution's kernel applies itself."""
    return ["%pad"] if problem.kind == "convolution" and problem.padding else []


def _conv_operands(problem, handle: str) -> list[tuple[str, str]]:
    """The kernel's image and filter: the op's first two operands, the image before its
    pad where the kernel pads it."""
    return [("%pad", "0"), (handle, "1")] if _padded(problem) else [(handle, "0, 1")]


def _attention_matcher(
    index: int, problem, absorbed: tuple[int, AbsorbedAttention] | None = None
) -> str:
    """Matches an `iree_linalg_ext.attention` by the exact type of q, k, v, the mask and
    the output (the custom route refuses a model where two different attentions share
    them: `drivers/custom_route.ambiguous`); with `absorbed` (its index and form), only
    where its operands are the copies it names, whose handles it yields too, and, where it
    writes the result's copy, rooted at that copy."""
    inputs, out = flash.operand_tensor_types(problem)
    typed = list(enumerate(inputs))
    if problem.mask_type:
        mask = f"tensor<{'x'.join(map(str, problem.operand_shape(3)))}x{problem.mask_type}>"
        typed.append((4, mask))
    typed.append((len(typed) + 1, out))  # the init, after the scale and the mask
    form = absorbed[1] if absorbed else None
    yielded = ["%op", *(f"%copy{s.operand}" for s in form.inputs)] if form else ["%op"]
    root = "%root" if form and form.output else "%op"
    yielded = ["%root", *yielded] if root == "%root" else yielded
    handles = ", ".join([ANY_OP] * len(yielded))
    name = f"match_absorbed_{index}_{absorbed[0]}" if absorbed else f"match_custom_{index}"
    lines = [
        f"  transform.named_sequence @{name}"
        f"(%{root[1:]}: {ANY_OP} {{transform.readonly}}) -> ({handles}) {{",
        *(output_matcher_lines(form) if root == "%root" else []),
        f'    transform.match.operation_name %op ["{flash.ATTENTION_OP}"] : {ANY_OP}',
    ]
    for position, tensor in typed:
        lines += [
            f"    %operand{position} = transform.get_operand %op[{position}]"
            f" : ({ANY_OP}) -> {ANY_VALUE}",
            f"    transform.iree.match.cast_compatible_type %operand{position} = {tensor}"
            f" : {ANY_VALUE}",
        ]
    lines += copy_matcher_lines(form) if form else []
    return "\n".join([*lines, f"    transform.yield {', '.join(yielded)} : {handles}", "  }"])


def _narrow_name(index: int, layout: StoredLayout | None, chain: int | None) -> str:
    """`narrow_{i}`, `narrow_stored_{i}`, and `_r{j}` for the j-th reshape chain."""
    name = f"narrow_stored_{index}" if layout else f"narrow_{index}"
    return name if chain is None else f"{name}_r{chain}"


def _narrow_matcher(
    index: int,
    problem: MatmulProblem,
    narrow: str,
    layout: StoredLayout | None = None,
    chain: tuple[int, ReshapeChain] | None = None,
) -> str:
    """Matches a `truncf` to `narrow` (an elementwise linalg.generic of nothing else) whose
    input is one of the problem's zero-filled contractions; yields both (with `layout`: only
    where the contraction's B is a stored weight's transpose, yielded third). With `chain`
    (its index and itself), the truncf reads the contraction through that chain's reshapes
    and has its shape."""
    name = "match_" + _narrow_name(index, layout, chain[0] if chain else None)
    yielded = ["%op", "%mm", "%t"] if layout else ["%op", "%mm", *_padded(problem)]
    handles = ", ".join([ANY_OP] * len(yielded))
    return "\n".join(
        [
            f"  transform.named_sequence @{name}"
            f"(%op: {ANY_OP} {{transform.readonly}}) -> ({handles}) {{",
            *_truncf_of_contraction("%op", problem, narrow, layout, chain),
            f"    transform.yield {', '.join(yielded)} : {handles}",
            "  }",
        ]
    )


def _truncf_of_contraction(
    handle: str,
    problem: MatmulProblem,
    narrow: str,
    layout: StoredLayout | None = None,
    chain: tuple[int, ReshapeChain] | None = None,
) -> list[str]:
    """Transform lines that match `handle` as a truncf to `narrow` of one of the problem's
    zero-filled contractions, bound to `%mm` (see `_narrow_matcher`)."""
    rank = len(chain[1].shape) if chain else len(problem.output_shape)
    dims = ", ".join(f"d{i}" for i in range(rank))
    identity = f"affine_map<({dims}) -> ({dims})>"
    shape = list(chain[1].shape) if chain else ["?"] * rank
    wide, thin = tensor_type(shape, NARROW_FROM), tensor_type(shape, narrow)
    parallel = ", ".join(['"parallel"'] * rank)
    if chain is None:
        producer = [
            f"    %mm = transform.get_producer_of_operand {handle}[0] : ({ANY_OP}) -> {ANY_OP}"
        ]
    else:  # the DAG's static types pin the truncf's shape
        producer = chain_matcher_lines(handle, chain[1], ANY_OP)
    return [
        f"    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root {handle} {{",
        f"    ^bb0(%in: {wide}, %out: {thin}):",
        f"      %r = linalg.generic {{indexing_maps = [{identity}, {identity}], "
        f"iterator_types = [{parallel}]}} ins(%in : {wide}) outs(%out : {thin}) {{",
        f"      ^bb1(%a: {NARROW_FROM}, %b: {narrow}):",
        f"        %c = arith.truncf %a : {NARROW_FROM} to {narrow}",
        f"        linalg.yield %c : {narrow}",
        f"      }} -> {thin}",
        f"    }} : ({ANY_OP}) -> ({ANY_VALUE}, {ANY_VALUE})",
        *producer,
        match_contraction(problem, "%mm").rstrip("\n"),
        # The truncf is the contraction's only user: else its f32 result is still needed.
        f"    transform.match.structured %mm : {ANY_OP} {{",
        f"    ^bb2(%produced: {ANY_OP}):",
        f"      %user = transform.match.structured.result %produced[0] single"
        f" : ({ANY_OP}) -> {ANY_OP}",
        "      transform.match.structured.yield",
        "    }",
        f"    %init = transform.get_producer_of_operand %mm[2] : ({ANY_OP}) -> {ANY_OP}",
        f'    transform.match.operation_name %init ["linalg.fill"] : {ANY_OP}',
        *(transpose_matcher("%mm", problem, layout) if layout else []),
        *_image_matcher(problem, "%mm"),
    ]


def _epilogue_matcher(
    index: int,
    j: int,
    problem: MatmulProblem,
    epilogue: Epilogue,
    layout: StoredLayout | None = None,
) -> str:
    """Matches the epilogue (a generic of its input and result types, and no more inputs;
    its result has the contraction's output shape, so it reduces nothing) whose input at its
    place is the contraction's rounded result: a truncf that is its only user, of one of the
    problem's zero-filled contractions (through the epilogue's reshapes; with `layout`: only
    where B is a stored weight's transpose). Yields the epilogue, the truncf, the
    contraction (and the transpose). The epilogue's body is compared where it captures no
    constant (`_exact_epilogue`); else a transform matcher cannot follow it, and
    model/epilogues.py writes arms only for types that tell the model's epilogues apart."""
    yielded = ["%op", "%tr", "%mm", *(["%t"] if layout else _padded(problem))]
    handles = ", ".join([ANY_OP] * len(yielded))
    param = "!transform.param<i64>"
    stored = "_stored" if layout else ""
    lines = [
        f"  transform.named_sequence @match_epilogue{stored}_{index}_{j}"
        f"(%op: {ANY_OP} {{transform.readonly}}) -> ({handles}) {{",
        f'    transform.match.operation_name %op ["linalg.generic"] : {ANY_OP}',
        *_exact_epilogue(epilogue),
        f"    transform.match.structured %op : {ANY_OP} {{",
        f"    ^bb0(%ep: {ANY_OP}):",
        f"      %count = transform.match.structured.num_inputs %ep : ({ANY_OP}) -> {param}",
        f"      %want = transform.param.constant {len(epilogue.inputs)} : i64 -> {param}",
        f"      transform.match.param.cmpi eq %count, %want : {param}",
        "      transform.match.structured.yield",
        "    }",
    ]
    for position, operand in enumerate(epilogue.inputs):
        lines += [
            f"    %ep{position} = transform.get_operand %op[{position}]"
            f" : ({ANY_OP}) -> {ANY_VALUE}",
            f"    transform.iree.match.cast_compatible_type %ep{position} = {operand.type}"
            f" : {ANY_VALUE}",
        ]
        if operand.kind == ROTATED:
            lines += _rotation_matcher(position)
    chain = (0, ReshapeChain(epilogue.reshapes, epilogue.acc_shape)) if epilogue.reshapes else None
    lines += [
        f"    %ep_out = transform.get_operand %op[{len(epilogue.inputs)}]"
        f" : ({ANY_OP}) -> {ANY_VALUE}",
        f"    transform.iree.match.cast_compatible_type %ep_out = {epilogue.out_type}"
        f" : {ANY_VALUE}",
        f"    %tr = transform.get_producer_of_operand %op[{epilogue.acc_position}]"
        f" : ({ANY_OP}) -> {ANY_OP}",
        *([] if epilogue.period > 1 else _only_user("%tr")),
        *_truncf_of_contraction("%tr", problem, epilogue.narrow, layout, chain),
        f"    transform.yield {', '.join(yielded)} : {handles}",
        "  }",
    ]
    return "\n".join(lines)


def _only_user(handle: str) -> list[str]:
    """Transform lines that match `handle`'s result as having one user (the epilogue)."""
    return [
        f"    transform.match.structured {handle} : {ANY_OP} {{",
        f"    ^bb0(%rounded: {ANY_OP}):",
        f"      %only = transform.match.structured.result %rounded[0] single"
        f" : ({ANY_OP}) -> {ANY_OP}",
        "      transform.match.structured.yield",
        "    }",
    ]


def _rotation_matcher(position: int) -> list[str]:
    """Transform lines that match the epilogue's operand at `position` as the end of RoPE's
    rotate_half chain (model/rotary.py): a collapse_shape of a generic of no inputs. The
    chain's body was checked when it was read; an arm with one is written only where no
    other epilogue of its types was left unread (model/epilogues.py `unambiguous`)."""
    param = "!transform.param<i64>"
    return [
        f"    %collapse{position} = transform.get_producer_of_operand %op[{position}]"
        f" : ({ANY_OP}) -> {ANY_OP}",
        f'    transform.match.operation_name %collapse{position} ["tensor.collapse_shape"]'
        f" : {ANY_OP}",
        f"    %rotate{position} = transform.get_producer_of_operand %collapse{position}[0]"
        f" : ({ANY_OP}) -> {ANY_OP}",
        f"    transform.match.structured %rotate{position} : {ANY_OP} {{",
        f"    ^bb0(%r: {ANY_OP}):",
        f"      %inputs = transform.match.structured.num_inputs %r : ({ANY_OP}) -> {param}",
        f"      %none = transform.param.constant 0 : i64 -> {param}",
        f"      transform.match.param.cmpi eq %inputs, %none : {param}",
        "      transform.match.structured.yield",
        "    }",
    ]


def _exact_epilogue(epilogue: Epilogue) -> list[str]:
    """Transform lines that match the epilogue's generic exactly (maps and body), where its
    body captures nothing (`Epilogue.dag`); none otherwise."""
    if not epilogue.dag:
        return []
    return [
        "    %dag_ins, %dag_outs = transform.iree.match.cast_compatible_dag_from_root %op {",
        *(f"    {line}" for line in epilogue.dag.splitlines()),
        f"    }} : ({ANY_OP}) -> ({ANY_VALUE}, {ANY_VALUE})",
    ]


def _epilogue_arms(i: int, w: Substitute) -> list[tuple[str, str, str]]:
    """(arm, matcher, caller) of each epilogue of a winner: the epilogue op replaced by the
    kernel that computes it, on the contraction's A (image) and B (filter; a stored weight
    where B is its transpose, that arm first) and the epilogue's other inputs."""
    arms = []
    convolution = w.problem.kind == "convolution"
    for j, (epilogue, _, stored_binary) in enumerate(w.epilogues):
        function = f"{FUNCTION_PREFIX}{i}_e{j}"
        extras = ", ".join(str(position) for position, _ in epilogue.extras)
        extra_sources = [("%op", extras)] if extras else []
        variants = [(None, function, _conv_operands(w.problem, "%mm"))]
        if stored_binary is not None:
            variants.insert(0, (w.stored[0], f"{function}_stored", [("%mm", "0"), ("%t", "0")]))
        for layout, called, sources in variants:
            stored = "_stored" if layout else ""
            params = ["%op", "%tr", "%mm", *(["%t"] if layout else _padded(w.problem))]
            callees = (f"{called}_kernel",) if convolution or layout else ()
            caller = _caller(
                f"call_epilogue{stored}_{i}_{j}", called, params, [*sources, *extra_sources],
                callees,
            )  # fmt: skip
            arms.append(
                (
                    f"@match_epilogue{stored}_{i}_{j} -> @call_epilogue{stored}_{i}_{j}",
                    _epilogue_matcher(i, j, w.problem, epilogue, layout),
                    caller,
                )
            )
    return arms


def _caller(
    name: str,
    function: str,
    params: list[str],
    sources: list[tuple[str, str]],
    callees: tuple[str, ...] = (),
) -> str:
    """Calls `function` in place of the matched op's result (`params`: the matcher's handles,
    the first the op replaced) on the operands `sources` names (handle, operand positions):
    a contraction's A and B, an attention's q, k, v, or A and the stored weight. `callees`:
    functions `function` calls, imported first."""
    signature = ", ".join(f"{p}: {ANY_OP} {{transform.readonly}}" for p in params)
    lines = [
        f"  transform.named_sequence @{name}({signature}) {{",
        f"    %module = transform.util.get_nearest_symbol_table {params[0]}"
        f" : ({ANY_OP}) -> {ANY_OP}",
        *(
            f"    %callee{i} = transform.util.import_symbol @{callee} into %module "
            f"if undefined : ({ANY_OP}) -> {ANY_OP}"
            for i, callee in enumerate(callees)
        ),
        f"    %func = transform.util.import_symbol @{function} into %module "
        f"if undefined : ({ANY_OP}) -> {ANY_OP}",
    ]
    names = ["%ins"] if len(sources) == 1 else [f"%in{i}" for i in range(len(sources))]
    for value, (handle, positions) in zip(names, sources, strict=True):
        lines.append(
            f"    {value} = transform.get_operand {handle}[{positions}] : ({ANY_OP}) -> {ANY_VALUE}"
        )
    if len(sources) > 1:
        lines.append(f"    %ins = transform.merge_handles {', '.join(names)} : {ANY_VALUE}")
    return "\n".join(
        [
            *lines,
            f"    %outs = transform.get_result {params[0]}[all] : ({ANY_OP}) -> {ANY_VALUE}",
            f"    transform.util.cast_and_call %func(%ins) -> %outs before {params[0]} {{",
            "      transform.type_conversion.tensor.cast_shape_dynamic_dims",
            f"    }} : ({ANY_OP}, {ANY_VALUE}, {ANY_VALUE}, {ANY_OP}) -> {ANY_OP}",
            "    transform.yield",
            "  }",
        ]
    )


def _operands(problem) -> str:
    """The matched op's operands its kernel takes: A and B, or an attention's q, k, v."""
    return "0, 1, 2" if problem.kind == "attention" else "0, 1"


def _functions(i: int, w: Substitute, executable_target: str) -> list[str]:
    """The util.funcs a winner's arms call: its kernel, its narrow twin, and for a stored
    weight the kernels that read it as stored with their wrappers."""
    name = f"{FUNCTION_PREFIX}{i}"
    extern = w.family.extern_function

    def kernel(problem, params, binary, called):
        return extern(problem, params, binary, executable_target, called, "util.func")

    functions = [kernel(w.problem, w.params, w.binary, name)]
    functions += _epilogue_functions(name, w, executable_target)
    for j, (absorbed, binary) in enumerate(w.absorbed):
        called = f"{name}_absorbed{j}"
        functions += [
            kernel(absorbed.problem, w.params, binary, f"{called}_kernel"),
            absorbed_function(called, f"{called}_kernel", w.problem, absorbed),
        ]
    if w.narrow is not None:
        narrow, binary = w.narrow
        functions.append(kernel(narrow, w.family.narrow_params(w.params), binary, f"{name}_narrow"))
    if w.stored is not None:
        layout, problem, binary, narrow_binary = w.stored
        functions += [
            kernel(problem, w.params, binary, f"{name}_stored_kernel"),
            wrapper_function(
                f"{name}_stored", f"{name}_stored_kernel", w.problem, layout, w.problem.acc_type
            ),
        ]
        if narrow_binary is not None:
            narrow_problem = dataclasses.replace(problem, acc_type=w.narrow[0].acc_type)
            functions += [
                kernel(
                    narrow_problem,
                    w.family.narrow_params(w.params),
                    narrow_binary,
                    f"{name}_ns_kernel",
                ),
                wrapper_function(
                    f"{name}_narrow_stored",
                    f"{name}_ns_kernel",
                    w.problem,
                    layout,
                    narrow_problem.acc_type,
                ),
            ]
    return functions + _reshaped_functions(name, w)


def _epilogue_functions(name: str, w: Substitute, executable_target: str) -> list[str]:
    """For each epilogue of a winner: its kernel's function (`{name}_e{j}`), and for a
    matmul whose B is a stored weight's transpose the kernel that reads it as stored with
    its wrapper (`{name}_e{j}_stored`)."""
    functions = []
    for j, (epilogue, binary, stored_binary) in enumerate(w.epilogues):
        called = f"{name}_e{j}"
        if w.problem.kind == "convolution":
            functions.append(
                w.family.extern_function(
                    w.problem, w.params, binary, executable_target, called, "util.func",
                    epilogue,
                )
            )  # fmt: skip
            continue
        params = w.family.narrow_params(w.params)
        functions.append(
            w.family.extern_function(
                w.narrow[0], params, binary, executable_target, called, "util.func", epilogue
            )
        )
        if stored_binary is None:
            continue
        layout, problem, *_ = w.stored
        narrow_problem = dataclasses.replace(problem, acc_type=epilogue.narrow)
        extras = [operand.type for _, operand in epilogue.extras]
        functions += [
            w.family.extern_function(
                narrow_problem, params, stored_binary, executable_target,
                f"{called}_stored_kernel", "util.func", epilogue,
            ),
            wrapper_function(
                f"{called}_stored", f"{called}_stored_kernel", w.problem, layout,
                epilogue.narrow, extras, epilogue.out_type,
            ),
        ]  # fmt: skip
    return functions


def _reshaped_functions(name: str, w: Substitute) -> list[str]:
    """For each reshape chain of a narrowed winner: its narrow kernel (and the one that
    reads the weight as stored) with the result reshaped to the truncf's shape."""
    if w.narrow is None or not w.chains:
        return []
    narrow_type = w.narrow[0].acc_type
    result = tensor_type(w.problem.acc_shape, narrow_type)
    lhs = tensor_type(w.problem.lhs_shape, w.problem.lhs_type)
    operands = [("narrow", tensor_type(w.problem.rhs_shape, w.problem.rhs_type))]
    if w.stored is not None and w.stored[3] is not None:
        operands.append(("narrow_stored", tensor_type(w.stored[0].shape, w.problem.rhs_type)))
    functions = []
    for j, chain in enumerate(w.chains):
        reshaped = tensor_type(list(chain.shape), narrow_type)
        for kind, rhs in operands:
            functions.append(
                reshaped_function(
                    f"{name}_{kind}_r{j}", f"{name}_{kind}", [lhs, rhs], result, reshaped
                )
            )
    return functions


def _narrow_arms(i: int, w: Substitute) -> list[tuple[str, str, str]]:
    """(arm, matcher, caller) of each narrow form of a winner, the reshaped and stored-weight
    ones first: the truncf read through each reshape chain, then read directly; in each,
    B as a stored weight's transpose before B as it is."""
    prefix = f"{FUNCTION_PREFIX}{i}"
    narrow_type = w.narrow[0].acc_type
    layouts: list[StoredLayout | None] = [None]
    if w.stored is not None and w.stored[3] is not None:
        layouts.insert(0, w.stored[0])
    arms = []
    for chain in [*enumerate(w.chains), None]:
        suffix = f"_r{chain[0]}" if chain else ""
        for layout in layouts:
            name = _narrow_name(i, layout, chain[0] if chain else None)
            if layout is None:
                function = f"{prefix}_narrow"
                params = ["%op", "%mm", *_padded(w.problem)]
                sources = _conv_operands(w.problem, "%mm")
                callees = (function,) if chain else ()
                if w.problem.kind == "convolution":  # its function calls its kernel
                    callees = (f"{function}_kernel",)
            else:
                function, params = f"{prefix}_narrow_stored", ["%op", "%mm", "%t"]
                sources = [("%mm", "0"), ("%t", "0")]
                callees = (f"{prefix}_ns_kernel", function) if chain else (f"{prefix}_ns_kernel",)
            arms.append(
                (
                    f"@match_{name} -> @call_{name}",
                    _narrow_matcher(i, w.problem, narrow_type, layout, chain),
                    _caller(f"call_{name}", function + suffix, params, sources, callees),
                )
            )
    return arms


def _arms(i: int, w: Substitute) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
    """(epilogue arms, narrow arms, plain arms, matchers, callers) of one winner, most
    specific first: a stored weight's transpose absorbed before the contraction alone."""
    prefix = f"{FUNCTION_PREFIX}{i}"
    stored = w.stored[0] if w.stored is not None else None
    epilogue_arms, narrow_arms, plain_arms, matchers, callers = [], [], [], [], []
    for arm, matcher, caller in _epilogue_arms(i, w):
        epilogue_arms.append(arm)
        matchers.append(matcher)
        callers.append(caller)
    for arm, matcher, caller in _narrow_arms(i, w) if w.narrow is not None else []:
        narrow_arms.append(arm)
        matchers.append(matcher)
        callers.append(caller)
    if stored is not None:
        plain_arms.append(f"@match_stored_{i} -> @call_stored_{i}")
        matchers.append(_matcher(i, w.problem, stored))
        callers.append(
            _caller(
                f"call_stored_{i}",
                f"{prefix}_stored",
                ["%op", "%t"],
                [("%op", "0"), ("%t", "0")],
                (f"{prefix}_stored_kernel",),
            )
        )
    for j, (absorbed, _) in enumerate(w.absorbed):
        copied = sorted(source.operand for source in absorbed.inputs)
        sources = [(f"%copy{o}", "0") if o in copied else ("%op", str(o)) for o in range(3)]
        params = ["%op", *(f"%copy{o}" for o in copied)]
        # One that writes the result's copy is rooted there, so it is matched in the first
        # pass, before the attention alone is.
        arms = epilogue_arms if absorbed.output else plain_arms
        arms.append(f"@match_absorbed_{i}_{j} -> @call_absorbed_{i}_{j}")
        matchers.append(_attention_matcher(i, w.problem, (j, absorbed)))
        callers.append(
            _caller(
                f"call_absorbed_{i}_{j}", f"{prefix}_absorbed{j}",
                ["%root", *params] if absorbed.output else params, sources,
                (f"{prefix}_absorbed{j}_kernel",),
            )
        )  # fmt: skip
    plain_arms.append(f"@match_custom_{i} -> @call_custom_{i}")
    matchers.append(_matcher(i, w.problem))
    # A convolution's function puts its operands channels-last and calls its kernel.
    callees = (f"{prefix}_kernel",) if w.problem.kind == "convolution" else ()
    callers.append(
        _caller(
            f"call_custom_{i}",
            prefix,
            ["%op", *_padded(w.problem)],
            _conv_operands(w.problem, "%op")
            if w.problem.kind == "convolution"
            else [("%op", _operands(w.problem))],
            callees,
        )  # fmt: skip
    )
    return epilogue_arms, narrow_arms, plain_arms, matchers, callers


def _fused_first() -> list[str]:
    """IREE's elementwise fusion, as dispatch creation runs it first: a convolution's op
    form (and its epilogue) are read from the fused model (model/convolution_ops.py)."""
    return [
        f'    %fusing = transform.structured.match ops{{["util.func"]}} in %module '
        f": ({ANY_OP}) -> {ANY_OP}",
        f"    transform.foreach %fusing : {ANY_OP} {{",
        f"      ^bb0(%f: {ANY_OP}):",
        f'        %fused = transform.apply_registered_pass "{ELEMENTWISE_FUSION}" to %f '
        f": ({ANY_OP}) -> {ANY_OP}",
        "    }",
    ]


def substitution_spec(winners: list[Substitute], executable_target: str) -> str:
    """The preprocessing spec that puts each winner's kernel in place of its op: first every
    contraction-then-truncf pair that a narrow kernel covers, then the contractions left;
    in each pass a contraction whose B is a stored weight's transpose takes that weight."""
    functions, epilogue_arms, narrow_arms, plain_arms, matchers, callers = [], [], [], [], [], []
    for i, w in enumerate(winners):
        functions += _functions(i, w, executable_target)
        epilogue, narrow, plain, matched, called = _arms(i, w)
        epilogue_arms += epilogue
        narrow_arms += narrow
        plain_arms += plain
        matchers += matched
        callers += called
    # Each pass walks the ops in order: a truncf comes before the epilogue that reads it,
    # so the epilogues are matched in a pass of their own, first.
    passes = [", ".join(epilogue_arms), ", ".join(narrow_arms), ", ".join(plain_arms)]
    main = [f"  transform.named_sequence @__transform_main(%module: {ANY_OP}) {{"]
    # Epilogues, pads and absorbed copies are read from the fused model: the spec fuses too.
    if any(w.problem.kind == "convolution" or w.epilogues or w.absorbed for w in winners):
        main += _fused_first()
    # The narrow pass must see the contractions unreplaced; each pass matches the functions
    # afresh (a pass's matching invalidates the handles it walked).
    for index, arms in enumerate(filter(None, passes)):
        main += [
            f'    %funcs{index} = transform.structured.match ops{{["func.func", "util.func"]}} '
            f"in %module : ({ANY_OP}) -> {ANY_OP}",
            f"    transform.foreach %funcs{index} : {ANY_OP} {{",
            f"      ^bb1(%f: {ANY_OP}):",
            f"        transform.foreach_match in %f {arms} : ({ANY_OP}) -> ({ANY_OP})",
            "    }",
        ]
    main += [
        f"    transform.apply_dce to %module : {ANY_OP}",
        f'    transform.apply_registered_pass "inline" to %module : ({ANY_OP}) -> {ANY_OP}',
        "    transform.yield",
        "  }",
    ]
    body = "\n".join([*functions, *matchers, *callers, "\n".join(main)])
    return f"module attributes {{transform.with_named_sequence}} {{\n{body}\n}}\n"


def write_substitution(
    path: str,
    winners: list[tuple[MatmulProblem, dict]],
    target,
    chains: dict[str, set[ReshapeChain]] | None = None,
    epilogues: dict[str, list[Epilogue]] | None = None,
    absorbed: dict[str, list[AbsorbedAttention]] | None = None,
    paddings: dict[str, tuple] | None = None,
) -> list[str]:
    """Writes the spec for the custom winners ((problem, point) pairs of the CUDA target)
    that can be substituted, their PTX beside it; returns why the others cannot be. A spec
    left by an earlier run is removed first. `chains` (narrow_reshapes.model_reshape_chains
    of the model) give the narrow kernels the truncfs they reach through reshapes;
    `epilogues` (model/epilogues.py, by `problem_key`) the epilogues its kernel computes in
    place of IREE's dispatch; `absorbed` (attention_sources.py, by name) an attention's forms
    over its copied operands' sources; `paddings` (conv_padding.py, by a convolution's
    `_key()`) the zero padding its kernel applies itself, reading the image before its pad."""
    if os.path.exists(path):
        os.remove(path)
    folder = path.removesuffix(".mlir")
    forms = ModelForms(chains or {}, epilogues or {}, absorbed or {}, paddings or {})
    build = {"attention": _attention_substitute, "convolution": _convolution_substitute}
    kept, refused = [], []
    for problem, point in winners:
        family = family_of(point, problem.kind)
        why = "not a kernel family's point" if family is None else family.unsupported(problem)
        if why:
            refused.append(f"{problem.name}: {why}")
            continue
        substitute = build.get(problem.kind, _matmul_substitute)
        kept.append(substitute(family, problem, point, forms, target.arch, folder))
    if kept:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(substitution_spec(kept, target.executable_target()))
    return refused


@dataclass(frozen=True)
class ModelForms:
    """What the run read from the model for the spec (see `write_substitution`)."""

    chains: dict
    epilogues: dict
    absorbed: dict
    paddings: dict


def _attention_substitute(family, problem, point, forms: ModelForms, arch: str, folder: str):
    """A flash winner's kernel, and one for each of its forms over copied operands."""
    params = family.params(point)
    binary = family.compile(problem, params, arch, os.path.join(folder, f"{problem.name}.ptx"))
    found = forms.absorbed.get(problem.name, []) if family.absorbs.copied_operands else []
    usable = [f for f in found if not family.unsupported(f.problem)]
    absorbed = tuple(
        (form, family.compile(
            form.problem, params, arch, os.path.join(folder, f"{problem.name}.absorbed{j}.ptx")
        ))
        for j, form in enumerate(usable)
    )  # fmt: skip
    return Substitute(problem, params, binary, absorbed=absorbed, family=family)


def _convolution_substitute(family, problem, point, forms: ModelForms, arch: str, folder: str):
    """A convolution winner's kernel (reading the image before its zero pad where the model
    has one), its narrow twin, and its epilogues' kernels (what its family absorbs)."""
    params = family.params(point)
    absorbs = family.absorbs
    found = forms.epilogues.get(problem_key(problem), []) if absorbs.epilogues else []
    padding = forms.paddings.get(problem._key()) if absorbs.padding else None
    if padding and problem.size("c") >= params.block_k:  # not the few-channel stem
        problem = padded_form(problem, padding)
    ptx = os.path.join(folder, f"{problem.name}.ptx")
    binary = family.compile(problem, params, arch, ptx)
    narrow = narrowed(problem) if absorbs.narrow_output else None
    if narrow is not None:
        ptx = os.path.join(folder, f"{problem.name}.to_{narrow.acc_type}.ptx")
        narrow = (narrow, family.compile(narrow, params, arch, ptx))
    fused = tuple(
        (e, family.compile(
            problem, params, arch, os.path.join(folder, f"{problem.name}.epilogue{j}.ptx"), e
        ), None)
        for j, e in enumerate(found)
    )  # fmt: skip
    return Substitute(problem, params, binary, narrow, epilogues=fused, family=family)


def _matmul_substitute(family, problem, point, forms: ModelForms, arch: str, folder: str):
    """A matmul winner's kernel, its narrow twin (reaching the truncf through the model's
    reshapes), the kernels reading a stored weight, and its epilogues' kernels (what its
    family absorbs)."""
    params = family.params(point)
    absorbs = family.absorbs
    binary = family.compile(problem, params, arch, os.path.join(folder, f"{problem.name}.ptx"))
    narrow = narrowed(problem) if absorbs.narrow_output else None
    if narrow is not None:
        ptx = os.path.join(folder, f"{problem.name}.to_{narrow.acc_type}.ptx")
        narrow = (narrow, family.compile(narrow, family.narrow_params(params), arch, ptx))
    stored = None
    if absorbs.stored_weights:
        stored = _stored_kernels(family, problem, params, narrow, arch, folder)
    wide = tensor_type(problem.acc_shape, problem.acc_type)
    reshaped = tuple(sorted(forms.chains.get(wide, ()))) if narrow and absorbs.reshapes else ()
    found = forms.epilogues.get(problem_key(problem), []) if narrow and absorbs.epilogues else []
    fused = _matmul_epilogue_kernels(family, problem, params, narrow, stored, found, arch, folder)
    return Substitute(problem, params, binary, narrow, stored, reshaped, fused, family=family)


def _matmul_epilogue_kernels(family, problem, params, narrow, stored, epilogues, arch, folder: str):
    """(epilogue, its kernel, the kernel reading B as a stored weight or None) of each of a
    matmul winner's epilogues: its narrow kernel with the epilogue in it. One that rotates
    heads (RoPE) computes two half blocks, each at least a dot wide: with the winner's
    blocks narrower than that, IREE keeps it."""
    kernels = []
    for j, epilogue in enumerate(epilogues):
        if epilogue.period > 1 and params.block_n < 2 * MIN_DOT:
            continue
        ptx = os.path.join(folder, f"{problem.name}.epilogue{j}.ptx")
        binary = family.compile(narrow[0], family.narrow_params(params), arch, ptx, epilogue)
        stored_binary = None
        if stored is not None and stored[3] is not None:
            narrow_stored = dataclasses.replace(stored[1], acc_type=epilogue.narrow)
            ptx = os.path.join(folder, f"{problem.name}.stored.epilogue{j}.ptx")
            stored_binary = family.compile(
                narrow_stored, family.narrow_params(params), arch, ptx, epilogue
            )
        kernels.append((epilogue, binary, stored_binary))
    return tuple(kernels)


def _stored_kernels(family, problem, params, narrow, arch: str, folder: str):
    """The kernels that read B as a stored weight (N x K), for the absorbed-transpose arms;
    None where B has no such form."""
    layout = stored_layout(problem)
    if layout is None:
        return None
    stored = stored_problem(problem)
    ptx = os.path.join(folder, f"{problem.name}.stored.ptx")
    binary = family.compile(stored, params, arch, ptx)
    narrow_binary = None
    if narrow is not None:
        ptx = os.path.join(folder, f"{problem.name}.stored.to_{narrow[0].acc_type}.ptx")
        narrow_stored = dataclasses.replace(stored, acc_type=narrow[0].acc_type)
        narrow_binary = family.compile(narrow_stored, family.narrow_params(params), arch, ptx)
    return layout, stored, binary, narrow_binary


def rewrite_commands(
    source: str, spec: str, flags: Sequence[str], out: str
) -> list[tuple[str, list[str]]]:
    """(tool, command) to lower the model to global optimization and apply the spec there;
    `out` gets the rewritten module, to compile on with `flags` and RESUME_FLAG."""
    from autosched.compile import compiler_path, opt_path

    lowered = _lowered(out)
    pipeline = (
        f"builtin.module(iree-preprocessing-transform-interpreter{{transform-spec-path={spec}}})"
    )
    return [
        (
            "iree-compile",
            [compiler_path(), source, *flags, f"--compile-to={REWRITE_PHASE}", "-o", lowered],
        ),
        ("iree-opt", [opt_path(), lowered, f"--pass-pipeline={pipeline}", "-o", out]),
    ]


def rewrite_model(
    source: str, spec: str, flags: Sequence[str], out: str, timeout: float
) -> tuple[str, int]:
    """The model at global optimization with the spec's kernels in place of their ops, and how
    many ops were replaced. A failing tool is a RuntimeError with its one telling line."""
    for tool, command in rewrite_commands(source, spec, flags, out):
        finished = processes.run(command, timeout)
        if finished.timed_out or finished.returncode != 0:
            why = (
                f"over {timeout:g} s"
                if finished.timed_out
                else processes.describe_failure(finished, tool)
            )
            raise RuntimeError(f"{tool}: {why}")
    return out, count_externs(out) - count_externs(_lowered(out))


def check_custom_spec(path: str) -> None:
    """A custom-kernel spec (a run's `results.custom.mlir`) must parse and be the
    preprocessing library that replaces ops (`@__transform_main`); anything else is one
    UserError naming the file, before anything is compiled."""
    from iree.compiler import ir

    from autosched.errors import UserError
    from autosched.ir_walk import children, symbol

    try:
        with open(path, "rb") as handle:
            module = ir.Module.parse(handle.read(), ir.Context())
    except OSError as error:
        raise UserError(f"{path}: cannot read the custom spec: {error.strerror}") from None
    except ir.MLIRError as error:
        found = error.error_diagnostics
        message = found[0].message if found else str(error).splitlines()[0]
        raise UserError(f"{path}: the custom spec does not parse: {message}") from None
    names = {
        symbol(op) for op in children(module.operation) if op.name == "transform.named_sequence"
    }
    if "__transform_main" in names:
        return
    if "__kernel_config" in names:
        raise UserError(f"{path}: this is a tuning spec: give it with --spec, not --custom")
    raise UserError(
        f"{path}: not a custom-kernel spec (no @__transform_main; a run writes one as "
        "results.custom.mlir)"
    )


def _lowered(out: str) -> str:
    """Where the model lowered to global optimization is kept, beside the rewritten one."""
    return out.removesuffix(".mlir") + ".global.mlir"


def count_externs(path: str) -> int:
    """Custom dispatches (`hal.dispatch.extern`) in a module, read with the bindings: the
    rewrite adds one for each contraction that now runs a custom kernel."""
    from iree.compiler import ir

    from autosched.ir_walk import walk_ops

    module = ir.Module.parseFile(path, ir.Context())
    return sum(1 for op in walk_ops(module.operation) if op.name == "hal.dispatch.extern")
