"""The whole-model proof of a model with several entry functions (a causal LM's prefill and
decode): each function proved as `proof.prove` proves one, then one verdict for the model.

Why one proof per function: each function has its own inputs, outputs and time, and a spec
may help one and not the other. The model's verdict is the paired statistic of one call of
every function per round (the rounds' times added up), so a spec is kept only when the
model, prefill and decode together, is faster. A cached causal LM is also generated from
(`decode_proof.py`): greedy tokens that differ are outputs that differ.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from autosched.drivers.decode_proof import GreedyCheck, greedy_check, read_cached_lm
from autosched.drivers.proof import (
    CUSTOM,
    CustomProof,
    ModelProof,
    RuntimeChoice,
    model_verdict,
    prove,
)
from autosched.measure.module_io import EntryFunction, source_entry_functions
from autosched.model.configured import DEFAULT_TIMEOUT
from autosched.model.lowering import prepare_model


@dataclass
class EntryPointsProof(ModelProof):
    """A ModelProof of the whole model (its rounds: one call of every function, added up),
    with each function's own proof and, for a cached causal LM, the generated tokens."""

    functions: list[ModelProof] = dataclasses.field(default_factory=list)
    greedy: GreedyCheck | None = None


def model_functions(model_path: str, flags: Sequence[str], timeout: float) -> list[EntryFunction]:
    """Every function the model exports, with its plain tensor types."""
    with tempfile.TemporaryDirectory(prefix="autosched-functions-") as work:
        source = prepare_model(model_path, work)
        return source_entry_functions(source, flags, work, timeout, model_path)


def prove_model(
    model_path: str,
    flags: Sequence[str],
    spec_path: str | None,
    device: str,
    *,
    work_dir: str,
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
    tokens_from: str | None = None,
    **options,
) -> ModelProof:
    """`proof.prove` for a model of one function; for several, each proved in its own
    folder under `work_dir` and the results combined (`EntryPointsProof`). A cached causal
    LM's builds generate greedy tokens, compared with torch's where the export saved them
    beside `tokens_from` (the user's model: the run builds from copies of it elsewhere)."""
    entries = model_functions(model_path, flags, timeout)
    common = {"seed": seed, "timeout": timeout, **options}
    if len(entries) < 2:
        return prove(model_path, flags, spec_path, device, work_dir=work_dir, **common)
    proofs = _prove_functions(entries, (model_path, flags, spec_path, device), work_dir, common)
    combined = combine(proofs)
    lm, why_not = read_cached_lm(entries)
    if why_not:  # prefill and decode, not generated from: said, not taken for a difference
        combined.greedy = GreedyCheck(0, message=f"not in the recipe's form: {why_not}")
    if lm is not None:
        builds = _built(combined.functions[0])
        source = tokens_from or options.get("default_model") or model_path
        combined.greedy = greedy_check(lm, builds, device, source, seed)
        weigh_greedy(combined, combined.greedy)
    return combined


def weigh_greedy(combined: EntryPointsProof, greedy: GreedyCheck) -> None:
    """Greedy tokens that differ are outputs that differ, of the build that made them: where
    only the custom kernels' build parts, it is the custom build's outputs that differ (the
    run keeps the spec's build and says why the kernels are left out, as for a custom build
    whose call's outputs differ); else the tuned model's (the run exits 1)."""
    if greedy.match or combined.default_only:
        return
    line = greedy.line()
    if not greedy.message and greedy.differing() == [CUSTOM] and combined.custom is not None:
        combined.custom.outputs_match = False
        combined.custom.message = "; ".join(m for m in (combined.custom.message, line) if m)
        return
    combined.outputs_match = False
    combined.message = "; ".join(m for m in (combined.message, line) if m)


def _prove_functions(
    entries: Sequence[EntryFunction], model: tuple, work_dir: str, common: dict
) -> list[ModelProof]:
    """Each function proved in its own folder. One module holds every function, so one set
    of compile flags (`build_choices`) serves them all: the last function (a causal LM's
    decode step, which a server calls once a token) chooses among them, and the others are
    built with its choice, applied where it builds and agrees."""
    choices = common.pop("build_choices", ())

    def proved(entry: EntryFunction, build_choices) -> ModelProof:
        folder = os.path.join(work_dir, entry.name)
        return prove(
            *model, function=entry.name, work_dir=folder, build_choices=build_choices, **common
        )

    decider = proved(entries[-1], choices)
    chosen = tuple(shlex.split(decider.build_flags))  # or IREE's formation: ()
    return [proved(entry, (chosen,) if chosen else ()) for entry in entries[:-1]] + [decider]


def _built(proof: ModelProof) -> dict[str, str]:
    """The builds a function's proof timed (every build holds every function): name -> vmfb;
    a build with compile flags chosen, as chosen."""
    names = ["default"]
    if not proof.default_only:
        names.append("tuned")
    if proof.custom is not None and proof.custom.outputs_match:
        names.append(CUSTOM)
    paths = {name: proof.vmfbs.get(name, "") for name in names}
    return {name: path for name, path in paths.items() if os.path.isfile(path)}


def _added(proofs: Sequence[ModelProof], rounds_of) -> list[float]:
    """Each round's time of one call of every function (rounds every function timed)."""
    timed = [rounds_of(p) for p in proofs]
    if not all(timed):
        return []
    return [sum(r) for r in zip(*timed, strict=False)]


def _summary(rounds: list[float]) -> tuple[float | None, float | None]:
    if not rounds:
        return None, None
    mean = statistics.fmean(rounds)
    return statistics.median(rounds), statistics.pstdev(rounds) / mean if mean else 0.0


