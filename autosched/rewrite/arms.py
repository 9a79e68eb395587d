"""The arms of the substitution spec: each matcher paired with the caller that puts the
winner's function in place of what it matched.

A caller imports the function (and the functions it calls) into the matched op's module and
`cast_and_call`s it on the operands the kernel reads, as IREE's custom-kernel samples do.
A winner's arms come most specific first: its epilogues, then its narrow forms (through
reshapes, reading a stored weight), then the op alone.
"""

from __future__ import annotations

from autosched.rewrite.matchers import (
    attention_matcher,
    contraction_matcher,
    conv_operands,
    epilogue_matcher,
    narrow_matcher,
    narrow_name,
    padded_handles,
)
from autosched.rewrite.replacements import FUNCTION_PREFIX, Substitute
from autosched.rewrite.row_norms import lhs_sources, norm_handles
from autosched.rewrite.sequences import Arm, caller_sequence
from autosched.rewrite.stored_weights import StoredLayout


def _operands(problem) -> str:
    """The matched attention's operands its kernel takes: q, k, v and its mask tensor
    (operand 3 is the scale)."""
    return "0, 1, 2, 4" if problem.mask_tensor else "0, 1, 2"


def _ab(problem, handle: str, b: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    """What the kernel reads for the contraction at `handle`: its A and B (B at `b` where
    given: a stored weight), a normed form's x, B and g (row_norms.lhs_sources), or a
    convolution's image and filter."""
    if problem.kind == "convolution":
        return conv_operands(problem, handle)
    return lhs_sources(problem, handle, b or (handle, "1"))


def _epilogue_arms(i: int, w: Substitute) -> list[tuple[Arm, str, str]]:
    """(arm, matcher, caller) of each epilogue of a winner: the epilogue op replaced by the
    kernel that computes it, on the contraction's A (image) and B (filter; a stored weight
    where B is its transpose, that arm first) and the epilogue's other inputs."""
    arms = []
    convolution = w.problem.kind == "convolution"
    for j, (epilogue, _, stored_binary) in enumerate(w.epilogues):
        function = f"{FUNCTION_PREFIX}{i}_e{j}"
        extra_sources = epilogue.sources("%tr", "%op")
        variants = [(None, function, _ab(w.problem, "%mm"))]
        if stored_binary is not None:
            stored_sources = _ab(w.problem, "%mm", ("%t", "0"))
            variants.insert(0, (w.stored[0], f"{function}_stored", stored_sources))
        for layout, called, sources in variants:
            stored = "_stored" if layout else ""
            params = ["%op", "%tr", "%mm", *(["%t"] if layout else padded_handles(w.problem))]
            params += norm_handles(w.problem)
            callees = (f"{called}_kernel",) if convolution or layout else ()
            caller = caller_sequence(
                f"call_epilogue{stored}_{i}_{j}", called, params, [*sources, *extra_sources],
                callees,
            )  # fmt: skip
            arms.append(
                (
                    (f"match_epilogue{stored}_{i}_{j}", f"call_epilogue{stored}_{i}_{j}"),
                    epilogue_matcher(i, j, w.problem, epilogue, layout),
                    caller,
                )
            )
    return arms


def _narrow_arms(i: int, w: Substitute) -> list[tuple[Arm, str, str]]:
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
            name = narrow_name(i, layout, chain[0] if chain else None)
            if layout is None:
                function = f"{prefix}_narrow"
                params = ["%op", "%mm", *padded_handles(w.problem)]
                sources = _ab(w.problem, "%mm")
                callees = (function,) if chain else ()
                if w.problem.kind == "convolution":  # its function calls its kernel
                    callees = (f"{function}_kernel",)
            else:
                function, params = f"{prefix}_narrow_stored", ["%op", "%mm", "%t"]
                sources = _ab(w.problem, "%mm", ("%t", "0"))
                callees = (f"{prefix}_ns_kernel", function) if chain else (f"{prefix}_ns_kernel",)
            params += norm_handles(w.problem)
            arms.append(
                (
                    (f"match_{name}", f"call_{name}"),
                    narrow_matcher(i, w.problem, narrow_type, layout, chain),
                    caller_sequence(f"call_{name}", function + suffix, params, sources, callees),
                )
            )
    return arms


def winner_arms(
    i: int, w: Substitute
) -> tuple[list[Arm], list[Arm], list[Arm], list[str], list[str]]:
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
        plain_arms.append((f"match_stored_{i}", f"call_stored_{i}"))
        matchers.append(contraction_matcher(i, w.problem, stored))
        callers.append(
            caller_sequence(
                f"call_stored_{i}",
                f"{prefix}_stored",
                ["%op", "%t", *norm_handles(w.problem)],
                _ab(w.problem, "%op", ("%t", "0")),
                (f"{prefix}_stored_kernel",),
            )
        )
    for j, (absorbed, _) in enumerate(w.absorbed):
        copied = sorted(source.operand for source in absorbed.inputs)
        sources = [(f"%copy{o}", "0") if o in copied else ("%op", str(o)) for o in range(3)]
        sources += [("%op", "4")] if w.problem.mask_tensor else []  # the mask, as it is
        params = ["%op", *(f"%copy{o}" for o in copied)]
        # One that writes the result's copy is rooted there, so it is matched in the first
        # pass, before the attention alone is.
        arms = epilogue_arms if absorbed.output else plain_arms
        arms.append((f"match_absorbed_{i}_{j}", f"call_absorbed_{i}_{j}"))
        matchers.append(attention_matcher(i, w.problem, (j, absorbed)))
        callers.append(
            caller_sequence(
                f"call_absorbed_{i}_{j}", f"{prefix}_absorbed{j}",
                ["%root", *params] if absorbed.output else params, sources,
                (f"{prefix}_absorbed{j}_kernel",),
            )
        )  # fmt: skip
    if w.binary is None:  # the op's own form does not fit: its narrow forms alone
        return epilogue_arms, narrow_arms, plain_arms, matchers, callers
    plain_arms.append((f"match_custom_{i}", f"call_custom_{i}"))
    matchers.append(contraction_matcher(i, w.problem))
    # A convolution's function puts its operands channels-last and calls its kernel.
    callees = (f"{prefix}_kernel",) if w.problem.kind == "convolution" else ()
    callers.append(
        caller_sequence(
            f"call_custom_{i}",
            prefix,
            ["%op", *padded_handles(w.problem), *norm_handles(w.problem)],
            [("%op", _operands(w.problem))]
            if w.problem.kind == "attention"
            else _ab(w.problem, "%op"),
            callees,
        )  # fmt: skip
    )
    return epilogue_arms, narrow_arms, plain_arms, matchers, callers
