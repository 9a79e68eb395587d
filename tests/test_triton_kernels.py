"""The Triton kernel family as IREE custom dispatches: PTX made without a GPU, wrapped in a
`hal.dispatch.extern` module that iree-compile builds for sm_90, and (on a GPU) the same
answers as numpy for plain, transposed, batched and unevenly divided problems."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import hopper_config
from iree.compiler import ir

from autosched.compile import CompileJob, compile_one
from autosched.config import RunConfig
from autosched.kernels.base import KernelDoesNotFit
from autosched.kernels.matmul_triton.kernel import (
    KernelParams,
    compile_ptx,
    extern_module,
    persistent_unsupported,
    split_unsupported,
    unsupported,
)
from autosched.measure.worker import Verifier, make_problem_data
from autosched.ops.matmul_kernel import KERNEL_FUNCTION
from autosched.outputs.records import problem_from_shape
from autosched.rewrite.arms import winner_arms
from autosched.rewrite.custom_functions import winner_functions
from autosched.targets import make_target

pytest.importorskip("triton")


def _problem(m, n, k, element="f16", acc="f32", batch=0, transpose_b=False, zero_init=True):
    return problem_from_shape(
        {
            "op": "linalg.batch_matmul" if batch else "linalg.matmul",
            "m": m,
            "n": n,
            "k": k,
            "batch": batch,
            "lhs_type": element,
            "rhs_type": element,
            "acc_type": acc,
            "transpose_a": False,
            "transpose_b": transpose_b,
            "zero_init": zero_init,
        }
    )


def _iree_compile(*arguments: str) -> str:
    """The real iree-compile on `arguments`; its stdout (the test fails on an error)."""
    from autosched.compile import compiler_path

    done = subprocess.run(
        [compiler_path(), *arguments], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


CASES = {
    "plain": (_problem(256, 384, 512), KernelParams(128, 128, 64, 4, 3, 8)),
    # Weights as nn.Linear stores them, bf16 in and out.
    "linear_bf16": (
        _problem(128, 256, 192, "bf16", "bf16", transpose_b=True),
        KernelParams(64, 128, 64, 4, 3, 4),
    ),
    "batched": (_problem(128, 128, 64, batch=3), KernelParams(64, 64, 32, 4, 2, 1)),
    # M, N and K that no block divides: masked loads and stores.
    "uneven": (_problem(200, 300, 100), KernelParams(64, 64, 32, 4, 2, 4)),
    # Serial split-K: a skinny product in 4 shares of K; batched, masked rows in 8 shares.
    "split_skinny": (_problem(16, 512, 1024), KernelParams(16, 32, 128, 4, 3, 8, 4)),
    "split_batched": (_problem(50, 96, 512, batch=2), KernelParams(64, 32, 64, 4, 3, 1, 8)),
    # A decode step's projection: 12 rows, weights as stored, bf16 C, K in 4 shares that add
    # up in an f32 workspace.
    "split_narrow": (
        _problem(12, 256, 1024, "bf16", "bf16", transpose_b=True),
        KernelParams(16, 64, 64, 4, 3, 8, 4),
    ),
    # A decode step's single row, a block of it alone summed on the CUDA cores (no MMA),
    # K in 2 shares into an f32 workspace; and 3 rows in blocks of 4, masked.
    "summed_row": (
        _problem(1, 256, 1024, "bf16", "bf16", transpose_b=True),
        KernelParams(1, 32, 256, 8, 3, 8, 2),
    ),
    "summed_rows": (_problem(3, 96, 512, transpose_b=True), KernelParams(4, 32, 64, 4, 3, 1)),
    # Persistent kernels loading by TMA: 6 blocks taken by 2 workgroups; weights as stored
    # with masked edges (12 blocks, 3 workgroups); a batch (3 workgroups per entry).
    "persistent": (_problem(256, 384, 512), KernelParams(128, 128, 64, 4, 3, 8, 1, 2)),
    "persistent_linear_bf16": (
        _problem(200, 300, 192, "bf16", "bf16", transpose_b=True),
        KernelParams(64, 128, 64, 4, 3, 4, 1, 3),
    ),
    "persistent_batched": (
        _problem(128, 128, 64, batch=3),
        KernelParams(64, 64, 32, 4, 2, 1, 1, 3),
    ),
    # Warp-specialized (Gluon): 6 blocks taken by 2 workgroups, B along N; weights as
    # stored, bf16 C stored by TMA past its last rows (12 blocks, 3 workgroups); a batch.
    "specialized": (_problem(256, 384, 512), KernelParams(128, 128, 64, 8, 3, 8, 1, 2, 1)),
    "specialized_linear_bf16": (
        _problem(200, 304, 192, "bf16", "bf16", transpose_b=True),
        KernelParams(64, 128, 64, 4, 3, 4, 1, 3, 1),
    ),
    "specialized_batched": (
        _problem(128, 128, 64, batch=3),
        KernelParams(64, 64, 32, 4, 2, 1, 1, 3, 1),
    ),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every case's PTX, extern module and sm_90 build."""
    folder = tmp_path_factory.mktemp("custom")
    target = make_target(RunConfig(target="cuda", arch="sm_90", ptxas="none"))
    out = {}
    for name, (problem, params) in CASES.items():
        binary = compile_ptx(problem, params, "sm_90", str(folder / f"{name}.ptx"))
        source = folder / f"{name}.mlir"
        source.write_text(
            extern_module(problem, params, binary, target.executable_target(), KERNEL_FUNCTION)
        )
        result = compile_one(
            CompileJob(str(source), str(folder / f"{name}.vmfb"), target.compile_flags()), 300
        )
        out[name] = (problem, binary, result)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_the_extern_module_builds_for_sm_90(built, name):
    problem, binary, result = built[name]
    assert result.status == "ok", result.message
    loader = 128 if CASES[name][1].specialized else 0  # the loader warp's warpgroup
    assert binary.pointers >= 3 and binary.threads == CASES[name][1].warps * 32 + loader
    ptx = open(binary.ptx_path).read()
    assert ".target sm_90a" in ptx
    # IREE embeds Triton's own cubin (an ELF file), not the PTX for the driver to compile.
    assert open(binary.cubin_path, "rb").read(4) == b"\x7fELF"
    assert binary.cubin_path in open(result.job.source).read()
    # the cubin's bytes are in the module itself: it builds wherever it is copied
    os.rename(binary.cubin_path, binary.cubin_path + ".moved")
    try:
        job = CompileJob(result.job.source, result.job.output + ".moved", result.job.flags)
        moved = compile_one(job, 300)
    finally:
        os.rename(binary.cubin_path + ".moved", binary.cubin_path)
    assert moved.status == "ok", moved.message
    assert b"\x7fELF" in open(result.job.output, "rb").read()


