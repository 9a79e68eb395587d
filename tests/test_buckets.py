"""A model exported with a dynamic sequence length, tuned on buckets of lengths: one spec
that serves the dynamic model at every length (issue 48, item 4)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG
from iree.compiler import ir
from test_causal_lm import dynamic_inputs

from autosched.cli import cli
from autosched.config import RunConfig
from autosched.drivers.bucket_proof import prove_buckets
from autosched.drivers.campaign import ModelProblem
from autosched.drivers.decode_proof import seeded_weights
from autosched.model.buckets import bucket_model, bucket_spec, dynamic_coverage, dynamic_patterns
from autosched.model.configured import tuning_spec_flags
from autosched.model.lowering import analyze_model
from autosched.model.torch_ops import VTensor
from autosched.ops.attention import AttentionPattern
from autosched.outputs.records import Trial
from autosched.outputs.spec import write_spec
from autosched.run.problem import ProblemResult
from autosched.search.space import build_space
from autosched.targets.cpu import CpuTarget

MODELS = os.path.join(os.path.dirname(__file__), "data", "models")
DYNAMIC = os.path.join(MODELS, "llama_mlp_dynamic_f32.mlirbc")  # x[1, ?, 64], three matmuls
CAUSAL_LM = os.path.join(MODELS, "hf_tiny_causal_lm_dynamic_f32.mlirbc")  # token ids [1, ?]


def bucket_inputs(path, length: int, shape=None) -> str:
    """The dynamic MLP's inputs at `length` tokens: x, then its three weights."""
    with open(DYNAMIC, "rb") as handle:
        module = ir.Module.parse(handle.read(), ir.Context())
    function = next(op.operation for op in module.body.operations)
    shapes = [VTensor.of(a).shape for a in function.regions[0].blocks[0].arguments]
    rng = np.random.default_rng(length)
    x = rng.standard_normal(shape or (1, length, 64)).astype(np.float32)
    weights = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in shapes[1:]]
    np.savez(path, x, *weights)
    return str(path)


def test_one_spec_from_two_buckets_serves_the_dynamic_model(tmp_path):
    """Each bucket's static roots are problems; their spec entry leaves the length (m)
    free, one configuration per dynamic root (the longer bucket's winner), so the dynamic
    model's dispatch carries it; built with and without the spec, the dynamic model gives
    the same outputs at both lengths."""
    target = CpuTarget(RunConfig())
    flags, work = target.compile_flags(), str(tmp_path / "model")
    files = [bucket_inputs(tmp_path / f"at{n}.npz", n) for n in (16, 40)]
    model = bucket_model(DYNAMIC, files, flags, work)
    assert [b.function for b in model.buckets] == ["main$len16", "main$len40"]
    model.patterns = dynamic_patterns(model, flags, work)
    assert {p.sizes for p in model.patterns} == {(1, None, 128, 64), (1, None, 64, 128)}
    roots = analyze_model(model.path, flags).roots
    names = [r.name for r in roots]
    assert "batch_matmul_1x16x64x128_f32_f32_f32" in names
    assert "batch_matmul_1x40x64x128_f32_f32_f32" in names
    spec, path = _bucket_spec(model, target, tmp_path)
    assert len(spec.best) == 2  # one entry per dynamic root, not one per bucket
    assert {p.m for p, _, _ in spec.best} == {40}  # the bucket with the most work
    assert set(spec.free.values()) == {frozenset({"m"})}
    text = open(path).read()
    assert text.startswith("// tuned on buckets len16 (")
    assert "dims_equal %m_dims" not in text and "dims_equal %n_dims, [128]" in text
    coverage = _serves_every_bucket(model, target, path, tmp_path, ["len16", "len40"])
    assert coverage == (3, 3)  # every dispatch of the dynamic model


