"""Writes the torch-dialect test models with iree-turbine: `llama_mlp.mlirbc`, `attention.mlirbc`.

iree-turbine and torch are not autosched dependencies; run this from a separate environment:

    python3.11 -m venv /tmp/turbine-venv
    /tmp/turbine-venv/bin/pip install torch==2.13.0 iree-turbine
    /tmp/turbine-venv/bin/python tests/data/models/make_torch_model.py

Models (f32, weights small so the files stay small):

- `llama_mlp.mlirbc`: a Llama-style MLP, down(silu(gate(x)) * up(x)), hidden 64, intermediate 128,
  no biases, on x[1, 8, 64] (batch 1, sequence 8): three nn.Linear layers, weights inside the module.
- `attention.mlirbc`: scaled_dot_product_attention on q, k, v [1, 4, 16, 16] (batch, heads,
  sequence, head dim), then the heads merged and multiplied by an output projection given as an
  input, w[64, 32]: one attention op and one matmul.
"""

from __future__ import annotations

import os

import iree.turbine.aot as aot
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int = 64, intermediate: int = 128):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    def forward(self, q, k, v, w):
        out = nn.functional.scaled_dot_product_attention(q, k, v)  # [1, 4, 16, 16]
        merged = out.transpose(1, 2).reshape(1, 16, 64)  # [batch, sequence, heads * head dim]
        return torch.matmul(merged, w)  # [1, 16, 32]


def save(module: nn.Module, args: tuple, name: str) -> None:
    path = os.path.join(HERE, name)
    aot.export(module, *args).save_mlir(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    torch.manual_seed(0)
    save(LlamaMLP().eval(), (torch.randn(1, 8, 64),), "llama_mlp.mlirbc")
    qkv = [torch.randn(1, 4, 16, 16) for _ in range(3)]
    save(Attention().eval(), (*qkv, torch.randn(64, 32)), "attention.mlirbc")
