"""One run at a time per work folder, per tuning database and per output.

Two runs on the same files measured points twice and deleted each other's outputs, so a
second run exits with a clear message instead. The lock is an advisory `flock` on a small
file: the kernel drops it when the holder dies, even by SIGKILL, so it never goes stale.
The holder removes its lock files when it lets go (no `.lock` files are left behind after
a run); a run that took the lock on a file removed meanwhile takes it again on the new one.
"""

from __future__ import annotations

import fcntl
import os

from autosched.errors import UserError


class RunLock:
    """Held for the life of a run; `release` (or process exit) frees it."""

    def __init__(self, paths: list[str]):
        self.handles = []
        try:
            for path in dict.fromkeys(os.path.abspath(p) for p in paths):
                self._take(path)
        except BaseException:
            self.release()
            raise

    def _take(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        while True:
            handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise UserError(
                    f"another autosched run (pid {holder}) is using "
                    f"{path.removesuffix('.lock')}; wait for it to finish, or give this run "
                    "its own [Env] work_dir and database"
                ) from None
            if _same_file(handle, path):
                break
            handle.close()  # its holder removed it as this run opened it: take the new one
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        self.handles.append(handle)

    def release(self) -> None:
        """Removes each lock file while still holding it, then lets go."""
        for handle in self.handles:
            if _same_file(handle, handle.name):
                os.unlink(handle.name)
            handle.close()
        self.handles = []


def _same_file(handle, path: str) -> bool:
    """Whether `path` still names the file `handle` holds open."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def lock_paths(work_dir: str, database: str, output: str = "") -> list[str]:
    """The lock files of a run: one in the work folder, one beside the database, one beside
    the CSV (two runs with their own folders but one --output would replace each other's
    CSV and summary)."""
    paths = [os.path.join(work_dir, ".autosched.lock"), database + ".lock"]
    return paths + ([output + ".lock"] if output else [])
