"""The transform matchers of the substitution spec: the walk that finds the ops to replace.

Each matcher is a `transform.named_sequence` that `foreach_match` runs on every op of the
model at REWRITE_PHASE: it matches a contraction as the tuning spec does (element types,
indexing maps, every dimension, named op or linalg.generic) whose accumulator is a
`linalg.fill` (the family computes C = A·B from zero), and what the winner's kernel absorbs
around it (its `truncf`, through reshapes; a stored weight's transpose; an epilogue; a
convolution's pad; an attention's copies), and yields the handles its caller
(`arms.caller_sequence`) replaces.
"""

from __future__ import annotations

from autosched.kernels import attention_layout
from autosched.kernels.igemm_conv import kernel as igemm
from autosched.ops.base import ANY_OP, ANY_VALUE
from autosched.ops.epilogue import ROTATED, Epilogue
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kernel import tensor_type
from autosched.outputs.spec import match_contraction
from autosched.rewrite.attention_sources import (
    AbsorbedAttention,
    copied_handle,
    copy_matcher_lines,
    output_matcher_lines,
)
from autosched.rewrite.builders import dag_lines, truncf_dag
from autosched.rewrite.conv_padding import PAD, padded_extents
from autosched.rewrite.narrow_reshapes import ReshapeChain, chain_matcher_lines
from autosched.rewrite.replacements import NARROW_FROM
from autosched.rewrite.row_norms import norm_handles, norm_matcher_lines, normed_form
from autosched.rewrite.stored_weights import StoredLayout, transpose_matcher


def padded_handles(problem) -> list[str]:
    """The handle a matcher yields for the pad a convolution's kernel applies itself."""
    return ["%pad"] if problem.kind == "convolution" and problem.padding else []


def conv_operands(problem, handle: str) -> list[tuple[str, str]]:
    """The kernel's image and filter: the op's first two operands, the image before its
    pad where the kernel pads it."""
    return [("%pad", "0"), (handle, "1")] if padded_handles(problem) else [(handle, "0, 1")]


def contraction_matcher(
    index: int, problem: MatmulProblem, layout: StoredLayout | None = None
) -> str:
    """Matches the problem's zero-filled contractions (with `layout`: only those whose B
    is the transpose of a stored weight, yielded too)."""
    if problem.kind == "attention":
        return attention_matcher(index, problem)
    name = f"match_stored_{index}" if layout else f"match_custom_{index}"
    transposed = transpose_matcher("%op", problem, layout) if layout else []
    yielded = ["%op", "%t"] if layout else ["%op", *padded_handles(problem)]
    return _sequence(
        name,
        "%op",
        [
            match_contraction(problem).rstrip("\n"),
            # The family starts from zero: the accumulator must come from a linalg.fill.
            f"    %init = transform.get_producer_of_operand %op[2] : ({ANY_OP}) -> {ANY_OP}",
            f'    transform.match.operation_name %init ["linalg.fill"] : {ANY_OP}',
            *transposed,
            *_image_matcher(problem, "%op"),
            *_norm_lines(problem, "%op"),
        ],
        [*yielded, *norm_handles(problem)],
    )


def _norm_lines(problem, handle: str) -> list[str]:
    """A normed form's (rewrite/row_norms.py): the norm that makes `handle`'s A."""
    return norm_matcher_lines(handle, problem.norm) if normed_form(problem) else []


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
        *_typed_operand("%conv_image", handle, 0, operand),
    ]
    if problem.padding:
        lines += [
            f"    %pad = transform.get_producer_of_operand {handle}[0] : ({ANY_OP}) -> {ANY_OP}",
            f'    transform.match.operation_name %pad ["{PAD}"] : {ANY_OP}',
            *_typed_operand("%pad_in", "%pad", 0, image),
        ]
    return lines


