"""Llama's MLP gate and up projections as one Triton kernel, against two (issue 24).

The Llama-3-8B layer's custom build runs the gate projection as one kernel and the up
projection as another whose epilogue reads the gate's result back and computes
SiLU(gate) x up (0.373 + 0.398 ms on the H200, session 26). Both read the same rows of the
normalized activations. One kernel can compute a block of both with two accumulators,
loading each tile of A once, and write only the product: the gate's 58 MB are neither
written nor read. Whether that pays on the H200 is what this measures before the family
grows such a form (model/epilogues.py would read the gate as a sibling contraction).

Times, with triton.testing.do_bench (median ms), on the Llama shape (2048 tokens, 4096 ->
14336, bf16, weights as nn.Linear stores them):

- two kernels: the gate's, then the up's with the SiLU(gate) x up epilogue (the family's
  plain form, 128x256x64 blocks, 8 warps, 3 stages, as the campaign picked);
- one fused kernel, 128 x (2 x BN) of work a block, for BN 64 and 128;
- torch: cuBLAS for both projections and the elementwise product, eager and torch.compile.

    python3 benchmarks/swiglu_kernel.py [--tokens 2048] [--hidden 4096] [--mlp 14336]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _block(M: tl.constexpr, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK, G):
    # This workgroup's rows, columns and first K offsets: blocks launched G rows of blocks
    # at a time, for L2 reuse (as the family's block_of).
    pid = tl.program_id(0)
    blocks_n = tl.cdiv(N, BN)
    first = pid // (G * blocks_n) * G
    size = min(tl.cdiv(M, BM) - first, G)
    pm, pn = first + (pid % (G * blocks_n)) % size, (pid % (G * blocks_n)) // size
    return pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)


@triton.jit
def _swiglu(g, u):
    # SiLU(g) * u on bf16 values, each step rounded to bf16 as the model rounds it.
    g = g.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32)
    return (silu * u.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def projection(
    a, w, gate, out, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr,
    SWIGLU: tl.constexpr,
):  # fmt: skip
    # out = A @ Wᵀ (W stored [N, K]); with SWIGLU, out = SiLU(gate) * (A @ Wᵀ).
    rm, rn, rk = _block(M, N, BM, BN, BK, G)
    pa = a + rm[:, None] * K + rk[None, :]
    pw = w + rn[None, :] * K + rk[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc = tl.dot(tl.load(pa), tl.load(pw), acc)
        pa += BK
        pw += BK
    offsets = rm[:, None] * N + rn[None, :]
    value = acc.to(tl.bfloat16)
    if SWIGLU:
        value = _swiglu(tl.load(gate + offsets), value)
    tl.store(out + offsets, value)


@triton.jit
def fused_swiglu(
    a, wg, wu, out, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    # out = SiLU(A @ Wgᵀ) * (A @ Wuᵀ): each tile of A loaded once for both products.
    rm, rn, rk = _block(M, N, BM, BN, BK, G)
    pa = a + rm[:, None] * K + rk[None, :]
    pg = wg + rn[None, :] * K + rk[:, None]
    pu = wu + rn[None, :] * K + rk[:, None]
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        x = tl.load(pa)
        acc_g = tl.dot(x, tl.load(pg), acc_g)
        acc_u = tl.dot(x, tl.load(pu), acc_u)
        pa += BK
        pg += BK
        pu += BK
    # Each projection rounded to bf16 before the product, as the model rounds it.
    value = _swiglu(acc_g.to(tl.bfloat16), acc_u.to(tl.bfloat16))
    tl.store(out + rm[:, None] * N + rn[None, :], value)


def two_kernels(x, wg, wu, blocks=(128, 256, 64), warps=8, stages=3):
    m, k = x.shape
    n = wg.shape[0]
    bm, bn, bk = blocks
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    gate = torch.empty(m, n, dtype=x.dtype, device=x.device)
    out = torch.empty_like(gate)
    options = {"BM": bm, "BN": bn, "BK": bk, "G": 8, "num_warps": warps, "num_stages": stages}
    projection[grid](x, wg, gate, gate, m, n, k, SWIGLU=False, **options)
    projection[grid](x, wu, gate, out, m, n, k, SWIGLU=True, **options)
    return out


def fused(x, wg, wu, blocks=(128, 128, 64), warps=8, stages=3):
    m, k = x.shape
    n = wg.shape[0]
    bm, bn, bk = blocks
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    fused_swiglu[grid](
        x, wg, wu, out, m, n, k, BM=bm, BN=bn, BK=bk, G=8, num_warps=warps, num_stages=stages
    )
    return out


def torch_swiglu(x, wg, wu):
    return torch.nn.functional.silu(x @ wg.T) * (x @ wu.T)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--mlp", type=int, default=14336)
    options = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(options.tokens, options.hidden, device="cuda", dtype=torch.bfloat16)
    wg, wu = (
        torch.randn(options.mlp, options.hidden, device="cuda", dtype=torch.bfloat16) * 0.02
        for _ in range(2)
    )
    expected = torch_swiglu(x, wg, wu).float()
    compiled = torch.compile(torch_swiglu)
    rows = [
        ("two kernels (gate; up with SiLU(gate) x up), 128x256x64 w8 s3", two_kernels),
        ("fused, 128 x 2x128 x 64, w8 s3", fused),
        ("fused, 128 x 2x128 x 64, w8 s4", lambda *t: fused(*t, stages=4)),
        ("fused, 128 x 2x64 x 64, w4 s4", lambda *t: fused(*t, (128, 64, 64), 4, 4)),
        ("fused, 64 x 2x128 x 64, w4 s4", lambda *t: fused(*t, (64, 128, 64), 4, 4)),
        ("torch eager (cuBLAS x2, then SiLU x up)", torch_swiglu),
        ("torch.compile", compiled),
    ]
    flops = 2 * 2 * options.tokens * options.hidden * options.mlp
    print(f"SwiGLU's gate and up, {options.tokens}x{options.hidden} -> {options.mlp}, bf16, ")
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}, torch {torch.__version__}")
    print("\n| kernels | ms (median) | TFLOP/s | max error against torch |")
    print("| --- | --- | --- | --- |")
    for name, function in rows:
        try:
            error = (function(x, wg, wu).float() - expected).abs().max().item()
            ms = triton.testing.do_bench(lambda f=function: f(x, wg, wu), return_mode="median")
            print(f"| {name} | {ms:.4f} | {flops / ms / 1e9:.0f} | {error:.3g} |", flush=True)
        except Exception as failure:  # noqa: BLE001 - a point that fails is a row that says so
            print(f"| {name} | failed: {str(failure).splitlines()[0][:80]} | | |", flush=True)


if __name__ == "__main__":
    main()
