"""A family of Triton matmul kernels that IREE runs as custom dispatches (issue 12).

IREE 3.13 has no Hopper tensor-core (wgmma) pipeline; Triton does. A kernel of this family
is compiled by Triton for sm_90a (wgmma, no TMA; its cubin) and wrapped in an IREE module as a
`hal.dispatch.extern` with the same signature as autosched's kernel modules, so it is
checked and timed like every other candidate. Its parameters (block sizes, warps, stages,
the launch-order group) are what a tuner searches.

Facts the module text relies on (../shared/probes/README.md, measured on the H200): launch
settings go in the extern op's properties; dynamic shared memory beyond 48 KB is granted
through `workgroup_local_memory`; bindings are the kernel's pointer parameters in operand
order, the output tied so that it is the third; Triton's hidden scratch pointers are extra
small operands.

Triton is an optional extra (`autosched[triton]`); `python -m autosched.triton_kernels` is
the PTX compiler the compile step runs, in its own process, for each point.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass

from autosched.analysis import MatmulProblem
from autosched.errors import UserError
from autosched.manifest import tensor_type

TRITON_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}
INPUT_TYPES = ("f16", "bf16")  # the tensor-core inputs the family covers
OUTPUT_TYPES = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class KernelParams:
    """One point of the family."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    group_m: int  # rows of blocks launched together, for L2 reuse
    split_k: int = 1  # workgroups that share one block's K, adding up in turn (serial split-K)

    @property
    def name(self) -> str:
        split = f"_k{self.split_k}" if self.split_k > 1 else ""
        return (
            f"tr_b{self.block_m}x{self.block_n}x{self.block_k}_w{self.warps}"
            f"_s{self.stages}_g{self.group_m}{split}"
        )

    @classmethod
    def from_point(cls, point: dict) -> KernelParams:
        """A custom point of the CUDA target's space (a record older than split_k has
        none: K whole)."""
        return cls(
            block_m=point["tile_m"],
            block_n=point["tile_n"],
            block_k=point["tile_k"],
            warps=point["warps"],
            stages=point["pipeline_depth"],
            group_m=point["group_m"],
            split_k=max(point.get("split_k", 1), 1),
        )


@dataclass(frozen=True)
class KernelBinary:
    """What Triton produced for one point: PTX on disk and its launch needs."""

    ptx_path: str  # Triton's PTX, kept to read what it made
    cubin_path: str  # Triton's own machine code (its bundled ptxas): what IREE embeds
    entry: str  # the PTX entry point
    pointers: int  # pointer parameters: a, b, c, then Triton's scratch pointers
    shared_bytes: int  # dynamic shared memory per workgroup
    threads: int  # threads per workgroup (warps x 32)


def unsupported(problem: MatmulProblem) -> str | None:
    """Why the family cannot compute this problem, or None."""
    if problem.lhs_type not in INPUT_TYPES or problem.rhs_type != problem.lhs_type:
        return f"custom kernels take f16 or bf16 inputs, not {problem.lhs_type}"
    if problem.acc_type not in OUTPUT_TYPES:
        return f"custom kernels write f32, f16 or bf16, not {problem.acc_type}"
    if not problem.zero_init:
        return "custom kernels start from a zero accumulator"
    return None


def split_unsupported(problem: MatmulProblem, block_k: int, split_k: int) -> str | None:
    """Why K cannot be split in `split_k` shares, or None: the shares add up in C itself,
    so C must be f32, and each share must be whole blocks of K."""
    if split_k == 1:
        return None
    if problem.acc_type != "f32":
        return f"split-K adds up in C, which must be f32, not {problem.acc_type}"
    if problem.k % (split_k * block_k):
        return f"split-K needs K ({problem.k}) in {split_k} shares of whole {block_k}-blocks"
    return None


def import_triton():
    # Triton 3.9 warns unless the FP-fusion default is named; keep its long-standing one.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        import triton
    except ImportError:
        raise UserError(
            "custom kernels need Triton, an optional extra: pip install 'autosched[triton]'"
        ) from None
    return triton


