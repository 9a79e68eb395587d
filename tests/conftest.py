"""Shared helpers: small MLIR modules written to a temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def matmul_function(
    name: str, m: int, n: int, k: int, element: str = "f32", acc: str = "f32"
) -> str:
    """A zero-filled linalg.matmul of the given shape, as a func."""
    return f"""
func.func @{name}(%a: tensor<{m}x{k}x{element}>, %b: tensor<{k}x{n}x{element}>) -> tensor<{m}x{n}x{acc}> {{
  %zero = arith.constant 0.0 : {acc}
  %empty = tensor.empty() : tensor<{m}x{n}x{acc}>
  %fill = linalg.fill ins(%zero : {acc}) outs(%empty : tensor<{m}x{n}x{acc}>) -> tensor<{m}x{n}x{acc}>
  %r = linalg.matmul ins(%a, %b : tensor<{m}x{k}x{element}>, tensor<{k}x{n}x{element}>)
                     outs(%fill : tensor<{m}x{n}x{acc}>) -> tensor<{m}x{n}x{acc}>
  return %r : tensor<{m}x{n}x{acc}>
}}
"""


def run_folder(project) -> Path:
    """The work folder of the one module or model run in `project`: the only folder under
    its generated/ (generated/ itself before the run made it)."""
    root = Path(project) / "generated"
    found = [path for path in root.iterdir() if path.is_dir()] if root.is_dir() else []
    return found[0] if len(found) == 1 else root


# CUDA knob lists that leave exactly one TileAndFuse tensor-core point for a 256^3 f16 matmul.
ONE_F16_TILE_AND_FUSE_POINT = {
    "pipeline": ["TileAndFuse"],
    "tile_m": [64],
    "tile_n": [64],
    "tile_k": [32],
    "subgroup_m": [2],
    "subgroup_n": [2],
}

# A model run's cfg for tests: a few trials, short timings.
MODEL_CFG = """
[Env]
jobs = 2
[SearchStrategy]
tuner = random
n_trial = 4
batch_size = 2
[Benchmark]
repetitions = 1
min_time = 0.005
retime_top = 1
"""

TRANSPOSED_B = """
func.func @transposed(%a: tensor<32x64xf32>, %b: tensor<16x64xf32>, %c: tensor<32x16xf32>) -> tensor<32x16xf32> {
  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>,
                                      affine_map<(m, n, k) -> (m, n)>]
      ins(%a, %b : tensor<32x64xf32>, tensor<16x64xf32>) outs(%c : tensor<32x16xf32>) -> tensor<32x16xf32>
  return %r : tensor<32x16xf32>
}
"""

BATCH = """
func.func @batched(%a: tensor<2x32x64xf32>, %b: tensor<2x64x16xf32>) -> tensor<2x32x16xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<2x32x16xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%empty : tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %r = linalg.batch_matmul ins(%a, %b : tensor<2x32x64xf32>, tensor<2x64x16xf32>)
                           outs(%fill : tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  return %r : tensor<2x32x16xf32>
}
"""

DYNAMIC = """
func.func @dynamic(%a: tensor<?x64xf32>, %b: tensor<64x16xf32>, %c: tensor<?x16xf32>) -> tensor<?x16xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<?x64xf32>, tensor<64x16xf32>) outs(%c : tensor<?x16xf32>) -> tensor<?x16xf32>
  return %r : tensor<?x16xf32>
}
"""

NO_MATMUL = """
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %r = arith.addf %a, %b : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


@pytest.fixture
def write_module(tmp_path):
    """Writes MLIR text to a file under tmp_path and returns its path."""

    def write(text: str, name: str = "module.mlir") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only where an NVIDIA GPU answers."""
    from autosched.targets.host import nvidia_gpus

    if nvidia_gpus():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (nvidia-smi finds none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def dispatch_check_takes_a_spec(entry, target, work_dir: str):
    """Whether a one-point spec reaches the root of the problem's dispatch check module,
    as a run decides before choosing it over the whole model (`CandidateBuilds.probe_check`)."""
    from autosched.config import RunConfig
    from autosched.outputs.records import MeasureContext
    from autosched.run.builds import CandidateBuilds
    from autosched.run.tuning import new_search
    from autosched.search.space import build_space

    config = RunConfig(target=target.config.target, arch=target.config.arch, work_dir=work_dir)
    space = build_space(entry.problem, target, {})
    context = MeasureContext("", "", "")
    search = new_search(config, target, context, entry.problem, space, entry.benchmark)
    verdict = CandidateBuilds(config, target, 1).probe_check(search)
    assert verdict is not None, "the probe's point did not build"
    return verdict.ok


def hopper_config(tmp_path):
    """A run's config for sm_90 with its files under tmp_path/generated and no ptxas (the
    CPU machines compile PTX for Hopper without assembling it)."""
    from autosched.config import RunConfig

    return RunConfig(
        target="cuda",
        arch="sm_90",
        ptxas="none",
        work_dir=str(tmp_path / "generated"),
        output_file=str(tmp_path / "generated/results.csv"),
        log_file=str(tmp_path / "generated/run.log"),
        database=str(tmp_path / "generated/tuning.jsonl"),
    )


def attach_dispatches(problems, model: str, flags, folder: str):
    """IREE's dispatches of `model` attached to `problems` as a run attaches them: from the
    model's one build (`model_build`), kept under `folder`."""
    from autosched.drivers.model_stages.prepare import attach_benchmarks
    from autosched.model.model_build import model_build

    build = model_build(model, flags, os.path.join(folder, "builds"))
    return attach_benchmarks(problems, build, flags, folder)