def test_hopper_tensor_cores_are_used(built):
    _, binary, _ = built["plain"]
    assert "wgmma" in open(binary.ptx_path).read()


def test_the_output_is_written_by_the_kernel_alone(built, tmp_path):
    """No copy into C: a zero-filled output, or a bare empty one, became a hoisted constant
    copied into C on every call, as large as C; the kernel writes every element itself."""
    problem, binary, result = built["plain"]
    flags = [f for f in result.job.flags if not f.startswith("--iree-hal-benchmark")]
    text = _iree_compile(result.job.source, *flags, "--compile-to=stream")
    assert "stream.cmd.dispatch @extern_dispatch" in text
    assert "stream.cmd.copy" not in text


@pytest.mark.parametrize("name", ["plain", "split_batched"])
def test_the_command_buffer_is_recorded_once(built, name):
    """The extern dispatch's bindings are indirect: IREE records the command buffer (the
    timed module's repeats of the dispatch) once and replays it with each call's buffers,
    as it does for its own dispatches. Bound directly, it was recorded on every call."""
    _, _, result = built[name]
    text = _iree_compile(result.job.source, *result.job.flags, "--compile-to=hal")
    (apply,) = [
        line for line in text.splitlines() if "util.func private @__main_memoize_apply" in line
    ]
    assert "@__main_memoize_apply()" in apply  # no buffers captured


def test_loads_are_asynchronous_and_pipelined(built):
    """Triton is told that IREE's bindings are 16-byte aligned: it then copies tiles with
    cp.async, one buffer per stage (3 stages of a 128x64 and a 64x128 f16 tile). Without
    that, every element was its own load and 4096^3 took 1.5 ms instead of about 0.2."""
    _, binary, _ = built["plain"]
    ptx = open(binary.ptx_path).read()
    assert "cp.async" in ptx
    assert binary.shared_bytes >= 3 * (128 * 64 + 64 * 128) * 2


def test_split_k_shares_pass_a_lock_on_in_order(built, tmp_path):
    """Split-K: one workgroup per block and share (grid z), one lock per block and batch
    entry bound after C, taken with an acquire and passed on with a release; the locks
    are zeros filled on the device, not a constant copied in."""
    problem, binary, result = built["split_batched"]
    params = CASES["split_batched"][1]
    source = open(result.job.source).read()
    assert "%z0 = arith.constant dense<0> : tensor<6xi32>" in source  # 3 blocks x 2 entries
    assert "-> (%out, %z0)" in source and f"%z = arith.constant {params.split_k}" in source
    ptx = open(binary.ptx_path).read()
    assert "atom.global.acquire.gpu.cas.b32" in ptx and "release.exch.b32" in ptx
    assert "ld.global.cg" in ptx
    flags = [f for f in result.job.flags if not f.startswith("--iree-hal-benchmark")]
    text = _iree_compile(result.job.source, *flags, "--compile-to=stream")
    assert "stream.cmd.fill" in text and "stream.cmd.copy" not in text
    # A kernel that does not split has no lock parameter at all.
    assert built["plain"][1].pointers == binary.pointers - 1


def test_persistent_kernels_load_by_tma_into_their_own_scratch(built):
    """A persistent point: its workgroups (at most one per block) loop over the blocks,
    A and B come by TMA (bulk tensor copies) through descriptors Triton writes to its
    global scratch, which the module binds written and sized for every workgroup; no
    copy or fill is added to the model for it."""
    problem, binary, result = built["persistent"]
    assert binary.entry == "persistent_matmul" and tuple(binary.workgroups) == (2, 1, 1)
    ptx = open(binary.ptx_path).read()
    assert "cp.async.bulk.tensor" in ptx and "tensormap" in ptx and "wgmma" in ptx
    assert binary.scratch_bytes > 0
    source = open(result.job.source).read()
    assert f"%g = flow.tensor.alloca : tensor<{2 * binary.scratch_bytes}xi8>" in source
    assert "-> (%out, %g)" in source
    flags = [f for f in result.job.flags if not f.startswith("--iree-hal-benchmark")]
    text = _iree_compile(result.job.source, *flags, "--compile-to=stream")
    assert "stream.cmd.copy" not in text
    fills = [line for line in text.splitlines() if "stream.cmd.fill" in line]
    assert all("for %c256]" in line for line in fills)  # the placeholder's zeros alone
    assert tuple(built["persistent_batched"][1].workgroups) == (3, 3, 1)
    # A plain kernel's scratch is a placeholder: nothing sized, nothing written.
    assert built["plain"][1].scratch_bytes == 0
    assert "%g =" not in open(built["plain"][2].job.source).read()


def test_the_ptx_compiler_runs_in_its_own_process(tmp_path):
    from autosched.outputs.records import problem_shape

    problem, params = CASES["uneven"]
    shape = problem_shape(problem)
    ptx = tmp_path / "k.ptx"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autosched.kernels.compile",
            "--family",
            "autosched.kernels.matmul_triton.family:MatmulTriton",
            "--shape",
            json.dumps(shape),
            "--params",
            json.dumps(params.__dict__),
            "--ptx",
            str(ptx),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads(done.stdout)
    assert meta["ptx_path"] == str(ptx) and meta["shared_bytes"] > 0 and ptx.exists()


def test_what_the_family_does_not_cover():
    assert "f16 or bf16" in unsupported(_problem(64, 64, 64, "f32"))
    assert "zero accumulator" in unsupported(_problem(64, 64, 64, zero_init=False))
    assert unsupported(_problem(64, 64, 64)) is None
    assert split_unsupported(_problem(64, 64, 256, acc="f16"), 32, 4) is None  # a workspace
    assert "shares of whole 32-blocks" in split_unsupported(_problem(64, 64, 96), 32, 4)
    assert split_unsupported(_problem(64, 64, 128), 32, 4) is None
    assert split_unsupported(_problem(64, 64, 96, acc="f16"), 32, 1) is None
    assert "K whole" in persistent_unsupported(_problem(64, 64, 128), 4)
    assert "16 bytes" in persistent_unsupported(_problem(64, 60, 128), 1)  # B's rows
    assert "16 bytes" in persistent_unsupported(_problem(64, 64, 60, transpose_b=True), 1)
    assert persistent_unsupported(_problem(60, 64, 64), 1) is None  # M is any


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_custom_kernels_give_numpys_answer(built, name, tmp_path):
    problem, _, result = built[name]
    check = _check_on_the_gpu(result.job.output, problem, tmp_path)
    assert check.status == "correct", check.message


