"""Custom winners of a model tuned on buckets, as the dynamic model takes them.

A model exported with a dynamic sequence length is tuned on static clones, one a bucket
(model/buckets.py), and its custom kernels are searched and timed on each clone's
problems. The build a server runs is the dynamic model, where one op serves every length:
the bucket problems of one dynamic root share one kernel for every size of its dynamic
loops, at the point of the member with the most work (flops x runs), since long prompts
are where a server spends its time: a matmul whose rows (M) alone are dynamic
(kernels/matmul_triton: M is a value the kernel is launched with), an attention whose query
rows, and keys, are one length (kernels/flash_attention: that length at launch). An
attention whose mask was causal at every bucket's length (recognised by its values there:
rewrite/attention_ops.py) keeps the kernel's own causal mask (else the kernel reads the
mask), and each bucket's proof compares the outputs at its length. A static root keeps its
own winner. A winner of any other dynamic root (a matmul whose N or K is dynamic, keys of a
length the query rows are not) has no kernel for every size yet, and is named as not
placed, with that reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autosched.kernels.attention_layout import length_unsupported, of_length
from autosched.model.buckets import BucketModel, free_roles, relaxed_key
from autosched.ops.matmul import DYNAMIC
from autosched.rewrite.placement import CUSTOM_ROUTE, NotPlaced

ROWS = frozenset({"m"})  # the loop roles a kernel for any count of rows leaves free


@dataclasses.dataclass
class BucketWinners:
    """The winners the dynamic model's spec is written with, each kernel's campaign
    problems (kernel problem name -> the bucket problems it serves), and those left out."""

    winners: list = dataclasses.field(default_factory=list)  # (problem, point)
    served: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    left_out: list[NotPlaced] = dataclasses.field(default_factory=list)
    why: list[str] = dataclasses.field(default_factory=list)  # each shared kernel's choice


def any_length_winners(
    model: BucketModel, problems: Sequence, winners: list, named: dict[str, str]
) -> BucketWinners:
    """`winners` ((problem, point), `named` the campaign problem of each: custom_route's
    custom_winners) as the dynamic model takes them (see the module's docstring)."""
    entries = {entry.problem.name: entry for entry in problems}
    found = BucketWinners()
    groups: dict[tuple, list] = {}
    for problem, point in winners:
        entry = entries[named[problem.name]]
        free = free_roles(entry, model.patterns)
        if free is not None and not free:  # a static root of the dynamic model
            found.winners.append((problem, point))
            found.served[problem.name] = [entry.problem.name]
        elif (why := _why(problem, free)) is None:
            key = (relaxed_key(problem, free), free)
            groups.setdefault(key, []).append((entry, problem, point))
        else:
            found.left_out.append(NotPlaced(entry.problem.name, CUSTOM_ROUTE, why))
    for (_, free), members in groups.items():
        entry, problem, point = max(members, key=lambda m: m[0].problem.flops * m[0].occurrences)
        shared = shared_problem(problem, free, [member for _, member, _ in members])
        found.winners.append((shared, point))
        found.served[shared.name] = [member.problem.name for member, _, _ in members]
        found.why.append(
            f"{shared.name}: one kernel for every size of its {', '.join(sorted(free))} "
            f"loops, at the point of "
            f"{entry.problem.name} (the bucket of the most work)"
        )
    return found


def shared_problem(problem, free: frozenset[str], members: list):
    """The problem the bucket problems `members` share in the dynamic model: at every size
    of its `free` loops (DYNAMIC: given at launch); an attention causal only where every
    bucket's mask was (else the kernel reads the mask)."""
    if problem.kind == "attention":
        causal = all(member.causal for member in members)
        return dataclasses.replace(of_length(problem, set(free)), causal=causal)
    return dataclasses.replace(problem, m=DYNAMIC, sites=[])


def _why(problem, free: frozenset[str] | None) -> str | None:
    """Why a bucket problem's custom winner of dynamic `free` loops has no place in the
    dynamic model (None: it has, at every size of them)."""
    if free is None:
        return "no op of the dynamic model is this bucket problem's"
    if problem.kind == "matmul" and free == ROWS:
        return None
    if problem.kind == "attention":
        why = length_unsupported(of_length(problem, set(free)))
        if why is None:
            return None
        return f"its op is of dynamic {', '.join(sorted(free))} in the model: {why}"
    roles = ", ".join(sorted(free))
    return f"its op is of dynamic {roles} in the model, and no custom kernel serves every size"