def _bucket_spec(model, target, tmp_path):
    """The buckets' spec (and its file) where every bucket's problem has a winner of its
    own, a point of its space other than the others'."""
    problems = []
    for root in analyze_model(model.path, target.compile_flags()).roots:
        entry = ModelProblem(root.as_problem(), root)
        space = build_space(entry.problem, target, {})
        entry.result = ProblemResult(entry.problem, space, baseline_ms=1.0, best_ms=0.5)
        entry.result.best = _trial(entry.problem, space.points[len(problems)])
        problems.append(entry)
    spec = bucket_spec(model, problems, target)
    path = write_spec(str(tmp_path / "spec.mlir"), spec.best, "", spec.free, spec.header(model))
    return spec, path


def _serves_every_bucket(model, target, spec: str, tmp_path, labels: list[str], name="main"):
    """The dynamic model built with `spec` gives the default's outputs at every bucket;
    returns (dynamic dispatches the spec configures, dynamic dispatches)."""
    flags, work = target.compile_flags(), str(tmp_path / "model")
    spec_flags = tuning_spec_flags(spec, target.tuning_spec_flag)
    coverage = dynamic_coverage(model, flags, spec_flags, work)
    proof = prove_buckets(
        model, flags, spec, target.device, work_dir=str(tmp_path / "model" / "proof"),
        spec_flag=target.tuning_spec_flag, rounds=1, repetitions=1, min_time=0.001,
    )  # fmt: skip
    assert [p.function for p in proof.functions] == [f"{name} at {label}" for label in labels]
    assert all(p.outputs_match and p.outputs_compared for p in proof.functions)
    return coverage


def _trial(problem, point, ms: float = 0.5, baseline: bool = False) -> Trial:
    """A checked record of `point` at `ms` (what bucket_spec reads: its point and time)."""
    return Trial(problem.name, "cpu", "", "picked", point, baseline, "ok", median_ms=ms)


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_a_run_on_two_buckets_says_the_speedup_of_each(tmp_path, monkeypatch):
    """`autosched run --bucket A --bucket B`: the dynamic model proved on each bucket's
    inputs, a line and a summary entry per bucket."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG + "dispatch_table = none\n")
    shutil.copy(DYNAMIC, tmp_path)
    for length in (16, 40):
        bucket_inputs(tmp_path / f"at{length}.npz", length)
    model = os.path.basename(DYNAMIC)
    args = ["run", model, "--bucket", "at16.npz", "--bucket", "at40.npz", "--budget", "4"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "\n  main at len16: " in result.output and "\n  main at len40: " in result.output
    work = tmp_path / "generated" / "llama_mlp_dynamic_f32"
    summary = json.loads((work / "results.summary.json").read_text())["model"]
    per_bucket = {f["function"]: f for f in summary["functions"]}
    assert set(per_bucket) == {"main at len16", "main at len40"}
    for bucket in per_bucket.values():
        assert bucket["outputs_match"] and bucket["default_ms"] > 0
        assert bucket["speedup"] is None or bucket["speedup"] > 0
    assert [b["label"] for b in summary["buckets"]["buckets"]] == ["len16", "len40"]
    assert summary["inputs"] == "at16.npz,at40.npz"
    spec = work / "results.spec.mlir"
    if spec.exists():  # kept only where faster beyond the rounds' noise
        assert spec.read_text().startswith("// tuned on buckets len16 (at16.npz")


def test_bad_buckets_are_one_line_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(DYNAMIC, tmp_path)
    bucket_inputs(tmp_path / "at16.npz", 16)
    bucket_inputs(tmp_path / "flat.npz", 16, shape=(16, 64))  # x of the wrong rank
    bucket_inputs(tmp_path / "again.npz", 16)
    model = os.path.basename(DYNAMIC)
    cases = {
        "flat.npz": "Error: flat.npz: array 0 is 16x64, not 1x?x64xf32",
        "again.npz": "Error: again.npz: the same sizes as at16.npz (len16)",
        "missing.npz": "missing.npz",
    }
    for second, line in cases.items():
        args = ["run", model, "--dry-run", "--bucket", "at16.npz", "--bucket", second]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        last = result.output.strip().splitlines()[-1]
        assert last.startswith("Error: ") and line in last, result.output
        assert "Traceback" not in result.output


@pytest.mark.slow  # about 9 s on two cores: the causal LM's spec built
def test_one_attention_entry_serves_the_dynamic_causal_lm_at_every_length(tmp_path):
    """A causal LM's attention at two lengths: one spec entry whose operand types leave the
    query and key lengths `?`, with the longer bucket's configuration (a query tile of 10,
    which 12 tokens do not fill twice); the dynamic model's attention dispatch carries it,
    and the dynamic build gives the default's outputs at both lengths."""
    target = CpuTarget(RunConfig())
    flags, work = target.compile_flags(), str(tmp_path / "model")
    files = []
    for length in (12, 20):
        dynamic_inputs(tmp_path / f"at{length}.npz", length)
        files.append(str(tmp_path / f"at{length}.npz"))
    model = bucket_model(CAUSAL_LM, files, flags, work)
    model.patterns = dynamic_patterns(model, flags, work)
    (pattern,) = [p for p in model.patterns if isinstance(p, AttentionPattern)]
    assert pattern.dynamic
    problems = []
    for root in analyze_model(model.path, flags).roots:
        entry = ModelProblem(root.as_problem(), root)
        if entry.problem.kind != "attention":
            continue
        space = build_space(entry.problem, target, {})
        names = [target.for_problem(entry.problem).config_name(p) for p in space.points]
        chosen = "q10_vec_1x8_kv4" if entry.problem.size("m") == 20 else names[0]
        point = space.points[names.index(chosen)]
        entry.result = ProblemResult(entry.problem, space, baseline_ms=1.0, best_ms=0.5)
        entry.result.best = _trial(entry.problem, point)
        problems.append(entry)
    assert sorted(p.problem.size("m") for p in problems) == [12, 20]
    spec = bucket_spec(model, problems, target)
    assert len(spec.best) == 1 and spec.best[0][0].size("m") == 20
    assert set(spec.free.values()) == {frozenset({"m", "k2"})}
    path = write_spec(str(tmp_path / "spec.mlir"), spec.best, "", spec.free, spec.header(model))
    assert "x?x" in open(path).read()
    coverage = _serves_every_bucket(model, target, path, tmp_path, ["len12", "len20"])
    assert coverage == (1, 9)  # the attention dispatch, of 9 dynamic roots


