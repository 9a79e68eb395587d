"""The RMSNorm before a projection kept in its matmul kernel (issue 48): transformers' Llama
normalizes each row before q, k, v, gate, up and the LM head; IREE runs each norm as a
dispatch of its own (33 in a Llama-3.2-1B decode step). The norm is read from the model
(rewrite/row_norms.py), and a winner's normed form reads x and the norm's weight g for A:
the kernel computes each row's rsqrt(mean(x^2) + eps) before its main loop and scales A's
tiles as it loads them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
from iree.compiler import ir

from autosched.ir_walk import symbol, walk_ops
from autosched.ops.row_norm import RowNorm

pytest.importorskip("triton")

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
DECODE_BF16 = os.path.join(MODELS, "hf_tiny_llama_in_place_t5_bf16.mlirbc")
POINT = {"tile_m": 64, "tile_n": 64, "tile_k": 64, "warps": 4, "pipeline_depth": 3, "group_m": 8}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """(target, the tiny in-place bf16 Llama lowered for sm_90, its matmul problems, their
    epilogues, folder), as tests/test_rotary_epilogues.py reads it."""
    from test_matmul_epilogues import read_epilogues

    return read_epilogues(DECODE_BF16, tmp_path_factory.mktemp("row_norms"))


def _norms(tiny_lm) -> dict:
    from autosched.rewrite.row_norms import winners_norms

    target, model, problems, _, folder = tiny_lm
    return winners_norms(model, target.compile_flags(), str(folder / "fused"), problems)


def test_the_norm_before_each_projection_is_read(tiny_lm):
    """Prefill's and decode's q, k, v, gate and up projections and the LM head read their
    A from an RMSNorm (eps 1e-6, the weight first, one reshape before the contraction);
    the o and down projections, whose A is attention's output and the SwiGLU product, and
    the rotary angles' matmul read none."""
    norms = _norms(tiny_lm)
    normed = sorted(name for name, found in norms.items() if found)
    assert len(normed) == 8  # q and o share a problem; so do k and v: 4 problems a function
    for name in normed:
        (norm,) = norms[name]
        assert abs(norm.eps - 1e-6) < 1e-12 and norm.weight_first and norm.reshapes == 1
        assert norm.g_type == "tensor<64xbf16>"
        assert norm.x_type == ("tensor<64xbf16>" if "1x1x" in name else "tensor<96x64xbf16>")
    unread = {name for name, found in norms.items() if not found}
    assert {n.split("_")[2] for n in unread} == {"1x96x64x128", "1x1x64x128", "1x8x96x1", "1x8x1x1"}


def test_a_layer_norm_is_no_rms_norm(tmp_path):
    """BERT's layer norm subtracts the mean: its projections read no RMSNorm."""
    from test_matmul_epilogues import read_epilogues

    target, model, problems, _, folder = read_epilogues(
        os.path.join(MODELS, "hf_bert_layer_f16.mlirbc"), tmp_path
    )
    from autosched.rewrite.row_norms import winners_norms

    found = winners_norms(model, target.compile_flags(), str(folder / "fused"), problems)
    assert found and not any(found.values())


INTERPRETED = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, REPO)
import torch
from autosched.kernels.matmul_triton import kernel as K
from autosched.ops.matmul import MatmulProblem
from autosched.ops.row_norm import RowNorm

