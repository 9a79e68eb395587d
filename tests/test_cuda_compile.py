"""Every constraint-valid point of small CUDA spaces compiles, and IREE applies it as emitted.

Runs the real iree-compile (no GPU needed: it only generates PTX) for sm_80, sm_89 and sm_90,
the last through the full target attribute that CudaTarget puts in the module.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import matmul_function
from iree.compiler import ir
from iree.compiler.tools.binaries import find_tool

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.errors import UserError
from autosched.ops.matmul import MatmulProblem, analyze_file
from autosched.ops.matmul_kernel import (
    kernel_module_text,
    kernel_variant,
    rounds_from_f32,
    tuned_input_module,
)
from autosched.search.space import build_space
from autosched.targets.base import Point
from autosched.targets.cuda import CudaTarget

ARCHS = ("sm_80", "sm_89", "sm_90")
IREE_COMPILE = find_tool("iree-compile")
JOBS = 2

# Both pipelines, 2 or 4 points each.
F16_TILES = {
    "tile_m": [64, 128],
    "tile_n": [64],
    "tile_k": [32],
    "subgroup_m": [2, 4],
    "subgroup_n": [2],
    "pipeline_depth": [2],
}

# name -> (module text, user lists that keep its space to a handful of points)
PROBLEMS = {
    "f32": (
        "func.func @main(%a: tensor<256x256xf32>, %b: tensor<256x256xf32>) -> tensor<256x256xf32> {\n"
        "  %z = arith.constant 0.0 : f32\n"
        "  %e = tensor.empty() : tensor<256x256xf32>\n"
        "  %c = linalg.fill ins(%z : f32) outs(%e : tensor<256x256xf32>) -> tensor<256x256xf32>\n"
        "  %r = linalg.matmul ins(%a, %b : tensor<256x256xf32>, tensor<256x256xf32>)\n"
        "      outs(%c : tensor<256x256xf32>) -> tensor<256x256xf32>\n"
        "  return %r : tensor<256x256xf32>\n}\n",
        {"tile_m": [32, 64], "tile_n": [32, 64], "tile_k": [16], "thread_m": [4], "thread_n": [4]},
    ),
    "f16": (
        "func.func @main(%a: tensor<256x256xf16>, %b: tensor<256x256xf16>) -> tensor<256x256xf32> {\n"
        "  %z = arith.constant 0.0 : f32\n"
        "  %e = tensor.empty() : tensor<256x256xf32>\n"
        "  %c = linalg.fill ins(%z : f32) outs(%e : tensor<256x256xf32>) -> tensor<256x256xf32>\n"
        "  %r = linalg.matmul ins(%a, %b : tensor<256x256xf16>, tensor<256x256xf16>)\n"
        "      outs(%c : tensor<256x256xf32>) -> tensor<256x256xf32>\n"
        "  return %r : tensor<256x256xf32>\n}\n",
        F16_TILES,
    ),
    "f16_transpose_b_acc": (
        "func.func @main(%a: tensor<256x256xf16>, %b: tensor<128x256xf16>,\n"
        "                %c: tensor<256x128xf32>) -> tensor<256x128xf32> {\n"
        "  %r = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>,\n"
        "      affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>]\n"
        "      ins(%a, %b : tensor<256x256xf16>, tensor<128x256xf16>)\n"
        "      outs(%c : tensor<256x128xf32>) -> tensor<256x128xf32>\n"
        "  return %r : tensor<256x128xf32>\n}\n",
        {**F16_TILES, "tile_m": [64], "tile_n": [64, 128], "subgroup_m": [2]},
    ),
    "f16_batch": (
        "func.func @main(%a: tensor<2x128x64xf16>, %b: tensor<2x64x128xf16>)"
        " -> tensor<2x128x128xf32> {\n"
        "  %z = arith.constant 0.0 : f32\n"
        "  %e = tensor.empty() : tensor<2x128x128xf32>\n"
        "  %c = linalg.fill ins(%z : f32) outs(%e : tensor<2x128x128xf32>)"
        " -> tensor<2x128x128xf32>\n"
        "  %r = linalg.batch_matmul ins(%a, %b : tensor<2x128x64xf16>, tensor<2x64x128xf16>)\n"
        "      outs(%c : tensor<2x128x128xf32>) -> tensor<2x128x128xf32>\n"
        "  return %r : tensor<2x128x128xf32>\n}\n",
        {**F16_TILES, "tile_m": [64], "subgroup_m": [2], "subgroup_n": [4]},
    ),
}


def _problem(tmp_path, name: str) -> MatmulProblem:
    path = tmp_path / f"{name}.mlir"
    path.write_text(PROBLEMS[name][0])
    (problem,) = analyze_file(str(path)).problems
    return problem


def _target(arch: str) -> CudaTarget:
    return CudaTarget(RunConfig(target="cuda", arch=arch))


def _lowering_config_text(compilation_info: str) -> str:
    """The lowering_config part of a compilation_info, as IREE prints it."""
    printed = str(ir.Attribute.parse(compilation_info, ir.Context()))
    start = printed.index("lowering_config = ") + len("lowering_config = ")
    return printed[start : printed.index(", translation_info")]


def _compile(args: tuple[str, str, list[str]]) -> tuple[int, str, str]:
    """Compiles to a vmfb, keeping the executable-configurations phase to check the config."""
    source, work, flags = args
    phases = work + ".phases"
    result = subprocess.run(
        [
            IREE_COMPILE,
            source,
            "-o",
            work + ".vmfb",
            f"--dump-compilation-phases-to={phases}",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    configured = ""
    if result.returncode == 0:
        (name,) = [f for f in os.listdir(phases) if f.endswith(".executable-configurations.mlir")]
        with open(os.path.join(phases, name), encoding="utf-8") as handle:
            configured = handle.read()
    return result.returncode, result.stderr, configured


def _assert_all_compile_as_emitted(tmp_path, problem, target: CudaTarget, points) -> None:
    """Every point compiles, and IREE applies its lowering config and workgroup size."""
    jobs: list[tuple[str, str, list[str]]] = []
    for point in points:
        work = str(tmp_path / target.config_name(point))
        with open(work + ".mlir", "w", encoding="utf-8") as handle:
            handle.write(kernel_variant(problem, target, point))
        jobs.append((work + ".mlir", work, target.compile_flags()))
    with ThreadPoolExecutor(JOBS) as pool:
        results = list(pool.map(_compile, jobs))
    for point, (code, stderr, configured) in zip(points, results, strict=True):
        label = f"{target.arch} {problem.name} {target.config_name(point)}"
        assert code == 0, f"{label}: {stderr[-2000:]}"
        expected = _lowering_config_text(target.lowering_config(problem, point))
        assert expected in configured, f"{label}: IREE did not apply {expected}"
        size = ", ".join(str(v) for v in target.workgroup_size(point))
        assert f"workgroup_size = [{size}]" in configured, label


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_every_valid_point_compiles_as_emitted(tmp_path, arch: str, name: str) -> None:
    problem = _problem(tmp_path, name)
    target = _target(arch)
    space = build_space(problem, target, PROBLEMS[name][1])
    assert 1 <= len(space.points) <= 12, (len(space.points), space.rejected)
    _assert_all_compile_as_emitted(tmp_path, problem, target, space.points)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "shape",
    [
        (32, 32, 32, "f32", "f32"),
        (32, 32, 32, "f16", "f32"),
        (16, 64, 64, "f16", "f32"),
        (32, 32, 32, "bf16", "f32"),
        (32, 32, 32, "f16", "f16"),
        (32, 32, 64, "f8E4M3FN", "f32"),
    ],
    ids=lambda shape: "x".join(map(str, shape)),
)
@pytest.mark.slow
def test_every_point_of_a_default_space_compiles(tmp_path, arch: str, shape) -> None:
    """No [SearchSpace] at all: the space a user gets from the problem alone."""
    m, n, k, element, accumulator = shape
    if element.startswith("f8") and arch == "sm_80":
        pytest.skip("fp8 needs sm_89 or later (test_fp8_uses_its_intrinsic_from_sm_89_on)")
    path = tmp_path / "mm.mlir"
    path.write_text(matmul_function("mm", m, n, k, element, accumulator))
    (problem,) = analyze_file(str(path)).problems
    target = _target(arch)
    space = build_space(problem, target, {})
    assert set(space.generated) == set(target.knob_names)
    assert 10 <= len(space.points) <= 80, len(space.points)
    _assert_all_compile_as_emitted(tmp_path, problem, target, space.points)


@pytest.mark.parametrize("arch", ("sm_80", "sm_90"))
def test_unaligned_shapes_pad_on_tensor_cores_and_compile(tmp_path, arch: str) -> None:
    """A classifier's 1000 columns and 2 rows (resnet's FC at batch 2): no tile divides
    them, so the space was empty. TileAndFuse on tensor cores pads each tile, as IREE's
    own default does (padding = [16, 32, 128] at 16x1000x2048); the points compile and
    IREE applies them as emitted."""
    path = tmp_path / "fc.mlir"
    path.write_text(matmul_function("fc", 2, 1000, 256, "f16", "f32"))
    (problem,) = analyze_file(str(path)).problems
    target = _target(arch)
    assert build_space(problem, target, {}).points  # was: tile_n does not divide N
    lists = {"tile_n": [32, 128], "tile_k": [64], "subgroup_m": [1], "subgroup_n": [2]}
    space = build_space(problem, target, {**lists, "pipeline": ["TileAndFuse"]})
    assert 1 <= len(space.points) <= 4, (len(space.points), space.rejected)
    for point in space.points:
        assert "padding = [16, " in target.lowering_config(problem, point), point
    _assert_all_compile_as_emitted(tmp_path, problem, target, space.points)
    simt = build_space(problem, target, {**lists, "mma_kind": ["none"], "tile_n": [128]})
    assert not simt.points and "only TileAndFuse on tensor cores pads" in str(simt.rejected)


def test_a_batched_single_row_pads_its_rows_and_compiles(tmp_path) -> None:
    """A decode step's projection: batch_matmul of one batch and one row. Its tensor-core
    tiles pad the row to 16; the padding's batch entry is that loop's tile (1): a 0 there
    made iree-compile divide by zero (SIGFPE) on every point of a Llama decode run."""
    shape = {"op": "linalg.batch_matmul", "m": 1, "n": 256, "k": 128, "batch": 1}
    types = {"lhs_type": "bf16", "rhs_type": "bf16", "acc_type": "f32"}
    flags = {"transpose_a": False, "transpose_b": False, "zero_init": True}
    problem = MatmulProblem.from_shape({**shape, **types, **flags})
    target = _target("sm_90")
    space = build_space(problem, target, {"pipeline": ["TileAndFuse"]})
    points = space.points[:1]
    assert points, space.rejected
    for point in points:
        assert "padding = [1, 16, " in target.lowering_config(problem, point), point
    _assert_all_compile_as_emitted(tmp_path, problem, target, points)


def test_a_dimension_no_power_of_two_tiles_is_one_tile_and_compiles(tmp_path) -> None:
    """mobilenet_v3's squeeze-excite FC of 24 columns (16x24x72): no power of two from 32
    tiles 24 and 8 divides it (no padding asked), so its IREE space was empty and the
    problem ran no trial on the H200. A tile of the whole dimension is one."""
    path = tmp_path / "se.mlir"
    path.write_text(matmul_function("se", 16, 24, 72, "f16", "f32"))
    (problem,) = analyze_file(str(path)).problems
    target = _target("sm_90")
    space = build_space(problem, target, {"pipeline": ["TileAndFuse", "VectorDistribute"]})
    assert space.points and {p["tile_n"] for p in space.points} == {24}
    _assert_all_compile_as_emitted(tmp_path, problem, target, space.points[:2])


def test_sm_90_target_attribute_compiles(tmp_path) -> None:
    """sm_90 is unknown to --iree-cuda-target in 3.13; the module carries the whole target."""
    target = _target("sm_90")
    assert not any(f.startswith("--iree-cuda-target") for f in target.compile_flags())
    attributes = target.module_attributes()
    assert 'arch = "sm_90"' in attributes["hal.device.targets"]
    source = tmp_path / "sm90.mlir"
    source.write_text(kernel_module_text(_problem(tmp_path, "f16"), attributes))
    result = subprocess.run(
        [IREE_COMPILE, str(source), "-o", str(tmp_path / "sm90.vmfb"), *target.compile_flags()],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_tuned_module_for_sm_90_carries_the_target_and_compiles(tmp_path) -> None:
    """The user's module with the winners attached compiles with the printed flags alone."""
    target = _target("sm_90")
    problem = _problem(tmp_path, "f16")
    point = build_space(problem, target, PROBLEMS["f16"][1]).points[0]
    source = tmp_path / "f16.mlir"  # written by _problem: the user's module
    tuned = tmp_path / "tuned.mlir"
    tuned.write_text(tuned_input_module(str(source), [(problem, target, point)]))
    assert 'arch = "sm_90"' in tuned.read_text()
    code, stderr, configured = _compile(
        (str(tuned), str(tmp_path / "tuned"), target.compile_flags())
    )
    assert code == 0, stderr[-2000:]
    assert _lowering_config_text(target.lowering_config(problem, point)) in configured


