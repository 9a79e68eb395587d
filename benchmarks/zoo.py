"""The model zoo: real models from transformers, timm and torchvision, each tuned by
`autosched run MODEL --target cuda` as a user runs it (no cfg), against torch eager,
torch.compile and torch.compile `max-autotune-no-cudagraphs` in the same call.

On the H200 (after the device pack's bootstrap, with iree-turbine's wheel unpacked):

    python3 benchmarks/zoo.py --out $OUT [--models vit_b16,resnet50] [--deadline-s 540]
        [--previous benchmarks/results/zoo.json] [--databases DIR] [--exports DIR]

A causal LM with `lengths` (llama32_1b_prefill) is exported with its sequence length
dynamic and tuned on a bucket of token ids at each length (the run draws the weights), one
row per length from the one build; torch.compile is timed at each length (max-autotune
left out: its autotuning of a whole LM does not fit a call). One with `batches`
(llama32_1b_decode) is exported with prefill and decode writing their KV cache in place, one
build per batch, and compared on the decode step against torch.compile's reduce-overhead
mode with transformers' StaticCache (benchmarks/zoo_decode.py), and against reading every
weight once. `--device cpu --models tiny_llama_prefill,tiny_llama_decode` runs those paths on
a machine without a GPU.

Every time is the median wall time of a synchronous call (IREE's by iree-benchmark-module,
torch's from the host's call to the GPU's end); torch's CUDA-event medians are kept beside.
A model's row is one call's; rows of other calls come from `--previous` unchanged, so the
zoo fills over several device calls. `--databases` holds `<model>.tuning.jsonl` to resume,
and the call writes the grown databases back into one archive (`zoo_runs.tar.gz`, with each
run's summary and log), since a call returns at most 8 files. `--exports` holds
`<model>.mlir` (a decode row's `<model>_b<batch>.mlir`) exported beforehand by the same
recipe with the device's torch and transformers, so that a call does not spend a minute
exporting a 1B LM.

A CNN at batch 32 does not fit one call with its max-autotune: inductor's autotuning of
resnet50's convolutions took about 300 s of a call. `--torch-only` times torch alone (eager,
torch.compile, max-autotune); every call writes each model's torch timings to
`torch_times.json` as it goes (the causal LMs', which time no max-autotune, aside), so a call
cut short keeps them; a later call given it by
`--max-autotune-from FILE` times eager and torch.compile again beside `autosched run` and
takes max-autotune from the file where it was timed on a GPU of the same name. Such a cell
is marked in zoo.md, and the row names the call (`max_autotune_from`).
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import zoo_decode
from model_campaign import (
    Llama3Layer,
    ModuleWithWeights,
    build_bert,
    build_llama3,
    export,
    time_calls,
)

CUDA = "cuda"


@dataclass(frozen=True)
class ZooModel:
    """One entry: where it comes from, what class of model it is, and its builder."""

    name: str
    source: str  # transformers, timm or torchvision
    kind: str  # decoder layer, encoder, vision transformer, CNN ...
    dtype: torch.dtype
    shape: dict = field(default_factory=dict)


def _rand_factory(dtype, device: str):
    generator = torch.Generator(device="cpu").manual_seed(0)

    def rand(*dims, std=0.02):
        return (torch.randn(*dims, generator=generator) * std).to(dtype).to(device)

    return rand


def _decoder_layer(family: str, dtype, shape: dict, device: str):
    """A transformers decoder layer of `family` (llama, qwen2, mistral), its rotary table
    computed outside and passed in, weights as arguments (model_campaign.Llama3Layer)."""
    prefix = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[family]
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config = getattr(module, f"{prefix}Config")(
        hidden_size=shape["hidden"],
        intermediate_size=shape["mlp"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["hidden"] // shape["heads"],
        rope_theta=shape.get("rope_theta", 10000.0),
        max_position_embeddings=max(8192, shape["seq"]),
        attn_implementation="sdpa",
    )
    layer_cls = getattr(module, f"{prefix}DecoderLayer")
    layer = layer_cls(config, layer_idx=0).to(dtype=dtype, device=device).eval()
    rand = _rand_factory(dtype, device)
    x = rand(shape["batch"], shape["seq"], shape["hidden"], std=1.0)
    positions = torch.arange(shape["seq"], device=device)[None].expand(shape["batch"], -1)
    with torch.no_grad():
        cos, sin = getattr(module, f"{prefix}RotaryEmbedding")(config).to(device)(x, positions)
    weights = [
        rand(*p.shape) if p.dim() == 2 else torch.ones(p.shape, dtype=dtype, device=device)
        for _, p in layer.named_parameters()
    ]
    return Llama3Layer(layer), [x, cos, sin, *weights]


def _gpt2_block(dtype, shape: dict, device: str):
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(
        n_embd=shape["hidden"], n_head=shape["heads"], n_positions=max(1024, shape["seq"])
    )
    config._attn_implementation = "sdpa"
    block = GPT2Block(config, layer_idx=0).to(dtype=dtype, device=device).eval()
    rand = _rand_factory(dtype, device)
    weights = [
        rand(*p.shape) if p.dim() == 2 else torch.ones(p.shape, dtype=dtype, device=device)
        for _, p in block.named_parameters()
    ]
    x = rand(shape["batch"], shape["seq"], shape["hidden"], std=1.0)
    return ModuleWithWeights(block), [x, *weights]


def _vision(source: str, dtype, shape: dict, device: str):
    """A whole timm or torchvision classifier with its own initial weights (random), as
    arguments; batch norms' statistics stay constants of the export."""
    if source == "timm":
        import timm

        net = timm.create_model(shape["net"], pretrained=False)
    else:
        import torchvision

        net = getattr(torchvision.models, shape["net"])()
    net = net.to(dtype=dtype, device=device).eval()
    image = _rand_factory(dtype, device)(shape["batch"], 3, shape["image"], shape["image"], std=1.0)
    return ModuleWithWeights(net), [image, *(p.detach() for p in net.parameters())]


