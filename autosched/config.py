"""auto-scheduler.cfg into typed values; every error names file, section, key and value."""

from __future__ import annotations

import configparser
import math
import os
from dataclasses import dataclass, field, fields, replace

from autosched.errors import UserError
from autosched.search.tuners.registry import TUNER_NAMES as TUNERS
from autosched.targets.registry import TARGET_NAMES as TARGETS

DEFAULT_CONFIG_FILE = "auto-scheduler.cfg"
# Each model's run works in its own folder under this one, named by the model's stem, so
# that nothing of one model's run is read by another's (issue 47: a resnet run's dispatch
# table listed an ONNX encoder's dispatches when every run shared `generated/`).
WORK_ROOT = "generated"
# The run's files in its work folder, when the cfg and the command line name none.
WORK_FILES = {"output_file": "results.csv", "log_file": "run.log", "database": "tuning.jsonl"}
PATH_KEYS = ("work_dir", *WORK_FILES)

SEARCH_SPACE = "SearchSpace"

Knob = int | str


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, after the cfg file and the command line are merged."""

    # [Env]
    input_file: str = ""
    # The four paths below: empty means in the input's work folder (`work_folder`).
    output_file: str = ""
    target: str = "cpu"
    device: str = ""  # empty: the target's own default (local-task, cuda)
    arch: str = ""  # cuda only; empty: detected from the local GPU, else sm_80
    log_file: str = ""
    work_dir: str = ""
    database: str = ""
    jobs: int = 0  # parallel compiles; 0: all cores
    compile_timeout: float = 120.0
    run_timeout: float = 60.0
    ptxas: str = ""  # cuda: ptxas to assemble kernels at compile time; empty: look for one
    starter_spec: str = ""  # a tuning spec of the user's, merged with the tuned one
    inputs: str = ""  # models: the user's inputs (.npz) for every whole-model check; "": random
    buckets: str = ""  # a dynamic-length model: .npz files, one length each, comma-joined
    devices: str = ""  # measure on several devices: a comma list of URIs, or all; empty: device
    executor: str = "local"  # local: this host's cores and devices; ray: a Ray cluster
    ray_address: str = "auto"  # the Ray cluster to join (ray.init's address)
    parallel_problems: int = 0  # problems searched at once; 0: two per measuring device (GPU)
    # [SearchStrategy]
    tuner: str = "xgboost"  # the best of the three in replay (search_efficiency.md)
    n_trial: int = 32
    seed: int = 0
    batch_size: int = 8  # points proposed per tuner round
    early_stopping: int = 0  # stop a problem after this many trials without improvement; 0: never
    starting_points: str = "target"  # target: its known-good points go first; none: tuner alone
    history: str = "none"  # database: other problems' records teach the cost model first
    # known-good points first (search/knowledge.py): "" the shipped base and the run's
    # database (and, in a model, siblings' winners); none: off; a path: that base instead
    knowledge: str = ""
    mode: str = "normal"  # models: fast | normal | extreme, the budget when none is given
    budget: int = 0  # models: total trials over all problems; 0: from the mode
    time_budget: float = 0.0  # models: wall-clock minutes for the search; 0: no limit
    # models: auto: a layout the target needs is chosen before the dispatches are read
    # (model/layouts.py: strided 1x1 convolutions as slices on CUDA, and NHWC convolutions
    # where the Triton convolution kernels are searched); strided: the slices on any target;
    # channels_last: the slices and NHWC convolutions (IREE's conversion); none: as given
    layout: str = "auto"
    # [Benchmark]
    repetitions: int = 5
    min_time: float = 0.05  # seconds per repetition
    dispatch_repeat: int = 0  # 0: the target's default
    retime_top: int = 3
    time_on: str = "dispatch"  # models: IREE's own dispatch (fused ops and all) or the kernel
    # tool: iree-benchmark-module per candidate; worker: the verifier's long-lived worker;
    # auto: the target's (worker on CUDA, where it agrees with the tool within 2 %)
    timer: str = "auto"
    # IREE runtime flags for checking and timing ("": none; auto: the target's, which on CUDA
    # is IREE's caching allocator: measure/contract.py TARGET_RUNTIME_FLAGS)
    runtime_flags: str = "auto"
    # IREE's dispatch formation for the reported build (custom kernels, else the spec's):
    # default, aggressive (--iree-dispatch-creation-enable-aggressive-fusion), choose (built
    # both ways, the faster kept), auto: choose on CUDA, default elsewhere
    dispatch_fusion: str = "auto"
    # models: every dispatch timed before and after the spec, as a table (and a picture with
    # matplotlib), or none; auto: none in fast mode (minutes count there), all otherwise
    dispatch_table: str = "auto"
    # [SearchSpace]: knob name -> candidate values, as the user wrote them
    search_space: dict[str, list[Knob]] = field(default_factory=dict)
    # [SearchSpace.<target>]: the same, used only when that target runs
    target_search_spaces: dict[str, dict[str, list[Knob]]] = field(default_factory=dict)
    source: str = "built-in defaults"  # the cfg file these came from, for messages
    # PATH_KEYS the user named (the cfg or the command line); the others follow the input.
    # None: those given non-empty at construction.
    named_paths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        """Fills the paths the user did not name from the input's work folder, again at
        every `replace`, so that a config that changes its input changes its folder."""
        named = self.named_paths
        if named is None:
            named = tuple(key for key in PATH_KEYS if getattr(self, key))
            object.__setattr__(self, "named_paths", named)
        folder = self.work_dir if "work_dir" in named else work_folder(self.input_file)
        object.__setattr__(self, "work_dir", folder)
        for key, name in WORK_FILES.items():
            if key not in named:
                object.__setattr__(self, key, os.path.join(folder, name))

    @property
    def knob_space(self) -> dict[str, list[Knob]]:
        """The knobs for this run's target: [SearchSpace.<target>] over [SearchSpace].

        So that one cfg can hold a space per target and `--target` switches between them.
        """
        return {**self.search_space, **self.target_search_spaces.get(self.target, {})}

    def knob_section(self, knob: str) -> str:
        """The cfg section a knob of `knob_space` came from, for error messages."""
        if knob in self.target_search_spaces.get(self.target, {}):
            return f"{SEARCH_SPACE}.{self.target}"
        return SEARCH_SPACE

    @property
    def first_pass_repetitions(self) -> int:
        """Repetitions of a candidate's first timing: fewer in fast mode, where the paired
        re-timing, not the first pass, names the winner."""
        return min(self.repetitions, FAST_REPETITIONS) if self.mode == "fast" else self.repetitions

    @property
    def repetition_s(self) -> float:
        """Seconds a timing's repetition (and its warm-up) lasts at least: shorter in fast
        mode, where 0.05 s repetitions made timing half of a CPU search's wall time."""
        return min(self.min_time, FAST_MIN_TIME) if self.mode == "fast" else self.min_time

    @property
    def retime_repetition_s(self) -> float:
        """Seconds a re-timing's repetition lasts at least: in fast mode longer than a first
        pass's, since its paired rounds name the winner (at 0.01 s, one resnet18 run on the
        CPU kept none of its large convolutions' winners)."""
        return min(self.min_time, FAST_RETIME_MIN_TIME) if self.mode == "fast" else self.min_time

    @property
    def finalists(self) -> int:
        """Candidates a problem re-times beside its default (`retime_top`; fewer in fast
        mode, where each costs three paired rounds)."""
        return min(self.retime_top, FAST_RETIME_TOP) if self.mode == "fast" else self.retime_top

    @property
    def times_dispatches(self) -> bool:
        """Whether a model run times every dispatch for its tables (`dispatch_table`)."""
        if self.dispatch_table == "auto":
            return self.mode != "fast"
        return self.dispatch_table == "all"


