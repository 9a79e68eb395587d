"""`python -m autosched` and the installed `autosched` command.

The signal handlers come first, at this module's first line and before any other import
(the command line's imports, IREE and numpy, take a second or more; the package's own
modules tens of milliseconds), so that Ctrl-C or SIGTERM at any moment after the interpreter
starts running the command ends it with its line and code (startup_signals.py).
"""

from autosched.startup_signals import starting_up

starting_up()  # on import: the console script imports this module before calling main


def main() -> None:
    starting_up()
    # The command line is imported only now, behind the handlers: that is the point.
    from autosched.cli import main as command_line  # noqa: PLC0415 - imported after the signal handlers are set

    command_line()


if __name__ == "__main__":
    main()
