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


MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
LLAMA_BF16 = os.path.join(MODELS, "hf_llama_layer_bf16.mlirbc")
DECODE_BF16 = os.path.join(MODELS, "hf_tiny_llama_in_place_t5_bf16.mlirbc")
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
    assert _rotary_against_iree(llama, paired) == 2  # q and k


@pytest.fixture(scope="module")
def decode_step(tmp_path_factory):
    """The tiny in-place Llama in bf16 as transformers 5 exports it (`tools/export_causal_lm.py
    --in-place --dtype bfloat16 --prompt 96 --cache 160`), read as `llama` is."""
    pytest.importorskip("triton")
    from test_matmul_epilogues import read_epilogues

    return read_epilogues(DECODE_BF16, tmp_path_factory.mktemp("decode_rotary"))


def test_a_decode_steps_rotation_is_read_from_its_heads(decode_step):
    """In a decode step (one token) q's and k's RoPE has no move of the heads: the epilogue
    reads the rounded result reshaped into heads, and the rotation's chain splits the
    rounded result itself. It is read as the same rotation (a head of 16, cos and sin by
    head dim alone: the step's one token), stored as the rows are."""
    *_, problems, epilogues, _ = decode_step
    single = [e for p in problems if p.m == 1 for e in epilogues[p.name] if e.period > 1]
    assert sorted(e.out_type for e in single) == ["tensor<2x16xbf16>", "tensor<4x16xbf16>"]
    for epilogue in single:
        heads = int(epilogue.out_type.split("<")[1].split("x")[0])
        assert [x.kind for x in epilogue.inputs] == [ACC, INDEXED, ROTATED, INDEXED]
        assert epilogue.inputs[2].period == 16 and epilogue.read_reshapes == 1
        assert epilogue.inputs[1].index == PermutedStore((heads, 16), (0, 1), 0)
        assert epilogue.inputs[1].index.offsets("r", "c") == "(c % 16) * 1"
        assert epilogue.store is None and epilogue.dag


@pytest.mark.parametrize("paired", [True, False], ids=["rotated_matmul", "tile_rotated"])
def test_a_decode_steps_rotary_epilogue_gives_iree_s_answer(decode_step, paired):
    """As the layer's: the decode step's q and k kernels' lines after their main loop,
    one row, against IREE's CPU build of the step's own chain (both layers)."""
    assert _rotary_against_iree(decode_step, paired, rows=1) == 4


def _rotary_against_iree(read: tuple, paired: bool, rows: int | None = None) -> int:
    """How many of the model's rotary epilogues (of problems of `rows` rows, or all) gave
    IREE's answers as the kernel computes them (the tests above)."""
    import textwrap

    import ml_dtypes
    from test_conv_kernels import NumpyPointer, _run, numpy_tl, tile

    from autosched.kernels.matmul_triton import source as kernels
    from autosched.kernels.templates import epilogue_values
    from autosched.rewrite.common import FUSED_MODEL
    from autosched.rewrite.common import is_problems_op as _is_problems_op
    from autosched.rewrite.epilogues import after_contraction, epilogue_of

    *_, problems, _, folder = read
    problems = [p for p in problems if rows is None or p.m == rows]
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
        names |= {"batch": 0, "scb": 0, "scm": n, "scn": 1}  # C row-major, where no store
        names |= {"e0": NumpyPointer(cos), "e1": NumpyPointer(sin)}
        names["c"] = stored = _Stored(m * n, names)
        result = rounded.reshape(m, n)
        store = epilogue.store
        offsets = store.offsets("rm[:, None]", "rn[None, :]") if store else kernels.ROW_MAJOR
        values = epilogue_values(epilogue, kernels.TILE_NAMES)
        if paired:
            exec("\n".join(kernels.ROTATED_COLUMNS), names)
            names["acc"] = tile(result[:, names["pairs"]])  # the main loop's tile of B's columns
            source = "\n".join(kernels.rotated_halves(offsets, values))
        else:
            names["acc"] = tile(result)
            source = kernels.store_tile(epilogue, n, kernels.plain_store(), values)
        if store is None and not paired:  # `matmul` points at C before its store lines
            exec(f"c_ptrs = c + ({kernels.ROW_MAJOR})", names)
        exec(textwrap.dedent(source), names)  # the kernel's own lines, as Python
        written = stored.written
        assert not np.isnan(written).any()  # every element written
        # bf16 rounds each product in the kernel; IREE may add them unrounded: two of its
        # ulps (2^-7) of the terms' sizes, which q * cos + rotate_half(q) * sin cancels
        assert (np.abs(written - expected) <= 2 * 2**-7 * stored.terms + 1e-3).all()
        checked += 1
    return checked


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


@pytest.mark.slow  # about 20 s on two cores: the tiny LM rewritten and lowered
def test_a_decode_step_with_its_kernels_has_no_rotation_left(decode_step, tmp_path):
    """Every matmul of the tiny LM a kernel with its epilogue: prefill's and decode's q and
    k kernels keep RoPE, so no rotating generic is left in either function, and the module
    still builds for sm_90."""
    from test_matmul_epilogues import triton_spec
    from test_triton_kernels import _iree_compile

    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
    from autosched.rewrite.replacements import substitutable

    target, model, problems, epilogues, folder = decode_step
    kept = [p for p in problems if substitutable(p) is None]  # not RoPE's angles (bf16 x f32)
    read = (target, model, kept, epilogues, folder)
    spec = triton_spec(read, str(tmp_path / "every.mlir"), POINT, epilogues)
    rewritten, _ = rewrite_model(model, spec, target.compile_flags(), str(tmp_path / "r.mlir"), 300)
    module = ir.Module.parseFile(rewritten, ir.Context())
    ops = list(walk_ops(module.operation))
    kernels = [str(op.results[0].type) for op in ops if op.name == "hal.dispatch.extern"]
    assert kernels.count("tensor<4x16xbf16>") == 2 and kernels.count("tensor<2x16xbf16>") == 2
    rotations = [op for op in ops if op.name == "tensor.extract" and _of_heads(op.operands[0])]
    assert not rotations  # only the embedding's gathers read with tensor.extract
    _iree_compile(rewritten, *target.compile_flags(), RESUME_FLAG, "--compile-to=stream")


def _of_heads(value: ir.Value) -> bool:
    """Whether `value` is an expand_shape's result (a rotation's halves of each head)."""
    owner = value.owner
    return not isinstance(owner, ir.Block) and owner.operation.name == "tensor.expand_shape"


@pytest.mark.gpu
def test_a_decode_step_with_its_rotary_kernels_gives_the_default_builds_outputs(
    decode_step, tmp_path, monkeypatch
):
    """On the GPU: the tiny LM with every matmul a kernel, prefill's and decode's RoPE in
    the q and k kernels, answers as IREE's default build does."""
    from click.testing import CliRunner
    from test_matmul_epilogues import triton_spec

    from autosched.cli import cli
    from autosched.rewrite.replacements import substitutable

    target, model, problems, epilogues, folder = decode_step
    kept = [p for p in problems if substitutable(p) is None]
    spec = triton_spec(
        (target, model, kept, epilogues, folder), str(tmp_path / "e.mlir"), POINT, epilogues
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["apply", DECODE_BF16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]
