"""An elementwise epilogue of a custom kernel, as the kernel computes it (issue 25): read from
a model by model/epilogues.py, written into the Triton convolution kernel by
targets/cuda_custom_convolution.py."""

from __future__ import annotations

from dataclasses import dataclass

TRITON_TYPES = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32"}
ACC, CHANNEL, FULL = "acc", "channel", "full"


@dataclass(frozen=True)
class EpilogueInput:
    """One input of the epilogue: the convolution's (narrowed) result, a vector along the
    output channels, or a tensor in the output's layout."""

    kind: str  # ACC, CHANNEL or FULL
    type: str  # its tensor type, as the op has it
    element: str  # that type's element type


@dataclass(frozen=True)
class Epilogue:
    """An epilogue as the kernel computes it."""

    inputs: tuple[EpilogueInput, ...]
    out_type: str  # the epilogue's result type
    out_element: str
    narrow: str  # the element type the truncf before it rounds the convolution to
    statements: tuple[str, ...]  # Triton, over `a{i}` (its inputs); the result is `out`

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
        """(operand position, input) of each input besides the convolution's result."""
        return [(i, x) for i, x in enumerate(self.inputs) if x.kind != ACC]
