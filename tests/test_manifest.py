"""Emitted variants parse, carry one compilation_info on the matmul, and IREE applies it."""

from __future__ import annotations

import subprocess

from conftest import BATCH, TRANSPOSED_B, matmul_function
from iree.compiler import ir
from iree.compiler.tools.binaries import find_tool

from autosched.config import RunConfig
from autosched.ops.matmul import analyze_file, walk_matmuls
from autosched.ops.matmul_kernel import kernel_variant, tuned_input_module
from autosched.search.space import build_space
from autosched.targets.cpu import CpuTarget

LISTS = {"tile_m": [16], "tile_n": [16], "vec_m": [4], "vec_n": [8], "vec_k": [2]}


def count_compilation_info(module: ir.Module) -> list[str]:
    found = []

    def visit(operation):
        for region in operation.regions:
            for block in region.blocks:
                for child in block.operations:
                    if "compilation_info" in child.operation.attributes:
                        found.append(child.operation.name)
                    visit(child.operation)

    visit(module.operation)
    return found


def test_each_variant_parses_with_one_compilation_info_on_the_matmul(write_module):
    analysis = analyze_file(write_module(matmul_function("f", 32, 32, 32) + TRANSPOSED_B + BATCH))
    target = CpuTarget(RunConfig())
    for problem in analysis.problems:
        point = build_space(problem, target, LISTS).points[0]
        text = kernel_variant(problem, target, point)
        module = ir.Module.parse(text, ir.Context())
        assert count_compilation_info(module) == [problem.op_name]


def applied_config(text: str, tmp_path, target: CpuTarget) -> str:
    source = tmp_path / "variant.mlir"
    source.write_text(text)
    finished = subprocess.run(
        [
            find_tool("iree-compile"),
            str(source),
            *target.compile_flags(),
            "--compile-to=executable-configurations",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return finished.stdout


def test_iree_applies_the_emitted_configuration(write_module, tmp_path):
    problem = analyze_file(write_module(matmul_function("f", 64, 64, 64))).problems[0]
    target = CpuTarget(RunConfig())
    point = {"tile_m": 32, "tile_n": 16, "vec_m": 4, "vec_n": 8, "vec_k": 2}
    output = applied_config(kernel_variant(problem, target, point), tmp_path, target)
    assert "distribution = [32, 16, 0]" in output
    assert "vector_common_parallel = [4, 8, 0]" in output
    assert "vector_reduction = [0, 0, 2]" in output
    # Without a point, IREE picks its own configuration: not ours.
    default = applied_config(kernel_variant(problem, target, None), tmp_path, target)
    assert "distribution = [32, 16, 0]" not in default


def test_tuned_input_module_annotates_every_site(write_module):
    path = write_module(
        matmul_function("x", 32, 32, 32) + TRANSPOSED_B + matmul_function("y", 32, 32, 32)
    )
    analysis = analyze_file(path)
    target = CpuTarget(RunConfig())
    shared = next(p for p in analysis.problems if len(p.sites) == 2)
    point = build_space(shared, target, LISTS).points[0]
    module = ir.Module.parse(tuned_input_module(path, [(shared, target, point)]), ir.Context())
    annotated = [op for _, op in walk_matmuls(module) if "compilation_info" in op.attributes]
    assert len(annotated) == 2  # both 32^3 matmuls, not the transposed one
