"""Recorded tuning landscapes: every point of a space with its measured score.

A landscape lets tuners be replayed and compared without a compiler or a device
(see `autosched.simulate`). Two sources are read:

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

from autosched.errors import UserError

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
N_SMS = 132  # H200 streaming multiprocessors, for the "waves" feature
MMA_M, MMA_N, MMA_K = 16, 8, 16  # NV_MMA_SYNC_F32_16x8x16_F16 tile
BYTES_PER_ELEMENT = {"f16": 2, "bf16": 2, "f32": 4, "i8": 1}


@dataclass
class Landscape:
    """One problem's space: point i has features[i], scores[i] (NaN = failed)."""

    problem: str
    features: np.ndarray  # (n_points, n_features), float64
    scores: np.ndarray  # (n_points,), GFLOP/s, higher is better, NaN where the point failed
    baseline: float  # the default configuration's GFLOP/s; NaN when unknown
    descriptions: list[str]  # one human-readable line per point
    feature_names: list[str] = field(default_factory=list)

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


def _csv_features(row: dict[str, str], m: int, n: int, dtype: str) -> dict[str, float]:
    """log2 of the knobs plus what a person would derive from them (threads, waves, ...)."""
    knobs = {k: _number(row, k) for k in CSV_KNOBS}
    feats = {f"log2_{k}": (0.0 if v is None else _log2(v)) for k, v in knobs.items()}
    pipeline = row["pipeline"].strip()
    wg_m, wg_n = knobs["wg_m"] or 1.0, knobs["wg_n"] or 1.0
    if pipeline.endswith("mma"):
        sg_m, sg_n = knobs["sg_m"] or 1.0, knobs["sg_n"] or 1.0
        threads = (wg_m / (MMA_M * sg_m)) * (wg_n / (MMA_N * sg_n)) * 32
        k_tile = (knobs["reduction"] or 1.0) * MMA_K
    else:
        threads = (wg_n / (knobs["thread_n"] or 1.0)) * (wg_m / (knobs["thread_m"] or 1.0))
        k_tile = knobs["reduction"] or 1.0
    workgroups = math.ceil(m / wg_m) * math.ceil(n / wg_n)
    waves = workgroups / N_SMS
    elem = BYTES_PER_ELEMENT.get(dtype, 4)
    stages = knobs["stages"] or 1.0
    smem = (wg_m + wg_n) * k_tile * elem * stages if knobs["promote"] else 0.0
    feats.update(
        log2_threads=_log2(threads),
        log2_workgroups=_log2(workgroups),
        log2_waves=_log2(waves),
        # Share of the last wave that is busy: 1.0 means no tail effect.
        wave_efficiency=waves / math.ceil(waves),
        log2_smem_bytes=_log2(smem) if smem else 0.0,
        # FLOPs per byte loaded for one workgroup tile (K cancels out).
        log2_tile_intensity=_log2(2 * wg_m * wg_n / ((wg_m + wg_n) * elem)),
    )
    return feats


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
            feats = _csv_features(row, m, n, dtype) if pipeline != "default" else {}
        except (ValueError, TypeError, AttributeError, ZeroDivisionError) as error:
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
    from autosched.config import RunConfig
    from autosched.targets import make_target

    return make_target(RunConfig(target=name, arch=arch))


def _target_features(record: dict) -> dict[str, float] | None:
    """The features today's target computes for the record's point, when it can.

    Features are a function of the point, so replaying with the current code's features
    measures the current cost model, whatever features the record was written with.
    """
    from autosched.records import problem_from_shape

    shape, point = record.get("shape") or {}, record.get("point") or {}
    if record.get("target") not in ("cpu", "cuda") or not shape or not point:
        return None
    try:
        problem = problem_from_shape(shape)
        return _target_for(record["target"], record.get("arch") or "").features(problem, point)
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
    if record.get("status", "ok") != "ok" or not _is_number(gflops) or gflops <= 0:
        return math.nan
    return float(gflops)


def _from_jsonl(text: str, path: str) -> list[Landscape]:
    """One landscape per (problem, target, arch); lines that do not parse are skipped."""
    groups: dict[tuple, dict] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves a partial last line
        if not isinstance(record, dict) or not isinstance(record.get("problem"), str):
            continue
        key = (record["problem"], str(record.get("target", "")), str(record.get("arch", "")))
        group = groups.setdefault(key, {"points": {}, "baseline": math.nan})
        if record.get("baseline"):
            score = _record_score(record)
            if not math.isnan(score):
                group["baseline"] = score
            continue
        point = record.get("point") or {}
        if not isinstance(point, dict):
            continue  # not a record this tool wrote
        name = str(record.get("config") or json.dumps(point, sort_keys=True))
        previous = group["points"].get(name)
        score = _record_score(record)
        # A point measured twice keeps its successful measurement, the later one if both are.
        if previous is None or not math.isnan(score):
            group["points"][name] = (_record_features(record), score, _describe_point(point, name))

    problem_counts: dict[str, int] = {}
    for problem, _, _ in groups:
        problem_counts[problem] = problem_counts.get(problem, 0) + 1
    landscapes = []
    for (problem, target, arch), group in groups.items():
        points = list(group["points"].values())
        if not points:
            continue
        names = sorted({name for feats, _, _ in points for name in feats})
        features = np.array([[feats.get(n, 0.0) for n in names] for feats, _, _ in points])
        label = problem if problem_counts[problem] == 1 else f"{problem} ({target} {arch})"
        landscapes.append(
            Landscape(
                problem=label,
                features=features.reshape(len(points), len(names)).astype(np.float64),
                scores=np.array([s for _, s, _ in points], dtype=np.float64),
                baseline=group["baseline"],
                descriptions=[d for _, _, d in points],
                feature_names=names,
            )
        )
    if not landscapes and groups == {}:
        raise UserError(f"{path}: no tuning records could be read")
    return landscapes


def _describe_point(point: dict, name: str) -> str:
    if not point:
        return name
    return " ".join(f"{k}={v}" for k, v in point.items())
