"""Writes the torch-dialect test models with iree-turbine (listed below).

iree-turbine and torch are an optional extra of autosched (its `weights_as_arguments` wraps
the modules here); run this from a separate environment, from the repository's root:

    python3.11 -m venv /tmp/turbine-venv
    /tmp/turbine-venv/bin/pip install '.[torch]' torch==2.13.0 transformers torchvision pillow
    /tmp/turbine-venv/bin/python tests/data/models/make_torch_model.py [FILE ...]

Models (f32, weights small so the files stay small):

- `llama_mlp.mlirbc`: a Llama-style MLP, down(silu(gate(x)) * up(x)), hidden 64, intermediate 128,
  no biases, on x[1, 8, 64] (batch 1, sequence 8): three nn.Linear layers, weights inside the module.
- `attention.mlirbc`: scaled_dot_product_attention on q, k, v [1, 4, 16, 16] (batch, heads,
  sequence, head dim), then the heads merged and multiplied by an output projection given as an
  input, w[64, 32]: one attention op and one matmul.
- `hf_llama_mlp_{f32,bf16}.mlirbc`: transformers' own `LlamaMLP` (hidden 128, intermediate 256)
  on x[1, 32, 128], its weights as arguments: each `nn.Linear` on the 3-D input is a unit-batch
  `batch_matmul` where IREE forms its dispatches, the form whose specs IREE's re-formed
  dispatch benchmark missed on CUDA (issue 22).
- `hf_llama_layer_{f32,bf16}.mlirbc`: transformers' own `LlamaDecoderLayer` (hidden 128, 4 heads,
  2 KV heads (GQA), head dim 32, MLP 256, RoPE, SDPA, causal) on x[1, 64, 128], with its rotary
  cos/sin and its weights as arguments: one attention root beside the matmuls (issue 24).
- `hf_bert_layer_{f32,f16}.mlirbc`: transformers' own `BertLayer` (hidden 128, 4 heads, FFN
  256, GELU, SDPA, no mask) on x[2, 32, 128] (f16: x[2, 16, 128]), weights as arguments. In
  f16 each projection's f32 result is rounded, then its bias added as the heads move before
  the tokens (one generic that permutes the matmul's result: issue 24).
  `hf_bert_layer_f16_seq32.mlirbc` is the f16 layer on x[2, 32, 128].
- `hf_gpt2_block_f16.mlirbc`: transformers' own `GPT2Block` (hidden 128, 4 heads, MLP 512,
  its Conv1D projections: `addmm`) on x[2, 32, 128] in f16, weights as arguments: each
  projection's bias is added to the f32 result and rounded in one generic (no truncf of its
  own before it).
- `tv_resnet18_f32.mlirbc`: torchvision's own `resnet18` (10 classes, eval mode) on
  x[2, 3, 64, 64] (a batch of 2: see targets/cpu_convolution.py), its parameters as arguments
  (issue 25). Needs torchvision and pillow beside torch; a CPU-only torch cannot load
  torchvision's compiled ops, which resnet18 does not use, so their registration is skipped.
- `tv_resnet18_f32_96.mlirbc`: the same on x[2, 3, 96, 96] (shape classes near the 64x64
  one's: what a knowledge base learnt on one teaches the other).
- `tv_resnet18_f16.mlirbc`: the same in f16, for the CUDA convolutions (tensor cores need
  16-bit operands).
- `tv_resnet50_f16.mlirbc`: torchvision's own `resnet50` (10 classes, eval mode, f16) on
  x[2, 3, 64, 64], parameters as arguments: its strided 1x1 (downsampling) convolutions stay
  in their dispatches, read through `d * 2`, as at full size.
- `tv_resnext50_32x4d_f16.mlirbc`: torchvision's own `resnext50_32x4d` the same way (f16):
  its 3x3 convolutions are grouped, 32 groups.
- `tv_mobilenet_v3_small_{f32,f16}.mlirbc`: torchvision's own `mobilenet_v3_small` the same
  way: depthwise 3x3 and 5x5 convolutions, strided and not.
- `tv_efficientnet_b0_f32.mlirbc`: torchvision's own `efficientnet_b0` the same way: depthwise
  convolutions, squeeze-excite and SiLU.
- `timm_vit_tiny_{f32,f16}.mlirbc`: timm's own `VisionTransformer` (48x48 images, 8x8 patches:
  36 patches and a class token, 37 tokens, an odd count; width 64, 2 blocks, 2 heads of 32)
  on x[2, 3, 48, 48], parameters as arguments: attention whose rows divide no tile.
  `timm_vit_tiny_b1_f32.mlirbc`: the same at batch 1, whose attention IREE's flow-level
  check module folds to one loop fewer than the dispatch it times.
- `hf_tiny_causal_lm_f32.mlirbc`: transformers' own `LlamaForCausalLM` (vocab 256, hidden 64,
  2 layers, 4 heads, 2 KV heads, MLP 128, no cache) on token ids [1, 16], parameters as
  arguments, returning the logits: a whole causal LM, its mask built by transformers' own code
  (which calls `torch.diff`).
- `llama_mlp_dynamic_f32.mlirbc`: the Llama-style MLP above (hidden 64, intermediate 128), its
  weights as arguments, on x[1, L, 64] with the sequence length L dynamic (2 to 4096;
  exported at 16): three matmuls of dynamic M, what a model tuned on buckets of lengths
  serves with one spec. `llama_mlp_dynamic_bf16.mlirbc` is the same in bf16: the custom
  matmul kernels for any M.
"""

