"""The matmul family's Triton source, rendered from its template files (`*.py.tmpl` here).

Triton compiles a kernel from its file, and an epilogue (rewrite/epilogues.py) is written into
it as statements: `$params` are the epilogue's extra pointers, `$epilogue` its statements
(`out = acc` without one). The kernels: `matmul` (a workgroup per output block, serial
split-K), `rotated_matmul` (RoPE's rotate_half kept in the kernel, issue 24) and
`persistent_matmul` (one workgroup per SM, loading by TMA); the warp-specialized Gluon form
renders its own (kernels/matmul_gluon/), with this family's store of a tile.
"""

from __future__ import annotations

from autosched.kernels.templates import epilogue_values, indented, render
from autosched.ops.epilogue import TRITON_TYPES as LANGUAGE_TYPES
from autosched.ops.epilogue import Epilogue
from autosched.ops.row_norm import RowNorm

PACKAGE = __package__
# The names an epilogue's lines use in every matmul kernel: the output column index and
# count, the tile's offsets and its mask.
TILE_NAMES = ("rn", "N", "offsets", "inside")

# A rotated kernel's columns, from `first`: the first halves' (`lo`), and B's (`pairs`:
# each of those, then its partner; past N where `first` is past N // 2).
ROTATED_COLUMNS = (
    "lo = first // HALF * (2 * HALF) + first % HALF",
    "pairs = tl.reshape(tl.join(lo, lo + HALF), (BN,))",
)
# The accumulator's pairs apart: the first halves' tile and their partners'.
ROTATED_SPLIT = "acc_lo, acc_hi = tl.split(tl.reshape(acc, (BM, BN // 2, 2)))"
# Each half of a rotated kernel's block: its columns, its tile and that rotated, then the
# epilogue and store (`STORE_TILE`).
ROTATED_HALVES = (
    ("rn = lo", "acc = acc_lo", "rot = -acc_hi"),
    ("rn = lo + HALF", "acc = acc_hi", "rot = acc_lo"),
)
ROW_MAJOR = "batch * scb + rm[:, None] * scm + rn[None, :] * scn"


def rotated_kernel(epilogue: Epilogue | None, block_n: int) -> bool:
    """Whether the epilogue's kernel is `rotated_matmul`: it rotates heads, and a block of
    `block_n` columns holds a head or part of one (`rotates_in_tile` says why not more)."""
    return epilogue is not None and 1 < epilogue.period and block_n <= epilogue.period


def rotates_in_tile(epilogue: Epilogue | None, block_n: int) -> bool:
    """Whether a rotated epilogue's kernel is `matmul` rotating its whole tile of several
    heads in registers (`tile_rotation`) rather than `rotated_matmul`. With blocks wider
    than a head, `rotated_matmul`'s half tiles came out of Triton 3.6 with every epilogue
    load and store scalar (the PTX of the Llama-3 q projection at 128x256: 256 loads and
    128 stores against 32 and 16), and that kernel ran 0.307 ms on the H200 against 0.139
    for the whole tile rotated; at a block of one head (the k projection at 128x128)
    `rotated_matmul` ran 0.036 ms against 0.058."""
    return epilogue is not None and 1 < epilogue.period < block_n


def tile_rotation(epilogue: Epilogue) -> list[str]:
    """Statements that set `rot` to rotate_half of the rounded tile `acc` within each head
    of a block of whole heads: the first half's columns take the second half's values
    negated, the second half's the first's."""
    heads, half, narrow = f"BN // {epilogue.period}", epilogue.period // 2, epilogue.narrow
    return [
        f"rot = acc.to({LANGUAGE_TYPES[narrow]})",
        f"rot = tl.permute(tl.reshape(rot, (BM, {heads}, 2, {half})), (0, 1, 3, 2))",
        "rot_lo, rot_hi = tl.split(rot)",
        "rot = tl.reshape(tl.permute(tl.join(-rot_hi, rot_lo), (0, 1, 3, 2)), (BM, BN))",
    ]


def parameters(values: dict[str, str], dynamic_m: bool = False) -> str:
    """The matmul kernels' parameters (`parameters.py.tmpl`), the epilogue's pointers in;
    `dynamic_m`: M a value the kernel is launched with (IREE's push constant), not a
    constant of its build."""
    rows = "M" if dynamic_m else "M: tl.constexpr"
    return render(PACKAGE, "parameters.py.tmpl", params=values["params"], rows=rows)


