"""Flash decoding: attention for a few query rows over many keys (a decode step against its
KV cache), as IREE custom dispatches.

With one query row per head, flash attention has one workgroup per head: 32 of the H200's
132 SMs for a Llama decode at batch 1, each reading the whole cache. Flash decoding (Dao et
al.'s split-KV forward) splits the keys in `splits` shares, one workgroup each: every share
folds its keys into a partial online softmax (its running max, sum and unnormalized output,
written to a workspace), and the last share of a batch entry to finish, counted on an
atomic lock, folds the partials together and writes the output. The lock goes back to 0 for
the next call (the locks are an operand that starts at zero, as the matmul family's split-K
locks are; the workspace is allocated, never filled). One kernel, no second dispatch.

The query rows (at most MAX_ROWS, padded to a block of at least 16 for the tensor cores)
stay in one block; a mask tensor (the static cache's valid positions) is applied as flash
attention applies it (kernels/online_softmax.py, kernels/attention_layout.py).

Grouped-query attention: where the op reads K and V from the cache as it is (a batch loop of
the query heads that share a KV head, which K and V do not index; the form over the sources
of the per-head copies, rewrite/attention_sources.py), the rows of a group's heads are
packed into the one block (`group_loop`), so each share reads its keys once for the whole
group instead of once per query head: a Llama decode's 4 heads a KV head read a quarter of
the cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autosched.errors import UserError
from autosched.kernels import attention_layout, online_softmax
from autosched.kernels.attention_layout import (
    MASK_TYPES,
    MAX_BATCH_LOOPS,
    batch_sizes,
    kernel_inputs,
    layout_constants,
    operand_strides,
    operand_tensor_types,
)
from autosched.kernels.base import KernelBinary
from autosched.kernels.extern import dispatch_extern_function
from autosched.kernels.triton import TRITON_TYPES, import_triton, triton_binary
from autosched.ops.attention import AttentionProblem

MAX_ROWS = 64  # query rows: a decode step's few tokens (more are flash attention's)
MIN_ROWS = 16  # the smallest block of rows a tensor-core dot takes


@dataclass(frozen=True)
class DecodingParams:
    """One point of the family."""

    block_m: int  # the query rows, padded
    block_n: int  # keys per step
    splits: int  # shares of the keys, one workgroup each
    warps: int
    stages: int

    @property
    def name(self) -> str:
        return f"fd_m{self.block_m}_n{self.block_n}_k{self.splits}_w{self.warps}_s{self.stages}"


def unsupported(problem: AttentionProblem) -> str | None:
    """Why the family cannot compute this attention, or None."""
    why = attention_layout.unsupported(problem)
    if why:
        return why
    if attention_layout.length_roles(problem):
        return "flash decoding runs at one length of the cache"
    if problem.causal:
        return "flash decoding takes no causal mask (a prompt's rows are flash attention's)"
    if problem.size("m") > MAX_ROWS:
        return f"flash decoding takes up to {MAX_ROWS} query rows, not {problem.size('m')}"
    return None


def group_loop(problem: AttentionProblem) -> int | None:
    """The batch loop of the query heads that share a KV head (Q indexes it, K and V do
    not: grouped-query attention over the cache as it is), when its heads' rows fit one
    block; else None."""
    sizes, rows = batch_sizes(problem), problem.size("m")
    q, k, v = (operand_strides(problem, operand) for operand in range(3))
    for index in range(len(problem.positions("b"))):
        loop = f"b{index}"
        shared = k[loop] == v[loop] == 0 and q[loop] != 0
        if shared and 1 < sizes[index] and sizes[index] * rows <= MAX_ROWS:
            return index
    return None


def packed_rows(problem: AttentionProblem) -> int:
    """The rows of one workgroup's block: the query rows of every head of a group."""
    loop = group_loop(problem)
    return problem.size("m") * (1 if loop is None else batch_sizes(problem)[loop])


def rows_block(problem: AttentionProblem) -> int:
    """The packed rows padded to a power of two, at least MIN_ROWS."""
    return max(MIN_ROWS, 1 << (packed_rows(problem) - 1).bit_length())


def block_rows(problem: AttentionProblem, params: DecodingParams) -> int:
    """The block of rows a point runs: its own, or the packed rows' where they need more (a
    point searched on the op form, placed where the form over the cache packs a group)."""
    return max(params.block_m, rows_block(problem))


def key_blocks(problem: AttentionProblem, block_n: int) -> int:
    return math.ceil(problem.size("k2") / block_n)


