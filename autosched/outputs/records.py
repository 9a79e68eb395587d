"""The measurement log: one JSON object per trial, appended and flushed as it happens.

It is the tuning database: a later run on the same problem, target and arch reads it back
and re-measures nothing it holds; `autosched simulate` replays it as a landscape.
"""

from __future__ import annotations

import errno
import json
import math
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from importlib.metadata import version

from autosched.ops.base import Problem
from autosched.ops.registry import BASE_KIND, kind

# not_applied: the module built for the point does not carry its configuration (a spec whose
# matcher missed the root op IREE configures): never timed as if it were the candidate.
FAILED = ("invalid", "compile_error", "not_applied", "runtime_error", "timeout", "wrong_answer")
# Timed, but out of reach of the default, so its answer was never checked (fast mode checks
# only what can still win): its time counts for the search, and it is never a winner.
UNCHECKED = "unchecked"


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
    # The default's timing this trial was scored against (re-timed between batches, on the
    # same device): the score is this trial's speedup over it, on the first default's scale.
    reference_ms: float | None = None
    verify_s: float | None = None  # wall seconds spent checking the answer
    verify_phases: dict = field(default_factory=dict)  # its steps in the worker, in seconds
    timing_s: float | None = None  # wall seconds spent in iree-benchmark-module
    message: str = ""
    iree_version: str = ""
    device: str = ""  # the IREE device URI it ran on (empty in records written before 0.2)
    flags: str = ""  # the target's iree-compile flags, space-separated
    shape: dict = field(default_factory=dict)  # m, n, k, batch, types, transposes
    features: dict = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def timed(self) -> bool:
        """Timed to the end: ok, or unchecked (a time, but never a winner)."""
        return self.status in ("ok", UNCHECKED)


def finite(value):
    """`value` with every NaN or infinite float (a default build that overflows, a ratio of
    two of them) as None: JSON has no such numbers, and a reader of the file must parse it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_text(value, **options) -> str:
    """Strict JSON (see `finite`)."""
    return json.dumps(finite(value), allow_nan=False, **options)


def problem_shape(problem: Problem) -> dict:
    """What a record keeps of its problem's shape (each kind's problem says)."""
    return problem.record_shape()


def problem_from_shape(shape: dict) -> Problem:
    """The problem a record was measured on (no op sites: it is not in any module here), of
    the kind its shape names (an attention's or a convolution's only in its op form, the
    custom route's, which records all of it)."""
    return kind(shape.get("kind", BASE_KIND)).problem_type.from_shape(shape)


def iree_version() -> str:
    try:
        return version("iree-base-compiler")
    except Exception:  # noqa: BLE001 - a version string is informative only
        return "unknown"


@dataclass(frozen=True)
class MeasureContext:
    """What a measurement depends on besides its point: a record made under another
    context (IREE version, device, compile flags) is measured again, not resumed."""

    iree_version: str
    device: str
    flags: str
    # The run's other measuring devices (--devices): their records, scored on the first
    # device's scale, resume too.
    other_devices: tuple[str, ...] = ()

    def resumes(self, trial: Trial) -> bool:
        if trial.iree_version != self.iree_version:
            return False
        if not trial.device:  # written before records named their device: trust successes
            return trial.ok
        return trial.device in (self.device, *self.other_devices) and trial.flags == self.flags


_FIELDS = {f.name: f for f in fields(Trial)}
_TEXT = ("problem", "target", "arch", "config", "status")
_NUMBERS = (
    "compile_s",
    "max_error",
    "median_ms",
    "cv",
    "gflops",
    "reference_ms",
    "verify_s",
    "timing_s",
)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def trial_from_record(raw: object) -> Trial:
    """A Trial from one decoded JSON line; ValueError says why the line cannot be one."""
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    for key in _TEXT:
        if not isinstance(raw.get(key), str):
            raise ValueError(f"{key} is not a string")
    if raw["status"] not in ("ok", UNCHECKED, *FAILED):
        raise ValueError(f"unknown status {raw['status']!r}")
    if not isinstance(raw.get("point"), dict):
        raise ValueError("point is not an object")
    if not isinstance(raw.get("baseline"), bool):
        raise ValueError("baseline is not true or false")
    for key in _NUMBERS:
        if raw.get(key) is not None and not _is_number(raw[key]):
            raise ValueError(f"{key} is not a number")
    if raw["status"] == "ok":
        for key in ("median_ms", "gflops"):
            value = raw.get(key)
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"status ok with {key} = {value!r}")
    known = {k: v for k, v in raw.items() if k in _FIELDS}  # newer fields are ignored
    for key in ("shape", "features", "verify_phases"):
        if not isinstance(known.get(key, {}), dict):
            raise ValueError(f"{key} is not an object")
    for key in ("compile_status", "verification", "message", "iree_version", "device", "flags"):
        if not isinstance(known.get(key, ""), str):
            raise ValueError(f"{key} is not a string")
    return Trial(**known)


