"""The zoo's decode rows: a whole causal LM's decode step (one new token a sequence against a
KV cache) for `benchmarks/zoo.py`, torch's side and the export.

torch runs transformers' own `LlamaForCausalLM` with a `StaticCache` as transformers
recommends for compiled generation: a prefill of the prompt, then the decode step timed
eager and under `torch.compile(mode="reduce-overhead")` (CUDA graphs; the cache's tensors
have static addresses, written in place). autosched gets the same model exported by
`tools/export_causal_lm.py --in-place` (prefill and decode writing the cache arguments, the
weights seeded), and the row compares the decode function's time. torch's greedy tokens
(batch 1) are saved beside the export, so the run's proof compares its builds' tokens with
them. The floor a decode step cannot beat at batch 1 is reading every weight once:
`weights_read_ms`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
from model_campaign import time_calls

from autosched.drivers.decode_proof import DECODE_STEPS

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
# Peak memory bandwidth (bytes/s) of the GPUs the zoo runs on, by torch's device name.
BANDWIDTH = {"H100 80GB HBM3": 3.35e12, "H200": 4.8e12}
TIMED_CALLS = 2 * (5 + 30)  # eager's and reduce-overhead's warm-ups and timed calls


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


@dataclass
class TorchDecode:
    """torch's side of a decode row."""

    times: dict  # eager and reduce-overhead: (events median, cv, wall median), or None
    weight_bytes: int
    prompt: np.ndarray  # [B, P], the seed's draw (as the export's)
    tokens: np.ndarray  # [B, DECODE_STEPS + 1]: torch's greedy tokens after the prompt


def torch_decode(shape, device: str) -> TorchDecode:
    """A prefill of the prompt and DECODE_STEPS greedy decode steps (torch's tokens, which the
    run's proof compares its builds' with), then the decode step timed eager and under
    reduce-overhead."""
    from transformers import StaticCache  # noqa: PLC0415 - on the GPU machine

    # transformers 5's StaticCache writes each call's token at its own running count, not
    # at `cache_position`, so the timed calls take cache slots too.
    needed = shape.prompt + DECODE_STEPS + 1 + TIMED_CALLS
    if needed > shape.cache:
        raise ValueError(f"a cache of {shape.cache} tokens is short of the {needed} timed")
    lm = EXPORT.llama(shape, seed=0).to(device)
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.parameters())
    cache = StaticCache(config=lm.config, max_cache_len=shape.cache)
    drawn = np.random.default_rng(0).integers(0, shape.vocab, (shape.batch, shape.prompt))
    prompt = torch.from_numpy(drawn).to(device)

    def step(ids, at):
        return lm(ids, past_key_values=cache, cache_position=at, use_cache=True).logits

    with torch.no_grad():
        start = torch.arange(shape.prompt, device=device)
        chosen = [step(prompt, start)[:, -1].argmax(-1)]
        for index in range(DECODE_STEPS):
            at = torch.tensor([shape.prompt + index], device=device)
            chosen.append(step(chosen[-1][:, None], at)[:, -1].argmax(-1))
    token = chosen[-1][:, None].contiguous()
    position = torch.tensor([shape.prompt + DECODE_STEPS], device=device)
    times = {"eager": time_calls(step, (token, position), device, warmups=5)}
    try:
        compiled = torch.compile(step, mode="reduce-overhead")
        times["compile"] = time_calls(compiled, (token, position), device, warmups=5)
    except Exception as error:  # a failure blanks the column; the zoo goes on
        print(f"torch.compile reduce-overhead failed: {error!r}"[:400], flush=True)
        times["compile"] = None
    finally:
        torch._dynamo.reset()
    tokens = torch.stack(chosen, dim=1).cpu().numpy()
    return TorchDecode(times, weight_bytes, drawn, tokens)


def export_in_place(shape, path: str) -> None:
    """prefill and decode, writing the cache arguments, the weights seeded (seed 0)."""
    EXPORT.export(path, shape, seed=0, in_place=True)


def weights_read_ms(weight_bytes: int, gpu: str) -> float | None:
    """Reading every weight once at the GPU's peak bandwidth: a decode step's floor."""
    bandwidth = next((b for name, b in BANDWIDTH.items() if name in gpu), None)
    return weight_bytes / bandwidth * 1e3 if bandwidth else None