def test_a_narrowed_kernel_problem_is_built_in_f32_and_rounded(tmp_path) -> None:
    """The custom route times a matmul followed by a truncf as one op with a bf16 result.
    IREE 3.13 cannot distribute that bare op on CUDA, so the kernel module computes the
    product in f32 and rounds it, as the model does; it compiles for sm_90. A problem of
    the user's module (it has sites) keeps its own accumulator."""
    target = _target("sm_90")
    shape = {"op": "linalg.batch_matmul", "m": 256, "n": 512, "k": 256, "batch": 1}
    types = {"lhs_type": "bf16", "rhs_type": "bf16", "acc_type": "bf16"}
    flags = {"transpose_a": False, "transpose_b": False, "zero_init": True}
    narrowed = MatmulProblem.from_shape({**shape, **types, **flags})
    assert rounds_from_f32(narrowed)
    text = kernel_variant(narrowed, target, None)
    with ir.Context():
        module = ir.Module.parse(text)
        ops = [op.name for op in module.body.operations[0].entry_block.operations]
    assert ops[-4:] == ["linalg.batch_matmul", "tensor.empty", "linalg.generic", "func.return"]
    assert "arith.truncf" in text and "tensor<1x256x512xf32>" in text
    assert "-> tensor<1x256x512xbf16>" in text.split("func.func @main")[1].splitlines()[0]
    source = tmp_path / "narrowed.mlir"
    source.write_text(text)
    result = subprocess.run(
        [IREE_COMPILE, str(source), "-o", str(tmp_path / "narrowed.vmfb"),
         *target.compile_flags()],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    own = dataclasses.replace(narrowed, sites=[object()])
    assert not rounds_from_f32(own) and "arith.truncf" not in kernel_variant(own, target, None)


def test_other_archs_use_the_flag() -> None:
    target = _target("sm_89")
    assert target.module_attributes() == {}
    assert "--iree-cuda-target=sm_89" in target.compile_flags()
    assert target.shared_memory_bytes == 101376 and target.max_threads == 1024


def test_ptxas_setting(tmp_path) -> None:
    """none embeds PTX; a path assembles with it; a bad path is one clear error. (Host
    discovery finds ptxas and hands it to the target, which runs no process itself.)"""
    from autosched.targets import make_target

    def cuda(ptxas: str):
        return make_target(RunConfig(target="cuda", arch="sm_80", ptxas=ptxas))

    assert not any("ptxas" in f for f in cuda("none").compile_flags())
    tool = tmp_path / "ptxas"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    flags = cuda(str(tool)).compile_flags()
    assert "--iree-cuda-use-ptxas" in flags and f"--iree-cuda-use-ptxas-from={tool}" in flags
    with pytest.raises(UserError, match="ptxas = /no/such/ptxas: not an executable file"):
        cuda("/no/such/ptxas")


def _rejections(tmp_path, name: str, lists: dict) -> tuple[list[Point], dict[str, int]]:
    space = build_space(_problem(tmp_path, name), _target("sm_89"), lists)
    return space.points, dict(space.rejected)


def test_too_many_threads_is_rejected(tmp_path) -> None:
    # 64x64 tile, one element per thread: 4096 threads.
    points, rejected = _rejections(
        tmp_path, "f32", {"tile_m": [64], "tile_n": [64], "thread_m": [1], "thread_n": [1]}
    )
    assert points == []
    assert rejected.get("over 1024 threads per workgroup")


def test_wrong_block_dim_is_rejected(tmp_path) -> None:
    lists = {**PROBLEMS["f16"][1], "tile_m": [64], "subgroup_m": [2], "pipeline": ["TileAndFuse"]}
    # 64x64 tile of 2x2 mma tiles per warp: 2*4 warps = 256 threads.
    points, _ = _rejections(tmp_path, "f16", {**lists, "block_dim_x": [256]})
    assert [p["block_dim_x"] for p in points] == [256]
    points, rejected = _rejections(tmp_path, "f16", {**lists, "block_dim_x": [128]})
    assert points == []
    assert rejected.get("block_dim_x differs from the derived workgroup size")


def test_knobs_of_the_other_kind_are_rejected(tmp_path) -> None:
    points, rejected = _rejections(tmp_path, "f16", {**PROBLEMS["f16"][1], "thread_m": [4]})
    assert points == []
    assert rejected.get("thread_m is only for SIMT points (0 otherwise)")


def test_shared_memory_over_the_limit_is_rejected(tmp_path) -> None:
    # f32 256x256 tiles with 64-deep k: 2 * 256 * 64 * 4 bytes = 128 KiB > sm_89's 99 KiB.
    points, rejected = _rejections(
        tmp_path,
        "f32",
        {"tile_m": [256], "tile_n": [256], "tile_k": [64], "thread_m": [8], "thread_n": [8]},
    )
    assert points == []
    assert rejected.get("shared memory over the sm_89 limit")


def test_fp8_uses_its_intrinsic_from_sm_89_on(tmp_path) -> None:
    """fp8 inputs take the 16x8x32 intrinsics where the arch has them, SIMT before."""
    path = tmp_path / "mm.mlir"
    path.write_text(matmul_function("mm", 64, 64, 64, "f8E5M2", "f32"))
    (problem,) = analyze_file(str(path)).problems
    assert _target("sm_90").default_mma_kind(problem) == "NV_MMA_SYNC_F32_16x8x32_F8E5M2"
    assert _target("sm_89").default_mma_kind(problem) == "NV_MMA_SYNC_F32_16x8x32_F8E5M2"
    assert _target("sm_80").default_mma_kind(problem) == "none"
    assert "needs sm_89 or later" in _target("sm_80").supports(problem)
    assert _target("sm_90").supports(problem) is None
    space = build_space(problem, _target("sm_90"), {})
    mma = [p for p in space.points if p["mma_kind"] != "none"]
    assert mma and all(p["tile_k"] % 32 == 0 for p in mma)  # one mma step is 32 deep


F16_MODEL = """
func.func @main(%a: tensor<256x512xf16>, %b: tensor<512x256xf16>, %bias: tensor<256x256xf32>) -> tensor<256x256xf16> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<256x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<256x256xf32>) -> tensor<256x256xf32>
  %m = linalg.matmul ins(%a, %b : tensor<256x512xf16>, tensor<512x256xf16>) outs(%f : tensor<256x256xf32>) -> tensor<256x256xf32>
  %s = arith.addf %m, %bias : tensor<256x256xf32>
  %h = arith.truncf %s : tensor<256x256xf32> to tensor<256x256xf16>
  return %h : tensor<256x256xf16>
}
"""


def test_dispatch_modules_of_a_model_keep_the_sm_90_target(tmp_path) -> None:
    """A model's dispatch, benchmark and check modules are built for the model's own target:
    a tensor-core candidate compiles for sm_90 and carries its mma config (built for a
    default GPU it failed: 'Cannot select: intrinsic mma.m16n8k16')."""
    from autosched.compile import CompileJob, compile_one
    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.dispatch_benchmarks import dispatch_check_modules, dump_dispatch_benchmarks
    from autosched.model.lowering import analyze_model, lower_to_dispatches
    from autosched.outputs.spec import tuning_spec

    (tmp_path / "model.mlir").write_text(F16_MODEL)
    target = _target("sm_90")
    model = model_for_target(str(tmp_path / "model.mlir"), target, str(tmp_path / "work"))
    flags = target.compile_flags()
    benchmarks = dump_dispatch_benchmarks(model, flags, str(tmp_path / "d"))
    checks = dispatch_check_modules(
        lower_to_dispatches(model, flags), set(benchmarks), str(tmp_path / "d"), model
    )
    (problem,) = analyze_model(model, flags).matmul_problems()
    point = next(p for p in build_space(problem, target, {}).points if p["mma_kind"] != "none")
    spec = tmp_path / "spec.mlir"
    spec.write_text(tuning_spec([(problem, target, point)]))
    assert len(benchmarks) == 1 and len(checks) == 1
    sources = [b.source for b in benchmarks.values()] + [c[0] for c in checks.values()]
    for source in sources:
        built = compile_one(
            CompileJob(source, source + ".vmfb", [*flags, *target.spec_flags(str(spec))]), 300
        )
        assert built.status == "ok", built.message


def _kernel_image(vmfb: str) -> bytes:
    """The module's one executable image (a cubin is an ELF file; PTX is text)."""
    data = open(vmfb, "rb").read()
    return b"ELF" if b"\x7fELF" in data else b"PTX" if b".version" in data else b"?"


def test_kernels_are_assembled_by_the_named_ptxas(tmp_path) -> None:
    """iree-compile 3.13 embeds PTX even with --iree-cuda-use-ptxas; the compile step
    assembles the dumped PTX itself and rebuilds with the cubin. A ptxas that fails leaves
    the PTX build, and nothing of the step is left on disk."""
    from autosched.compile import CompileJob, compile_one
    from autosched.targets.host import find_ptxas

    ptxas = find_ptxas(RunConfig(target="cuda"))
    if not ptxas:
        pytest.skip("no ptxas on this machine")
    source = tmp_path / "mm.mlir"
    source.write_text(matmul_function("mm", 256, 256, 128, "f16"))
    problem = analyze_file(str(source)).problems[0]
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(ptxas=ptxas))
    point = next(p for p in build_space(problem, target, {}).points if p["mma_kind"] != "none")
    variant = tmp_path / "variant.mlir"
    variant.write_text(kernel_variant(problem, target, point))
    plain = [f for f in target.compile_flags() if "ptxas" not in f]
    failing = tmp_path / "failing_ptxas"
    failing.write_text("#!/bin/sh\nexit 1\n")
    failing.chmod(0o755)
    cases = {
        "assembled": (target.compile_flags(), b"ELF"),
        "plain": (plain, b"PTX"),
        "failed": (
            [*plain, "--iree-cuda-use-ptxas", f"--iree-cuda-use-ptxas-from={failing}"],
            b"PTX",
        ),
    }
    for name, (flags, image) in cases.items():
        output = tmp_path / f"{name}.vmfb"
        result = compile_one(CompileJob(str(variant), str(output), flags), 300)
        assert result.status == "ok", result.message
        assert _kernel_image(str(output)) == image, name
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["mm.mlir", "variant.mlir", "failing_ptxas", *(f"{n}.vmfb" for n in cases)]
    )


