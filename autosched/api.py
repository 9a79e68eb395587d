"""`autosched.tune(module, *example_args)`: a torch module tuned from Python.

The module is exported with iree-turbine (its parameters as arguments, so the export holds
no weights; `aot.export` applies iree-turbine's decompositions for IREE), the export is
tuned by the same model run `autosched run` makes (`run_model`), and the tuned build (the
spec and custom kernels the run kept, as `autosched compile` builds them) is returned as a
callable on torch tensors. torch and iree-turbine are an optional extra, imported here
only when `tune` is called.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from autosched.cli import BarProgress
from autosched.config import WORK_ROOT, load_config, with_overrides
from autosched.drivers.compile_model import LoadedModule, compile_tuned, run_files
from autosched.drivers.model_run import run_model
from autosched.errors import UserError
from autosched.outputs.commands import TUNED_VMFB
from autosched.targets import make_target

TORCH_EXTRA = "pip install '.[torch]'"  # from a clone of autosched


def _torch_and_aot():
    """torch and iree.turbine.aot, or one UserError naming the extra."""
    try:
        import torch  # noqa: PLC0415 - an optional extra, imported where it is used
        from iree.turbine import aot  # noqa: PLC0415 - an optional extra, imported where it is used
    except ImportError as error:
        raise UserError(
            f"autosched.tune needs torch and iree-turbine ({error.name or error} is missing): "
            f"{TORCH_EXTRA}"
        ) from None
    return torch, aot


def weights_as_arguments(module, inputs: int):
    """`module` as a torch module taking its `inputs` inputs and then its parameters, so
    that an export holds no weights (the committed test models are built so)."""
    torch, _ = _torch_and_aot()

    class WeightsAsArguments(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module
            self.names = [name for name, _ in module.named_parameters()]

        def forward(self, *args):
            weights = dict(zip(self.names, args[inputs:], strict=True))
            return torch.func.functional_call(self.inner, weights, args[:inputs])

    return WeightsAsArguments()


def to_numpy(torch, tensor) -> np.ndarray:
    """A torch tensor as a numpy array IREE's runtime takes: bf16 (which numpy lacks) as
    ml_dtypes' bfloat16, through its bits."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def to_torch(torch, array: np.ndarray):
    """A result of IREE's runtime as a torch tensor (bf16 through its bits)."""
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


@dataclass
class TunedModule:
    """The tuned build of a torch module: call it with the module's inputs (torch tensors;
    its weights are passed for you), `save` its vmfb."""

    vmfb: str
    device: str
    weights: list[np.ndarray]
    described: str = ""  # what the build holds (the spec, the custom kernels)
    loaded: LoadedModule | None = field(default=None, repr=False)

    def __call__(self, *tensors):
        torch, _ = _torch_and_aot()
        if self.loaded is None:
            self.loaded = LoadedModule(self.vmfb, self.device)
        arrays = [to_numpy(torch, t) for t in tensors]
        results = [to_torch(torch, r) for r in self.loaded(*arrays, *self.weights)]
        return results[0] if len(results) == 1 else tuple(results)

    def save(self, path: str) -> str:
        """Copies the tuned module (a vmfb for the target) to `path`; returns it."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        shutil.copyfile(self.vmfb, path)
        return path


def tune(
    module,
    *example_args,
    target: str = "cpu",
    budget: int | None = None,
    mode: str | None = None,
    work_dir: str | None = None,
) -> TunedModule:
    """Exports `module` on `example_args`, tunes it for `target` ("cpu" or "cuda") as
    `autosched run` does (`budget` trials, or `mode`'s; the cfg of the current folder, as
    the command reads it), and returns its tuned build. Everything goes to `work_dir`
    (default: generated/<the module's class name>/)."""
    torch, aot = _torch_and_aot()
    name = type(module).__name__.lower()
    folder = work_dir or os.path.join(WORK_ROOT, name)
    os.makedirs(folder, exist_ok=True)
    weights = [p.detach() for p in module.parameters()]
    wrapper = weights_as_arguments(module.eval(), len(example_args))
    path = os.path.join(folder, f"{name}.mlir")
    with torch.no_grad():
        aot.export(wrapper, *example_args, *weights).save_mlir(path)
    config = with_overrides(
        load_config(None), input_file=path, target=target, budget=budget, mode=mode,
        work_dir=folder,
    )  # fmt: skip
    try:
        run_model(config, resume=True, dry_run=False, progress=BarProgress())
    except SystemExit as done:  # the command's exit: outputs that differ, an interrupt
        why = f"the run ended with exit code {done.code}; see {config.log_file}"
        raise UserError(why) from None
    spec, custom = run_files(config, None, None)
    compiled = compile_tuned(config, spec, custom, os.path.join(folder, TUNED_VMFB))
    device = make_target(config).device
    arrays = [to_numpy(torch, w) for w in weights]
    return TunedModule(compiled.vmfb, device, arrays, compiled.describe())
