"""What a run leaves behind for people: the CSV, run.log, the closing summary table and the
line that says why no spec came out."""

from __future__ import annotations

import csv
import datetime
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from autosched.ops.matmul import MatmulProblem
from autosched.outputs.records import Trial
from autosched.run.problem import ProblemResult

BASE_COLUMNS = [
    "problem",
    "function",
    "M",
    "N",
    "K",
    "batch",
    "lhs_type",
    "rhs_type",
    "acc_type",
    "target",
    "config",
]
RESULT_COLUMNS = [
    "status",
    "compile_status",
    "compile_s",
    "verification",
    "max_error",
    "device",
    "median_ms",
    "cv",
    "gflops",
    "speedup",
    "retimed_ms",
    "rank",
    "chosen",
    "message",
]


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


class CsvReport:
    """One row per trial, written as measured; ranks are filled in at the end.

    Every write replaces the whole file through a temporary one, so the CSV is never half
    written, and the last run's CSV stays until this run has a row of its own: a run that
    fails early (a bad database, a full disk) does not cut it to its header.
    """

    def __init__(self, path: str, knob_names: tuple[str, ...]):
        self.path = path
        self.columns = BASE_COLUMNS + list(knob_names) + RESULT_COLUMNS
        self.knob_names = knob_names
        self.rows: list[dict[str, str]] = []
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def _write(self) -> None:
        temporary = self.path + ".tmp"
        try:
            with open(temporary, "w", newline="", encoding="utf-8") as handle:
                writer = csv.DictWriter(handle, self.columns)
                writer.writeheader()
                writer.writerows(self.rows)
            os.replace(temporary, self.path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise

    def row_for(self, problem: MatmulProblem, trial: Trial, baseline_ms: float | None) -> dict:
        timed = trial.timed and trial.median_ms and baseline_ms
        speedup = baseline_ms / trial.median_ms if timed else None
        row = {
            "problem": problem.name,
            "function": ";".join(sorted({s.function for s in problem.sites})),
            **problem.csv_shape(),  # each kind fills M, N, K its own way
            "target": trial.target + (f":{trial.arch}" if trial.arch else ""),
            "config": trial.config,
            **{k: trial.point.get(k, "") for k in self.knob_names},
            "status": trial.status,
            "compile_status": trial.compile_status,
            "compile_s": _fmt(trial.compile_s, 3),
            "verification": trial.verification,
            "max_error": _fmt(trial.max_error, 3),
            "device": trial.device,
            "median_ms": _fmt(trial.median_ms, 5),
            "cv": _fmt(trial.cv, 3),
            "gflops": _fmt(trial.gflops, 5),
            "speedup": _fmt(speedup, 4),
            "retimed_ms": "",
            "rank": "",
            "chosen": "",
            "message": trial.message,
        }
        return {k: str(v) for k, v in row.items()}

    def add(self, problem: MatmulProblem, trial: Trial, baseline_ms: float | None) -> dict:
        row = self.row_for(problem, trial, baseline_ms)
        self.rows.append(row)
        self._write()
        return row

    def finish(self, retimed: dict[tuple[str, str], float], chosen: set[tuple[str, str]]) -> None:
        """Marks the re-timed medians and the chosen rows, and ranks each problem's correct
        rows (`rank_rows`)."""
        for row in self.rows:
            key = (row["problem"], row["config"])
            if key in retimed:
                row["retimed_ms"] = _fmt(retimed[key], 5)
        mark_chosen(self.rows, chosen)
        if self.rows:
            self._write()


def mark_chosen(rows: list[dict], chosen: set[tuple[str, str]]) -> None:
    """Sets each row's `chosen` flag from (problem, config) pairs and ranks each problem's
    correct rows so that the ranks follow the choice: the chosen row first, then the rows
    timed again beside the default (by that time), then the rest by their first
    measurement. A first measurement alone does not outrank the choice: candidates 1.2-2.1x
    faster at first once ranked above a chosen `iree_default` that the re-timing or the
    whole model's verdict kept."""
    by_problem: dict[str, list[dict]] = {}
    for row in rows:
        row["chosen"] = "yes" if (row["problem"], row["config"]) in chosen else ""
        row["rank"] = ""
        if row["status"] == "ok" and row["median_ms"]:
            by_problem.setdefault(row["problem"], []).append(row)
    for ranked in by_problem.values():
        ranked.sort(key=_rank_key)
        for rank, row in enumerate(ranked, start=1):
            row["rank"] = str(rank)


def _rank_key(row: dict) -> tuple:
    retimed = row.get("retimed_ms") or ""
    return (
        row["chosen"] != "yes",
        not retimed,
        float(retimed) if retimed else float(row["median_ms"]),
    )


def rechoose_csv(path: str, chosen: set[tuple[str, str]]) -> None:
    """The CSV at `path` with its chosen rows and ranks set again: what the whole model's
    verdict kept (a spec not kept chooses IREE's default for every problem)."""
    if not os.path.isfile(path):
        return
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns, rows = list(reader.fieldnames or []), list(reader)
    if "chosen" not in columns:
        return
    mark_chosen(rows, chosen)
    temporary = path + ".tmp"
    with open(temporary, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(temporary, path)


class RunLog:
    """run.log: appended, one dated section per run, each line flushed as written.

    Problems tuned at the same time (one thread each) write their lines through
    `buffered`, so that each problem's section reads in one piece.
    """

    latest: str | None = None  # the log of this process's last run: where a crash is told

    def __init__(self, path: str):
        self.path = path
        RunLog.latest = path
        self._local = threading.local()  # this thread's buffer, while `buffered` is open
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.write(
            f"\n===== autosched run {datetime.datetime.now().isoformat(timespec='seconds')} ====="
        )

    def write(self, line: str = "") -> None:
        buffer = getattr(self._local, "buffer", None)
        if buffer is not None:
            buffer.append(line)
            return
        self._append([line])

    def _append(self, lines: list[str]) -> None:
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))

    @contextmanager
    def buffered(self) -> Iterator[None]:
        """This thread's lines are held, and written together at the end (also when the
        run is interrupted): the database, not the log, is what a crash must not lose."""
        self._local.buffer = []
        try:
            yield
        finally:
            lines, self._local.buffer = self._local.buffer, None
            if lines:
                self._append(lines)

    def section(self, title: str) -> None:
        self.write(f"\n--- {title} ---")


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table (for the terminal and run.log)."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def summary_rows(results: list[ProblemResult], note: str = "") -> str:
    """The closing table: each problem's space, trials, default and best time, and winner;
    under it `note` (BENCHMARK_NOTE, a model's, by default)."""
    rows = []
    for r in results:
        failed = sum(1 for t in r.trials if not t.timed)
        best = r.best
        rows.append(
            [
                r.problem.name,
                f"{len(r.space.points)}",
                f"{len(r.trials)}" + (f" ({r.resumed} resumed)" if r.resumed else ""),
                f"{failed}" + (f" ({r.not_applied} not applied)" if r.not_applied else ""),
                f"{r.baseline_ms:.4g}" if r.baseline_ms else "-",
                f"{r.best_ms:.4g}" if r.best_ms else "-",
                f"{r.problem.flops / (r.best_ms * 1e6):.4g}" if r.best_ms else "-",
                speedup_cell(r),
                best.config if best else "(custom route)" if r.custom_route else "(IREE default)",
            ]
        )
    headers = [
        "problem",
        "space",
        "trials",
        "failed",
        "default ms",
        "best ms",
        "GFLOP/s",
        "speedup",
        "best config",
    ]
    return table(headers, rows) + "\n" + (note or BENCHMARK_NOTE)