def chunk(problem: AttentionProblem, params: DecodingParams) -> int:
    """Keys per share, whole blocks of them (a block never crosses into the next share)."""
    return math.ceil(key_blocks(problem, params.block_n) / params.splits) * params.block_n


def params_unsupported(problem: AttentionProblem, params: DecodingParams) -> str | None:
    """Why a point cannot run this problem, or None."""
    if params.block_m < problem.size("m"):
        return f"block_m {params.block_m} holds fewer than the {problem.size('m')} query rows"
    if params.splits < 2:
        return "one share of the keys is flash attention's kernel"
    if params.splits > key_blocks(problem, params.block_n):
        return f"{params.splits} shares of {key_blocks(problem, params.block_n)} key blocks"
    return None


def entries(problem: AttentionProblem) -> int:
    """Batch entries a workgroup of each share serves: a group's heads count as one."""
    return math.prod(problem.batch_sizes) * problem.size("m") // packed_rows(problem)


def workspace_floats(problem: AttentionProblem, params: DecodingParams) -> int:
    """The partials of every share: its output rows, then their max and their sum."""
    rows = block_rows(problem, params)
    return entries(problem) * params.splits * rows * (problem.size("n") + 2)


def grid(problem: AttentionProblem, params: DecodingParams) -> tuple[int, int, int]:
    """Workgroups: one per share of the keys, times every batch entry."""
    return params.splits, entries(problem), 1


def _kernel():
    """The Triton kernel (defined here so that importing this module needs no Triton)."""
    triton = import_triton()
    import triton.language as tl  # noqa: PLC0415 - an optional extra, imported where it is used

    fold_keys = online_softmax.key_blocks(triton, tl)
    offset = online_softmax.entry_offset(triton, tl)
    fold_partials = _fold_partials(triton, tl)

    @triton.jit
    def flash_decoding(
        q, k, v, mk, o, lock, part,
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
        sqg: tl.constexpr, sog: tl.constexpr, smg: tl.constexpr, ROWS: tl.constexpr,
        B1: tl.constexpr, B2: tl.constexpr, M: tl.constexpr, N: tl.constexpr,
        D: tl.constexpr, DV: tl.constexpr, SCALE: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, EVEN_N: tl.constexpr, SPLITS: tl.constexpr,
        CHUNK: tl.constexpr,
    ):  # fmt: skip
        share = tl.program_id(0)
        entry = tl.program_id(1)
        rows = tl.arange(0, BM)  # a group's heads, M query rows each (ROWS in all)
        head = rows // M
        row = rows - head * M
        live = rows < ROWS
        dv = tl.arange(0, DV)
        q_base = q + qo + offset(entry, sqb0, sqb1, sqb2, B1, B2)
        k_base = k + ko + offset(entry, skb0, skb1, skb2, B1, B2)
        v_base = v + vo + offset(entry, svb0, svb1, svb2, B1, B2)
        mk_base = mk
        if MASK != 0:
            mk_base = mk + offset(entry, smb0, smb1, smb2, B1, B2)
        q_ptrs = q_base + (head * sqg + row * sqr)[:, None] + tl.arange(0, D)[None, :] * sqc
        qt = tl.load(q_ptrs, mask=live[:, None], other=0.0)
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, DV], dtype=tl.float32)
        start = share * CHUNK
        stop = tl.minimum(start + CHUNK, N)
        acc, m_i, l_i = fold_keys(
            acc, m_i, l_i, qt, k_base, v_base, mk_base, rows, head * smg + row * smr, start,
            stop, skr, skc, svr, svc, smc, ROWS, N, D, DV, SCALE, BN, False, EVEN_N, MASK,
        )  # fmt: skip
        # This share's partial, then the lock: the last share of the entry folds them all.
        size: tl.constexpr = BM * (DV + 2)
        slot = part + (entry * SPLITS + share) * size
        tl.store(slot + rows[:, None] * DV + dv[None, :], acc)
        tl.store(slot + BM * DV + rows, m_i)
        tl.store(slot + BM * DV + BM + rows, l_i)
        tl.debug_barrier()  # every thread's partial lands before the lock counts it
        arrived = tl.atomic_add(lock + entry, 1, sem="acq_rel")
        if arrived == SPLITS - 1:
            result = fold_partials(part + entry * SPLITS * size, rows, dv, SPLITS, BM, DV)
            o_base = o + offset(entry, sob0, sob1, sob2, B1, B2)
            o_ptrs = o_base + (head * sog + row * sor)[:, None] + dv[None, :] * soc
            tl.store(o_ptrs, result.to(o.dtype.element_ty), mask=live[:, None])
            tl.atomic_xchg(lock + entry, 0)  # ready for the next call

    return flash_decoding


