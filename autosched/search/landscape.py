"""Recorded tuning landscapes: every point of a space with its measured score.

A landscape lets tuners be replayed and compared without a compiler or a device
(see `autosched.drivers.simulate`). Two sources are read:

* a CSV like `h200_matmul_4096_landscape.csv` (one row per configuration, `time_ms`
  per call; the `default` pipeline row is IREE's own configuration = the baseline);
* the tool's own tuning database, JSON lines with one record per measured point.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
from dataclasses import dataclass, field

import click
import numpy as np

from autosched.config import RunConfig
from autosched.errors import UserError
from autosched.outputs.records import UNCHECKED, problem_from_shape
from autosched.search.space import matching_points
from autosched.targets import make_target
from autosched.targets.base import recorded_point
from autosched.targets.cuda import MMA_FOR_TYPES, NONE

# Numeric knob columns of the landscape CSV, in feature order.
CSV_KNOBS = (
    "wg_m",
    "wg_n",
    "sg_m",
    "sg_n",
    "thread_m",
    "thread_n",
    "reduction",
    "stages",
    "promote",
)
CSV_REQUIRED = ("M", "N", "K", "dtype", "pipeline", *CSV_KNOBS, "time_ms")
MMA_K = 16  # reduction elements per step of the 16x8x16 intrinsics the CSV's mma rows use


@dataclass
class Landscape:
    """One problem's space: point i has features[i], scores[i] (NaN = failed)."""

    problem: str
    features: np.ndarray  # (n_points, n_features), float64
    scores: np.ndarray  # (n_points,), GFLOP/s, higher is better, NaN where the point failed
    baseline: float  # the default configuration's GFLOP/s; NaN when unknown
    descriptions: list[str]  # one human-readable line per point
    feature_names: list[str] = field(default_factory=list)
    starting: list[int] = field(default_factory=list)  # the target's known-good points here
    lhs_type: str = ""  # the input element type, for a replay's history; "" when unknown

    @property
    def n_points(self) -> int:
        return len(self.scores)

    @property
    def best(self) -> float:
        """The best recorded score (NaN when every point failed)."""
        ok = self.scores[~np.isnan(self.scores)]
        return float(ok.max()) if ok.size else math.nan


def load_landscapes(path: str) -> list[Landscape]:
    """Reads a landscape CSV or a JSON-lines tuning database, chosen by content."""
    if not os.path.isfile(path):
        raise UserError(f"landscape file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read landscape file {path}: {error}") from None
    if text.lstrip().startswith("{"):
        landscapes = _from_jsonl(text, path)
    else:
        landscapes = _from_csv(text, path)
    if not landscapes:
        raise UserError(f"no problems in landscape file {path}")
    return landscapes


# --- CSV -------------------------------------------------------------------------------


def _log2(value: float) -> float:
    """log2 for positive values; 0 (and 1 for promote=1) stay distinct: log2(0) -> -1."""
    return math.log2(value) if value > 0 else -1.0


def _number(row: dict[str, str], key: str) -> float | None:
    text = (row.get(key) or "").strip()
    return float(text) if text else None


CSV_ARCH = "sm_90"  # the shipped CSV landscapes are H200 measurements; an `arch` column wins


def _csv_point(row: dict[str, str], dtype: str, acc: str) -> dict:
    """The CUDA target's point for one CSV row (its knob names and meanings)."""
    pipeline, _, kind = row["pipeline"].strip().partition("-")
    knobs = {k: int(_number(row, k) or 0) for k in CSV_KNOBS}
    mma = kind == "mma"
    return {
        "pipeline": pipeline,
        "mma_kind": MMA_FOR_TYPES[(dtype, acc)] if mma else NONE,
        "tile_m": knobs["wg_m"],
        "tile_n": knobs["wg_n"],
        # `reduction` counts mma steps of 16 with tensor cores, elements without.
        "tile_k": knobs["reduction"] * (MMA_K if mma else 1),
        "subgroup_m": knobs["sg_m"],
        "subgroup_n": knobs["sg_n"],
        "thread_m": knobs["thread_m"],
        "thread_n": knobs["thread_n"],
        "block_dim_x": 0,
        "block_dim_y": 0,
        "block_dim_z": 0,
        "pipeline_depth": knobs["stages"],
        "promote_operands": knobs["promote"],
        "warps": 0,  # custom kernels' knobs: the CSV holds IREE configurations only
        "group_m": 0,
        "split_k": 0,
        "persistent": 0,
        "specialized": 0,
    }


