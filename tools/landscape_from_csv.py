"""A run's results.csv as a replayable landscape: the tool's own JSON-lines records, trimmed
to what `autosched simulate` and benchmarks/repeatability.py read.

    python3 tools/landscape_from_csv.py RESULTS.csv --arch sm_90 --out LANDSCAPE.jsonl

The CSV's target column names the architecture (`cuda:sm_90`) only as text; give it with
`--arch`. The matmul's operand layout is not in the CSV and is taken as plain (no transposed
operand), as the suite's and the held-out shapes' modules are. `gflops` is the CSV's own,
which on a run over several devices is already on the first device's scale.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from autosched.config import RunConfig  # noqa: E402
from autosched.targets import make_target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--arch", required=True)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    with open(options.csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    name = rows[0]["target"].split(":")[0]  # the CSV names the target as cuda:sm_90
    target = make_target(RunConfig(target=name, arch=options.arch))
    knobs = [k.name for k in target.knobs]
    with open(options.out, "w") as out:
        for row in rows:
            batch = int(row["batch"] or 0)
            baseline = row["config"] == "iree_default"
            record = {
                "problem": row["problem"],
                "target": name,
                "arch": options.arch,
                "config": row["config"],
                "baseline": baseline,
                "status": row["status"],
                "gflops": float(row["gflops"]) if row["gflops"] else None,
                "point": {} if baseline else {k: _value(row[k]) for k in knobs if row.get(k)},
                "shape": {
                    "op": "linalg.batch_matmul" if batch else "linalg.matmul",
                    "m": int(row["M"]),
                    "n": int(row["N"]),
                    "k": int(row["K"]),
                    "batch": batch,
                    "lhs_type": row["lhs_type"],
                    "rhs_type": row["rhs_type"],
                    "acc_type": row["acc_type"],
                    "transpose_a": False,
                    "transpose_b": False,
                    "zero_init": True,
                },
            }
            out.write(json.dumps(record, sort_keys=True) + "\n")
    print(f"{len(rows)} records -> {options.out}")


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        return text


if __name__ == "__main__":
    main()
