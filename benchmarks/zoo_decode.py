"""The zoo's decode rows: a whole causal LM's decode step (one new token a sequence against a
KV cache) for `benchmarks/zoo.py`, torch's side and the export.

torch runs transformers' own `LlamaForCausalLM` with a `StaticCache` as transformers
recommends for compiled generation: a prefill of the prompt, then the decode step timed
eager and under `torch.compile(mode="reduce-overhead")` (CUDA graphs; the cache's tensors
have static addresses, written in place). autosched gets the same model exported by
`tools/export_causal_lm.py --in-place` (prefill and decode writing the cache arguments, the
weights seeded), and the row compares the decode function's time. The floor a decode step
cannot beat at batch 1 is reading every weight once: `weights_read_ms`.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import torch
from model_campaign import time_calls

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
# Peak memory bandwidth (bytes/s) of the GPUs the zoo runs on, by torch's device name.
BANDWIDTH = {"H100 80GB HBM3": 3.35e12, "H200": 4.8e12}


def _export_tool():
    """tools/export_causal_lm.py as a module (tools/ is not a package)."""
    path = os.path.join(TOOLS, "export_causal_lm.py")
    spec = importlib.util.spec_from_file_location("export_causal_lm", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


EXPORT = _export_tool()


def lm_shape(shape: dict, batch: int, dtype: torch.dtype):
    """The export tool's Shape of a zoo entry at `batch` sequences."""
    return EXPORT.Shape(
        vocab=shape["vocab"], hidden=shape["hidden"], intermediate=shape["mlp"],
        layers=shape["layers"], heads=shape["heads"], kv_heads=shape["kv_heads"],
        prompt=shape["prompt"], cache=shape["cache"], batch=batch,
        dtype=str(dtype).removeprefix("torch."),
    )  # fmt: skip


def decode_times(shape, device: str) -> tuple[dict, int]:
    """torch's decode step after a prefill of the prompt, eager and reduce-overhead: (events
    median, cv, wall median) each, or None where torch.compile failed; and the bytes of
    the model's weights."""
    from transformers import StaticCache  # noqa: PLC0415 - on the GPU machine

    lm = EXPORT.llama(shape, seed=0).to(device)
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.parameters())
    cache = StaticCache(config=lm.config, max_cache_len=shape.cache)
    prompt = torch.from_numpy(
        np.random.default_rng(0).integers(0, shape.vocab, (shape.batch, shape.prompt))
    ).to(device)
    with torch.no_grad():
        lm(prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(
            shape.prompt, device=device))  # fmt: skip
    token = prompt[:, -1:].contiguous()
    position = torch.tensor([shape.prompt], device=device)

    def step(ids, at):
        return lm(ids, past_key_values=cache, cache_position=at, use_cache=True).logits

    times = {"eager": time_calls(step, (token, position), device, warmups=5)}
    try:
        compiled = torch.compile(step, mode="reduce-overhead")
        times["compile"] = time_calls(compiled, (token, position), device, warmups=5)
    except Exception as error:  # a failure blanks the column; the zoo goes on
        print(f"torch.compile reduce-overhead failed: {error!r}"[:400], flush=True)
        times["compile"] = None
    finally:
        torch._dynamo.reset()
    return times, weight_bytes


def export_in_place(shape, path: str) -> None:
    """prefill and decode, writing the cache arguments, the weights seeded (seed 0)."""
    EXPORT.export(path, shape, seed=0, in_place=True)


def weights_read_ms(weight_bytes: int, gpu: str) -> float | None:
    """Reading every weight once at the GPU's peak bandwidth: a decode step's floor."""
    bandwidth = next((b for name, b in BANDWIDTH.items() if name in gpu), None)
    return weight_bytes / bandwidth * 1e3 if bandwidth else None