def _csv_features(row: dict[str, str], m: int, n: int, k: int, dtype: str) -> dict[str, float]:
    """The CUDA target's own features of the row's point: the cost model replayed here is
    the one `autosched run` uses."""
    acc = (row.get("acc") or "f32").strip()
    shape = {
        "op": "linalg.matmul",
        "m": m,
        "n": n,
        "k": k,
        "batch": 0,
        "lhs_type": dtype,
        "rhs_type": dtype,
        "acc_type": acc,
        "transpose_a": False,
        "transpose_b": False,
        "zero_init": True,
    }
    target = _target_for("cuda", (row.get("arch") or CSV_ARCH).strip())
    return target.features(problem_from_shape(shape), _csv_point(row, dtype, acc))


def _describe_csv(row: dict[str, str]) -> str:
    parts = [row["pipeline"].strip()]
    parts += [f"{k}={row[k].strip()}" for k in CSV_KNOBS if (row.get(k) or "").strip()]
    return " ".join(parts)


def _from_csv(text: str, path: str) -> list[Landscape]:
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in CSV_REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise UserError(f"{path}: not a landscape CSV, missing columns {', '.join(missing)}")
    problems: dict[tuple, dict] = {}
    pipelines: set[str] = set()
    for line, row in enumerate(reader, start=2):
        try:
            m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
            time_ms = _number(row, "time_ms")
            dtype = row["dtype"].strip()
            pipeline = row["pipeline"].strip()
            feats = _csv_features(row, m, n, k, dtype) if pipeline != "default" else {}
        except (KeyError, ValueError, TypeError, AttributeError, ZeroDivisionError) as error:
            raise UserError(f"{path}:{line}: bad landscape row ({error})") from None
        key = (m, n, k, dtype)
        entry = problems.setdefault(key, {"points": [], "baseline": math.nan})
        gflops = 2.0 * m * n * k / (time_ms * 1e6) if time_ms and time_ms > 0 else math.nan
        if pipeline == "default":
            entry["baseline"] = gflops
            continue
        pipelines.add(pipeline)
        entry["points"].append((feats, pipeline, gflops, _describe_csv(row)))

    pipeline_names = sorted(pipelines)
    landscapes = []
    for (m, n, k, dtype), entry in problems.items():
        points = entry["points"]
        if not points:
            continue
        knob_names = list(points[0][0])
        rows = [
            [feats[name] for name in knob_names] + [float(pipeline == p) for p in pipeline_names]
            for feats, pipeline, _, _ in points
        ]
        landscapes.append(
            Landscape(
                problem=f"matmul_{m}x{n}x{k}_{dtype}",
                lhs_type=dtype,
                features=np.asarray(rows, dtype=np.float64),
                scores=np.asarray([g for _, _, g, _ in points], dtype=np.float64),
                baseline=entry["baseline"],
                descriptions=[d for _, _, _, d in points],
                feature_names=knob_names + [f"pipeline={p}" for p in pipeline_names],
            )
        )
    return landscapes


# --- JSON lines (the tuning database) ---------------------------------------------------


@functools.cache
def _target_for(name: str, arch: str):
    return make_target(RunConfig(target=name, arch=arch))


def _target_starting(record: dict, points: list[dict]) -> list[int]:
    """Which recorded points today's target measures first (`Target.starting_points`)."""
    try:
        problem = problem_from_shape(record.get("shape") or {})
        target = _target_for(record["target"], record.get("arch") or "")
        return matching_points(points, target.starting_points(problem))
    except (KeyError, TypeError, ValueError, click.ClickException):
        return []


def _target_features(record: dict) -> dict[str, float] | None:
    """The features today's target computes for the record's point, when it can.

    Features are a function of the point, so replaying with the current code's features
    measures the current cost model, whatever features the record was written with.
    """
    shape, point = record.get("shape") or {}, record.get("point") or {}
    if record.get("target") not in ("cpu", "cuda") or not shape or not point:
        return None
    try:
        problem = problem_from_shape(shape)
        target = _target_for(record["target"], record.get("arch") or "")
        return target.features(problem, recorded_point(target, point))
    except (KeyError, TypeError, ValueError, ZeroDivisionError, click.ClickException):
        return None


