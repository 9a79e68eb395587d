"""An elementwise epilogue of a custom kernel, as the kernel computes it (issues 25 and 24):
read from a model by rewrite/epilogues.py, written into the Triton convolution kernel by
kernels/igemm_conv/ and into the matmul kernel by kernels/matmul_triton/."""

from __future__ import annotations

import math
from dataclasses import dataclass

TRITON_TYPES = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32"}
ACC, CHANNEL, FULL = "acc", "channel", "full"
# A matmul's: its rounded result rotated by half in each head (RoPE's rotate_half,
# rewrite/rotary.py), and a tensor indexed by some of the result's dims (RoPE's cos and sin,
# by token and head dim).
ROTATED, INDEXED = "rotated", "indexed"


@dataclass(frozen=True)
class PermutedStore:
    """Where a matmul kernel writes its (m, n) tile when the epilogue's result permutes the
    contraction's dims (BERT's bias add that also moves the heads before the tokens): the
    truncf's dims, outermost first, the first `rows` of them splitting M and the rest N, each
    with its extent and its stride in the epilogue's result. The same tells where an indexed
    input's elements are (a stride of 0: a dim that input does not have)."""

    extents: tuple[int, ...]
    strides: tuple[int, ...]
    rows: int

    def offsets(self, row: str, column: str) -> str:
        """The Triton expression of each tile element's offset in the result, from its row
        and column indices (`row` and `column`, broadcast over the tile)."""
        terms = []
        # The rows' dims, then the columns' (a single row of a decode step: no rows' dims).
        for name, first, end in ((row, 0, self.rows), (column, self.rows, len(self.extents))):
            for dim in range(first, end):
                if self.strides[dim] == 0:  # an indexed input that has no such dim
                    continue
                inner = math.prod(self.extents[dim + 1 : end])
                part = f"({name} // {inner})" if inner > 1 else name
                if dim > first:  # the outermost dim of the split needs no modulo
                    part = f"({part} % {self.extents[dim]})"
                terms.append(f"{part} * {self.strides[dim]}")
        return " + ".join(terms) or "0"


@dataclass(frozen=True)
class EpilogueInput:
    """One input of the epilogue: the contraction's (narrowed) result, a vector along the
    output channels, a tensor in the output's layout, the result rotated by half in each
    `period` columns, or a tensor `index`ed by some of the result's dims."""

    kind: str  # ACC, CHANNEL, FULL, ROTATED or INDEXED
    type: str  # its tensor type, as the op has it
    element: str  # that type's element type
    period: int = 0  # ROTATED: the head dim, the columns each rotation stays within
    # INDEXED: the rounded result's dims with this input's stride in each (0: not indexed)
    index: PermutedStore | None = None


@dataclass(frozen=True)
class Then:
    """A second elementwise generic that reads an epilogue's result (through `reshapes`
    reshapes, which keep the elements' order) and nothing else of the kernel's, computed in
    the same kernel: GPT-2's GELU or residual add after the bias its projection rounds in.
    Its inputs besides that result come after the first generic's in `Epilogue.inputs`;
    `Epilogue.out_type` is its result's."""

    acc: int  # its operand that is the first generic's result
    positions: tuple[int, ...]  # its operand position of each of its other inputs, in order
    reads: str  # the type it reads the first generic's result as
    first_out: str  # the first generic's result type
    reshapes: int = 0
    dag: str = ""  # as Epilogue.dag, for this generic


