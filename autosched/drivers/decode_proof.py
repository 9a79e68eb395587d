"""A cached causal LM's proof: prefill, then decode step by step carrying the KV cache, and the
greedy tokens of each build compared (and with torch's, where the export saved them).

Timing each function on random inputs says whether a build is faster, and comparing one
call's outputs says whether it answers alike; neither says that the cache a build writes is
the cache its next call reads. Generating does: the default and the tuned build each run
prefill on one prompt, then DECODE_STEPS decode calls, each fed the previous call's cache and
greedy token, and the tokens must be equal (or, in a 16-bit model, part only where the
default's own logits hold a near tie: `near_tie`).

The functions follow the recipe of `tools/export_causal_lm.py` (docs/causal-lm.md):

    prefill(tokens[1, P] int, cache..., weights...)                -> (logits, cache...)
    decode(token[1, 1] int, position[1] int, cache..., weights...) -> (logits, cache...)

The cache is what decode returns after its logits, and both functions take it, and the same
weights, in that order. Or, exported with `--in-place` (as a server runs decode: no copy of
the whole cache a token), each function writes the cache arguments themselves and returns
its logits alone; the cache then stays on the device from call to call.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from autosched.drivers.compile_model import LoadedModule
from autosched.measure.module_io import UNUSED_INPUT, EntryFunction, TensorSpec

PREFILL, DECODE = "prefill", "decode"
DECODE_STEPS = 32  # decode calls after the prefill: DECODE_STEPS + 1 greedy tokens in all
INTEGER_TYPES = ("i32", "i64", "si32", "si64")
# The numpy types the runtime takes for a model's float arguments (bf16 as ml_dtypes').
FLOAT_TYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}
# A 16-bit build that parts from the default's tokens where the default's logits put the two
# tokens within two of the type's roundings (2 x its unit roundoff, relative to the step's
# largest logit) parts at a near tie: which of the two a rounding picks is not a fault.
NEAR_TIE = {"f16": 2.0**-10, "bf16": 2.0**-7}
TOP_LOGITS = 8  # the highest logits kept a step, to judge where two builds part


def seeded_weights(shapes: Sequence[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    """A causal LM's weights drawn with numpy from `seed`, the same for torch and IREE: 1-D
    (norm scales) ones, 2-D [out, in] normal / sqrt(in), so activations stay near unit
    scale and the logits lie far enough apart that greedy tokens do not flip on rounding."""
    rng = np.random.default_rng(seed)
    drawn = []
    for shape in shapes:
        if len(shape) == 1:
            drawn.append(np.ones(shape, np.float32))
        else:
            drawn.append((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32))
    return drawn


@dataclass(frozen=True)
class CachedLM:
    """Where a cached causal LM's prefill and decode take their cache and weights."""

    prompt: int  # P: prefill's tokens
    cache: tuple[TensorSpec, ...]  # what decode returns after its logits (or writes)
    weights: tuple[TensorSpec, ...]
    vocab: int  # the logits' last dimension
    token_type: str = "i64"  # the token ids' and the position's element type
    in_place: bool = False  # the functions write the cache arguments (and return logits)
    batch: int = 1  # B: sequences a call (tokens [B, P])

    @property
    def cache_length(self) -> int:
        """C: positions the cache holds (its keys' third dimension, [1, heads, C, dim])."""
        return self.cache[0].shape[-2] if self.cache and len(self.cache[0].shape) >= 2 else 0

    @property
    def steps(self) -> int:
        """Decode steps the cache has room for after the prompt, at most DECODE_STEPS."""
        return max(0, min(DECODE_STEPS, self.cache_length - self.prompt))


def _is_tokens(spec: TensorSpec, batch: int, length: int | None = None) -> bool:
    shape_ok = len(spec.shape) == 2 and spec.shape[0] == batch
    return shape_ok and spec.element in INTEGER_TYPES and length in (None, spec.shape[1])


def cached_lm(entries: Sequence[EntryFunction]) -> CachedLM | None:
    """The model as a cached causal LM when it exports prefill and decode in the recipe's
    form (the cache returned, or written in place); None otherwise (its functions are still
    proved one by one)."""
    return read_cached_lm(entries)[0]


