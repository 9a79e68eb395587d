"""Model-level layout choices: the model rewritten before IREE forms its dispatches, where the
form IREE would give an op leaves it out of every fast configuration.

**Strided 1x1 convolutions** (resnet's downsampling). IREE's global optimization has a pass
for them, `iree-global-opt-convert-strided-contraction-to-contraction`: the input is read
through a strided `tensor.extract_slice`, and the op becomes a pointwise convolution that IREE
configures on the tensor cores. In IREE 3.13 the pass leaves alone every one whose input a
`linalg.generic` computes (a ReLU's output, in resnet); those stay `reduction_` dispatches that
no tensor-core configuration takes ("expected indexing map 0 to be a projected
permutation"). On the H200, resnet50's three took 164-210 ms each, 99 % of IREE's 552 ms model.

With the input behind a `util.optimization_barrier` (an identity op), IREE's own pass takes
it, and the dispatch reads its input through a
strided view: the same dispatches (resnet50: 41), the same answers. The model is lowered to
IREE's `input` phase, the barriers are placed with the bindings, and the module is written as
bytecode: every later compile (dispatches, candidates, checks, the tuned model) starts from it
as from the user's model. IREE's default of the user's model stays the proof's baseline.

**Channels-last** (`layout = channels_last`). torch exports NCHW images and FCHW filters; a
convolution that reads a shifted filter tap of an NCHW image reads no aligned row, and a
kernel that wants channels-last must transpose every image on every call. IREE's own
`iree-preprocessing-convert-conv-to-channels-last` (run here with iree-opt, before the
barriers: a barrier stops the transposes from cancelling) turns each convolution NHWC with
transposes around it, and IREE's transpose propagation cancels them between convolutions:
resnet50 keeps one transpose (its input image), and its convolutions read NHWC images and
write NHWC outputs. IREE's own NHWC convolutions are slower than its NCHW ones on the H200
(0.558 ms against 0.141 for resnet50's 3x3 at 7x7), so the layout is for the Triton
convolution kernels (`layout = auto` chooses it where they are searched).

**Generalized contractions** (`layout = generalized`). torch's linear layers on a [B, S, H]
activation export as `linalg.batch_matmul` ops of one batch entry. IREE forms those as
batch matmuls, unit batch and all, and a decode step's one row as a batch matmul of one row:
its CUDA default took 27 us for Llama-3.2-1B's 2048 x 2048 projection, where the same
product as a plain matmul ran in 5.1 us, at cuBLAS's speed (benchmarks/results/
h100_decode_step.md). MLIR's `linalg-generalize-named-ops` makes every named linalg op a
`linalg.generic`; IREE then folds their unit dims, and forms matrix-vector dispatches for
one row and matmuls that read a weight as it is stored for many. Convolutions are
generalized too, so the layout is for models without them. Opt-in: the custom kernel
route reads named contractions.

**Single-row contractions** (`layout = rows`, single_rows.py): only the contractions of one
row (a decode step's projections) become generics; prefill's matmuls and the attentions stay
named, where the custom kernels find them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from iree.compiler import ir

from autosched.errors import UserError
from autosched.ir_walk import walk_ops
from autosched.model.lowering import lower_to_phase, run_passes
from autosched.model.single_rows import (
    GENERALIZE_TAGGED,
    add_sequence,
    drop_sequence,
    tag_single_rows,
)

LAYOUT_PHASE = "input"  # where the convolutions are still named ops with their strides
# Named 2-D convolutions and where their filter's window dims are.
WINDOW_DIMS = {
    "linalg.conv_2d_nchw_fchw": (2, 3),
    "linalg.conv_2d_nhwc_fhwc": (1, 2),
    "linalg.conv_2d_nhwc_hwcf": (0, 1),
}
BARRIER = "util.optimization_barrier"
CHANNELS_LAST = "builtin.module(util.func(iree-preprocessing-convert-conv-to-channels-last))"
GENERALIZE = "builtin.module(util.func(linalg-generalize-named-ops))"


@dataclass(frozen=True)
class ModelLayout:
    """The model every build starts from, and what was changed to get it."""

    source: str  # the user's model, or the rewritten one
    original: str  # the user's model (as the target needs it): IREE's default is built from it
    strided_slices: int = 0  # strided 1x1 convolutions IREE formed as reductions
    channels_last: bool = False  # convolutions turned NHWC by IREE's preprocessing pass
    generalized: bool = False  # named linalg ops as generics (`layout = generalized`)
    single_rows: int = 0  # single-row contractions made generics (`layout = rows`)

    @property
    def changed(self) -> bool:
        return self.source != self.original

    def describe(self) -> str:
        if not self.changed:
            return ""
        changes = []
        if self.strided_slices:
            changes.append(
                f"{self.strided_slices} strided 1x1 convolution(s) that IREE forms as "
                "reductions read their input through a strided slice instead, as pointwise "
                "convolutions (IREE's own convert-strided-contraction-to-contraction, their "
                "input behind a barrier)"
            )
        if self.channels_last:
            changes.append(
                "convolutions read NHWC images (IREE's convert-conv-to-channels-last; its "
                "transpose propagation cancels the transposes between them)"
            )
        if self.generalized:
            changes.append(
                "named contractions as generics (MLIR's linalg-generalize-named-ops): IREE "
                "folds their unit dims, one row a matrix-vector dispatch"
            )
        if self.single_rows:
            changes.append(
                f"{self.single_rows} single-row contraction(s) as generics (transform "
                "dialect's structured.generalize): IREE forms matrix-vector dispatches; the "
                "other contractions stay named for the custom kernels"
            )
        return (
            f"layout: {'; '.join(changes)}; IREE's default of the model as given stays the "
            f"baseline ({self.source}; `layout = none` keeps the model as given)"
        )


def strided_1x1(op: ir.Operation) -> bool:
    """A named 2-D convolution with a 1x1 window, a stride over 1 and no dilation."""
    dims = WINDOW_DIMS.get(op.name)
    if dims is None or "strides" not in op.attributes:
        return False
    strides = [int(s) for s in ir.DenseIntElementsAttr(op.attributes["strides"])]
    dilations = (
        [int(d) for d in ir.DenseIntElementsAttr(op.attributes["dilations"])]
        if "dilations" in op.attributes
        else [1, 1]
    )
    shape = ir.RankedTensorType(op.operands[1].type).shape
    window = [shape[d] for d in dims]
    return window == [1, 1] and max(strides) > 1 and dilations == [1, 1]


def _computed(value: ir.Value) -> bool:
    """Whether an op of the model (not an argument, not a barrier already) makes `value`."""
    owner = value.owner
    if isinstance(owner, ir.Block):  # a function's argument
        return False
    return owner.operation.name != BARRIER


def place_barriers(module: ir.Module) -> int:
    """Puts each strided 1x1 convolution's computed input behind a barrier; how many."""
    placed = 0
    for op in list(walk_ops(module.operation)):
        if not strided_1x1(op) or not _computed(op.operands[0]):
            continue
        value = op.operands[0]
        with ir.InsertionPoint(op), op.location:
            barrier = ir.Operation.create(BARRIER, results=[value.type], operands=[value])
        op.operands[0] = barrier.result
        placed += 1
    return placed


