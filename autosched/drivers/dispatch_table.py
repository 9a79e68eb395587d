"""The whole model's picture: every dispatch IREE forms, timed on IREE's own dispatch
benchmark with IREE's default and with the tuning spec, times the launches of one model
call, largest first. A model is not its matmuls: this says where the rest of the time goes
(attention, layout ops, element-wise dispatches), before and after.

Dispatches replaced by custom kernels are timed as IREE builds them (the spec's view); their
custom kernels' times are in the problem table.
"""

from __future__ import annotations

import filecmp
import os
from dataclasses import asdict, dataclass

from autosched.compile import CompileJob, compile_all
from autosched.config import RunConfig
from autosched.measure.benchmark_tool import time_module
from autosched.measure.contract import runtime_flags
from autosched.model.dispatch_benchmarks import DispatchBenchmark
from autosched.outputs.dispatch_labels import dispatch_label
from autosched.outputs.report import table

DISPATCHES_PER_CALL = 10  # per timed call of a dispatch benchmark


@dataclass
class DispatchRow:
    """One dispatch: its launches per model call and its time per launch, before and after."""

    entry_point: str
    calls: int
    default_ms: float | None
    tuned_ms: float | None = None
    tuned: str = ""  # the tuned problem whose root it is ("" for the rest)
    root_op: str = ""  # its root op for a reader (outputs/dispatch_labels.py): "conv 3x3 64->64"
    changed: bool = False  # the spec written configures it (its problem is in the spec)

    @property
    def default_total(self) -> float:
        return (self.default_ms or 0.0) * self.calls

    @property
    def tuned_total(self) -> float:
        ms = self.tuned_ms if self.tuned_ms is not None else self.default_ms
        return (ms or 0.0) * self.calls


def _builds(benchmarks, target, spec_path: str | None, folder: str) -> list[CompileJob]:
    jobs = []
    for entry, benchmark in benchmarks.items():
        base = [*target.compile_flags(), *benchmark.flags]
        jobs.append(
            CompileJob(benchmark.source, os.path.join(folder, f"{entry}.default.vmfb"), base)
        )
        if spec_path:
            flags = [*base, *target.spec_flags(os.path.abspath(spec_path))]
            jobs.append(
                CompileJob(benchmark.source, os.path.join(folder, f"{entry}.tuned.vmfb"), flags)
            )
    return jobs


def _time(vmfb: str, benchmark: DispatchBenchmark, device: str, config: RunConfig, flags):
    timing = time_module(
        vmfb,
        device,
        [],
        DISPATCHES_PER_CALL,
        config.repetitions,
        config.min_time,
        config.run_timeout,
        function=benchmark.function,
        runtime_flags=flags,
    )
    return timing.median_ms if timing.status == "ok" else None


def time_dispatches(
    benchmarks: dict[str, DispatchBenchmark],
    calls: dict[str, int],
    target,
    spec_path: str | None,
    config: RunConfig,
    tuned: dict[str, str],
    folder: str = "",
    changed: frozenset[str] = frozenset(),
) -> list[DispatchRow]:
    """Every dispatch timed with IREE's default and (with `spec_path`) with the spec, one
    after the other on the target's device; largest share of the default first. `tuned`
    maps a tuned problem's dispatches to its name; `changed` names the dispatches the spec
    configures."""
    folder = folder or os.path.join(config.work_dir, "model", "dispatch_table")
    os.makedirs(folder, exist_ok=True)
    built = {
        r.job.output
        for r in compile_all(
            _builds(benchmarks, target, spec_path, folder),
            config.compile_timeout,
            config.jobs or os.cpu_count() or 1,
        )
        if r.status == "ok"
    }
    rows, flags = [], runtime_flags(config)
    for entry, benchmark in benchmarks.items():
        default, after = (os.path.join(folder, f"{entry}.{w}.vmfb") for w in ("default", "tuned"))
        row = DispatchRow(entry, calls.get(entry, 1), None, tuned=tuned.get(entry, ""))
        row.root_op = dispatch_label(benchmark.source)
        row.changed = bool(spec_path) and entry in changed
        if default in built:
            row.default_ms = _time(default, benchmark, target.device, config, flags)
        if after in built and default in built and filecmp.cmp(default, after, shallow=False):
            # The spec left it byte for byte as IREE builds it: the same time, not a second
            # timing's noise (a 7x7 convolution the spec does not touch read 2.5x faster).
            row.tuned_ms = row.default_ms
        elif after in built:
            row.tuned_ms = _time(after, benchmark, target.device, config, flags)
        rows.append(row)
    return sorted(rows, key=lambda r: -r.default_total)