LLAMA3 = {"batch": 1, "seq": 2048, "hidden": 4096, "heads": 32, "kv_heads": 8, "mlp": 14336}
# Llama-3.2-1B's shape (random weights), prefill at three lengths from one dynamic build.
LLAMA32_1B = {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "mlp": 8192,
              "vocab": 128256, "rope_theta": 500000.0, "lengths": [512, 1500, 2048]}  # fmt: skip
# Its decode step at batch 1 and 8 after a 512-token prompt, a 2048-token cache.
LLAMA32_1B_DECODE = {**{k: v for k, v in LLAMA32_1B.items() if k != "lengths"},
                     "prompt": 512, "cache": 2048, "batches": [1, 8]}  # fmt: skip
ZOO = [
    ZooModel("llama3_8b_layer", "transformers", "decoder layer, GQA 4:1, head dim 128",
             torch.bfloat16, dict(LLAMA3, rope_theta=500000.0)),
    ZooModel("qwen2_7b_layer", "transformers", "decoder layer, q/k/v bias, GQA 7:1, seq 4096",
             torch.bfloat16,
             {"batch": 1, "seq": 4096, "hidden": 3584, "heads": 28, "kv_heads": 4, "mlp": 18944}),
    ZooModel("mistral_7b_layer_1500", "transformers", "decoder layer, seq 1500 (no power of two)",
             torch.bfloat16, dict(LLAMA3, seq=1500)),
    ZooModel("gpt2_medium_block", "transformers", "decoder block, bias, MHA, head dim 64",
             torch.float16, {"batch": 8, "seq": 1024, "hidden": 1024, "heads": 16}),
    ZooModel("bert_base_layer", "transformers", "encoder layer, head dim 64",
             torch.float16, {"batch": 8, "seq": 512, "hidden": 768, "heads": 12, "mlp": 3072}),
    ZooModel("vit_b16", "timm", "vision transformer, 197 tokens",
             torch.float16, {"net": "vit_base_patch16_224", "batch": 32, "image": 224}),
    ZooModel("deit_small", "timm", "vision transformer, 6 heads, 197 tokens",
             torch.float16, {"net": "deit_small_patch16_224", "batch": 32, "image": 224}),
    ZooModel("convnext_tiny", "timm", "CNN, 7x7 depthwise",
             torch.float16, {"net": "convnext_tiny", "batch": 32, "image": 224}),
    ZooModel("resnet50", "torchvision", "CNN, residual",
             torch.float16, {"net": "resnet50", "batch": 32, "image": 224}),
    ZooModel("resnext50_32x4d", "torchvision", "CNN, grouped",
             torch.float16, {"net": "resnext50_32x4d", "batch": 32, "image": 224}),
    ZooModel("efficientnet_b0", "torchvision", "CNN, depthwise, squeeze-excite, SiLU",
             torch.float16, {"net": "efficientnet_b0", "batch": 32, "image": 224}),
    ZooModel("mobilenet_v3_large", "torchvision", "CNN, inverted residual, hard-swish",
             torch.float16, {"net": "mobilenet_v3_large", "batch": 32, "image": 224}),
    ZooModel("llama32_1b_prefill", "transformers",
             "whole causal LM, prefill: one build for every length", torch.bfloat16,
             LLAMA32_1B),
    ZooModel("llama32_1b_decode", "transformers",
             "whole causal LM, decode (cache 2048, in place; torch: reduce-overhead)",
             torch.bfloat16, LLAMA32_1B_DECODE),
    # The same paths on a tiny LM: `--device cpu` runs them on a machine without a GPU.
    ZooModel("tiny_llama_prefill", "transformers", "whole causal LM, prefill (tiny)",
             torch.float32, {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 128,
                             "vocab": 256, "lengths": [16, 40]}),
    ZooModel("tiny_llama_decode", "transformers", "whole causal LM, decode (tiny)",
             torch.float32, {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 128,
                             "vocab": 256, "prompt": 8, "cache": 128, "batches": [1, 2]}),
]  # fmt: skip
BY_NAME = {model.name: model for model in ZOO}


