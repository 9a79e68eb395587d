"""The flash-attention and flash-decoding kernel families (kernels/flash_attention/,
kernels/flash_decoding/) on the local NVIDIA GPU, launched by Triton, against torch's SDPA
on the same shapes; writes a markdown table.

    python3 benchmarks/flash_attention.py --out DIR [--shapes llama3_8b,llama32_1b_decode]

A `_decode` shape is one decode step (one query row per head) over a cache of C keys with
the cache's i1 mask (its last 10 % not yet written), K and V repeated per query head as the
exported model holds them: both families' points against SDPA on K and V not repeated,
and the time to read K and V once at the GPU's memory bandwidth (`--bandwidth`, GB/s).
Then flash decoding on the form the model runs once the rewrite reads the cache as it is
(`gqa` rows: K and V once per KV head, a group's query heads packed in one block of rows).

The attention is the Llama-3-8B layer's as IREE holds it before forming dispatches (32 query
heads on 8 KV heads, K broadcast to every head, V stored transposed, seq 2048, head dim 128,
bf16, causal): every point of a small grid is checked against SDPA's answer and timed in a
CUDA graph (median of 7 replays of 20 launches), beside SDPA (causal, GQA, on K and V not
repeated) and torch.compile of it.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from custom_kernels import graph_ms  # noqa: E402

from autosched.kernels.flash_attention.kernel import (  # noqa: E402
    FlashParams,
    _constants,
    _kernel,
    grid,
    params_unsupported,
)
from autosched.kernels.flash_decoding import kernel as decoding  # noqa: E402
from autosched.ops.attention import AttentionProblem  # noqa: E402

SHAPES = {
    # (heads, kv heads, seq, head dim, V transposed)
    "llama3_8b": (32, 8, 2048, 128, True),
    "llama3_8b_v_rows": (32, 8, 2048, 128, False),
    "bert_base": (12 * 8, 12 * 8, 512, 64, False),
    # ViT-B/16 at batch 32: 197 tokens (no multiple of any block), the zoo's row
    "vit_b16": (12 * 32, 12 * 32, 197, 64, False),
}
DECODE_SHAPES = {  # (batch, heads, kv heads, cache, head dim)
    "llama32_1b_decode": (1, 32, 8, 2048, 64),
    "llama32_1b_b8_decode": (8, 32, 8, 2048, 64),
    "llama3_8b_decode": (1, 32, 8, 4096, 128),
}
DECODE_FLASH = [FlashParams(64, n, 4, 2) for n in (64, 128)]
DECODE_SPLIT = [decoding.DecodingParams(16, n, k, 4, 2) for n in (64, 128) for k in (4, 8, 16, 32)]
GRID = {"block_m": [64, 128], "block_n": [32, 64, 128, 256], "warps": [4, 8], "stages": [2, 3]}


def problem_for(heads: int, seq: int, dim: int, v_transposed: bool, causal: bool):
    """The op form: loops (b, m, n, k1, k2); q (b, m, k1), k (b, k2, k1), v (b, n, k2) or
    (b, k2, n), mask (b, m, k2), out (b, m, n)."""
    v = (0, 2, 4) if v_transposed else (0, 4, 2)
    return AttentionProblem(
        loops=("b", "m", "n", "k1", "k2"),
        loop_sizes=(heads, seq, dim, dim, seq),
        query_type="bf16",
        key_type="bf16",
        value_type="bf16",
        mask_type="bf16" if causal else "",
        operand_loops=((0, 1, 3), (0, 4, 3), v, *([(0, 1, 4)] if causal else []), (0, 1, 2)),
        scale=1 / math.sqrt(dim),
        form="op",
        causal=causal,
        output_type="bf16",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="llama3_8b,llama3_8b_v_rows,bert_base")
    parser.add_argument("--bandwidth", type=float, default=4800.0, help="GB/s (the H200's)")
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    lines = [f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", ""]
    for shape in options.shapes.split(","):
        decode = shape in DECODE_SHAPES
        lines += run_decode(shape, options.bandwidth) if decode else run_shape(shape)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(options.out, "flash_attention.md"), "w") as handle:
        handle.write(text)
    print(text)


def run_shape(shape: str) -> list[str]:
    heads, kv_heads, seq, dim, v_transposed = SHAPES[shape]
    causal = shape.startswith("llama")
    problem = problem_for(heads, seq, dim, v_transposed, causal)
    torch.manual_seed(0)
    q = torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, kv_heads, seq, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, kv_heads, seq, dim, device="cuda", dtype=torch.bfloat16)
    gqa = heads != kv_heads

    def sdpa():
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=problem.scale, enable_gqa=gqa
        )

    expected = sdpa()[0].float()
    repeat = heads // kv_heads
    k_op = k[0].repeat_interleave(repeat, 0).contiguous()
    v_rows = v[0].repeat_interleave(repeat, 0)
    v_op = (v_rows.transpose(-1, -2) if v_transposed else v_rows).contiguous()
    q_op = q[0].contiguous()
    out = torch.empty(heads, seq, dim, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(sdpa)
    rows = [
        f"## {shape}: {heads} heads on {kv_heads} KV heads, seq {seq}, head dim {dim}, "
        f"{'causal, ' if causal else ''}V {'transposed' if v_transposed else 'by rows'}, bf16",
        "",
        f"- torch SDPA: {graph_ms(sdpa):.4f} ms; torch.compile(SDPA): {graph_ms(compiled):.4f} ms",
        "",
        "| point | max error | ms |",
        "| --- | --- | --- |",
    ]
    print(rows[2], flush=True)  # torch's, before a call's limit can cut the sweep
    kernel = _kernel()
    for values in itertools.product(*GRID.values()):
        params = FlashParams(*values)
        if params_unsupported(problem, params):
            continue
        constants = {**_constants(problem, params), "L": None}  # no length given at launch
        blocks = grid(problem, params)[:2]

        def launch(params=params, constants=constants, blocks=blocks):
            kernel[blocks](
                q_op, k_op, v_op, o=out, **constants, num_warps=params.warps,
                num_stages=params.stages,
            )  # fmt: skip

        rows.append(timed_row(params.name, launch, out, expected))
        print(rows[-1], flush=True)
    return rows + [""]


def decode_problem(entries: int, cache: int, dim: int) -> AttentionProblem:
    """A decode step's op form as the exported model holds it: loops (b, n, k1, k2), q
    (b, k1), k (b, k2, k1), v (b, n, k2), its i1 mask (b, k2), out (b, n)."""
    return AttentionProblem(
        loops=("b", "n", "k1", "k2"),
        loop_sizes=(entries, dim, dim, cache),
        query_type="bf16",
        key_type="bf16",
        value_type="bf16",
        mask_type="i1",
        operand_loops=((0, 2), (0, 3, 2), (0, 1, 3), (0, 3), (0, 1)),
        scale=1 / math.sqrt(dim),
        form="op",
        output_type="bf16",
    )


def decode_gqa_problem(batch: int, kv_heads: int, group: int, cache: int, dim: int):
    """The decode step over the cache as it is: loops (b, kv head, group, k1, k2, n), q
    (b, h, g, k1), k and v (b, h, k2, d) not indexing the group, mask (b, h, g, k2), out
    (b, h, g, n)."""
    return AttentionProblem(
        loops=("b", "b", "b", "k1", "k2", "n"),
        loop_sizes=(batch, kv_heads, group, dim, cache, dim),
        query_type="bf16",
        key_type="bf16",
        value_type="bf16",
        mask_type="i1",
        operand_loops=((0, 1, 2, 3), (0, 1, 4, 3), (0, 1, 4, 5), (0, 1, 2, 4), (0, 1, 2, 5)),
        scale=1 / math.sqrt(dim),
        form="op",
        output_type="bf16",
    )


def run_decode(shape: str, bandwidth: float) -> list[str]:
    batch, heads, kv_heads, cache, dim = DECODE_SHAPES[shape]
    problem = decode_problem(batch * heads, cache, dim)
    torch.manual_seed(0)
    q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, cache, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, kv_heads, cache, dim, device="cuda", dtype=torch.bfloat16)
    keep = torch.ones(batch, 1, 1, cache, device="cuda", dtype=torch.bool)
    keep[..., int(cache * 0.9) :] = False  # the cache's last positions not written yet

    def sdpa():
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, scale=problem.scale, enable_gqa=heads != kv_heads
        )

    expected = sdpa().reshape(batch * heads, dim).float()
    repeat = heads // kv_heads
    k_op = k.repeat_interleave(repeat, 1).reshape(batch * heads, cache, dim).contiguous()
    v_op = v.repeat_interleave(repeat, 1).reshape(batch * heads, cache, dim)
    v_op = v_op.transpose(-1, -2).contiguous()
    q_op = q.reshape(batch * heads, dim).contiguous()
    mask_op = keep.reshape(batch, 1, cache).expand(batch, heads, cache)
    mask_op = mask_op.reshape(batch * heads, cache).to(torch.int8).contiguous()
    once = 2 * batch * kv_heads * cache * dim * 2  # K and V, bf16, read once
    rows = [
        f"## {shape}: batch {batch}, {heads} heads on {kv_heads} KV heads, a cache of "
        f"{cache}, head dim {dim}, bf16, an i1 mask",
        "",
        f"- torch SDPA: {graph_ms(sdpa):.4f} ms; K and V read once at {bandwidth:g} GB/s: "
        f"{once / bandwidth / 1e6:.4f} ms (the op form reads them {repeat}x, repeated per "
        f"query head: {repeat * once / bandwidth / 1e6:.4f} ms)",
        "",
        "| point | max error | ms |",
        "| --- | --- | --- |",
    ]
    operands = (q_op, k_op, v_op, mask_op)
    for params in DECODE_FLASH + DECODE_SPLIT:
        rows.append(_decode_row(problem, params, operands, expected))
        print(rows[-1], flush=True)
    group = heads // kv_heads
    packed = decode_gqa_problem(batch, kv_heads, group, cache, dim)
    mask_gqa = keep.expand(batch, kv_heads, group, cache).to(torch.int8).contiguous()
    operands = (q.reshape(batch, kv_heads, group, dim), k, v, mask_gqa)
    for params in DECODE_SPLIT:
        row = _decode_row(packed, params, operands, expected.reshape(packed.output_shape))
        rows.append(row.replace("| fd_", "| gqa fd_", 1))
        print(rows[-1], flush=True)
    return rows + [""]


def _decode_row(problem, params, operands, expected) -> str:
    """One point's row: its error against SDPA and its time in a CUDA graph."""
    out = torch.empty(problem.output_shape, device="cuda", dtype=torch.bfloat16)
    split = isinstance(params, decoding.DecodingParams)
    if split:
        why = decoding.params_unsupported(problem, params)
        if why:
            return f"| {params.name} | not run: {why} | - |"
        kernel, constants = decoding._kernel(), decoding.constants(problem, params)
        blocks = decoding.grid(problem, params)[:2]
        extra = {
            "part": torch.empty(decoding.workspace_floats(problem, params), device="cuda"),
            "lock": torch.zeros(decoding.entries(problem), device="cuda", dtype=torch.int32),
        }
    else:
        kernel, constants = _kernel(), {**_constants(problem, params), "L": None}
        blocks, extra = grid(problem, params)[:2], {}

    def launch():
        kernel[blocks](
            *operands, o=out, **extra, **constants, num_warps=params.warps,
            num_stages=params.stages,
        )  # fmt: skip

    return timed_row(params.name, launch, out, expected)


def timed_row(name: str, launch, out, expected) -> str:
    """A point's row: its error against SDPA's answer and its time in a CUDA graph, or why
    it failed."""
    try:
        launch()
        torch.cuda.synchronize()
        error = (out.float() - expected).abs().max().item() / expected.abs().max().item()
        return f"| {name} | {error:.2g} | {graph_ms(launch):.4f} |"
    except Exception as failure:  # noqa: BLE001 - a point that fails is a row
        return f"| {name} | failed: {str(failure)[:80]} | - |"


if __name__ == "__main__":
    main()