def _fold_partials(triton, tl):
    """The last share's fold of every share's partial (a @triton.jit helper, built where
    Triton is imported): each partial rescaled to the running max, then the rows divided
    by their sum. `base` is the entry's first partial; one is BM rows of DV outputs, then
    the rows' max and sum."""

    @triton.jit
    def fold_partials(base, rows, dv, SPLITS: tl.constexpr, BM: tl.constexpr, DV: tl.constexpr):
        size: tl.constexpr = BM * (DV + 2)
        m_all = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_all = tl.zeros([BM], dtype=tl.float32)
        out = tl.zeros([BM, DV], dtype=tl.float32)
        for other in range(SPLITS):
            share = base + other * size
            m_s = tl.load(share + BM * DV + rows, cache_modifier=".cg")
            l_s = tl.load(share + BM * DV + BM + rows, cache_modifier=".cg")
            a_s = tl.load(share + rows[:, None] * DV + dv[None, :], cache_modifier=".cg")
            m_new = tl.maximum(m_all, m_s)
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # no keys yet
            alpha = tl.math.exp2(m_all - m_new)
            beta = tl.math.exp2(m_s - m_new)
            out = out * alpha[:, None] + a_s * beta[:, None]
            l_all = l_all * alpha + l_s * beta
            m_all = m_new
        return out / l_all[:, None]

    return fold_partials


def constants(problem: AttentionProblem, params: DecodingParams) -> dict:
    """The kernel's constexprs for one point."""
    return {
        **packed_layout(problem),
        "ROWS": packed_rows(problem),
        "BM": block_rows(problem, params),
        "BN": params.block_n,
        "EVEN_N": problem.size("k2") % params.block_n == 0,
        "SPLITS": params.splits,
        "CHUNK": chunk(problem, params),
    }


def packed_layout(problem: AttentionProblem) -> dict:
    """The layout's constants (attention_layout.layout_constants) with the group loop taken
    out of the batch loops: its strides in Q, the output and the mask as sqg, sog, smg."""
    constants = layout_constants(problem)
    loop = group_loop(problem)
    constants |= {"sqg": 0, "sog": 0, "smg": 0}
    if loop is None:
        return constants
    others = [index for index in range(MAX_BATCH_LOOPS) if index != loop]
    for prefix in "qkvom":
        strides = [constants[f"s{prefix}b{index}"] for index in range(MAX_BATCH_LOOPS)]
        if prefix in "qom":
            constants[f"s{prefix}g"] = strides[loop]
        moved = [0] + [strides[index] for index in others]  # an outer loop of size 1
        constants |= {f"s{prefix}b{index}": moved[index] for index in range(MAX_BATCH_LOOPS)}
    sizes = batch_sizes(problem)
    constants["B1"], constants["B2"] = (sizes[index] for index in others)
    return constants


def compile_kernel(
    problem: AttentionProblem, params: DecodingParams, arch: str, path: str
) -> KernelBinary:
    """Triton's PTX and cubin for one point (no GPU needed)."""
    why = unsupported(problem) or params_unsupported(problem, params)
    if why:
        raise UserError(f"{params.name}: {why}")
    element = f"*{TRITON_TYPES[problem.query_type]}"
    signature = {"q": element, "k": element, "v": element}
    if problem.mask_tensor:
        signature["mk"] = f"*{MASK_TYPES[problem.mask_type]}"
    signature |= {"o": element, "lock": "*i32", "part": "*fp32"}
    return triton_binary(
        _kernel(),
        signature,
        constants(problem, params),
        len(signature),
        arch,
        params.warps,
        params.stages,
        path,
    )


def extern_function(
    problem: AttentionProblem,
    params: DecodingParams,
    binary: KernelBinary,
    executable_target: str,
    name: str,
    kind: str = "func.func",
) -> str:
    """A function `name(q, k, v[, mask]) -> out` that runs the kernel as a
    `hal.dispatch.extern`: its locks an operand that starts at zero, its workspace one
    that need not (every share writes its part before the last reads it)."""
    _, out = operand_tensor_types(problem)
    locks = [f"tensor<{entries(problem)}xi32>"]
    workspace = [f"tensor<{workspace_floats(problem, params)}xf32>"]
    workgroups = grid(problem, params)
    inputs = kernel_inputs(problem)
    return dispatch_extern_function(
        name, kind, inputs, out, binary, executable_target, workgroups, locks, workspace
    )