def build(model: ZooModel, device: str):
    """The torch module and its arguments (weights included) for one zoo entry."""
    if model.source in ("timm", "torchvision"):
        return _vision(model.source, model.dtype, model.shape, device)
    if model.name.startswith("bert"):
        return build_bert(model.dtype, model.shape, _rand_factory(model.dtype, device), device)
    if model.name.startswith("gpt2"):
        return _gpt2_block(model.dtype, model.shape, device)
    if model.name.startswith("llama3"):
        shape = dict(model.shape, head_dim=model.shape["hidden"] // model.shape["heads"])
        return build_llama3(model.dtype, shape, _rand_factory(model.dtype, device), device)
    family = model.name.split("_")[0]
    return _decoder_layer(family, model.dtype, model.shape, device)


def _causal_lm(model: ZooModel, device: str):
    """transformers' LlamaForCausalLM from a config (random weights): a module of (token
    ids, *weights) -> logits, its weights as arguments as a user exports it, and them."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - on the GPU machine

    shape = model.shape
    config = LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"],
        intermediate_size=shape["mlp"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=2 * max(shape["lengths"]),
        rope_theta=shape.get("rope_theta", 10000.0), attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    lm = LlamaForCausalLM(config).to(model.dtype).to(device).eval()
    names = [name for name, _ in lm.named_parameters()]
    weights = [parameter.detach() for parameter in lm.parameters()]

    class Logits(torch.nn.Module):
        def forward(self, ids, *args):
            params = dict(zip(names, args, strict=True))
            return torch.func.functional_call(lm, params, (ids,), {"use_cache": False}).logits

    return Logits(), weights


def tune_lengths(entry: ZooModel, options, minutes: float) -> list[dict]:
    """A causal LM exported with its length dynamic, tuned on a bucket of token ids at each
    length (the weights drawn by the run: a bucket holds the ids alone), against torch at
    each length: a row per length, every one from the same build."""
    folder = os.path.abspath(os.path.join(options.work, entry.name))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    module, weights = _causal_lm(entry, options.device)
    lengths, vocab = entry.shape["lengths"], entry.shape["vocab"]
    times, buckets = {}, []
    for length in lengths:
        ids = torch.randint(0, vocab, (1, length), device=options.device)
        times[length] = torch_times(module, (ids, *weights), options.device, autotune=False)
        print(f"{entry.name} at {length}: torch {json.dumps(times[length])}", flush=True)
        # The bucket holds the ids alone: the run draws the weights (seeded).
        np.savez(os.path.join(folder, f"at{length}.npz"), ids.cpu().numpy())
        buckets += ["--bucket", f"at{length}.npz"]
    model_path = os.path.join(folder, f"{entry.name}.mlir")
    if not reuse_export(options.exports, entry.name, model_path):
        export_dynamic(module, weights, lengths, model_path)
    del module, weights
    seed_database(options.databases, entry.name, folder)
    extra = [*(options.autosched_args.split() if options.autosched_args else []), *buckets]
    code, wall = run_autosched(folder, model_path, extra, search_minutes(options, minutes), options)
    summary_path = find_one(folder, "*summary.json")
    summary = json.load(open(summary_path)) if summary_path else {}
    print(f"{entry.name}: exit {code}, {wall:.0f} s", flush=True)
    functions = {f["function"]: f for f in (summary.get("model") or {}).get("functions", [])}
    rows = []
    for length in lengths:
        found = next((f for name, f in functions.items() if name.endswith(f"len{length}")), {})
        one = {**summary, "model": found and {**found, **delivered(summary)}}
        named = ZooModel(f"{entry.name}@{length}", entry.source, entry.kind, entry.dtype,
                         dict(entry.shape, length=length))  # fmt: skip
        rows.append(row(named, times[length], one, wall, code))
    return rows


def tune_decode(entry: ZooModel, options, minutes: float) -> list[dict]:
    """A causal LM's decode step at each batch, its cache written in place: a row per batch,
    each its own export and run, compared on the decode function's time."""
    rows = []
    for batch in entry.shape["batches"]:
        if (options.stop_at - time.monotonic()) / 60 < 3:
            print(f"{entry.name} at batch {batch}: not started, the call's time is up", flush=True)
            continue
        stem = f"{entry.name}_b{batch}"
        folder = os.path.abspath(os.path.join(options.work, stem))
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        shape = zoo_decode.lm_shape(entry.shape, batch, entry.dtype)
        side = zoo_decode.torch_decode(shape, options.device)
        times = side.times
        print(f"{stem}: torch {json.dumps(times)}", flush=True)
        model_path = os.path.join(folder, f"{stem}.mlir")
        torch.cuda.empty_cache()  # torch's model is gone: the GPU is the run's
        if not reuse_export(options.exports, stem, model_path):
            zoo_decode.export_in_place(shape, model_path)
        if batch == 1:  # torch's tokens, which the proof compares its builds' with
            saved = os.path.join(folder, f"{stem}.tokens.npz")
            np.savez(saved, prompt=side.prompt, tokens=side.tokens[0], seed=0)
        seed_database(options.databases, stem, folder)
        extra = options.autosched_args.split() if options.autosched_args else []
        searched = search_minutes(options, minutes)
        code, wall = run_autosched(folder, model_path, extra, searched, options)
        summary_path = find_one(folder, "*summary.json")
        summary = json.load(open(summary_path)) if summary_path else {}
        print(f"{stem}: exit {code}, {wall:.0f} s", flush=True)
        functions = (summary.get("model") or {}).get("functions", [])
        decode = next((f for f in functions if f["function"] == "decode"), {})
        named = ZooModel(f"{entry.name}@b{batch}", entry.source, entry.kind, entry.dtype,
                         dict(entry.shape, batch=batch))  # fmt: skip
        one = row(named, times, {**summary, "model": decode and {**decode, **delivered(summary)}},
                  wall, code)  # fmt: skip
        one["weights_read_ms"] = zoo_decode.weights_read_ms(side.weight_bytes, one["gpu"])
        one["greedy_match"] = ((summary.get("model") or {}).get("greedy") or {}).get("match")
        rows.append(one)
    return rows


def export_dynamic(module, weights, lengths: list[int], path: str) -> None:
    """The module exported with iree-turbine, the token ids' length dynamic."""
    from iree.turbine import aot  # noqa: PLC0415 - on the GPU machine

    cpu = [weight.cpu() for weight in weights]
    ids = torch.zeros((1, lengths[0]), dtype=torch.int64)
    sequence = torch.export.Dim.DYNAMIC(min=2, max=2 * max(lengths))
    dynamic = ({1: sequence}, (None,) * len(cpu))  # the ids, then the weights' tuple
    aot.export(module, ids, *cpu, dynamic_shapes=dynamic, strict_export=False).save_mlir(path)


def torch_times(module, args, device: str, autotune: bool = True) -> dict:
    """Eager, torch.compile and max-autotune-no-cudagraphs: (events median, cv, wall median)
    each, or None where torch.compile failed."""
    times = {"eager": time_calls(module, args, device, warmups=5)}
    modes = [("compile", None), ("max_autotune", "max-autotune-no-cudagraphs")]
    for label, mode in modes if autotune else modes[:1]:
        try:
            compiled = torch.compile(module, mode=mode) if mode else torch.compile(module)
            times[label] = time_calls(compiled, args, device, warmups=5)
        except Exception as error:  # a failure blanks the column; the zoo goes on
            print(f"torch.compile {label} failed: {error!r}"[:400], file=sys.stderr)
            times[label] = None
        finally:
            torch._dynamo.reset()
    return times


def search_minutes(options, minutes: float) -> float:
    """The search's minutes once torch's timings and the export are done: at most
    `minutes`, leaving 2 for the run's proof before the call's deadline."""
    return min(minutes, max(0.5, (options.stop_at - time.monotonic()) / 60 - 2.0))


def run_autosched(folder: str, model_path: str, extra: list[str], minutes: float, options) -> tuple:
    """`autosched run` as a user types it (no cfg in the folder); its exit code and wall s.
    A run still going at the call's deadline is interrupted as a user would (Ctrl-C: its
    database flushed, to be resumed by --databases), then killed 30 s later."""
    command = [sys.executable, "-m", "autosched", "run", model_path, "--target", options.target]
    command += [*extra, "--time-budget", f"{minutes:.2f}"]
    began = time.perf_counter()
    with open(os.path.join(folder, "output.txt"), "w") as handle:
        run = subprocess.Popen(command, cwd=folder, stdout=handle, stderr=subprocess.STDOUT)
        try:
            run.wait(timeout=max(options.stop_at - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            print(f"{model_path}: interrupted at the call's deadline", flush=True)
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=30)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
    return run.returncode, time.perf_counter() - began


def find_one(folder: str, pattern: str) -> str | None:
    """The run's file matching `pattern` anywhere under its folder (the work-folder layout
    may name it per model)."""
    found = sorted(glob.glob(os.path.join(folder, "**", pattern), recursive=True))
    return found[0] if found else None


def autosched_ms(model: dict) -> tuple[float | None, bool | None]:
    """The fastest build the run proved with matching outputs and delivers (a spec the run
    did not write leaves IREE's default), and whether outputs match (None: the run proved
    nothing, stopped or failed before its proof)."""
    if not model:
        return None, None
    builds = []
    if model.get("spec_written", True):
        builds.append((model.get("tuned_ms"), model.get("outputs_match")))
    custom = model.get("custom") or {}
    builds.append((custom.get("ms"), custom.get("outputs_match")))
    matching = [ms for ms, ok in builds if ms and ok]
    if matching:
        return min(matching), True
    return model.get("default_ms"), bool(model.get("outputs_match"))


def autosched_cv(model: dict, best: float | None) -> float | None:
    """The CV of the rounds of the build `autosched_ms` chose (custom, tuned or default)."""
    custom = model.get("custom") or {}
    for ms, cv in (
        (custom.get("ms"), custom.get("cv")),
        (model.get("tuned_ms"), model.get("tuned_cv")),
    ):
        if best is not None and ms == best:
            return cv
    return model.get("default_cv") if best is not None else None


def delivered(summary: dict) -> dict:
    """Whether the run wrote its spec, for a row of one of the model's functions."""
    return {"spec_written": (summary.get("model") or {}).get("spec_written", True)}


def not_placed(summary: dict) -> list:
    """Winners that did not reach the model, with their reason: the summary's own list, or,
    from a summary without one, every problem whose winner is in the spec but not applied."""
    if "not_placed" in summary:
        return summary["not_placed"]
    return [
        {"problem": p["problem"], "reason": "in the spec, not applied in the model"}
        for p in summary.get("problems", [])
        if p.get("in_spec") and not p.get("applied_in_model")
    ]


def outputs_cell(one: dict) -> str:
    """The outputs column: a run stopped before its proof compared nothing, and says so; a
    decode row whose builds' greedy tokens part ways says that too."""
    if one["outputs_match"] is None:
        return f"not proved (exit {one.get('exit_code')})"
    cell = "match" if one["outputs_match"] else "DIFFER"
    if one.get("greedy_match") is False:  # a decode row: the builds' greedy tokens
        cell += "; greedy tokens differ"
    return cell


def row(entry: ZooModel, times: dict, summary: dict, wall: float, code: int) -> dict:
    model = summary.get("model") or {}
    best, match = autosched_ms(model)

    def wall_of(label):
        timing = times.get(label)
        return timing[2] if timing else None

    def events_of(label):
        timing = times.get(label)
        return timing[0] if timing else None

    def cv_of(label):
        timing = times.get(label)
        return timing[1] if timing else None

    return {
        "name": entry.name,
        "source": entry.source,
        "class": entry.kind,
        "dtype": str(entry.dtype).removeprefix("torch."),
        "shape": entry.shape,
        "torch_eager_ms": wall_of("eager"),
        "torch_compile_ms": wall_of("compile"),
        "torch_compile_max_autotune_ms": wall_of("max_autotune"),
        "torch_events_ms": {label: events_of(label) for label in times},
        "iree_default_ms": model.get("default_ms"),
        "autosched_ms": best,
        # Each median's spread: torch's over its calls, IREE's over the proof's rounds.
        "cv": {
            **{f"torch_{label}": cv_of(label) for label in times},
            "iree_default": model.get("default_cv"),
            "autosched": autosched_cv(model, best),
        },
        "outputs_match": match,
        "tuning_s": round(wall, 1),
        "phases_s": summary.get("phases_s", {}),  # where the tuning time went (run.log's)
        "build_flags": model.get("build_flags", ""),  # compile flags the proof chose
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU",
        "exit_code": code,
        "not_placed": not_placed(summary),
    }


def earlier_max_autotune(options, name: str) -> list | None:
    """max-autotune's timing of `name` from `--max-autotune-from`, where it was taken on a
    GPU of this one's name; None otherwise (then it is timed in this call)."""
    if not options.max_autotune_from:
        return None
    earlier = json.load(open(options.max_autotune_from)).get(name) or {}
    same_gpu = earlier.get("gpu") == torch.cuda.get_device_name()
    return earlier.get("times", {}).get("max_autotune") if same_gpu else None


def time_torch_only(names: list[str], out: str) -> None:
    """torch's three timings of each model, for a later call's `--max-autotune-from`:
    `torch_times.json` written after each model, so a call cut short keeps what it timed."""
    for name in names:
        module, args = build(BY_NAME[name], CUDA)
        times = torch_times(module, args, CUDA)
        print(f"{name}: torch {json.dumps(times)}", flush=True)
        keep_torch_times(out, name, times)
        del module, args
        torch.cuda.empty_cache()


def keep_torch_times(out: str, name: str, times: dict) -> None:
    """Add `name`'s torch timings to the call's `torch_times.json` (every call keeps them:
    resnet50's max-autotune took minutes of a call whose deadline then cut its run, and a
    later call's `--max-autotune-from` reuses them)."""
    path = os.path.join(out, "torch_times.json")
    timed = json.load(open(path)) if os.path.exists(path) else {}
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    timed[name] = {"times": times, "gpu": gpu}
    with open(path, "w") as handle:
        json.dump(timed, handle, indent=1)


def tune_one(entry: ZooModel, options, minutes: float) -> dict:
    folder = os.path.abspath(os.path.join(options.work, entry.name))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    module, args = build(entry, CUDA)
    earlier = earlier_max_autotune(options, entry.name)
    times = torch_times(module, args, CUDA, autotune=earlier is None)
    if earlier is not None:
        times["max_autotune"] = earlier
    print(f"{entry.name}: torch {json.dumps(times)}", flush=True)
    keep_torch_times(options.out, entry.name, times)
    model_path = os.path.join(folder, f"{entry.name}.mlir")
    export(module, args, model_path)
    del module, args
    torch.cuda.empty_cache()
    seed_database(options.databases, entry.name, folder)
    extra = list(options.autosched_args.split()) if options.autosched_args else []
    code, wall = run_autosched(folder, model_path, extra, search_minutes(options, minutes), options)
    summary_path = find_one(folder, "*summary.json")
    summary = json.load(open(summary_path)) if summary_path else {}
    print(f"{entry.name}: exit {code}, {wall:.0f} s", flush=True)
    one = row(entry, times, summary, wall, code)
    if earlier is not None:
        one["max_autotune_from"] = options.max_autotune_from
    return one


def reuse_export(exports: str | None, name: str, path: str) -> bool:
    """Whether `<name>.mlir` was exported beforehand (the same recipe, made with the
    device's torch and transformers on another machine) and copied to `path`: the 1B LM's
    export takes about a minute of a call. The weights are arguments, drawn by seed, so the
    file holds the graph alone."""
    source = exports and os.path.join(exports, f"{name}.mlir")
    if not source or not os.path.exists(source):
        return False
    shutil.copyfile(source, path)
    print(f"{name}: the export from {source}", flush=True)
    return True


def seed_database(databases: str | None, name: str, folder: str) -> None:
    """Put a committed database where the run reads its own (resumed, then grown)."""
    source = databases and os.path.join(databases, f"{name}.tuning.jsonl")
    if source and os.path.exists(source):
        target = os.path.join(folder, "generated", name, "tuning.jsonl")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)


def archive(work: str, out: str) -> None:
    """Each run's summary, log, console output and database in one file (8 files come back)."""
    with tarfile.open(os.path.join(out, "zoo_runs.tar.gz"), "w:gz") as tar:
        for pattern in ("*summary.json", "run.log", "output.txt", "*.jsonl", "*.spec.mlir"):
            for path in glob.glob(os.path.join(work, "**", pattern), recursive=True):
                tar.add(path, arcname=os.path.relpath(path, work))


def ratio(numerator, denominator) -> float | None:
    return numerator / denominator if numerator and denominator else None


def write_tables(out: str, rows: list[dict], command: str, machine: str) -> None:
    with open(os.path.join(out, "zoo.json"), "w") as handle:
        json.dump({"machine": machine, "command": command, "models": rows}, handle, indent=1)
    header = ["model", "source", "class", "dtype", "eager", "torch.compile", "max-autotune",
              "IREE default", "autosched", "vs torch.compile", "vs max-autotune",
              "vs best torch", "CV % (compile, max-autotune, autosched)", "outputs",
              "tuning s", "not placed", "GPU"]  # fmt: skip
    lines = [
        "# The model zoo: autosched against torch on one GPU",
        "",
        f"Machine: {machine}. Command: `{command}`.",
        "",
        "Times in ms: the median wall time of a synchronous call for every column (IREE's "
        "builds by iree-benchmark-module, torch's from the host's call to the GPU's end). "
        "Each row is one device call's, on the GPU its last column names. CVs: torch's over "
        "its 30 timed calls (CUDA events), autosched's over the proof's paired rounds.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
    ]
    speedups, over_best = [], []
    for r in rows:
        vs_compile = ratio(r["torch_compile_ms"], r["autosched_ms"])
        vs_max = ratio(r["torch_compile_max_autotune_ms"], r["autosched_ms"])
        vs_best = min((v for v in (vs_compile, vs_max) if v), default=None)
        if vs_compile and r["outputs_match"] and r.get("greedy_match") is not False:
            speedups.append(vs_compile)  # a build whose outputs differ is no speedup
            over_best.append(vs_best)
        cells = [r["name"], r["source"], r["class"], r["dtype"]]
        cells += [_ms(r[k]) for k in ("torch_eager_ms", "torch_compile_ms",
                                       "torch_compile_max_autotune_ms", "iree_default_ms",
                                       "autosched_ms")]  # fmt: skip
        if r.get("max_autotune_from") and r["torch_compile_max_autotune_ms"]:
            cells[6] += " (a)"
        cells += [_x(vs_compile), _x(vs_max), _x(vs_best), cv_cell(r), outputs_cell(r)]
        cells += [f"{r['tuning_s']:.0f}", "; ".join(str(p) for p in r["not_placed"]) or "-"]
        cells.append(r.get("gpu", "-").removeprefix("NVIDIA "))
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.get("max_autotune_from") for r in rows):
        note = "(a) max-autotune timed in an earlier call on a GPU of this name"
        lines += ["", f"{note} (`--max-autotune-from`): its autotuning does not fit beside a run."]
    if speedups:
        geomean = statistics.geometric_mean(speedups)
        count = len(speedups)
        left = len(rows) - count
        why = f"; {left} left out: outputs or greedy tokens differ, or no time" if left else ""
        best = statistics.geometric_mean(over_best)
        lines += [
            "",
            f"Geometric mean over torch.compile: {geomean:.2f}x; over the faster of "
            f"torch.compile and max-autotune (best torch): {best:.2f}x ({count} models{why}).",
        ]
    for r in rows:  # a decode step against its floor: every weight read once
        floor = r.get("weights_read_ms")
        if floor and r["autosched_ms"]:
            lines.append(
                f"{r['name']}: {r['autosched_ms']:.3f} ms a token against {floor:.3f} ms to read "
                f"the weights once at the GPU's peak bandwidth ({r['autosched_ms'] / floor:.2f}x)."
            )
    with open(os.path.join(out, "zoo.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


def cv_cell(r: dict) -> str:
    """The spreads of the three times compared (rows of calls before CVs were kept: -)."""
    cv = r.get("cv") or {}
    keys = ("torch_compile", "torch_max_autotune", "autosched")
    return " / ".join(f"{cv[k] * 100:.1f}" if cv.get(k) is not None else "-" for k in keys)


def _ms(value) -> str:
    return f"{value:.3f}" if value else "-"


def _x(value) -> str:
    return f"{value:.2f}x" if value else "-"


def one_row_of(name: str) -> ZooModel:
    """A zoo entry by name; `name@b8` keeps only batch 8 of a decode entry, `name@512` only
    length 512 of a prefill entry (a call with time for one of its rows)."""
    base, _, only = name.partition("@")
    entry = BY_NAME[base]
    if not only:
        return entry
    sizes, value = ("batches", only[1:]) if only.startswith("b") else ("lengths", only)
    return replace(entry, shape={**entry.shape, sizes: [int(value)]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where zoo.json, zoo.md and the archive go")
    parser.add_argument("--work", default="/tmp/zoo", help="the runs' folders")
    parser.add_argument("--models", default=",".join(BY_NAME), help="comma-separated names")
    parser.add_argument("--previous", help="a zoo.json whose other rows are kept")
    parser.add_argument("--databases", help="a folder of <model>.tuning.jsonl to resume")
    parser.add_argument("--exports", help="a folder of <model>.mlir exported beforehand")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="this call's seconds")
    parser.add_argument("--minutes", type=float, default=4.0, help="search minutes per model")
    parser.add_argument("--autosched-args", default="", help="more `autosched run` options")
    parser.add_argument(
        "--torch-only", action="store_true", help="time torch alone: torch_times.json"
    )
    parser.add_argument("--max-autotune-from", help="a torch_times.json of an earlier call")
    parser.add_argument(
        "--device", default=CUDA, choices=(CUDA, "cpu"), help="cpu: a smoke run, no GPU"
    )
    options = parser.parse_args()
    options.target = "cuda" if options.device == CUDA else "cpu"
    began = time.monotonic()
    options.stop_at = began + options.deadline_s - 45  # an interrupted run's rows and archive
    os.makedirs(options.out, exist_ok=True)
    previous = json.load(open(options.previous))["models"] if options.previous else []
    rows = {r["name"]: r for r in previous}
    if options.torch_only:
        time_torch_only(options.models.split(","), options.out)
        return
    for name in options.models.split(","):
        left_min = (options.deadline_s - (time.monotonic() - began)) / 60
        if left_min < 3:  # torch's three timings and a proof need about this much
            print(f"{name}: not started, {left_min:.1f} min left in this call", flush=True)
            continue
        minutes = min(options.minutes, max(0.5, left_min - 2.5))
        entry = one_row_of(name)
        if "lengths" in entry.shape:  # a causal LM's prefill: a row per length, one build
            new = tune_lengths(entry, options, minutes)
        elif "batches" in entry.shape:  # its decode step: a row per batch
            new = tune_decode(entry, options, minutes)
        else:
            new = [tune_one(entry, options, minutes)]
        for one in new:  # a run that proved nothing keeps the row it would replace
            if one["autosched_ms"] or one["name"] not in rows:
                rows[one["name"]] = one
        archive(options.work, options.out)
        where = torch.cuda.get_device_name() if options.device == CUDA else "CPU"
        machine = f"one {where}, torch {torch.__version__}"
        command = "python3 benchmarks/zoo.py " + " ".join(sys.argv[1:])
        order = {m.name: i for i, m in enumerate(ZOO)}
        ordered = sorted(
            rows.values(),
            key=lambda r: (
                order.get(r["name"].split("@")[0], 99),
                r["shape"].get("length", 0),
                r["shape"].get("batch", 0),
            ),
        )
        write_tables(options.out, ordered, command, machine)


if __name__ == "__main__":
    main()
