"""The flash-attention kernel family (kernels/flash_attention/) on the local NVIDIA GPU,
launched by Triton, against torch's SDPA on the same shapes; writes a markdown table.

    python3 benchmarks/flash_attention.py --out DIR [--shape llama3_8b]

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
from autosched.ops.attention import AttentionProblem  # noqa: E402

SHAPES = {
    # (heads, kv heads, seq, head dim, V transposed)
    "llama3_8b": (32, 8, 2048, 128, True),
    "llama3_8b_v_rows": (32, 8, 2048, 128, False),
    "bert_base": (12 * 8, 12 * 8, 512, 64, False),
}
GRID = {"block_m": [64, 128], "block_n": [32, 64, 128], "warps": [4, 8], "stages": [2, 3]}


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
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    lines = [f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", ""]
    for shape in options.shapes.split(","):
        lines += run_shape(shape)
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
    kernel = _kernel()
    for values in itertools.product(*GRID.values()):
        params = FlashParams(*values)
        if params_unsupported(problem, params):
            continue
        constants = _constants(problem, params)
        blocks = grid(problem, params)[:2]

        def launch(params=params, constants=constants, blocks=blocks):
            kernel[blocks](
                q_op, k_op, v_op, o=out, **constants, num_warps=params.warps,
                num_stages=params.stages,
            )  # fmt: skip

        try:
            launch()
            torch.cuda.synchronize()
            error = (out.float() - expected).abs().max().item() / expected.abs().max().item()
            ms = graph_ms(launch)
            rows.append(f"| {params.name} | {error:.2g} | {ms:.4f} |")
        except Exception as failure:  # noqa: BLE001 - a point that fails is a row
            rows.append(f"| {params.name} | failed: {str(failure)[:80]} | - |")
        print(rows[-1], flush=True)
    return rows + [""]


if __name__ == "__main__":
    main()