def read_cached_lm(entries: Sequence[EntryFunction]) -> tuple[CachedLM | None, str]:
    """`cached_lm`, and why a model exporting prefill and decode is none ('' where it is
    one, or exports no such pair): its tokens are then not generated, and the run says so."""
    named = {entry.name: entry for entry in entries}
    prefill, decode = named.get(PREFILL), named.get(DECODE)
    if prefill is None or decode is None:
        return None, ""
    if not prefill.inputs or not decode.outputs:
        return None, "prefill takes no input or decode returns nothing"
    in_place = bool(decode.written)
    count = len(decode.written) if in_place else len(decode.outputs) - 1
    cache = tuple(decode.inputs[2 : 2 + count]) if in_place else decode.outputs[1:]
    position = decode.inputs[1] if len(decode.inputs) > 1 else None
    batch = prefill.inputs[0].shape[0] if prefill.inputs[0].shape else 0
    if in_place:  # each writes its cache arguments, and returns its logits alone
        returned = (
            prefill.written == tuple(range(1, 1 + count))
            and decode.written == tuple(range(2, 2 + count))
            and len(prefill.outputs) == len(decode.outputs) == 1
        )
    else:
        returned = tuple(prefill.outputs[1:]) == cache
    checks = (
        (count > 0, "decode neither returns nor writes a cache"),
        (returned, "prefill and decode do not return (or write) the same cache"),
        (_is_tokens(prefill.inputs[0], batch), "prefill's first argument is no [B, P] token ids"),
        (_is_tokens(decode.inputs[0], batch, 1), "decode's first argument is no [B, 1] token id"),
        (position is not UNUSED_INPUT, "decode never reads its position (traced as a constant?)"),
        (
            position is not None and position.shape == (1,) and position.element in INTEGER_TYPES,
            "decode's second argument is no [1] integer position",
        ),
        (
            tuple(prefill.inputs[1 : 1 + count]) == cache
            and tuple(decode.inputs[2 : 2 + count]) == cache,
            "the cache arguments are not the cache the functions return or write",
        ),
        (
            prefill.inputs[1 + count :] == decode.inputs[2 + count :],
            "prefill and decode take different weights",
        ),
    )
    failed = [why for ok, why in checks if not ok]
    if failed:
        return None, failed[0]
    vocab = decode.outputs[0].shape[-1]
    weights = prefill.inputs[1 + count :]
    token_type = prefill.inputs[0].element
    prompt = prefill.inputs[0].shape[1]
    return CachedLM(prompt, cache, weights, vocab, token_type, in_place, batch), ""


@dataclass(frozen=True)
class Prompt:
    """What the builds generate from: the prompt, the weights, and torch's greedy tokens
    where the export saved them (`<model stem>.tokens.npz`: `prompt`, `tokens`, `seed`)."""

    tokens: np.ndarray  # [B, P]
    weights: list[np.ndarray]
    expected: tuple[int, ...] = ()  # torch's greedy tokens ((): none saved)
    source: str = "random"


def tokens_file(model_path: str) -> str:
    """Where the export recipe saves torch's greedy tokens for `model_path`."""
    return os.path.splitext(model_path)[0] + ".tokens.npz"


def _token_array(values, element: str) -> np.ndarray:
    return np.asarray(values, dtype=np.int32 if "32" in element else np.int64)


def make_prompt(lm: CachedLM, model_path: str, seed: int) -> Prompt:
    """torch's prompt, seed and greedy tokens from the export's `.tokens.npz` beside the
    model (when its prompt fits), else a prompt and weights drawn from `seed`."""
    shapes = [spec.shape for spec in lm.weights]
    saved = tokens_file(model_path)
    if os.path.isfile(saved):
        with np.load(saved) as data:
            prompt, tokens, saved_seed = data["prompt"], data["tokens"], int(data["seed"])
        if prompt.shape == (1, lm.prompt):
            expected = tuple(int(t) for t in tokens[: lm.steps + 1])
            weights = _typed(seeded_weights(shapes, saved_seed), lm.weights)
            return Prompt(_token_array(prompt, lm.token_type), weights, expected, saved)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, lm.vocab, (lm.batch, lm.prompt))
    weights = _typed(seeded_weights(shapes, seed), lm.weights)
    return Prompt(_token_array(prompt, lm.token_type), weights)


def _typed(arrays: list[np.ndarray], specs: Sequence[TensorSpec]) -> list[np.ndarray]:
    """The drawn (f32) weights in the types the model takes (a bf16 model's as bf16)."""
    return [
        a.astype(FLOAT_TYPES.get(s.element, a.dtype)) for a, s in zip(arrays, specs, strict=True)
    ]


@dataclass(frozen=True)
class Generated:
    """A build's greedy tokens, and at each step its first sequence's highest logits
    (token -> logit, TOP_LOGITS of them)."""

    tokens: list
    top: list[dict[int, float]]


def _top(logits: np.ndarray) -> dict[int, float]:
    """The first sequence's highest logits at the last position: token -> logit."""
    row = np.asarray(logits[0, -1], dtype=np.float32)
    best = np.argsort(row)[::-1][:TOP_LOGITS]
    return {int(t): float(row[t]) for t in best}


