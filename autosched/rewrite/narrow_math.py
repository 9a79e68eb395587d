"""Branch-free Triton forms of an epilogue's division, erf and tanh where the result is 16
bits.

An epilogue runs in the MMA warps on every element of the accumulator tile (128 a thread
for a 128x128 tile of 4 warps). Computed as the model writes them, an f16 division is
IEEE's `div.rn.f32` and erf is libdevice's `erff`: both branch to slow paths. On ViT's fc1
(bias, then erf GELU; 6304x3072x768, f16) built for sm_90 that costs 68-144 bytes of
spills per thread, and in the kernels that are not warp-specialized ptxas serializes the
wgmma pipeline ("C7514: wgmma.mma_async instructions are serialized due to non wgmma
instructions reading accumulator registers"). Without the branches the same kernels have
no spills and no serialization (docs/how-it-works.md, the rewrite of matmuls).

Both forms are exact to well under the 16-bit result's rounding step (2^-11 relative for
f16, 2^-8 for bf16): the division `div.full.f32` (2 ulp of f32); erf by Abramowitz and
Stegun 7.1.26 (absolute error 1.5e-7; one exponential, one reciprocal), and below
|x| = 1/4, where that form's 1 - tail loses erf's leading digits, by its Taylor series to
x^7 (relative error about 1e-7). An f32 result keeps the exact forms.
"""

from __future__ import annotations

import math

NARROW = ("f16", "bf16")
# erf(x) = 1 - t * (a1 + t * (a2 + ...)) * exp(-x^2), t = 1 / (1 + P x), for x >= 0.
P = 0.3275911
A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
SMALL = 0.25  # below it, erf(x) = 2 / sqrt(pi) * (x - x^3 / 3 + x^5 / 10 - x^7 / 42)
TAYLOR = tuple(2 / math.sqrt(math.pi) * c for c in (1.0, -1 / 3, 1 / 10, -1 / 42))


def divide(target: str, a: str, b: str) -> list[str]:
    """`target = a / b` in f32 without IEEE's slow path, rounded back to a's type."""
    wide = f"tl.fdiv({a}.to(tl.float32), {b}.to(tl.float32), ieee_rounding=False)"
    return [f"{target} = {wide}.to({a}.dtype)"]


def erf(target: str, a: str) -> list[str]:
    """`target = erf(a)` in f32 (Abramowitz and Stegun 7.1.26; below SMALL, the Taylor
    series), rounded back to a's type."""
    names = ("x", "abs", "sq", "t", "tail", "large")
    x, size, square, t, tail, large = (f"{target}_{name}" for name in names)
    return [
        f"{x} = {a}.to(tl.float32)",
        f"{size} = tl.abs({x})",
        f"{square} = {x} * {x}",
        f"{t} = tl.fdiv(tl.full([1, 1], 1.0, tl.float32), {size} * {P!r} + 1.0,"
        " ieee_rounding=False)",
        f"{tail} = {_horner(A, t)} * {t} * tl.exp(-{square})",
        f"{large} = tl.where({x} < 0.0, {tail} - 1.0, 1.0 - {tail})",
        f"{target} = tl.where({size} < {SMALL!r}, {_horner(TAYLOR, square)} * {x}, {large})"
        f".to({a}.dtype)",
    ]


def tanh(target: str, a: str) -> list[str]:
    """`target = tanh(a)` as 1 - 2 / (e^2a + 1) in f32 (Gluon has no tanh), the division
    without IEEE's slow path, rounded back to a's type."""
    wide = f"tl.exp(2.0 * {a}.to(tl.float32)) + 1.0"
    two = "tl.full([1, 1], 2.0, tl.float32)"
    return [f"{target} = (1.0 - tl.fdiv({two}, {wide}, ieee_rounding=False)).to({a}.dtype)"]


def _horner(coefficients: tuple[float, ...], x: str) -> str:
    """c0 + x * (c1 + x * (...)) as one expression."""
    form = repr(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        form = f"({form} * {x} + {coefficient!r})"
    return form


# The body ops with a narrow form: (target, operand names) -> statements.
FORMS = {"arith.divf": divide, "math.erf": erf, "math.tanh": tanh}
