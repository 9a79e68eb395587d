"""The noise guard: a winner must beat the default in every paired round, by more than
the noise of the measurements themselves."""

from __future__ import annotations

from types import SimpleNamespace

from autosched.ops.matmul import MatmulProblem
from autosched.outputs.records import Trial
from autosched.outputs.report import CUSTOM_NOTE, summary_rows
from autosched.run.problem import BASELINE, ProblemResult
from autosched.run.retime import FAST_FLOOR, finalists, judge, paired_verdict, timed_rounds


def rounds(default: list[float], candidate: list[float]) -> list[dict[str, float]]:
    return [{BASELINE: d, "c": c} for d, c in zip(default, candidate, strict=True)]


def test_a_steady_win_is_a_winner():
    verdict = paired_verdict(rounds([10.0, 10.2, 9.9], [8.0, 8.1, 7.9]), "c")
    assert verdict.beats_default and 1.24 < verdict.median < 1.27


def test_losing_one_round_is_not_a_win():
    verdict = paired_verdict(rounds([10.0, 10.0, 10.0], [8.0, 8.0, 10.5]), "c")
    assert not verdict.beats_default


def test_a_gain_inside_the_noise_is_not_a_win():
    """The default drifted +176 % on a loaded CPU once; a 5 % gain inside such noise is none."""
    verdict = paired_verdict(rounds([10.0, 27.6, 12.0], [9.5, 26.0, 11.4]), "c")
    assert min(verdict.speedups) > 1  # faster in each round, yet
    assert verdict.noise > 0.4 and not verdict.beats_default


def test_no_paired_round_is_no_win():
    assert not paired_verdict([{BASELINE: 1.0}, {"c": 0.5}], "c").beats_default


def trial(name: str, ms: float, gflops: float, baseline: bool = False) -> Trial:
    return Trial(
        problem="p",
        target="cpu",
        arch="",
        config=name,
        point={},
        baseline=baseline,
        status="ok",
        median_ms=ms,
        gflops=gflops,
    )


def test_retiming_with_a_fake_timer_names_the_steady_winner():
    """Re-timing is pure over its timer: the finalists by score, timed round by round with
    the default, and the fastest named only when it beats the default every round."""
    default = trial(BASELINE, 10.0, 1.0, baseline=True)
    trials = [trial("a", 9.0, 1.1), trial("b", 6.0, 1.6), trial("c", 7.0, 1.4), trial("d", 0.1, 0)]
    trials[3].status = "wrong_answer"
    contenders, entries = finalists(trials, default, top=2)
    assert [t.config for t in contenders] == ["b", "c"]
    assert [t.config for t in entries] == [BASELINE, "b", "c"]
    times = {BASELINE: iter([10.0, 10.1, 9.9]), "b": iter([8.0, 8.1, 7.9]), "c": iter([7.5] * 3)}
    calls = []

    def fake(name: str) -> float | None:
        calls.append(name)
        return next(times[name])

    found = judge(contenders, timed_rounds([t.config for t in entries], fake, rounds=3))
    assert calls == [BASELINE, "b", "c"] * 3  # interleaved, round by round
    assert found.winner.config == "c" and found.final["c"] == 7.5
    assert found.baseline_ms == 10.0 and found.beats_default


def test_retiming_a_candidate_that_loses_a_round_keeps_the_default():
    default = trial(BASELINE, 10.0, 1.0, baseline=True)
    contenders, entries = finalists([trial("a", 9.0, 1.1)], default, top=3)
    times = {BASELINE: iter([10.0, 10.0, 10.0]), "a": iter([9.0, 10.5, 9.0])}
    found = judge(contenders, timed_rounds([t.config for t in entries], lambda n: next(times[n])))
    assert found.winner.config == "a" and not found.beats_default


def test_a_finalist_that_fails_to_time_is_left_out():
    default = trial(BASELINE, 10.0, 1.0, baseline=True)
    contenders, entries = finalists([trial("a", 9.0, 1.1)], default, top=1)
    found = judge(contenders, timed_rounds([t.config for t in entries], lambda n: None))
    assert found.winner is None and found.baseline_ms is None


def test_a_noisy_near_win_says_so_and_what_to_do():
    """The quick start on a busy machine ended "nothing beat IREE's default" while its best
    candidate was faster but inside the noise: the last line says which (issue 26)."""
    from autosched.outputs.report import no_winner_line
    from autosched.run.problem import ProblemResult

    class Named:
        name = "matmul_512x512x512_f32_f32_f32"

    noisy = ProblemResult(Named(), None)
    noisy.verdict = paired_verdict(rounds([10.0, 27.6, 12.0], [9.5, 26.0, 11.4]), "c")
    line = no_winner_line([noisy])
    assert "too noisy to name a winner" in line and "repetitions and min_time" in line
    slower = ProblemResult(Named(), None)
    slower.verdict = paired_verdict(rounds([10.0, 10.0, 10.0], [11.0, 11.0, 11.0]), "c")
    assert no_winner_line([slower]) == "no tuning spec: nothing beat IREE's default configurations"