def _record_features(record: dict) -> dict[str, float]:
    """Today's target features, else the record's own `features`, else log2 of the point."""
    computed = _target_features(record)
    if computed is not None:
        return computed
    given = record.get("features")
    if isinstance(given, dict) and given:
        return {str(k): float(v) for k, v in given.items() if _is_number(v)}
    point = record.get("point") or {}
    return {f"log2_{k}": _log2(float(v)) for k, v in point.items() if _is_number(v)}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _record_score(record: dict) -> float:
    gflops = record.get("gflops")
    timed = record.get("status", "ok") in ("ok", UNCHECKED)  # unchecked: timed, out of reach
    if not timed or not _is_number(gflops) or gflops <= 0:
        return math.nan
    return float(gflops)


WARNED_LINES = 3  # malformed lines named one by one; the rest are counted


def _malformed(record: dict) -> str:
    """Why a record's fields cannot be read as this tool writes them ("" when they can)."""
    for key in ("shape", "point"):
        if key in record and record[key] is not None and not isinstance(record[key], dict):
            return f"{key} is not an object"
    return ""


def _warn_malformed(path: str, malformed: list[tuple[int, str]]) -> None:
    """One warning per skipped line (file:line: reason), the first few, then a count."""
    for number, reason in malformed[:WARNED_LINES]:
        click.echo(f"warning: {path}:{number}: line skipped ({reason})", err=True)
    if len(malformed) > WARNED_LINES:
        click.echo(
            f"warning: {path}: {len(malformed) - WARNED_LINES} more malformed line(s) skipped",
            err=True,
        )


def _from_jsonl(text: str, path: str) -> list[Landscape]:
    """One landscape per (problem, target, arch); lines that do not parse are skipped, and
    records whose fields have the wrong type are skipped with a warning naming the line."""
    groups: dict[tuple, dict] = {}
    malformed: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves a partial last line
        if not isinstance(record, dict) or not isinstance(record.get("problem"), str):
            continue
        reason = _malformed(record)
        if reason:
            malformed.append((number, reason))
            continue
        key = (record["problem"], str(record.get("target", "")), str(record.get("arch", "")))
        group = groups.setdefault(key, {"points": {}, "baseline": math.nan, "record": record})
        if record.get("baseline"):
            score = _record_score(record)
            if not math.isnan(score):
                group["baseline"] = score
            continue
        point = record.get("point") or {}
        name = str(record.get("config") or json.dumps(point, sort_keys=True))
        previous = group["points"].get(name)
        score = _record_score(record)
        # A point measured twice keeps its successful measurement, the later one if both are.
        if previous is None or not math.isnan(score):
            features = _record_features(record)
            group["points"][name] = (features, score, _describe_point(point, name), point)

    _warn_malformed(path, malformed)
    problem_counts: dict[str, int] = {}
    for problem, _, _ in groups:
        problem_counts[problem] = problem_counts.get(problem, 0) + 1
    landscapes = []
    for (problem, target, arch), group in groups.items():
        points = list(group["points"].values())
        if not points:
            continue
        names = sorted({name for feats, *_ in points for name in feats})
        features = np.array([[feats.get(n, 0.0) for n in names] for feats, *_ in points])
        label = problem if problem_counts[problem] == 1 else f"{problem} ({target} {arch})"
        landscapes.append(
            Landscape(
                problem=label,
                features=features.reshape(len(points), len(names)).astype(np.float64),
                scores=np.array([s for _, s, _, _ in points], dtype=np.float64),
                baseline=group["baseline"],
                descriptions=[d for _, _, d, _ in points],
                feature_names=names,
                starting=_target_starting(group["record"], [p for *_, p in points]),
                lhs_type=str((group["record"].get("shape") or {}).get("lhs_type") or ""),
            )
        )
    if not landscapes and groups == {}:
        raise UserError(f"{path}: no tuning records could be read")
    return landscapes


def _describe_point(point: dict, name: str) -> str:
    if not point:
        return name
    return " ".join(f"{k}={v}" for k, v in point.items())