def _lowered(model_path: str, flags: Sequence[str], work_dir: str) -> str:
    """The model at IREE's input phase, as text: its constants in full, and its ops with the
    model's own locations (the run names a root by its line in the user's model)."""
    out = os.path.join(work_dir, "model.input.mlir")
    return lower_to_phase(model_path, flags, LAYOUT_PHASE, out, work_dir, elide_above=None)


def converted(path: str, pipeline: str, out: str, what: str) -> None:
    """Runs the passes `pipeline` (`what` they do, for the error) on the module at `path`
    (IREE's input phase), written to `out`."""
    try:
        run_passes(path, pipeline, out)
    except RuntimeError as error:
        raise UserError(
            f"{path}: {what} failed: {error} (`layout = none` keeps the model as given)"
        ) from None


def _single_rows_generalized(lowered: str, work_dir: str) -> tuple[str, int]:
    """The module at `lowered` with its single-row contractions generalized (a new file;
    `lowered` is removed), and how many there were."""
    module = ir.Module.parseFile(lowered, ir.Context())
    tagged = tag_single_rows(module)
    if not tagged:
        return lowered, 0
    add_sequence(module)
    marked = os.path.join(work_dir, "model.rows_tagged.mlirbc")
    with open(marked, "wb") as handle:
        module.operation.write_bytecode(handle)
    out = os.path.join(work_dir, "model.rows.mlir")
    converted(marked, GENERALIZE_TAGGED, out, "the generalization of single-row contractions")
    os.remove(marked)
    os.remove(lowered)
    return out, tagged


def choose_layout(
    model_path: str,
    flags: Sequence[str],
    work_dir: str,
    reductions: int,
    channels_last: bool = False,
    generalized: bool = False,
    rows: bool = False,
) -> ModelLayout:
    """The model with its strided 1x1 convolutions read through slices, where IREE forms
    `reductions` of them as reductions, its convolutions channels-last, its named ops
    generalized and its single-row contractions generalized when asked (none of these: the
    model as it is)."""
    kept = ModelLayout(model_path, model_path)
    if not reductions and not channels_last and not generalized and not rows:
        return kept
    os.makedirs(work_dir, exist_ok=True)
    lowered = _lowered(model_path, flags, work_dir)
    # First: a barrier before the conversions would keep their transposes.
    for wanted, pipeline, name, what in (
        (channels_last, CHANNELS_LAST, "channels_last", "IREE's channels-last conversion"),
        (generalized, GENERALIZE, "generalized", "MLIR's generalization of named ops"),
    ):
        if wanted:
            out = os.path.join(work_dir, f"model.{name}.mlir")
            converted(lowered, pipeline, out, what)
            os.remove(lowered)
            lowered = out
    single_rows = 0
    if rows:
        lowered, single_rows = _single_rows_generalized(lowered, work_dir)
    module = ir.Module.parseFile(lowered, ir.Context())
    if single_rows:  # the sequence and its marks leave the model once they ran
        drop_sequence(module)
    placed = place_barriers(module) if reductions else 0
    os.remove(lowered)
    if not placed and not channels_last and not generalized and not single_rows:
        return kept
    stem = os.path.splitext(os.path.basename(model_path))[0]
    out = os.path.join(work_dir, f"{stem}.layout.mlirbc")
    with open(out, "wb") as handle:
        module.operation.write_bytecode(handle)
    return ModelLayout(
        out, model_path, placed and reductions, channels_last, generalized, single_rows
    )
