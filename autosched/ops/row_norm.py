"""An RMSNorm of A's rows kept in a matmul's kernel (issue 48): the norm before a Llama
projection, read from a model by rewrite/row_norms.py and computed by the Triton matmul
kernel before its main loop (kernels/matmul_triton/).

transformers' `LlamaRMSNorm` (Mistral's, Qwen2's) is, at global optimization, four generics
before the projection's A: x widened to f32, the sum of its squares along K, each element
times rsqrt(sum / K + eps) rounded back to x's type, and that times the norm's weight g in
x's type. With the kernel computing it, A is never written: the kernel reads x and g, and a
decode step keeps no dispatch of its own for the norm.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class RowNorm:
    """One norm before a contraction's A, as the model spells it (its types are what the
    spec's matcher compares)."""

    eps: float
    x_type: str  # the norm's input as the model holds it (the rows of K, maybe reshaped)
    wide_type: str  # x widened to f32
    sums_type: str  # the sum of squares of each row
    normed_type: str  # x times its row's rsqrt, rounded back to x's element type
    g_type: str  # the norm's weight, a vector along K
    weighted_type: str  # normed times g: A before the reshapes
    weight_first: bool  # g is the weight multiply's first operand
    reshapes: int  # reshapes between that product and the contraction's A
    wide_dag: str  # the widening generic as a transform DAG matcher's region
    weight_dag: str  # the weight multiply's

    @property
    def digest(self) -> str:
        """A short name that tells the norms of one problem apart (stable across runs:
        kernels' files are named by it)."""
        return hashlib.sha1(repr(self).encode()).hexdigest()[:6]

    @property
    def weight_position(self) -> int:
        """g's operand position in the weight multiply (normed is the other)."""
        return 0 if self.weight_first else 1

    @property
    def normed_position(self) -> int:
        return 1 - self.weight_position