def test_fast_mode_re_times_no_clear_loser():
    """With fast mode's floor, a candidate clearly slower than the default on the first pass
    (against the default timed nearest to it) is not re-timed; one near it still is."""
    default = trial(BASELINE, 10.0, 1.0, baseline=True)
    loser, near = trial("loser", 12.0, 0.8), trial("near", 10.2, 0.98)
    assert finalists([loser], default, top=1, floor=FAST_FLOOR) == ([], [])
    assert finalists([loser], default, top=1)[0] == [loser]  # normal mode: re-timed
    near.reference_ms = 10.0  # the default re-timed beside it
    assert finalists([loser, near], default, top=2, floor=FAST_FLOOR)[0] == [near]


def test_fast_mode_re_times_no_finalist_far_behind_the_fastest():
    """Fast mode re-times a second finalist only within FAST_GAP of the fastest's first-pass
    speedup: 1.8x behind it, it cannot overtake it; close behind, it can."""
    default = trial(BASELINE, 10.0, 1.0, baseline=True)
    fast, far, close = trial("fast", 5.0, 2.0), trial("far", 9.0, 1.11), trial("close", 6.0, 1.67)
    assert finalists([fast, far], default, top=2, floor=FAST_FLOOR)[0] == [fast]
    assert finalists([fast, close], default, top=2, floor=FAST_FLOOR)[0] == [fast, close]
    assert finalists([fast, far], default, top=2)[0] == [fast, far]  # normal mode: both


def test_fast_mode_re_times_the_fastest_where_the_default_did_not_build():
    """The Llama-3-8B layer's narrowed MLP matmuls (bf16 out): IREE's default of the bare op
    fails to distribute, so no candidate has a speedup; fast mode's floor dropped every one
    and the 4.9x kernels never reached the model. Without a default, the fastest by time and
    those within FAST_GAP of it are re-timed."""
    failed = trial(BASELINE, 0.0, 0.0, baseline=True)
    failed.status = "compile_error"
    fast, close, far = trial("fast", 0.31, 7.7), trial("close", 0.35, 6.9), trial("far", 0.6, 4.0)
    contenders, entries = finalists([far, close, fast], failed, top=2, floor=FAST_FLOOR)
    assert contenders == [fast, close] and entries == [fast, close]
    assert finalists([far, fast], None, top=2, floor=FAST_FLOOR)[0] == [fast]


def test_a_slow_default_is_not_timed_again_beside_finalists_far_ahead_of_it():
    """IREE's attention at 197 tokens: 18.5 ms a dispatch, 200 to a call of its module (3.7 s);
    finalists 460x faster on the first pass are re-timed among themselves. A default under a
    second a call, or one finalist within CLEAR_MARGIN of it, is timed beside them."""
    from autosched.run.retime import CLEAR_MARGIN, retimes_default

    default = trial(BASELINE, 18.5, 0.2, baseline=True)
    flash = [trial("fa_m128_n32", 0.040, 95.0), trial("fa_m128_n64", 0.0403, 94.0)]
    assert not retimes_default(flash, default, 18.5 * 200 / 1e3)
    assert retimes_default(flash, default, 0.9)
    close = [flash[0], trial("slow", 18.5 / (CLEAR_MARGIN - 1), 1.0)]
    assert retimes_default(close, default, 3.7)
    contenders, _ = finalists(flash, default, top=2)
    found = judge(
        contenders,
        timed_rounds(
            ["fa_m128_n32", "fa_m128_n64"], {"fa_m128_n32": 0.04, "fa_m128_n64": 0.041}.get
        ),
    )
    assert (
        found.winner.config == "fa_m128_n32" and found.beats_default and found.baseline_ms is None
    )


def test_the_closing_table_says_when_a_winner_had_no_default_to_beat():
    """A custom search whose IREE default did not build (the narrowed matmuls' bare bf16-out
    op, before their default was built in f32 and rounded): its row gives the kernel's time
    and says `no default`, not `not tuned`; a problem with no candidate run keeps
    `(IREE default)`, and one fast mode left to the custom route says so."""
    shape = {"op": "linalg.batch_matmul", "m": 2048, "n": 4096, "k": 4096, "batch": 1}
    types = {"lhs_type": "bf16", "rhs_type": "bf16", "acc_type": "bf16"}
    flags = {"transpose_a": False, "transpose_b": False, "zero_init": True}
    problem = MatmulProblem.from_shape({**shape, **types, **flags})
    failed = trial(BASELINE, 0.0, 0.0, baseline=True)
    failed.status = "compile_error"
    kernel = trial("tr_wg128x256x64_w8_s3_g8", 0.1032, 666.0)
    narrow = ProblemResult(problem, SimpleNamespace(points=[0] * 440), [failed, kernel], failed)
    narrow.best, narrow.best_ms = kernel, 0.1032
    untouched = ProblemResult(problem, SimpleNamespace(points=[0] * 440), [], None)
    routed = ProblemResult(problem, SimpleNamespace(points=[0] * 440), [], None)
    routed.custom_route = True  # fast mode ran no IREE candidate of it
    text = summary_rows([narrow, untouched, routed], CUSTOM_NOTE)
    first, second, third = text.splitlines()[2:5]
    assert "0.1032" in first and "no default" in first and "tr_wg128x256x64_w8_s3_g8" in first
    assert "(IREE default)" in second and "none faster" in second
    assert "(custom route)" in third and "none faster" not in third
    assert text.endswith(CUSTOM_NOTE)