def _strides(problem: MatmulProblem) -> dict[str, int]:
    """Element strides of A, B and C (batch, row, column), from the problem's layout."""
    m, n, k = problem.m, problem.n, problem.k
    a_m, a_k = (1, m) if problem.transpose_a else (k, 1)
    b_k, b_n = (1, k) if problem.transpose_b else (n, 1)
    return {
        "sab": m * k,
        "sam": a_m,
        "sak": a_k,
        "sbb": k * n,
        "sbk": b_k,
        "sbn": b_n,
        "scb": m * n,
        "scm": n,
        "scn": 1,
    }


def _kernel():
    """The Triton kernel (defined here so that importing this module needs no Triton)."""
    triton = import_triton()
    import triton.language as tl

    @triton.jit
    def matmul(
        a,
        b,
        c,
        locks,
        M: tl.constexpr,
        N: tl.constexpr,
        K: tl.constexpr,
        sab: tl.constexpr,
        sam: tl.constexpr,
        sak: tl.constexpr,
        sbb: tl.constexpr,
        sbk: tl.constexpr,
        sbn: tl.constexpr,
        scb: tl.constexpr,
        scm: tl.constexpr,
        scn: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        G: tl.constexpr,
        EVEN: tl.constexpr,
        SPLIT: tl.constexpr,
        K_PART: tl.constexpr,
    ):
        pid = tl.program_id(0)
        batch = tl.program_id(1)
        # This workgroup's share of K (serial split-K). A constant 0 when K is whole, so
        # that the kernel is the one without split-K, instruction for instruction.
        if SPLIT > 1:
            part = tl.program_id(2)
        else:
            part = 0
        blocks_m = tl.cdiv(M, BM)
        blocks_n = tl.cdiv(N, BN)
        group = pid // (G * blocks_n)
        first = group * G
        size = min(blocks_m - first, G)
        pm = first + (pid % (G * blocks_n)) % size
        pn = (pid % (G * blocks_n)) // size
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = part * K_PART + tl.arange(0, BK)
        pa = a + batch * sab + rm[:, None] * sam + rk[None, :] * sak
        pb = b + batch * sbb + rk[:, None] * sbk + rn[None, :] * sbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K_PART, BK):
            if EVEN:  # M, N and K are multiples of the blocks: no masks
                x = tl.load(pa)
                y = tl.load(pb)
            else:
                x = tl.load(pa, mask=(rm[:, None] < M) & (rk[None, :] + k < K), other=0.0)
                y = tl.load(pb, mask=(rk[:, None] + k < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
            pa += BK * sak
            pb += BK * sbk
        out = c + batch * scb + rm[:, None] * scm + rn[None, :] * scn
        if SPLIT > 1:
            # The block's K shares add up in order, as CUTLASS's serial split-K does: share
            # s waits until the block's lock reads s, adds what C holds, stores, and passes
            # the lock on; the last share sets it back to 0 for the next call. Share s-1 is
            # launched before share s (z is the slowest grid axis; CUDA starts blocks in
            # order, which CUTLASS relies on too), so the wait ends.
            lock = locks + batch * tl.num_programs(0) + pid
            if part > 0:
                while tl.atomic_cas(lock, part, part, sem="acquire") != part:
                    pass
                inside = (rm[:, None] < M) & (rn[None, :] < N)
                # From L2 (.cg): an SM's L1 does not see another SM's stores.
                acc += tl.load(out, mask=inside, cache_modifier=".cg")
        value = acc.to(c.dtype.element_ty)
        if EVEN:
            tl.store(out, value)
        else:
            tl.store(out, value, mask=(rm[:, None] < M) & (rn[None, :] < N))
        if SPLIT > 1:
            tl.debug_barrier()  # every thread's store lands before the lock moves on
            tl.atomic_xchg(lock, (part + 1) % SPLIT, sem="release")

    return matmul


def grid(problem: MatmulProblem, params: KernelParams) -> tuple[int, int, int]:
    """Workgroups: one per output block, times the batch, times the shares of K."""
    return blocks(problem, params), max(problem.batch, 1), params.split_k


def blocks(problem: MatmulProblem, params: KernelParams) -> int:
    """Output blocks of one batch entry."""
    return math.ceil(problem.m / params.block_m) * math.ceil(problem.n / params.block_n)


def compile_ptx(problem: MatmulProblem, params: KernelParams, arch: str, path: str) -> KernelBinary:
    """Triton's PTX for one point, written to `path` (no GPU needed)."""
    triton = import_triton()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _kernel()
    element, output = TRITON_TYPES[problem.lhs_type], TRITON_TYPES[problem.acc_type]
    why = split_unsupported(problem, params.block_k, params.split_k)
    if why:
        raise UserError(f"{params.name}: {why}")
    k_part = problem.k // params.split_k if params.split_k > 1 else problem.k
    even = (
        problem.m % params.block_m == 0
        and problem.n % params.block_n == 0
        and problem.k % params.block_k == 0
    )
    constants = {
        "M": problem.m,
        "N": problem.n,
        "K": problem.k,
        **_strides(problem),
        "BM": params.block_m,
        "BN": params.block_n,
        "BK": params.block_k,
        "G": params.group_m,
        "EVEN": even,
        "SPLIT": params.split_k,
        "K_PART": k_part,
    }
    signature = {"a": f"*{element}", "b": f"*{element}", "c": f"*{output}", "locks": "*i32"}
    if params.split_k == 1:
        constants["locks"] = None  # no lock pointer in the kernel's parameters
    signature.update({name: "constexpr" for name in constants})
    # IREE's bindings are 16-byte aligned. Told so, Triton loads with vector and
    # asynchronous copies and pipelines its stages; untold, each element is its own load
    # (1.5 ms instead of about 0.2 at 4096^3 f16 on the H200).
    aligned = {(index,): [["tt.divisibility", 16]] for index in range(3)}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
    capability = int(arch.removeprefix("sm_"))
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", capability, 32),
        options={
            "num_warps": params.warps,
            "num_stages": params.stages,
        },
    )
    ptx = compiled.asm["ptx"]
    entry = re.search(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx, re.S)
    if entry is None:
        raise RuntimeError("Triton's PTX has no entry point")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(ptx)
    # IREE embeds Triton's cubin, not its PTX: at 4096^3 f16 on the H200 the same kernel
    # assembled from PTX ISA 8.4 by CUDA 13.0's ptxas (or the driver) ran 0.254 ms in IREE,
    # launched by Triton from its own build 0.210 ms.
    cubin = os.path.splitext(os.path.abspath(path))[0] + ".cubin"
    with open(cubin, "wb") as handle:
        handle.write(compiled.asm["cubin"])
    return KernelBinary(
        ptx_path=os.path.abspath(path),
        cubin_path=cubin,
        entry=entry.group(1),
        pointers=entry.group(2).count(".param"),
        shared_bytes=int(compiled.metadata.shared),
        threads=params.warps * 32,
    )


def extern_function(
    problem: MatmulProblem,
    params: KernelParams,
    binary: KernelBinary,
    executable_target: str,
    name: str,
    kind: str = "func.func",
) -> str:
    """A function `name(A, B) -> C` that runs the kernel as a `hal.dispatch.extern` (`kind`
    util.func for a substitution spec to call).

    The output is a `flow.tensor.alloca`: memory with undefined contents, never hoisted,
    since the kernel stores every element of C (it computes A·B from zero in registers). A
    zero-filled output, or a bare empty one, is hoisted into a constant that IREE then
    copies into C on every call (64 MB at 4096² f32). An optimization barrier on the empty
    tensor stops that, but it is a host-side step between device work: each custom
    dispatch then ended the model's command buffer. (A decoder layer with nine of them ran
    slower than IREE's default on the H200; that split was the difference we found in its
    stream IR.)
    """
    lhs = tensor_type(problem.lhs_shape, problem.lhs_type)
    rhs = tensor_type(problem.rhs_shape, problem.rhs_type)
    out = tensor_type(problem.acc_shape, problem.acc_type)
    x, y, z = grid(problem, params)
    # Split-K's locks, one per output block: zeros that the kernel leaves at zero.
    locks = [f"tensor<{x * y}xi32>"] if params.split_k > 1 else []
    scratch = binary.pointers - 3 - len(locks)
    scratch_values = [f"%s{i}" for i in range(scratch)]
    operand_types = [lhs, rhs, out, *locks] + ["tensor<256xi8>"] * scratch
    operands = ["%a", "%b", "%c", *["%l" for _ in locks], *scratch_values]
    # Indirect: the buffers come from the call's binding table, so IREE records the command
    # buffer once and replays it. Without the flag an extern dispatch binds its buffers
    # directly and the command buffer (every repeat of the dispatch) is recorded on every
    # call, as IREE's own dispatches are not.
    read_only = '#hal.pipeline.binding<storage_buffer, "ReadOnly|Indirect">'
    written = "#hal.pipeline.binding<storage_buffer, Indirect>"
    bindings = [read_only] * 2 + [written] * (1 + len(locks)) + [read_only] * scratch
    returns = "util.return" if kind == "util.func" else "return"
    visibility = " private" if kind == "util.func" else ""
    results = "(%c, %l)" if locks else "%c"
    result = "%r#0" if locks else "%r"
    lines = [
        f"  {kind}{visibility} @{name}(%a: {lhs}, %b: {rhs}) -> {out} {{",
        f"    %c = flow.tensor.alloca : {out}",
        *[f"    %l = arith.constant dense<0> : {t}" for t in locks],
        *[f"    {v} = arith.constant dense<0> : tensor<256xi8>" for v in scratch_values],
        f'    %r{":2" if locks else ""} = hal.dispatch.extern "{binary.entry}"'
        f"({', '.join(operands)}) : ({', '.join(operand_types)}) -> {results}",
        "      count(%device: !hal.device) -> (index, index, index) {",
        f"        %x = arith.constant {x} : index",
        f"        %y = arith.constant {y} : index",
        f"        %z = arith.constant {z} : index",
        "        hal.return %x, %y, %z : index, index, index",
        "      }",
        f"      layout(#hal.pipeline.layout<bindings = [{', '.join(bindings)}]>)",
        "      objects({",
        f"        {executable_target} ordinal(0) = "
        f'[#hal.executable.object<{{path = "{binary.cubin_path}"}}>]',
        "      })",
        f"      <{{workgroup_size = [{binary.threads} : index, 1 : index, 1 : index], "
        f"subgroup_size = 32 : index, workgroup_local_memory = {binary.shared_bytes} : index}}>",
        f"    {returns} {result} : {out}",
        "  }",
    ]
    return "\n".join(lines) + "\n"


def extern_module(
    problem: MatmulProblem,
    params: KernelParams,
    binary: KernelBinary,
    executable_target: str,
    function: str,
) -> str:
    """An IREE module whose `function` takes A and B like autosched's kernel modules (see
    `extern_function`); the executable target is the arch's full attribute
    (CudaTarget.executable_target), named on the module too."""
    device = f'[#hal.device.target<"cuda", [{executable_target}]> : !hal.device]'
    body = extern_function(problem, params, binary, executable_target, function)
    return f"module attributes {{hal.device.targets = {device}}} {{\n{body}}}\n"


def main(argv: list[str] | None = None) -> None:
    """`python -m autosched.triton_kernels`: one point's PTX and its launch needs (JSON)."""
    from autosched.records import problem_from_shape

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--shape", required=True, help="the problem as records.problem_shape")
    parser.add_argument("--params", required=True, help="KernelParams as JSON")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--ptx", required=True)
    parser.add_argument("--module", help="also write the extern module (the kernel module)")
    options = parser.parse_args(argv)
    problem = problem_from_shape(json.loads(options.shape))
    params = KernelParams(**json.loads(options.params))
    binary = compile_ptx(problem, params, options.arch, options.ptx)
    if options.module:
        from autosched.config import RunConfig
        from autosched.host import Machine
        from autosched.manifest import KERNEL_FUNCTION, write_text
        from autosched.targets.cuda import CudaTarget

        target = CudaTarget(RunConfig(target="cuda", arch=options.arch), Machine())
        text = extern_module(problem, params, binary, target.executable_target(), KERNEL_FUNCTION)
        write_text(options.module, text)
    json.dump(asdict(binary), sys.stdout)


if __name__ == "__main__":
    main()
