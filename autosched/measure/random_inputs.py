"""Random inputs: what a run draws for a model's arguments where the user gives none (or
leaves out the last ones), seeded, in ranges a model of any depth keeps finite (module_io's
`make_inputs` says which)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autosched.errors import UserError

INTEGER_HIGH = 8  # integer inputs are drawn from [0, 8): valid as small indices and counts
# Each redraw (after IREE's default gave NaN or inf) keeps 1-D float arguments in
# STATISTICS_RANGE and shrinks the others SHRINK times more.
STATISTICS_RANGE = (0.5, 1.5)
SHRINK = 4.0
FLOATS = {"f16": np.float16, "f32": np.float32, "f64": np.float64}


def integer_type(element: str) -> tuple[bool, int] | None:
    """(signed, bits) for i8, si32, ui16, ...; None for a float type."""
    for prefix, signed in (("ui", False), ("si", True), ("i", True)):
        if element.startswith(prefix) and element[len(prefix) :].isdigit():
            return signed, int(element[len(prefix) :])
    return None


def _scale(spec) -> float:
    return 1.0 / max(1.0, float(max(spec.shape, default=1))) ** 0.5


def random_values(rng: np.random.Generator, spec, draw: int, what: str):
    """One argument's random values (`spec`: module_io's TensorSpec; see `make_inputs`);
    `what` names it in the error."""
    integer = integer_type(spec.element)
    if integer is not None:
        high = 2 if integer[1] == 1 else INTEGER_HIGH
        return rng.integers(0, high, size=spec.shape)
    if spec.element in FLOATS or spec.element == "bf16":
        return _random_floats(rng, spec, draw)
    raise UserError(f"{what} is {spec.text}: no random inputs of it")


def _random_floats(rng: np.random.Generator, spec, draw: int) -> np.ndarray:
    """Uniform floats for one argument (see `make_inputs` for the ranges)."""
    if draw and len(spec.shape) == 1:
        return rng.uniform(*STATISTICS_RANGE, size=spec.shape)
    return rng.uniform(-1.0, 1.0, size=spec.shape) * _scale(spec) / SHRINK**draw


def drawn_after(given: int, inputs: Sequence) -> bool:
    """Whether a file of the first `given` arrays may stand for a function's `inputs`
    (module_io's TensorSpecs), the others drawn at random (seeded, as a run without inputs
    draws them): the given ones fix every dynamic size and each one left out is static (a
    causal LM's weights after its tokens: a bucket need not hold gigabytes of weights). A
    model of static sizes takes all its arrays or none."""
    kept, left = inputs[:given], inputs[given:]
    dynamic = any(spec.dynamic for spec in kept)
    return 0 < given < len(inputs) and dynamic and not any(spec.dynamic for spec in left)
