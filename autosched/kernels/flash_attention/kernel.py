"""A family of Triton flash-attention kernels that IREE runs as custom dispatches (issue 24).

IREE 3.13's CUDA attention (VectorDistribute on mma.sync) ran the Llama-3-8B layer's
attention in 0.63 ms at best against torch SDPA's 0.10 on the H200. This kernel is the
flash-attention forward pass (one workgroup per block of query rows and batch entry, the
online softmax over blocks of key rows, in registers, on wgmma through Triton), written for
the attention as IREE holds it: any layout (each operand's strides come from its indexing
map), up to three batch loops, grouped-query attention without K and V repeated (a batch
loop K and V do not index has stride 0 there), and a causal mask applied in the kernel, so
that blocks above the diagonal are never read and no mask tensor is needed.

A point is block_m (query rows per workgroup), block_n (key rows per step), warps and
stages. Like the matmul family (kernels/matmul_triton/) it is compiled by Triton to a cubin
and wrapped as a `hal.dispatch.extern` (family.py: the family behind the contract). Its
source is Python code here, not a template file: it has no part that varies by point or
epilogue (every point's differences are Triton constexprs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autosched.errors import UserError
from autosched.kernels import online_softmax
from autosched.kernels.attention_layout import (
    ATTENTION_OP,
    MASK_TYPES,
    kernel_inputs,
    layout_constants,
    length_constants,
    length_roles,
    length_unsupported,
    operand_tensor_types,
)
from autosched.kernels.attention_layout import unsupported as layout_unsupported
from autosched.kernels.base import KernelBinary
from autosched.kernels.extern import DynamicRows, dispatch_extern_function
from autosched.kernels.triton import TRITON_TYPES, import_triton, triton_binary
from autosched.ops.attention import AttentionProblem

__all__ = ["ATTENTION_OP", "FlashParams", "compile_kernel", "extern_function", "unsupported"]


@dataclass(frozen=True)
class FlashParams:
    """One point of the family."""

    block_m: int
    block_n: int
    warps: int
    stages: int

    @property
    def name(self) -> str:
        return f"fa_m{self.block_m}_n{self.block_n}_w{self.warps}_s{self.stages}"


def unsupported(problem: AttentionProblem) -> str | None:
    """Why the family cannot compute this attention, or None (a DYNAMIC length too:
    attention_layout.length_unsupported)."""
    return length_unsupported(problem) or layout_unsupported(problem)


def _constants(problem: AttentionProblem, params: FlashParams) -> dict:
    """The kernel's constexprs; for a DYNAMIC length its layout over the length L, which it
    takes at launch (a blocks' tail is then always masked)."""
    m, k2 = problem.size("m"), problem.size("k2")
    dynamic = bool(length_roles(problem))
    return {
        # No length given at launch, unless the layout's say otherwise.
        "BY_L": 0,
        "BY_L2": 0,
        "M_BY_L": False,
        "N_BY_L": False,
        **(length_constants(problem) if dynamic else layout_constants(problem)),
        "CAUSAL": problem.causal,
        "BM": params.block_m,
        "BN": params.block_n,
        "EVEN_M": not dynamic and m % params.block_m == 0,
        "EVEN_N": not dynamic and k2 % params.block_n == 0,
    }


def _kernel():
    """The Triton kernel (defined here so that importing this module needs no Triton)."""
    triton = import_triton()
    import triton.language as tl  # noqa: PLC0415 - an optional extra, imported where it is used

    key_blocks = online_softmax.key_blocks(triton, tl)
    offset = online_softmax.entry_offset(triton, tl)
    by_length = online_softmax.by_length(triton, tl)
    length_or = online_softmax.length_or(triton, tl)

    @triton.jit
    def flash_attention(
        q, k, v, mk, o, L,
        qo: tl.constexpr, ko: tl.constexpr, vo: tl.constexpr,
        sqb0: tl.constexpr, sqb1: tl.constexpr, sqb2: tl.constexpr, sqr: tl.constexpr,
        sqc: tl.constexpr,
        skb0: tl.constexpr, skb1: tl.constexpr, skb2: tl.constexpr, skr: tl.constexpr,
        skc: tl.constexpr,
        svb0: tl.constexpr, svb1: tl.constexpr, svb2: tl.constexpr, svr: tl.constexpr,
        svc: tl.constexpr,
        sob0: tl.constexpr, sob1: tl.constexpr, sob2: tl.constexpr, sor: tl.constexpr,
        soc: tl.constexpr,
        smb0: tl.constexpr, smb1: tl.constexpr, smb2: tl.constexpr, smr: tl.constexpr,
        smc: tl.constexpr, MASK: tl.constexpr,
        B1: tl.constexpr, B2: tl.constexpr, M: tl.constexpr, N: tl.constexpr,
        D: tl.constexpr, DV: tl.constexpr, SCALE: tl.constexpr, CAUSAL: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
        BY_L: tl.constexpr, BY_L2: tl.constexpr, M_BY_L: tl.constexpr, N_BY_L: tl.constexpr,
    ):  # fmt: skip
        if M_BY_L or N_BY_L:  # a length known at launch (L): the sizes and strides over it
            M, N = length_or(M, L, M_BY_L), length_or(N, L, N_BY_L)
            sqb0, sqb1, sqb2, sqr, sqc = by_length(sqb0, sqb1, sqb2, sqr, sqc, L, BY_L, BY_L2, 0)
            skb0, skb1, skb2, skr, skc = by_length(skb0, skb1, skb2, skr, skc, L, BY_L, BY_L2, 5)
            svb0, svb1, svb2, svr, svc = by_length(svb0, svb1, svb2, svr, svc, L, BY_L, BY_L2, 10)
            sob0, sob1, sob2, sor, soc = by_length(sob0, sob1, sob2, sor, soc, L, BY_L, BY_L2, 15)
            smb0, smb1, smb2, smr, smc = by_length(smb0, smb1, smb2, smr, smc, L, BY_L, BY_L2, 20)
        # The last query blocks have the most keys under a causal mask: launch them first.
        start = tl.num_programs(0) - 1 - tl.program_id(0)
        entry = tl.program_id(1)
        rows = start * BM + tl.arange(0, BM)
        q_base = q + qo + offset(entry, sqb0, sqb1, sqb2, B1, B2)
        k_base = k + ko + offset(entry, skb0, skb1, skb2, B1, B2)
        v_base = v + vo + offset(entry, svb0, svb1, svb2, B1, B2)
        o_base = o + offset(entry, sob0, sob1, sob2, B1, B2)
        mk_base = mk
        if MASK != 0:
            mk_base = mk + offset(entry, smb0, smb1, smb2, B1, B2)
        mk_rows = rows * smr
        q_ptrs = q_base + rows[:, None] * sqr + tl.arange(0, D)[None, :] * sqc
        if EVEN_M:
            qt = tl.load(q_ptrs)
        else:
            qt = tl.load(q_ptrs, mask=rows[:, None] < M, other=0.0)
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, DV], dtype=tl.float32)
        if CAUSAL:  # keys before the block's first row unmasked, then the diagonal blocks
            below = start * BM
            acc, m_i, l_i = key_blocks(
                acc, m_i, l_i, qt, k_base, v_base, mk_base, rows, mk_rows, 0, below,
                skr, skc, svr, svc, smc, M, N, D, DV, SCALE, BN, False, EVEN_N, MASK,
            )  # fmt: skip
            stop = min(below + BM, N)
            acc, m_i, l_i = key_blocks(
                acc, m_i, l_i, qt, k_base, v_base, mk_base, rows, mk_rows, below, stop,
                skr, skc, svr, svc, smc, M, N, D, DV, SCALE, BN, True, EVEN_N, MASK,
            )  # fmt: skip
        else:
            acc, m_i, l_i = key_blocks(
                acc, m_i, l_i, qt, k_base, v_base, mk_base, rows, mk_rows, 0, N,
                skr, skc, svr, svc, smc, M, N, D, DV, SCALE, BN, False, EVEN_N, MASK,
            )  # fmt: skip
        out = acc / l_i[:, None]
        o_ptrs = o_base + rows[:, None] * sor + tl.arange(0, DV)[None, :] * soc
        if EVEN_M:
            tl.store(o_ptrs, out.to(o.dtype.element_ty))
        else:
            tl.store(o_ptrs, out.to(o.dtype.element_ty), mask=rows[:, None] < M)

    return flash_attention


