"""One iree-compile of a whole model for everything a run reads of it (issue 49): the build
writes IREE's default module byte for byte as a plain compile does, its phases give the same
dispatches and configurations as the separate compiles did, it is kept per source, flags and
the files they name, and a model run compiles no model to the same phase twice (every
iree-compile call logged by a wrapper around the real tool, `AUTOSCHED_IREE_COMPILE`)."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner
from conftest import MODEL_CFG
from test_model_run import MODELS

from autosched.cli import cli
from autosched.compile import compiler_path
from autosched.config import RunConfig
from autosched.model import model_build as model_build_module
from autosched.model.configured import (
    dispatch_configs,
    in_configured_form,
    iree_compile,
    roots_in,
    tuning_spec_flags,
)
from autosched.model.lowering import analyze_model
from autosched.model.model_build import (
    CONFIGURED,
    PRINT_FLAGS,
    analyze_build,
    build_key,
    cached_build,
    known_seconds,
    model_build,
)
from autosched.outputs.spec import tuning_spec
from autosched.targets.cpu import CpuTarget

FLAGS = CpuTarget(RunConfig()).compile_flags()


def test_one_compile_gives_iree_default_module_and_the_phases_a_run_reads(tmp_path):
    model = os.path.join(MODELS, "llama_mlp.mlirbc")
    cache = str(tmp_path / "builds")
    build = model_build(model, FLAGS, cache)
    plain = iree_compile(model, FLAGS, str(tmp_path / "plain.vmfb"), 600, model)
    assert open(build.vmfb, "rb").read() == open(plain, "rb").read()  # IREE's default
    assert analyze_build(build, FLAGS) == in_configured_form(
        analyze_model(model, FLAGS), model, FLAGS
    )
    assert roots_in(build.phase(CONFIGURED)) == dispatch_configs(model, FLAGS)
    assert len(os.listdir(build.benchmarks)) == 3  # one benchmark a dispatch
    stamp = os.stat(build.vmfb).st_mtime_ns
    again = model_build(model, FLAGS, cache)  # kept: not compiled again
    assert again == build and os.stat(again.vmfb).st_mtime_ns == stamp
    with pytest.raises(Exception, match="wrote no `nothing` phase"):
        build.phase("nothing")


def test_a_build_is_kept_per_source_flags_and_the_bytes_of_the_files_they_name(tmp_path):
    source = tmp_path / "model.mlir"
    source.write_text("module {}\n")
    spec = tmp_path / "spec.mlir"
    spec.write_text("// one\n")
    with_spec = [*FLAGS, f"--iree-codegen-tuning-spec-path={spec}"]
    first = build_key(str(source), with_spec)
    assert first == build_key(str(source), list(with_spec))
    assert first != build_key(str(source), FLAGS)
    spec.write_text("// two\n")  # a spec rewritten in place is another build
    assert build_key(str(source), with_spec) != first
    source.write_text("module {}\n// changed\n")
    assert build_key(str(source), FLAGS) != build_key(str(tmp_path / "spec.mlir"), FLAGS)
    assert cached_build(str(source), FLAGS, str(tmp_path / "none")) is None


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_a_spec_build_runs_on_every_thread_and_on_one_where_that_hangs(tmp_path, monkeypatch):
    """A whole-model build with a spec compiles on every thread first, stopped at a
    multiple of the model's build without the spec (its DONE file's seconds): the same
    bytes as one thread makes. Where it runs past that limit (set to nothing here), the
    build is compiled again on one thread, as every spec build was before."""
    model = os.path.join(MODELS, "llama_mlp.mlirbc")
    spec = tmp_path / "spec.mlir"
    spec.write_text(tuning_spec([(p, CpuTarget(RunConfig()), POINT) for p in _problems(model)][:1]))
    with_spec = [*FLAGS, *tuning_spec_flags(str(spec), CpuTarget.tuning_spec_flag)]
    assert "--mlir-disable-threading" in with_spec
    for attempt in range(3):  # the threaded compile itself hangs in about 1 in 200
        cache = str(tmp_path / f"cache{attempt}")
        plain = model_build(model, FLAGS, cache)
        assert known_seconds(plain.source, cache) > 0
        threaded = model_build(model, with_spec, cache)
        if "--mlir-disable-threading" not in _command(threaded):
            break
    assert "--mlir-disable-threading" not in _command(threaded)  # compiled threaded
    monkeypatch.setattr(model_build_module, "HANG_FLOOR", 0.0)
    monkeypatch.setattr(model_build_module, "HANG_FACTOR", 0.0)  # "hangs" at once
    again = model_build(model, with_spec, str(tmp_path / "again"))  # no plain build known
    assert "--mlir-disable-threading" in _command(again)
    model_build(model, FLAGS, str(tmp_path / "hung"))
    hung = model_build(model, with_spec, str(tmp_path / "hung"))  # known, and stopped at 0 s
    assert "--mlir-disable-threading" in _command(hung)
    with open(threaded.vmfb, "rb") as one, open(hung.vmfb, "rb") as other:
        assert one.read() == other.read()


def _command(build) -> str:
    """The iree-compile command that made a finished build (its DONE file's first line)."""
    with open(os.path.join(build.folder, "DONE"), encoding="utf-8") as handle:
        return handle.readline()


POINT = {"tile_m": 16, "tile_n": 32, "vec_m": 8, "vec_n": 16, "vec_k": 4}


def _problems(model: str):
    return analyze_model(model, FLAGS).matmul_problems()


def logged_compiles(calls) -> list[tuple[str, ...]]:
    """Each logged iree-compile of a whole model (its source named after the model), as
    (flags less the output, the dump folders and how phases are printed): the same tuple
    twice is the same model compiled to the same phase twice."""
    found = []
    for line in calls.read_text().splitlines():
        words = line.split()
        if not words or not os.path.basename(words[0]).startswith("hf_llama_mlp_f32"):
            continue
        kept, skip = [], False
        for word in words[1:]:
            if skip:
                skip = False
                continue
            if word == "-o":
                skip = True
                continue
            if word in PRINT_FLAGS or word.startswith(
                ("--dump-compilation-phases-to=", "--iree-hal-dump-")
            ):
                continue
            kept.append(word)
        found.append(tuple(kept))
    return found


@pytest.mark.slow  # over 6 s on two cores: the README's command stays under 10 minutes
def test_a_model_run_compiles_no_model_to_the_same_phase_twice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(MODEL_CFG)
    shutil.copy(f"{MODELS}/hf_llama_mlp_f32.mlirbc", tmp_path)
    calls = tmp_path / "calls.txt"
    wrapper = tmp_path / "compile.sh"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {compiler_path()} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("AUTOSCHED_IREE_COMPILE", str(wrapper))
    args = ["run", "hf_llama_mlp_f32.mlirbc", "--mode", "fast", "--budget", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    every = calls.read_text().splitlines()
    assert len(every) == len(set(every)), every  # no build at all made twice
    compiles = logged_compiles(calls)
    assert len(compiles) == len(set(compiles)), compiles
    phases = [flag for flags in compiles for flag in flags if flag.startswith("--compile-to=")]
    assert "--compile-to=flow" not in phases  # the dispatches come from the one build
    assert "--compile-to=executable-configurations" not in phases
    whole = [flags for flags in compiles if not any(f.startswith("--compile-to") for f in flags)]
    assert tuple(FLAGS) in whole  # IREE's default, built once and proved against
    assert "model: " in result.output and "where the time went" in result.output
    # A second run in the same folder takes the model's build from the first one's.
    calls.unlink()
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    assert tuple(FLAGS) not in logged_compiles(calls)