def run(m, n, k, params, eps):
    # eps None: the plain kernel, A read as it is
    norm = RowNorm(eps, f"tensor<{m}x{k}xf16>", "", "", "", f"tensor<{k}xf16>", "", True, 0, "", "")
    norm = None if eps is None else norm
    problem = MatmulProblem(
        "linalg.matmul", m, n, k, 0, "f16", "f16", "f16", False, False, True, "", norm=norm
    )
    launched = K._launched(problem, params, None)
    kernel = K._kernel(None, launched, False, norm)
    constants = K._constants(problem, launched, None)
    blocks, batch, shares = K.grid(problem, launched)
    torch.manual_seed(0)
    x, g = (torch.randn(m, k) * 3).half(), torch.rand(k).half() + 0.5
    b, c = torch.randn(k, n).half(), torch.zeros(m, n, dtype=torch.float16)
    operands = (x, b, c) if norm is None else (x, b, g, c)
    if shares > 1:
        constants.pop("locks", None), constants.pop("w", None)
        locks, w = torch.zeros(blocks * batch, dtype=torch.int32), torch.zeros(m * n)
        kernel[(blocks, batch, shares)](*operands, locks, w, **constants)
    else:
        kernel[(blocks, batch, shares)](*operands, locks=None, w=None, **constants)
    wide = x.float()
    a = x if norm is None else g * (wide * torch.rsqrt((wide * wide).mean(-1, keepdim=True) + eps)).half()
    expected = a.float() @ b.float()
    return ((c.float() - expected).abs().max() / expected.abs().max()).item()

for case in CASES:
    m, n, k, block, split, eps = case
    params = K.KernelParams(block[0], block[1], block[2], 4, 2, 8, split_k=split)
    print(m, n, k, params.name, run(m, n, k, params, eps))
