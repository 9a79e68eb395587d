"""Root-op kinds by name, in the order a dispatch's ops are offered to them; importing this
imports none of them (like the tuners', targets' and executors' registries), only their
protocol (ops/base.py).

Adding a kind: one module with a `RootOpKind` (ops/base.py), its line here, and its knobs in
each target that supports it.
"""

from __future__ import annotations

from functools import cache
from importlib import import_module

from autosched.ops.base import DispatchSite, Problem, Root, RootOpKind, SkippedRoot

# The kind every backend's own class tunes (other kinds are its views: targets/base.py), and
# the one a record without a `kind` names: the matmul family, which came before the others.
BASE_KIND = "matmul"

KINDS = {
    "attention": ("autosched.ops.attention", "AttentionKind"),
    "convolution": ("autosched.ops.convolution_kind", "ConvolutionKind"),
    "gather": ("autosched.ops.gather", "GatherKind"),
    "matmul": ("autosched.ops.matmul_kind", "MatmulKind"),
}


@cache
def kind(name: str) -> RootOpKind:
    """The registered kind `name` (one instance per process)."""
    module, cls = KINDS[name]
    return getattr(import_module(module), cls)()


def root_kinds() -> list[RootOpKind]:
    return [kind(name) for name in KINDS]


def classify_root(op, site: DispatchSite) -> Root | SkippedRoot | None:
    """A dispatch op as a kind's problem, a SkippedRoot, or None when no kind knows it."""
    for candidate in root_kinds():
        found = candidate.recognise(op, site)
        if found is not None:
            return found
    return None


def kind_of(problem: Problem) -> RootOpKind:
    """The kind a problem belongs to (its `kind` names it)."""
    return kind(problem.kind)