def store_tile(epilogue: Epilogue | None, block_n: int, write: str, values: dict[str, str]) -> str:
    """`matmul`'s lines after its main loop (`store_tile.py.tmpl`): its result's layout,
    and with a rotated input whose blocks rotate in their tile, that rotation, then the
    epilogue (`values`, epilogue_values') and `write`, which stores the tile `value`."""
    store = epilogue.store if epilogue else None
    offsets = store.offsets("rm[:, None]", "rn[None, :]") if store else ROW_MAJOR
    pointers = "    c_ptrs = c + offsets" if store else ""
    if rotates_in_tile(epilogue, block_n):
        pointers += "".join(f"\n    {line}" for line in tile_rotation(epilogue))
    return render(
        PACKAGE, "store_tile.py.tmpl",
        offsets=offsets, pointers=pointers, epilogue=values["epilogue"], store=write,
    )  # fmt: skip


def plain_store() -> str:
    """The store from registers: masked unless the blocks cover C exactly."""
    return render(PACKAGE, "plain_store.py.tmpl")


def rotated_halves(offsets: str, values: dict[str, str]) -> list[str]:
    """The lines after a rotated kernel's main loop: the accumulator split in its halves,
    then each half's epilogue and store, the result written at `offsets`."""
    tile = render(
        PACKAGE, "store_tile.py.tmpl", offsets=offsets, pointers="    c_ptrs = c + offsets",
        epilogue=values["epilogue"], store=plain_store(),
    )  # fmt: skip
    halves = [line for half in ROTATED_HALVES for line in [*(f"    {x}" for x in half), tile]]
    return [f"    {ROTATED_SPLIT}", *halves]


def accumulate_lines(columns: str, k_part: str, norm: RowNorm | None) -> str:
    """The main loop's call: `accumulate` over A and B at the block's `columns`, or with a
    norm the rows' scales first and `accumulate_normed` over x, B and g."""
    sizes = f"M, N, K, {k_part}, sak, sbk, BM, BN, BK, EVEN"
    if norm is None:
        return f"    acc = accumulate(pa, pb, rm, rk, {columns}, {sizes})"
    rows = "a + batch * sab + rm[:, None] * sam"
    return (
        f"    scale = row_scale({rows}, rm, M, K, sak, BM, BK, EVEN)\n"
        f"    acc = accumulate_normed(pa, pb, g + rk, scale, rm, rk, {columns}, {sizes})"
    )


def kernel_source(
    epilogue: Epilogue | None = None,
    block_n: int = 0,
    persistent: bool = False,
    dynamic_m: bool = False,
    norm: RowNorm | None = None,
) -> str:
    """The kernel's source, with the epilogue's loads and statements after the main loop
    (a kernel with one never splits K: `narrow_params`) and its result's layout; with a
    rotated input, `matmul` rotating its tile or also `rotated_matmul` (`rotates_in_tile`
    at `block_n` columns a block); `persistent`: `persistent_matmul` alone, its epilogue
    inside its loop over blocks; `dynamic_m`: `matmul` alone, for any count of rows M
    (`parameters`); `norm`: `matmul` and `rotated_matmul` computing A as the RMSNorm of x
    (g, the norm's weight, their parameter after B)."""
    store = epilogue.store if epilogue else None
    offsets = store.offsets("rm[:, None]", "rn[None, :]") if store else ROW_MAJOR
    helpers = render(PACKAGE, "helpers.py.tmpl")
    values = epilogue_values(epilogue, TILE_NAMES)
    if persistent and not rotated_kernel(epilogue, block_n):
        tile = indented(store_tile(epilogue, block_n, plain_store(), values))
        return helpers + render(
            PACKAGE, "persistent.py.tmpl", parameters=parameters(values), store_tile=tile
        )
    if norm is not None:
        helpers += render(PACKAGE, "norm.py.tmpl", eps=repr(norm.eps))
        values["params"] = "g, " + values["params"]
    tile = store_tile(epilogue, block_n, plain_store(), values)
    source = helpers + render(
        PACKAGE, "matmul.py.tmpl",
        parameters=parameters(values, dynamic_m),
        accumulate=accumulate_lines("rn", "K_PART", norm),
        store_tile=indented(tile),
        last_tile=indented(tile, "        "),  # a split K's last share, from the workspace
    )  # fmt: skip
    if rotated_kernel(epilogue, block_n) and not dynamic_m:
        source += render(
            PACKAGE, "rotated.py.tmpl",
            parameters=parameters(values),
            columns="\n".join(f"    {line}" for line in ROTATED_COLUMNS),
            accumulate=accumulate_lines("pairs", "K", norm),
            halves="\n".join(rotated_halves(offsets, values)),
        )  # fmt: skip
    return source
