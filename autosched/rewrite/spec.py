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

from iree.compiler import ir

from autosched.errors import UserError
from autosched.ir_walk import children, symbol
from autosched.kernels.base import KernelDoesNotFit
from autosched.kernels.registry import family_of
from autosched.ops.epilogue import Epilogue
from autosched.ops.matmul import MatmulProblem
from autosched.ops.row_norm import RowNorm
from autosched.rewrite.arms import winner_arms
from autosched.rewrite.attention_sources import AbsorbedAttention
from autosched.rewrite.common import ELEMENTWISE_FUSION
from autosched.rewrite.compile_ahead import Compiled, Recorder, compile_calls
from autosched.rewrite.custom_functions import winner_functions
from autosched.rewrite.narrow_reshapes import ReshapeChain
from autosched.rewrite.replacements import (
    ModelForms,
    Substitute,
    build_substitute,
)
from autosched.rewrite.row_norms import normed_form, normed_forms
from autosched.rewrite.sequences import main_sequence


def substitution_spec(winners: list[Substitute], executable_target: str) -> str:
    """The preprocessing spec that puts each winner's kernel in place of its op: first every
    contraction-then-truncf pair that a narrow kernel covers, then the contractions left;
    in each pass a contraction whose B is a stored weight's transpose takes that weight."""
    functions, epilogue_arms, narrow_arms, plain_arms, matchers, callers = [], [], [], [], [], []
    for i, w in enumerate(winners):
        functions += winner_functions(i, w, executable_target)
        epilogue, narrow, plain, matched, called = winner_arms(i, w)
        epilogue_arms += epilogue
        narrow_arms += narrow
        plain_arms += plain
        matchers += matched
        callers += called
    # Each pass walks the ops in order: a truncf comes before the epilogue that reads it,
    # so the epilogues are matched in a pass of their own, first; the narrow pass must see
    # the contractions unreplaced.
    passes = [epilogue_arms, narrow_arms, plain_arms]
    # Epilogues, pads, absorbed copies and norms are read from the fused model: the spec
    # fuses too.
    fuses = any(
        w.problem.kind == "convolution" or w.epilogues or w.absorbed or normed_form(w.problem)
        for w in winners
    )
    main = main_sequence(passes, ELEMENTWISE_FUSION if fuses else None)
    body = "\n".join([*functions, *matchers, *callers, main])
    return f"module attributes {{transform.with_named_sequence}} {{\n{body}\n}}\n"


def write_substitution(
    path: str,
    winners: list[tuple[MatmulProblem, dict]],
    target,
    chains: dict[str, set[ReshapeChain]] | None = None,
    epilogues: dict[str, list[Epilogue]] | None = None,
    absorbed: dict[str, list[AbsorbedAttention]] | None = None,
    paddings: dict[str, tuple] | None = None,
    norms: dict[str, list[RowNorm]] | None = None,
) -> list[str]:
    """Writes the spec for the custom winners ((problem, point) pairs of the CUDA target)
    that can be substituted, their PTX beside it; returns why the others cannot be. A spec
    left by an earlier run is removed first. `chains` (narrow_reshapes.model_reshape_chains
    of the model) give the narrow kernels the truncfs they reach through reshapes;
    `epilogues` (rewrite/epilogues.py, by `problem_key`) the epilogues its kernel computes in
    place of IREE's dispatch; `absorbed` (attention_sources.py, by name) an attention's forms
    over its copied operands' sources; `paddings` (conv_padding.py, by a convolution's
    `key()`) the zero padding its kernel applies itself, reading the image before its pad;
    `norms` (rewrite/row_norms.py, by `problem_key`) the RMSNorms that make a matmul's A,
    each a form of the winner (its arms before the winner's own) whose kernel computes it.
    A normed form that does not build is left out: the winner's own form takes its ops."""
    if os.path.exists(path):
        os.remove(path)
    folder = path.removesuffix(".mlir")
    forms = ModelForms(chains or {}, epilogues or {}, absorbed or {}, paddings or {}, norms or {})
    kept, refused, taken = [], [], []
    for problem, point in winners:
        family = family_of(point, problem.kind)
        why = "not a kernel family's point" if family is None else family.unsupported(problem)
        if why:
            refused.append(f"{problem.name}: {why}")
        else:
            taken += [(family, form, point) for form in normed_forms(family, problem, point, forms)]
            taken.append((family, problem, point))
    calls = []  # every kernel the winners need, compiled side by side (compile_ahead.py)
    for family, problem, point in taken:
        build_substitute(Recorder(family, calls), problem, point, forms, target.arch, folder)
    done = compile_calls(calls)
    for family, problem, point in taken:
        try:
            built = build_substitute(
                Compiled(family, done), problem, point, forms, target.arch, folder
            )
            kept.append(dataclasses.replace(built, family=family))
        except KernelDoesNotFit as error:  # its own kernel, as the model's op form needs it
            if not normed_form(problem):  # (a normed form: the winner's own takes its ops)
                refused.append(f"{problem.name}: {error}")
    if kept:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(substitution_spec(kept, target.executable_target()))
    return refused


def check_custom_spec(path: str) -> None:
    """A custom-kernel spec (a run's `results.custom.mlir`) must parse and be the
    preprocessing library that replaces ops (`@__transform_main`); anything else is one
    UserError naming the file, before anything is compiled."""
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
