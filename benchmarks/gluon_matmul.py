"""A warp-specialized Hopper matmul in Gluon against the Triton family and cuBLAS (issue 24).

The Llama-3-8B layer's MLP runs its three matmuls in Triton kernels at 630-700 TFLOP/s on
the H200, where cuBLAS runs 790-820 (session 26): 0.23 ms a call, the largest gap left.
Triton 3.6 does not warp-specialize a matmul for sm_90, and more points of the family did
not close it. cuBLAS's Hopper kernels keep one warp issuing TMA copies into a ring of
shared-memory stages while two warpgroups run wgmma out of it. Gluon (Triton's
layout-explicit language) can write that kernel: this measures whether it pays before the
custom family grows such a form.

The kernel: C = A·Wᵀ (A [M, K], W [N, K] as nn.Linear stores it, bf16 in, f32 accumulate,
bf16 out), persistent (one workgroup per SM taking output blocks in turn, G rows of blocks
at a time), TMA descriptors made on the device as IREE's custom dispatches need them (its
global scratch); a loader warp fills STAGES stages, and the default partition's warps run
wgmma with one in flight, freeing each stage as its MMA completes, then store the block.
With SWIGLU the block is SiLU(gate) * (A·Wᵀ), gate read in the epilogue (the up
projection's form in the custom build).

Times with triton.testing.do_bench (median ms; TFLOP/s), on the Llama shapes:

    python3 benchmarks/gluon_matmul.py [--tokens 2048] [--check]
"""

from __future__ import annotations

import argparse

import triton
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
def tile_of(tile, M: gl.constexpr, N: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
            G: gl.constexpr):  # fmt: skip
    # The output block of the persistent loop's `tile`: G rows of blocks at a time.
    blocks_m: gl.constexpr = (M + BM - 1) // BM
    blocks_n: gl.constexpr = (N + BN - 1) // BN
    first = tile // (G * blocks_n) * G
    size = min(blocks_m - first, G)
    return first + (tile % (G * blocks_n)) % size, (tile % (G * blocks_n)) // size


@gluon.jit
def load_partition(a_desc, w_desc, a_bufs, w_bufs, ready, empty,
                   M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BM: gl.constexpr,
                   BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                   G: gl.constexpr):  # fmt: skip
    # One warp: each block's K steps copied into the ring, a stage refilled once the MMA
    # that read it has freed it.
    tiles: gl.constexpr = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
    steps: gl.constexpr = (K + BK - 1) // BK
    count = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        pm, pn = tile_of(tile, M, N, BM, BN, G)
        for step in range(steps):
            stage = count % STAGES
            mbarrier.wait(empty.index(stage), ((count // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, a_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pm * BM, step * BK], bar, a_bufs.index(stage))
            tma.async_copy_global_to_shared(w_desc, [pn * BN, step * BK], bar, w_bufs.index(stage))
            count += 1


@gluon.jit
def mma_partition(c, gate, c_desc, c_smem, a_bufs, w_bufs, ready, empty,
                  M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BM: gl.constexpr,
                  BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, G: gl.constexpr,
                  SWIGLU: gl.constexpr, TMA_STORE: gl.constexpr):  # fmt: skip
    # The default partition's warps: wgmma out of the ring, one MMA in flight, then the
    # block's epilogue and store.
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BN, 16]
    )
    tiles: gl.constexpr = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
    steps: gl.constexpr = (K + BK - 1) // BK
    count = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        pm, pn = tile_of(tile, M, N, BM, BN, G)
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
        for step in range(steps):
            stage = count % STAGES
            mbarrier.wait(ready.index(stage), (count // STAGES) & 1)
            a, w = a_bufs.index(stage), w_bufs.index(stage)
            acc = warpgroup_mma(a, w.permute((1, 0)), acc, is_async=True)
            acc, a, w = warpgroup_mma_wait(1, deps=(acc, a, w))
            # The previous step's MMA has completed: its stage is free.
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=step > 0)
            count += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        out = acc.to(gl.bfloat16)
        rm = pm * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
        rn = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        offsets = rm[:, None] * N + rn[None, :]
        if SWIGLU:
            g = gl.load(gate + offsets).to(gl.float32)
            silu = (g / (1.0 + gl.exp(-g))).to(gl.bfloat16).to(gl.float32)
            out = (silu * out.to(gl.float32)).to(gl.bfloat16)
        if TMA_STORE:
            tma.store_wait(pendings=0)  # the previous block's store has read c_smem
            c_smem.store(out)
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [pm * BM, pn * BN], c_smem)
        else:
            gl.store(c + offsets, out)
    if TMA_STORE:
        tma.store_wait(pendings=0)


@gluon.jit
def ws_matmul(a, w, gate, c,
              M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BM: gl.constexpr,
              BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, G: gl.constexpr,
              SWIGLU: gl.constexpr, TMA_STORE: gl.constexpr, LOAD_REGS: gl.constexpr):  # fmt: skip
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16)
    a_desc = tma.make_tensor_descriptor(a, [M, K], [K, 1], [BM, BK], a_layout)
    w_desc = tma.make_tensor_descriptor(w, [N, K], [K, 1], [BN, BK], w_layout)
    c_desc = tma.make_tensor_descriptor(c, [M, N], [N, 1], [BM, BN], c_layout)
    a_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], a_layout)
    w_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], w_layout)
    if TMA_STORE:
        c_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], c_layout)
    else:
        c_smem = a_bufs  # unused
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [
            (mma_partition, (c, gate, c_desc, c_smem, a_bufs, w_bufs, ready, empty, M, N, K,
                             BM, BN, BK, STAGES, G, SWIGLU, TMA_STORE)),
            (load_partition, (a_desc, w_desc, a_bufs, w_bufs, ready, empty, M, N, K, BM, BN,
                              BK, STAGES, G)),
        ],
        [1],
        [LOAD_REGS],
    )  # fmt: skip