from __future__ import annotations

import os

import iree.turbine.aot as aot
import torch
from torch import nn

from autosched.api import weights_as_arguments

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


def hf_llama_mlp(dtype: torch.dtype) -> tuple[nn.Module, tuple]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP as HfLlamaMLP

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4)
    mlp = HfLlamaMLP(config).to(dtype).eval()
    weights = [p.detach() for p in mlp.parameters()]
    return weights_as_arguments(mlp, 1), (torch.randn(1, 32, 128, dtype=dtype), *weights)


class LayerWithWeights(nn.Module):
    """A transformers layer run with its weights as arguments and extra inputs as keywords."""

    def __init__(self, layer: nn.Module, keywords):
        super().__init__()
        self.layer, self.keywords = layer, keywords
        self.names = [name for name, _ in layer.named_parameters()]

    def forward(self, x, *args):
        extra, weights = args[: len(self.keywords)], args[len(self.keywords) :]
        params = dict(zip(self.names, weights, strict=True))
        keywords = self.keywords(*extra) if callable(self.keywords) else {}
        out = torch.func.functional_call(self.layer, params, (x,), keywords)
        return out[0] if isinstance(out, tuple) else out


class RotaryKeywords:
    """LlamaDecoderLayer's keywords: no mask (SDPA's causal path) and (cos, sin) as inputs."""

    def __len__(self) -> int:
        return 2

    def __call__(self, cos, sin):
        return {"attention_mask": None, "position_embeddings": (cos, sin)}


def hf_llama_layer(dtype: torch.dtype) -> tuple[nn.Module, tuple]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        attn_implementation="sdpa",
    )
    layer = LlamaDecoderLayer(config, layer_idx=0).to(dtype).eval()
    x = torch.randn(1, 64, 128, dtype=dtype)
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(64)[None])
    weights = [p.detach() for p in layer.parameters()]
    return LayerWithWeights(layer, RotaryKeywords()), (x, cos, sin, *weights)


def hf_bert_layer(dtype: torch.dtype = torch.float32, seq: int = 32) -> tuple[nn.Module, tuple]:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    config = BertConfig(
        hidden_size=128, num_attention_heads=4, intermediate_size=256, attn_implementation="sdpa"
    )
    layer = BertLayer(config).eval().to(dtype)
    weights = [p.detach() for p in layer.parameters()]
    return LayerWithWeights(layer, ()), (torch.randn(2, seq, 128, dtype=dtype), *weights)


def hf_gpt2_block() -> tuple[nn.Module, tuple]:
    """transformers' GPT2Block (hidden 128, 4 heads, MLP 512) in f16 on x[2, 32, 128]."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(n_embd=128, n_head=4, n_positions=64, attn_implementation="sdpa")
    block = GPT2Block(config, layer_idx=0).eval().to(torch.float16)
    weights = [p.detach() for p in block.parameters()]
    return LayerWithWeights(block, ()), (torch.randn(2, 32, 128, dtype=torch.float16), *weights)


def torchvision_model(name: str, dtype: torch.dtype, side: int = 64) -> tuple[nn.Module, tuple]:
    """torchvision's own `name` (10 classes, eval mode) on x[2, 3, side, side] in `dtype`."""
    import importlib
    import sys
    import types

    # torchvision's compiled ops (nms, roi_align) do not load beside a CPU-only torch wheel;
    # these models use none of them.
    sys.modules.setdefault(
        "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
    )
    models = importlib.import_module("torchvision.models")
    model = getattr(models, name)(num_classes=10).eval().to(dtype)
    weights = [p.detach() for p in model.parameters()]
    return weights_as_arguments(model, 1), (torch.randn(2, 3, side, side).to(dtype), *weights)


def timm_vit_tiny(dtype: torch.dtype, batch: int = 2) -> tuple[nn.Module, tuple]:
    from timm.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(
        img_size=48, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10
    )
    vit = vit.eval().to(dtype)
    weights = [p.detach() for p in vit.parameters()]
    return weights_as_arguments(vit, 1), (torch.randn(batch, 3, 48, 48).to(dtype), *weights)


