"""RoPE kept in the q and k kernels (issue 24): transformers' Llama layer rotates q and k
(`q * cos + rotate_half(q) * sin`) in a chain of ops after each projection's truncf, which
IREE ran as a dispatch of its own (0.064 ms of the Llama-3-8B layer on the H200). The chain's
rotation is read by evaluating its index arithmetic (model/rotary.py); the kernel rotates
its tile, reads cos and sin by token and head dim, and stores the heads first."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from iree import compiler
from iree.compiler import ir

from autosched.ir_walk import walk_ops
from autosched.ops.epilogue import ACC, INDEXED, ROTATED, PermutedStore
from autosched.rewrite.rotary import rotates_half

ROTATION = """
func.func @f(%x: tensor<2x3x2x4xf32>) -> tensor<2x3x2x4xf32> {
  %c1 = arith.constant 1 : index
  %e = tensor.empty() : tensor<2x3x2x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      outs(%e : tensor<2x3x2x4xf32>) {
  ^bb0(%out: f32):
    %i0 = linalg.index 0 : index
    %i1 = linalg.index 1 : index
    %i2 = linalg.index 2 : index
    %i3 = linalg.index 3 : index
    %other = arith.subi %c1, %i2 : index
    %v = tensor.extract %x[%i0, %i1, INDEX, %i3] : tensor<2x3x2x4xf32>
    %n = arith.negf %v : f32
    %first = arith.cmpi eq, %other, %c1 : index
    %s = arith.select %first, NEGATED : f32
    linalg.yield %s : f32
  } -> tensor<2x3x2x4xf32>
  return %r : tensor<2x3x2x4xf32>
}
"""


@pytest.mark.parametrize(
    "index, negated, rotates",
    [
        ("%other", "%n, %v", True),  # transformers' rotate_half
        ("%other", "%v, %n", False),  # the second half negated
        ("%i2", "%n, %v", False),  # each half its own
        ("%i3", "%n, %v", False),  # another dim's index
    ],
    ids=["rotate_half", "second_half_negated", "no_swap", "wrong_index"],
)
def test_only_a_rotation_by_half_is_read_as_one(index, negated, rotates):
    """The rotating generic's body, evaluated over its whole iteration space, is taken only
    where each element reads its head's other half, negated in the first half."""
    text = ROTATION.replace("INDEX", index).replace("NEGATED", negated)
    module = ir.Module.parse(text, ir.Context())
    (generic,) = [op for op in walk_ops(module.operation) if op.name == "linalg.generic"]
    source = module.body.operations[0].regions[0].blocks[0].arguments[0]
    assert rotates_half(generic, source) is rotates


