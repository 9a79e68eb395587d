"""Kernel families behind one contract (issue 46): adding one is a folder and a registry
line. A toy matmul family, registered from this test, is searched (its points join the CUDA
target's space and compile through the run's own jobs) and substituted into a small model
at the CPU compile level: no GPU and no Triton (its "binary" is a placeholder that IREE
embeds without reading). Also: the registry imports no family, and the kernel sources are
templates rendered strictly."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
from conftest import hopper_config

from autosched.kernels.base import KernelBinary, KernelFamily
from autosched.kernels.extern import dispatch_extern_function
from autosched.kernels.registry import FAMILIES, families_for, family_of
from autosched.kernels.templates import TemplateError, render, render_text
from autosched.ops.epilogue import (
    ACC,
    CHANNEL,
    FULL,
    INDEXED,
    ROTATED,
    Epilogue,
    EpilogueInput,
    PermutedStore,
)
from autosched.ops.matmul_kernel import tensor_type
from autosched.outputs.records import problem_from_shape
from autosched.search.space import build_space
from autosched.targets.base import Family
from autosched.targets.cuda import CudaTarget
from autosched.targets.host import Machine

TOY = "Toy"  # the toy family's value of the CUDA target's `pipeline` knob


@dataclass(frozen=True)
class ToyParams:
    block: int
    warps: int

    @property
    def name(self) -> str:
        return f"toy_b{self.block}_w{self.warps}"


class ToyKernels(KernelFamily):
    """A family that needs no Triton: its binary is placeholder bytes (never run here)."""

    name = "toy_matmul"
    kind = "matmul"
    label = "toy kernels"
    selector = ("pipeline", TOY)
    needs_triton = False
    params_type = ToyParams

    def unsupported(self, problem) -> str | None:
        return None if problem.lhs_type == "f16" else "toy kernels take f16"

    def space(self, problem, target, pinned: dict[str, list]) -> Family:
        return Family(
            "toy",
            [],
            fixed={"pipeline": [TOY], **pinned, "tile_k": [64], "pipeline_depth": [0]},
            candidates={"tile_m": [64, 128], "tile_n": [64], "warps": [4], "group_m": [0]},
        )

    def params(self, point) -> ToyParams:
        return ToyParams(point["tile_m"], point["warps"])

    def compile(self, problem, params, arch: str, path: str, epilogue=None) -> KernelBinary:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("// toy\n")
        cubin = path.removesuffix(".ptx") + ".cubin"
        with open(cubin, "wb") as handle:
            handle.write(b"toy kernel")
        blocks = -(-problem.m // params.block) * -(-problem.n // params.block)
        return KernelBinary(path, cubin, "toy_matmul", 3, 0, params.warps * 32, 0, (blocks, 1, 1))

    def extern_function(
        self, problem, params, binary, executable_target, name, kind="func.func", epilogue=None
    ) -> str:
        inputs = [
            tensor_type(problem.lhs_shape, problem.lhs_type),
            tensor_type(problem.rhs_shape, problem.rhs_type),
        ]
        out = tensor_type(problem.acc_shape, problem.acc_type)
        return dispatch_extern_function(
            name, kind, inputs, out, binary, executable_target, binary.workgroups
        )


@pytest.fixture
def toy_registered():
    """The toy family's one registry line, for this test only."""
    FAMILIES[ToyKernels.name] = (__name__, ToyKernels.__name__)
    yield
    del FAMILIES[ToyKernels.name]


def _problem(m=256, n=384, k=512):
    return problem_from_shape(
        {"op": "linalg.matmul", "m": m, "n": n, "k": k, "batch": 0, "lhs_type": "f16",
         "rhs_type": "f16", "acc_type": "f32", "transpose_a": False, "transpose_b": False,
         "zero_init": True}
    )  # fmt: skip


def _target(tmp_path) -> CudaTarget:
    """The CUDA target for sm_90 on a machine without Triton (the matmul Triton family is
    not searched there; the toy needs no Triton)."""
    return CudaTarget(hopper_config(tmp_path), Machine(triton=False))