class LogitsOf(nn.Module):
    """A causal LM's logits alone, its parameters as arguments."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        self.names = [name for name, _ in lm.named_parameters()]

    def forward(self, ids, *weights):
        params = dict(zip(self.names, weights, strict=True))
        return torch.func.functional_call(self.lm, params, (ids,), {"use_cache": False}).logits


def hf_tiny_causal_lm() -> tuple[nn.Module, tuple]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    lm = LlamaForCausalLM(config).eval()
    weights = [p.detach() for p in lm.parameters()]
    return LogitsOf(lm), (torch.randint(0, 256, (1, 16)), *weights)


def llama_mlp_dynamic(dtype=torch.float32) -> tuple[nn.Module, tuple, dict]:
    """The MLP on x[1, L, 64], L dynamic; the weights (static) as arguments."""
    mlp = LlamaMLP().to(dtype).eval()
    weights = [p.detach() for p in mlp.parameters()]
    length = torch.export.Dim("length", min=2, max=4096)
    dynamic = [({1: length}, *[None] * len(weights))]  # forward(*args): one tuple
    x = torch.randn(1, 16, 64).to(dtype)
    return weights_as_arguments(mlp, 1), (x, *weights), dynamic


def save(module: nn.Module, args: tuple, name: str, dynamic_shapes=None) -> None:
    path = os.path.join(HERE, name)
    aot.export(module, *args, dynamic_shapes=dynamic_shapes).save_mlir(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def models() -> dict:
    """File name -> how to build its module and arguments."""
    found = {
        "llama_mlp.mlirbc": lambda: (LlamaMLP().eval(), (torch.randn(1, 8, 64),)),
        "attention.mlirbc": lambda: (
            Attention().eval(),
            (*[torch.randn(1, 4, 16, 16) for _ in range(3)], torch.randn(64, 32)),
        ),
    }
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        found[f"hf_llama_mlp_{name}.mlirbc"] = lambda d=dtype: hf_llama_mlp(d)
        found[f"hf_llama_layer_{name}.mlirbc"] = lambda d=dtype: hf_llama_layer(d)
    found["hf_bert_layer_f32.mlirbc"] = lambda: hf_bert_layer()
    # In f16 a sequence of 16, not the head dim (32): V's transposed heads then differ in
    # shape from Q's and K's, as in BERT-base (512 and 64).
    found["hf_bert_layer_f16.mlirbc"] = lambda: hf_bert_layer(torch.float16, seq=16)
    # And at 32, where they have the same shape: told apart by their maps.
    found["hf_bert_layer_f16_seq32.mlirbc"] = lambda: hf_bert_layer(torch.float16)
    for net, dtype, name in (
        ("resnet18", torch.float32, "tv_resnet18_f32.mlirbc"),
        ("resnet18", torch.float16, "tv_resnet18_f16.mlirbc"),
        ("resnet50", torch.float16, "tv_resnet50_f16.mlirbc"),
        ("mobilenet_v3_small", torch.float32, "tv_mobilenet_v3_small_f32.mlirbc"),
        ("mobilenet_v3_small", torch.float16, "tv_mobilenet_v3_small_f16.mlirbc"),
        ("resnext50_32x4d", torch.float16, "tv_resnext50_32x4d_f16.mlirbc"),
        ("efficientnet_b0", torch.float32, "tv_efficientnet_b0_f32.mlirbc"),
    ):
        found[name] = lambda n=net, d=dtype: torchvision_model(n, d)
    # The same resnet18 on 96x96 images: each convolution's image 1.5x as wide, the shape
    # classes near the 64x64 one's (benchmarks/transfer_runs.py: what its runs teach).
    found["tv_resnet18_f32_96.mlirbc"] = lambda: torchvision_model("resnet18", torch.float32, 96)
    for dtype, name in ((torch.float32, "f32"), (torch.float16, "f16")):
        found[f"timm_vit_tiny_{name}.mlirbc"] = lambda d=dtype: timm_vit_tiny(d)
    # At batch 1, whose attention's unit batch loop IREE folds where it forms dispatches.
    found["timm_vit_tiny_b1_f32.mlirbc"] = lambda: timm_vit_tiny(torch.float32, batch=1)
    found["hf_gpt2_block_f16.mlirbc"] = hf_gpt2_block
    found["hf_tiny_causal_lm_f32.mlirbc"] = hf_tiny_causal_lm
    found["llama_mlp_dynamic_f32.mlirbc"] = llama_mlp_dynamic
    found["llama_mlp_dynamic_bf16.mlirbc"] = lambda: llama_mlp_dynamic(torch.bfloat16)
    return found


if __name__ == "__main__":
    import sys

    wanted = sys.argv[1:]  # file names; all of them without any
    for name, build in models().items():
        if not wanted or name in wanted:
            torch.manual_seed(0)
            try:
                module, args, *dynamic = build()  # and the dynamic dims, if any
                save(module, args, name, *dynamic)
            except Exception as error:  # one model's failure leaves the others to be written
                print(f"{name}: {type(error).__name__}: {error}"[:2000])
