"""The commands the tool prints for the user to run: every word quoted for a POSIX shell
(a path with spaces, a flag that holds one) and every build given its `-o`, so that what is
printed runs as pasted (a pasted command once wrote 69 KB of binary to the terminal)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

# The tuned module in the model's work folder: what the printed build commands write and
# what `autosched compile` writes without -o.
TUNED_VMFB = "model.vmfb"


def shell_line(steps: Sequence[Sequence[str]], between: str = " && ") -> str:
    """Commands joined by `&&` (`between`), each word quoted where the shell needs it."""
    return between.join(shlex.join(step) for step in steps)


def tuned_model_steps(
    path: str, target, spec_path: str | None, out: str, extra: Sequence[str] = ()
) -> list[list[str]]:
    """The commands that build the model at `path` with the spec (and the compile flags
    `extra`) into `out`: an ONNX model is imported first (iree-compile takes MLIR, not
    .onnx)."""
    flags = [*target.compile_flags(), *(target.spec_flags(spec_path) if spec_path else [])]
    flags += list(extra)
    if os.path.splitext(path)[1].lower() != ".onnx":
        return [["iree-compile", path, *flags, "-o", out]]
    imported = os.path.splitext(path)[0] + ".mlir"
    return [
        ["iree-import-onnx", path, "-o", imported],
        ["iree-compile", imported, *flags, "-o", out],
    ]