def attention_matcher(
    index: int, problem, absorbed: tuple[int, AbsorbedAttention] | None = None
) -> str:
    """Matches an `iree_linalg_ext.attention` by the exact type of q, k, v, the mask and
    the output (the custom route refuses a model where two different attentions share
    them: `drivers/custom_route.ambiguous`); with `absorbed` (its index and form), only
    where its operands are the copies it names, whose handles it yields too, and, where it
    writes the result's copy, rooted at that copy."""
    inputs, out = attention_layout.operand_tensor_types(problem)
    typed = list(enumerate(inputs))
    if problem.mask_type:
        mask = tensor_type(problem.operand_shape(3), problem.mask_type)
        typed.append((4, mask))
    typed.append((len(typed) + 1, out))  # the init, after the scale and the mask
    form = absorbed[1] if absorbed else None
    yielded = ["%op", *(copied_handle(s) for s in form.inputs)] if form else ["%op"]
    root = "%root" if form and form.output else "%op"
    yielded = ["%root", *yielded] if root == "%root" else yielded
    name = f"match_absorbed_{index}_{absorbed[0]}" if absorbed else f"match_custom_{index}"
    lines = [
        *(output_matcher_lines(form) if root == "%root" else []),
        f'    transform.match.operation_name %op ["{attention_layout.ATTENTION_OP}"] : {ANY_OP}',
    ]
    for position, tensor in typed:
        lines += _typed_operand(f"%operand{position}", "%op", position, tensor)
    lines += copy_matcher_lines(form) if form else []
    return _sequence(name, root, lines, yielded)


def narrow_name(index: int, layout: StoredLayout | None, chain: int | None) -> str:
    """`narrow_{i}`, `narrow_stored_{i}`, and `_r{j}` for the j-th reshape chain."""
    name = f"narrow_stored_{index}" if layout else f"narrow_{index}"
    return name if chain is None else f"{name}_r{chain}"


