"""Custom kernel families by name; importing this imports none of them (like the kinds',
targets' and tuners' registries).

Adding a family: one folder under kernels/ with a `KernelFamily` (kernels/base.py), and its
line here. The kind targets ask `families_for(kind)`; a point's family is `family_of`.
"""

from __future__ import annotations

from importlib import import_module

FAMILIES = {
    "matmul_triton": ("autosched.kernels.matmul_triton.family", "MatmulTriton"),
    "flash_attention": ("autosched.kernels.flash_attention.family", "FlashAttention"),
    "flash_decoding": ("autosched.kernels.flash_decoding.family", "FlashDecoding"),
    "igemm_conv": ("autosched.kernels.igemm_conv.family", "IgemmConvolution"),
}


def family(name: str):
    """The registered family `name`."""
    module, cls = FAMILIES[name]
    return getattr(import_module(module), cls)()


def all_families() -> list:
    return [family(name) for name in FAMILIES]


def families_for(kind: str) -> list:
    """The families that serve a root-op kind, in registry order."""
    return [f for f in all_families() if f.kind == kind]


def family_of(point_or_name, kind: str | None = None):
    """The family of a point (None for a point of IREE's own pipelines), or by name. With
    `kind`, a partial point that names none of the kind's selector knobs (only a family's
    own knobs, as a hand-written winner may) is the kind's first family's."""
    if isinstance(point_or_name, str):
        return family(point_or_name)
    point = point_or_name
    found = next((f for f in all_families() if f.selects(point)), None)
    if found is None and kind is not None:
        found = next((f for f in families_for(kind) if f.selector[0] not in point), None)
    return found


def family_knobs(kind: str) -> tuple:
    """The knobs of a kind's families, each once, in registry order."""
    knobs = {}
    for found in families_for(kind):
        for knob in found.knobs:
            knobs.setdefault(knob.name, knob)
    return tuple(knobs.values())