class TuningDatabase:
    """Append-only JSON-lines file; every record is one write, synced before returning.

    A line torn by a full disk or a kill is never glued to the next record: an append
    first ends an unterminated last line. Lines that cannot be read (torn, not UTF-8,
    fields of the wrong type) are skipped and counted in `skipped`, never fatal.
    """

    def __init__(self, path: str):
        self.path = path
        self.skipped: Counter[str] = Counter()  # reason -> unreadable lines, from the last load
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def append(self, trial: Trial) -> None:
        data = (json_text(asdict(trial), sort_keys=True) + "\n").encode("utf-8")
        descriptor = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(descriptor).st_size
            if size and os.pread(descriptor, 1, size - 1) != b"\n":
                data = b"\n" + data
            if os.write(descriptor, data) != len(data):
                raise OSError(errno.ENOSPC, "short write: the disk is full", self.path)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def compact(self) -> int:
        """Removes torn lines (not UTF-8, or not JSON: a write cut short by a full disk or a
        kill) so that they are not warned about on every run; every other line stays as it
        is, in order. Written to a temporary file and renamed over the database, so a crash
        here loses nothing. Returns how many lines went (call it holding the run's lock)."""
        if not os.path.isfile(self.path):
            return 0
        kept, torn = [], 0
        with open(self.path, "rb") as handle:
            for line in handle:
                if not line.strip():
                    continue
                try:
                    json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    torn += 1
                    continue
                kept.append(line if line.endswith(b"\n") else line + b"\n")
        if torn:
            temporary = self.path + ".compact"
            with open(temporary, "wb") as handle:
                handle.writelines(kept)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        return torn

    def records(self) -> list[Trial]:
        """Every readable record, in file order; unreadable lines are counted in `skipped`."""
        self.skipped = Counter()
        if not os.path.isfile(self.path):
            return []
        trials = []
        with open(self.path, "rb") as handle:
            for line in handle:
                if not line.strip():
                    continue
                try:
                    trials.append(trial_from_record(json.loads(line.decode("utf-8"))))
                except UnicodeDecodeError:
                    self.skipped["not UTF-8"] += 1
                except json.JSONDecodeError:
                    self.skipped["not JSON (a torn line?)"] += 1
                except (ValueError, TypeError) as error:
                    self.skipped[str(error)] += 1
        return trials

    def load(
        self, problem: str, target: str, arch: str, context: MeasureContext | None = None
    ) -> list[Trial]:
        """Earlier trials of this problem on this target, measured under `context`.

        The newest record of a point wins; records from another IREE version, device or
        flag set are left out, so they are measured again.
        """
        found: dict[tuple[str, bool], Trial] = {}
        for trial in self.records():
            if (trial.problem, trial.target, trial.arch) != (problem, target, arch):
                continue
            if context is not None and not context.resumes(trial):
                continue
            found[(trial.config, trial.baseline)] = trial
        return list(found.values())
