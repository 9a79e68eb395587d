"""What every Triton family's compile shares: Triton imported with one clear error, a kernel
built from its rendered source, and PTX and cubin written with their launch needs.

Triton is an optional extra (`.[triton]`); nothing here imports it until a kernel
is compiled, in the compile pool's own process (kernels/compile.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import tempfile

from autosched.errors import UserError
from autosched.kernels.base import WARP, KernelBinary, KernelDoesNotFit

TRITON_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}
TRITON_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
# Bytes of each element type the families read and write (their inputs are f16 or bf16).
ELEMENT_BYTES = {"f16": 2, "bf16": 2, "f32": 4}
# Shared memory a workgroup may have on each arch the families run on (targets/cuda.py's
# ARCHS says the same).
SHARED_MEMORY_BYTES = {"sm_90": 232448}


def import_triton():
    # Triton 3.9 warns unless the FP-fusion default is named; keep its long-standing one.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        import triton  # noqa: PLC0415 - an optional extra, imported where it is used
    except ImportError:
        raise UserError(
            "custom kernels need Triton, an optional extra: pip install '.[triton]'"
        ) from None
    return triton


def kernel_from_source(source: str, function: str):
    """The Triton kernel `function` of `source`, written to a file of its own named by its
    hash in a per-user folder (Triton reads a kernel's source from its file)."""
    import_triton()
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), f"autosched-triton-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{function}_{digest}.py")
    if not os.path.exists(path):
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".py", delete=False) as handle:
            handle.write(source)
        os.replace(handle.name, path)  # whole, even with another process writing it too
    spec = importlib.util.spec_from_file_location(f"autosched_{function}_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def triton_binary(
    kernel,
    signature: dict[str, str],
    constants: dict,
    buffers: int,
    arch: str,
    warps: int,
    stages: int,
    path: str,
    gluon: bool = False,
) -> KernelBinary:
    """Triton's PTX and cubin for one kernel (`buffers`: its first pointer parameters, IREE's
    bindings, counted past any of them fixed in `constants`: an operand the point does not
    have), the PTX written to `path` (no GPU needed); `gluon`: a Gluon kernel (its stages
    its own, its threads all its warps, the loader's too)."""
    triton = import_triton()
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415 - an optional extra, imported where it is used
    from triton.compiler import ASTSource  # noqa: PLC0415 - an optional extra, imported where it is used

    signature = {**signature, **{name: "constexpr" for name in constants}}
    # IREE's bindings are 16-byte aligned. Told so, Triton loads with vector and
    # asynchronous copies and pipelines its stages; untold, each element is its own load
    # (1.5 ms instead of about 0.2 at 4096^3 f16 on the H200).
    passed = [i for i, name in enumerate(kernel.arg_names) if name not in constants]
    aligned = {(index,): [["tt.divisibility", 16]] for index in passed[:buffers]}
    options = {"num_warps": warps, "num_stages": stages}
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415 - an optional extra, imported where it is used

        source = GluonASTSource(kernel, signature, constants, aligned)
        options.pop("num_stages")
    else:
        source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
    capability = int(arch.removeprefix("sm_"))
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    shared = int(compiled.metadata.shared)
    if shared > SHARED_MEMORY_BYTES.get(arch, shared):
        raise KernelDoesNotFit(
            f"the kernel needs {shared} bytes of shared memory, over {arch}'s "
            f"{SHARED_MEMORY_BYTES[arch]} per workgroup"
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
        scalars=len(re.findall(r"\.param\s+\.[bsu]32\b", entry.group(2))),
        shared_bytes=shared,
        threads=int(compiled.metadata.num_warps) * WARP,  # a Gluon kernel's loader warps too
        scratch_bytes=int(getattr(compiled.metadata, "global_scratch_size", 0)),
    )