def _check_on_the_gpu(vmfb: str, problem, tmp_path, timeout: float = 120):
    """The verifier's answer for a module on the GPU, against numpy."""
    data = make_problem_data(problem, str(tmp_path / "inputs"))
    verifier = Verifier("cuda")
    try:
        return verifier.check(vmfb, data, problem, timeout)
    finally:
        verifier.close()


def test_a_narrow_split_k_adds_its_shares_in_an_f32_workspace(built):
    """A bf16 C's shares of K add up in an f32 workspace bound after the locks (undefined at
    the start: the first share writes it), and the last share rounds the sum into C; a
    kernel with an f32 C adds them in C and has no workspace."""
    problem, binary, result = built["split_narrow"]
    source = open(result.job.source).read()
    assert "%w0 = flow.tensor.alloca : tensor<3072xf32>" in source  # 12 x 256 sums
    assert "-> (%out, %z0, %w0)" in source
    assert binary.pointers == built["split_skinny"][1].pointers + 1
    ptx = open(binary.ptx_path).read()
    assert "atom.global.acquire.gpu.cas.b32" in ptx and "cvt.rn.bf16" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["split_skinny", "split_narrow"])
def test_split_k_locks_are_left_at_zero_for_the_next_dispatch(built, tmp_path, name):
    """Five dispatches of a split-K kernel in one call, as a timed module runs them: a lock
    left anywhere but 0 would hang the second dispatch (the verifier's timeout), and a
    share that read C before the one ahead of it stored would give a wrong answer."""
    problem, _, result = built[name]
    flags = [*result.job.flags, "--iree-hal-benchmark-dispatch-repeat-count=5"]
    repeated = compile_one(CompileJob(result.job.source, str(tmp_path / "x5.vmfb"), flags), 300)
    assert repeated.status == "ok", repeated.message
    check = _check_on_the_gpu(repeated.job.output, problem, tmp_path, 60)
    assert check.status == "correct", check.message


def _cuda(tmp_path, triton=True):
    from autosched.targets.host import Machine

    config = hopper_config(tmp_path)
    return config, make_target(config, Machine(triton=triton))


def test_custom_kernels_join_the_space_by_default_where_they_run(tmp_path):
    from autosched.search.space import build_space

    problem, _ = CASES["plain"]
    _, target = _cuda(tmp_path)
    lists = {"pipeline": ["TileAndFuse", "Custom"]}
    space = build_space(problem, target, lists)
    custom = [p for p in space.points if p["pipeline"] == "Custom"]
    iree = [p for p in space.points if p["pipeline"] != "Custom"]
    assert custom and iree
    assert all(p["warps"] in (4, 8) and p["subgroup_m"] == 0 for p in custom)
    assert all(p["warps"] == 0 and p["group_m"] == 0 for p in iree)
    assert target.config_name(custom[0]).startswith("tr_wg")
    assert not target.in_spec(custom[0]) and target.in_spec(iree[0])
    # By default where Triton is installed (the fastest route, issue 24), unless the cfg's
    # pipeline list leaves them out; never without Triton.
    assert any(p["pipeline"] == "Custom" for p in build_space(problem, target, {}).points)
    assert "custom Triton matmul kernels searched too" in target.describe()
    assert "flash-attention kernels too" in target.describe()
    assert "runtime flags: --cuda_async_allocations=false --device_allocator=caching" in (
        target.describe()
    )  # `runtime_flags = auto`: IREE's caching allocator, named in the run's first lines
    iree_only = {"pipeline": ["TileAndFuse", "VectorDistribute"]}
    assert all(p["pipeline"] != "Custom" for p in build_space(problem, target, iree_only).points)
    _, without = _cuda(tmp_path, triton=False)
    assert all(p["pipeline"] != "Custom" for p in build_space(problem, without, {}).points)
    assert all(p["pipeline"] != "Custom" for p in build_space(problem, without, lists).points)


def test_persistent_points_are_one_workgroup_per_sm_where_tma_can_load(tmp_path):
    """The family's `persistent` knob: 0, or the arch's SMs (132 on sm_90) where TMA can
    read the operands. A persistent point's epilogue needs shared memory beside its stages:
    the space counts half a block of C, and the compile step turns away a kernel over the
    limit (128x256x64 in 3 stages with an f32 C needs 278552 bytes of sm_90's 232448; with
    a bf16 C it fits)."""
    from autosched.search.space import build_space

    _, target = _cuda(tmp_path)
    problem = _problem(512, 1024, 512, "bf16", "f32", transpose_b=True)
    space = build_space(problem, target, {"pipeline": ["Custom"]})
    persistent = [p for p in space.points if p["persistent"] and not p["specialized"]]
    assert persistent and {p["persistent"] for p in persistent} == {132}
    assert all(p["split_k"] == 1 for p in persistent)
    assert target.config_name(persistent[0]).endswith("_p132")
    blocks = {(p["tile_m"], p["tile_n"], p["tile_k"], p["pipeline_depth"]) for p in persistent}
    assert (128, 256, 64, 3) in blocks and (128, 256, 64, 4) not in blocks
    wide = KernelParams(128, 256, 64, 8, 3, 8, 1, 132)
    with pytest.raises(
        KernelDoesNotFit, match="278552 bytes of shared memory, over sm_90's 232448"
    ):
        compile_ptx(problem, wide, "sm_90", str(tmp_path / "wide.ptx"))
    narrow = _problem(512, 1024, 512, "bf16", "bf16", transpose_b=True)
    assert compile_ptx(narrow, wide, "sm_90", str(tmp_path / "n.ptx")).shared_bytes < 232448
    uneven = build_space(_problem(512, 1020, 512), target, {"pipeline": ["Custom"]})
    assert not any(p["persistent"] for p in uneven.points)  # B's rows of 2040 bytes
    # A form TMA cannot load (the model's weight read as stored, rows along K) runs the
    # winner's blocks one workgroup each.
    stored = _problem(512, 1024, 500, "bf16", "bf16", transpose_b=True)
    binary = compile_ptx(stored, wide, "sm_90", str(tmp_path / "s.ptx"))
    assert binary.entry == "matmul" and tuple(binary.workgroups) == (4 * 4, 1, 1)