@pytest.mark.slow  # about 13 s on two cores: a spec proved on two buckets
def test_apply_proves_a_spec_on_each_bucket_of_the_dynamic_model(tmp_path, monkeypatch):
    """`autosched apply MODEL --spec S --bucket A --bucket B`: the dynamic model built with the
    spec, proved on each bucket's inputs (a line each), and how many of its dispatches of
    dynamic size the spec configures; a custom-kernel spec with buckets is one Error line."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(DYNAMIC, tmp_path)
    for length in (16, 40):
        bucket_inputs(tmp_path / f"at{length}.npz", length)
    target = CpuTarget(RunConfig())
    model = bucket_model(DYNAMIC, [str(tmp_path / "at16.npz")], target.compile_flags(), "work")
    model.patterns = dynamic_patterns(model, target.compile_flags(), "work")
    _, spec = _bucket_spec(model, target, tmp_path)
    args = ["apply", os.path.basename(DYNAMIC), "--spec", spec]
    result = CliRunner().invoke(cli, [*args, "--bucket", "at16.npz", "--bucket", "at40.npz"])
    assert result.exit_code == 0, result.output
    assert "\n  main at len16: " in result.output and "\n  main at len40: " in result.output
    assert "the spec configures 3 of the dynamic model's 3 dispatches of dynamic size" in (
        result.output
    )
    result = CliRunner().invoke(cli, [*args, "--bucket", "at16.npz", "--custom", spec])
    assert result.exit_code == 2 and "Error: " in result.output
    assert "static sizes only" in result.output and "Traceback" not in result.output


def test_the_winner_fastest_over_every_bucket_is_the_dynamic_roots_entry(tmp_path):
    """Each bucket timed the other's winner (as siblings do): the entry takes the winner the
    buckets together run fastest, not the largest bucket's, and the spec's header says why.
    A winner not timed on every bucket leaves the largest bucket's."""
    target = CpuTarget(RunConfig())
    flags, work = target.compile_flags(), str(tmp_path / "model")
    files = [bucket_inputs(tmp_path / f"at{n}.npz", n) for n in (16, 40)]
    model = bucket_model(DYNAMIC, files, flags, work)
    model.patterns = dynamic_patterns(model, flags, work)
    roots = [
        r for r in analyze_model(model.path, flags).roots if r.name.endswith("x64x128_f32_f32_f32")
    ]
    short, long = sorted(
        (ModelProblem(r.as_problem(), r) for r in roots), key=lambda e: e.problem.m
    )
    space = build_space(long.problem, target, {})
    mine, theirs = space.points[0], space.points[1]  # the short bucket's winner, the long's
    # default ms, then ms of the short bucket's winner and of the long bucket's, per bucket
    for entry, default_ms, times in ((short, 1.0, (0.6, 2.0)), (long, 2.0, (1.1, 1.0))):
        trials = [_trial(entry.problem, p, ms) for p, ms in zip((mine, theirs), times, strict=True)]
        best = min(trials, key=lambda t: t.median_ms)
        entry.result = ProblemResult(entry.problem, space, trials, best=best)
        entry.result.baseline = _trial(entry.problem, {}, default_ms, baseline=True)
    spec = bucket_spec(model, [short, long], target)
    assert [(p.name, point) for p, _, point in spec.best] == [(short.problem.name, mine)]
    header = spec.header(model)
    assert f"// picked of {short.problem.name}: the fastest timed on every bucket" in header
    long.result.trials = long.result.trials[1:]  # neither winner timed on both buckets
    short.result.trials = short.result.trials[:1]
    spec = bucket_spec(model, [short, long], target)
    assert [(p.name, point) for p, _, point in spec.best] == [(long.problem.name, theirs)]
    assert "the winner of the bucket of the most work" in spec.header(model)


