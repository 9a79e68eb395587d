"""Whole models tuned by `autosched run MODEL`: IREE's default, autosched and torch eager.

Builds each model in torch, exports it with iree-turbine (weights as function arguments, so the
export stays small), times torch eager on the same GPU, runs `autosched run` on the export with
one budget, and writes a markdown table from each run's `results.summary.json` (torch.compile
is timed beside eager; `llama3_bf16` is transformers' own LlamaDecoderLayer, Llama-3-8B shape):

    python3 benchmarks/model_campaign.py --out DIR [--models decoder_f16,encoder_f32]
        [--budget N] [--scale 1.0] [--target cuda]   # or --models llama3_bf16

On the H200 (after the device pack's bootstrap, with iree-turbine's wheel unpacked):

    python3 benchmarks/model_campaign.py --out $OUT --budget 160

`--scale 0.0625` shrinks every dimension for a quick check on the CPU (`--target cpu`;
`--scale 0.03125` for llama3_bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

# name -> (kind, dtype, shape parameters)
MODELS = {
    # Llama-style decoder layer: seq 2048, hidden 4096, 32 heads, MLP 11008, RMSNorm, SiLU gate.
    "decoder_f16": (
        "decoder",
        torch.float16,
        {"seq": 2048, "hidden": 4096, "heads": 32, "mlp": 11008},
    ),
    # BERT-base-style encoder layer: 8 x 512 tokens, hidden 768, 12 heads, FFN 3072, GELU.
    "encoder_f32": (
        "encoder",
        torch.float32,
        {"batch": 8, "seq": 512, "hidden": 768, "heads": 12, "mlp": 3072},
    ),
    "encoder_f16": (
        "encoder",
        torch.float16,
        {"batch": 8, "seq": 512, "hidden": 768, "heads": 12, "mlp": 3072},
    ),
    # transformers' own LlamaDecoderLayer in the Llama-3-8B shape (GQA 32/8 heads, SDPA, RoPE).
    "llama3_bf16": (
        "llama3",
        torch.bfloat16,
        {
            "batch": 1,
            "seq": 2048,
            "hidden": 4096,
            "heads": 32,
            "kv_heads": 8,
            "mlp": 14336,
            "rope_theta": 500000.0,
        },
    ),
    # transformers' own BertLayer in the BERT-base shape (12 heads, SDPA, no mask), f16.
    "bert_f16": (
        "bert",
        torch.float16,
        {"batch": 8, "seq": 512, "hidden": 768, "heads": 12, "mlp": 3072},
    ),
    # torchvision's own CNNs (issue 25), eval mode, parameters as arguments (the batch norms'
    # running statistics stay constants of the export).
    "resnet50_f16": ("torchvision", torch.float16, {"batch": 16, "image": 224, "net": "resnet50"}),
    "mobilenet_f16": (
        "torchvision",
        torch.float16,
        {"batch": 16, "image": 224, "net": "mobilenet_v3_large"},
    ),
}

CFG = """
[Env]
target = {target}
devices = {devices}
parallel_problems = {parallel}
compile_timeout = 300
# A candidate that hangs on the GPU (a few implicit-GEMM points of resnet50 did) is recorded
# as a timeout after this; resnet50's slowest whole-model check runs in about 0.6 s.
run_timeout = 20
[SearchStrategy]
tuner = xgboost
batch_size = {batch}
n_trial = {n_trial}
layout = {layout}
[Benchmark]
repetitions = 3
min_time = {min_time}
retime_top = 3
timer = {timer}
runtime_flags = {runtime_flags}
dispatch_table = {dispatch_table}
{custom}"""
CUSTOM_CFG = "[SearchSpace.cuda]\npipeline = [TileAndFuse, VectorDistribute, Custom]\n"
# Custom kernels are searched by default where they run: without --custom, IREE's alone.
IREE_ONLY_CFG = (
    "[SearchSpace.cuda]\npipeline = [TileAndFuse, VectorDistribute]\nconv_kernel = [iree]\n"
)


def rms_norm(x, weight):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight


class Decoder(torch.nn.Module):
    """One Llama layer with explicit attention matmuls (q·kᵀ, softmax, a·v), so that all nine
    contractions are matmuls IREE can be tuned on."""

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, x, wq, wk, wv, wo, w_gate, w_up, w_down, n1, n2):
        seq, hidden = x.shape
        h = rms_norm(x, n1)
        q, k, v = h @ wq, h @ wk, h @ wv
        d = hidden // self.heads
        q = q.view(seq, self.heads, d).transpose(0, 1)
        k = k.view(seq, self.heads, d).transpose(0, 1)
        v = v.view(seq, self.heads, d).transpose(0, 1)
        scores = (q @ k.transpose(1, 2)) * (d**-0.5)
        attention = torch.softmax(scores.float(), dim=-1).to(x.dtype) @ v
        x = x + attention.transpose(0, 1).reshape(seq, hidden) @ wo
        h = rms_norm(x, n2)
        return x + (F.silu(h @ w_gate) * (h @ w_up)) @ w_down


class Encoder(torch.nn.Module):
    """One BERT layer: self-attention with explicit matmuls, LayerNorm, GELU feed-forward."""

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, x, wq, wk, wv, wo, w1, w2, g1, b1, g2, b2):
        batch, seq, hidden = x.shape
        d = hidden // self.heads

        def split(t):
            return t.view(batch, seq, self.heads, d).transpose(1, 2).reshape(-1, seq, d)

        q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
        scores = (q @ k.transpose(1, 2)) * (d**-0.5)
        attention = torch.softmax(scores.float(), dim=-1).to(x.dtype) @ v
        attention = (
            attention.view(batch, self.heads, seq, d).transpose(1, 2).reshape(batch, seq, hidden)
        )
        x = F.layer_norm(x + attention @ wo, (hidden,), g1, b1)
        return F.layer_norm(x + F.gelu(x @ w1) @ w2, (hidden,), g2, b2)


class Llama3Layer(torch.nn.Module):
    """transformers' LlamaDecoderLayer with its weights as arguments: forward(hidden_states, cos,
    sin, *weights) runs the layer through torch.func.functional_call, so the export takes the
    weights as function arguments. The rotary (cos, sin) come in as inputs, computed outside with
    LlamaRotaryEmbedding. The mask is attention_mask=None: transformers' sdpa path then calls
    scaled_dot_product_attention(is_causal=True, enable_gqa=True), which iree-turbine exports as
    one torch.aten.scaled_dot_product_attention with the causal flag (no [1,1,seq,seq] mask input
    to feed, and the same flash path in torch eager)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.names = [name for name, _ in layer.named_parameters()]

    def forward(self, hidden_states, cos, sin, *weights):
        out = torch.func.functional_call(
            self.layer,
            dict(zip(self.names, weights, strict=True)),
            (hidden_states,),
            {"attention_mask": None, "position_embeddings": (cos, sin)},
        )
        return out[0] if isinstance(out, tuple) else out  # a tuple in older transformers


