"""A model exported with a dynamic length tuned on buckets of lengths, for one spec that
serves the dynamic model at every length.

A server runs one build at whatever length a prompt has; autosched tunes static problems.
Each bucket (`--bucket FILE.npz`: one input set at one length) fixes the model's dynamic
dimensions to its arrays' sizes as `fixed_lengths` does for `--inputs`, as a static clone of
the model's function named after the bucket (`main$len16`), all clones in ONE module. That
module is tuned by the path every model of several functions takes, so each bucket's roots
are problems. The spec is then written for the dynamic model: a root op of the dynamic model
whose loops are of dynamic size is matched with those loops left free
(`DynamicRoot.free_roles`), and its bucket problems share one configuration
(`bucket_spec`): the winner of the bucket with the most work (the member problem of the most
flops x occurrences with a winner), since the longest prompts are where a server spends its
time, and every length the spec then serves gets a configuration timed on real work.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from iree.compiler import ir

from autosched.errors import UserError
from autosched.ir_walk import symbol, walk_ops
from autosched.measure.input_files import given_arrays
from autosched.model.fixed_lengths import (
    dynamic_arguments,
    fixed_arguments,
    public_functions,
    retype_arguments,
    static_results,
    write_module,
)
from autosched.model.lowering import (
    dispatch_functions,
    is_linalg_op,
    parse_prepared,
)
from autosched.model.model_build import CONFIGURED, FLOW, build_cache, model_build
from autosched.ops.attention import AttentionPattern, attention_pattern
from autosched.ops.contraction import ContractionPattern, contraction_pattern
from autosched.run.retime import first_pass_speedup
from autosched.targets.base import has_config

Pattern = ContractionPattern | AttentionPattern  # a root of the dynamic model


@dataclass(frozen=True)
class Bucket:
    """One input set at one length: its file, and the static clone tuned at its sizes."""

    file: str  # the .npz, as the user named it
    label: str  # its dynamic sizes: len16 (one size), len16x8 (several)
    function: str  # its clone's name in the bucket module: main$len16
    sizes: str  # "input 0 at 1x16x64xf32", for the lines that say what was tuned

    def describe(self) -> str:
        return f"{self.label} ({self.file}: {self.sizes})"


@dataclass
class BucketModel:
    """The module of the buckets' static clones, and the dynamic model the spec serves."""

    path: str  # the module of static clones, tuned
    model: str  # the dynamic model as the user gave it (the proof builds it)
    function: str  # its dynamic function's name
    buckets: list[Bucket]
    line: str  # what was tuned, for the run's first lines
    patterns: list[Pattern] = field(default_factory=list)  # its roots, dynamic sizes None

    def labels(self) -> str:
        return ", ".join(b.describe() for b in self.buckets)


def _label(fixed: dict, arguments) -> str:
    """`len16` where every dynamic size is 16; `len16x8` for several sizes."""
    sizes = []
    for index, tensor in arguments:
        for declared, size in zip(tensor.shape, fixed[index].shape, strict=True):
            if declared is None and size not in sizes:
                sizes.append(size)
    return "len" + "x".join(str(s) for s in sizes)