def work_folder(input_file: str) -> str:
    """`generated/<the input's stem>` (`generated` without an input)."""
    stem = os.path.splitext(os.path.basename(input_file))[0]
    return os.path.join(WORK_ROOT, stem) if stem else WORK_ROOT


# Which section holds each scalar field, and how to read it.
_SECTIONS: dict[str, dict[str, type]] = {
    "Env": {
        "input_file": str,
        "output_file": str,
        "target": str,
        "device": str,
        "arch": str,
        "log_file": str,
        "work_dir": str,
        "database": str,
        "jobs": int,
        "compile_timeout": float,
        "run_timeout": float,
        "ptxas": str,
        "starter_spec": str,
        "inputs": str,
        "buckets": str,
        "devices": str,
        "executor": str,
        "ray_address": str,
        "parallel_problems": int,
    },
    "SearchStrategy": {
        "tuner": str,
        "n_trial": int,
        "seed": int,
        "batch_size": int,
        "early_stopping": int,
        "starting_points": str,
        "history": str,
        "knowledge": str,
        "mode": str,
        "budget": int,
        "time_budget": float,
        "layout": str,
    },
    "Benchmark": {
        "repetitions": int,
        "min_time": float,
        "dispatch_repeat": int,
        "retime_top": int,
        "time_on": str,
        "timer": str,
        "runtime_flags": str,
        "dispatch_fusion": str,
        "dispatch_table": str,
    },
}
MODES = ("fast", "normal", "extreme")
FAST_REPETITIONS = 3  # fast mode: a candidate's first timing repeats at most this often
FAST_RETIME_TOP = 2  # fast mode: at most this many finalists re-timed a problem
FAST_MIN_TIME = 0.01  # fast mode: seconds a first-pass timing's repetition lasts at least
FAST_RETIME_MIN_TIME = 0.02  # ... and a re-timing's, whose paired rounds name the winner
TIME_ON = ("dispatch", "kernel")
TIMERS = ("auto", "tool", "worker")
EXECUTORS = ("local", "ray")
STARTING_POINTS = ("target", "none")
HISTORIES = ("database", "none")
DISPATCH_TABLES = ("auto", "all", "none")
DISPATCH_FUSIONS = ("auto", "choose", "default", "aggressive")
LAYOUTS = ("auto", "strided", "channels_last", "generalized", "rows", "none")
_CHOICES = {
    "target": TARGETS,
    "tuner": TUNERS,
    "mode": MODES,
    "time_on": TIME_ON,
    "timer": TIMERS,
    "executor": EXECUTORS,
    "starting_points": STARTING_POINTS,
    "history": HISTORIES,
    "dispatch_table": DISPATCH_TABLES,
    "dispatch_fusion": DISPATCH_FUSIONS,
    "layout": LAYOUTS,
}
_MINIMUM = {
    "jobs": 0,
    "parallel_problems": 0,
    "compile_timeout": 0.1,
    "run_timeout": 0.1,
    "n_trial": 1,
    "seed": 0,
    "batch_size": 1,
    "early_stopping": 0,
    "budget": 0,
    "time_budget": 0.0,
    "repetitions": 1,
    "min_time": 0.0,
    "dispatch_repeat": 0,
    "retime_top": 0,
}