def custom_build_lines(rows: list[DispatchRow]) -> str:
    """The model with its custom kernels: each dispatch's time per model call (the spec on
    IREE's dispatches, `hal.dispatch.extern` the custom kernels) and its share."""
    total = sum(r.tuned_total for r in rows) or 1.0
    headers = ["dispatch", "runs", "ms", "share", "kernel"]
    cells = [
        [
            r.entry_point,
            str(r.calls),
            f"{r.tuned_total:.4g}" if r.default_ms is not None else "-",
            f"{r.tuned_total / total:.1%}",
            "custom" if _is_custom(r) else "IREE",
        ]
        for r in sorted(rows, key=lambda r: -r.tuned_total)
    ]
    lines = [table(headers, cells), f"all dispatches with the custom kernels: {total:.4g} ms"]
    return "\n".join([*lines, *layout_line(rows, total)])


# Root ops in IREE's dispatch names for dispatches that only move data (or mostly): what the
# custom kernels could absorb by reading their operands through strides (issue 24 item 2).
LAYOUT_WORDS = ("transpose", "broadcast")


def root_name(entry_point: str) -> str:
    """The part of IREE's dispatch name that names its root op and shape
    (`<function>$async_dispatch_<n>_<root>_<shape>...`): the model's function name, which
    may hold any word, is not in it."""
    _, found, rest = entry_point.rpartition("dispatch_")
    if not found:
        return entry_point
    _, _, root = rest.partition("_")
    return root


def is_layout_op(entry_point: str) -> bool:
    """Whether a dispatch's root op only moves data: a transpose or a broadcast, which IREE
    may name as an elementwise one (`elementwise_broadcast_...`); never a matmul that reads
    an operand transposed (`matmul_transpose_b_...`)."""
    words = root_name(entry_point).split("_")
    if words[0] == "elementwise":
        words = words[1:]
    return bool(words) and words[0] in LAYOUT_WORDS


def layout_line(rows: list[DispatchRow], total: float) -> list[str]:
    """One line saying what the layout ops left after tuning cost, against `total` (none
    when there are none)."""
    layout = [r for r in rows if is_layout_op(r.entry_point)]
    if not layout:
        return []
    ms = sum(r.tuned_total for r in layout)
    return [
        f"layout ops left (transposes, broadcasts): {len(layout)} dispatch(es), "
        f"{ms:.4g} ms ({ms / (total or 1.0):.1%})"
    ]


def dispatch_lines(rows: list[DispatchRow]) -> str:
    """The table: each dispatch's time per model call and its share, before and after (the
    default alone when no spec was written: nothing was timed after)."""
    before = sum(r.default_total for r in rows) or 1.0
    after = sum(r.tuned_total for r in rows) or 1.0
    with_spec = any(r.tuned_ms is not None for r in rows)
    headers = ["dispatch", "root op", "runs", "ms before", "share", "ms after", "share after"]
    headers = [*(headers if with_spec else headers[:5]), "problem"]
    cells = []
    for r in rows:
        cell = [r.entry_point, r.root_op or "-", str(r.calls)]
        cell += [f"{r.default_total:.4g}" if r.default_ms is not None else "-"]
        cell += [f"{r.default_total / before:.1%}"]
        if with_spec:
            cell += [f"{r.tuned_total:.4g}" if r.default_ms is not None else "-"]
            cell += [f"{r.tuned_total / after:.1%}"]
        cells.append([*cell, _problem_cell(r)])
    total = (
        f"all dispatches: {before:.4g} ms -> {after:.4g} ms per model call"
        if with_spec
        else f"all dispatches: {before:.4g} ms per model call (IREE's default; no spec written)"
    )
    return "\n".join([table(headers, cells), total, *layout_line(rows, after)])


