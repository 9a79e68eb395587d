"""Exports a transformers causal LM as ONE module with two functions, prefill and decode,
its KV cache passed in and returned, its weights as arguments (docs/causal-lm.md).

The recipe (iree-turbine's `FxProgramsBuilder`: several `torch.export` programs of one root
module, written as one MLIR module by `aot.export`):

    prefill(tokens[1, P] i64, cache..., weights...)            -> (logits[1, P, V], cache...)
    decode(token[1, 1] i64, position[1] i64, cache..., weights...) -> (logits[1, 1, V], cache...)

`--in-place` exports them as a server runs them: each writes the cache arguments themselves
(transformers' StaticCache updates them with `index_copy_`; iree-turbine exports the write,
and IREE stores it into the caller's buffer) and returns its logits alone, so a decode step
does not copy the whole cache.

`cache` is each layer's keys and values, [1, KV heads, C, head dim] (transformers'
`StaticCache` layout, C the cache's length), in layer order, keys before values. Prefill
writes positions 0..P-1 from an empty (zero) cache; decode writes `position`. Inside, each
function runs transformers' own `LlamaForCausalLM` with a `StaticCache` whose tensors are the
arguments (copied, so the export returns new caches instead of mutating its inputs).

The weights are drawn with `autosched.drivers.decode_proof.seeded_weights` (numpy, seeded), so
a test without torch rebuilds them from the seed alone; the greedy tokens torch produces with
them (prefill, then DECODE_STEPS decode steps) are saved next to the model as
`<stem>.tokens.npz` (`prompt`, `tokens`, `seed`).

`--decode-dynamic` exports the decode step alone with the cache's length C dynamic
(`torch.export.Dim` on each cache tensor's third dim; the mask is as long as the cache the
call is given), for one build that serves a cache of any length, tuned on `--bucket` files
at two or more lengths (the committed `tests/data/models/hf_tiny_llama_decode_dynamic_f32.mlirbc`).

`--size llama32_1b` exports Llama-3.2-1B's shape (hidden 2048, 16 layers, 32/8 heads, vocab
128256; random weights) with a 512-token prompt and a 2048-token cache. `--prompt P` and
`--cache C` set those lengths for either size.

`--batch B` exports B sequences a call (tokens [B, P], each cache tensor [B, ...]; torch's
tokens are saved at batch 1 only). `--dtype bfloat16` (or float16) exports the weights and
the cache in that type, without torch's tokens (rounding may part them from any build's): the
committed
`tests/data/models/hf_tiny_llama_cached_bf16.mlirbc`, whose attentions take the cache's mask.

iree-turbine and torch are not dependencies of autosched; run this from a separate
environment, from the repository's root:

    python3.11 -m venv /tmp/turbine-venv
    /tmp/turbine-venv/bin/pip install torch==2.13.0 transformers==4.57.6 iree-turbine click \
        'iree-base-compiler==3.13.*' 'iree-base-runtime==3.13.*'
    PYTHONPATH=. /tmp/turbine-venv/bin/python tools/export_causal_lm.py \
        tests/data/models/hf_tiny_llama_cached_f32.mlirbc
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import numpy as np

from autosched.drivers.decode_proof import DECODE_STEPS, seeded_weights


@dataclass(frozen=True)
class Shape:
    """The exported model's size: a tiny Llama by default (the committed CPU test model)."""

    vocab: int = 256
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    prompt: int = 8  # P: prefill's tokens
    cache: int = 64  # C: the static cache's length (>= prompt + DECODE_STEPS)
    batch: int = 1  # B: sequences (the tokens [B, P], each cache tensor [B, ...])
    dtype: str = "float32"  # torch's name of the weights' and the cache's type


# `--size`: the tiny default, or Llama-3.2-1B's shape (random weights; a 2048-token cache).
SIZES = {
    "tiny": {},
    "llama32_1b": {
        "vocab": 128256, "hidden": 2048, "intermediate": 8192, "layers": 16, "heads": 32,
        "kv_heads": 8, "prompt": 512, "cache": 2048,
    },
}  # fmt: skip


def llama(shape: Shape, seed: int):
    """transformers' LlamaForCausalLM of `shape`, its weights `seeded_weights(..., seed)`."""
    import torch  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.cache,
        attn_implementation="sdpa",
    )
    lm = LlamaForCausalLM(config).eval()
    parameters = list(lm.parameters())
    drawn = seeded_weights([tuple(p.shape) for p in parameters], seed)
    with torch.no_grad():
        for parameter, values in zip(parameters, drawn, strict=True):
            parameter.copy_(torch.from_numpy(values))
    return lm.to(getattr(torch, shape.dtype))


