"""The implicit-GEMM convolution family (`kernels/igemm_conv/`) on resnet50's
convolutions, launched by Triton, against cuDNN through torch (NCHW and channels-last) on
the same GPU in the same call (issue 25).

Each shape is the op IREE holds at global optimization (NCHW image, padded; FCHW filter;
f16 in, f32 out). The kernel reads the image and filter channels-last: the transposes the
custom route adds are timed apart (`transposes`). Every point's answer is checked against
torch's f32 convolution before it is timed. Medians of `do_bench` (CUDA events).

    python3 benchmarks/conv_kernels.py --out conv_kernels.md
"""

from __future__ import annotations

import argparse
import sys

from autosched.kernels.igemm_conv import kernel as family
from autosched.ops.convolution import nchw_problem

# resnet50 (torchvision, batch 16, 224x224): (channels, image size, filters, window,
# stride) of each distinct convolution, strided 1x1s as IREE's layout leaves them
# (pointwise over a strided slice: the slice's size).
RESNET50 = (
    (3, 224, 64, 7, 2),
    (64, 56, 64, 1, 1),
    (64, 56, 64, 3, 1),
    (64, 56, 256, 1, 1),
    (256, 56, 64, 1, 1),
    (256, 56, 128, 1, 1),
    (128, 56, 128, 3, 2),
    (128, 28, 512, 1, 1),
    (256, 28, 512, 1, 1),
    (512, 28, 128, 1, 1),
    (128, 28, 128, 3, 1),
    (512, 28, 256, 1, 1),
    (256, 28, 256, 3, 2),
    (256, 14, 1024, 1, 1),
    (512, 14, 1024, 1, 1),
    (1024, 14, 256, 1, 1),
    (256, 14, 256, 3, 1),
    (1024, 14, 512, 1, 1),
    (512, 14, 512, 3, 2),
    (512, 7, 2048, 1, 1),
    (1024, 7, 2048, 1, 1),
    (2048, 7, 512, 1, 1),
    (512, 7, 512, 3, 1),
)
POINTS = (
    family.ConvParams(128, 128, 64, 8, 3),
    family.ConvParams(128, 64, 64, 4, 3),
    family.ConvParams(64, 128, 64, 4, 3),
    family.ConvParams(128, 256, 64, 8, 3),
    family.ConvParams(64, 64, 64, 4, 4),
    family.ConvParams(256, 128, 64, 8, 3),
)


def _launcher(problem, params, x, w, o):
    """Runs the point once (Triton compiles it) and returns what launches it again."""
    kernel = family._kernel()
    grid = family.grid(problem, params)
    constants = family._constants(problem, params)

    def launch():
        kernel[grid](x, w, o, **constants, num_warps=params.warps, num_stages=params.stages)

    launch()
    return launch


def one_shape(shape, batch: int):
    """(row of the table, best point) for one convolution."""
    import torch
    import torch.nn.functional as functional
    from triton.testing import do_bench

    channels, size, filters, window, stride = shape
    problem = nchw_problem(batch, channels, size, filters, window, stride)
    pad = window // 2
    image = torch.randn(batch, channels, size, size, device="cuda", dtype=torch.float16)
    weight = torch.randn(filters, channels, window, window, device="cuda", dtype=torch.float16)
    weight /= (channels * window * window) ** 0.5
    padded = functional.pad(image, (pad, pad, pad, pad))
    reference = functional.conv2d(padded.float(), weight.float(), stride=stride)
    x = padded.permute(0, 2, 3, 1).contiguous()
    w = weight.permute(2, 3, 1, 0).contiguous()
    transposes = do_bench(
        lambda: (padded.permute(0, 2, 3, 1).contiguous(), weight.permute(2, 3, 1, 0).contiguous()),
        return_mode="median",
    )
    best = None
    for params in POINTS:
        if params.block_n > 2 * filters:
            continue
        out = torch.empty_like(reference)
        launch = _launcher(problem, params, x, w, out)
        torch.cuda.synchronize()
        error = ((out - reference).abs().max() / reference.abs().max()).item()
        if error > 1e-2:
            print(f"{problem.name} {params.name}: WRONG (max error {error:.3g})", file=sys.stderr)
            continue
        ms = do_bench(launch, return_mode="median")
        if best is None or ms < best[0]:
            best = (ms, params, error)
    cudnn = do_bench(
        lambda: functional.conv2d(image, weight, stride=stride, padding=pad), return_mode="median"
    )
    last_image = image.to(memory_format=torch.channels_last)
    last_weight = weight.to(memory_format=torch.channels_last)
    cudnn_last = do_bench(
        lambda: functional.conv2d(last_image, last_weight, stride=stride, padding=pad),
        return_mode="median",
    )
    ms, params, error = best
    tflops = problem.flops / ms / 1e9
    row = (
        f"| {channels}->{filters}, {window}x{window}/{stride} at {size} | {ms * 1000:.1f} "
        f"({tflops:.0f} TFLOP/s) | {params.name} | {transposes * 1000:.1f} | "
        f"{cudnn * 1000:.1f} | {cudnn_last * 1000:.1f} | {error:.1e} |"
    )
    return row, ms, cudnn, cudnn_last, transposes


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="conv_kernels.md")
    parser.add_argument("--batch", type=int, default=16)
    options = parser.parse_args()
    lines = [
        f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, batch {options.batch}",
        "",
        "| convolution | kernel us | best point | transposes us | cuDNN NCHW us "
        "| cuDNN channels-last us | max error |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    totals = [0.0, 0.0, 0.0, 0.0]
    for shape in RESNET50:
        row, *times = one_shape(shape, options.batch)
        print(row, flush=True)
        lines.append(row)
        totals = [t + x for t, x in zip(totals, times, strict=True)]
    kernel, cudnn, cudnn_last, transposes = totals
    lines.append(
        f"| all distinct shapes, once each | {kernel * 1000:.1f} | | {transposes * 1000:.1f} "
        f"| {cudnn * 1000:.1f} | {cudnn_last * 1000:.1f} | |"
    )
    lines.append(f"\nkernels / cuDNN channels-last, summed: {kernel / cudnn_last:.2f}")
    with open(options.out, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
