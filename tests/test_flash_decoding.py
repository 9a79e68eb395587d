"""The flash-decoding family: a decode step's attention (a few query rows over a long
cache) split over shares of its keys, the last share to finish folding the partials
together. CPU tests build its points for sm_90 and substitute it in a cached LM; the GPU
tests check its answers, call after call (its locks must go back to zero)."""

from __future__ import annotations

import math
import os

import pytest
from iree.compiler import ir

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.ir_walk import symbol, walk_ops
from autosched.kernels.flash_decoding.family import DECODING
from autosched.kernels.flash_decoding.kernel import (
    DecodingParams,
    entries,
    group_loop,
    packed_layout,
    params_unsupported,
    unsupported,
    workspace_floats,
)
from autosched.measure.worker import Verifier, make_problem_data
from autosched.outputs.records import problem_from_shape
from autosched.rewrite.apply import rewrite_model
from autosched.rewrite.attention_ops import model_attentions
from autosched.rewrite.attention_sources import winners_absorbed
from autosched.rewrite.spec import write_substitution
from autosched.search.space import build_space
from autosched.targets import make_target

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
SM90 = make_target(RunConfig(target="cuda", arch="sm_90"))
BF16 = {f"{role}_type": "bf16" for role in ("query", "key", "value", "output")}
DECODE = {  # one query row per head (32 heads of 64), a cache of 1000 keys and its i1 mask
    "kind": "attention",
    "loops": ["b", "n", "k1", "k2"],
    "loop_sizes": [32, 64, 64, 1000],
    "mask_type": "i1",
    "form": "op",
    "causal": False,
    "scale": 0.125,
    "operand_loops": [[0, 2], [0, 3, 2], [0, 1, 3], [0, 3], [0, 1]],
    **BF16,
}
# A Llama decode over the cache as it is: batch 2, 8 KV heads, 4 query heads on each (K and V
# do not index that loop), one row, a cache of 1000 and its mask per head.
GQA = {
    **DECODE,
    "loops": ["b", "b", "b", "k1", "k2", "n"],
    "loop_sizes": [2, 8, 4, 64, 1000, 64],
    "operand_loops": [[0, 1, 2, 3], [0, 1, 4, 3], [0, 1, 4, 5], [0, 1, 2, 4], [0, 1, 2, 5]],
}
POINT = {"kernel": DECODING, "q_tile": 16, "kv_tile": 64, "kv_splits": 8, "q_warps": 4}
POINT["kv_stages"] = 2


def decode(**changes):
    return problem_from_shape({**DECODE, **changes})


def test_the_family_takes_few_query_rows_without_a_causal_mask():
    assert unsupported(decode()) is None
    assert unsupported(decode(mask_type="bf16")) is None
    assert "causal" in unsupported(decode(causal=True))
    prompt = decode(
        loops=["b", "m", "n", "k1", "k2"],
        loop_sizes=[32, 512, 64, 64, 512],
        operand_loops=[[0, 1, 3], [0, 4, 3], [0, 2, 4], [0, 1, 4], [0, 1, 2]],
    )
    assert "up to 64 query rows" in unsupported(prompt)
    problem = decode()
    assert "one share" in params_unsupported(problem, DecodingParams(16, 64, 1, 4, 2))
    assert "shares of 16 key blocks" in params_unsupported(
        problem, DecodingParams(16, 64, 32, 4, 2)
    )


def test_the_heads_of_a_kv_group_share_one_block_of_rows():
    """Under grouped-query attention over the cache, a workgroup takes the 4 heads of one
    KV head (4 rows of its block of 16), so each share reads its keys once per group."""
    problem, params = decode(**GQA), DecodingParams(16, 64, 8, 4, 2)
    assert group_loop(problem) == 2 and entries(problem) == 2 * 8
    assert workspace_floats(problem, params) == 16 * 8 * 16 * 66
    layout = packed_layout(problem)
    assert layout["sqg"] == 64 and layout["smg"] == 1000 and layout["sog"] == 64
    # The other batch loops are the entries: (1, 2, 8), Q's strides along them.
    assert (layout["B1"], layout["B2"]) == (2, 8)
    assert [layout[f"sqb{i}"] for i in range(3)] == [0, 8 * 4 * 64, 4 * 64]
    assert [layout[f"skb{i}"] for i in range(3)] == [0, 8 * 1000 * 64, 1000 * 64]
    assert group_loop(decode()) is None  # the op form's K and V copied per query head
    # 4 heads of 20 rows are more than a block: not packed.
    wide = decode(**{**GQA, "loops": ["b", "b", "b", "m", "k1", "k2", "n"],
                     "loop_sizes": [2, 8, 4, 20, 64, 1000, 64],
                     "operand_loops": [[0, 1, 2, 3, 4], [0, 1, 5, 4], [0, 1, 5, 6],
                                       [0, 1, 2, 3, 5], [0, 1, 2, 3, 6]]})  # fmt: skip
    assert group_loop(wide) is None and entries(wide) == 2 * 8 * 4


