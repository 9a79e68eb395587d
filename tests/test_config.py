"""The cfg file: typed values, and one clear line for every kind of mistake."""

from __future__ import annotations

import pytest

from autosched.config import RunConfig, load_config, parse_knob_list, with_overrides
from autosched.errors import UserError
from autosched.targets import make_target
from autosched.targets.base import check_search_space


def write_cfg(tmp_path, text: str) -> str:
    path = tmp_path / "auto-scheduler.cfg"
    path.write_text(text)
    return str(path)


def test_reads_all_sections(tmp_path):
    path = write_cfg(
        tmp_path,
        "[Env]\ntarget = cpu\njobs = 3\n[SearchSpace]\ntile_m = [64,128]\n"
        "[SearchStrategy]\ntuner = random\nn_trial = 7\nseed = 4\n[Benchmark]\nrepetitions = 2\n",
    )
    config = load_config(path)
    assert (config.target, config.jobs, config.tuner, config.n_trial, config.seed) == (
        "cpu",
        3,
        "random",
        7,
        4,
    )
    assert config.repetitions == 2
    assert config.search_space == {"tile_m": [64, 128]}


def test_shipped_cfg_files_load_and_fit_their_target():
    import glob

    paths = ["auto-scheduler.cfg", *glob.glob("configs/*.cfg")]
    assert len(paths) >= 2
    for path in paths:
        config = load_config(path)
        check_search_space(make_target(config), config)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[Oops]\nx = 1\n", "unknown section [Oops]"),
        ("[Env]\ncolour = red\n", "[Env] unknown key 'colour'"),
        ("[SearchStrategy]\nn_trial = many\n", "n_trial = 'many': expected int"),
        ("[SearchStrategy]\nn_trial = 0\n", "must be at least 1"),
        ("[SearchStrategy]\ntuner = annealing\n", "expected one of grid, random, xgboost"),
        ("[Env]\ntarget = tpu\n", "expected one of cpu, cuda"),
        ("[SearchSpace]\ntile_m = []\n", "tile_m = '[]': empty list"),
        ("[SearchSpace]\ntile_m = [64, 64]\n", "repeated values"),
        ("[SearchSpace]\ntile_m = [64, 12.5]\n", "neither an integer nor a name"),
        ("[Env\n", "not a valid cfg file"),
    ],
)
def test_errors_name_file_section_key_and_value(tmp_path, text, expected):
    path = write_cfg(tmp_path, text)
    with pytest.raises(UserError) as caught:
        load_config(path)
    message = str(caught.value)
    assert expected in message and message.startswith(path) and "\n" not in message


def test_unknown_knob_for_target(tmp_path):
    config = load_config(write_cfg(tmp_path, "[SearchSpace]\nwarp_tile = [1]\n"))
    with pytest.raises(UserError, match="unknown key 'warp_tile' for target cpu"):
        check_search_space(make_target(config), config)


def test_knob_value_of_wrong_kind(tmp_path):
    config = load_config(write_cfg(tmp_path, "[SearchSpace]\ntile_m = [big]\n"))
    with pytest.raises(UserError, match="'big' is not an integer from 1 to"):
        check_search_space(make_target(config), config)


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="no such config file"):
        load_config(str(tmp_path / "nope.cfg"))


def test_command_line_overrides_and_checks():
    config = with_overrides(RunConfig(), n_trial=5, tuner=None)
    assert config.n_trial == 5 and config.tuner == "xgboost"
    with pytest.raises(UserError, match="--n-trial 0"):
        with_overrides(RunConfig(), n_trial=0)


def test_knob_list_syntax():
    assert parse_knob_list("[64, 128]") == [64, 128]
    assert parse_knob_list("32") == [32]
    assert parse_knob_list("[TileAndFuse, VectorDistribute]") == ["TileAndFuse", "VectorDistribute"]


