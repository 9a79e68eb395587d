"""The custom matmul family's warp-specialized form, written in Gluon (issue 24).

Triton 3.6 does not warp-specialize a matmul for sm_90: its kernels issue their loads and
their wgmma from the same warps, and on the Llama-3-8B layer's MLP they ran at 630-700
TFLOP/s on the H200 where cuBLAS ran 790-820. cuBLAS's Hopper kernels give one warp the
TMA copies into a ring of shared-memory stages and the other warps the wgmma out of it.
Gluon, Triton's layout-explicit language (`triton.experimental.gluon`, in Triton 3.6),
writes that kernel: `specialized_matmul` is persistent (one workgroup per SM taking the
output blocks in turn, G rows of blocks at a time), makes its TMA descriptors on the device
(in Triton's global scratch, as the family's persistent form does), and splits into

- a loader warp that copies each block's K steps of A and B into STAGES stages, refilling
  a stage once the MMA that read it has freed it (an mbarrier pair a stage);
- the workgroup's warps, which run wgmma on each stage with one in flight, free the stage
  before, and then apply the epilogue and store the block from registers (the family's
  `STORE_TILE`, so every epilogue form the family writes works here too).

An epilogue's statements are Triton-language text (ops/epilogue.py); the source names
Gluon's equivalents `tl` so that the same text compiles. This module is the kernel's text
only; cuda_custom.py compiles it (`GluonASTSource`) and launches it like its other forms.
"""

from __future__ import annotations

# The source's first lines: Gluon, and the `tl` names an epilogue's statements use (a
# module, since a kernel may read modules and constexprs from its globals). A constant of
# the epilogue (`tl.full([1, 1], v, T)`) is a scalar that broadcasts to the tile's layout.
# `compat`: what Gluon renamed between Triton 3.6 and 3.9.
GLUON_PRELUDE = """import types

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def scalar_full(shape: gl.constexpr, value: gl.constexpr, dtype: gl.constexpr):
    return gl.to_tensor(value).to(dtype)


tl = types.ModuleType("tl")
for _name in ("constexpr", "float16", "bfloat16", "float32", "load", "store", "where", "exp",
              "abs", "sqrt", "maximum", "minimum"):
    setattr(tl, _name, getattr(gl, _name))
tl.full = scalar_full
tl.math = types.ModuleType("math")
tl.math.rsqrt, tl.math.erf = gl.rsqrt, gl.erf

# Gluon's names that moved between Triton releases (3.6's, then 3.9's).
compat = types.ModuleType("compat")
compat.copy_in = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
compat.copy_out = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
"""