def test_a_decode_steps_rows_get_blocks_of_their_own_summed_on_the_cuda_cores(tmp_path):
    """Up to 4 rows (a decode step's), the family also offers blocks of just those rows
    (M rounded up to a power of two), summed on the CUDA cores: plain kernels only, their
    products at most 64 f32 registers a thread; its known points include them. Eight rows keep the 16-row blocks of the tensor cores."""
    from autosched.search.space import build_space

    _, target = _cuda(tmp_path)
    for rows, block in ((1, 1), (3, 4)):
        problem = _problem(rows, 2048, 2048, "bf16", "f32", transpose_b=True)
        points = build_space(problem, target, {"pipeline": ["Custom"]}).points
        summed = [p for p in points if p["tile_m"] < 16]
        assert summed and {p["tile_m"] for p in summed} == {block}
        assert not any(p["persistent"] or p["specialized"] for p in summed)
        assert all(p["tile_m"] * p["tile_n"] * p["tile_k"] <= 64 * 32 * p["warps"] for p in summed)
        assert (block, 16, 256) in {(p["tile_m"], p["tile_n"], p["tile_k"]) for p in summed}
        known = target.for_problem(problem).starting_points(problem)
        assert any(p.get("tile_m") == block for p in known)
    eight = _problem(8, 2048, 2048, "bf16", "f32", transpose_b=True)
    points = build_space(eight, target, {"pipeline": ["Custom"]}).points
    assert points and min(p["tile_m"] for p in points) == 16


def test_warp_specialized_points_are_persistent_and_fit_wgmma(tmp_path):
    """The family's `specialized` knob: 1 only with a persistent point whose block is 16
    rows a warp by at most 256 columns, its f32 accumulator at most 128 registers a thread.
    Its kernel is Gluon's (`specialized_matmul`): the MMA warps and a loader warpgroup, its
    stages in shared memory and, with a bf16 C, a block of C for the TMA store; with an f32
    C that block does not fit beside 3 stages of 128x256x64, and the block is stored from
    registers. Where TMA cannot load the operands it runs the plain kernel."""
    from autosched.search.space import build_space

    _, target = _cuda(tmp_path)
    problem = _problem(512, 1024, 512, "bf16", "f32", transpose_b=True)
    points = build_space(problem, target, {"pipeline": ["Custom"]}).points
    specialized = [p for p in points if p["specialized"]]
    assert specialized and all(p["persistent"] == 132 for p in specialized)
    assert all(p["tile_m"] % (16 * p["warps"]) == 0 for p in specialized)
    blocks = {(p["tile_m"], p["tile_n"], p["warps"]) for p in specialized}
    assert (128, 256, 8) in blocks and (128, 256, 4) not in blocks and (64, 64, 8) not in blocks
    assert target.config_name(specialized[0]).endswith("_p132_ws")
    assert target.starting_points(problem)[0]["specialized"] == 1
    wide = KernelParams(128, 256, 64, 8, 3, 8, 1, 132, specialized=1)
    f32 = compile_ptx(problem, wide, "sm_90", str(tmp_path / "f32.ptx"))
    narrow = _problem(512, 1024, 512, "bf16", "bf16", transpose_b=True)
    bf16 = compile_ptx(narrow, wide, "sm_90", str(tmp_path / "bf16.ptx"))
    for binary in (f32, bf16):
        assert binary.entry == "specialized_matmul" and binary.threads == 8 * 32 + 128
        assert tuple(binary.workgroups) == (4 * 4, 1, 1)  # fewer blocks than SMs
    stages = 3 * (128 + 256) * 64 * 2
    assert stages <= f32.shared_bytes < stages + 1024  # stages and barriers
    assert bf16.shared_bytes >= stages + 128 * 256 * 2  # and a bf16 block of C
    ptx = open(bf16.ptx_path).read()
    assert "setmaxnreg" in ptx and "cp.async.bulk.tensor.2d.global.shared" in ptx
    stored = _problem(512, 1024, 500, "bf16", "bf16", transpose_b=True)
    binary = compile_ptx(stored, wide, "sm_90", str(tmp_path / "s.ptx"))
    assert binary.entry == "matmul"


def test_a_custom_point_compiles_through_the_runs_own_jobs(tmp_path):
    """The run's compile job for a custom point: Triton writes the PTX and the extern module
    in the compile pool, then iree-compile builds it (with the dispatch repeated)."""
    from autosched.compile import compile_all
    from autosched.run.tuning import Tuning
    from autosched.search.space import build_space

    problem, _ = CASES["uneven"]
    config, target = _cuda(tmp_path)
    space = build_space(problem, target, {"pipeline": ["Custom"], "tile_k": [32]})
    points = space.points[:2]
    tuning = Tuning(config, target, resume=False)
    try:
        jobs = [tuning.builds.kernel_job(problem, target.config_name(p), p, 20) for p in points]
        results = list(compile_all(jobs, 300, 2))
    finally:
        tuning.close()
    assert [r.status for r in results] == ["ok", "ok"], [r.message for r in results]
    for job in jobs:
        assert "hal.dispatch.extern" in open(job.source).read()


