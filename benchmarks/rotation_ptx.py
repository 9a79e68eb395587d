"""Memory instructions of the two RoPE kernels in Triton's PTX, block by block (issue 24).

Llama-3's q projection with RoPE in its kernel ran 0.307 ms on the H200 as `rotated_matmul`
(a block's first-half columns beside their partners, split in registers) and 0.139 ms as
`matmul` rotating its whole tile in registers; at the k projection's blocks of one head it
was the other way (0.036 against 0.058). This compiles both kernels for sm_90 at the q
projection's shape (2048 x 4096 x 4096 bf16, RoPE's epilogue with cos and sin by token and
head dim, the heads stored first) and counts their global loads and stores and
asynchronous copies: scalar epilogue loads and stores show as many more instructions. No GPU
is needed.

    python3 benchmarks/rotation_ptx.py

Prints a markdown table.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from autosched.kernels import triton as compile_helpers  # noqa: E402
from autosched.kernels.matmul_triton import source as matmul_source  # noqa: E402
from autosched.ops.epilogue import (  # noqa: E402
    ACC,
    INDEXED,
    ROTATED,
    Epilogue,
    EpilogueInput,
    PermutedStore,
)

M, N, K, HEAD = 2048, 4096, 4096, 128
BLOCKS = [(128, 256, 64, 8, 3), (128, 256, 64, 4, 3), (64, 256, 32, 4, 4), (128, 128, 64, 4, 3)]


def rope_epilogue() -> Epilogue:
    """q * cos + rotate_half(q) * sin, in bf16, the result stored heads first."""
    heads = N // HEAD
    by_token = PermutedStore(extents=(M, heads, HEAD), strides=(HEAD, 0, 1), rows=1)
    inputs = (
        EpilogueInput(ACC, "", "bf16"),
        EpilogueInput(INDEXED, "", "bf16", index=by_token),
        EpilogueInput(ROTATED, "", "bf16", period=HEAD),
        EpilogueInput(INDEXED, "", "bf16", index=by_token),
    )
    store = PermutedStore(extents=(M, heads, HEAD), strides=(HEAD, M * HEAD, 1), rows=1)
    statements = (
        "p = (a0 * a1).to(tl.bfloat16)",
        "q = (a2 * a3).to(tl.bfloat16)",
        "out = p + q",
    )
    return Epilogue(inputs, "", "bf16", "bf16", statements, store=store)


def counts(epilogue: Epilogue, block: tuple[int, ...], paired: bool) -> dict[str, int]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bm, bn, bk, warps, stages = block
    source = matmul_source.kernel_source(epilogue, 0 if paired else bn)
    function = "rotated_matmul" if paired else "matmul"
    kernel = compile_helpers.kernel_from_source(source, function)
    constants = {"M": M, "N": N, "K": K, "sab": M * K, "sam": K, "sak": 1, "sbb": K * N}
    constants |= {"sbk": 1, "sbn": K, "scb": M * N, "scm": N, "scn": 1, "BM": bm, "BN": bn}
    constants |= {"BK": bk, "G": 8, "EVEN": True, "SPLIT": 1, "K_PART": K, "locks": None}
    if paired:
        constants["HALF"] = HEAD // 2
    pointers = ["a", "b", "e0", "e1", "c"]
    signature = {p: "*bf16" for p in pointers} | {"locks": "*i32"}
    signature |= {name: "constexpr" for name in constants}
    aligned = {(index,): [["tt.divisibility", 16]] for index in range(len(pointers))}
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": warps, "num_stages": stages},
    )
    ptx = compiled.asm["ptx"]
    return {op: ptx.count(op) for op in ("ld.global", "st.global", "cp.async.cg")}


def main() -> None:
    epilogue = rope_epilogue()
    print("| block (m x n x k, warps, stages) | kernel | ld.global | st.global | cp.async |")
    print("| --- | --- | --- | --- | --- |")
    for block in BLOCKS:
        for paired in (True, False):
            if not paired and block[1] <= HEAD:
                continue  # the tile rotation needs whole heads, two or more
            found = counts(epilogue, block, paired)
            name = "rotated_matmul" if paired else "matmul, tile rotated"
            cells = " | ".join(str(found[op]) for op in ("ld.global", "st.global", "cp.async.cg"))
            print(f"| {'x'.join(map(str, block[:3]))}, {block[3]}, {block[4]} | {name} | {cells} |")


if __name__ == "__main__":
    main()