@dataclass(frozen=True)
class Epilogue:
    """An epilogue as the kernel computes it."""

    inputs: tuple[EpilogueInput, ...]
    out_type: str  # the epilogue's result type
    out_element: str
    narrow: str  # the element type the truncf before it rounds the convolution to
    statements: tuple[str, ...]  # Triton, over `a{i}` (its inputs); the result is `out`
    reshapes: int = 0  # reshapes between the contraction and its truncf (narrow_reshapes.py)
    acc_shape: tuple[int, ...] = ()  # the truncf's shape, after those reshapes
    # Reshapes between the truncf and the epilogue, which reads the rounded result in heads
    # (a decode step's RoPE: rewrite/rotary.py); the kernel's tile is the same elements.
    read_reshapes: int = 0
    store: PermutedStore | None = None  # a result that permutes the truncf's dims
    # The generic as a transform DAG matcher's region, where its body captures nothing
    # (rewrite/epilogues.py `_dag`): matched exactly, not by its types alone.
    dag: str = ""
    # False: no truncf before it; the body reads the f32 accumulator and rounds its own
    # result to `narrow` (a matmul's bias added in f32, as torch's addmm in f16 does).
    rounded_before: bool = True
    then: Then | None = None  # a generic after this one, in the same kernel

    @property
    def signature(self) -> tuple:
        """What the spec's matcher sees: the inputs' and result's types."""
        return tuple(i.type for i in self.inputs), self.out_type

    @property
    def acc_position(self) -> int:
        """The operand that is the convolution's rounded result."""
        return next(i for i, x in enumerate(self.inputs) if x.kind == ACC)

    @property
    def extras(self) -> list[tuple[int, EpilogueInput]]:
        """(operand position, input) of each input the kernel reads besides A and B (not the
        contraction's result, nor its rotation: the kernel has them), in the kernel's
        order; a `then` generic's inputs last, at their positions in it."""
        first = self.first_inputs
        found = [(i, x) for i, x in enumerate(first) if x.kind not in (ACC, ROTATED)]
        if self.then is not None:
            found += list(zip(self.then.positions, self.inputs[len(first) :], strict=True))
        return found

    @property
    def first_inputs(self) -> tuple[EpilogueInput, ...]:
        """The first generic's inputs (all of them without `then`)."""
        count = len(self.inputs) - (len(self.then.positions) if self.then else 0)
        return self.inputs[:count]

    def sources(self, first: str, last: str) -> list[tuple[str, str]]:
        """(handle, operand positions) of the kernel's other inputs, in its order: the
        first generic's on `first`, a `then` generic's on `last` (one handle without it)."""
        count = len(self.extras) - (len(self.then.positions) if self.then else 0)
        parts = [(first if self.then else last, self.extras[:count])]
        parts.append((last, self.extras[count:]))
        return [(h, ", ".join(str(p) for p, _ in part)) for h, part in parts if part]

    @property
    def exact(self) -> bool:
        """Whether the spec's matcher compares every generic's body (`dag`)."""
        return bool(self.dag) and (self.then is None or bool(self.then.dag))

    @property
    def period(self) -> int:
        """The columns a rotated input stays within (a head); 1 without one."""
        return math.lcm(1, *(x.period for x in self.inputs if x.kind == ROTATED))

    def triton_lines(
        self, channel: str, channels: str, offsets: str, mask: str
    ) -> tuple[list[str], list[str]]:
        """(pointer parameters, statements) of the epilogue in a kernel whose accumulator
        tile is `acc` (and, for a rotated input, `rot` its rotation: cuda_custom.py's
        `rotated_matmul`): each input loaded on the output tile (the accumulator rounded as
        the truncf rounds it, or its rotation; a per-channel vector at `channel`, under
        `channels`; an output-shaped tensor at `offsets` under `mask`; an indexed one at its
        own offsets), then the body; its result `out`. A rotated or indexed input is a
        matmul kernel's, on its tile's rows `rm` and columns `rn`."""
        lines, params = [], []
        for position, operand in enumerate(self.inputs):
            name = f"a{position}"
            if operand.kind in (ACC, ROTATED):
                tile = "acc" if operand.kind == ACC else "rot"
                wide = not self.rounded_before and operand.kind == ACC
                lines.append(
                    f"{name} = {tile}"
                    if wide
                    else f"{name} = {tile}.to({TRITON_TYPES[self.narrow]})"
                )
                continue
            pointer = f"e{len(params)}"
            params.append(pointer)
            if operand.kind == INDEXED:
                at = operand.index.offsets("rm[:, None]", "rn[None, :]")
                lines.append(f"{name} = tl.load({pointer} + ({at}), mask={mask}, other=0.0)")
            elif operand.kind == CHANNEL:
                lines.append(
                    f"{name} = tl.load({pointer} + {channel}, mask={channel} < {channels},"
                    " other=0.0)[None, :]"
                )
            else:
                lines.append(f"{name} = tl.load({pointer} + {offsets}, mask={mask}, other=0.0)")
        return params, [*lines, *self.statements]