@pytest.mark.gpu
def test_a_run_searches_custom_kernels_on_the_gpu(tmp_path, monkeypatch):
    """`pipeline = [Custom]`: every custom candidate is built, checked against numpy and
    timed like IREE's; a custom winner is named and said to be missing from the spec."""
    from click.testing import CliRunner
    from conftest import matmul_function

    from autosched.cli import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.mlir").write_text(matmul_function("mm", 512, 512, 512, "f16", "f32"))
    (tmp_path / "auto-scheduler.cfg").write_text(
        "[Env]\ntarget = cuda\narch = sm_90\n[SearchSpace.cuda]\npipeline = [Custom]\n"
        "tile_m = [64, 128]\ntile_n = [128]\ntile_k = [64]\n[SearchStrategy]\nn_trial = 4\n"
        "[Benchmark]\nrepetitions = 2\nmin_time = 0.01\ntimer = worker\n"
    )
    result = CliRunner().invoke(cli, ["run", "mm.mlir"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in open("generated/mm/tuning.jsonl")]
    custom = [r for r in records if r["config"].startswith("tr_")]
    assert len(custom) == 4 and all(r["status"] == "ok" for r in custom), records
    if "custom-kernel winners" in result.output:  # one beat IREE's default
        assert "hal.dispatch.extern" in open("generated/mm/results.custom.mlir").read()


def test_custom_winners_replace_their_ops_before_dispatches_form(tmp_path):
    """The preprocessing spec puts the kernel in place of the zero-filled matmul it was
    tuned for; a matmul of the same types that accumulates into an input keeps IREE's
    code (the family starts from zero)."""
    from autosched.rewrite.apply import SPEC_FLAG
    from autosched.rewrite.spec import write_substitution
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    problem, params = CASES["plain"]
    point = {
        "tile_m": params.block_m,
        "tile_n": params.block_n,
        "tile_k": params.block_k,
        "warps": params.warps,
        "pipeline_depth": params.stages,
        "group_m": params.group_m,
    }
    spec = str(tmp_path / "results.custom.mlir")
    assert write_substitution(spec, [(problem, point)], target) == []
    device = target.module_attributes()["hal.device.targets"]
    t = "tensor<256x384xf32>"
    (tmp_path / "model.mlir").write_text(
        f"module attributes {{hal.device.targets = {device}}} {{\n"
        f"  func.func @main(%a: tensor<256x512xf16>, %b: tensor<512x384xf16>, %acc: {t})"
        f" -> ({t}, {t}) {{\n"
        "    %zero = arith.constant 0.0 : f32\n"
        f"    %e = tensor.empty() : {t}\n"
        f"    %f = linalg.fill ins(%zero : f32) outs(%e : {t}) -> {t}\n"
        "    %r = linalg.matmul ins(%a, %b : tensor<256x512xf16>, tensor<512x384xf16>)"
        f" outs(%f : {t}) -> {t}\n"
        "    %r2 = linalg.matmul ins(%a, %b : tensor<256x512xf16>, tensor<512x384xf16>)"
        f" outs(%acc : {t}) -> {t}\n"
        f"    return %r, %r2 : {t}, {t}\n  }}\n}}\n"
    )
    text = _iree_compile(
        str(tmp_path / "model.mlir"),
        *target.compile_flags(),
        f"{SPEC_FLAG}={spec}",
        "--compile-to=flow",
    )
    assert text.count("flow.dispatch @extern_dispatch") == 1  # the zero-filled one
    assert text.count("_matmul_256x384x512") >= 1  # the accumulating one: IREE's dispatch


LINEAR_MODEL = """
func.func @main(%x: tensor<256x512xf16>, %w: tensor<384x512xf16>) -> tensor<256x384xf16> {
  %e = tensor.empty() : tensor<512x384xf16>
  %t = linalg.transpose ins(%w : tensor<384x512xf16>) outs(%e : tensor<512x384xf16>)
      permutation = [1, 0]
  %zero = arith.constant 0.0 : f16
  %o = tensor.empty() : tensor<256x384xf16>
  %f = linalg.fill ins(%zero : f16) outs(%o : tensor<256x384xf16>) -> tensor<256x384xf16>
  %r = linalg.matmul ins(%x, %t : tensor<256x512xf16>, tensor<512x384xf16>)
      outs(%f : tensor<256x384xf16>) -> tensor<256x384xf16>
  %s = math.sin %r : tensor<256x384xf16>
  return %s : tensor<256x384xf16>
}
"""


def test_a_models_contraction_is_replaced_where_its_dispatch_form_is_known(tmp_path):
    """A model (nn.Linear as torch lowers it: a transposed weight, then a matmul) is found as
    the transposed-B matmul IREE's dispatch holds; the spec written for that problem replaces
    it once the model is lowered to global optimization, and iree-compile goes on from there
    to an sm_90 module with the kernel as a custom dispatch."""
    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.lowering import analyze_model
    from autosched.rewrite.apply import RESUME_FLAG, SPEC_FLAG, rewrite_model
    from autosched.rewrite.spec import write_substitution
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    (tmp_path / "linear.mlir").write_text(LINEAR_MODEL)
    model = model_for_target(str(tmp_path / "linear.mlir"), target, str(tmp_path / "work"))
    (contraction,) = analyze_model(model, target.compile_flags()).contractions
    problem = contraction.as_matmul_problem()
    assert problem.transpose_b and (problem.m, problem.n, problem.k) == (256, 384, 512)
    point = {"tile_m": 128, "tile_n": 128, "tile_k": 64, "warps": 4, "pipeline_depth": 3}
    spec = str(tmp_path / "results.custom.mlir")
    assert write_substitution(spec, [(problem, {**point, "group_m": 8})], target) == []
    flags = target.compile_flags()
    rewritten, replaced = rewrite_model(model, spec, flags, str(tmp_path / "rewritten.mlir"), 300)
    assert replaced == 1
    _iree_compile(rewritten, *flags, RESUME_FLAG, "-o", str(tmp_path / "model.vmfb"))
    # The same spec on the model as written (before global optimization) finds nothing: its
    # matmul there takes the transposed copy, not the weight.
    plain = tmp_path / "plain.mlir"
    _iree_compile(model, *flags, "--compile-to=input", "-o", str(plain))
    flow = _iree_compile(str(plain), *flags, f"{SPEC_FLAG}={spec}", "--compile-to=flow")
    assert "hal.dispatch.extern" not in flow


TWO_LAYERS = """
func.func @main(%x: tensor<256x512xf16>, %w: tensor<512x512xf16>, %v: tensor<512x512xf16>)
    -> tensor<256x512xf16> {
  %zero = arith.constant 0.0 : f16
  %o = tensor.empty() : tensor<256x512xf16>
  %f = linalg.fill ins(%zero : f16) outs(%o : tensor<256x512xf16>) -> tensor<256x512xf16>
  %h = linalg.matmul ins(%x, %w : tensor<256x512xf16>, tensor<512x512xf16>)
      outs(%f : tensor<256x512xf16>) -> tensor<256x512xf16>
  %s = math.sin %h : tensor<256x512xf16>
  %r = linalg.matmul ins(%s, %v : tensor<256x512xf16>, tensor<512x512xf16>)
      outs(%f : tensor<256x512xf16>) -> tensor<256x512xf16>
  return %r : tensor<256x512xf16>
}
"""


def test_custom_kernels_keep_the_model_in_one_command_buffer(tmp_path):
    """Two contractions replaced by custom dispatches: the model's device work is still one
    command buffer, with no copy into either output. A barrier on the output tensor made
    each custom dispatch end the command buffer (a host-side step between them)."""
    rewritten, text = _rewritten_to_stream(tmp_path, TWO_LAYERS, replaced=2)
    assert text.count("stream.cmd.dispatch @extern_dispatch") == 2
    assert text.count("stream.cmd.execute") == 1
    assert "stream.cmd.copy" not in text
    # ...recorded once at load and replayed with each call's buffers, as a model without
    # custom dispatches is (their bindings are indirect).
    from autosched.rewrite.apply import RESUME_FLAG

    flags = make_target(RunConfig(target="cuda", arch="sm_90")).compile_flags()
    hal = _iree_compile(rewritten, *flags, RESUME_FLAG, "--compile-to=hal")
    assert "util.func private @__main_memoize_apply() ->" in hal


def _model_with_custom_spec(folder, text: str = LINEAR_MODEL) -> tuple[str, str, str]:
    """A model (LINEAR_MODEL unless `text`) with its one contraction problem, and a
    custom-kernel spec for that problem as a run writes it: (the model as written, the model
    lowered for sm_90, the spec)."""
    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.lowering import analyze_model
    from autosched.rewrite.spec import write_substitution
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    (folder / "model.mlir").write_text(text)
    model = model_for_target(str(folder / "model.mlir"), target, str(folder / "work"))
    (contraction,) = analyze_model(model, target.compile_flags()).contractions
    point = {"tile_m": 64, "tile_n": 64, "tile_k": 64, "warps": 4, "pipeline_depth": 3}
    spec = str(folder / "results.custom.mlir")
    problem = contraction.as_matmul_problem()
    assert write_substitution(spec, [(problem, {**point, "group_m": 8})], target) == []
    return str(folder / "model.mlir"), model, spec


def _rewritten_to_stream(folder, text: str, replaced: int) -> tuple[str, str]:
    """The model rewritten with its custom spec (`replaced` contractions, checked), and the
    stream IR iree-compile makes of it: (rewritten module path, stream text)."""
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model

    _, model, spec = _model_with_custom_spec(folder, text)
    flags = make_target(RunConfig(target="cuda", arch="sm_90")).compile_flags()
    rewritten, count = rewrite_model(model, spec, flags, str(folder / "rewritten.mlir"), 300)
    assert count == replaced
    return rewritten, _iree_compile(rewritten, *flags, RESUME_FLAG, "--compile-to=stream")


@pytest.mark.gpu
@pytest.mark.parametrize(("layers", "replaced"), [("linear", 1), ("f32 then truncf", 2)])
def test_a_model_with_its_custom_kernel_gives_the_default_builds_outputs(
    tmp_path, monkeypatch, layers, replaced
):
    """`autosched apply MODEL --custom SPEC` on the GPU: the third build runs the kernel in
    place of the model's contractions (for f32 accumulators truncated to f16, the kernel
    that stores f16 itself), and its outputs match IREE's default build."""
    from click.testing import CliRunner

    from autosched.cli import cli

    monkeypatch.chdir(tmp_path)
    text = LINEAR_MODEL if layers == "linear" else _narrowing_model(second_use=False)
    model, _, spec = _model_with_custom_spec(tmp_path, text)
    result = CliRunner().invoke(cli, ["apply", model, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert f"with custom kernels ({replaced} op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


@pytest.mark.parametrize(("custom_ms", "substituted"), [(0.05, True), (0.2, False)])
def test_a_custom_kernel_replaces_a_contraction_only_under_iree_s_best(
    tmp_path, custom_ms, substituted
):
    """After a model's campaign, a custom kernel goes into results.custom.mlir only when its
    time is under the best IREE dispatch time of its problem (0.1 ms here)."""
    from autosched.drivers.campaign import ModelProblem
    from autosched.drivers.custom_route import write_custom_spec
    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.lowering import analyze_model
    from autosched.outputs.records import Trial
    from autosched.outputs.report import RunLog
    from autosched.run.problem import ProblemResult
    from autosched.search.space import build_space
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    (tmp_path / "linear.mlir").write_text(LINEAR_MODEL)
    model = model_for_target(str(tmp_path / "linear.mlir"), target, str(tmp_path / "work"))
    (contraction,) = analyze_model(model, target.compile_flags()).contractions
    problem = contraction.as_matmul_problem()
    space = build_space(problem, target, {"pipeline": ["TileAndFuse", "Custom"]})
    iree = next(p for p in space.points if target.in_spec(p))
    custom = next(p for p in space.points if not target.in_spec(p))

    def result(point, ms) -> ProblemResult:
        name = target.config_name(point)
        best = Trial(problem.name, "cuda", "sm_90", name, point, False, "ok", median_ms=ms)
        return ProblemResult(problem, space, [best], best=best, best_ms=ms, baseline_ms=0.3)

    entry = ModelProblem(problem, contraction, result=result(iree, 0.1))
    log = RunLog(str(tmp_path / "run.log"))
    spec = str(tmp_path / "results.custom.mlir")
    found = {problem.name: result(custom, custom_ms)}
    written = write_custom_spec(spec, target, [entry], found, log)
    assert (written == spec) is substituted
    if not substituted:
        assert "not under IREE's" in (tmp_path / "run.log").read_text()


def _narrowing_model(second_use: bool) -> str:
    """Two f16 layers as torch exports them: f32 accumulators, each result truncated to f16
    (with `second_use`, the first layer's f32 result is also returned)."""
    t32, t16, w = "tensor<256x512xf32>", "tensor<256x512xf16>", "tensor<512x512xf16>"
    identity = "affine_map<(i, j) -> (i, j)>"

    def layer(out: str, lhs: str, rhs: str) -> str:
        return (
            f"  %{out}_f32 = linalg.matmul ins({lhs}, {rhs} : {t16}, {w}) outs(%f : {t32})"
            f" -> {t32}\n"
            f"  %{out} = linalg.generic {{indexing_maps = [{identity}, {identity}], "
            f'iterator_types = ["parallel", "parallel"]}} ins(%{out}_f32 : {t32}) '
            f"outs(%e16 : {t16}) {{\n"
            "  ^bb0(%a: f32, %b: f16):\n"
            "    %c = arith.truncf %a : f32 to f16\n"
            "    linalg.yield %c : f16\n"
            f"  }} -> {t16}\n"
        )

    results = f"%y, %h_f32 : {t16}, {t32}" if second_use else f"%y : {t16}"
    types = f"({t16}, {t32})" if second_use else t16
    return (
        f"func.func @main(%x: {t16}, %w: {w}, %v: {w}) -> {types} {{\n"
        "  %zero = arith.constant 0.0 : f32\n"
        f"  %e = tensor.empty() : {t32}\n"
        f"  %e16 = tensor.empty() : {t16}\n"
        f"  %f = linalg.fill ins(%zero : f32) outs(%e : {t32}) -> {t32}\n"
        + layer("h", "%x", "%w")
        + layer("y", "%h", "%v")
        + f"  return {results}\n}}\n"
    )


@pytest.mark.parametrize("second_use", [False, True])
def test_a_contraction_and_its_truncf_become_one_narrow_kernel(tmp_path, second_use):
    """f32 accumulation truncated to f16 (torch's f16 layers): the truncf goes into the
    kernel, which stores f16 itself, so no f32 tensor is written and read again. Where the
    f32 result has another user, that layer keeps the f32 kernel and its truncf."""
    from autosched.model.lowering import walk_ops

    rewritten, text = _rewritten_to_stream(tmp_path, _narrowing_model(second_use), replaced=2)
    module = ir.Module.parseFile(rewritten, ir.Context())
    externs = [op for op in walk_ops(module.operation) if op.name == "hal.dispatch.extern"]
    narrow = [op for op in externs if str(op.results[0].type).endswith("xf16>")]
    truncs = [op for op in walk_ops(module.operation) if op.name == "arith.truncf"]
    assert (len(narrow), len(truncs)) == ((1, 1) if second_use else (2, 0))
    assert text.count("stream.cmd.execute") == 1 and "stream.cmd.copy" not in text


def test_a_dry_run_of_the_custom_family_sweep_writes_no_custom_variant(tmp_path, monkeypatch):
    """`--dry-run` runs no compiler: custom points, whose modules Triton writes at compile
    time, are counted and not written (they were an internal error), and the shipped sweep
    cfg covers the whole family."""
    from click.testing import CliRunner

    from autosched.cli import cli

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli,
        [
            "run",
            os.path.join(root, "examples/matmul_f16_4096.mlir"),
            "--config",
            os.path.join(root, "configs/cuda_custom_sweep.cfg"),
            "--dry-run",
            "--arch",
            "sm_90",
        ],
    )
    assert result.exit_code == 0, result.output
    # 320 points, and 108 of them warp-specialized too
    assert "428 valid, 0 variants written (428 custom kernels not" in result.output


LLAMA_BF16 = os.path.join(os.path.dirname(__file__), "data", "models", "hf_llama_layer_bf16.mlirbc")


def _llama_with_narrow_spec(folder, reshapes: bool) -> tuple[str, str]:
    """transformers' Llama layer (bf16) lowered for sm_90 and a custom-kernel spec for its
    q and o projection problem (1 x 64 x 128 x 128), written with the model's reshape
    chains or without: (the model, the spec)."""
    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.lowering import analyze_model
    from autosched.rewrite.narrow_reshapes import ReshapeChain, model_reshape_chains
    from autosched.rewrite.spec import write_substitution
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    model = model_for_target(LLAMA_BF16, target, str(folder / "work"))
    found = [
        c.as_matmul_problem() for c in analyze_model(model, target.compile_flags()).contractions
    ]
    problem = next(p for p in found if p.name == "batch_matmul_1x64x128x128_bf16_bf16_f32")
    chains = model_reshape_chains(model, target.compile_flags(), str(folder / "narrow"))
    expected = [ReshapeChain(1, (64, 128)), ReshapeChain(2, (64, 4, 32))]  # o, q split in heads
    assert sorted(chains["tensor<1x64x128xf32>"]) == expected
    point = {
        "tile_m": 64,
        "tile_n": 64,
        "tile_k": 64,
        "warps": 4,
        "pipeline_depth": 3,
        "group_m": 8,
    }
    spec = str(folder / "results.custom.mlir")
    assert write_substitution(spec, [(problem, point)], target, chains if reshapes else None) == []
    return model, spec


@pytest.mark.parametrize("reshapes", [True, False])
def test_a_truncf_behind_reshapes_goes_into_the_narrow_kernel(tmp_path, reshapes):
    """torch's nn.Linear on a 3-D input: the unit-batch contraction's f32 result is collapsed
    (and split into heads for q) before its truncf. With the model's reshape chains the
    narrow kernel takes over each truncf, its bf16 result reshaped, so no truncf of a custom
    kernel's result is left for IREE to run (0.48 ms of a Llama-3-8B layer on the H200);
    without them both kernels write f32 and IREE truncates it, as before."""
    from autosched.model.lowering import walk_ops
    from autosched.rewrite.apply import RESUME_FLAG, rewrite_model
    from autosched.rewrite.narrow_reshapes import truncf_chains

    model, spec = _llama_with_narrow_spec(tmp_path, reshapes)
    flags = make_target(RunConfig(target="cuda", arch="sm_90")).compile_flags()
    rewritten, replaced = rewrite_model(model, spec, flags, str(tmp_path / "rw.mlir"), 300)
    assert replaced == 2  # q and o share the problem
    module = ir.Module.parseFile(rewritten, ir.Context())
    externs = [
        str(op.results[0].type)
        for op in walk_ops(module.operation)
        if op.name == "hal.dispatch.extern"
    ]
    assert externs == ["tensor<1x64x128xbf16>" if reshapes else "tensor<1x64x128xf32>"] * 2
    left = [c for op, c in truncf_chains(module) if op.name == "hal.dispatch.extern"]
    assert len(left) == (0 if reshapes else 2)
    _iree_compile(rewritten, *flags, RESUME_FLAG, "--compile-to=stream")


@pytest.mark.gpu
def test_narrow_kernels_behind_reshapes_give_the_default_builds_outputs(tmp_path, monkeypatch):
    """On the GPU: the Llama layer with its q and o projections as narrow kernels whose
    results are reshaped in place of the truncfs gives IREE's default build's outputs."""
    from click.testing import CliRunner

    from autosched.cli import cli

    monkeypatch.chdir(tmp_path)
    _, spec = _llama_with_narrow_spec(tmp_path, reshapes=True)
    result = CliRunner().invoke(cli, ["apply", LLAMA_BF16, "--custom", spec, "--target", "cuda"])
    assert result.exit_code == 0, result.output
    assert "with custom kernels (2 op(s) replaced)" in result.output
    assert "outputs match" in result.output.split("with custom kernels")[1]


def test_a_runs_custom_spec_reads_the_models_reshapes(tmp_path):
    """The run's own spec writer (`write_custom_spec` with the model) lowers the model once
    more and gives the narrow kernel its reshape arms: a model run reaches the truncfs the
    test above reaches by hand."""
    from autosched.drivers.campaign import ModelProblem
    from autosched.drivers.custom_route import write_custom_spec
    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.lowering import analyze_model
    from autosched.outputs.records import Trial
    from autosched.outputs.report import RunLog
    from autosched.run.problem import ProblemResult
    from autosched.search.space import build_space
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    model = model_for_target(LLAMA_BF16, target, str(tmp_path / "work"))
    contraction = next(
        c
        for c in analyze_model(model, target.compile_flags()).contractions
        if c.as_matmul_problem().name == "batch_matmul_1x64x128x128_bf16_bf16_f32"
    )
    problem = contraction.as_matmul_problem()
    space = build_space(problem, target, {"pipeline": ["TileAndFuse", "Custom"]})
    point = next(p for p in space.points if not target.in_spec(p))
    name = target.config_name(point)
    best = Trial(problem.name, "cuda", "sm_90", name, point, False, "ok", median_ms=0.05)
    found = ProblemResult(problem, space, [best], best=best, best_ms=0.05, baseline_ms=0.3)
    entry = ModelProblem(problem, contraction, result=found)
    spec = str(tmp_path / "results.custom.mlir")
    log = RunLog(str(tmp_path / "run.log"))
    model_and_work = (model, str(tmp_path / "model"))
    assert write_custom_spec(spec, target, [entry], {problem.name: found}, log, model_and_work)
    text = open(spec).read()
    assert "@match_narrow_stored_0_r1" in text and "flow.tensor.reshape" in text


def test_custom_kernels_are_timed_in_the_form_the_model_runs(tmp_path):
    """The Llama layer's matmuls whose dispatches truncate their f32 result to bf16 (q and
    o, gate and up, down) have their custom kernels timed narrow, a bf16 C, as the model's
    substitution writes them; k and v, which keep f32 in their dispatch, as they are. The
    spec still replaces the model's own problem."""
    from autosched.drivers.campaign import ModelProblem
    from autosched.drivers.custom_route import timed_form
    from autosched.drivers.model_stages.prepare import model_for_target
    from autosched.model.lowering import analyze_model
    from autosched.targets.cuda import CudaTarget
    from autosched.targets.host import Machine

    target = CudaTarget(RunConfig(target="cuda", arch="sm_90"), Machine(triton=True))
    model = model_for_target(LLAMA_BF16, target, str(tmp_path / "work"))
    contractions = analyze_model(model, target.compile_flags()).contractions
    timed = {
        c.as_matmul_problem().name: timed_form(ModelProblem(c.as_matmul_problem(), c)).acc_type
        for c in contractions
    }
    assert timed == {
        "batch_matmul_1x64x128x128_bf16_bf16_f32": "bf16",  # q and o
        "batch_matmul_1x64x64x128_bf16_bf16_f32": "f32",  # k and v
        "batch_matmul_1x64x256x128_bf16_bf16_f32": "bf16",  # gate and up
        "batch_matmul_1x64x128x256_bf16_bf16_f32": "bf16",  # down
    }


def test_a_winner_whose_f32_kernel_does_not_fit_keeps_its_bf16_form(tmp_path):
    """The BERT zoo model's case: a persistent winner timed with a narrow C (bf16) whose
    f32 form needs 278552 bytes of sm_90's 232448. Its narrow kernel replaces the ops that
    round their result; the plain form is left out (IREE keeps an op that does not round);
    a point whose narrow form does not fit either is refused with the reason."""
    from autosched.kernels.registry import family_of
    from autosched.rewrite.replacements import ModelForms, build_substitute

    problem = _problem(512, 1024, 512, "bf16", "f32", transpose_b=True)
    wide = {"tile_m": 128, "tile_n": 256, "tile_k": 64, "warps": 8, "pipeline_depth": 3,
            "group_m": 8, "split_k": 1, "persistent": 132}  # fmt: skip
    family, forms = family_of(wide, "matmul"), ModelForms({}, {}, {}, {}, {})
    substitute = build_substitute(family, problem, wide, forms, "sm_90", str(tmp_path / "w"))
    assert substitute.binary is None and substitute.narrow is not None
    assert substitute.narrow[0].acc_type == "bf16"
    assert substitute.narrow[1].shared_bytes <= 232448
    functions = "\n".join(winner_functions(0, substitute, "#executable"))
    assert "@autosched_custom_0_narrow(" in functions and "@autosched_custom_0(" not in functions
    arms = winner_arms(0, substitute)
    assert arms[1] and not arms[2]  # narrow arms, no plain one
    deeper = {**wide, "pipeline_depth": 5}  # 5 stages of A and B alone: 245760 bytes
    with pytest.raises(KernelDoesNotFit, match="shared memory"):
        build_substitute(family, problem, deeper, forms, "sm_90", str(tmp_path / "d"))


def test_summed_blocks_give_torchs_answer_in_tritons_interpreter():
    """A decode step's blocks summed on the CUDA cores, run by Triton's interpreter on the
    CPU against torch: one row whole and in 4 shares of K, and 3 rows in a block of 4
    (masked). Needs torch, as the interpreter does."""
    pytest.importorskip("torch")
    from test_row_norms import interpreted_errors

    cases = [
        (1, 96, 256, (1, 32, 64), 1, None),
        (1, 64, 256, (1, 16, 64), 4, None),
        (3, 96, 64, (4, 32, 32), 1, None),
    ]
    assert max(interpreted_errors(cases)) < 2e-3  # f16's rounding of C