def combine(proofs: Sequence[ModelProof]) -> EntryPointsProof:
    """One proof of the model from each function's: times added per round, the outputs
    matching only where every function's match, the messages named by function."""
    default_rounds = _added(proofs, lambda p: p.default_rounds_ms)
    tuned_rounds = _added(proofs, lambda p: p.tuned_rounds_ms)
    default_ms, default_cv = _summary(default_rounds)
    tuned_ms, tuned_cv = _summary(tuned_rounds)
    errors = [p.max_error for p in proofs if p.max_error is not None]
    messages = [f"{p.function}: {p.message}" for p in proofs if p.message]
    identical = all(p.identical for p in proofs)
    return EntryPointsProof(
        function="+".join(p.function for p in proofs),
        default_ms=default_ms or 0.0,
        tuned_ms=tuned_ms,
        default_cv=default_cv or 0.0,
        tuned_cv=tuned_cv,
        speedup=model_verdict(default_rounds, tuned_rounds, identical).speedup,
        outputs_match=all(p.outputs_match for p in proofs),
        max_error=max(errors) if errors else None,
        outputs=sum(p.outputs for p in proofs),
        default_rounds_ms=default_rounds,
        tuned_rounds_ms=tuned_rounds,
        message="; ".join(messages),
        outputs_compared=all(p.outputs_compared for p in proofs),
        custom=_combined_custom(proofs, default_ms, tuned_ms),
        default_only=all(p.default_only for p in proofs),
        runtime_flags=_chosen_flags(proofs),
        **_build_flags(proofs),
        runtime_choices=_combined_choices(proofs),
        identical=identical,
        functions=list(proofs),
    )


def _combined_custom(
    proofs: Sequence[ModelProof], default_ms: float | None, tuned_ms: float | None
) -> CustomProof | None:
    """The custom build of the whole model (every function's proof built the same module):
    its rounds added like the default's, so its speedup is over the same model time."""
    customs = [p.custom for p in proofs]
    if any(c is None for c in customs):
        return None
    first = customs[0]
    errors = [c.max_error for c in customs if c.max_error is not None]
    messages = [f"{p.function}: {p.custom.message}" for p in proofs if p.custom.message]
    combined = CustomProof(
        replaced=first.replaced,
        placed=first.placed,
        outputs_match=all(c.outputs_match for c in customs),
        max_error=max(errors) if errors else None,
        rounds_ms=_added(proofs, lambda p: p.custom.rounds_ms),
        message="; ".join(messages),
    )
    combined.ms, combined.cv = _summary(combined.rounds_ms)
    if combined.ms:
        combined.speedup = default_ms / combined.ms if default_ms else None
        combined.over_spec = tuned_ms / combined.ms if tuned_ms else None
    return combined


def _build_flags(proofs: Sequence[ModelProof]) -> dict:
    """The compile flags of the module every function runs from: the last function's choice
    (`_prove_functions`) where every function took it, else none (a build and its printed
    command must be the one timed)."""
    chosen = {p.build_flags for p in proofs}
    flags = chosen.pop() if len(chosen) == 1 else ""
    decider = proofs[-1]
    return {
        "build_flags": flags,
        "build_flags_of": decider.build_flags_of if flags else "",
        "build_choices": decider.build_choices,
    }


def _chosen_flags(proofs: Sequence[ModelProof]) -> str:
    """The runtime flags every function was timed with, or each function's where their
    fastest differ (`prefill: ...; decode: ...`)."""
    chosen = {p.runtime_flags for p in proofs}
    if len(chosen) == 1:
        return chosen.pop()
    return "; ".join(f"{p.function}: {p.runtime_flags or 'none'}" for p in proofs)


def _combined_choices(proofs: Sequence[ModelProof]) -> list[RuntimeChoice]:
    """Each runtime-flag choice's time of one call of every function (None where a
    function did not run with it or did not time it)."""
    times: dict[str, list[float | None]] = {}
    for proof in proofs:
        for choice in proof.runtime_choices:
            times.setdefault(choice.flags, []).append(choice.ms)
    return [
        RuntimeChoice(flags, sum(ms) if len(ms) == len(proofs) and None not in ms else None)
        for flags, ms in times.items()
    ]


def function_lines(proof: ModelProof) -> list[str]:
    """One line per function (its times and outputs) and the generated tokens' line; none
    for a model of one function."""
    if not isinstance(proof, EntryPointsProof):
        return []
    lines = []
    for part in proof.functions:
        times = f"{part.default_ms:.3f} ms"
        if part.tuned_ms is not None and not part.default_only:
            times += f" -> {part.tuned_ms:.3f} ms ({part.verdict.describe()})"
        outputs = "outputs match" if part.outputs_match else "OUTPUTS DIFFER"
        lines.append(f"  {part.function}: {times}" + ("" if part.default_only else f", {outputs}"))
    if proof.greedy is not None:
        lines.append(f"  {proof.greedy.line()}")
    return lines


def function_fields(proof: ModelProof) -> dict:
    """The summary's per-function numbers and generated tokens (empty for one function)."""
    if not isinstance(proof, EntryPointsProof):
        return {}
    functions = [
        {
            "function": p.function,
            "default_ms": p.default_ms,
            "tuned_ms": p.tuned_ms,
            "speedup": p.speedup,
            "verdict": p.verdict.verdict if not p.default_only else None,
            "outputs_match": p.outputs_match,
            "max_error": p.max_error,
            # The build with custom kernels, on this function's (or bucket's) inputs.
            "custom": {"ms": p.custom.ms, "outputs_match": p.custom.outputs_match}
            if p.custom is not None
            else None,
        }
        for p in proof.functions
    ]
    greedy = None
    if proof.greedy is not None:
        greedy = {**dataclasses.asdict(proof.greedy), "match": proof.greedy.match}
    return {"functions": functions, "greedy": greedy}
