"""What the attention kernel families share (flash attention over all keys, flash decoding
over shares of them): which attentions a Triton kernel of theirs computes, each operand's
strides as IREE lays it out, and the constants that tell a kernel the layout and the mask.
Nothing here imports Triton."""

from __future__ import annotations

import dataclasses
import math

from autosched.errors import UserError
from autosched.kernels.triton import TRITON_TYPES
from autosched.ops.attention import AttentionProblem
from autosched.ops.matmul import DYNAMIC
from autosched.ops.matmul_kernel import tensor_type

ATTENTION_OP = "iree_linalg_ext.attention"  # the op form the families replace
INPUT_TYPES = ("f16", "bf16")
# A mask tensor's element types, as Triton loads them: IREE stores an i1 tensor a byte an
# element (kept where non-zero); a float mask is added to the scaled scores.
MASK_TYPES = {"i1": "i8", **TRITON_TYPES}

# A mask tensor's kinds (the kernels' MASK): none (or the causal one, the kernel's own), a
# keep mask (a key is kept where the mask is non-zero), an additive mask.
NO_MASK, KEEP, ADD = 0, 1, 2
HEAD_DIMS = (16, 32, 64, 128, 256)  # Triton's tl.arange needs a power of two
MAX_BATCH_LOOPS = 3
LOG2E = 1.4426950408889634


def unsupported(problem: AttentionProblem) -> str | None:
    """Why the attention kernels cannot compute this attention, or None."""
    types = {problem.query_type, problem.key_type, problem.value_type}
    if len(types) > 1 or not types <= set(INPUT_TYPES):
        return f"flash-attention kernels take f16 or bf16 q, k and v, not {sorted(types)}"
    if problem.mask_tensor and problem.mask_type not in MASK_TYPES:
        kinds = sorted(MASK_TYPES)
        return f"flash-attention kernels take masks of {kinds}, not {problem.mask_type}"
    if problem.scale is None:
        return "the attention's scale is not a constant"
    if len(problem.positions("b")) > MAX_BATCH_LOOPS:
        return f"flash-attention kernels take up to {MAX_BATCH_LOOPS} batch loops"
    for role in ("k1", "n"):
        if problem.size(role) not in HEAD_DIMS:
            return f"head dim {problem.size(role)} is not one of {HEAD_DIMS}"
    return None