LLAMA_BF16 = os.path.join(os.path.dirname(__file__), "data", "models", "hf_llama_layer_bf16.mlirbc")
POINT = {"tile_m": 64, "tile_n": 64, "tile_k": 64, "warps": 4, "pipeline_depth": 3, "group_m": 8}
HEADS_FIRST = {"tensor<4x64x32xbf16>": 4, "tensor<2x64x32xbf16>": 2}  # q and k: heads


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(target, the bf16 Llama layer lowered for sm_90, its matmul problems, their
    epilogues, folder)."""
    pytest.importorskip("triton")
    from test_matmul_epilogues import read_epilogues

    return read_epilogues(LLAMA_BF16, tmp_path_factory.mktemp("llama_rotary"))


def _rotary(epilogues: dict) -> list:
    return [e for found in epilogues.values() for e in found if e.period > 1]


def test_q_and_k_are_read_with_their_rotation(llama):
    """q's and k's epilogues: the rounded result, cos and sin by token and head dim (32),
    the result rotated in each head; stored with the heads before the tokens."""
    *_, epilogues, _ = llama
    rotary = _rotary(epilogues)
    assert sorted(e.out_type for e in rotary) == sorted(HEADS_FIRST)
    for epilogue in rotary:
        heads = HEADS_FIRST[epilogue.out_type]
        assert [x.kind for x in epilogue.inputs] == [ACC, INDEXED, ROTATED, INDEXED]
        assert epilogue.inputs[2].period == 32
        by_token_and_dim = PermutedStore((64, heads, 32), (32, 0, 1), 1)
        assert epilogue.inputs[1].index == epilogue.inputs[3].index == by_token_and_dim
        assert epilogue.store == PermutedStore((64, heads, 32), (32, 64 * 32, 1), 1)
        assert epilogue.dag


def _chain_alone(root, inputs: list) -> str:
    """A module whose `main` takes `inputs` (values of the model) and returns what `root`
    computes from them: every op between them cloned, in the model's order, bodies'
    captured values included (IREE builds the chain alone for the CPU)."""
    from iree.compiler.dialects import func

    chain = []

    def visit(op):
        if any(op == seen for seen in chain):
            return
        for inner in [op, *walk_ops(op)]:
            for value in inner.operands:
                owner = value.owner
                if value in inputs or isinstance(owner, ir.Block):
                    continue
                if owner.operation.parent.name in ("util.func", "func.func"):
                    visit(owner.operation)
        chain.append(op)

    visit(root.operation)
    body = root.operation.parent.regions[0].blocks[0]
    ordered = [op.operation for op in body.operations if any(op == c for c in chain)]
    with root.context, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            main = func.FuncOp("main", ([v.type for v in inputs], [root.results[0].type]))
            block = main.add_entry_block()
            mapping = dict(zip(inputs, block.arguments, strict=True))
            with ir.InsertionPoint(block):
                for op in ordered:
                    copy = op.clone()
                    for inner in [copy, *walk_ops(copy)]:
                        for index, value in enumerate(inner.operands):
                            if value in mapping:
                                inner.operands[index] = mapping[value]
                    mapping.update(zip(op.results, copy.results, strict=True))
                func.ReturnOp([mapping[root.results[0]]])
        return str(module)


@pytest.mark.parametrize("block_n, half", [(32, 64), (128, 64), (256, 16), (64, 32)])
def test_a_rotated_kernel_s_blocks_write_every_column_once(block_n, half):
    """Each block of a rotated kernel computes BN // 2 first-half columns and their
    partners HALF columns on: over the blocks, every column of the heads exactly once, a
    block holding part of a head (BN < 2 * HALF) or several."""
    from test_conv_kernels import numpy_tl

    from autosched.kernels.matmul_triton.source import ROTATED_COLUMNS

    n = 4 * max(block_n, 2 * half)  # whole blocks and heads
    columns = []
    for pn in range(n // block_n):
        first = pn * (block_n // 2) + np.arange(block_n // 2)
        names = {"tl": numpy_tl(), "first": first, "HALF": half, "BN": block_n}
        exec("\n".join(ROTATED_COLUMNS), names)
        lo, pairs = names["lo"], np.asarray(names["pairs"])
        assert (lo % (2 * half) < half).all()  # first halves of their heads
        assert (pairs[0::2] == lo).all() and (pairs[1::2] == lo + half).all()
        columns += [*pairs]
    assert sorted(columns) == list(range(n))


class _Stored:
    """The output of a kernel run by numpy: `c + offsets` is where `tl.store` writes; each
    element's terms (|q * cos| and |rotate_half(q) * sin|, from the epilogue's inputs as the
    kernel loaded them: acc, cos, rot, sin) are kept beside it, for the rounding bound."""

    def __init__(self, size: int, names: dict):
        self.written = np.full(size, np.nan, np.float32)
        self.terms = np.zeros(size, np.float32)
        self.dtype = SimpleNamespace(element_ty=np.float32)
        self.names = names  # the kernel's variables, as its lines run

    def __add__(self, offsets):
        return self, np.asarray(offsets)

    @staticmethod
    def store(place, value, mask=None):
        stored, offsets = place
        stored.written[offsets] = np.asarray(value).astype(np.float32)
        a = [np.asarray(stored.names[f"a{i}"]).astype(np.float32) for i in range(4)]
        stored.terms[offsets] = np.abs(a[0] * a[1]) + np.abs(a[2] * a[3])


@pytest.mark.parametrize("paired", [True, False], ids=["rotated_matmul", "tile_rotated"])
def test_each_rotary_epilogue_as_the_kernel_computes_it_gives_iree_s_answer(llama, paired):
    """Each kernel's lines after its main loop, run by numpy in bf16 on the whole (m, n)
    result as one block, against IREE's CPU build of the model's own chain from the rounded
    result: `rotated_matmul`'s (B's columns in pairs, the tile split in its halves, each
    half's epilogue with cos and sin gathered at their offsets, the store), or `matmul`'s
    with its block of whole heads rotated in its tile. Every element lands where IREE puts
    it, within bf16's rounding."""
    import textwrap

    import ml_dtypes
    from test_conv_kernels import NumpyPointer, _run, numpy_tl, tile

    from autosched.kernels.matmul_triton import source as kernels
    from autosched.kernels.templates import epilogue_values
    from autosched.rewrite.common import FUSED_MODEL
    from autosched.rewrite.common import is_problems_op as _is_problems_op
    from autosched.rewrite.epilogues import after_contraction, epilogue_of

    *_, problems, _, folder = llama
    module = ir.Module.parseFile(str(folder / "fused" / FUSED_MODEL), ir.Context())
    checked = 0
    for op in list(walk_ops(module.operation)):
        problem = next((p for p in problems if _is_problems_op(op, p)), None)
        epilogue = epilogue_of(op, problem) if problem else None
        if getattr(epilogue, "period", 1) == 1:
            continue
        truncf, generic, _ = after_contraction(op)
        inputs = [truncf.results[0], generic.operands[1], generic.operands[3]]
        vmfb = compiler.compile_str(
            _chain_alone(generic, inputs), target_backends=["llvm-cpu"],
            extra_args=["--iree-llvmcpu-target-cpu=generic"],
        )  # fmt: skip
        rng = np.random.default_rng(checked)
        rounded, cos, sin = (
            rng.uniform(-2, 2, ir.RankedTensorType(v.type).shape).astype(ml_dtypes.bfloat16)
            for v in inputs
        )
        expected = _run(vmfb, "local-task", rounded, cos, sin).astype(np.float32).reshape(-1)
        m, n = problem.m, problem.n
        assert kernels.rotates_in_tile(epilogue, n)  # several heads in the one block
        names = {"tl": SimpleNamespace(**vars(numpy_tl()), store=_Stored.store), "EVEN": True}
        names |= {"HALF": epilogue.period // 2, "first": np.arange(n // 2), "rm": np.arange(m)}
        names |= {"BM": m, "BN": n, "M": m, "N": n, "rn": np.arange(n)}
        names |= {"e0": NumpyPointer(cos), "e1": NumpyPointer(sin)}
        names["c"] = stored = _Stored(m * n, names)
        result = rounded.reshape(m, n)
        offsets = epilogue.store.offsets("rm[:, None]", "rn[None, :]")
        values = epilogue_values(epilogue, kernels.TILE_NAMES)
        if paired:
            exec("\n".join(kernels.ROTATED_COLUMNS), names)
            names["acc"] = tile(result[:, names["pairs"]])  # the main loop's tile of B's columns
            source = "\n".join(kernels.rotated_halves(offsets, values))
        else:
            names["acc"] = tile(result)
            source = kernels.store_tile(epilogue, n, kernels.plain_store(), values)
        exec(textwrap.dedent(source), names)  # the kernel's own lines, as Python
        written = stored.written
        assert not np.isnan(written).any()  # every element written
        # bf16 rounds each product in the kernel; IREE may add them unrounded: two of its
        # ulps (2^-7) of the terms' sizes, which q * cos + rotate_half(q) * sin cancels
        assert (np.abs(written - expected) <= 2 * 2**-7 * stored.terms + 1e-3).all()
        checked += 1
    assert checked == 2  # q and k


@pytest.mark.slow  # about 13 s on two cores: the Llama layer rewritten and lowered
def test_the_rewritten_layer_has_no_rotation_left(llama, tmp_path):
    """With blocks of 32 columns or more the q and k kernels write RoPE's heads-first
    results and no rotating generic is left (the layer still builds for sm_90), blocks of two
    heads rotating their tile and blocks of one head as `rotated_matmul`; with blocks of 16
    (half blocks narrower than a dot), IREE keeps the rotation and the kernels write q and k
    as they are. A persistent point's kernels are `persistent_matmul` with their epilogues
    in their loop over blocks, but for `rotated_matmul`, which has no persistent form."""
    from test_matmul_epilogues import triton_spec
    from test_triton_kernels import _iree_compile

    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model

    target, model, _, epilogues, _ = llama
    found = {}
    for tile_n in (64, 32, 16, "32p"):
        point = POINT | {"tile_n": int(str(tile_n)[:2]), "persistent": 132 * (tile_n == "32p")}
        spec = triton_spec(llama, str(tmp_path / f"c{tile_n}.mlir"), point, epilogues)
        out = str(tmp_path / f"rewritten_{tile_n}.mlir")
        rewritten, replaced = rewrite_model(model, spec, target.compile_flags(), out, 300)
        assert replaced == 7
        module = ir.Module.parseFile(rewritten, ir.Context())  # kept: the ops live in it
        ops = list(walk_ops(module.operation))
        dispatches = [op for op in ops if op.name == "hal.dispatch.extern"]
        externs = [str(op.results[0].type) for op in dispatches]
        found[tile_n] = (externs, sum(op.name == "tensor.extract" for op in ops))
        kernels = [ir.StringAttr(op.attributes["export_name"]).value for op in dispatches]
        assert kernels.count("rotated_matmul") == (2 if tile_n in (32, "32p") else 0)
        assert kernels.count("persistent_matmul") == (5 if tile_n == "32p" else 0)
        if tile_n != 16:
            _iree_compile(rewritten, *target.compile_flags(), RESUME_FLAG, "--compile-to=stream")
    for tile_n in (64, 32, "32p"):
        externs, extracts = found[tile_n]
        assert extracts == 0 and all(externs.count(t) == 1 for t in HEADS_FIRST)
    externs, extracts = found[16]
    assert extracts == 2 and not any(t in externs for t in HEADS_FIRST)
