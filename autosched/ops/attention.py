"""Attention roots (`iree_linalg_ext.attention`, from SDPA): recognised and listed as not
tuned, with their operands; tuning them is the next kind's work (its knobs, a spec matcher
on `transform.iree.match.attention`, a kernel module)."""

from __future__ import annotations

from iree.compiler import ir

from autosched.ops.base import DispatchSite, RootOpKind, SkippedRoot

ATTENTION_OPS = ("iree_linalg_ext.attention", "iree_linalg_ext.online_attention")


class AttentionKind(RootOpKind):
    name = "attention"

    def recognise(self, op: ir.Operation, site: DispatchSite) -> SkippedRoot | None:
        if op.name not in ATTENTION_OPS:
            return None
        shapes = ", ".join(str(o.type) for o in op.operands)
        return SkippedRoot(op.name, "attention", f"not a matmul: {shapes}", site)