def narrow_matcher(
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
    name = "match_" + narrow_name(index, layout, chain[0] if chain else None)
    yielded = ["%op", "%mm", "%t"] if layout else ["%op", "%mm", *padded_handles(problem)]
    lines = _truncf_of_contraction("%op", problem, narrow, layout, chain)
    return _sequence(name, "%op", lines, [*yielded, *norm_handles(problem)])


def _truncf_of_contraction(
    handle: str,
    problem: MatmulProblem,
    narrow: str,
    layout: StoredLayout | None = None,
    chain: tuple[int, ReshapeChain] | None = None,
) -> list[str]:
    """Transform lines that match `handle` as a truncf to `narrow` of one of the problem's
    zero-filled contractions, bound to `%mm` (see `narrow_matcher`)."""
    rank = len(chain[1].shape) if chain else len(problem.output_shape)
    shape = list(chain[1].shape) if chain else ["?"] * rank
    wide, thin = tensor_type(shape, NARROW_FROM), tensor_type(shape, narrow)
    if chain is None:
        producer = [
            f"    %mm = transform.get_producer_of_operand {handle}[0] : ({ANY_OP}) -> {ANY_OP}"
        ]
    else:  # the DAG's static types pin the truncf's shape
        producer = chain_matcher_lines(handle, chain[1], ANY_OP)
    return [
        *truncf_dag("%ins, %outs", handle, wide, thin),
        *producer,
        *_contraction(problem, layout),
    ]


def _contraction(problem: MatmulProblem, layout: StoredLayout | None = None) -> list[str]:
    """Transform lines that match `%mm` as one of the problem's zero-filled contractions
    whose result has one user (else its f32 result is still needed)."""
    return [
        match_contraction(problem, "%mm").rstrip("\n"),
        # Its one user (the truncf or the epilogue): else its f32 result is still needed.
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
        *_norm_lines(problem, "%mm"),
    ]


def epilogue_matcher(
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
    constant (`dag_lines`); else a transform matcher cannot follow it, and
    rewrite/epilogues.py writes arms only for types that tell the model's epilogues apart.
    An epilogue that rounds in its own body reads the contraction itself (no truncf: the
    contraction takes its place among the handles); one with a `then` generic is matched
    from that generic, through its reshapes, to the first (in the truncf's place)."""
    then = epilogue.then
    rounding = "%tr" if epilogue.rounded_before or then else "%mm"
    yielded = ["%op", rounding, "%mm", *(["%t"] if layout else padded_handles(problem))]
    yielded += norm_handles(problem)
    stored = "_stored" if layout else ""
    first = "%tr" if then else "%op"  # the generic that reads the contraction (or truncf)
    lines = []
    if then is not None:
        added = epilogue.inputs[len(epilogue.first_inputs) :]
        types = dict(zip(then.positions, (x.type for x in added), strict=True))
        types[then.acc] = then.reads
        ordered = [types[position] for position in range(len(types))]
        lines += _generic_lines("%op", "then", ordered, epilogue.out_type, then.dag)
        chain = ReshapeChain(then.reshapes, ())
        lines += chain_matcher_lines("%op", chain, ANY_OP, operand=then.acc, bound="%tr")
    first_types = [x.type for x in epilogue.first_inputs]
    first_out = then.first_out if then else epilogue.out_type
    lines += _generic_lines(first, "ep", first_types, first_out, epilogue.dag)
    for position, operand in enumerate(epilogue.first_inputs):
        if operand.kind == ROTATED:
            lines += _rotation_matcher(position)
    producer = "%tr" if epilogue.rounded_before else "%mm"
    read = ReshapeChain(epilogue.read_reshapes, ())  # none: the producer of its operand
    lines += chain_matcher_lines(first, read, ANY_OP, epilogue.acc_position, bound=producer)
    if epilogue.rounded_before:
        chain = (
            (0, ReshapeChain(epilogue.reshapes, epilogue.acc_shape)) if epilogue.reshapes else None
        )
        lines += [
            *([] if epilogue.period > 1 else _only_user("%tr")),
            *_truncf_of_contraction("%tr", problem, epilogue.narrow, layout, chain),
        ]
    else:
        lines += _contraction(problem, layout)
    return _sequence(f"match_epilogue{stored}_{index}_{j}", "%op", lines, yielded)


def _generic_lines(handle: str, name: str, inputs: list[str], out: str, dag: str) -> list[str]:
    """Transform lines that match `handle` as a linalg.generic of exactly `inputs` (their
    types, in order) and the result type `out`, and of the body `dag` where it has one."""
    param = "!transform.param<i64>"
    lines = [
        f'    transform.match.operation_name {handle} ["linalg.generic"] : {ANY_OP}',
        *(dag_lines(f"%{name}_dag_ins, %{name}_dag_outs", handle, dag) if dag else []),
        f"    transform.match.structured {handle} : {ANY_OP} {{",
        f"    ^bb0(%{name}: {ANY_OP}):",
        f"      %{name}_count = transform.match.structured.num_inputs %{name}"
        f" : ({ANY_OP}) -> {param}",
        f"      %{name}_want = transform.param.constant {len(inputs)} : i64 -> {param}",
        f"      transform.match.param.cmpi eq %{name}_count, %{name}_want : {param}",
        "      transform.match.structured.yield",
        "    }",
    ]
    for position, spelled in enumerate(inputs):
        lines += _typed_operand(f"%{name}{position}", handle, position, spelled)
    return lines + _typed_operand(f"%{name}_out", handle, len(inputs), out)


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
    rotate_half chain (rewrite/rotary.py): a collapse_shape of a generic of no inputs. The
    chain's body was checked when it was read; an arm with one is written only where no
    other epilogue of its types was left unread (rewrite/epilogues.py `unambiguous`)."""
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


def _sequence(name: str, root: str, lines: list[str], yielded: list[str]) -> str:
    """A matcher `@name(root)` of the transform lines `lines` that yields `yielded`."""
    handles = ", ".join([ANY_OP] * len(yielded))
    return "\n".join(
        [
            f"  transform.named_sequence @{name}({root}: {ANY_OP} {{transform.readonly}})"
            f" -> ({handles}) {{",
            *lines,
            f"    transform.yield {', '.join(yielded)} : {handles}",
            "  }",
        ]
    )


def _typed_operand(value: str, handle: str, position: int, spelled: str) -> list[str]:
    """Transform lines that bind `handle`'s operand at `position` to `value` and match it
    as of the type `spelled` (or one cast-compatible with it)."""
    return [
        f"    {value} = transform.get_operand {handle}[{position}] : ({ANY_OP}) -> {ANY_VALUE}",
        f"    transform.iree.match.cast_compatible_type {value} = {spelled} : {ANY_VALUE}",
    ]
