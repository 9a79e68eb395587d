"""The noise guard: a winner must beat the default in every paired round, by more than
the noise of the measurements themselves."""

from __future__ import annotations

from autosched.runner import BASELINE, paired_verdict


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