def _problem_cell(row: DispatchRow) -> str:
    """The problem whose root the dispatch is, marked where the spec written configures it
    (a problem searched but left out of the spec is its default, before and after)."""
    if not row.tuned:
        return "-"
    return f"{row.tuned} (in spec)" if row.changed else row.tuned


def outside_line(build: str, model_ms: float | None, rows: list[DispatchRow]) -> str | None:
    """What a call of the `build` (the proof's time, `model_ms`) spends beside its
    dispatches timed alone: IREE's runtime handing the call to its queue and the finished
    work back to the caller (on the H200, the Llama-3-8B layer's kernels ran back to back
    with 20 us of gaps, and 0.2-0.3 ms went before the first and after the last:
    benchmarks/model_timeline.py). None without both times."""
    kernels = sum(r.tuned_total for r in rows)
    if not model_ms or not kernels:
        return None
    outside = model_ms - kernels
    if outside <= 0:  # the call took no longer than its dispatches timed one by one
        return (
            f"the {build} model: {model_ms:.4g} ms a call, its dispatches timed alone "
            f"{kernels:.4g} ms: what the call spends beside them is within the timings' noise"
        )
    return (
        f"the {build} model: {model_ms:.4g} ms a call, its dispatches timed alone "
        f"{kernels:.4g} ms: {outside:.4g} ms ({outside / model_ms:.0%}) beside them "
        "(the runtime submitting the call and returning it, and gaps between dispatches)"
    )


def dispatch_summary(rows: list[DispatchRow] | None) -> list[dict]:
    """The rows as the summary JSON holds them (none for no rows)."""
    return [
        asdict(r) | {"default_total_ms": r.default_total, "tuned_total_ms": r.tuned_total}
        for r in rows or []
    ]


def plot_dispatches(
    rows: list[DispatchRow],
    path: str,
    top: int = 20,
    custom: list[DispatchRow] | None = None,
) -> str | None:
    """A bar chart of the largest dispatches before and after (needs matplotlib: the
    optional `plots` extra); None without it. With `custom` (the build with custom kernels,
    `custom_build_dispatches`), a second panel shows that build's dispatches, largest first:
    the build the run reports as its fastest."""
    try:
        import matplotlib  # noqa: PLC0415 - an optional extra, imported where it is used

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - an optional extra, imported where it is used
    except ImportError:
        return None
    shown = rows[:top][::-1]
    extra = sorted(custom or [], key=lambda r: -r.tuned_total)[:top][::-1]
    heights = [0.35 * len(shown) + 1.5, *([0.35 * len(extra) + 1.5] if extra else [])]
    figure, panels = plt.subplots(
        len(heights),
        1,
        figsize=(10, sum(heights)),
        squeeze=False,
        sharex=True,
        height_ratios=heights,
    )
    _spec_panel(panels[0][0], picture_bars(shown))
    if extra:
        _custom_panel(panels[1][0], extra, sum(r.tuned_total for r in custom or []))
    panels[-1][0].set_xlabel("ms per model call")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


@dataclass(frozen=True)
class Bar:
    """One dispatch in the picture: its label, its times per model call before and after
    the spec, and whether the spec configures it (drawn hatched)."""

    label: str
    default_ms: float
    tuned_ms: float | None  # None: no build with a spec (the run wrote none)
    changed: bool


