"""The custom matmul family's warp-specialized form, written in Gluon (issue 24).

Triton 3.6 does not warp-specialize a matmul for sm_90: its kernels issue their loads and
their wgmma from the same warps, and on the Llama-3-8B layer's MLP they ran at 630-700
TFLOP/s on the H200 where cuBLAS ran 790-820. cuBLAS's Hopper kernels give one warp the
TMA copies into a ring of shared-memory stages and the other warps the wgmma out of it.
Gluon, Triton's layout-explicit language (`triton.experimental.gluon`, in Triton 3.6),
writes that kernel: `specialized_matmul` is persistent (one workgroup per SM taking the
output blocks in turn, G rows of blocks at a time), makes its TMA descriptors on the device
(in Triton's global scratch, as the family's persistent form does), and splits into

- a loader warp that copies each block's K steps of A and B into STAGES stages, refilling
  a stage once the MMA that read it has freed it (an mbarrier pair a stage);
- the workgroup's warps, which run wgmma on each stage with one in flight, free the stage
  before, and then apply the epilogue and store the block from registers (the family's
  `STORE_TILE`, so every epilogue form the family writes works here too).

An epilogue's statements are Triton-language text (ops/epilogue.py); the source names
Gluon's equivalents `tl` so that the same text compiles (`prelude.py.tmpl`). This module
renders the kernel's text (`specialized.py.tmpl`); the matmul family (kernels/matmul_triton/)
compiles it (`GluonASTSource`) and launches it like its other forms.

Why a form of the matmul family and not a family of its own: its points are the matmul
family's (the `specialized` knob is one dimension of that one space, tied to `persistent`
by the space's rules), its config names are the family's, and whether a specialized point
runs this kernel is decided per compiled form (an epilogue that rotates its tile, or
operands TMA cannot load, run `persistent_matmul` or `matmul` instead).
"""

from __future__ import annotations

from autosched.kernels.matmul_triton.source import (
    TILE_NAMES,
    parameters,
    store_tile,
)
from autosched.kernels.templates import epilogue_values, indented, render
from autosched.ops.epilogue import Epilogue

LOADER_REGISTERS = 40  # the loader warp's registers (setmaxnreg); the MMA warps get the rest
# Threads beside the MMA warps: Gluon gives the one loader warp a warpgroup of its own.
LOADER_THREADS = 128


def tma_store() -> str:
    """The block's store when TMA_STORE (`tma_store.py.tmpl`): the block before must have
    left c_smem (TMA bounds the copy by C's shape, so no mask); else the matmul family's
    plain store from registers."""
    return render(__package__, "tma_store.py.tmpl")


def specialized_source(epilogue: Epilogue | None, block_n: int) -> str:
    """`specialized_matmul`'s source, its epilogue and store inside the MMA warps' loop
    over blocks."""
    values = epilogue_values(epilogue, TILE_NAMES)
    tile = indented(store_tile(epilogue, block_n, tma_store(), values))
    return render(__package__, "prelude.py.tmpl") + render(
        __package__, "specialized.py.tmpl",
        params=values["params"], parameters=parameters(values), store_tile=tile,
        loader_registers=LOADER_REGISTERS,
    )  # fmt: skip
