"""The matmul family's kernels: a point's parameters, which kernel a point runs, and its
compile to a cubin that IREE runs as a `hal.dispatch.extern` (issue 12).

IREE 3.13 has no Hopper tensor-core (wgmma) pipeline; Triton does. A kernel of this family
is compiled by Triton for sm_90a (wgmma; TMA in its persistent forms; its cubin) and
wrapped in an IREE module as a `hal.dispatch.extern` with the same signature as autosched's
kernel modules (kernels/extern.py), so it is checked and timed like every other candidate.
Its parameters (block sizes, warps, stages, the launch-order group, split-K, persistence,
warp specialization) are what a tuner searches (space.py). The sources are template files
(source.py; the warp-specialized Gluon form: kernels/matmul_gluon/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autosched.errors import UserError
from autosched.kernels.base import KernelBinary
from autosched.kernels.extern import (
    DynamicRows,
    dispatch_extern_function,
    extern_module_text,
)
from autosched.kernels.matmul_gluon.source import specialized_source
from autosched.kernels.matmul_triton.source import kernel_source, rotated_kernel, rotates_in_tile
from autosched.kernels.triton import (
    SHARED_MEMORY_BYTES,
    TRITON_BYTES,
    TRITON_TYPES,
    kernel_from_source,
    triton_binary,
)
from autosched.ops.epilogue import Epilogue
from autosched.ops.matmul import MatmulProblem
from autosched.ops.matmul_kernel import tensor_type
from autosched.ops.row_norm import RowNorm

INPUT_TYPES = ("f16", "bf16")  # the tensor-core inputs the family covers
OUTPUT_TYPES = ("f32", "f16", "bf16")
MIN_DOT = 16  # tl.dot's smallest extent of each dim


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
    # Workgroups that take the output blocks in turn, loading A and B by TMA descriptors
    # (`persistent_matmul`); 0: one workgroup per block, loading by pointers.
    persistent: int = 0
    # 1: the persistent kernel warp-specialized, a loader warp feeding the MMA warps
    # (`specialized_matmul`, Gluon: kernels/matmul_gluon/).
    specialized: int = 0

    @property
    def name(self) -> str:
        split = f"_k{self.split_k}" if self.split_k > 1 else ""
        persistent = f"_p{self.persistent}" if self.persistent else ""
        specialized = "_ws" if self.specialized else ""
        return (
            f"tr_b{self.block_m}x{self.block_n}x{self.block_k}_w{self.warps}"
            f"_s{self.stages}_g{self.group_m}{split}{persistent}{specialized}"
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
            persistent=point.get("persistent", 0),
            specialized=point.get("specialized", 0),
        )


def unsupported(problem: MatmulProblem) -> str | None:
    """Why the family cannot compute this problem, or None."""
    if problem.lhs_type not in INPUT_TYPES or problem.rhs_type != problem.lhs_type:
        found = dict.fromkeys((problem.lhs_type, problem.rhs_type))
        return f"custom kernels take f16 or bf16 inputs of one type, not {' and '.join(found)}"
    if problem.acc_type not in OUTPUT_TYPES:
        return f"custom kernels write f32, f16 or bf16, not {problem.acc_type}"
    if not problem.zero_init:
        return "custom kernels start from a zero accumulator"
    return None


def split_unsupported(problem: MatmulProblem, block_k: int, split_k: int) -> str | None:
    """Why K cannot be split in `split_k` shares, or None: each share must be whole blocks
    of K (the shares add up in C where it is f32 and nothing follows, else in an f32
    workspace: `uses_workspace`)."""
    if split_k == 1:
        return None
    if problem.k % (split_k * block_k):
        return f"split-K needs K ({problem.k}) in {split_k} shares of whole {block_k}-blocks"
    return None


def uses_workspace(problem: MatmulProblem, split_k: int, epilogue: Epilogue | None) -> bool:
    """Whether a split K's shares add up in an f32 workspace (the kernel's `w`) rather than
    in C: where C is narrower than f32 (a decode step's bf16 projection) or an epilogue
    follows, which the last share applies to the sum before it stores C."""
    return split_k > 1 and (epilogue is not None or problem.acc_type != "f32")


def persistent_unsupported(problem: MatmulProblem, split_k: int) -> str | None:
    """Why a persistent kernel (TMA descriptors over A and B) cannot run this problem, or
    None: it runs K whole, and TMA needs each operand's rows (and batch entries) in steps
    of 16 bytes."""
    if split_k > 1:
        return "a persistent kernel runs its K whole"
    rows = (problem.m if problem.transpose_a else problem.k,
            problem.k if problem.transpose_b else problem.n)  # fmt: skip
    if any(row * 2 % 16 for row in rows):  # f16 or bf16 (INPUT_TYPES)
        return "TMA needs the operands' rows in steps of 16 bytes"
    return None


def dynamic_unsupported(problem: MatmulProblem, epilogue: Epilogue | None) -> str | None:
    """Why the family cannot run this problem for any count of rows M (a problem whose M is
    DYNAMIC), or None: M must be A's row count and C's, in one batch entry at most, with no
    epilogue."""
    if problem.batch > 1:
        return "a kernel for any M runs one batch entry"
    if problem.transpose_a:
        return "a kernel for any M reads A with its rows along M"
    if epilogue is not None:
        return "a kernel for any M has no epilogue"
    return None


def _strides(problem: MatmulProblem) -> dict[str, int]:
    """Element strides of A, B and C (batch, row, column), from the problem's layout (for
    any count of rows the batch strides, which depend on M, are 0: one batch entry)."""
    m, n, k = problem.m, problem.n, problem.k
    a_m, a_k = (1, m) if problem.transpose_a else (k, 1)
    b_k, b_n = (1, k) if problem.transpose_b else (n, 1)
    if problem.any_rows:
        m = 0
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


def kernel_function(epilogue: Epilogue | None, params: KernelParams) -> str:
    """Which kernel a point runs: `rotated_matmul` for an epilogue rotating heads in blocks
    of a head or less (it has no persistent form), else `specialized_matmul`,
    `persistent_matmul` or `matmul`. A warp-specialized point whose epilogue rotates its
    tile (`rotates_in_tile`: reshapes of the tile Gluon would need layouts for) runs
    `persistent_matmul`."""
    if rotated_kernel(epilogue, params.block_n):
        return "rotated_matmul"
    if params.specialized and params.persistent and not rotates_in_tile(epilogue, params.block_n):
        return "specialized_matmul"
    return "persistent_matmul" if params.persistent else "matmul"


def _kernel(
    epilogue: Epilogue | None,
    params: KernelParams,
    any_rows: bool = False,
    norm: RowNorm | None = None,
):
    """The Triton kernel `kernel_function` names (built from its source, so that importing
    this module needs no Triton); for `any_rows`, `matmul` taking M at launch; with `norm`,
    computing A as the norm of x."""
    if any_rows:
        return kernel_from_source(kernel_source(None, params.block_n, dynamic_m=True), "matmul")
    function = kernel_function(epilogue, params)
    if function == "specialized_matmul":
        return kernel_from_source(specialized_source(epilogue, params.block_n), function)
    persistent = function == "persistent_matmul"
    source = kernel_source(epilogue, params.block_n, persistent, norm=norm)
    return kernel_from_source(source, function)


def grid(problem: MatmulProblem, params: KernelParams) -> tuple[int, int, int]:
    """Workgroups: one per output block (a persistent kernel's, at most one per SM), times
    the batch, times the shares of K."""
    per_batch = blocks(problem, params)
    if params.persistent:
        per_batch = min(per_batch, params.persistent)
    return per_batch, max(problem.batch, 1), params.split_k


def blocks(problem: MatmulProblem, params: KernelParams) -> int:
    """Output blocks of one batch entry."""
    return math.ceil(problem.m / params.block_m) * math.ceil(problem.n / params.block_n)


def compile_ptx(
    problem: MatmulProblem,
    params: KernelParams,
    arch: str,
    path: str,
    epilogue: Epilogue | None = None,
) -> KernelBinary:
    """Triton's PTX for one point, written to `path` (no GPU needed); with `epilogue` in it
    (its extra inputs after A and B; it writes the epilogue's type; K is never split).
    The binary names its workgroups: a persistent point runs one workgroup per block
    where its kernel has no persistent form (`rotated_matmul`) or TMA cannot load this
    form's operands (a weight read as stored, whose rows run along K). A problem whose M
    is DYNAMIC gets a kernel for any count of rows, given at launch (`dynamic_unsupported`):
    the point's blocks in `matmul`, one workgroup each, K whole; the binary names no
    workgroups (the launch counts them)."""
    dynamic_m = problem.any_rows
    params = _launched(problem, params, epilogue)
    kernel = _kernel(epilogue, params, dynamic_m, problem.norm)
    gluon = kernel_function(epilogue, params) == "specialized_matmul"
    element, output = TRITON_TYPES[problem.lhs_type], TRITON_TYPES[problem.acc_type]
    constants = _constants(problem, params, epilogue)
    if gluon:
        constants["STAGES"] = params.stages  # Gluon does not pipeline: the kernel's ring
    signature = {"a": f"*{element}", "b": f"*{element}"}
    if problem.norm is not None:  # the norm's weight, along K
        signature["g"] = f"*{element}"
    for index, (_, operand) in enumerate(epilogue.extras if epilogue else []):
        signature[f"e{index}"] = f"*{TRITON_TYPES[operand.element]}"
    if epilogue is not None:
        output = TRITON_TYPES[epilogue.out_element]
    signature |= {"c": f"*{output}", "locks": "*i32", "w": "*fp32"}
    if params.split_k == 1:
        constants["locks"] = None  # no lock pointer in the kernel's parameters
    if not constants["WORK"]:
        constants["w"] = None  # nor a workspace
    if gluon:
        constants["TMA_STORE"] = tma_store_fits(problem, params, epilogue, output, arch)
    buffers = len(signature) - 2  # A, B, the epilogue's inputs and C: IREE's bindings
    if dynamic_m:  # a value after the operands: the rows IREE passes as a push constant
        del constants["M"]
        signature["M"] = "i32"
    binary = triton_binary(
        kernel, signature, constants, buffers, arch, params.warps, params.stages, path, gluon
    )
    return replace(binary, workgroups=() if dynamic_m else grid(problem, params))


def _launched(
    problem: MatmulProblem, params: KernelParams, epilogue: Epilogue | None
) -> KernelParams:
    """The point as its kernel runs it (see `compile_ptx`): one workgroup per block, K
    whole, for any count of rows; K whole where the epilogue rotates heads in halves; not
    persistent where that kernel has no persistent form or TMA cannot load the operands."""
    if problem.any_rows:
        why = dynamic_unsupported(problem, epilogue)
        if why:
            raise UserError(f"{params.name}: {why}")
        params = replace(params, split_k=1, persistent=0, specialized=0)
    rotated = kernel_function(epilogue, params) == "rotated_matmul"
    if rotated:  # its halves' template has no split K
        params = replace(params, split_k=1)
    normed = problem.norm is not None  # the norm is in `matmul` and `rotated_matmul`
    if rotated or normed or persistent_unsupported(problem, params.split_k):
        params = replace(params, persistent=0, specialized=0)
    why = split_unsupported(problem, params.block_k, params.split_k)
    if why:
        raise UserError(f"{params.name}: {why}")
    return params


def _constants(problem: MatmulProblem, params: KernelParams, epilogue: Epilogue | None) -> dict:
    """The kernel's constants: sizes, strides, blocks and the point's choices."""
    k_part = problem.k // params.split_k if params.split_k > 1 else problem.k
    even = (
        not problem.any_rows
        and problem.m % params.block_m == 0
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
        "WORK": uses_workspace(problem, params.split_k, epilogue),
    }
    if rotated_kernel(epilogue, params.block_n):
        if params.block_n < 2 * MIN_DOT:
            raise UserError(f"{params.name}: a rotated kernel's half blocks need {MIN_DOT} columns")
        constants["HALF"] = epilogue.period // 2
    if params.persistent:
        constants["PROGRAMS"] = params.persistent
    return constants


def tma_store_fits(
    problem: MatmulProblem, params: KernelParams, epilogue: Epilogue | None, output: str, arch: str
) -> bool:
    """Whether the warp-specialized kernel stores its blocks by TMA: C row-major (no
    epilogue that writes it permuted), its rows in 16-byte steps, and a block of C beside
    the stages in shared memory (at 128x256x64 in 3 stages, a bf16 C fits and an f32 one
    does not). On the H200 the TMA store took the Llama-3 gate projection from 0.393 to
    0.338 ms (benchmarks/gluon_matmul.py, session 27)."""
    if epilogue is not None and epilogue.store is not None:
        return False
    element = TRITON_BYTES[TRITON_TYPES[problem.lhs_type]]
    stages = params.stages * (params.block_m + params.block_n) * params.block_k * element
    c_block = params.block_m * params.block_n * TRITON_BYTES[output]
    limit = SHARED_MEMORY_BYTES.get(arch, 0) - 1024  # the stages' barriers and alignment
    return problem.n * TRITON_BYTES[output] % 16 == 0 and stages + c_block <= limit


def extern_function(
    problem: MatmulProblem,
    params: KernelParams,
    binary: KernelBinary,
    executable_target: str,
    name: str,
    kind: str = "func.func",
    epilogue: Epilogue | None = None,
) -> str:
    """A function `name(A, B) -> C` that runs the kernel as a `hal.dispatch.extern` (`kind`
    util.func for a substitution spec to call). With `epilogue`: `name(A, B, extras...)`
    returns the epilogue's result, in its own shape (a reshape of C: the same elements in
    the same order). A normed form (ops/row_norm.py) takes the norm's x for A and its
    weight g after B (`operand_types`). For a problem whose M is DYNAMIC, A and C have any
    count of rows (`?` in their types), which the launch reads from A.

    The output is a `flow.tensor.alloca`: memory with undefined contents, never hoisted,
    since the kernel stores every element of C (it computes A·B from zero in registers). A
    zero-filled output, or a bare empty one, is hoisted into a constant that IREE then
    copies into C on every call (64 MB at 4096² f32). An optimization barrier on the empty
    tensor stops that, but it is a host-side step between device work: each custom
    dispatch then ended the model's command buffer. (A decoder layer with nine of them ran
    slower than IREE's default on the H200; that split was the difference we found in its
    stream IR.)
    """
    if problem.any_rows:
        return _dynamic_extern(problem, params, binary, executable_target, name, kind)
    lhs, after_b = operand_types(problem)
    rhs = tensor_type(problem.rhs_shape, problem.rhs_type)
    out = tensor_type(problem.acc_shape, problem.acc_type)
    extras = [*after_b, *(operand.type for _, operand in epilogue.extras)] if epilogue else after_b
    x, y, z = binary.workgroups or grid(problem, params)
    # Split-K's locks, one per output block: zeros that the kernel leaves at zero; and
    # where the shares add up outside C, their f32 workspace.
    locks = [f"tensor<{x * y}xi32>"] if z > 1 else []
    sums = math.prod(problem.acc_shape)
    work = [f"tensor<{sums}xf32>"] if uses_workspace(problem, z, epilogue) else []
    return dispatch_extern_function(
        name, kind, [lhs, rhs, *extras], epilogue.out_type if epilogue else out, binary,
        executable_target, (x, y, z), locks, work,
    )  # fmt: skip


def operand_types(problem: MatmulProblem) -> tuple[str, list[str]]:
    """(A's type, the types of what the kernel reads after B): A, or for a normed form
    (ops/row_norm.py) x as the model holds it and then g."""
    if problem.norm is None:
        return tensor_type(problem.lhs_shape, problem.lhs_type), []
    return problem.norm.x_type, [problem.norm.g_type]


def _dynamic_extern(
    problem: MatmulProblem,
    params: KernelParams,
    binary: KernelBinary,
    executable_target: str,
    name: str,
    kind: str,
) -> str:
    """`extern_function` of a binary for any count of rows: A's and C's row dimension `?`,
    one workgroup per block of rows and columns."""
    row = len(problem.lhs_shape) - 2  # after a unit batch, if any
    lhs = tensor_type(problem.lhs_shape, problem.lhs_type)
    rhs = tensor_type(problem.rhs_shape, problem.rhs_type)
    out = tensor_type(problem.acc_shape, problem.acc_type)
    across = math.ceil(problem.n / params.block_n)
    rows = DynamicRows(operand=0, dim=row, block=params.block_m, across=across)
    return dispatch_extern_function(
        name, kind, [lhs, rhs], out, binary, executable_target, (1, 1, 1), rows=rows
    )


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
    body = extern_function(problem, params, binary, executable_target, function)
    return extern_module_text(executable_target, body)