def test_target_sections_switch_with_the_target(tmp_path):
    """One cfg holds a space per target; --target picks which one a run uses."""
    path = write_cfg(
        tmp_path,
        "[Env]\ntarget = cpu\n[SearchSpace]\ntile_m = [64]\n"
        "[SearchSpace.cpu]\nvec_m = [4, 8]\n[SearchSpace.cuda]\ntile_m = [128]\nthread_m = [4]\n",
    )
    cpu = load_config(path)
    assert cpu.knob_space == {"tile_m": [64], "vec_m": [4, 8]}
    check_search_space(make_target(cpu), cpu)
    cuda = with_overrides(cpu, target="cuda", arch="sm_80")
    assert cuda.knob_space == {"tile_m": [128], "thread_m": [4]}  # the target's section wins
    assert cuda.knob_section("thread_m") == "SearchSpace.cuda"
    check_search_space(make_target(cuda), cuda)


def test_knob_of_the_wrong_target_section_names_it(tmp_path):
    path = write_cfg(
        tmp_path, "[Env]\ntarget = cuda\narch = sm_80\n[SearchSpace.cuda]\nvec_m = [4]\n"
    )
    config = load_config(path)
    with pytest.raises(
        UserError, match=r"\[SearchSpace.cuda\] unknown key 'vec_m' for target cuda"
    ):
        check_search_space(make_target(config), config)


def test_unknown_target_section(tmp_path):
    with pytest.raises(UserError, match=r"unknown section \[SearchSpace.tpu\]"):
        load_config(write_cfg(tmp_path, "[SearchSpace.tpu]\ntile_m = [1]\n"))


def test_an_inputs_files_default_to_its_own_work_folder(tmp_path):
    """Unnamed paths follow the input (generated/<stem>/), again when the input changes;
    a path the cfg or the command line names stays where it was named."""
    config = with_overrides(RunConfig(), input_file="models/resnet.v1.onnx")
    assert (config.work_dir, config.output_file) == (
        "generated/resnet.v1",
        "generated/resnet.v1/results.csv",
    )
    assert config.log_file == "generated/resnet.v1/run.log"
    assert config.database == "generated/resnet.v1/tuning.jsonl"
    named = with_overrides(config, output_file="out/r.csv", input_file="b.mlir")
    assert named.output_file == "out/r.csv" and named.work_dir == "generated/b"
    assert with_overrides(named, input_file="c.mlir").output_file == "out/r.csv"
    path = write_cfg(tmp_path, "[Env]\nwork_dir = w\ndatabase = all.jsonl\nlog_file =\n")
    loaded = with_overrides(load_config(path), input_file="m.mlir")
    assert (loaded.work_dir, loaded.database, loaded.log_file) == ("w", "all.jsonl", "w/run.log")
    assert RunConfig().work_dir == "generated"  # no input yet


def test_the_start_lines_say_where_a_run_writes_and_what_it_resumes(tmp_path):
    from autosched.outputs.paths import RunPaths, start_lines

    config = RunConfig(input_file="m.mlir", work_dir=str(tmp_path))
    paths = RunPaths.of(config)
    assert start_lines(paths, resume=True) == [
        f"writing to CSV {tmp_path}/results.csv, log {tmp_path}/run.log, database "
        f"{tmp_path}/tuning.jsonl (builds under {tmp_path})"
    ]
    (tmp_path / "tuning.jsonl").write_text('{"a": 1}\n\n{"b": 2}\n')
    assert start_lines(paths, resume=True)[1] == (
        f"resuming 2 trial(s) and 0 timing(s) of IREE's default from {tmp_path}/tuning.jsonl "
        "(--fresh ignores them)"
    )
    assert "are not read" in start_lines(paths, resume=False)[1]


def test_a_lock_file_goes_with_its_run(tmp_path):
    from autosched.drivers.runlock import RunLock

    path = str(tmp_path / "a" / "x.lock")
    lock = RunLock([path])
    with pytest.raises(UserError, match="another autosched run"):
        RunLock([path])
    lock.release()
    assert not (tmp_path / "a" / "x.lock").exists()
    RunLock([path]).release()  # taken again after it