def operand_strides(problem: AttentionProblem, operand: int) -> dict[str, int]:
    """Element strides of one operand (q 0, k 1, v 2, [mask 3], out last) along each loop
    role it indexes, row-major as IREE's tensors are; batch loops as b0, b1, b2 (0 where the
    operand does not index the loop: K and V under grouped-query attention, and the query
    rows of a decode step, whose single row IREE folded away)."""
    loops = problem.operand_loops[operand]
    sizes = [problem.loop_sizes[i] for i in loops]
    strides = {loop: math.prod(sizes[d + 1 :]) for d, loop in enumerate(loops)}
    _, inner, pitch = view_of(problem, operand)
    if inner:  # a slice of a wider last dim: the loops outside it step over the whole dim
        strides = {loop: s // inner * pitch if s >= inner else s for loop, s in strides.items()}
    named = {
        problem.loops[loop]: stride
        for loop, stride in strides.items()
        if problem.loops[loop] != "b"
    }
    for index, loop in enumerate(problem.positions("b")):
        named[f"b{index}"] = strides.get(loop, 0)
    return named


def view_of(problem: AttentionProblem, operand: int) -> tuple[int, int, int]:
    """(offset, sliced extent, full extent) of an operand the kernel reads as a slice of a
    wider tensor's last dim (AttentionProblem.views); (0, 0, 0) for one read whole."""
    views = problem.views
    return views[operand] if 0 <= operand < len(views) else (0, 0, 0)


def batch_sizes(problem: AttentionProblem) -> list[int]:
    """The batch loops' sizes, padded with 1 to MAX_BATCH_LOOPS."""
    sizes = problem.batch_sizes
    return sizes + [1] * (MAX_BATCH_LOOPS - len(sizes))


def length_roles(problem: AttentionProblem) -> set[str]:
    """The loop roles of DYNAMIC size: a length known when the kernel is launched."""
    return {role for role, size in zip(problem.loops, problem.loop_sizes, strict=True) if size < 0}


def length_unsupported(problem: AttentionProblem) -> str | None:
    """Why a kernel cannot run this attention at a length known at launch, or None: its
    query rows, and maybe its keys, are that length (a prompt's self-attention), read
    whole (not sliced from a wider tensor)."""
    roles = length_roles(problem)
    if not roles:
        return None
    if "m" not in roles or not roles <= {"m", "k2"}:
        return f"a kernel for any length takes query rows and keys of that length, not {roles}"
    if problem.views:
        return "a kernel for any length reads its operands whole"
    return None


def of_length(problem: AttentionProblem, roles: set[str]) -> AttentionProblem:
    """The problem with the loops of `roles` of DYNAMIC size (a length known at launch)."""
    sizes = tuple(
        DYNAMIC if role in roles else size
        for role, size in zip(problem.loops, problem.loop_sizes, strict=True)
    )
    return dataclasses.replace(problem, loop_sizes=sizes, sites=[])


def at_length(problem: AttentionProblem, length: int) -> AttentionProblem:
    """The problem with each DYNAMIC loop of `length`."""
    sizes = tuple(length if size < 0 else size for size in problem.loop_sizes)
    return dataclasses.replace(problem, loop_sizes=sizes, sites=[])


def length_constants(problem: AttentionProblem) -> dict:
    """`layout_constants` of a problem of DYNAMIC length (`length_unsupported` None): each
    stride that is a multiple c of the length L is c with its bit set in BY_L (q's five
    strides from bit 0, then k's, v's, the output's and the mask's: the kernel multiplies
    by L at launch), and one of c x L squared (past a mask over rows and keys) in BY_L2;
    M and N are L where M_BY_L and N_BY_L say so."""
    at = [layout_constants(at_length(problem, n)) for n in (1, 2, 3)]
    constants, by_length, by_square = dict(at[0]), 0, 0
    names = [f"s{p}{part}" for p in "qkvom" for part in ("b0", "b1", "b2", "r", "c")]
    for bit, name in enumerate(names):
        one, two, three = (found.get(name) for found in at)
        if one == two == three:
            continue
        if (two, three) == (2 * one, 3 * one):
            by_length |= 1 << bit
        elif (two, three) == (4 * one, 9 * one):  # past a mask's rows and keys
            by_square |= 1 << bit
        else:
            raise UserError(f"the stride {name} is not a multiple of the length or its square")
    roles = length_roles(problem)
    return constants | {
        "BY_L": by_length,
        "BY_L2": by_square,
        "M_BY_L": "m" in roles,
        "N_BY_L": "k2" in roles,
    }


def layout_constants(problem: AttentionProblem) -> dict:
    """A kernel's constexprs for the problem's layout (each operand's batch, row and column
    strides), its sizes, its scale in log2 units and its mask (MASK; `mk` None without a
    mask tensor)."""
    out = len(problem.operand_loops) - 1
    names = {"q": (0, "m", "k1"), "k": (1, "k2", "k1"), "v": (2, "k2", "n"), "o": (out, "m", "n")}
    names |= {"m": (3, "m", "k2")} if problem.mask_tensor else {}
    constants = {"MASK": NO_MASK}
    for prefix, operand in (("q", 0), ("k", 1), ("v", 2)):
        constants[f"{prefix}o"] = view_of(problem, operand)[0]
    for prefix, (operand, row, column) in names.items():
        strides = operand_strides(problem, operand)
        for index in range(MAX_BATCH_LOOPS):
            constants[f"s{prefix}b{index}"] = strides.get(f"b{index}", 0)
        constants[f"s{prefix}r"] = strides.get(row, 0)
        constants[f"s{prefix}c"] = strides[column]
    if problem.mask_tensor:
        constants["MASK"] = KEEP if problem.mask_type == "i1" else ADD
    else:
        constants["mk"] = None  # no mask operand
        constants |= {f"sm{part}": 0 for part in ("b0", "b1", "b2", "r", "c")}
    _, size1, size2 = batch_sizes(problem)
    return {
        **constants,
        "B1": size1,
        "B2": size2,
        "M": problem.size("m"),
        "N": problem.size("k2"),
        "D": problem.size("k1"),
        "DV": problem.size("n"),
        "SCALE": float(problem.scale) * LOG2E,
    }


def operand_tensor_types(problem: AttentionProblem) -> tuple[list[str], str]:
    """(q, k, v) and the output as tensor types, in the op's layout."""
    types = [problem.query_type, problem.key_type, problem.value_type]
    out_loops = problem.operand_loops[-1]

    def shaped(loops, element, operand=-1):
        shape = [problem.loop_sizes[i] for i in loops]
        _, inner, pitch = view_of(problem, operand)
        if inner:  # the wider tensor, its sliced dim whole (the dims it held merged)
            rows = math.prod(shape) // inner
            shape = [rows, pitch]
        return tensor_type(shape, element)

    inputs = [shaped(problem.operand_loops[i], types[i], i) for i in range(3)]
    return inputs, shaped(out_loops, problem.value_type)


def kernel_inputs(problem: AttentionProblem) -> list[str]:
    """The tensor types a kernel function takes: q, k, v and, where the op reads one, its
    mask tensor."""
    inputs, _ = operand_tensor_types(problem)
    if problem.mask_tensor:
        loops = problem.operand_loops[3]
        inputs.append(tensor_type([problem.loop_sizes[i] for i in loops], problem.mask_type))
    return inputs
