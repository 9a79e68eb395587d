"""The knowledge base's seeds in replay: trials until a point within 3 % of a recorded
landscape's best is measured, with the tuner alone, with the target's starting points
(today's default without a knowledge base), and with the knowledge base's points first.

Leave-one-out: each landscape is seeded from the winners of the *other* landscapes given
(autosched/search/knowledge.py), never from its own records. No compiler, no device.

    python3 benchmarks/transfer_replay.py A.jsonl B.jsonl ... --out RESULT.md [--seeds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from dataclasses import replace

import numpy as np

from autosched.drivers.simulate import replay
from autosched.outputs.records import TuningDatabase
from autosched.search import knowledge
from autosched.search.landscape import Landscape, load_landscapes

WITHIN = 0.03
N_TRIAL = 32


def recorded_points(path: str) -> dict[str, tuple[list[dict], dict]]:
    """Each problem's points in the landscape's order (first appearance of each config),
    and its shape, as `landscape._from_jsonl` reads them."""
    found: dict[str, tuple[dict[str, dict], dict]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            points, _ = found.setdefault(record["problem"], ({}, record.get("shape") or {}))
            if not record.get("baseline"):
                points.setdefault(str(record["config"]), record.get("point") or {})
    return {name: (list(points.values()), shape) for name, (points, shape) in found.items()}


def trials_to(landscape: Landscape, order: list[int]) -> int:
    """Trials (1-based) until a point within WITHIN of the best is measured."""
    goal = (1 - WITHIN) * landscape.best
    scores = landscape.scores
    return next((i for i, p in enumerate(order, 1) if scores[p] >= goal), len(order) + 1)


def variants(landscape: Landscape, first: list[int]) -> dict[str, Landscape | None]:
    """The first points of each variant (None: none, the tuner alone)."""
    return {
        "tuner alone": None,
        "target's starting points": landscape,
        "with the knowledge base": replace(landscape, starting=first),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landscapes", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--tuner", default="xgboost")
    args = parser.parse_args()
    rows = []
    for path in args.landscapes:
        others = [p for p in args.landscapes if p != path]
        trials = [t for p in others for t in TuningDatabase(p).records()]
        base = knowledge.from_trials(trials)
        points = recorded_points(path)
        for landscape in load_landscapes(path):
            space, shape = points[landscape.problem]
            assert len(space) == landscape.n_points, "points not in the landscape's order"
            shape_class = knowledge.ShapeClass.of("cpu", "", shape)
            found = base.nearest(shape_class)
            seeds = knowledge.seed_indices([s.point for s in found], space)
            first = knowledge.first_points(found, space, landscape.starting)
            for name, seeded in variants(landscape, first).items():
                use = seeded or landscape
                runs = [
                    trials_to(
                        landscape,
                        replay(use, args.tuner, seed, N_TRIAL, starting=seeded is not None).order,
                    )
                    for seed in range(args.seeds)
                ]
                kb = seeds and name == "with the knowledge base"
                share = float(np.nanmax(landscape.scores[seeds]) / landscape.best) if kb else None
                rows.append(
                    f"| {landscape.problem} | {landscape.n_points} | {name} | "
                    f"{statistics.median(runs):g} | {max(runs)} | "
                    f"{f'{share:.1%}' if share is not None else ''} |"
                )
    lines = [
        "# The knowledge base's seeds in replay (leave-one-out)",
        "",
        f"Machine: {platform.node()} ({os.cpu_count()} cores); replay only. Tuner "
        f"{args.tuner}, {args.seeds} seeds, batches of 8.",
        "",
        f"    python3 benchmarks/transfer_replay.py {' '.join(args.landscapes)} --out {args.out} "
        f"--seeds {args.seeds} --tuner {args.tuner}",
        "",
        f"*trials*: until a point within {WITHIN:.0%} of the landscape's best is measured "
        "(median and worst over seeds); *seeds' best*: the best seeded point's share of it.",
        "",
        "The target's starting points (CPU_STARTING, targets/cpu.py) were picked from these two "
        "landscapes, so they know both problems; the knowledge base of each is the other's "
        "winners only.",
        "",
        "| problem | space | first batch | trials (median) | worst | seeds' best |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
