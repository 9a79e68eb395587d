"""Convolution roots (`linalg.conv_*`, `linalg.depthwise_conv_*`): recognised and listed as
not tuned; tuning them as implicit GEMMs is the next kind's work."""

from __future__ import annotations

from iree.compiler import ir

from autosched.ops.base import DispatchSite, RootOpKind, SkippedRoot


class ConvolutionKind(RootOpKind):
    name = "convolution"

    def recognise(self, op: ir.Operation, site: DispatchSite) -> SkippedRoot | None:
        if not op.name.startswith(("linalg.conv", "linalg.depthwise_conv")):
            return None
        return SkippedRoot(op.name, "convolution", "convolutions are not tuned", site)
