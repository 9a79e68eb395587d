"""Fast mode's shortcuts (issue 49): candidates timed first and checked only when they can
still win, shorter timings, fewer finalists, the points around the best next, the defaults'
builds compiled on every core at once, and known winners judged against the faster default."""

from __future__ import annotations

import json
import os
import re
import shutil

from click.testing import CliRunner
from test_model_run import MODELS

from autosched.cli import cli
from autosched.compile import CompileJob
from autosched.config import RunConfig
from autosched.drivers.model_stages import search as search_stage
from autosched.measure.benchmark_tool import Timing
from autosched.measure.contract import CHECK, TIMED, Candidate, Measurement
from autosched.outputs.records import UNCHECKED, Trial
from autosched.run.retime import FAST_FLOOR
from autosched.run.timed_first import Reach, merged, timed_first
from autosched.search import knowledge

FAST_CFG = """
[Env]
jobs = 2
[SearchStrategy]
tuner = random
batch_size = 4
[Benchmark]
repetitions = 3
min_time = 0.005
"""
# Vectors of one element: every point is many times slower than IREE's default.
SLOW_SPACE = "[SearchSpace]\nvec_m = [1]\nvec_n = [1]\nvec_k = [1]\n"
MODEL = "hf_llama_mlp_f32"


def _fast_run(folder, cfg: str, budget: int) -> tuple[list[dict], dict]:
    """A fast run of the Llama MLP in `folder`: its records and its summary."""
    (folder / "auto-scheduler.cfg").write_text(cfg)
    shutil.copy(f"{MODELS}/{MODEL}.mlirbc", folder)
    result = CliRunner().invoke(
        cli, ["run", f"{MODEL}.mlirbc", "--mode", "fast", "--budget", str(budget)]
    )
    assert result.exit_code == 0, result.output
    work = folder / "generated" / MODEL
    records = [json.loads(line) for line in (work / "tuning.jsonl").read_text().splitlines()]
    return records, json.loads((work / "results.summary.json").read_text())


def test_a_candidate_out_of_reach_is_timed_but_never_built_for_its_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    records, summary = _fast_run(tmp_path, FAST_CFG + SLOW_SPACE, budget=4)
    candidates = [r for r in records if not r["baseline"]]
    assert len(candidates) == 4
    for record in candidates:
        assert record["status"] == UNCHECKED, record
        assert record["median_ms"] > record["reference_ms"] / FAST_FLOOR
        assert record["verification"] == "" and "answer not checked" in record["message"]
        assert record["gflops"] > 0  # the tuner learns from the time
        folder = tmp_path / "generated" / MODEL / "linalg"
        assert not list(folder.rglob(f"{record['config']}.check.vmfb"))  # never built
        assert list(folder.rglob(f"{record['config']}.dispatch.vmfb"))
    for baseline in (r for r in records if r["baseline"]):
        assert baseline["verification"] == "correct" and baseline["compile_s"] > 0
    assert all(not row["in_spec"] and row["trials"] == 2 for row in summary["problems"])
    # Run again in the folder: the unchecked records are resumed, never measured twice.
    again, _ = _fast_run(tmp_path, FAST_CFG + SLOW_SPACE, budget=8)
    points = [(r["problem"], r["config"]) for r in again if not r["baseline"]]
    assert len(points) > len(candidates) and len(points) == len(set(points))
    log = (tmp_path / "generated" / MODEL / "run.log").read_text()
    assert "unreadable" not in log and "resumed 2 trials" in log
    assert not os.path.exists(tmp_path / "generated" / MODEL / "results.spec.mlir")
    # Without a probe, the default's own timed build names the root's form as timed (its
    # configured executables kept, though its job was written again after it was built).
    assert all(row["timed_form"].startswith("linalg.") for row in summary["problems"])