def parse_knob_list(text: str) -> list[Knob]:
    """`[64, 128]` or `64` or `[TileAndFuse, VectorDistribute]` into a list of ints and names."""
    body = text.strip()
    if body.startswith("[") != body.endswith("]"):
        raise ValueError("unbalanced brackets")
    body = body.strip("[]").strip()
    if not body:
        raise ValueError("empty list")
    values: list[Knob] = []
    for item in body.split(","):
        item = item.strip().strip("'\"")
        if not item:
            raise ValueError("empty item")
        try:
            values.append(int(item))
        except ValueError:
            if not item.replace("_", "").isalnum():
                raise ValueError(f"{item!r} is neither an integer nor a name") from None
            values.append(item)
    if len(set(values)) != len(values):
        raise ValueError("repeated values")
    return values


# Upper limits: a value past these is a typo, and some (inf, 1e308) break the tools.
_MAXIMUM = {
    "compile_timeout": 86400.0,
    "run_timeout": 86400.0,
    "min_time": 60.0,
    "jobs": 4096,
    "n_trial": 10_000_000,
    "batch_size": 100_000,
    "repetitions": 1000,
    "dispatch_repeat": 100_000,
    "retime_top": 1000,
    "seed": 2**32 - 1,
    "budget": 100_000_000,
    "time_budget": 525_600.0,  # a year of minutes
}
MAX_TEXT = 4096  # longest path or name a cfg value may hold
MAX_DEVICE = 256