BENCHMARK_NOTE = (
    "(times and speedups: each problem's own dispatch timed alone, as IREE's dispatch "
    "benchmark; inside the whole model it may gain less: see the model line and the "
    "dispatch table)"
)
# The custom route's table: its kernels are timed on their bare op, not IREE's dispatch.
CUSTOM_NOTE = (
    "(custom kernels: each problem's kernel timed alone on its bare op, against IREE's "
    "default of that op where it builds; the model line says what they gave in place)"
)
# A module of bare matmuls has no model line and no dispatch table to point to.
MODULE_NOTE = (
    "(times: each matmul's function compiled and timed alone; speedup: IREE's default over "
    "the best, timed again side by side)"
)


def speedup_cell(result: ProblemResult) -> str:
    if result.speedup:
        return f"{result.speedup:.2f}x"
    if result.best is not None:  # a winner without a default to hold it against
        return "no default"
    if result.custom_route:
        return "-"
    return "not tuned" if not_tuned_reason(result) else "none faster"


def not_tuned_reason(result: ProblemResult) -> str:
    """Why a problem was not tuned ('' when it was): its search stopped before any check
    could be made, or IREE's default failed on it, so no candidate could be compared."""
    if result.stopped and not result.trials:
        return result.stopped.removeprefix(result.problem.name + ": ")
    baseline = result.baseline
    if baseline is not None and not baseline.ok:
        return f"IREE's default: {baseline.status}: {baseline.message}"
    return ""


def no_winner_line(results: list[ProblemResult]) -> str:
    """Why no spec came out, in a newcomer's words: nothing was faster, or something was but
    the timings moved too much between rounds to name it, and what to do then."""
    noisy = [r for r in results if r.verdict is not None and r.verdict.median > 1 and not r.best]
    if not noisy:
        return "no tuning spec: nothing beat IREE's default configurations"
    worst = max(noisy, key=lambda r: r.verdict.noise)
    return (
        f"no tuning spec: too noisy to name a winner: {worst.problem.name}'s best candidate "
        f"was {worst.verdict.median:.2f}x IREE's default, but its timings moved "
        f"{worst.verdict.noise:.1%} between rounds. Run again on a quieter machine, or raise "
        "[Benchmark] repetitions and min_time"
    )