def test_a_fast_run_checks_every_candidate_within_reach_of_the_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    records, summary = _fast_run(tmp_path, FAST_CFG, budget=8)
    candidates = [r for r in records if not r["baseline"] and r["median_ms"]]
    assert candidates
    for record in candidates:
        reach = record["reference_ms"] / FAST_FLOOR
        if record["status"] == "ok":
            assert record["verification"] == "correct" and record["median_ms"] <= reach
        elif record["median_ms"] <= reach:  # within reach, but not among the 2 fastest
            assert record["status"] == UNCHECKED and "fastest checked" in record["message"]
            faster = [
                r for r in candidates
                if r["problem"] == record["problem"] and r["status"] == "ok"
                and r["median_ms"] < record["median_ms"]
            ]  # fmt: skip
            assert len(faster) >= 2
        else:
            assert record["status"] == UNCHECKED and "out of reach" in record["message"]
    chosen = {row["problem"] for row in summary["problems"] if row["in_spec"]}
    checked = {r["problem"] for r in candidates if r["status"] == "ok"}
    assert chosen <= checked  # a winner was checked
    log = (tmp_path / "generated" / MODEL / "run.log").read_text()
    ahead = re.findall(r"the first batches' (\d+) timed builds compiled on every core", log)
    assert len(ahead) == 1 and int(ahead[0]) >= len(summary["problems"])


def test_fast_mode_times_shorter_and_re_times_fewer():
    fast = RunConfig(mode="fast", repetitions=5, min_time=0.05, retime_top=3)
    assert (fast.first_pass_repetitions, fast.repetition_s, fast.finalists) == (3, 0.01, 2)
    assert fast.retime_repetition_s == 0.02  # the paired rounds that name the winner
    normal = RunConfig(mode="normal", repetitions=5, min_time=0.05, retime_top=3)
    assert (normal.first_pass_repetitions, normal.repetition_s, normal.finalists) == (5, 0.05, 3)
    assert normal.retime_repetition_s == 0.05
    assert RunConfig(mode="fast", repetitions=1, min_time=0.005).repetition_s == 0.005


def test_the_points_around_a_point_are_one_knob_doubled_or_halved():
    space = [
        {"tile": t, "vec": v, "order": o} for t in (4, 8, 16, 32) for v in (1, 2, 4) for o in "ab"
    ]
    centre = {"tile": 8, "vec": 2, "order": "a"}
    found = knowledge.neighbours(centre, space, skip=[], seed=0)
    expected = [
        {"tile": 4, "vec": 2, "order": "a"},
        {"tile": 16, "vec": 2, "order": "a"},
        {"tile": 8, "vec": 1, "order": "a"},
        {"tile": 8, "vec": 4, "order": "a"},
    ]
    assert sorted(found) == sorted(space.index(p) for p in expected)
    skipped = knowledge.neighbours(centre, space, skip=[space.index(expected[0])], seed=0)
    assert space.index(expected[0]) not in skipped and len(skipped) == 3
    assert knowledge.neighbours(centre, space, [], seed=1) != found or len(found) < 2


def _trial(median_ms: float, reference_ms: float | None = None, baseline: bool = False) -> Trial:
    return Trial(
        problem="p", target="cpu", arch="", config="c", point={}, baseline=baseline,
        status="ok", median_ms=median_ms, cv=0.01, reference_ms=reference_ms,
    )  # fmt: skip


def test_a_known_win_is_judged_against_the_faster_timing_of_the_default():
    default = _trial(3.8, baseline=True)
    # The default re-timed at 11.8 ms beside the batch (a busy moment): 4.6 ms is no win.
    assert knowledge.beats_default(_trial(4.6, reference_ms=11.8), default) is None
    assert knowledge.beats_default(_trial(1.9, reference_ms=11.8), default) == 2.0
    assert knowledge.beats_default(_trial(1.9, reference_ms=3.0), default) == 3.0 / 1.9


def test_a_checked_candidate_keeps_its_time_and_takes_the_checks_verdict():
    timed = Measurement("local-task", timing=Timing("ok", median_ms=1.0), timing_s=0.1)
    checked = Measurement("local-task", verification="correct", max_error=0.0, verify_s=0.2)
    both = merged(timed, checked)
    assert both.status == "ok" and both.verification == "correct" and both.timing.median_ms == 1.0
    wrong = Measurement("local-task", "wrong_answer", "off by 3", verification="wrong_answer")
    assert merged(timed, wrong).status == "wrong_answer"
    assert merged(timed, None) is None  # its check did not build: the build's failure stands


