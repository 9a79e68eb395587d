"""The model budget's scheduler: pure functions over each problem's history of best times."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from autosched.config import RunConfig
from autosched.drivers.campaign import (
    ModelProblem,
    budget_for,
    first_batch,
    leave_to_custom_route,
    minor,
    opening_history,
    pick_next,
    shares,
    untried,
)
from autosched.drivers.custom_route import custom_coverage
from autosched.model.dispatch_benchmarks import DispatchBenchmark
from autosched.ops.matmul import MatmulProblem
from autosched.run.tuning import problem_space
from autosched.targets import make_target


@dataclass
class Runs:
    """What the scheduler reads of a contraction: how often the model runs it."""

    occurrences: int


def entry(name: str, occurrences: int, history: list[float], done: bool = False):
    problem = type("P", (), {"name": name})()
    return ModelProblem(problem, Runs(occurrences), history=history, done=done)


def test_untried_problems_come_first_largest_share_first():
    a = entry("a", 1, [1.0, 0.5, 0.4])  # improving fast, but tried
    b = entry("b", 4, [1.0])  # 4 ms of model time, untried
    c = entry("c", 1, [2.0])  # 2 ms, untried
    assert pick_next([a, b, c]) is b
    b.history.append(1.0)
    assert pick_next([a, b, c]) is c


def test_budget_moves_to_the_problem_still_improving():
    flat = entry("flat", 2, [1.0, 1.0, 1.0, 1.0])  # no gain in the window
    falling = entry("falling", 1, [1.0, 0.8, 0.6, 0.5])  # 0.15 ms per batch lately
    assert pick_next([flat, falling]) is falling


def test_occurrences_weigh_the_gain():
    once = entry("once", 1, [1.0, 0.9, 0.8, 0.7])
    often = entry("often", 3, [1.0, 0.95, 0.9, 0.85])  # half the gain, three times as often
    assert pick_next([once, often]) is often


def test_done_problems_are_never_picked():
    assert pick_next([entry("x", 1, [1.0], done=True)]) is None


def test_mode_budgets_and_a_fair_first_batch():
    problems = [entry(str(i), 1, [1.0]) for i in range(4)]
    assert budget_for("fast", 32, problems) == 32
    assert budget_for("normal", 32, problems) == 128
    assert budget_for("extreme", 32, problems) == 512
    assert first_batch(budget=6, problems=4, batch_size=8) == 1
    assert first_batch(budget=100, problems=4, batch_size=8) == 8


def test_shares_weigh_time_by_occurrences():
    problems = [entry("a", 3, [1.0]), entry("b", 1, [1.0])]
    assert shares({"a": 1.0, "b": 1.0}, problems) == {"a": 0.75, "b": 0.25}


def test_problems_the_budget_left_untried_are_named_largest_share_first():
    tried = entry("tried", 1, [1.0, 0.9])
    small, large = entry("small", 1, [0.5]), entry("large", 2, [1.0])
    done = entry("done", 1, [3.0], done=True)  # nothing to try: not listed
    for e, trials in ((tried, [1]), (small, []), (large, []), (done, [])):
        e.search = SimpleNamespace(trials=trials)
    assert untried([tried, small, large, done]) == ["large", "small"]


def test_a_resumed_problem_counts_as_tried():
    """A problem whose trials came from the database does not take a first batch before
    the problems never searched, even with a larger share of the model."""
    resumed = entry("resumed", 4, opening_history(SimpleNamespace(best_ms=1.0, trials=[1, 2])))
    fresh = entry("fresh", 1, opening_history(SimpleNamespace(best_ms=0.5, trials=[])))
    assert resumed.history == [1.0, 1.0] and fresh.history == [0.5]
    assert pick_next([resumed, fresh]) is fresh
    fresh.history.append(0.5)
    assert pick_next([resumed, fresh]) is resumed  # every problem tried: the largest gain


def test_fast_mode_gives_a_problem_under_two_percent_of_the_time_one_batch():
    def timed(name: str, occurrences: int, default_ms: float) -> ModelProblem:
        problem = entry(name, occurrences, [default_ms])
        baseline = SimpleNamespace(median_ms=default_ms, ok=True)
        problem.search = SimpleNamespace(result=SimpleNamespace(baseline=baseline))
        return problem

    conv, head, small = timed("conv", 3, 3.0), timed("head", 1, 0.01), timed("small", 1, 0.2)
    problems = [conv, head, small]  # 9 ms, 0.01 ms (0.1 %) and 0.2 ms (2.2 %) of 9.21
    assert minor(head, problems)
    assert not minor(small, problems) and not minor(conv, problems)
    untimed = entry("untimed", 1, [1.0])  # no default: never judged minor
    assert not minor(untimed, [*problems, untimed])


def test_fast_mode_leaves_a_problem_a_custom_family_covers_to_the_custom_route(tmp_path):
    """On sm_90 the custom route searches a bf16 matmul timed on its dispatch (its custom
    points are left out of its campaign space): fast mode runs no IREE candidate of it
    (run.log says so). On sm_80 no family covers it, and its IREE search goes on; so does
    a problem the route does not search (a collapsed convolution whose op form no family
    takes is left out of the coverage)."""
    shape = {"op": "linalg.matmul", "m": 2048, "n": 2048, "k": 2048, "batch": 0}
    types = {"lhs_type": "bf16", "rhs_type": "bf16", "acc_type": "f32"}
    flags = {"transpose_a": False, "transpose_b": True, "zero_init": True}
    problem = MatmulProblem.from_shape({**shape, **types, **flags})
    dispatch = DispatchBenchmark("main$async_dispatch_0", "bench.mlir", "bench")
    covered, said = {}, {}
    for arch in ("sm_90", "sm_80"):
        config = RunConfig(target="cuda", arch=arch, work_dir=str(tmp_path))
        target = make_target(config)
        space = problem_space(problem, target, {}, dispatch, custom_only=False)
        assert space.points and all(target.for_problem(problem).in_spec(p) for p in space.points)
        one = ModelProblem(problem, SimpleNamespace(occurrences=1, sites=[]), benchmark=dispatch)
        one.search = SimpleNamespace(space=space, result=SimpleNamespace(custom_route=False))
        said[arch] = []
        tuning = SimpleNamespace(
            target=target, config=config, log=SimpleNamespace(write=said[arch].append)
        )
        covered[arch] = custom_coverage(tuning, [one], "model.mlirbc")
        leave_to_custom_route(tuning, [one], covered[arch])
        assert one.done == one.search.result.custom_route == bool(covered[arch])
    assert covered == {"sm_90": {problem.name: problem}, "sm_80": {}}
    assert len(said["sm_90"]) == 1 and "leaves it to the custom route" in said["sm_90"][0]
    assert said["sm_80"] == []
    one.done = one.search.result.custom_route = False
    leave_to_custom_route(tuning, [one], {"another": problem})  # not this one: searched
    assert not one.done and not one.search.result.custom_route
