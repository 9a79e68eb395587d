"""The user's inputs files, read: one `.npz`, or one `.npy` per argument (as iree-run-module
takes them); a file that is not numpy's is one UserError naming it. Which array is which
argument, and whether it fits, is module_io's (`load_inputs`)."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence

import numpy as np

from autosched.errors import UserError

NPY_MAGIC = b"\x93NUMPY"  # the first bytes of every .npy file (numpy's format)


def input_files(given: str) -> list[str]:
    """The user's inputs files, as `--inputs` and the cfg's `inputs` hold them: one `.npz`,
    or `.npy` files in argument order separated by commas (`a.npy,b.npy`; the command line's
    repeated `--inputs` is joined so). A path that names a file as it stands is one file,
    commas and all."""
    if not given or os.path.isfile(given):
        return [given] if given else []
    return [part.strip() for part in given.split(",") if part.strip()]


def npz_arrays(path: str) -> dict[str, np.ndarray]:
    """Every array of an `.npz` file, by name; a UserError naming it when it is none."""
    if not zipfile.is_zipfile(path) and not _is_npy(path):
        raise UserError(f"{path}: not a numpy .npz file of arrays (np.savez writes them)")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise UserError(f"{path}: not a numpy .npz file of arrays ({error})"[:300]) from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise UserError(f"{path}: one numpy array, not an .npz file of arrays (name it .npy)")
    try:
        with loaded as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise UserError(f"{path}: not a numpy .npz file of arrays ({error})"[:300]) from None


def _is_npy(path: str) -> bool:
    """Whether the file starts as every .npy file does."""
    with open(path, "rb") as handle:
        return handle.read(len(NPY_MAGIC)) == NPY_MAGIC


def npy_array(path: str) -> np.ndarray:
    """The array of one `.npy` file; a UserError naming it when it is none."""
    if not _is_npy(path):
        raise UserError(f"{path}: not a numpy .npy file (np.save writes them)")
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise UserError(f"{path}: not a numpy .npy file ({error})"[:300]) from None
    return array


def in_argument_order(arrays: dict, names: Sequence[str], count: int) -> list[tuple]:
    """(key, array) pairs in argument order: by `arr_<i>`, else by `names`, else as stored."""
    for keys in ([f"arr_{i}" for i in range(count)], list(names)):
        if keys and set(keys) == set(arrays):
            return [(key, arrays[key]) for key in keys]
    return list(arrays.items())


def given_arrays(given: str, count: int) -> list[np.ndarray]:
    """The user's arrays in argument order (`count` arguments): one `.npz`'s, or one
    `.npy` file's each."""
    files = input_files(given)
    if len(files) == 1 and not files[0].endswith(".npy"):
        return [array for _, array in in_argument_order(npz_arrays(files[0]), (), count)]
    return [npy_array(name) for name in files]
