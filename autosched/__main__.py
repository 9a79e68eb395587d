"""`python -m autosched` and the installed `autosched` command.

The signal handlers come first, before the command line's imports (IREE, numpy: a second
or more), so that Ctrl-C or SIGTERM at any moment ends the command with its line and code.
"""

from autosched.interrupts import starting_up


def main() -> None:
    starting_up()
    # The command line is imported only now, behind the handlers: that is the point.
    from autosched.cli import main as command_line  # noqa: PLC0415 - imported after the signal handlers are set

    command_line()


if __name__ == "__main__":
    main()
