"""The files a run writes, named in one place and checked before anything is measured.

A bad `--output` once overwrote the input module, or replaced the tuning database with a
CSV; every such collision, and every path that cannot be written, is refused up front with
one `Error:` line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from iree.compiler import ir

from autosched.config import RunConfig
from autosched.errors import UserError
from autosched.outputs.spec import read_starter


@dataclass(frozen=True)
class RunPaths:
    input_file: str
    csv: str
    best_module: str  # the input module with the winners attached
    spec: str  # the winners as a tuning spec
    database: str
    log: str
    work_dir: str
    starter_spec: str = ""  # an input, like the module: no output may be it
    custom_spec: str = ""  # custom-kernel winners as a preprocessing spec
    summary: str = ""  # a model run's numbers (JSON)
    picture: str = ""  # a model run's dispatches, before and after (with matplotlib)

    @classmethod
    def of(cls, config: RunConfig) -> RunPaths:
        stem = os.path.splitext(config.output_file)[0]
        return cls(
            input_file=config.input_file,
            csv=config.output_file,
            best_module=stem + ".best.mlir",
            spec=stem + ".spec.mlir",
            database=config.database,
            log=config.log_file,
            work_dir=config.work_dir,
            starter_spec=config.starter_spec,
            custom_spec=stem + ".custom.mlir",
            summary=stem + ".summary.json",
            picture=stem + ".dispatches.png",
        )

    def outputs(self) -> dict[str, str]:
        """Each file the run writes, by what it is (for messages): the temporary files the
        CSV and the summary are written through too."""
        named = {
            "--output (the CSV)": self.csv,
            "the tuned module": self.best_module,
            "the tuning spec": self.spec,
            "the custom-kernel spec": self.custom_spec,
            "the tuning database": self.database,
            "the run log": self.log,
        }
        if self.summary:  # paths of a model run (RunPaths.of names them)
            named |= {"the summary": self.summary, "the dispatch picture": self.picture}
        if self.database.strip():  # torn lines are compacted away through it
            named["the tuning database's compaction file"] = self.database + ".compact"
        for what, temporary in (("the CSV", self.csv), ("the summary", self.summary)):
            if temporary.strip():
                named[f"{what}'s temporary file"] = temporary + ".tmp"
        return named


def record_counts(database: str) -> tuple[int, int]:
    """(trials, IREE defaults) among the tuning database's records (its non-empty lines;
    torn ones are compacted away before a run counts them); (0, 0) without a database."""
    if not os.path.isfile(database):
        return 0, 0
    trials = defaults = 0
    with open(database, "rb") as handle:
        for line in filter(bytes.strip, handle):
            try:
                baseline = json.loads(line).get("baseline") is True
            except (ValueError, AttributeError):  # unreadable: the run skips it with a warning
                continue
            defaults += baseline
            trials += not baseline
    return trials, defaults


def start_lines(paths: RunPaths, resume: bool) -> list[str]:
    """The run's first lines: where it writes, and whether it resumes from its database."""
    named = f"CSV {paths.csv}, log {paths.log}, database {paths.database}"
    lines = [f"writing to {named} (builds under {paths.work_dir})"]
    trials, defaults = record_counts(paths.database)
    records = trials + defaults
    if records and resume:
        what = f"{trials} trial(s) and {defaults} timing(s) of IREE's default"
        lines.append(f"resuming {what} from {paths.database} (--fresh ignores them)")
    elif records:
        lines.append(f"--fresh: the {records} records of {paths.database} are not read")
    return lines


# The work folder's own sub-folders (builds, dispatch dumps, inputs): no output may be in one.
WORK_FOLDERS = ("model", "linalg", "inputs")


def _writable_folder(path: str, what: str) -> None:
    """The nearest existing folder above `path` must be a folder this process can write."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise UserError(f"{what} {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: the folder {folder} is not writable")


def check_paths(paths: RunPaths) -> None:
    """Refuses empty, colliding, folder-valued and unwritable output paths."""
    for what, path in paths.outputs().items():
        if not path.strip():
            raise UserError(f"{what} is an empty path")
        if os.path.isdir(path):
            raise UserError(f"{what} {path} is a folder; give a file name")
        _writable_folder(path, what)
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise UserError(f"{what} {path} is not writable")
    if os.path.exists(paths.work_dir) and not os.path.isdir(paths.work_dir):
        raise UserError(f"work_dir {paths.work_dir} is a file, not a folder")
    _writable_folder(os.path.join(paths.work_dir, "x"), "work_dir")
    seen: dict[str, str] = {os.path.realpath(paths.input_file): "the input module"}
    if paths.starter_spec:
        read_starter(paths.starter_spec, ir.Context())  # fail now, not after the search
        seen[os.path.realpath(paths.starter_spec)] = "the starter spec"
    managed = [os.path.realpath(os.path.join(paths.work_dir, f)) for f in WORK_FOLDERS]
    for what, path in paths.outputs().items():
        real = os.path.realpath(path)
        inside = next((f for f in managed if real.startswith(f + os.sep)), None)
        if inside:
            raise UserError(
                f"{what} {path} is inside {inside}, which the run fills with its own builds: "
                "give it a place outside work_dir's model/, linalg/ and inputs/"
            )
        if real in seen:
            raise UserError(
                f"{seen[real]} and {what} are the same file, {path}: give each its own "
                "(--output, and the cfg's database and log_file)"
            )
        seen[real] = what
