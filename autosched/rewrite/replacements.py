"""The replacement of each custom winner: the kernels its arms call, compiled (issue 12).

A winner replaces its op, and where the model lets it, more around the op: the `truncf`
after an f32 accumulator (its narrow twin), a stored weight's transpose, the reshapes before
the `truncf`, an epilogue, an attention's copied operands. Each form is its own kernel,
built here from the winner's point; the matchers, functions and arms that put them in the
model are written from the `Substitute` this module returns.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from autosched.kernels.base import KernelBinary, KernelDoesNotFit, KernelFamily
from autosched.kernels.matmul_triton.kernel import MIN_DOT
from autosched.kernels.registry import families_for
from autosched.ops.epilogue import Epilogue
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kernel import tensor_type
from autosched.rewrite.attention_sources import AbsorbedAttention
from autosched.rewrite.common import problem_key
from autosched.rewrite.conv_padding import padded_form
from autosched.rewrite.narrow_reshapes import ReshapeChain
from autosched.rewrite.stored_weights import StoredLayout, stored_layout, stored_problem

NARROW_FROM = "f32"  # an accumulator type whose truncf consumer the kernel can take over
FUNCTION_PREFIX = "autosched_custom_"  # the spec's util.funcs: {prefix}{winner}[_form]


@dataclass(frozen=True)
class Substitute:
    """One winner as the spec uses it: its kernel, and the kernel that stores the narrow
    type for the contraction-then-truncf form (None where the output is already narrow)."""

    problem: MatmulProblem
    params: object  # the family's kernel parameters
    # None: the op's own form does not fit the GPU (a persistent kernel at 128x256x64 in 3
    # stages needs 278552 bytes with an f32 C, and fits with a bf16 one): narrow forms alone.
    binary: KernelBinary | None
    narrow: tuple[MatmulProblem, KernelBinary] | None = None
    # B made by transposing a stored weight (rewrite/stored_weights.py): the layout, the
    # kernel that reads the weight as stored, and its narrow twin.
    stored: tuple[StoredLayout, MatmulProblem, KernelBinary, KernelBinary | None] | None = None
    # Reshapes between the contraction and its truncf in the model (narrow_reshapes.py).
    chains: tuple[ReshapeChain, ...] = ()
    # Epilogues in the model (rewrite/epilogues.py), each with its kernel, and for a matmul
    # whose B is a stored weight's transpose the kernel that reads the weight as stored.
    epilogues: tuple[tuple[Epilogue, KernelBinary, KernelBinary | None], ...] = ()
    # An attention written over its copied operands' sources (attention_sources.py), each
    # form with its kernel.
    absorbed: tuple[tuple[AbsorbedAttention, KernelBinary], ...] = ()
    family: KernelFamily | None = None  # the kernel family (kernels/) its kernels are of


@dataclass(frozen=True)
class ModelForms:
    """What the run read from the model for the spec (see `spec.write_substitution`)."""

    chains: dict
    epilogues: dict
    absorbed: dict
    paddings: dict
    norms: dict


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


def _fitting(family: KernelFamily, *arguments) -> KernelBinary | None:
    """The family's kernel for a form around a winner's op; None where it does not fit the
    GPU (a form's epilogue or narrow store can need more shared memory than the winner's
    own kernel): that form stays IREE's, the winner's own kernel still replaces its op."""
    try:
        return family.compile(*arguments)
    except KernelDoesNotFit:
        return None


def _attention_substitute(family, problem, point, forms: ModelForms, arch: str, folder: str):
    """A flash winner's kernel, and one for each of its forms over copied operands."""
    params = family.params(point)
    binary = family.compile(problem, params, arch, os.path.join(folder, f"{problem.name}.ptx"))
    found = forms.absorbed.get(problem.name, []) if family.absorbs.copied_operands else []
    usable = [f for f in found if not family.unsupported(f.problem)]
    kernels = [
        (form, _fitting(
            family, form.problem, params, arch,
            os.path.join(folder, f"{problem.name}.absorbed{j}.ptx"),
        ))
        for j, form in enumerate(usable)
    ]  # fmt: skip
    absorbed = tuple((form, kernel) for form, kernel in kernels if kernel is not None)
    return Substitute(problem, params, binary, absorbed=absorbed, family=family)