def bucket_model(model_path: str, files: Sequence[str], flags, work: str) -> BucketModel:
    """The model's function cloned at each bucket's sizes into one module written in
    `work`; a UserError naming the file or the model where that cannot be done."""
    if not model_path.endswith((".mlir", ".mlirbc")):
        raise UserError(f"{model_path}: buckets take a torch or MLIR export (.mlir, .mlirbc)")
    os.makedirs(work, exist_ok=True)
    module = parse_prepared(model_path, work)
    functions = public_functions(module)
    if len(functions) != 1:
        raise UserError(
            f"{model_path}: buckets take a model of one function; it exports {len(functions)}"
        )
    (function,) = functions
    name, arguments = symbol(function), dynamic_arguments(function)
    count = len(function.regions[0].blocks[0].arguments)
    if not arguments:
        raise UserError(
            f"{model_path}: {name} has no argument of dynamic size: buckets are for a "
            "dynamic export (--inputs FILE.npz tunes a static one on your inputs)"
        )
    buckets, clones = [], []
    for file in files:
        fixed = fixed_arguments(function, arguments, file)
        bucket = Bucket(
            file,
            _label(fixed, arguments),
            "",
            ", ".join(f"input {i} at {t.type_text()}" for i, t in fixed.items()),
        )
        twin = next((b for b in buckets if b.label == bucket.label), None)
        if twin is not None:
            raise UserError(f"{file}: the same sizes as {twin.file} ({bucket.label})")
        clone = function.clone(ir.InsertionPoint(module.body))
        clone.attributes["sym_name"] = ir.StringAttr.get(f"{name}${bucket.label}", module.context)
        retype_arguments(clone, fixed)
        buckets.append(Bucket(bucket.file, bucket.label, f"{name}${bucket.label}", bucket.sizes))
        clones.append(clone)
    function.erase()
    stem = os.path.splitext(os.path.basename(model_path))[0]
    typed = write_module(module, os.path.join(work, f"{stem}.buckets-inputs.mlirbc"))
    where = f"{model_path}: {name}"
    static_results(module, [b.function for b in buckets], typed, (flags, work, model_path), where)
    path = write_module(module, os.path.join(work, f"{stem}.buckets.mlirbc"))
    described = ", ".join(f"input {i} ({t.type_text()})" for i, t in arguments)
    model = BucketModel(path, model_path, name, buckets, "")
    model.line = (
        f"{where}: {described} of dynamic size: tuned on {len(buckets)} bucket(s), "
        f"{model.labels()}; one spec serves the dynamic model"
    )
    if any(len(given_arrays(file, count)) < count for file in files):
        model.line += "; the inputs a bucket leaves out are drawn at random (seeded)"
    return model


def _pattern(op: ir.Operation) -> Pattern | None:
    """The op as a contraction or an attention pattern; None for neither."""
    found = contraction_pattern(op) if is_linalg_op(op) else None
    return found or attention_pattern(op)


def dynamic_patterns(model: BucketModel, flags, work: str) -> list[Pattern]:
    """The contraction and attention roots of the dynamic model's dispatches (IREE's `flow`
    phase, kept in `work`'s build cache), their dynamic sizes as None."""
    flow = model_build(model.model, flags, build_cache(work)).parse(FLOW)
    found = []
    for _, _, function in dispatch_functions(flow):
        for op in walk_ops(function):
            pattern = _pattern(op)
            if pattern is not None and pattern not in found:
                found.append(pattern)
    return found


@dataclass
class BucketSpec:
    """What the spec holds for the dynamic model: one (problem, target, point) per entry,
    the loop roles each entry leaves free (problem name -> roles), and the configuration
    each tuned problem's dispatches must carry in the bucket module (name -> text)."""

    best: list = field(default_factory=list)
    free: dict[str, frozenset[str]] = field(default_factory=dict)
    expected: dict[str, str] = field(default_factory=dict)
    chosen: dict[str, str] = field(default_factory=dict)  # problem name -> its entry's problem
    why: list[str] = field(default_factory=list)  # how each dynamic root's entry was chosen

    def header(self, model: BucketModel) -> str:
        lines = [f"tuned on buckets {model.labels()} of {model.model}; serves any length"]
        return "".join(f"// {line}\n" for line in [*lines, *self.why])


def free_roles(entry, patterns: Sequence[Pattern]) -> frozenset[str] | None:
    """The loop roles of the dynamic root this bucket problem came from that are of dynamic
    size (empty: a static root); None where no dynamic root matches it."""
    for pattern in patterns:
        if isinstance(pattern, AttentionPattern):
            if pattern.matches(entry.problem):
                return pattern.free_roles(entry.problem)
        elif entry.problem.kind == "matmul" and pattern.matches(entry.contraction):
            return pattern.free_roles()
    return None


def bucket_spec(model: BucketModel, problems: list, target) -> BucketSpec:
    """One spec entry per dynamic root: its bucket problems grouped by the matcher that
    leaves the dynamic loops free, each group given one of its winners (`_chosen`).
    Problems of no dynamic root keep their own exact entry."""
    groups: dict[tuple, list] = {}
    spec = BucketSpec()
    for entry in problems:
        free = free_roles(entry, model.patterns) or frozenset()
        key = (entry.problem.key() if not free else relaxed_key(entry.problem, free), free)
        groups.setdefault(key, []).append(entry)
    for (_, free), members in groups.items():
        winners = [e for e in members if _winner(e, target) is not None]
        if not winners:
            continue
        chosen, why = _chosen(winners, members)
        point = chosen.result.best.point
        spec.best.append((chosen.problem, target, point))
        if free:
            spec.free[chosen.problem.name] = free
            spec.why.append(f"{chosen.result.best.config} of {chosen.problem.name}: {why}")
        config = target.for_problem(chosen.problem).lowering_config(chosen.problem, point)
        for member in winners:
            spec.expected[member.problem.name] = config
            spec.chosen[member.problem.name] = chosen.problem.name
    return spec