def greedy_tokens(vmfb: str, device: str, lm: CachedLM, prompt: Prompt) -> Generated:
    """The build's greedy tokens: prefill's last logits, then `lm.steps` decode calls, each
    fed the cache the previous call returned (or wrote: the same device buffers)."""
    prefill = LoadedModule(vmfb, device, PREFILL)
    decode = prefill.sibling(DECODE)
    empty = [np.zeros(spec.shape, FLOAT_TYPES.get(spec.element, np.float32)) for spec in lm.cache]
    cache = [prefill.on_device(array) for array in empty] if lm.in_place else empty
    weights = [prefill.on_device(array) for array in prompt.weights]  # copied once, not a call
    logits, *returned = prefill(prompt.tokens, *cache, *weights)
    cache = cache if lm.in_place else returned
    chosen = [np.argmax(logits[:, -1], axis=-1)]  # each sequence's greedy token
    top = [_top(logits)]
    for step in range(lm.steps):
        token = _token_array(chosen[-1][:, None], lm.token_type)
        position = _token_array([lm.prompt + step], lm.token_type)
        logits, *returned = decode(token, position, *cache, *weights)
        cache = cache if lm.in_place else returned
        chosen.append(np.argmax(logits[:, -1], axis=-1))
        top.append(_top(logits))
    # One sequence's tokens as ints (torch's saved tokens), several as a tuple a step.
    tokens = [int(c[0]) if lm.batch == 1 else tuple(int(t) for t in c) for c in chosen]
    return Generated(tokens, top)


def _parting(reference: Generated, other: list) -> tuple[int, int, int] | None:
    """(step, the reference's token, the other's) where `other` first parts from the
    reference's tokens; None where they agree or part in another sequence, whose logits
    are not kept."""
    pairs = enumerate(zip(reference.tokens, other, strict=True))
    step = next((i for i, (a, b) in pairs if a != b), None)
    if step is None:
        return None
    ours, theirs = _first_sequence(reference.tokens[step]), _first_sequence(other[step])
    return None if ours == theirs else (step, ours, theirs)


def near_tie(reference: Generated, other: list, element: str) -> str:
    """Where `other`'s tokens first part from `reference`'s and the reference's own logits
    put both tokens within NEAR_TIE[element] of each other (relative to its largest
    logit): how ('' where they agree, or part where no rounding explains it)."""
    parted = _parting(reference, other)
    if parted is None or element not in NEAR_TIE:
        return ""
    step, ours, theirs = parted
    logits = reference.top[step]
    best = max(logits.values())
    if theirs not in logits or best - logits[theirs] > NEAR_TIE[element] * max(abs(best), 1e-30):
        return ""
    return (
        f"token {step} at a near tie: the default's logits put {theirs} "
        f"{best - logits[theirs]:.3g} below its {ours}, within two {element} roundings of "
        f"{best:.3g}"
    )


def logit_gap(reference: Generated, other: list) -> str:
    """Where `other` parts from `reference` by more than a near tie: how far below its own
    token the reference's logits put `other`'s ('' where they agree), so a parting can be
    weighed against the outputs' tolerance."""
    parted = _parting(reference, other)
    if parted is None:
        return ""
    step, ours, theirs = parted
    logits = reference.top[step]
    if theirs not in logits:
        return f"{theirs} is not among the default's top {len(logits)} logits there"
    best = max(logits.values())
    gap = best - logits[theirs]
    share = gap / max(abs(best), 1e-30)
    return (
        f"the default's logits put {theirs} {gap:.3g} below its {ours} ({share:.2%} of {best:.3g})"
    )


def logit_drift(reference: Generated, other: Generated) -> str:
    """Where `other` parts from `reference`: both builds were fed the same tokens up to
    there, so how far apart their logits lie at each step (at the tokens both rank highest)
    says whether the parting is a rounding apart or grew from the first step on; and how
    far above the reference's token `other`'s own logits put its own ('' where they agree
    or share no top tokens)."""
    parted = _parting(reference, other.tokens)
    if parted is None:
        return ""
    step, ours, theirs = parted
    apart = [_apart(r, o) for r, o in zip(reference.top[: step + 1], other.top, strict=False)]
    known = [value for value in apart if value is not None]
    if not known:
        return ""
    own = other.top[step]
    lead = (
        f"its own put {theirs} {own[theirs] - own[ours]:.3g} above {ours}; " if ours in own else ""
    )
    first, there = (_said(apart[index]) for index in (0, step))
    return (
        f"{lead}fed the same tokens, its logits lay within {max(known):.3g} of the default's "
        f"up to there (token 0: {first}; token {step}: {there})"
    )


def _apart(reference: dict[int, float], other: dict[int, float]) -> float | None:
    """The largest difference of two builds' logits at the tokens both keep (None: none)."""
    shared = reference.keys() & other.keys()
    return max((abs(reference[t] - other[t]) for t in shared), default=None)


def _said(value: float | None) -> str:
    return "no shared top token" if value is None else f"{value:.3g}"


