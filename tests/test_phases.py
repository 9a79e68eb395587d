"""Where a run's time goes (issue 49): the phase clock (nested and concurrent phases count
wall time once), the per-candidate split from the records, and a model run in fast mode
that prints the block and records `phases_s` and `candidates_s` in its summary (and times
no dispatch table: `dispatch_table = auto`)."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG
from test_model_run import MODELS

from autosched.cli import cli
from autosched.config import RunConfig
from autosched.outputs.records import Trial
from autosched.run.phases import PhaseClock, candidate_split, time_lines


def test_a_phase_entered_on_two_threads_at_once_counts_its_wall_time_once():
    clock = PhaseClock()

    def work() -> None:
        with clock.phase("defaults"):
            time.sleep(0.2)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with clock.phase("defaults"):  # a later entry adds to it
        time.sleep(0.05)
    seconds = clock.summary()["defaults"]
    assert 0.25 <= seconds < 0.45, seconds  # not 0.65: the threads overlapped


def test_phases_nest_and_unknown_names_are_refused():
    clock = PhaseClock()
    with clock.phase("search_iree"):
        with clock.phase("retiming"):
            time.sleep(0.02)
    summary = clock.summary()
    assert list(summary) == ["search_iree", "retiming", "total"]
    assert summary["search_iree"] >= summary["retiming"] >= 0.02
    assert summary["total"] >= summary["search_iree"]
    with pytest.raises(ValueError, match="unknown phase"):
        with clock.phase("lunch"):
            pass


def record(compile_s, verify_s, timing_s) -> Trial:
    return Trial(
        "p",
        "cpu",
        "",
        "c",
        {},
        False,
        "ok",
        compile_s=compile_s,
        verify_s=verify_s,
        timing_s=timing_s,
    )


def test_the_candidate_split_is_medians_and_totals_of_what_records_hold():
    trials = [record(2.0, 0.1, 0.3), record(4.0, 0.3, None), record(3.0, None, None)]
    split = candidate_split(trials)
    assert split["candidates"] == {"count": 3}
    assert split["compile"] == {"median": 3.0, "total": 9.0}
    assert split["check"] == {"median": 0.2, "total": 0.4}
    assert split["time"] == {"median": 0.3, "total": 0.3}
    clock = PhaseClock()
    with clock.phase("lowering"):
        pass
    lines = time_lines(clock, trials)
    assert lines[0].startswith("where the time went (")
    assert lines[1].strip().startswith("lowering")
    assert "candidates: 3 measured; compile 3.00 s median (9.0 s in all)" in lines[-1]


def test_dispatch_tables_are_timed_in_normal_and_extreme_modes_unless_asked():
    assert not RunConfig(mode="fast").times_dispatches
    assert RunConfig(mode="normal").times_dispatches
    assert RunConfig(mode="extreme").times_dispatches
    assert RunConfig(mode="fast", dispatch_table="all").times_dispatches
    assert not RunConfig(mode="normal", dispatch_table="none").times_dispatches


def test_a_fast_model_run_says_where_its_time_went(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG)  # dispatch_table: auto
    shutil.copy(f"{MODELS}/hf_llama_mlp_f32.mlirbc", tmp_path)
    result = CliRunner().invoke(
        cli, ["run", "hf_llama_mlp_f32.mlirbc", "--mode", "fast", "--budget", "2"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "generated/hf_llama_mlp_f32/results.summary.json").read_text())
    phases = summary["phases_s"]
    for phase in ("lowering", "dispatch_dump", "search_iree", "defaults", "proof"):
        assert phases[phase] > 0, phases
    if not phases["retiming"]:  # fast mode re-times no candidate under 0.95x of the default
        log = (tmp_path / "generated/hf_llama_mlp_f32/run.log").read_text()
        assert log.count("not re-timed: the best candidate was") == len(summary["problems"])
    assert "dispatch_tables" in phases and summary["dispatches"] == []  # fast: no table
    assert phases["total"] >= phases["lowering"] + phases["search_iree"] + phases["proof"]
    assert phases["search_iree"] >= phases["defaults"]
    measured = summary["candidates_s"]["candidates"]["count"]
    assert measured >= summary["trials"]  # the defaults are measured too
    assert summary["candidates_s"]["compile"]["total"] > 0
    assert "where the time went" in result.output and "candidates: " in result.output
    assert "timing every dispatch of the model" not in result.output
