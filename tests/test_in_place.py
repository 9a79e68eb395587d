"""Which points a custom matmul winner is timed against in the model, and which it keeps
(drivers/in_place.py): on the H100, ViT-B/16's fc1 ran its bare winner (persistent,
warp-specialized) in 0.058 ms and in the model, with its bias and erf GELU, in 0.110."""

from __future__ import annotations

from autosched.drivers.in_place import Alternative, alternatives, keep_fastest
from autosched.kernels.matmul_triton.space import CUSTOM
from autosched.ops.matmul import MatmulProblem
from autosched.outputs.records import Trial
from autosched.run.problem import ProblemResult

MAPS = (
    "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>, "
    "affine_map<(d0, d1, d2) -> (d0, d1)>]"
)
FC1 = MatmulProblem(
    "linalg.matmul", 6304, 3072, 768, 0, "f16", "f16", "f32", False, True, True, MAPS
)


def trial(name: str, ms: float, persistent: int = 0, specialized: int = 0, status="ok") -> Trial:
    point = {"pipeline": CUSTOM, "persistent": persistent, "specialized": specialized}
    return Trial(FC1.name, "cuda", "sm_90", name, point, False, status, median_ms=ms)


def fc1_search() -> ProblemResult:
    """fc1's custom search as the H100 measured it (bare kernels), and a wrong answer."""
    winner = trial("tr_wg128x128x64_w4_s4_g8_p132_ws", 0.0581, 132, 1)
    trials = [
        trial("tr_wg128x128x64_w4_s3_g8", 0.0689),
        trial("tr_wg128x256x64_w8_s3_g8_p132_ws", 0.0598, 132, 1),
        winner,
        trial("tr_wg256x128x64_w8_s3_g8_p132", 0.0636, 132),
        trial("tr_wg128x128x64_w4_s4_g8_p132", 0.0601, 132),
        trial("tr_wg64x64x64_w4_s3_g8", 0.0400, status="wrong_answer"),
        trial("tr_wg64x256x32_w4_s4_g8", 0.0916),
    ]
    return ProblemResult(FC1, None, trials, best=winner, best_ms=winner.median_ms)


def test_a_winner_is_timed_beside_the_fastest_point_of_each_other_form():
    """The winner first, then the fastest correct point of each other epilogue form:
    persistent (one workgroup an SM) and plain (another workgroup computes through the
    epilogue); no wrong answer, no second point of a form."""
    found = alternatives(fc1_search(), 3)
    assert [(a.trial.config, a.form) for a in found] == [
        ("tr_wg128x128x64_w4_s4_g8_p132_ws", "warp-specialized"),
        ("tr_wg128x128x64_w4_s4_g8_p132", "persistent"),
        ("tr_wg128x128x64_w4_s3_g8", "plain"),
    ]
    assert len(alternatives(fc1_search(), 2)) == 2


class _Log:
    def __init__(self):
        self.lines = []

    def write(self, line: str = "") -> None:
        self.lines.append(line)


def test_the_point_fastest_in_the_model_is_kept_and_said():
    """The plain point, slower bare but fastest with its epilogue in the model, becomes
    the problem's best; run.log names every form's time in place and the point kept."""
    search = fc1_search()
    timed = [
        Alternative(a.trial, a.form, ms)
        for a, ms in zip(alternatives(search, 3), [1.327, 1.2, 0.84], strict=True)
    ]
    log = _Log()
    kept = keep_fastest({FC1.name: search}, {FC1.name: timed}, log)
    assert kept[FC1.name].best.config == "tr_wg128x128x64_w4_s3_g8"
    assert kept[FC1.name].best_ms == 0.0689
    assert "(plain) 0.84 ms" in log.lines[0] and "keeps tr_wg128x128x64_w4_s3_g8" in log.lines[1]


def test_a_winner_fastest_in_place_or_untimed_there_stays():
    """The winner stays where it is fastest in the model, and where its own time in place
    is missing (its build failed): that time is what the others are held to."""
    search = fc1_search()
    found = alternatives(search, 3)
    fastest = [
        Alternative(a.trial, a.form, ms) for a, ms in zip(found, [0.7, 0.8, 0.9], strict=True)
    ]
    untimed = [
        Alternative(a.trial, a.form, ms) for a, ms in zip(found, [None, 0.8, 0.5], strict=True)
    ]
    for timed in (fastest, untimed):
        kept = keep_fastest({FC1.name: search}, {FC1.name: timed}, _Log())
        assert kept[FC1.name] is search