def test_a_registered_family_is_searched_beside_iree_s_pipelines(tmp_path, toy_registered):
    target, problem = _target(tmp_path), _problem()
    assert [f.name for f in families_for("matmul")] == ["matmul_triton", "toy_matmul"]
    space = build_space(problem, target, {})
    toy = [p for p in space.points if p["pipeline"] == TOY]
    assert sorted(p["tile_m"] for p in toy) == [64, 128]
    assert any(p["pipeline"] == "TileAndFuse" for p in space.points)
    assert not any(p["pipeline"] == "Custom" for p in space.points)  # no Triton here
    assert isinstance(family_of(toy[0]), ToyKernels) and not target.in_spec(toy[0])
    assert target.config_name(toy[0]) == "toy_b64_w4" and target.workgroup_size(toy[0])[0] == 128
    assert target.features(problem, toy[0])["is_custom"] == 1.0
    # The run's own compile job: the family's compile step writes the extern module in a
    # process of its own (which imports the family by its class), iree-compile builds it.
    from autosched.compile import compile_all
    from autosched.run.tuning import Tuning

    tests = os.path.dirname(os.path.abspath(__file__))
    paths = [tests, os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"], before = os.pathsep.join(filter(None, paths)), paths[1]
    tuning = Tuning(target.config, target, resume=False)
    try:
        job = tuning.builds.kernel_job(problem, target.config_name(toy[0]), toy[0], 2)
        (result,) = compile_all([job], 300, 1)
    finally:
        tuning.close()
        os.environ["PYTHONPATH"] = before
    assert result.status == "ok", result.message
    text = open(job.source).read()
    assert 'hal.dispatch.extern "toy_matmul"' in text


def test_without_its_registry_line_the_family_is_not_searched(tmp_path):
    space = build_space(_problem(), _target(tmp_path), {})
    assert not any(p["pipeline"] == TOY for p in space.points)


def test_a_registered_family_replaces_a_models_matmul(tmp_path, toy_registered):
    """The toy's winner goes into the custom spec, and the model rewritten at global
    optimization runs its kernel as a `hal.dispatch.extern` in the matmul's place."""
    from autosched.rewrite.apply import rewrite_model
    from autosched.rewrite.spec import write_substitution

    target, problem = _target(tmp_path), _problem()
    point = {"pipeline": TOY, "tile_m": 64, "tile_n": 64, "warps": 4}
    spec = str(tmp_path / "results.custom.mlir")
    assert write_substitution(spec, [(problem, point)], target) == []
    device = target.module_attributes()["hal.device.targets"]
    t = "tensor<256x384xf32>"
    (tmp_path / "model.mlir").write_text(
        f"module attributes {{hal.device.targets = {device}}} {{\n"
        f"  func.func @main(%a: tensor<256x512xf16>, %b: tensor<512x384xf16>) -> {t} {{\n"
        "    %zero = arith.constant 0.0 : f32\n"
        f"    %e = tensor.empty() : {t}\n"
        f"    %f = linalg.fill ins(%zero : f32) outs(%e : {t}) -> {t}\n"
        "    %r = linalg.matmul ins(%a, %b : tensor<256x512xf16>, tensor<512x384xf16>)"
        f" outs(%f : {t}) -> {t}\n"
        f"    %s = math.sin %r : {t}\n"
        f"    return %s : {t}\n  }}\n}}\n"
    )
    out = str(tmp_path / "rewritten.mlir")
    flags = target.compile_flags()
    rewritten, replaced = rewrite_model(str(tmp_path / "model.mlir"), spec, flags, out, 300)
    assert replaced == 1
    assert 'hal.dispatch.extern "toy_matmul"' in open(rewritten).read()
    # A point of no family is refused, with the reason.
    iree = {"pipeline": "TileAndFuse"}
    assert write_substitution(spec, [(problem, iree)], target) == [
        f"{problem.name}: not a kernel family's point"
    ]


def test_the_registry_imports_no_family():
    code = (
        "import sys, autosched.kernels.registry as r; "
        "print(sorted(m for m in sys.modules if m.startswith('autosched.kernels.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['autosched.kernels.registry']"


def test_templates_are_rendered_strictly():
    assert render_text("a $x b ${y}", {"x": 1, "y": 2}) == "a 1 b 2"
    with pytest.raises(TemplateError, match=r"no value for \['y'\]"):
        render_text("a $x b ${y}", {"x": 1})
    with pytest.raises(TemplateError, match=r"no placeholder for \['z'\]"):
        render_text("a $x b ${y}", {"x": 1, "y": 2, "z": 3})
    with pytest.raises(TemplateError):  # the matmul kernel's parameters need the epilogue's
        render("autosched.kernels.matmul_triton", "parameters.py.tmpl")


def _epilogues() -> dict[str, Epilogue | None]:
    """Every epilogue form the kernels write: none, a channel vector, a full tensor, a
    permuted store, a RoPE rotation (indexed cos and sin), and that permuted."""
    acc = EpilogueInput(ACC, "tensor<256x512xf16>", "f16")
    bias = EpilogueInput(CHANNEL, "tensor<512xf16>", "f16")
    full = EpilogueInput(FULL, "tensor<256x512xf16>", "f16")
    out = ("tensor<256x512xf16>", "f16", "f16")
    store = PermutedStore((2, 128, 8, 64), (64, 1024, 8192, 1), 2)
    rot = EpilogueInput(ROTATED, "tensor<256x512xbf16>", "bf16", period=64)
    cos = EpilogueInput(
        INDEXED, "tensor<256x64xbf16>", "bf16", index=PermutedStore((256, 8, 64), (64, 0, 1), 1)
    )
    rope = ("v0 = a0 * a1", "v1 = a2 * a3", "out = v0 + v1")
    bf16 = ("tensor<256x512xbf16>", "bf16", "bf16")
    return {
        "none": None,
        "bias_relu": Epilogue((acc, bias), *out, ("v0 = a0 + a1", "out = tl.maximum(v0, 0.0)")),
        "full": Epilogue((acc, full), *out, ("out = a0 * a1",)),
        "permuted": Epilogue((acc, bias), *out, ("out = a0 + a1",), store=store),
        "rope": Epilogue((acc, cos, rot, cos), *bf16, rope),
        "rope_permuted": Epilogue((acc, cos, rot, cos), *bf16, rope, store=store),
    }


@pytest.mark.parametrize("name", list(_epilogues()))
def test_every_template_renders_for_every_epilogue_form(name):
    """Each kernel's source, for each epilogue form and block width, is Python with its
    epilogue in it and no placeholder left (Triton compiles it: tests/test_triton_kernels.py,
    test_matmul_epilogues.py, test_conv_kernels.py)."""
    from autosched.kernels.igemm_conv.kernel import kernel_source as conv_source
    from autosched.kernels.matmul_gluon.source import specialized_source
    from autosched.kernels.matmul_triton.source import kernel_source

    epilogue = _epilogues()[name]
    sources = [specialized_source(epilogue, n) for n in (32, 64, 128, 256)]
    sources += [kernel_source(epilogue, n, p) for n in (32, 64, 128, 256) for p in (False, True)]
    if epilogue is None or epilogue.period == 1 and epilogue.store is None:
        sources.append(conv_source(epilogue))
    for source in sources:
        ast.parse(source)
        assert "$" not in source
        assert ("out = acc" in source) == (epilogue is None)
