"""Builds the shipped knowledge base (autosched/search/knowledge.json) from the committed
tuning databases: every `benchmarks/results/**/*.jsonl` (run databases, landscapes, sweeps),
each tuned problem's points that beat its default beyond the noise, by target, arch and
shape class (autosched/search/knowledge.py).

    python3 tools/build_knowledge.py                  # writes the shipped file
    python3 tools/build_knowledge.py --out FILE DB.jsonl ...   # other databases
"""

from __future__ import annotations

import argparse
import glob
import os
from collections import Counter

from autosched.outputs.records import TuningDatabase
from autosched.search.knowledge import SHIPPED, Knowledge, from_trials

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATABASES = os.path.join(ROOT, "benchmarks", "results", "**", "*.jsonl")


def build(paths: list[str]) -> Knowledge:
    """Every database's winners, merged (a problem in several keeps the fastest)."""
    knowledge = Knowledge()
    for path in paths:
        knowledge = knowledge.merged(from_trials(TuningDatabase(path).records()))
    knowledge.problems.sort(key=lambda p: (p.target, p.arch, p.problem))
    return knowledge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("databases", nargs="*", help="JSON-lines databases (default: committed)")
    parser.add_argument("--out", default=SHIPPED, help="the knowledge base to write")
    args = parser.parse_args()
    paths = args.databases or sorted(glob.glob(DATABASES, recursive=True))
    knowledge = build(paths)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(knowledge.to_json())
    problems = knowledge.problems
    counts = Counter((p.target, p.arch or "-", p.shape.get("kind", "matmul")) for p in problems)
    print(f"{os.path.relpath(args.out)}: {len(problems)} problems from {len(paths)} databases")
    for (target, arch, kind), count in sorted(counts.items()):
        print(f"  {target} {arch} {kind}: {count}")


if __name__ == "__main__":
    main()