DECODE = os.path.join(MODELS, "hf_tiny_llama_decode_dynamic_f32.mlirbc")  # cache [1, 2, ?, 16]


def decode_inputs(path, cache: int) -> str:
    """The dynamic decode step's inputs with a cache of `cache` positions: one token, its
    position (the cache's last), each layer's keys and values, then the weights."""
    with open(DECODE, "rb") as handle:
        module = ir.Module.parse(handle.read(), ir.Context())
    function = next(op.operation for op in module.body.operations)
    shapes = [VTensor.of(a).shape for a in function.regions[0].blocks[0].arguments]
    rng = np.random.default_rng(cache)
    layers = [(rng.standard_normal((1, 2, cache, 16)) * 0.5).astype(np.float32) for _ in range(4)]
    token, position = np.array([[5]], dtype=np.int64), np.array([cache - 1], dtype=np.int64)
    np.savez(path, token, position, *layers, *seeded_weights(shapes[6:], 0))
    return str(path)


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_one_decode_attention_entry_serves_every_cache_length(tmp_path):
    """transformers' decode step exported with the KV cache's length dynamic
    (tools/export_causal_lm.py --decode-dynamic), tuned on caches of 64 and 128: the single
    query row's attention at each length is a problem (loops b, n, k1, k2); one spec entry
    leaves the key length free, and the dynamic build with it gives the default's outputs
    with either cache."""
    target = CpuTarget(RunConfig())
    flags, work = target.compile_flags(), str(tmp_path / "model")
    files = [decode_inputs(tmp_path / f"cache{n}.npz", n) for n in (64, 128)]
    model = bucket_model(DECODE, files, flags, work)
    assert [b.function for b in model.buckets] == ["decode$len64", "decode$len128"]
    model.patterns = dynamic_patterns(model, flags, work)
    (pattern,) = [p for p in model.patterns if isinstance(p, AttentionPattern)]
    assert pattern.dynamic
    problems = []
    for root in analyze_model(model.path, flags).roots:
        if root.kind != "attention":
            continue
        entry = ModelProblem(root.as_problem(), root)
        assert entry.problem.loops == ("b", "n", "k1", "k2")  # one query row: no m
        space = build_space(entry.problem, target, {})
        entry.result = ProblemResult(entry.problem, space, baseline_ms=1.0, best_ms=0.5)
        entry.result.best = _trial(entry.problem, space.points[-1])
        problems.append(entry)
    assert sorted(p.problem.size("k2") for p in problems) == [64, 128]
    spec = bucket_spec(model, problems, target)
    assert len(spec.best) == 1 and spec.best[0][0].size("k2") == 128
    assert set(spec.free.values()) == {frozenset({"k2"})}
    path = write_spec(str(tmp_path / "spec.mlir"), spec.best, "", spec.free, spec.header(model))
    assert "x?x" in open(path).read()
    labels = ["len64", "len128"]
    configured, dynamic = _serves_every_bucket(model, target, path, tmp_path, labels, "decode")
    # The attention dispatch (both layers run it): the one root of dynamic size in decode,
    # whose matmuls are of one token whatever the cache's length.
    assert (configured, dynamic) == (1, 1)