def cached_functions(lm, shape: Shape, in_place: bool = False):
    """prefill and decode as free functions of (root, args...) for FxProgramsBuilder; with
    `in_place`, each writes the cache arguments themselves and returns the logits alone."""
    import torch  # noqa: PLC0415
    from transformers import StaticCache  # noqa: PLC0415

    names = [name for name, _ in lm.named_parameters()]
    count = 2 * shape.layers

    def static_cache(tensors, positions):
        cache = StaticCache(config=lm.config, max_cache_len=shape.cache)
        for index, layer in enumerate(cache.layers):
            keys, values = tensors[2 * index], tensors[2 * index + 1]
            if not in_place:
                keys, values = keys.clone(), values.clone()
            # The cache's length is the arguments' (dynamic in `--decode-dynamic`: the mask
            # is then as long as the cache the call is given).
            layer.max_batch_size, layer.num_heads, layer.max_cache_len, layer.head_dim = keys.shape
            layer.dtype, layer.device = keys.dtype, keys.device
            layer.keys, layer.values, layer.is_initialized = keys, values, True
            if hasattr(layer, "cumulative_length"):
                # transformers 5 writes the cache at its own count of tokens, not at the
                # `cache_position` it no longer takes: the count is the first position here,
                # a tensor of the call (else traced as the constant 0).
                layer.cumulative_length = positions[:1].clone()
        return cache

    def run(root, ids, positions, args):
        tensors, weights = args[:count], args[count:]
        cache = static_cache(tensors, positions)
        params = dict(zip(names, weights, strict=True))
        keywords = {
            "past_key_values": cache,
            "cache_position": positions,  # transformers 4's
            "position_ids": positions[None].expand(ids.shape[0], -1),  # and 5's
            "use_cache": True,
        }
        out = torch.func.functional_call(root, params, (ids,), keywords)
        if in_place:  # StaticCache.update wrote the arguments (index_copy_)
            return (out.logits,)
        layers = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return (out.logits, *layers)

    def prefill(root, tokens, *args):
        return run(root, tokens, torch.arange(tokens.shape[1]), args)

    def decode(root, token, position, *args):
        return run(root, token, position, args)

    return prefill, decode


def empty_cache(lm, shape: Shape) -> list:
    import torch  # noqa: PLC0415

    head_dim = shape.hidden // shape.heads
    one = (shape.batch, shape.kv_heads, shape.cache, head_dim)
    return [torch.zeros(one, dtype=getattr(torch, shape.dtype)) for _ in range(2 * shape.layers)]


def greedy(lm, shape: Shape, prompt, in_place: bool = False) -> list[int]:
    """torch's greedy tokens through the exported functions themselves: prefill's last
    logits, then DECODE_STEPS decode steps carrying the cache (DECODE_STEPS + 1 tokens)."""
    import torch  # noqa: PLC0415

    prefill, decode = cached_functions(lm, shape, in_place)
    weights = [p.detach() for p in lm.parameters()]
    with torch.no_grad():
        cache = empty_cache(lm, shape)
        logits, *returned = prefill(lm, prompt, *cache, *weights)
        cache = cache if in_place else returned
        tokens = [int(logits[0, -1].argmax())]
        for step in range(DECODE_STEPS):
            token = torch.tensor([[tokens[-1]]])
            position = torch.tensor([shape.prompt + step])
            logits, *returned = decode(lm, token, position, *cache, *weights)
            cache = cache if in_place else returned
            tokens.append(int(logits[0, -1].argmax()))
        # The cached path agrees with transformers' own uncached forward on every token.
        whole = torch.cat([prompt, torch.tensor([tokens[:-1]])], dim=1)
        plain = lm(whole, use_cache=False).logits[0, shape.prompt - 1 :].argmax(-1).tolist()
    if plain != tokens:
        raise SystemExit(f"cached greedy tokens {tokens} differ from the uncached {plain}")
    return tokens


