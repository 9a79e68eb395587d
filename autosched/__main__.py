# SIGTERM is handled before the command's imports, which take a second or more.
from autosched.interrupts import outside_runs

outside_runs()

from autosched.cli import main  # noqa: E402

main()
