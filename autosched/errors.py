"""The one exception type that ends a run with a one-line message and exit code 2."""

import os
import stat

import click


class UserError(click.ClickException):
    """Bad input from the user: a missing file, a bad cfg value, an unsupported module.

    click prints it as one `Error: ...` line on stderr and exits with code 2, no traceback,
    both from the installed command and from click's test runner.
    """

    exit_code = 2


def require_file(path: str) -> None:
    """A UserError that says what `path` is when it is not a readable regular file (a
    folder, a FIFO, a dangling link or a loop of links), rather than "no such file"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise UserError(f"{path}: a symbolic link to nothing") from None
        raise UserError(f"{path}: no such file") from None
    except OSError as error:  # ELOOP: a loop of symbolic links; EACCES
        raise UserError(f"{path}: {error.strerror}") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file (a FIFO, socket or device)")