CONFIGS = [  # (BM, BN, BK, STAGES, G, warps, TMA_STORE)
    (128, 256, 64, 3, 8, 8, True),
    (128, 256, 64, 4, 8, 8, False),
    (128, 256, 64, 3, 8, 8, False),
    (128, 128, 64, 5, 8, 8, True),
    (128, 256, 64, 3, 1, 8, True),
]


def compile_for(M, N, K, config, swiglu, arch=90):
    """The kernel compiled for sm_90 without a GPU (what IREE would embed)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    bm, bn, bk, stages, g, warps, tma_store = config
    constants = dict(M=M, N=N, K=K, BM=bm, BN=bn, BK=bk, STAGES=stages, G=g,
                     SWIGLU=swiglu, TMA_STORE=tma_store, LOAD_REGS=40)  # fmt: skip
    signature = {"a": "*bf16", "w": "*bf16", "gate": "*bf16", "c": "*bf16"}
    signature |= {name: "constexpr" for name in constants}
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    source = GluonASTSource(ws_matmul, signature, constants, aligned)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--compile-only", action="store_true", help="no GPU: compile and report")
    options = parser.parse_args()
    shapes = {  # name: (N, K, SwiGLU epilogue)
        "q/o 4096x4096": (4096, 4096, False),
        "gate 14336x4096": (14336, 4096, False),
        "up+SwiGLU 14336x4096": (14336, 4096, True),
        "down 4096x14336": (4096, 14336, False),
    }
    if options.compile_only:
        for name, (n, k, swiglu) in shapes.items():
            for config in CONFIGS:
                compiled = compile_for(options.tokens, n, k, config, swiglu)
                ptx = compiled.asm["ptx"]
                print(name, config, "shared", compiled.metadata.shared, "warps",
                      compiled.metadata.num_warps, "scratch",
                      compiled.metadata.global_scratch_size, "setmaxnreg", ptx.count("setmaxnreg"),
                      "wgmma", ptx.count("wgmma.mma_async"))  # fmt: skip
        return
    run_on_gpu(options.tokens, shapes)


def gluon_launcher(a, w, gate, c, config, swiglu: bool, sms: int):
    """A no-argument launch of the Gluon kernel at `config`."""
    bm, bn, bk, stages, g, warps, tma_store = config
    (m, k), n = a.shape, w.shape[0]
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
    constants = (m, n, k, bm, bn, bk, stages, g, swiglu, tma_store, 40)
    return lambda: ws_matmul[grid](a, w, gate, c, *constants, num_warps=warps)


def family_launcher(a, w, gate, c, swiglu: bool):
    """The custom family's pointer kernel as the campaign picks it (128x256x64, 8 warps,
    3 stages; swiglu_kernel.py's `projection`, the same loop)."""
    from swiglu_kernel import projection

    (m, k), n = a.shape, w.shape[0]
    grid = (triton.cdiv(m, 128) * triton.cdiv(n, 256),)
    options = {"BM": 128, "BN": 256, "BK": 64, "G": 8, "num_warps": 8, "num_stages": 3}
    return lambda: projection[grid](a, w, gate, c, m, n, k, SWIGLU=swiglu, **options)


def row(name: str, label: str, launch, c, expected, flops: int) -> str:
    """One table row: the launch's median time, TFLOP/s and error (or why it failed)."""
    try:
        launch()
        error = (c.float() - expected.float()).abs().max().item()
        ms = triton.testing.do_bench(launch, return_mode="median")
        return f"| {name} | {label} | {ms:.4f} | {flops / ms / 1e9:.0f} | {error:.3g} |"
    except Exception as failure:  # noqa: BLE001 - a kernel that fails is a row that says so
        return f"| {name} | {label} | failed: {str(failure).splitlines()[0][:100]} | | |"


def run_on_gpu(tokens: int, shapes: dict) -> None:
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    triton.set_allocator(lambda size, _, __: torch.empty(size, dtype=torch.int8, device="cuda"))
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}")
    print("\n| shape | kernel | ms | TFLOP/s | max error |\n| --- | --- | --- | --- | --- |")
    torch.manual_seed(0)
    linear, silu = torch.nn.functional.linear, torch.nn.functional.silu
    for name, (n, k, swiglu) in shapes.items():
        a = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16) / 8
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 8
        gate = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
        flops = 2 * tokens * n * k
        if swiglu:
            expected = silu(gate) * linear(a, w)
            torch_rows = [
                ("cuBLAS, then SiLU x up (torch)", lambda a=a, w=w, g=gate: silu(g) * linear(a, w))
            ]
        else:
            expected = linear(a, w)
            torch_rows = [("cuBLAS (torch)", lambda a=a, w=w, c=c: torch.matmul(a, w.T, out=c))]
        for label, launch in torch_rows:
            ms = triton.testing.do_bench(launch, return_mode="median")
            print(f"| {name} | {label} | {ms:.4f} | {flops / ms / 1e9:.0f} | - |", flush=True)
        family = family_launcher(a, w, gate, c, swiglu)
        print(row(name, "family 128x256x64 w8 s3", family, c, expected, flops), flush=True)
        for config in CONFIGS:
            bm, bn, bk, stages, g, warps, tma_store = config
            label = f"gluon {bm}x{bn}x{bk} s{stages} g{g} w{warps}" + (" tma" if tma_store else "")
            launch = gluon_launcher(a, w, gate, c, config, swiglu, sms)
            print(row(name, label, launch, c, expected, flops), flush=True)


if __name__ == "__main__":
    main()