def test_a_candidate_is_checked_only_while_it_can_still_be_a_finalist():
    reach = Reach(limit_ms=10.0, kept_ms=(4.0,), keep=2)
    assert reach.cutoff([]) == 10.0  # one checked so far: room for another finalist
    assert reach.cutoff([6.0, 8.0]) == 6.0  # 4 and 6 are the two fastest
    assert reach.cutoff([3.0, 2.0]) == 3.0
    assert Reach(limit_ms=5.0, kept_ms=(1.0, 9.0), keep=2).cutoff([]) == 5.0  # the default's
    assert Reach(limit_ms=5.0).cutoff([1.0, 2.0, 3.0]) == 5.0  # no finalist cut


class _Scripted:
    """An executor (the measuring seam, not IREE) that answers each build with a scripted
    outcome: a candidate's time for its timed build, its verdict for its check."""

    def __init__(self, times: dict[str, float], verdicts: dict[str, str]):
        self.times, self.verdicts, self.checked = times, verdicts, []

    def run(self, candidates, prepare, done):
        for candidate in candidates:
            (role,) = candidate.jobs
            if role == TIMED:
                timing = Timing("ok", median_ms=self.times[candidate.name])
                done(candidate, {}, Measurement("cpu", timing=timing))
                continue
            self.checked.append(candidate.name)
            verdict = self.verdicts[candidate.name]
            status = "ok" if verdict == "correct" else verdict
            done(candidate, {}, Measurement("cpu", status, verification=verdict))


def test_a_failed_check_lets_the_next_fastest_candidate_be_checked():
    """The two fastest are checked first; where their checks fail (a configuration IREE did
    not apply, a wrong answer), the next fastest within reach move up, so that a candidate
    faster than the default is not left unchecked; once two pass, slower ones are not."""
    times = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 9.0}

    def run(verdicts):
        candidates = [
            Candidate(
                n,
                {"p": 1},
                {TIMED: CompileJob("x", f"{n}.t", []), CHECK: CompileJob("x", f"{n}.c", [])},
            )
            for n in times
        ]
        executor, outcomes = _Scripted(times, verdicts), {}
        reach = Reach(limit_ms=5.0, keep=2)
        timed_first(
            executor, candidates, None, lambda c, b, o: outcomes.setdefault(c.name, o), reach
        )
        return executor.checked, {n: o.status for n, o in outcomes.items()}

    failing = {"a": "not_applied", "b": "wrong_answer", "c": "correct", "d": "correct"}
    checked, statuses = run(failing)
    assert checked == ["a", "b", "c", "d"]
    assert statuses == {
        "a": "not_applied",
        "b": "wrong_answer",
        "c": "ok",
        "d": "ok",
        "e": UNCHECKED,
    }
    checked, statuses = run({n: "correct" for n in times})
    assert checked == ["a", "b"] and statuses["c"] == statuses["d"] == UNCHECKED


def test_a_problem_left_to_the_custom_route_has_its_default_timed_alone(tmp_path, monkeypatch):
    """Fast mode runs no IREE candidate of a problem the custom route searches, so its
    default is timed without a check module or a spec probe: no `.check.vmfb`, and a
    default record with no verification. (The custom route then searches it on its bare
    kernel: on the CPU, its default alone, checked against numpy.)"""
    monkeypatch.chdir(tmp_path)

    def every_dispatch(tuning, problems, model_path):
        return {e.problem.name: e.problem for e in problems if e.benchmark is not None}

    monkeypatch.setattr(search_stage, "custom_coverage", every_dispatch)
    records, summary = _fast_run(tmp_path, FAST_CFG, budget=8)
    work = tmp_path / "generated" / MODEL
    assert not list((work / "linalg").rglob("*.check.vmfb"))
    on_dispatch = [r for r in records if "timed on the dispatch" in r["flags"]]
    assert [r["baseline"] for r in on_dispatch] == [True] * len(summary["problems"])
    for default in on_dispatch:  # no IREE candidate; the default timed, unchecked
        assert default["status"] == "ok" and default["verification"] == ""
        assert default["median_ms"] > 0
    log = (work / "run.log").read_text()
    assert log.count("fast mode leaves it to the custom route") == len(summary["problems"])
    assert "spec reaches the configured root" not in log and "checked on the dispatch" not in log