def llama3_shape(shape: dict, scale: float) -> dict:
    """Scaled Llama-3 shape: heads scaled, kv heads dividing heads, head_dim = hidden / heads
    (even, for the rotary halves), so hidden is rounded down to heads * head_dim."""
    heads = max(1, int(shape["heads"] * scale))
    kv_heads = max(1, min(heads, int(shape["kv_heads"] * scale)))
    while heads % kv_heads:
        kv_heads -= 1
    head_dim = max(2, int(shape["hidden"] * scale) // heads // 2 * 2)
    return {
        "batch": shape["batch"],
        "seq": max(1, int(shape["seq"] * scale)),
        "hidden": heads * head_dim,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "mlp": max(1, int(shape["mlp"] * scale)),
        "rope_theta": shape["rope_theta"],
    }


def build_llama3(dtype, shape: dict, rand, device: str):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=shape["hidden"],
        intermediate_size=shape["mlp"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        rope_theta=shape["rope_theta"],
        max_position_embeddings=max(8192, shape["seq"]),
        rms_norm_eps=1e-5,
        attn_implementation="sdpa",
    )
    layer = LlamaDecoderLayer(config, layer_idx=0).to(dtype=dtype, device=device).eval()
    model = Llama3Layer(layer)
    x = rand(shape["batch"], shape["seq"], shape["hidden"], std=1.0)
    positions = torch.arange(shape["seq"], device=device)[None].expand(shape["batch"], -1)
    with torch.no_grad():
        cos, sin = LlamaRotaryEmbedding(config).to(device)(x, positions)
    # Random projections (std 0.02, Llama's initializer_range) and RMSNorm weights of one.
    weights = [
        rand(*p.shape) if p.dim() == 2 else torch.ones(p.shape, dtype=dtype, device=device)
        for _, p in layer.named_parameters()
    ]
    return model, [x, cos, sin, *weights]


class ModuleWithWeights(torch.nn.Module):
    """A module called with its parameters as arguments (small exports): transformers'
    BertLayer (no mask: every token attends), a torchvision model."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.names = [name for name, _ in layer.named_parameters()]

    def forward(self, hidden_states, *weights):
        params = dict(zip(self.names, weights, strict=True))
        out = torch.func.functional_call(self.layer, params, (hidden_states,))
        return out[0] if isinstance(out, tuple) else out


def build_bert(dtype, shape: dict, rand, device: str):
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    config = BertConfig(
        hidden_size=shape["hidden"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["mlp"],
        attn_implementation="sdpa",
    )
    layer = BertLayer(config).to(dtype=dtype, device=device).eval()
    weights = [
        rand(*p.shape) if p.dim() == 2 else torch.ones(p.shape, dtype=dtype, device=device)
        for _, p in layer.named_parameters()
    ]
    x = rand(shape["batch"], shape["seq"], shape["hidden"], std=1.0)
    return ModuleWithWeights(layer), [x, *weights]


def build_torchvision(dtype, shape: dict, rand, device: str):
    import torchvision

    net = getattr(torchvision.models, shape["net"])().to(dtype=dtype, device=device).eval()
    weights = [p.detach() for p in net.parameters()]
    image = rand(shape["batch"], 3, shape["image"], shape["image"], std=1.0)
    return ModuleWithWeights(net), [image, *weights]


def sdpa_case(name: str, shape: dict, device: str):
    """torch's SDPA alone on the model's attention shapes (q, k, v; causal and GQA for
    Llama), to compare the attention dispatch with; None for models without SDPA."""
    kind, dtype, _ = MODELS[name]
    if kind not in ("llama3", "bert"):
        return None
    heads = shape["heads"]
    head_dim = shape.get("head_dim") or shape["hidden"] // heads
    kv = shape.get("kv_heads", heads)
    batch, seq = shape["batch"], shape["seq"]
    q = torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(batch, kv, seq, head_dim, dtype=dtype, device=device) for _ in "kv")
    causal = kind == "llama3"

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv != heads)

    return attend, [q, k, v]


def build(name: str, scale: float, device: str):
    kind, dtype, shape = MODELS[name]
    generator = torch.Generator(device="cpu").manual_seed(0)

    def rand(*dims, std=0.02):
        return (torch.randn(*dims, generator=generator) * std).to(dtype).to(device)

    if kind == "llama3":
        s = llama3_shape(shape, scale)
        model, args = build_llama3(dtype, s, rand, device)
        return model, args, s
    if kind == "torchvision":
        s = dict(shape, image=max(32, int(shape["image"] * scale)))
        model, args = build_torchvision(dtype, s, rand, device)
        return model, args, s
    if kind == "bert":
        s = {k: v if k in ("batch", "heads") else max(1, int(v * scale)) for k, v in shape.items()}
        s["hidden"] = s["hidden"] // s["heads"] * s["heads"]
        model, args = build_bert(dtype, s, rand, device)
        return model, args, s
    s = {k: max(1, int(v * scale)) if k not in ("heads", "batch") else v for k, v in shape.items()}
    if scale < 1:
        s["heads"] = max(1, int(shape["heads"] * scale))
    hidden, mlp = s["hidden"], s["mlp"]
    if kind == "decoder":
        model = Decoder(s["heads"])
        args = [rand(s["seq"], hidden, std=1.0)]
        args += [rand(hidden, hidden) for _ in range(4)]
        args += [rand(hidden, mlp), rand(hidden, mlp), rand(mlp, hidden)]
        args += [torch.ones(hidden, dtype=dtype, device=device) for _ in range(2)]
    else:
        model = Encoder(s["heads"])
        args = [rand(s["batch"], s["seq"], hidden, std=1.0)]
        args += [rand(hidden, hidden) for _ in range(4)]
        args += [rand(hidden, mlp), rand(mlp, hidden)]
        one, zero = torch.ones(hidden, dtype=dtype), torch.zeros(hidden, dtype=dtype)
        args += [one.to(device), zero.to(device), one.to(device), zero.to(device)]
    return model, args, s


def eager_ms(model, args, device: str) -> tuple[float, float, float]:
    """Median and CV of torch eager over 30 calls after 5 warm-ups (CUDA events on a GPU),
    and the median wall time of a call (see `time_calls`)."""
    return time_calls(model, args, device, warmups=5)


def compile_ms(model, args, device: str) -> tuple[float, float, float] | None:
    """torch.compile(model) timed like eager_ms: compiled and warmed up on 5 calls, then 30 timed
    calls. None when torch.compile fails (on a CPU it needs a C++ toolchain and may not work)."""
    try:
        compiled = torch.compile(model)
        return time_calls(compiled, args, device, warmups=5)
    except Exception as error:  # any failure only blanks the column
        print(f"torch.compile failed: {type(error).__name__}: {error}"[:500], file=sys.stderr)
        return None
    finally:
        torch._dynamo.reset()  # the next model compiles afresh


def time_calls(model, args, device: str, warmups: int) -> tuple[float, float, float]:
    """Median and CV of 30 calls after `warmups` untimed ones (CUDA events on a GPU: the
    stream's time, as the GPU runs the call), and the median wall time of a synchronous call
    (from the host's call to the GPU's end, as iree-benchmark-module times IREE's)."""
    times, walls = [], []
    with torch.no_grad():
        for index in range(warmups + 30):
            began = time.perf_counter()
            if device == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                model(*args)
                end.record()
                torch.cuda.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                began = time.perf_counter()
                model(*args)
                elapsed = (time.perf_counter() - began) * 1e3
            if index >= warmups:
                times.append(elapsed)
                walls.append((time.perf_counter() - began) * 1e3)
    mean = statistics.fmean(times)
    return statistics.median(times), statistics.pstdev(times) / mean, statistics.median(walls)


def export(model, args, path: str) -> None:
    from iree.turbine import aot

    cpu_args = [a.cpu() for a in args]
    model.cpu()  # its buffers too (batch norms' statistics), where the arguments now are
    aot.export(model, *cpu_args).save_mlir(path)


def run_autosched(
    folder: str, model_path: str, budget: int, minutes: float | None
) -> tuple[int, float, str]:
    """The run's exit code, wall seconds and output; the output is written to output.txt
    as it comes, so a campaign cut short by a time limit still shows how far it got.
    `minutes` bounds the search (`--time-budget`), so that a device call's limit leaves
    time for the whole-model proof."""
    command = [sys.executable, "-m", "autosched", "run", model_path, "--budget", str(budget)]
    command += ["--time-budget", str(minutes)] if minutes else []
    began = time.perf_counter()
    path = os.path.join(folder, "output.txt")
    with open(path, "w") as handle:
        done = subprocess.run(command, cwd=folder, stdout=handle, stderr=subprocess.STDOUT)
    with open(path) as handle:
        return done.returncode, time.perf_counter() - began, handle.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="decoder_f16,encoder_f32,encoder_f16")
    parser.add_argument("--budget", type=int, default=160)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--target", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--timer", default="tool", choices=["tool", "worker"])
    parser.add_argument("--devices", default="", help="[Env] devices, e.g. all")
    parser.add_argument(
        "--custom", action="store_true", help="custom kernels too (sm_90 with Triton, issue 12)"
    )
    parser.add_argument("--n-trial", type=int, default=32, help="[SearchStrategy] n_trial")
    parser.add_argument("--time-budget", type=float, help="minutes of search per model")
    parser.add_argument(
        "--layout", default="auto", help="[SearchStrategy] layout, e.g. channels_last"
    )
    parser.add_argument(
        "--runtime-flags",
        default="auto",
        help="[Benchmark] runtime_flags (auto: the target's; on CUDA IREE's caching allocator)",
    )
    parser.add_argument(
        "--dispatch-table",
        default="all",
        choices=["all", "none"],
        help="[Benchmark] dispatch_table (none: no per-dispatch table, a shorter call)",
    )
    parser.add_argument(
        "--parallel-problems",
        type=int,
        default=0,
        help="[Env] parallel_problems (0: two per GPU); more where each trial's check "
        "compiles the whole model (mobilenet's 1x1 convolutions: about 56 s a candidate)",
    )
    options = parser.parse_args()
    device = "cuda" if options.target == "cuda" else "cpu"
    os.makedirs(options.out, exist_ok=True)
    rows = []
    for name in options.models.split(","):
        folder = os.path.abspath(os.path.join(options.out, name))
        os.makedirs(folder, exist_ok=True)
        model, args, shape = build(name, options.scale, device)
        eager = eager_ms(model, args, device)
        compiled = compile_ms(model, args, device)
        case = sdpa_case(name, shape, device)
        sdpa = time_calls(case[0], case[1], device, warmups=5) if case else None
        # each [median, cv, wall median]
        torch_times = {"eager": eager, "compile": compiled, "sdpa": sdpa}
        with open(os.path.join(folder, "torch_times.json"), "w") as handle:
            json.dump(torch_times, handle)  # kept even if the run is cut short
        print(f"{name}: torch {json.dumps(torch_times)}", flush=True)
        model_path = os.path.join(folder, f"{name}.mlir")
        export(model, args, model_path)
        with open(os.path.join(folder, "auto-scheduler.cfg"), "w") as handle:
            handle.write(
                CFG.format(
                    target=options.target,
                    batch=16 if options.target == "cuda" else 4,
                    min_time=0.03 if options.target == "cuda" else 0.01,
                    timer=options.timer,
                    devices=options.devices,
                    parallel=options.parallel_problems,
                    custom=CUSTOM_CFG if options.custom else IREE_ONLY_CFG,
                    n_trial=options.n_trial,
                    layout=options.layout,
                    runtime_flags=options.runtime_flags,
                    dispatch_table=options.dispatch_table,
                )
            )
        code, wall, _ = run_autosched(folder, model_path, options.budget, options.time_budget)
        # each model runs in its own work folder, generated/<model stem>/
        summary_path = os.path.join(folder, "generated", name, "results.summary.json")
        summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
        rows.append((name, shape, eager, compiled, code, wall, summary, sdpa))
        print(f"{name}: exit {code}, {wall:.0f} s", flush=True)
    write_table(os.path.join(options.out, "model_campaign.md"), rows, options)


HEADER = [
    "model",
    "IREE default ms (cv)",
    "autosched ms (cv)",
    "speedup",
    "torch eager ms (cv); wall",
    "torch.compile ms (cv); wall",
    "outputs",
    "trials / budget",
    "tuning wall s",
]
PROBLEM_HEADER = [
    "problem",
    "runs",
    "share before",
    "share after",
    "default ms",
    "best ms",
    "speedup",
    "trials",
    "in spec",
    "applied",
    "route",
    "custom kernel ms",
    "not applied",
    "default drift",
    "timed form",
]


def table_row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def contraction_line(problems: list[dict]) -> str:
    """The tuned contraction dispatches' time per call, default against best (each problem's
    dispatch time x its occurrences, re-timed figures)."""
    before = sum(p["default_ms"] * p["occurrences"] for p in problems)
    after = sum(p["best_ms"] * p["occurrences"] for p in problems)
    speedup = before / after if after else 0.0
    return (
        f"\ntuned dispatches (contractions, attention): {before:.4g} ms -> {after:.4g} ms"
        f" ({speedup:.2f}x)"
    )


def torch_text(timing) -> str:
    """A torch timing's cell: the CUDA events' median (CV), and the wall time of a
    synchronous call."""
    if not timing:
        return "-"
    return f"{timing[0]:.3f} ({timing[1]:.1%}); wall {timing[2]:.3f}"


def write_table(path: str, rows, options) -> None:
    command = (
        f"python3 benchmarks/model_campaign.py --out DIR --budget {options.budget} "
        f"--scale {options.scale} --target {options.target} --models {options.models} "
        f"--n-trial {options.n_trial} "
        f"--timer {options.timer}"
        + (f" --devices {options.devices}" if options.devices else "")
        + (" --custom" if options.custom else "")
        + (f" --time-budget {options.time_budget:g}" if options.time_budget else "")
        + (f' --runtime-flags="{options.runtime_flags}"' if options.runtime_flags != "auto" else "")
    )
    lines = [
        f"# Whole models: IREE default, autosched, torch eager ({options.target})",
        "",
        f"Command: `{command}`",
        "",
        "IREE's builds are timed by iree-benchmark-module: the wall time of a synchronous call."
        " torch's first number is the CUDA events around a call (the GPU stream's time), its"
        " wall the host's time of a synchronous call, as IREE's.",
        "",
        table_row(HEADER),
        table_row(["---"] * len(HEADER)),
    ]
    details = []
    for name, shape, eager, compiled, code, wall, summary, sdpa in rows:
        model = summary.get("model") or {}
        eager_text, compile_text = torch_text(eager), torch_text(compiled)
        if not model:
            failed = f"exit {code}: see {name}/output.txt"
            if code == 0:
                failed = "no candidate beat IREE's default by more than the noise: no spec"
            cells = [name, failed, "", "", eager_text, compile_text, "", "", f"{wall:.0f}"]
            lines.append(table_row(cells))
            continue
        tuned = model.get("tuned_ms")
        answer = "match" if model["outputs_match"] else "DIFFER"
        lines.append(
            table_row(
                [
                    name,
                    f"{model['default_ms']:.3f} ({model['default_cv']:.1%})",
                    f"{tuned:.3f} ({model['tuned_cv']:.1%})" if tuned else "-",
                    f"{model['speedup']:.2f}x" if model.get("speedup") else "-",
                    eager_text,
                    compile_text,
                    f"{answer} (max err {model['max_error'] or 0:.2g})",
                    f"{summary['trials']} / {summary['budget']}",
                    f"{wall:.0f}",
                ]
            )
        )
        custom = model.get("custom")
        if custom:  # the third build of the proof: custom kernels in place of contractions
            answer = "match" if custom["outputs_match"] else "DIFFER"
            ms = f"{custom['ms']:.3f} ({custom['cv']:.1%})" if custom.get("ms") else "-"
            lines.append(
                table_row(
                    [
                        f"{name} + {custom['replaced']} custom kernel(s)",
                        f"{model['default_ms']:.3f}",
                        ms,
                        f"{custom['speedup'] or 0:.2f}x",
                        eager_text,
                        compile_text,
                        f"{answer} (max err {custom['max_error'] or 0:.2g})",
                        "",
                        "",
                    ]
                )
            )
        details += [f"\n## {name} {shape}\n", table_row(PROBLEM_HEADER)]
        details.append(table_row(["---"] * len(PROBLEM_HEADER)))
        for p in summary["problems"]:
            cells = [p["problem"], p["occurrences"], f"{p['share']:.1%}", f"{p['share_after']:.1%}"]
            cells += [f"{p['default_ms']:.4g}", f"{p['best_ms']:.4g}", f"{p['speedup'] or 1:.2f}x"]
            cells += [p["trials"], p["in_spec"], p["applied_in_model"], p.get("route", "")]
            cells.append(f"{p['custom_ms']:.4g}" if p.get("custom_ms") else "-")
            drift = p.get("default_drift")
            cells.append(p.get("not_applied", ""))
            cells.append(f"{drift:.1%}" if drift is not None else "")
            cells.append(p.get("timed_form", "").replace("|", "\\|"))
            details.append(table_row(cells))
        details.append(contraction_line(summary["problems"]))
        if sdpa:
            details.append(
                f"\ntorch SDPA alone on the same attention shapes: {sdpa[0]:.4g} ms "
                f"(cv {sdpa[1]:.1%}); the attention rows above are IREE's dispatch"
            )
        if summary.get("skipped"):
            details.append(f"\nnot tuned: {summary['skipped']}")
    with open(path, "w") as handle:
        handle.write("\n".join(lines + details) + "\n")


if __name__ == "__main__":
    main()
