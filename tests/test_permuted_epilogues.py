"""A matmul epilogue whose result permutes the matmul's (issue 24): BERT's q, k and v
projections add their bias as the heads move before the tokens (v's also after its head dim),
one generic IREE runs as a dispatch of its own; the Triton kernel writes each element where
that generic would."""

from __future__ import annotations

import os

import numpy as np
import pytest
from iree import compiler
from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.ops.epilogue import ACC, CHANNEL, PermutedStore


@pytest.mark.parametrize(
    "order",
    [(0, 2, 1, 3), (0, 2, 3, 1)],  # q, k: [b, h, s, d]; v: [b, h, d, s]
    ids=["heads_first", "heads_first_keys_last"],
)
def test_the_stores_offsets_put_each_element_where_the_permutation_does(order):
    """The kernel's offsets, evaluated by numpy on a whole (m, n) tile of a 2x5 by 3x4
    result (rows split into batch and tokens, columns into heads and head dim), scatter the
    matmul's result into numpy's transpose of it."""
    extents = (2, 5, 3, 4)
    out_shape = [extents[i] for i in order]
    out_strides = [int(np.prod(out_shape[i + 1 :])) for i in range(4)]
    strides = tuple(out_strides[order.index(dim)] for dim in range(4))
    store = PermutedStore(extents, strides, rows=2)
    m, n = 2 * 5, 3 * 4
    result = np.arange(m * n).reshape(m, n)
    namespace = {"rm": np.arange(m), "rn": np.arange(n)}
    offsets = eval(store.offsets("rm[:, None]", "rn[None, :]"), namespace)
    written = np.empty(m * n, dtype=result.dtype)
    written[offsets] = result
    expected = np.transpose(result.reshape(extents), order)
    assert (written.reshape(out_shape) == expected).all()


BERT_F16 = os.path.join(os.path.dirname(__file__), "data", "models", "hf_bert_layer_f16.mlirbc")
POINT = {"tile_m": 32, "tile_n": 64, "tile_k": 64, "warps": 4, "pipeline_depth": 3, "group_m": 8}


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(target, the f16 BERT layer lowered for sm_90, its matmul problems, their epilogues,
    folder)."""
    pytest.importorskip("triton")
    from test_matmul_epilogues import read_epilogues

    return read_epilogues(BERT_F16, tmp_path_factory.mktemp("bert_permuted"))


def _spec(bert, path: str, epilogues) -> str:
    """Every matmul problem of the layer as one Triton point (with `epilogues`)."""
    from test_matmul_epilogues import triton_spec

    return triton_spec(bert, path, POINT, epilogues)


def test_the_projections_bias_adds_are_read_with_the_heads_moved_first(bert):
    """q and k (one epilogue: the same op) and v (its head dim before its tokens) add their
    bias as the heads move before the tokens; the output projection's bias and residual add
    keeps the matmul's layout."""
    _, _, problems, epilogues, _ = bert
    square = epilogues["matmul_transpose_b_32x128x128_f16_f16_f32"]  # q, k, v and o
    stores = {e.out_type: e.store for e in square}
    assert set(stores) == {
        "tensor<2x4x16x32xf16>",  # q, k: [batch, heads, tokens, head dim]
        "tensor<2x4x32x16xf16>",  # v: [batch, heads, head dim, tokens]
        "tensor<2x16x128xf16>",  # o, with the residual
    }
    assert stores["tensor<2x4x16x32xf16>"] == PermutedStore((2, 16, 4, 32), (2048, 32, 512, 1), 2)
    assert stores["tensor<2x4x32x16xf16>"] == PermutedStore((2, 16, 4, 32), (2048, 1, 512, 16), 2)
    assert stores["tensor<2x16x128xf16>"] is None
    moved = [e for e in square if e.store]
    assert all([x.kind for x in e.inputs] == [ACC, CHANNEL] for e in moved)
    assert all(e.statements == ("v0 = a0 + a1", "out = v0") for e in moved)


def test_each_permuted_epilogue_as_the_kernel_computes_it_gives_iree_s_answer(bert):
    """The kernel's statements over its (m, n) tile, then its store's offsets, run by numpy
    (f16), against the same generic built alone by IREE for the CPU: every element lands
    where IREE puts it, with IREE's value."""
    assert _permuted_against_iree(bert, np.float16) == 3  # q, k and v


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """The tiny in-place bf16 Llama (transformers 5's export), read as `bert` is."""
    pytest.importorskip("triton")
    from test_matmul_epilogues import read_epilogues

    path = os.path.join(os.path.dirname(__file__), "data", "models")
    model = os.path.join(path, "hf_tiny_llama_in_place_t5_bf16.mlirbc")
    return read_epilogues(model, tmp_path_factory.mktemp("tiny_lm_heads"))


def test_a_prompts_v_moves_its_heads_as_it_rounds(tiny_lm):
    """Prefill's v projection (its f32 result reshaped into heads, then one generic that
    rounds it to bf16 and moves the heads before the tokens for the cache) is an epilogue
    that rounds its f32 input itself and stores permuted: as the kernel computes it, numpy
    puts every element where IREE does, with IREE's value."""
    import ml_dtypes

    assert _permuted_against_iree(tiny_lm, np.float32, ml_dtypes.bfloat16) == 2  # 2 layers


