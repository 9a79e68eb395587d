"""The measurement log: one JSON object per trial, appended and flushed as it happens.

It is the tuning database: a later run on the same problem, target and arch reads it back
and re-measures nothing it holds; `autosched simulate` replays it as a landscape.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

from autosched.analysis import MatmulProblem

FAILED = ("invalid", "compile_error", "runtime_error", "timeout", "wrong_answer")


@dataclass
class Trial:
    """One measured point (or the IREE default, when `baseline` is true)."""

    problem: str
    target: str
    arch: str
    config: str
    point: dict
    baseline: bool
    status: str  # ok, or one of FAILED
    compile_status: str = ""
    compile_s: float | None = None
    verification: str = ""  # correct, wrong_answer, or empty when not run
    max_error: float | None = None
    median_ms: float | None = None
    cv: float | None = None
    samples_ms: list[float] | None = None
    gflops: float | None = None
    verify_s: float | None = None  # wall seconds spent checking the answer
    timing_s: float | None = None  # wall seconds spent in iree-benchmark-module
    message: str = ""
    iree_version: str = ""
    shape: dict = field(default_factory=dict)  # m, n, k, batch, types, transposes
    features: dict = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def problem_shape(problem: MatmulProblem) -> dict:
    return {
        "op": problem.op_name,
        "m": problem.m,
        "n": problem.n,
        "k": problem.k,
        "batch": problem.batch,
        "lhs_type": problem.lhs_type,
        "rhs_type": problem.rhs_type,
        "acc_type": problem.acc_type,
        "transpose_a": problem.transpose_a,
        "transpose_b": problem.transpose_b,
        "zero_init": problem.zero_init,
    }


def _indexing_maps(batched: bool, transpose_a: bool, transpose_b: bool) -> str:
    """The op's maps for a layout, as the bindings print them."""
    b, m, n, k = ("d0, ", "d1", "d2", "d3") if batched else ("", "d0", "d1", "d2")
    dims = f"({b}{m}, {n}, {k})"
    lhs = f"{k}, {m}" if transpose_a else f"{m}, {k}"
    rhs = f"{n}, {k}" if transpose_b else f"{k}, {n}"
    maps = [f"affine_map<{dims} -> ({b}{x})>" for x in (lhs, rhs, f"{m}, {n}")]
    return f"[{', '.join(maps)}]"


def problem_from_shape(shape: dict) -> MatmulProblem:
    """The problem a record was measured on (no op sites: it is not in any module here)."""
    return MatmulProblem(
        op_name=shape["op"],
        m=shape["m"],
        n=shape["n"],
        k=shape["k"],
        batch=shape["batch"],
        lhs_type=shape["lhs_type"],
        rhs_type=shape["rhs_type"],
        acc_type=shape["acc_type"],
        transpose_a=shape["transpose_a"],
        transpose_b=shape["transpose_b"],
        zero_init=shape["zero_init"],
        indexing_maps=_indexing_maps(
            bool(shape["batch"]), shape["transpose_a"], shape["transpose_b"]
        ),
    )


def iree_version() -> str:
    try:
        from importlib.metadata import version

        return version("iree-base-compiler")
    except Exception:  # noqa: BLE001 - a version string is informative only
        return "unknown"


class TuningDatabase:
    """Append-only JSON-lines file; every write is flushed and synced before returning."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def append(self, trial: Trial) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(asdict(trial), sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def load(self, problem: str, target: str, arch: str) -> list[Trial]:
        """Earlier trials of this problem on this target; a torn last line is skipped."""
        if not os.path.isfile(self.path):
            return []
        found: dict[tuple[str, bool], Trial] = {}
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    raw = json.loads(line)
                    trial = Trial(**raw)
                except (json.JSONDecodeError, TypeError):
                    continue
                if (trial.problem, trial.target, trial.arch) == (problem, target, arch):
                    found[(trial.config, trial.baseline)] = trial  # the newest wins
        return list(found.values())