def _convolution_substitute(family, problem, point, forms: ModelForms, arch: str, folder: str):
    """A convolution winner's kernel (reading the image before its zero pad where the model
    has one), its narrow twin, and its epilogues' kernels (what its family absorbs)."""
    params = family.params(point)
    absorbs = family.absorbs
    found = forms.epilogues.get(problem_key(problem), []) if absorbs.epilogues else []
    padding = forms.paddings.get(problem.key()) if absorbs.padding else None
    if padding and problem.size("c") >= params.block_k:  # not the few-channel stem
        problem = padded_form(problem, padding)
    ptx = os.path.join(folder, f"{problem.name}.ptx")
    binary = family.compile(problem, params, arch, ptx)
    narrow = narrowed(problem) if absorbs.narrow_output else None
    if narrow is not None:
        ptx = os.path.join(folder, f"{problem.name}.to_{narrow.acc_type}.ptx")
        kernel = _fitting(family, narrow, params, arch, ptx)
        narrow = (narrow, kernel) if kernel is not None else None
    kernels = [
        (e, _fitting(
            family, problem, params, arch,
            os.path.join(folder, f"{problem.name}.epilogue{j}.ptx"), e,
        ))
        for j, e in enumerate(found)
    ]  # fmt: skip
    fused = tuple((e, kernel, None) for e, kernel in kernels if kernel is not None)
    return Substitute(problem, params, binary, narrow, epilogues=fused, family=family)


def _matmul_substitute(family, problem, point, forms: ModelForms, arch: str, folder: str):
    """A matmul winner's kernel, its narrow twin (reaching the truncf through the model's
    reshapes), the kernels reading a stored weight, and its epilogues' kernels (what its
    family absorbs)."""
    params = family.params(point)
    absorbs = family.absorbs
    too_large = None
    try:
        binary = family.compile(problem, params, arch, os.path.join(folder, f"{problem.name}.ptx"))
    except KernelDoesNotFit as error:  # its narrow form (timed so, as a rule) may still fit
        binary, too_large = None, error
    narrow = narrowed(problem) if absorbs.narrow_output else None
    if narrow is not None:
        ptx = os.path.join(folder, f"{problem.name}.to_{narrow.acc_type}.ptx")
        kernel = _fitting(family, narrow, family.narrow_params(params), arch, ptx)
        narrow = (narrow, kernel) if kernel is not None else None
    if too_large is not None and narrow is None:
        raise too_large
    stored = None
    if absorbs.stored_weights:
        stored = _stored_kernels(family, problem, params, narrow, arch, folder)
    wide = tensor_type(problem.acc_shape, problem.acc_type)
    reshaped = tuple(sorted(forms.chains.get(wide, ()))) if narrow and absorbs.reshapes else ()
    # A kernel for any count of rows (M DYNAMIC) has no epilogue: the op and its truncf.
    epilogues = narrow and absorbs.epilogues and not problem.any_rows
    found = forms.epilogues.get(problem_key(problem), []) if epilogues else []
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
        binary = _fitting(family, narrow[0], family.narrow_params(params), arch, ptx, epilogue)
        if binary is None:
            continue
        stored_binary = None
        if stored is not None and stored[3] is not None:
            narrow_stored = dataclasses.replace(stored[1], acc_type=epilogue.narrow)
            ptx = os.path.join(folder, f"{problem.name}.stored.epilogue{j}.ptx")
            stored_binary = _fitting(
                family, narrow_stored, family.narrow_params(params), arch, ptx, epilogue
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
    binary = _fitting(family, stored, params, arch, ptx)
    if binary is None:
        return None
    narrow_binary = None
    if narrow is not None:
        ptx = os.path.join(folder, f"{problem.name}.stored.to_{narrow[0].acc_type}.ptx")
        narrow_stored = dataclasses.replace(stored, acc_type=narrow[0].acc_type)
        narrow_binary = _fitting(family, narrow_stored, family.narrow_params(params), arch, ptx)
    return layout, stored, binary, narrow_binary


def build_substitute(
    family: KernelFamily, problem, point, forms: ModelForms, arch: str, folder: str
) -> Substitute:
    """A substitutable winner's kernels (their PTX in `folder`), for its kind."""
    build = {"attention": _attention_substitute, "convolution": _convolution_substitute}
    return build.get(problem.kind, _matmul_substitute)(family, problem, point, forms, arch, folder)
