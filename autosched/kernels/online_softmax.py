"""The online softmax over blocks of keys that the attention families share (flash
attention over all keys, flash decoding over a share of them): defined where Triton is
imported, as the kernels that inline it are."""

from __future__ import annotations


def key_blocks(triton, tl):
    """The attention kernels' loop over blocks of keys (a @triton.jit helper Triton
    inlines), built where Triton is imported."""

    @triton.jit
    def fold(
        acc, m_i, l_i, q, k_base, v_base, mk_base, rows, mk_rows, start, stop,
        skr, skc, svr, svc, smc, M, N, D: tl.constexpr, DV: tl.constexpr, SCALE: tl.constexpr,
        BN: tl.constexpr, DIAGONAL: tl.constexpr, EVEN_N: tl.constexpr, MASK: tl.constexpr,
    ):  # fmt: skip
        """Key rows [start, stop) in blocks of BN, folded into the online softmax; on the
        DIAGONAL blocks the causal mask hides keys after each query row; a MASK tensor keeps
        keys (KEEP) or is added to the scores (ADD), its rows at the offsets `mk_rows` (the
        block's `rows` below M are live); keys past N are masked unless EVEN_N. Sizes and
        strides are the kernel's constants, or values it was launched with (a length known
        at run time)."""
        d = tl.arange(0, D)
        dv = tl.arange(0, DV)
        for first in range(start, stop, BN):
            cols = first + tl.arange(0, BN)
            k_ptrs = k_base + cols[None, :] * skr + d[:, None] * skc
            v_ptrs = v_base + cols[:, None] * svr + dv[None, :] * svc
            if EVEN_N:
                kt = tl.load(k_ptrs)
            else:
                kt = tl.load(k_ptrs, mask=cols[None, :] < N, other=0.0)
            s = tl.dot(q, kt) * SCALE  # log2 units: exp2 below
            if DIAGONAL:
                s = tl.where(rows[:, None] >= cols[None, :], s, float("-inf"))
            if MASK != 0:
                inside = (rows[:, None] < M) & (cols[None, :] < N)
                mk_ptrs = mk_base + mk_rows[:, None] + cols[None, :] * smc
                given = tl.load(mk_ptrs, mask=inside, other=0)
                if MASK == 1:  # KEEP
                    s = tl.where(given != 0, s, float("-inf"))
                else:  # ADD, in the scores' log2 units
                    s = s + given.to(tl.float32) * 1.4426950408889634
            if not EVEN_N:
                s = tl.where(cols[None, :] < N, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if MASK != 0:  # a row whose keys are all masked so far: nothing to scale by
                m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            if EVEN_N:
                vt = tl.load(v_ptrs)
            else:
                vt = tl.load(v_ptrs, mask=cols[:, None] < N, other=0.0)
            acc = tl.dot(p.to(vt.dtype), vt, acc * alpha[:, None])
            m_i = m_new
        return acc, m_i, l_i

    @triton.jit
    def key_blocks(
        acc, m_i, l_i, q, k_base, v_base, mk_base, rows, mk_rows, start, stop,
        skr, skc, svr, svc, smc, M, N, D, DV, SCALE, BN, DIAGONAL, EVEN_N, MASK,
    ):  # fmt: skip
        """`fold` (D to MASK: the kernel's constexprs) over [start, stop): where N is not a
        whole number of blocks, only the last block reaches past it, so the blocks before
        it load unmasked (a masked load along a contiguous dim is an element a load)."""
        if EVEN_N:
            acc, m_i, l_i = fold(
                acc, m_i, l_i, q, k_base, v_base, mk_base, rows, mk_rows, start, stop,
                skr, skc, svr, svc, smc, M, N, D, DV, SCALE, BN, DIAGONAL, True, MASK,
            )  # fmt: skip
        else:
            whole = start + (stop - start) // BN * BN
            acc, m_i, l_i = fold(
                acc, m_i, l_i, q, k_base, v_base, mk_base, rows, mk_rows, start, whole,
                skr, skc, svr, svc, smc, M, N, D, DV, SCALE, BN, DIAGONAL, True, MASK,
            )  # fmt: skip
            acc, m_i, l_i = fold(
                acc, m_i, l_i, q, k_base, v_base, mk_base, rows, mk_rows, whole, stop,
                skr, skc, svr, svc, smc, M, N, D, DV, SCALE, BN, DIAGONAL, False, MASK,
            )  # fmt: skip
        return acc, m_i, l_i

    return key_blocks


def entry_offset(triton, tl):  # noqa: ARG001 - built like key_blocks
    """The element offset of batch entry `entry` in an operand (a @triton.jit helper): the
    entry split into the three batch loops (B1 and B2 the inner two's sizes), times the
    operand's strides along them."""

    @triton.jit
    def entry_offset(entry, sb0, sb1, sb2, B1, B2):  # the kernel's constexprs, inlined
        return (entry // (B1 * B2)) * sb0 + ((entry // B2) % B1) * sb1 + (entry % B2) * sb2

    return entry_offset


def by_length(triton, tl):  # noqa: ARG001 - built like key_blocks
    """An operand's five strides (three batch loops, row, column), each multiplied by the
    length `L` where its bit of BY (from SHIFT) is set, by L squared where its bit of BY2
    is: a stride over loops of the length's size, known at run time (a @triton.jit
    helper)."""

    @triton.jit
    def scaled(stride, L, BY, BY2, BIT):  # BY, BY2, BIT: the kernel's constexprs
        if (BY >> BIT) & 1:
            stride = stride * L
        if (BY2 >> BIT) & 1:
            stride = stride * L * L
        return stride

    @triton.jit
    def by_length(s0, s1, s2, sr, sc, L, BY, BY2, SHIFT):
        s0 = scaled(s0, L, BY, BY2, SHIFT)
        s1 = scaled(s1, L, BY, BY2, SHIFT + 1)
        s2 = scaled(s2, L, BY, BY2, SHIFT + 2)
        sr = scaled(sr, L, BY, BY2, SHIFT + 3)
        sc = scaled(sc, L, BY, BY2, SHIFT + 4)
        return s0, s1, s2, sr, sc

    return by_length


def length_or(triton, tl):  # noqa: ARG001 - built like key_blocks
    """A size: the length `L` known at launch where BY is set, else the constant `value`
    (a @triton.jit helper)."""

    @triton.jit
    def length_or(value, L, BY):  # BY: the kernel's constexpr
        size = value
        if BY:
            size = L
        return size

    return length_or