def export(path: str, shape: Shape, seed: int, in_place: bool = False) -> None:
    """prefill and decode in one module (`in_place`: each writes the cache arguments)."""
    import iree.turbine.aot as aot  # noqa: PLC0415
    import torch  # noqa: PLC0415

    lm = llama(shape, seed)
    prefill, decode = cached_functions(lm, shape, in_place)
    weights = tuple(p.detach() for p in lm.parameters())
    cache = tuple(empty_cache(lm, shape))
    prompt = torch.from_numpy(
        np.random.default_rng(seed).integers(0, shape.vocab, (shape.batch, shape.prompt))
    )
    builder = aot.FxProgramsBuilder(lm)
    builder.export_program(prefill, name="prefill", args=(prompt, *cache, *weights), strict=False)
    decode_args = (prompt[:, :1], torch.tensor([shape.prompt]), *cache, *weights)
    builder.export_program(decode, name="decode", args=decode_args, strict=False)
    aot.export(builder).save_mlir(path)
    if shape.dtype != "float32" or shape.batch > 1:  # rounding may part torch's tokens
        print(f"wrote {path} ({os.path.getsize(path)} bytes) in {shape.dtype}")  # from IREE's
        return
    tokens = greedy(lm, shape, prompt, in_place)
    stem = os.path.splitext(path)[0]
    np.savez(f"{stem}.tokens.npz", prompt=prompt.numpy(), tokens=np.array(tokens), seed=seed)
    print(f"wrote {path} ({os.path.getsize(path)} bytes); torch's greedy tokens {tokens}")


def export_dynamic(path: str, shape: Shape, seed: int) -> None:
    """The model's plain forward (no cache), token ids [1, S] with S dynamic (2 to the
    cache's length): logits [1, S, V]."""
    import iree.turbine.aot as aot  # noqa: PLC0415
    import torch  # noqa: PLC0415

    lm = llama(shape, seed)
    names = [name for name, _ in lm.named_parameters()]
    weights = tuple(p.detach() for p in lm.parameters())

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, ids, *args):
            params = dict(zip(names, args, strict=True))
            keywords = {"use_cache": False}
            return torch.func.functional_call(self.lm, params, (ids,), keywords).logits

    ids = torch.zeros((1, shape.prompt), dtype=torch.int64)
    sequence = torch.export.Dim.DYNAMIC(min=2, max=shape.cache)
    dynamic = ({1: sequence}, (None,) * len(weights))  # ids, then the *args tuple
    exported = aot.export(Logits(), ids, *weights, dynamic_shapes=dynamic, strict_export=False)
    exported.save_mlir(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes), sequence length dynamic")


def export_decode_dynamic(path: str, shape: Shape, seed: int) -> None:
    """The decode step alone, the cache's length C dynamic (DECODE_STEPS + 2 to 4096): one
    build serves a cache of any length (`--bucket` files at two or more lengths tune it)."""
    import iree.turbine.aot as aot  # noqa: PLC0415
    import torch  # noqa: PLC0415

    lm = llama(shape, seed)
    _, decode = cached_functions(lm, shape)
    weights = tuple(p.detach() for p in lm.parameters())
    cache = tuple(empty_cache(lm, shape))
    length = torch.export.Dim.DYNAMIC(min=DECODE_STEPS + 2, max=4096)
    token, position = torch.zeros((1, 1), dtype=torch.int64), torch.tensor([shape.prompt])
    rest = (*({2: length} for _ in cache), *(None for _ in weights))  # decode's *args
    builder = aot.FxProgramsBuilder(lm)
    builder.export_program(
        decode,
        name="decode",
        args=(token, position, *cache, *weights),
        dynamic_shapes=(None, None, rest),
        strict=False,
    )
    aot.export(builder).save_mlir(path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes), the cache's length dynamic")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the .mlirbc (or .mlir) to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dynamic", action="store_true", help="the plain forward, its sequence length dynamic"
    )
    parser.add_argument(
        "--decode-dynamic",
        action="store_true",
        help="the decode step alone, the KV cache's length dynamic",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="the weights' and the cache's type (greedy tokens are saved for float32 only)",
    )
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES), help="the model's shape")
    parser.add_argument("--batch", type=int, default=1, help="sequences (prefill and decode)")
    parser.add_argument("--prompt", type=int, help="prefill's tokens (default: the size's)")
    parser.add_argument("--cache", type=int, help="the cache's length (default: the size's)")
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="prefill and decode write the cache arguments and return the logits alone",
    )
    args = parser.parse_args()
    lengths = {"prompt": args.prompt, "cache": args.cache}
    sized = {**SIZES[args.size], **{k: v for k, v in lengths.items() if v is not None}}
    shape = Shape(dtype=args.dtype, batch=args.batch, **sized)
    if shape.cache < shape.prompt + DECODE_STEPS:
        parser.error(f"--cache must hold the prompt and {DECODE_STEPS} decode steps")
    if args.decode_dynamic:
        export_decode_dynamic(args.output, shape, args.seed)
    elif args.dynamic:
        export_dynamic(args.output, shape, args.seed)
    else:
        export(args.output, shape, args.seed, args.in_place)


if __name__ == "__main__":
    main()