def _shown(raw: str) -> str:
    """A value as quoted in an error message, cut short when it is huge."""
    return repr(raw if len(raw) <= 60 else raw[:57] + "...")


def check_value(where: str, key: str, value, option: str = ""):
    """Raises UserError when a typed value is outside what its key allows.

    `where` names the cfg file and section; a command-line `option` replaces both.
    """
    shown = _shown(str(value))
    where = f"{option} {str(value)[:60]}" if option else f"{where}: {key} = {shown}"
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: must be a finite number")
    if key in _CHOICES and value not in _CHOICES[key]:
        raise UserError(f"{where}: expected one of {', '.join(_CHOICES[key])}")
    if key in _MINIMUM and value < _MINIMUM[key]:
        raise UserError(f"{where}: must be at least {_MINIMUM[key]}")
    if key in _MAXIMUM and value > _MAXIMUM[key]:
        raise UserError(f"{where}: must be at most {_MAXIMUM[key]:g}")
    if isinstance(value, str):
        if len(value) > (MAX_DEVICE if key == "device" else MAX_TEXT):
            raise UserError(f"{where}: {len(value)} characters is too long")
        if "\0" in value:
            raise UserError(f"{where}: holds a NUL character")
    return value


def _convert(where: str, key: str, raw: str, kind: type):
    try:
        value = kind(raw)
    except (ValueError, OverflowError):
        raise UserError(f"{where}: {key} = {_shown(raw)}: expected {kind.__name__}") from None
    return check_value(where, key, value)


def load_config(path: str | None) -> RunConfig:
    """Reads a cfg file; with no path, ./auto-scheduler.cfg if present, else the defaults."""
    if path is None:
        if not os.path.isfile(DEFAULT_CONFIG_FILE):
            return RunConfig()
        path = DEFAULT_CONFIG_FILE
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such config file")
    parser = configparser.ConfigParser(inline_comment_prefixes=(";", "#"), interpolation=None)
    parser.optionxform = str  # keep key case so that errors quote the user's spelling
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error as error:
        message = " ".join(str(error).split())[:300]
        raise UserError(f"{path}: not a valid cfg file: {message}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not a UTF-8 text file (byte {error.start})") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read the cfg file: {error.strerror}") from None
    values: dict[str, object] = {"source": path}
    space_sections = {SEARCH_SPACE: "", **{f"{SEARCH_SPACE}.{t}": t for t in TARGETS}}
    target_spaces: dict[str, dict[str, list[Knob]]] = {}
    for section in parser.sections():
        if section in space_sections:
            space = {}
            for key, raw in parser.items(section):
                try:
                    space[key] = parse_knob_list(raw)
                except ValueError as error:
                    raise UserError(f"{path}: [{section}] {key} = {raw!r}: {error}") from None
            if space_sections[section]:
                target_spaces[space_sections[section]] = space
            else:
                values["search_space"] = space
            continue
        if section not in _SECTIONS:
            known = ", ".join(f"[{s}]" for s in [*_SECTIONS, *space_sections])
            raise UserError(f"{path}: unknown section [{section}] (known: {known})")
        for key, raw in parser.items(section):
            if key not in _SECTIONS[section]:
                known = ", ".join(_SECTIONS[section])
                raise UserError(f"{path}: [{section}] unknown key {key!r} (known: {known})")
            kind = _SECTIONS[section][key]
            if raw.strip() == "" and kind is str:
                continue  # an empty string key means "use the default"
            values[key] = _convert(f"{path}: [{section}]", key, raw.strip(), kind)
    return RunConfig(**values, target_search_spaces=target_spaces)


def with_overrides(config: RunConfig, **overrides) -> RunConfig:
    """Applies command-line options; None means 'not given'."""
    given = {k: v for k, v in overrides.items() if v is not None}
    names = {f.name for f in fields(RunConfig)}
    unknown = set(given) - names
    if unknown:
        raise ValueError(f"not RunConfig fields: {sorted(unknown)}")
    for key, value in given.items():
        check_value("", key, value, option=f"--{key.replace('_', '-')}")
    paths = [key for key in given if key in PATH_KEYS]
    named = tuple(dict.fromkeys([*(config.named_paths or ()), *paths]))
    return replace(config, **given, named_paths=named)
