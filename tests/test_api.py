"""`autosched.tune` from Python. torch and iree-turbine are an optional extra (3 GB): the
tests that tune a module run where both import (the GPU machine) and are skipped with the
reason elsewhere; the message a user without them gets runs everywhere."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import autosched
from autosched.errors import UserError

HAS_TORCH = all(importlib.util.find_spec(name) for name in ("torch", "iree.turbine"))
needs_torch = pytest.mark.skipif(
    not HAS_TORCH, reason="torch and iree-turbine are not installed (pip install '.[torch]')"
)

TINY_CFG = """
[Env]
jobs = 2
[SearchStrategy]
tuner = random
n_trial = 2
batch_size = 2
[Benchmark]
repetitions = 1
min_time = 0.005
retime_top = 1
"""


@pytest.mark.skipif(HAS_TORCH, reason="torch and iree-turbine import here: no message to see")
def test_without_the_torch_extra_tune_says_how_to_install_it():
    with pytest.raises(UserError) as raised:
        autosched.tune(object(), np.zeros(2))
    message = raised.value.message
    assert "needs torch and iree-turbine" in message and "pip install '.[torch]'" in message
    assert "\n" not in message


def _mlp_in(tmp_path, monkeypatch, dtype):
    """A two-layer MLP in `dtype` and an example input, in `tmp_path` with the tiny cfg."""
    import torch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(TINY_CFG)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    return model.to(dtype), torch.randn(16, 64, dtype=dtype)


@needs_torch
def test_tune_returns_a_callable_that_runs_the_tuned_build(tmp_path, monkeypatch):
    import torch

    model, x = _mlp_in(tmp_path, monkeypatch, torch.float32)
    tuned = autosched.tune(model, x, budget=2)
    assert isinstance(tuned, autosched.TunedModule)
    expected = model(x).detach()
    got = tuned(x)
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    other = torch.randn(16, 64)  # any inputs of the example's shapes, not only the example's
    torch.testing.assert_close(tuned(other), model(other).detach(), rtol=1e-4, atol=1e-4)
    saved = tuned.save(str(tmp_path / "out" / "tuned.vmfb"))
    assert open(saved, "rb").read() == open(tuned.vmfb, "rb").read()
    folder = tmp_path / "generated" / "sequential"
    assert (folder / "results.csv").is_file() and (folder / "run.log").is_file()


@needs_torch
def test_tune_keeps_its_files_in_the_given_work_folder(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto-scheduler.cfg").write_text(TINY_CFG)
    model = torch.nn.Linear(32, 32)
    tuned = autosched.tune(model, torch.randn(8, 32), budget=1, work_dir=str(tmp_path / "w"))
    assert tuned.vmfb == str(tmp_path / "w" / "model.vmfb")
    assert (tmp_path / "w" / "tuning.jsonl").is_file() and not (tmp_path / "generated").exists()


@needs_torch
def test_tune_takes_and_returns_bf16_tensors(tmp_path, monkeypatch):
    """numpy has no bf16: weights, inputs and results cross to IREE as ml_dtypes' bfloat16."""
    import torch

    model, x = _mlp_in(tmp_path, monkeypatch, torch.bfloat16)
    tuned = autosched.tune(model, x, budget=2)
    got = tuned(x)
    assert got.dtype == torch.bfloat16 and got.shape == (16, 32)
    torch.testing.assert_close(got, model(x).detach(), rtol=3e-2, atol=3e-2)
    log = (tmp_path / "generated" / "sequential" / "run.log").read_text()
    assert "bf16_bf16_f32" in log  # the bf16 matmuls were the problems tuned
