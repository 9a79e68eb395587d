"""The element types a model takes and returns, and the iree-compile flags they need.

IREE demotes f64 to f32 by default (`--iree-input-demote-f64-to-f32`): the model's own
buffers stay f64 while the module expects f32 (an ONNX model then fails at run time with
`buffer view byte length 320 exceeds backing buffer byte length 160`), and its contractions
are tuned as f32 problems. A model that takes or returns f64 is compiled without the
demotion; its answers then match ONNX's to about 1e-15.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from autosched.measure.module_io import (
    check_given_inputs,
    check_input_sizes,
    dynamic_line,
    source_entry_functions,
)
from autosched.model.lowering import LOWERING_TIMEOUT, prepare_model
from autosched.ops.base import Problem

KEEP_F64 = "--iree-input-demote-f64-to-f32=false"


def model_input_flags(
    model_path: str, flags: list[str], work: str, given_inputs: str = "", named_by: str = ""
) -> tuple[list[str], str]:
    """(the flags the model's types need, a line naming its types) from its entry function
    as IREE reads it with every type kept; a UserError when an input is too large to make,
    or when the user's `given_inputs` do not fit it (arrays named as `named_by`'s arguments),
    before any work."""
    os.makedirs(work, exist_ok=True)
    source = prepare_model(model_path, work)
    entries = source_entry_functions(source, [*flags, KEEP_F64], work, LOWERING_TIMEOUT, model_path)
    for entry in entries:  # every function: a causal LM's prefill and decode
        check_input_sizes(entry, model_path)
    if len(entries) == 1:  # several functions take no --inputs (refused with its reason)
        folder = os.path.join(work, "inputs")
        check_given_inputs(given_inputs, entries[0], named_by or model_path, folder)
    inputs = sorted({spec.element for entry in entries for spec in entry.inputs})
    outputs = sorted({spec.element for entry in entries for spec in entry.outputs})
    line = f"{model_path}: takes {', '.join(inputs) or 'nothing'}, returns {', '.join(outputs)}"
    dynamic = next((dynamic_line(entry) for entry in entries if dynamic_line(entry)), "")
    if dynamic:
        line += f"; {dynamic}"
    if "f64" in inputs + outputs:
        return [KEEP_F64], line + f"; compiled with {KEEP_F64} (IREE demotes f64 by default)"
    return [], line


def problem_input_flags(problems: Iterable[Problem]) -> list[str]:
    """The flags a module of bare ops needs for its problems' element types: an f64 problem
    is compiled with f64 kept, as its inputs are made (demoted, every measurement of it,
    IREE's default included, failed on an f32/f64 input mismatch)."""
    for problem in problems:
        operands = problem.check_operands() or []
        if "f64" in {operand.element for operand in operands} | {problem.out_type}:
            return [KEEP_F64]
    return []
