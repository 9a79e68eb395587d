"""The one exception type that ends a run with a one-line message and exit code 2."""

import click


class UserError(click.ClickException):
    """Bad input from the user: a missing file, a bad cfg value, an unsupported module.

    click prints it as one `Error: ...` line on stderr and exits with code 2, no traceback,
    both from the installed command and from click's test runner.
    """

    exit_code = 2