def grid(problem: AttentionProblem, params: FlashParams) -> tuple[int, int, int]:
    """Workgroups: one per block of query rows, times every batch entry."""
    return math.ceil(problem.size("m") / params.block_m), math.prod(problem.batch_sizes), 1


def compile_kernel(
    problem: AttentionProblem, params: FlashParams, arch: str, path: str
) -> KernelBinary:
    """Triton's PTX and cubin for one point (no GPU needed)."""
    why = unsupported(problem) or params_unsupported(problem, params)
    if why:
        raise UserError(f"{params.name}: {why}")
    element = TRITON_TYPES[problem.query_type]
    signature = {"q": f"*{element}", "k": f"*{element}", "v": f"*{element}", "o": f"*{element}"}
    if problem.mask_tensor:
        signature["mk"] = f"*{MASK_TYPES[problem.mask_type]}"
    constants = _constants(problem, params)
    buffers = len(signature)  # the operands: IREE's bindings
    if length_roles(problem):  # the length, a value after them (IREE's push constant)
        signature["L"] = "i32"
    else:
        constants["L"] = None
    return triton_binary(
        _kernel(), signature, constants, buffers, arch, params.warps, params.stages, path
    )


def params_unsupported(problem: AttentionProblem, params: FlashParams) -> str | None:
    """Why a point cannot run this problem, or None: under a causal mask the diagonal
    blocks start at a query block's first row, so key blocks must tile query blocks."""
    if problem.causal and params.block_m % params.block_n:
        return f"causal: block_n {params.block_n} does not divide block_m {params.block_m}"
    return None


def extern_function(
    problem: AttentionProblem,
    params: FlashParams,
    binary: KernelBinary,
    executable_target: str,
    name: str,
    kind: str = "func.func",
) -> str:
    """A function `name(q, k, v[, mask]) -> out` that runs the kernel as a
    `hal.dispatch.extern` (`kind` util.func for a substitution spec to call); a causal mask
    is the kernel's own, a mask tensor an operand. For a DYNAMIC length the operands' `?`
    are that length, read from q's rows, and the grid follows it."""
    _, out = operand_tensor_types(problem)
    inputs = kernel_inputs(problem)
    rows = None
    if length_roles(problem):
        entries = math.prod(problem.batch_sizes)
        dim = problem.operand_loops[0].index(problem.positions("m")[0])
        rows = DynamicRows(operand=0, dim=dim, block=params.block_m, y=entries)
        workgroups = (1, entries, 1)
    else:
        workgroups = grid(problem, params)
    return dispatch_extern_function(
        name, kind, inputs, out, binary, executable_target, workgroups, rows=rows
    )