def test_its_points_join_the_decode_steps_space_beside_flash_attention():
    points = build_space(decode(), SM90, {}).points
    kernels = {p["kernel"] for p in points}
    assert kernels == {"flash", DECODING}  # IREE has no configuration for one query row
    decoding = [p for p in points if p["kernel"] == DECODING]
    assert all(p["q_tile"] == 16 and p["kv_splits"] >= 2 for p in decoding)
    assert all(p["kv_splits"] == 0 for p in points if p["kernel"] == "flash")
    view = SM90.for_problem(decode())
    for point in points:  # the cost model's features of one query row (blocks of 16 or 64)
        assert view.features(decode(), point)["log2_workgroups"] >= math.log2(32)
    starting = view.starting_points(decode())
    assert {"kernel": DECODING, **{k: v for k, v in POINT.items() if k != "kernel"}} in starting


@pytest.fixture(scope="module", params=["op", "gqa"])
def decoding_module(tmp_path_factory, request):
    """One point of the family for the decode step (the op form, and the form over the
    cache whose KV groups it packs), built for sm_90 as IREE runs it."""
    pytest.importorskip("triton")
    folder = tmp_path_factory.mktemp("decoding")
    problem = decode() if request.param == "op" else decode(**GQA)
    view = SM90.for_problem(problem)
    source = str(folder / "fd.mlir")
    command = view.source_command(problem, POINT, source)
    built = compile_one(
        CompileJob(source, str(folder / "fd.vmfb"), SM90.compile_flags(), command), 300
    )
    assert built.status == "ok", built.message
    return problem, built


def test_a_point_builds_as_one_extern_dispatch_with_its_zeroed_workspace(decoding_module):
    problem, built = decoding_module
    text = open(built.job.source).read()
    assert 'hal.dispatch.extern "flash_decoding"' in text
    # 32 heads (or 16 groups) x 8 shares x 16 rows x (64 outputs, a max and a sum), and a
    # lock per head or group
    heads = entries(problem)
    assert heads == (32 if group_loop(problem) is None else 16)
    assert f"tensor<{heads * 8 * 16 * 66}xf32>" in text and f"tensor<{heads}xi32>" in text
    assert f"arith.constant dense<0> : tensor<{heads}xi32>" in text  # locks start at zero
    assert f"flow.tensor.alloca : tensor<{heads * 8 * 16 * 66}xf32>" in text  # never filled
    ptx = open(built.job.source.removesuffix(".mlir") + ".ptx").read()
    assert "atom" in ptx and "ex2.approx" in ptx  # the lock, the exp2 online softmax


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
@pytest.mark.parametrize("absorbing", [False, True])
def test_a_cached_lms_decode_attention_is_replaced_by_the_family(tmp_path, absorbing):
    """The bf16 cached Llama's decode attention (one row, the cache's i1 mask) is replaced
    by a flash-decoding kernel in decode, and the whole module builds for sm_90; with its
    form over K's and V's sources, the kernel reads the cache as it is, its per-head
    repeats (a copy of the whole cache each step) gone, the mask passed on."""
    pytest.importorskip("triton")
    path = os.path.join(MODELS, "hf_tiny_llama_cached_bf16.mlirbc")
    ops = model_attentions(path, SM90.compile_flags(), str(tmp_path / "ops"))
    (step,) = [op for op in ops if op.single_row]
    forms = winners_absorbed(path, SM90.compile_flags(), str(tmp_path / "fused"), [step])
    (form,) = forms[step.name]
    repeats = {source.copy_type for source in form.sources}  # K's and V's, per query head
    assert repeats == {"tensor<2x2x64x16xbf16>", "tensor<2x2x16x64xbf16>"}
    assert group_loop(form.problem) is not None  # read once for the 2 heads of a KV head
    point = dict(POINT, kv_tile=16, kv_splits=4)
    spec = str(tmp_path / "custom.mlir")
    absorbed = forms if absorbing else None
    assert write_substitution(spec, [(step, point)], SM90, absorbed=absorbed) == []
    out, replaced = rewrite_model(path, spec, SM90.compile_flags(), str(tmp_path / "m.mlir"), 300)
    assert replaced == 2  # decode's two layers
    module = ir.Module.parseFile(out, ir.Context())
    functions = [o for o in walk_ops(module.operation) if "sym_name" in o.attributes]
    decode = next(o for o in functions if symbol(o) == "decode$async")
    copied = {str(o.results[0].type) for o in walk_ops(decode) if o.name == "linalg.generic"}
    assert bool(repeats & copied) != absorbing
    flags = [*SM90.compile_flags(), "--compile-from=global-optimization"]
    built = compile_one(CompileJob(out, str(tmp_path / "m.vmfb"), flags), 300)
    assert built.status == "ok", built.message


@pytest.mark.gpu
def test_the_kernel_gives_numpys_answer_call_after_call(decoding_module, tmp_path):
    """Its answer, checked twice with the same module: the second call finds the locks the
    first left at zero."""
    problem, built = decoding_module
    data = make_problem_data(problem, str(tmp_path / "inputs"))
    verifier = Verifier("cuda")
    try:
        for _ in range(2):
            check = verifier.check(built.job.output, data, problem, 120)
            assert check.status == "correct", check.message
    finally:
        verifier.close()