@pytest.mark.slow  # about 20 s on two cores: a whole run and its proof
def test_a_decode_run_on_two_cache_lengths_proves_each(tmp_path, monkeypatch):
    """`autosched run DECODE --bucket cache64.npz --bucket cache128.npz`: the decode step's
    problems at both cache lengths (its single-row attention at each), and the dynamic
    build proved on each cache's inputs, a line and a summary entry per cache length."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG + "dispatch_table = none\n")
    shutil.copy(DECODE, tmp_path)
    for cache in (64, 128):
        decode_inputs(tmp_path / f"cache{cache}.npz", cache)
    model = os.path.basename(DECODE)
    buckets = ["--bucket", "cache64.npz", "--bucket", "cache128.npz"]
    result = CliRunner().invoke(cli, ["run", model, *buckets, "--budget", "4"])
    assert result.exit_code == 0, result.output
    assert "attention_4x1x16x64x16_f32_mask_i1" in result.output
    assert "attention_4x1x16x128x16_f32_mask_i1" in result.output
    work = tmp_path / "generated" / "hf_tiny_llama_decode_dynamic_f32"
    summary = json.loads((work / "results.summary.json").read_text())["model"]
    per_bucket = {f["function"]: f for f in summary["functions"]}
    assert set(per_bucket) == {"decode at len64", "decode at len128"}
    assert all(b["outputs_match"] and b["default_ms"] > 0 for b in per_bucket.values())


@pytest.mark.slow  # a whole run on two buckets
def test_a_bucket_may_hold_only_what_fixes_the_length(tmp_path, monkeypatch):
    """A bucket of x alone (the MLP's weights are of static size): the run says the others
    are drawn at random, and the proof draws them; one that leaves out x is one line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG + "dispatch_table = none\n")
    shutil.copy(DYNAMIC, tmp_path)
    rng = np.random.default_rng(0)
    for length in (16, 40):
        np.savez(tmp_path / f"x{length}.npz", rng.standard_normal((1, length, 64)).astype("f4"))
    name = os.path.basename(DYNAMIC)
    args = ["run", name, "--bucket", "x16.npz", "--bucket", "x40.npz", "--budget", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "the inputs a bucket leaves out are drawn at random (seeded)" in result.output
    summary = tmp_path / "generated" / "llama_mlp_dynamic_f32" / "results.summary.json"
    model = json.loads(summary.read_text())["model"]
    assert model["inputs"] == "x16.npz,x40.npz" and model["default_ms"] > 0  # it ran
    np.savez(tmp_path / "none.npz")
    result = CliRunner().invoke(cli, ["run", name, "--dry-run", "--bucket", "none.npz"])
    assert result.exit_code == 2
    assert "Error: none.npz: 0 array(s), but main takes 4 argument(s)" in result.output