def _first_sequence(token) -> int:
    """A step's token of the first sequence (a step of several sequences is a tuple)."""
    return token[0] if isinstance(token, tuple) else token


@dataclass
class GreedyCheck:
    """Each build's greedy tokens over one prefill and `steps` decode steps."""

    steps: int
    tokens: dict[str, list[int]] = field(default_factory=dict)  # build -> its tokens
    expected: list[int] = field(default_factory=list)  # torch's ([]: not saved)
    source: str = "random"  # the prompt's: the export's .tokens.npz, or random
    message: str = ""  # why a build's tokens could not be made
    # A 16-bit model: torch's tokens (its own kernels, its own roundings) may part from
    # IREE's default build's at a near tie, so there they are compared and said, and the
    # builds must equal the default's; in f32 every build must equal torch's.
    sixteen_bit: bool = False
    # A 16-bit build whose tokens part from the default's at a near tie: build -> where.
    ties: dict[str, str] = field(default_factory=dict)
    # A build that parts from the default's tokens otherwise: build -> the logit gap there.
    gaps: dict[str, str] = field(default_factory=dict)

    @property
    def match(self) -> bool:
        """Every build's tokens equal the default's, or part from them at a near tie (and
        torch's, where saved and f32)."""
        return not self.message and bool(self.tokens) and not self.differing()

    def differing(self) -> list[str]:
        """The builds whose tokens neither equal the wanted ones (the default's; torch's,
        where saved and f32) nor part from them at a near tie."""
        runs = list(self.tokens.values())
        wanted = runs[0] if runs else []
        if self.expected and not self.sixteen_bit:
            wanted = self.expected
        return [name for name, t in self.tokens.items() if t != wanted and name not in self.ties]

    def torch_agreement(self) -> str:
        """For a 16-bit model whose default build parts from torch's tokens: how far they
        agree ('' where they agree, or where nothing compares)."""
        default = next(iter(self.tokens.values()), [])
        if not (self.sixteen_bit and self.expected and default) or default == self.expected:
            return ""
        same = next(
            (i for i, (a, b) in enumerate(zip(default, self.expected, strict=False)) if a != b),
            min(len(default), len(self.expected)),
        )
        return f"; torch's tokens equal the default's up to token {same} (16-bit rounding)"

    def first_difference(self) -> str:
        """`tuned: token 5 is 40, default's 12`, or '' when every build agrees."""
        names = list(self.tokens)
        reference = (names[0], self.tokens[names[0]])
        if self.expected and not self.sixteen_bit:
            reference = ("torch", self.expected)
        for name in names:
            for index, (got, want) in enumerate(zip(self.tokens[name], reference[1], strict=False)):
                if got != want:
                    gap = f"; {self.gaps[name]}" if name in self.gaps else ""
                    return f"{name}: token {index} is {got}, {reference[0]}'s {want}{gap}"
        return ""

    def line(self) -> str:
        """The proof's line for the generated tokens."""
        if self.message:
            return f"greedy tokens: not compared: {self.message}"
        count = self.steps + 1
        what = f"greedy tokens (prefill, then {self.steps} decode steps carrying the cache)"
        parted = self.torch_agreement()
        builds = " = ".join([*self.tokens, *(["torch"] if self.expected and not parted else [])])
        if self.match and self.ties:
            ties = "; ".join(f"{name}'s part at {where}" for name, where in self.ties.items())
            return f"{what}: equal until a near tie ({ties}){parted}"
        if self.match:
            return f"{what}: {count} of {count} equal: {builds}{parted}"
        return f"{what}: DIFFER ({self.first_difference()})"


def greedy_check(
    lm: CachedLM, builds: dict[str, str], device: str, model_path: str, seed: int
) -> GreedyCheck:
    """Every build (name -> vmfb) generates from one prompt; their tokens, and torch's."""
    prompt = make_prompt(lm, model_path, seed)
    narrow = next((spec.element for spec in lm.cache if spec.element in NEAR_TIE), "")
    check = GreedyCheck(
        lm.steps, expected=list(prompt.expected), source=prompt.source, sixteen_bit=bool(narrow)
    )
    generated = {}
    for name, vmfb in builds.items():
        try:
            generated[name] = greedy_tokens(vmfb, device, lm, prompt)
        except (RuntimeError, ValueError) as error:
            check.message = f"the {name} build fails: {str(error).splitlines()[0][:300]}"
            break
        check.tokens[name] = generated[name].tokens
    reference = next(iter(generated.values()), None)
    for name, run in list(generated.items())[1:]:
        where = near_tie(reference, run.tokens, narrow)
        if where:
            check.ties[name] = where
        elif gap := logit_gap(reference, run.tokens):
            drift = logit_drift(reference, run)
            check.gaps[name] = f"{gap}; {drift}" if drift else gap
    return check
