"""The custom winners' kernels compiled side by side, before the spec is written.

A winner needs up to six kernels (its op's, its narrow twin, a stored weight's, one for
each epilogue), and Triton compiles them one at a time in this process: on the H100 the
GPT-2-medium block's fast-mode run spent about 40 s of its 168 outside every timed phase,
most of it writing its five winners' spec. Here a first pass of the spec's own builder
records what it would compile (the family stands behind a recorder that compiles
nothing), the kernels are compiled in processes of their own, every core at once, and the
real pass takes each kernel from there, or raises what its compile raised. A kernel that
failed otherwise is compiled again in the real pass, which raises as it always did.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from autosched import processes
from autosched.kernels.base import KernelBinary, KernelDoesNotFit, KernelFamily
from autosched.kernels.compile import family_class
from autosched.ops.epilogue import Epilogue

COMPILE_S = 600.0  # a process of kernels past this leaves them to the spec's own pass


@dataclass(frozen=True)
class KernelCall:
    """One `KernelFamily.compile` the spec's builder makes, as a process can repeat it."""

    family: str  # the family's class, as `module:Class`
    problem: object  # its sites left out: a kernel needs the op, not where it occurs
    params: object
    arch: str
    path: str  # the PTX's path: one kernel a path in a spec's folder
    epilogue: Epilogue | None = None


class _Stand:
    """A family whose `compile` is another's; everything else is the family's own."""

    def __init__(self, family: KernelFamily):
        self._family = family

    def __getattr__(self, name: str):
        return getattr(self._family, name)


class Recorder(_Stand):
    """Records each compile and compiles nothing (its binary is a placeholder)."""

    def __init__(self, family: KernelFamily, calls: list[KernelCall]):
        super().__init__(family)
        self._calls = calls

    def compile(self, problem, params, arch: str, path: str, epilogue=None) -> KernelBinary:
        cls = type(self._family)
        self._calls.append(
            KernelCall(
                f"{cls.__module__}:{cls.__qualname__}",
                _without_sites(problem),
                params,
                arch,
                os.path.abspath(path),
                epilogue,
            )
        )
        return KernelBinary(path, path, "", 0, 0, 0)


class Compiled(_Stand):
    """Takes each kernel compiled ahead by its path, or compiles it here."""

    def __init__(self, family: KernelFamily, done: dict[str, KernelBinary | Exception]):
        super().__init__(family)
        self._done = done

    def compile(self, problem, params, arch: str, path: str, epilogue=None) -> KernelBinary:
        found = self._done.get(os.path.abspath(path))
        if isinstance(found, KernelBinary):
            return found
        if isinstance(found, KernelDoesNotFit):
            raise found
        return _compiled(self._family, problem, params, arch, path, epilogue)


def _compiled(family, problem, params, arch: str, path: str, epilogue) -> KernelBinary:
    """The family's compile as the builder calls it: an epilogue only where there is one
    (a family that absorbs none takes no such argument)."""
    if epilogue is None:
        return family.compile(problem, params, arch, path)
    return family.compile(problem, params, arch, path, epilogue)


def _without_sites(problem):
    if not dataclasses.is_dataclass(problem):
        return problem
    fields = {f.name for f in dataclasses.fields(problem)}
    return dataclasses.replace(problem, sites=[]) if "sites" in fields else problem


def _compile(call: KernelCall) -> KernelBinary | Exception:
    """One kernel, in a process of the pool (KernelDoesNotFit is an answer, not a fault)."""
    family = family_class(call.family)()
    try:
        return _compiled(family, call.problem, call.params, call.arch, call.path, call.epilogue)
    except KernelDoesNotFit as error:
        return error
    except Exception as error:  # noqa: BLE001 - the real pass compiles it again and raises
        return RuntimeError(str(error))


def compile_calls(calls: list[KernelCall], jobs: int | None = None) -> dict[str, object]:
    """PTX path -> its binary, or the KernelDoesNotFit its compile raised: the calls split
    over processes of their own (`python -m`, not multiprocessing: a script that calls
    autosched need not guard its main module), every core at once. A process that fails or
    runs past COMPILE_S leaves its kernels to the real pass."""
    if len(calls) < 2:
        return {}
    workers = max(1, min(jobs or os.cpu_count() or 1, len(calls)))
    chunks = [calls[index::workers] for index in range(workers)]
    with tempfile.TemporaryDirectory(prefix="autosched-kernels-") as folder:

        def compile_chunk(index: int) -> dict[str, object]:
            out = os.path.join(folder, f"{index}.pickle")
            command = [sys.executable, "-m", __name__, out]
            try:
                sent = pickle.dumps(chunks[index])
            except (pickle.PicklingError, TypeError, AttributeError):  # compiled in turn
                return {}
            finished = processes.run(command, COMPILE_S, input_bytes=sent)
            if finished.returncode != 0 or not os.path.exists(out):
                return {}
            with open(out, "rb") as handle:
                return pickle.load(handle)

        with ThreadPoolExecutor(workers) as pool:
            found = list(pool.map(compile_chunk, range(workers)))
    return {path: result for part in found for path, result in part.items()}


def main() -> None:
    """A process of `compile_calls`: the pickled calls on stdin, their results pickled to
    the path its one argument names."""
    calls = pickle.loads(sys.stdin.buffer.read())
    found = {call.path: _compile(call) for call in calls}
    with open(sys.argv[1], "wb") as handle:
        pickle.dump(found, handle)


if __name__ == "__main__":
    main()