SPECIALIZED_KERNEL_SOURCE = """

@gluon.jit
def block_of(block, M: gl.constexpr, N: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
             G: gl.constexpr):
    # The output block of the persistent loop's `block`: G rows of blocks at a time.
    blocks_n: gl.constexpr = (N + BN - 1) // BN
    first = block // (G * blocks_n) * G
    size = min((M + BM - 1) // BM - first, G)
    return first + (block % (G * blocks_n)) % size, (block % (G * blocks_n)) // size


@gluon.jit
def load_stages(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M: gl.constexpr,
                N: gl.constexpr, K: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                BK: gl.constexpr, G: gl.constexpr, STAGES: gl.constexpr,
                A_MK: gl.constexpr, B_KN: gl.constexpr):
    # The loader warp: each block's K steps of A and B copied into the ring of stages.
    blocks: gl.constexpr = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
    count = 0
    for block in range(gl.program_id(0), blocks, gl.num_programs(0)):
        pm, pn = block_of(block, M, N, BM, BN, G)
        for k in range(0, K, BK):
            stage = count % STAGES
            mbarrier.wait(empty.index(stage), ((count // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            if A_MK:
                compat.copy_in(a_desc, [pm * BM, k], bar, a_bufs.index(stage))
            else:
                compat.copy_in(a_desc, [k, pm * BM], bar, a_bufs.index(stage))
            if B_KN:
                compat.copy_in(b_desc, [k, pn * BN], bar, b_bufs.index(stage))
            else:
                compat.copy_in(b_desc, [pn * BN, k], bar, b_bufs.index(stage))
            count += 1


@gluon.jit
def multiply_and_store(a_bufs, b_bufs, ready, empty, c_desc, c_smem, batch, $params c,
                       M: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                       scb: gl.constexpr, scm: gl.constexpr, scn: gl.constexpr,
                       BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, G: gl.constexpr,
                       EVEN: gl.constexpr, STAGES: gl.constexpr, A_MK: gl.constexpr,
                       B_KN: gl.constexpr, TMA_STORE: gl.constexpr):
    # The MMA warps: wgmma on each stage with one in flight, the stage before freed once
    # its MMA is done; then the block's epilogue, and its store by TMA out of c_smem while
    # the next block runs (TMA_STORE), or from registers.
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BN, 16]
    )
    blocks: gl.constexpr = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
    count = 0
    for block in range(gl.program_id(0), blocks, gl.num_programs(0)):
        pm, pn = block_of(block, M, N, BM, BN, G)
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
        for k in range(0, K, BK):
            stage = count % STAGES
            mbarrier.wait(ready.index(stage), (count // STAGES) & 1)
            x, y = a_bufs.index(stage), b_bufs.index(stage)
            if A_MK:
                x_tile = x
            else:
                x_tile = x.permute((1, 0))
            if B_KN:
                y_tile = y
            else:
                y_tile = y.permute((1, 0))
            acc = warpgroup_mma(x_tile, y_tile, acc, is_async=True)
            acc, x, y = warpgroup_mma_wait(1, deps=(acc, x, y))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k > 0)
            count += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        rm = pm * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
        rn = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        c_ptrs = c + batch * scb + rm[:, None] * scm + rn[None, :] * scn
$store_tile
    if TMA_STORE:
        tma.store_wait(0)


@gluon.jit
def staged_operand(base, rows: gl.constexpr, columns: gl.constexpr, stride: gl.constexpr,
                   BR: gl.constexpr, BC: gl.constexpr, STAGES: gl.constexpr):
    # A TMA descriptor over a [rows, columns] operand (its rows `stride` apart) and the
    # ring of STAGES [BR, BC] blocks it fills.
    dtype: gl.constexpr = base.dtype.element_ty
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BR, BC], dtype)
    desc = tma.make_tensor_descriptor(base, [rows, columns], [stride, 1], [BR, BC], layout)
    return desc, gl.allocate_shared_memory(dtype, [STAGES, BR, BC], layout)


@gluon.jit
def specialized_matmul(
$parameters
    PROGRAMS: tl.constexpr, STAGES: tl.constexpr, TMA_STORE: tl.constexpr,
):
    batch = gl.program_id(1)
    A_MK: gl.constexpr = sak == 1  # A's rows along K
    B_KN: gl.constexpr = sbn == 1  # B's rows along N (else a weight as nn.Linear stores it)
    if A_MK:
        a_desc, a_bufs = staged_operand(a + batch * sab, M, K, sam, BM, BK, STAGES)
    else:
        a_desc, a_bufs = staged_operand(a + batch * sab, K, M, sak, BK, BM, STAGES)
    if B_KN:
        b_desc, b_bufs = staged_operand(b + batch * sbb, K, N, sbk, BK, BN, STAGES)
    else:
        b_desc, b_bufs = staged_operand(b + batch * sbb, N, K, sbn, BN, BK, STAGES)
    if TMA_STORE:  # C row-major, a block of it beside the stages
        c_type: gl.constexpr = c.dtype.element_ty
        c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], c_type)
        c_desc = tma.make_tensor_descriptor(c + batch * scb, [M, N], [scm, 1], [BM, BN], c_layout)
        c_smem = gl.allocate_shared_memory(c_type, [BM, BN], c_layout)
    else:  # unused
        c_desc, c_smem = a_desc, a_bufs
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [
            (multiply_and_store, (a_bufs, b_bufs, ready, empty, c_desc, c_smem, batch, $params c,
                                  M, N, K, scb, scm, scn, BM, BN, BK, G, EVEN, STAGES, A_MK,
                                  B_KN, TMA_STORE)),
            (load_stages, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, BM, BN, BK,
                           G, STAGES, A_MK, B_KN)),
        ],
        [1],
        [$loader_registers],
    )
"""

# The block's store when TMA_STORE: the block before must have left c_smem (TMA bounds the
# copy by C's shape, so no mask); else cuda_custom.py's PLAIN_STORE from registers.
TMA_STORE = """    if TMA_STORE:
        tma.store_wait(0)
        c_smem.store(value)
        fence_async_shared()
        compat.copy_out(c_desc, [pm * BM, pn * BN], c_smem)
    elif EVEN:
        tl.store(c_ptrs, value)
    else:
        tl.store(c_ptrs, value, mask=inside)"""

LOADER_REGISTERS = 40  # the loader warp's registers (setmaxnreg); the MMA warps get the rest
# Threads beside the MMA warps: Gluon gives the one loader warp a warpgroup of its own.
LOADER_THREADS = 128