def _permuted_against_iree(read: tuple, element, out=None) -> int:
    """How many of the model's epilogues with a permuted store gave IREE's answer as the
    kernel computes them (inputs drawn in `element`; the result compared in `out`)."""
    from test_conv_kernels import _alone, _numpy_statements, _run

    from autosched.ir_walk import walk_ops
    from autosched.rewrite.common import FUSED_MODEL
    from autosched.rewrite.common import is_problems_op as _is_problems_op
    from autosched.rewrite.epilogues import after_contraction, epilogue_of

    *_, problems, _, folder = read
    module = ir.Module.parseFile(str(folder / "fused" / FUSED_MODEL), ir.Context())
    checked = 0
    for op in list(walk_ops(module.operation)):
        problem = next((p for p in problems if _is_problems_op(op, p)), None)
        epilogue = epilogue_of(op, problem) if problem else None
        if getattr(epilogue, "store", None) is None or epilogue.period > 1:  # (RoPE's: rotary)
            continue
        generic = after_contraction(op)[1]
        rng = np.random.default_rng(checked)
        operands = [ir.RankedTensorType(v.type).shape for v in list(generic.operands)[:-1]]
        inputs = [rng.uniform(-2, 2, shape).astype(element) for shape in operands]
        vmfb = compiler.compile_str(
            _alone(generic), target_backends=["llvm-cpu"],
            extra_args=["--iree-llvmcpu-target-cpu=generic"],
        )  # fmt: skip
        expected = _run(vmfb, "local-task", *inputs).reshape(-1)
        m, n = problem.m, problem.n
        tiles = [x.reshape(m, n) if x.size == m * n else x.reshape(-1) for x in inputs]
        result = _numpy_statements(epilogue, tiles).astype(out or element)
        offsets = eval(epilogue.store.offsets("rm[:, None]", "rn[None, :]"),
                       {"rm": np.arange(m), "rn": np.arange(n)})  # fmt: skip
        written = np.full(m * n, np.nan, dtype=out or element)
        written[offsets] = result
        assert (written.astype(np.float32) == expected.astype(np.float32)).all()
        checked += 1
    return checked


def test_the_rewritten_layer_has_no_head_moving_dispatch_left(bert):
    """With the epilogues the q, k and v kernels write the heads-first tensors themselves:
    the three bias-and-transpose generics are gone, and the layer builds for sm_90."""
    from test_triton_kernels import _iree_compile

    from autosched.model.lowering import run_passes
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
    from autosched.rewrite.common import ELEMENTWISE_FUSION

    target, model, problems, epilogues, folder = bert
    flags = target.compile_flags()
    counts = {}
    for kept in (None, epilogues):
        spec = _spec(bert, str(folder / f"custom_{kept is not None}.mlir"), kept)
        out = str(folder / f"rewritten_{kept is not None}.mlir")
        rewritten, replaced = rewrite_model(model, spec, flags, out, 300)
        assert replaced == 6  # q, k, v, o and the two FFN matmuls
        fused = f"{out}.fused.mlir"
        run_passes(rewritten, f"builtin.module(util.func({ELEMENTWISE_FUSION}))", fused)
        module = ir.Module.parseFile(fused, ir.Context())  # kept: the ops live in it
        ops = list(walk_ops(module.operation))
        externs = [str(op.results[0].type) for op in ops if op.name == "hal.dispatch.extern"]
        counts[kept is not None] = (len([op for op in ops if op.name == "linalg.generic"]), externs)
    generics, externs = counts[True]
    assert (
        externs.count("tensor<2x4x16x32xf16>") == 2 and externs.count("tensor<2x4x32x16xf16>") == 1
    )
    assert generics < counts[False][0] - 3  # the three head moves, and the o and FFN epilogues
    _iree_compile(rewritten, *flags, RESUME_FLAG, "--compile-to=stream")


@pytest.mark.gpu
def test_the_layer_with_heads_moved_in_its_kernels_gives_the_default_builds_outputs(
    bert, tmp_path, monkeypatch
):
    """On the GPU: every matmul of the BERT layer a Triton kernel, q, k and v storing their
    heads first, and the outputs match IREE's default build."""
    from click.testing import CliRunner

    from autosched.cli import cli

    spec = _spec(bert, str(tmp_path / "custom.mlir"), bert[3])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", BERT_F16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (6 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


def test_heads_moves_of_the_same_types_are_told_apart_by_their_maps(tmp_path):
    """At a sequence of 32, the head dim, v's heads-first result has q's and k's shape: the
    spec matches each generic exactly (maps and body: it captures nothing), so q and k call
    the kernel that stores tokens before the head dim and v the one that stores them last."""
    from test_matmul_epilogues import read_epilogues, triton_spec

    from autosched.rewrite.apply import rewrite_model

    read = read_epilogues(BERT_F16.replace(".mlirbc", "_seq32.mlirbc"), tmp_path)
    target, model, _, epilogues, _ = read
    square = epilogues["matmul_transpose_b_64x128x128_f16_f16_f32"]
    moved = [e for e in square if e.store]
    assert len(moved) == 2 and moved[0].out_type == moved[1].out_type and all(e.dag for e in moved)
    spec = triton_spec(read, str(tmp_path / "custom.mlir"), POINT, epilogues)
    rewritten, replaced = rewrite_model(
        model, spec, target.compile_flags(), str(tmp_path / "r"), 300
    )
    assert replaced == 6
    module = ir.Module.parseFile(rewritten, ir.Context())
    ops = list(walk_ops(module.operation))
    (attention,) = [op for op in ops if op.name == "iree_linalg_ext.attention"]
    strides = []
    for operand in list(attention.operands)[:3]:  # q, k, v: each collapsed from its kernel
        extern = operand.owner.operands[0].owner
        assert extern.name == "hal.dispatch.extern"
        objects = str(extern.attributes["target_objects"])
        (index,) = [j for j in range(len(square)) if f".epilogue{j}.cubin" in objects]
        strides.append(square[index].store.strides)
    assert strides[0] == strides[1] == (4096, 32, 1024, 1)  # [batch, heads, tokens, head dim]
    assert strides[2] == (4096, 1, 1024, 32)  # [batch, heads, head dim, tokens]