"""


def interpreted_errors(cases: list[tuple]) -> list[float]:
    """Each case's (m, n, k, block, split_k, eps or None) kernel run by Triton's
    interpreter, against torch: the largest error relative to the largest answer."""
    script = textwrap.dedent(INTERPRETED).replace("REPO", repr(REPO))
    script = script.replace("CASES", repr(cases))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = [float(line.split()[-1]) for line in done.stdout.splitlines()]
    assert len(errors) == len(cases), done.stdout
    return errors


def test_the_normed_kernel_gives_the_norms_answer():
    """The Triton kernel with the norm, run by Triton's interpreter on the CPU (f16: its
    interpreter has no bf16), against torch's RMSNorm then matmul: rows that are not
    whole blocks, a single row with K split in two shares (each share scales by the whole
    row's norm), whole blocks. Needs torch, as the interpreter does."""
    pytest.importorskip("torch")
    cases = [
        (3, 96, 64, (16, 32, 32), 1, 1e-5),
        (1, 64, 128, (16, 64, 32), 2, 1e-5),
        (64, 64, 64, (32, 32, 64), 1, 1e-5),
        (1, 64, 128, (1, 32, 32), 2, 1e-5),  # a block of the one row, summed on CUDA cores
        (3, 96, 64, (4, 32, 32), 1, 1e-5),
    ]
    assert max(interpreted_errors(cases)) < 2e-3  # f16's rounding of C


def _every_kernel_spec(tiny_lm, path: str) -> str:
    """Every substitutable matmul of the tiny LM at one point, with the model's reshape
    chains, epilogues and norms: the spec's path."""
    from autosched.rewrite.narrow_reshapes import model_reshape_chains
    from autosched.rewrite.replacements import substitutable
    from autosched.rewrite.spec import write_substitution

    target, model, problems, epilogues, folder = tiny_lm
    chains = model_reshape_chains(model, target.compile_flags(), str(folder / "narrow"))
    winners = [(p, POINT) for p in problems if substitutable(p) is None]
    norms = _norms(tiny_lm)
    assert write_substitution(path, winners, target, chains, epilogues, None, None, norms) == []
    return path


@pytest.mark.slow  # about 25 s on two cores: the tiny LM's kernels compiled, rewritten, lowered
def test_with_its_kernels_the_decode_step_keeps_no_norm(tiny_lm, tmp_path):
    """Every matmul a kernel, the norms in the kernels after them where the rows are few:
    the decode step keeps no reduction (each norm was one) while prefill's 96 rows keep
    their 5 norms IREE's, and the module builds for sm_90."""
    from test_triton_kernels import _iree_compile

    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
    from autosched.rewrite.placement import placed_kernels

    target, model, *_ = tiny_lm
    spec = _every_kernel_spec(tiny_lm, str(tmp_path / "every.mlir"))
    rewritten, replaced = rewrite_model(
        model, spec, target.compile_flags(), str(tmp_path / "r.mlir"), 300
    )
    assert replaced == 30  # 7 projections a layer, 2 layers, and the LM head, in each function
    module = ir.Module.parseFile(rewritten, ir.Context())
    functions = {symbol(op): op for op in walk_ops(module.operation) if op.name == "util.func"}
    reductions = {
        name: [
            op
            for op in walk_ops(functions[f"{name}$async"])
            if op.name == "linalg.generic" and "reduction" in str(op.attributes["iterator_types"])
        ]
        for name in ("prefill", "decode")
    }
    assert len(reductions["prefill"]) == 5 and not reductions["decode"]
    # A normed form's kernels are its winner's: placed under the problem's own name.
    placed = placed_kernels(rewritten)
    assert sum(placed.values()) == 30 and not any("rmsnorm" in name for name in placed)
    assert any("rmsnorm" in path for path in os.listdir(spec.removesuffix(".mlir")))
    _iree_compile(rewritten, *target.compile_flags(), RESUME_FLAG, "--compile-to=stream")


@pytest.mark.gpu
def test_the_tiny_lm_with_normed_kernels_gives_the_default_builds_outputs(
    tiny_lm, tmp_path, monkeypatch
):
    """On the GPU: the tiny LM with every matmul a kernel and the norms in them answers as
    IREE's default build does, prefill and decode."""
    from click.testing import CliRunner

    from autosched.cli import cli

    spec = _every_kernel_spec(tiny_lm, str(tmp_path / "every.mlir"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", DECODE_BF16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


def test_a_norm_names_its_form_apart():
    """Two norms of one problem give two forms with their own names (their kernels' files
    are named so), and the form's readings are the problem's own (`problem_key`)."""
    from autosched.ops.matmul import MatmulProblem
    from autosched.rewrite.common import problem_key
    from autosched.rewrite.row_norms import normed

    problem = MatmulProblem(
        "linalg.matmul", 1, 64, 64, 0, "bf16", "bf16", "f32", False, False, True, ""
    )
    one, two = (RowNorm(eps, "t", "w", "s", "n", "g", "a", True, 1, "", "") for eps in (1e-5, 1e-6))
    names = {normed(problem, one).name, normed(problem, two).name, problem.name}
    assert len(names) == 3
    assert problem_key(normed(problem, one)) == problem_key(problem) == problem.name


@pytest.mark.slow  # over 5 s on two cores: the README's command stays under 10 minutes
def test_a_normed_kernel_rotates_heads_of_its_block(tmp_path):
    """The Llama layer's q projection with its RoPE at blocks of one head (32 columns:
    `rotated_matmul`) and its norm: the kernel builds for sm_90 and takes g after B."""
    from test_matmul_epilogues import read_epilogues

    from autosched.kernels.matmul_triton import kernel
    from autosched.rewrite.row_norms import normed, winners_norms

    read = read_epilogues(os.path.join(MODELS, "hf_llama_layer_bf16.mlirbc"), tmp_path)
    target, model, problems, epilogues, folder = read
    norms = winners_norms(model, target.compile_flags(), str(folder / "fused"), problems)
    (q,) = [p for p in problems if p.n == 128 and p.k == 128 and norms[p.name]]
    (rotary,) = [e for e in epilogues[q.name] if e.period > 1]
    narrow = normed(replace(q, acc_type="bf16"), norms[q.name][0])
    params = kernel.KernelParams(64, 32, 64, 4, 3, 8)
    binary = kernel.compile_ptx(narrow, params, "sm_90", str(tmp_path / "q.ptx"), rotary)
    assert binary.entry == "rotated_matmul"
    body = kernel.extern_function(narrow, params, binary, target.executable_target(), "q")
    assert body.count("tensor<128xbf16>") >= 1  # g, after B
    # A decode step's block of one row, summed on the CUDA cores, builds in the same form.
    row = kernel.KernelParams(1, 32, 64, 4, 3, 8)
    summed = kernel.compile_ptx(narrow, row, "sm_90", str(tmp_path / "r.ptx"), rotary)
    assert summed.entry == "rotated_matmul" and "mma" not in open(summed.ptx_path).read()