def _winner(entry, target):
    best = entry.result.best if entry.result else None
    return best if best is not None and has_config(target, entry.problem, best.point) else None


def _chosen(winners: list, members: list) -> tuple:
    """The winner the buckets together run fastest: each member's own first-pass timing
    of that point (sibling sharing hands each bucket the others' winners), as its default's
    time x runs over the point's speedup, added over the members. Where no winner was
    timed and checked on every member, the winner of the member of the most work: long
    prompts are where a server spends its time. (member, why)."""
    largest = max(winners, key=lambda e: e.problem.flops * e.occurrences)
    scored = [(_all_buckets_ms(members, w.result.best.point), w) for w in winners]
    scored = [(ms, w) for ms, w in scored if ms is not None]
    if not scored:
        return largest, "the winner of the bucket of the most work (none timed on every bucket)"
    ms, best = min(scored, key=lambda item: item[0])
    others = ", ".join(f"{w.result.best.config} {m:.4g} ms" for m, w in scored if w is not best)
    why = f"the fastest timed on every bucket ({ms:.4g} ms a call of each"
    return best, why + (f"; {others})" if others else ")")


def _all_buckets_ms(members: list, point: dict) -> float | None:
    """Expected ms of one call at every member's length with `point`; None where a member
    has no checked timing of it."""
    total = 0.0
    for member in members:
        result = member.result
        trial = next((t for t in result.trials if t.ok and t.point == point), None)
        speedup = first_pass_speedup(trial, result.baseline) if trial else None
        if not speedup or result.baseline is None or not result.baseline.ok:
            return None
        total += result.baseline.median_ms * member.occurrences / speedup
    return total


def relaxed_key(problem, free: frozenset[str]) -> tuple:
    """What a matcher with the `free` roles left out checks of the problem."""
    if problem.kind == "attention":
        sizes = tuple(
            None if role in free else size
            for role, size in zip(problem.loops, problem.loop_sizes, strict=True)
        )
        return (problem.kind, tuple(problem.operand_types(free)), problem.operand_loops, sizes)
    dims = {"m": problem.m, "n": problem.n, "k": problem.k, "batch": problem.batch}
    kept = tuple((role, size) for role, size in dims.items() if role not in free)
    return (problem.lhs_type, problem.rhs_type, problem.acc_type, problem.indexing_maps, kept)


def _dynamic_configs(path: str) -> dict[str, str | None]:
    """Dispatch function -> the configuration of its contraction of dynamic size, in a
    module compiled to `executable-configurations`."""
    module = ir.Module.parseFile(path, ir.Context())
    found = {}
    for op in walk_ops(module.operation):
        if op.name != "func.func" or "translation_info" not in op.attributes:
            continue
        for inner in walk_ops(op):
            pattern = _pattern(inner)
            if pattern is not None and pattern.dynamic:
                config = inner.attributes
                text = config["lowering_config"] if "lowering_config" in config else None
                found[symbol(op)] = f"{text} {op.attributes['translation_info']}"
    return found


def dynamic_coverage(model: BucketModel, flags, spec_flags, work: str) -> tuple[int, int]:
    """(dispatches of the dynamic model whose contraction the spec configures otherwise
    than IREE's default, its dispatches whose contraction is of dynamic size): both builds
    from `work`'s build cache (the proof's own builds)."""
    cache = build_cache(work)
    default = _dynamic_configs(model_build(model.model, flags, cache).phase(CONFIGURED))
    tuned = _dynamic_configs(
        model_build(model.model, [*flags, *spec_flags], cache).phase(CONFIGURED)
    )
    changed = [name for name, config in tuned.items() if default.get(name) != config]
    return len(changed), len(tuned)