def picture_bars(rows: list[DispatchRow]) -> list[Bar]:
    """The picture's bars, in the rows' order: each labelled by its root op. Without a
    spec (no row timed after), there is no second bar: the default stays."""
    with_spec = any(r.tuned_ms is not None for r in rows)
    return [
        Bar(bar_label(r), r.default_total, r.tuned_total if with_spec else None, r.changed)
        for r in rows
    ]


SPEC_HATCH = "///"


def _spec_panel(axes, bars: list[Bar]) -> None:
    """IREE's dispatches before and after the spec; those the spec configures hatched.
    Without a spec, the default's bars alone (an orange bar "with the spec" equal to the
    default's said a spec had been tried on every dispatch)."""
    from matplotlib.patches import Patch  # noqa: PLC0415 - an optional extra, imported where it is used

    positions = range(len(bars))
    if any(b.tuned_ms is None for b in bars):
        axes.barh(list(positions), [b.default_ms for b in bars], 0.6,
                  label="IREE default", color="tab:blue")  # fmt: skip
        axes.set_yticks(list(positions), [b.label for b in bars], fontsize=7)
        axes.set_title("IREE's dispatches (no spec written: IREE's default stays)", fontsize=9)
        axes.legend()
        return
    axes.barh([p + 0.2 for p in positions], [b.default_ms for b in bars], 0.4,
              label="IREE default", color="tab:blue")  # fmt: skip
    tuned = axes.barh(
        [p - 0.2 for p in positions], [b.tuned_ms for b in bars], 0.4,
        color="tab:orange", label="with the spec",
    )  # fmt: skip
    for patch, bar in zip(tuned.patches, bars, strict=True):
        if bar.changed:
            patch.set_hatch(SPEC_HATCH)
            patch.set_edgecolor("black")
    # The legend's keys drawn as such (taken from the bars, "with the spec" showed the first
    # bar's hatch and "configured by the spec" the default's blue).
    handles = [Patch(color="tab:blue", label="IREE default")]
    handles.append(Patch(color="tab:orange", label="with the spec"))
    if any(b.changed for b in bars):
        handles.append(Patch(facecolor="tab:orange", hatch=SPEC_HATCH, edgecolor="black",
                             label="configured by the spec"))  # fmt: skip
    axes.set_yticks(list(positions), [b.label for b in bars], fontsize=7)
    for tick, bar in zip(axes.get_yticklabels(), bars, strict=True):
        tick.set_fontweight("bold" if bar.changed else "normal")
    axes.set_title("IREE's dispatches, default and tuning spec", fontsize=9)
    axes.legend(handles=handles)


def _custom_panel(axes, shown: list[DispatchRow], total: float) -> None:
    """The build with custom kernels: its dispatches' times, the kernels in green."""
    colors = ["tab:green" if _is_custom(r) else "tab:orange" for r in shown]
    axes.barh(range(len(shown)), [r.tuned_total for r in shown], 0.6, color=colors)
    axes.set_yticks(range(len(shown)), [bar_label(r) for r in shown], fontsize=7)
    axes.set_title(f"with the custom kernels (green): {total:.4g} ms", fontsize=9)


def bar_label(row: DispatchRow) -> str:
    """A dispatch's label in the picture: its root op and IREE's number for it (`#7`), or
    a custom kernel's name; IREE's own name where its ops could not be read."""
    if _is_custom(row):
        return f"custom kernel ({row.entry_point})"
    number = _dispatch_number(row.entry_point)
    if row.root_op:
        return f"{row.root_op} (#{number})" if number else row.root_op
    return root_name(row.entry_point)[:48] or row.entry_point[-48:]


def _dispatch_number(entry_point: str) -> str:
    """IREE's number of a dispatch (`main$async_dispatch_7_...` -> 7), '' without one."""
    _, found, rest = entry_point.partition("dispatch_")
    number = rest.partition("_")[0]
    return number if found and number.isdigit() else ""


def _is_custom(row: DispatchRow) -> bool:
    """A custom kernel's dispatch: IREE names each `hal.dispatch.extern` extern_dispatch_N."""
    return "extern_dispatch" in row.entry_point