def test_a_spec_iree_compile_cannot_load_is_a_compile_error(tmp_path) -> None:
    """For CUDA, iree-compile 3.13 prints `Failed to load transform library module` for a
    spec it cannot load and still exits 0, with IREE's own configurations: the build is
    recorded as a compile error naming the spec's own error, not as the spec's."""
    target = _target("sm_80")
    source = tmp_path / "mm.mlir"
    source.write_text(matmul_function("mm", 32, 32, 32))
    spec = tmp_path / "spec.mlir"
    spec.write_text(
        "module attributes {transform.with_named_sequence} {\n"
        "  transform.named_sequence @__kernel_config(%v: !transform.any_op"
        " {transform.consumed}) -> !transform.any_op"
        " attributes {iree_codegen.tuning_spec_entrypoint} {\n"
        "    %r = transform.foreach_match in %v @missing -> @missing"
        " : (!transform.any_op) -> !transform.any_op\n"
        "    transform.yield %r : !transform.any_op\n  }\n}\n"
    )
    flags = [*target.compile_flags(), f"{target.tuning_spec_flag}={spec}"]
    built = compile_one(CompileJob(str(source), str(tmp_path / "mm.vmfb"), flags), 300)
    assert built.status == "compile_error", built
    assert built.message.startswith("spec not loaded:") and "@missing" in built.message
    plain = compile_one(CompileJob(str(source), str(tmp_path / "p.vmfb"), flags[:-1]), 300)
    assert plain.status == "ok", plain.message
