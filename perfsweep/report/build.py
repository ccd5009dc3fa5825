"""Build a sweep's report: which charts fit the sweep (:data:`CHARTS`), report.md and runs.csv.

:func:`make_report` loads and shapes everything and draws the figures in memory (tests look
at its frames and artists); :func:`write_report` puts them on disk; :func:`build_report` does
both and is what the end of every sweep calls (see perfsweep.summary).

A chart is drawn only when the sweep's differing axes make it meaningful (a heatmap needs
both batch and seq_len to vary, factor effects need a complete on/off grid, ...); report.md
lists the charts it left out and why, so a missing picture is never a silent failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from sqlalchemy.engine import Engine

from perfsweep import interrupts, metrics, store
from perfsweep.cli import UserError, first_line
from perfsweep.configs import (
    COMPILE_NOTE,
    OLD_MFU_NOTE,
    SAMPLES_ONLY_WHERE,
    SPEEDUP,
    axis_name,
    axis_text,
    compile_column,
    compiled,
    concurrency_note,
    config_key,
    label_axes,
    mfu_column,
    old_mfu,
    per_config,
    throughputs,
    unranked_samples,
)
from perfsweep.configs import baseline as pick_baseline
from perfsweep.names import (
    BOTTLENECK_RULE,
    DATA_BOUND_WAIT_FRACTION,
    GPU_BOUND_BUSY_FRACTION,
    KERNEL_CATEGORIES,
    LOSS_TOLERANCE,
    NOISY_IQR_FRACTION,
    NOISY_RULE,
    PROFILED_STEP_WARN_RATIO,
    STAGES,
)
from perfsweep.report import charts, fmt, frames
from perfsweep.report.charts import ChartSpec, Panel
from perfsweep.results import load_batch_searches, load_child, load_sweep_runs, search_label

TOP_BARS = 30
"""Most configs a bar chart shows; larger sweeps show the fastest ones (plus the baseline)."""
TOP_TABLE = 50
"""Most rows of the report.md table; runs.csv always has every run."""
RANGE = (
    "the range over its repeats, or for a config with one run its tokens/s scaled by its median step time over its "
    "p90 and over its p10 step time"
)
"""What a config's tokens/s range (whisker) is, in report.md, compare.md and the captions."""
REPEATS = f"; the repeats' tokens/s disagree (IQR/median > {NOISY_IQR_FRACTION:.0%})"
INTERVALS = (
    "Speedup intervals are 95% bootstrap intervals: over repeats when both sides have more than one run, otherwise "
    "over the measured steps, resampled in blocks of n^(1/3) steps so autocorrelated steps do not fake precision; an "
    'interval that contains 1 is reported as "no measurable difference". With fewer than about 5 repeats a side the '
    "interval over repeats cannot reach past the runs' own range, so it understates the spread."
)
"""How the stored intervals are computed (:func:`perfsweep.metrics.speedups`), in README.md's words."""


@dataclass
class Chart:
    """A chart of one report: its figure and the frame it was drawn from, or why it was left out."""

    name: str
    title: str
    caption: str = ""
    figure: Figure | None = None
    frame: pd.DataFrame | None = None
    skipped: str | None = None
    extra_md: str = ""
    file = property(lambda self: f"{self.name}.png")


@dataclass
class Report:
    """What the charts are drawn from and report.md is written from; ``charts`` in their order."""

    engine: Engine
    sweeps: pd.DataFrame
    runs: pd.DataFrame  # one row per run, as in runs.csv
    configs: pd.DataFrame  # one row per config (per_config) with its speedup: the charts and the table
    throughput: list[Any]  # per config, what its tokens/s intervals resample (configs.throughputs)
    baseline: str  # how the baseline config (``is_baseline`` in configs) was chosen
    where: str | None = None
    top: int = TOP_BARS
    searches: pd.DataFrame = field(default_factory=pd.DataFrame)  # batch_searches rows (batch=max)
    charts: dict[str, Chart] = field(default_factory=dict)
    rate: str = "tokens/s"  # the unit of throughput_per_s: samples/s for models that count samples (fmt.RATES)
    db = property(lambda self: store.display_url(self.engine))

    def __post_init__(self) -> None:
        """``shown``: the configs of the bar charts, all or the ``top`` fastest plus the baseline."""
        self.shown, self.shown_note = frames.top_configs(self.configs, self.configs, self.top)


# --------------------------------------------------------------------------------------------
# what the panels write and colour


def _effects(metric: str, name: str, better: int) -> Panel:
    """Factor effects on ``metric`` in % of its mean, green where they help (``better``: the
    helpful sign), faded for interactions, grey where the 95% interval contains 0; the absolute
    effect and its % are written on each bar (the interval is its whisker, and in report.md's table)."""
    pct, ci = f"effect_pct_{metric}", tuple(f"effect_pct_ci_{end}_{metric}" for end in ("lo", "hi"))

    def colors(f: pd.DataFrame) -> list[Any]:
        none = f["effect_verdict"] if ci[0] in f else [""] * len(f)
        helps = zip(f[pct] * better > 0, f["label"], none, strict=True)
        return [
            to_rgba(charts.LIGHT if n else charts.GOOD if h else charts.BAD, 0.5 if " x " in t else 1.0)
            for h, t, n in helps
        ]

    label = f"effect on {name}, of the mean"
    err = (ci,) if metric == "throughput_per_s" else ()
    return Panel(
        (pct,),
        title=name,
        color=colors,
        text=lambda f: f[f"{name} bar label"],
        label=label,
        ref=0,
        err=err,
        err_label="95% interval",
    )


def _speedup_colors(f: pd.DataFrame) -> list[str]:
    """The baseline grey, a config whose interval contains 1 in a neutral colour, one measurably
    slower in red: drawn like a faster one, a 0.36x bar looked like a 4.55x one."""
    verdicts = zip(f["is_baseline"], f["speedup_verdict"], strict=True)
    return [
        charts.BASE
        if b
        else charts.LIGHT
        if v == metrics.NO_DIFFERENCE
        else charts.BAD
        if v == "slower"
        else charts.BAR
        for b, v in verdicts
    ]


def _speedup_text(f: pd.DataFrame) -> list[str]:
    rows = f[["is_baseline", "speedup", "speedup_ci_lo", "speedup_ci_hi", "status"]].itertuples(False)
    return ["base" if b else fmt.speedup(s, lo, hi) if pd.notna(s) else st.upper() for b, s, lo, hi, st in rows]


def stored_rules(runs: pd.DataFrame) -> str:
    """The noisy rules that judged ``runs`` (``runs.noisy_rule``: runs stored before schema 0012 by
    the IQR alone), not today's rule for them; today's where none is stored."""
    stored = runs["noisy_rule"] if "noisy_rule" in runs else pd.Series(dtype=object)
    return " | ".join([r for r in dict.fromkeys(stored) if isinstance(r, str)] or [NOISY_RULE])


def noisy_md(configs: pd.DataFrame) -> str:
    """'2 of 4 ok configs have noisy timings (...)', by :func:`perfsweep.configs.per_config`'s ``noisy``; "" if none."""
    ok = configs[configs["ok"]]
    n = int(ok["noisy"].sum())
    return f"{n} of {len(ok)} ok configs have noisy timings ({stored_rules(ok)}, or repeats that disagree)" if n else ""


# --------------------------------------------------------------------------------------------
# the charts, in the order report.md shows them, and what report.md says about each

MEMORY_TEXT = {  # the memory chart's columns, and what report.md says each is
    "peak_allocated_bytes": "peak allocated (live tensors; on CPU parameters, optimizer state and the peak of one "
    "step's allocations, counted by torch.profiler)",
    "peak_reserved_bytes": "CUDA peak reserved (held by the caching allocator)",
    "rss_growth_bytes": "on CPU the growth of the process's resident set during training, which also holds memory "
    "glibc kept after frees",
    "peak_mem_bytes": "peak bytes of live tensors",
}
MEMORY_COLORS = {"peak allocated (tensors)": charts.BAR, "peak reserved (caching allocator)": charts.LIGHT}
MEMORY_COLORS |= {"process RSS growth during training": charts.LIGHT, "peak memory (tensors)": charts.BAR}
STEP, TOKENS = "step_time_ms_median", ("throughput_per_s",)
STAGE_PANEL = {"kind": "stacked", "colors": charts.STAGE_COLORS, "marker": STEP}

THROUGHPUT = ChartSpec(
    "throughput",
    "Throughput",
    (
        Panel(
            TOKENS,
            title="label: speedup vs the baseline (95% interval); whisker: range over repeats, or for one run the "
            "throughput scaled to its p90..p10 step time",
            color=_speedup_colors,
            text=_speedup_text,
            err=(("throughput_per_s_lo", "throughput_per_s_hi"),),
            baseline=True,
        ),
    ),
    frames.shown,
    legend=(
        ("measurably faster than the baseline, or no interval to tell", charts.BAR),
        ("measurably slower than the baseline", charts.BAD),
        (metrics.NO_DIFFERENCE, charts.LIGHT),
        ("baseline config", charts.BASE),
    ),
    caption="Tokens per second over all measured steps (warmup excluded), the median over a config's repeats; "
    f"whiskers span {RANGE}; the label on each bar is the speedup vs the baseline, with its 95% interval where "
    "one is stored.",
)
GPU = ChartSpec(
    "gpu",
    "GPU busy share and kernel time",
    (
        Panel(TOKENS, title="throughput\n(measured steps)"),
        Panel(
            ("gpu_busy_fraction",),
            title=f"GPU busy share and verdict\ndashed: {GPU_BOUND_BUSY_FRACTION:.0%}, gpu-bound at or above",
            color=lambda f: [charts.BOTTLENECK_COLORS.get(v, charts.BASE) for v in f["bottleneck"]],
            text=lambda f: [f"{b:.0%} {v}" for b, v in f[["gpu_busy_fraction", "bottleneck"]].values],
            label="GPU busy, of the measured step",
            ref=GPU_BOUND_BUSY_FRACTION,
        ),
        Panel(
            tuple(f"kernel_ms_{c}" for c in KERNEL_CATEGORIES),
            "stacked",
            "GPU work by kernel category\ndashed: the measured step",
            colors=charts.KERNEL_COLORS,
            marker=STEP,
        ),
    ),
    frames.gpu,
    side_by_side=True,
    legend=tuple((f"{v}-bound", c) for v, c in charts.BOTTLENECK_COLORS.items()),
    caption="GPU busy share = union of kernel intervals in a profiled step / the measured (unprofiled) median step. "
    "A GPU that is idle most of the step waits for the host to launch work: making its kernels faster then buys "
    f"little tokens/s. Kernel categories follow the name rules of perfsweep.trace. Verdict rule: {BOTTLENECK_RULE}.",
)
MEMORY = ChartSpec(
    "memory",
    "Peak memory",
    (Panel(tuple(MEMORY_TEXT), colors=MEMORY_COLORS, baseline=True),),
    frames.memory,
    lambda f, note, r: {"memory": "; ".join(text for c, text in MEMORY_TEXT.items() if c in f)},
    caption="Peak memory over the measured steps: {memory}. Dashed line: the baseline.",
)
PARETO = ChartSpec(
    "pareto",
    "Throughput vs memory (Pareto front)",
    (Panel(TOKENS, "scatter", "up and to the left is better", x="peak_mem_bytes"),),
    frames.pareto,
    lambda f, note, r: {"front": fmt.listing(f[f["on_front"]].sort_values("peak_mem_bytes")["label"], 4, "; ")},
    caption="Every finished config as tokens/s against peak memory; the orange staircase is the Pareto front (no "
    "other config is both faster and leaner). A config that did not finish is a mark on the bottom edge at the memory "
    "it had reached, its shape the reason; the legend counts those with no memory figure. Either axis is logarithmic where its values "
    "span more than 20x. On the front, leanest first: {front}.",
)
BREAKDOWN = ChartSpec(
    "breakdown",
    "Step-time breakdown by stage",
    (
        Panel(tuple(f"cpu_ms_{s}" for s in STAGES), title="CPU (host) time, incl. kernel launches", **STAGE_PANEL),
        Panel(tuple(f"gpu_ms_{s}" for s in STAGES), title="GPU kernel time, by launching stage", **STAGE_PANEL),
    ),
    frames.breakdown,
    lambda f, note, r: {"panels": _panels_text(f), "overhead": _profiler_overhead(f)},
    side_by_side=True,
    same_scale=True,  # CPU and GPU ms on one scale: 0-120 beside 0-70 under one label misled
    caption="Time per step in each stage (data_to_device, forward, backward, optimizer_step, zero_grad), averaged "
    "over the profiler's active steps; the dashed line is the measured (unprofiled) median step. {panels}{overhead}",
)


def _profiler_overhead(frame: pd.DataFrame) -> str:
    """A warning when the profiled steps' CPU stages add up to well over the measured step: the
    profiler's own cost (recording shapes, FLOPs and memory per op, largest on CPU) is in them, and
    so is whatever else slowed those few steps (other load on the machine): two profiled steps
    cannot tell which."""
    cpu = frame[[c for c in frame.columns if c.startswith("cpu_ms_")]].sum(axis=1)
    ratio = metrics.profiled_step_ratio(cpu, frame["step_time_ms_median"])
    if not ratio > PROFILED_STEP_WARN_RATIO:
        return ""
    return (
        f" The profiled steps took up to {ratio:.1f}x the measured step: the profiler's own cost is in them "
        "(and any other load on the machine during those steps), so compare the stages with each other, and take "
        "step time from the dashed line."
    )


def _panels_text(frame: pd.DataFrame) -> str:
    """What the breakdown's panels are: CPU and GPU; the CPU's alone, whose device time is its CPU
    time; or the CPU's alone on a GPU, where an older perfsweep stored GPU times without backward's
    kernels (frames.breakdown leaves them out, and this caption once said "On CPU" of H100 runs)."""
    if "gpu_ms_forward" in frame:
        return PANELS_TEXT["gpu"]
    return PANELS_TEXT["gpu time not drawn" if frame.attrs.get("gpu_time_not_drawn") else "cpu"]


PANELS_TEXT = {
    "gpu": "Left panel: CPU (host) time; right panel: GPU kernel time attributed to the stage that launched it.",
    "cpu": "On CPU the device time equals the CPU time, so each config has one bar.",
    "gpu time not drawn": "Only the CPU (host) time is drawn: these runs' GPU time per stage was stored by a perfsweep "
    "that counted only the kernels launched from the main thread, which leaves out backward's (launched from "
    "autograd's thread); `perfsweep trace` on a run's trace.json.gz gives it.",
}
SCALING = ChartSpec(
    "scaling",
    "Scaling with batch / seq_len",
    tuple(Panel((y,), "lines", grid_x=True) for y in ("throughput_per_s", "peak_mem_bytes")),
    frames.scaling,
    lambda f, note, r: {"axes": " and ".join(f["axis"].unique())},
    facet="axis",
    facet_title="vs {}",
    caption="Throughput (top) and peak memory (bottom) against {axes}, one line per combination of the other "
    "differing axes, in order of their values; a mark in the shaded band under 0 = a run that did not finish, in "
    "its line's colour, its shape the reason (legend; OOM, FAILED written under them).",
)
HEATMAP = ChartSpec(
    "heatmap",
    "Throughput over batch x seq_len",
    (Panel(TOKENS, "heatmap", x="batch", group="seq_len"),),
    frames.heatmap,
    facet="panel",
    caption="tokens/s for every batch x seq_len cell (median of repeats), its colour from the lowest value shown "
    "(dark) to the highest (yellow), not from 0: read the figures; red cells did not finish and say why (OOM, FAILED, "
    "TIMEOUT).",
)
FACTORS = ChartSpec(
    "factors",
    "Factor effects",
    (_effects("throughput_per_s", "throughput", 1), _effects("peak_mem_bytes", "peak memory", -1)),
    lambda r: frames.factorial_effects(r.configs, r.throughput),
    lambda f, note, r: {
        "computed": f" Computed {note}." if note else "",
        "caution": noisy_md(r.configs) and f" Caution: {noisy_md(r.configs)}, so effects of that size can be noise.",
    },
    side_by_side=True,
    legend=(("helps", charts.GOOD), ("hurts", charts.BAD), (metrics.NO_DIFFERENCE, charts.LIGHT)),
    caption="Design-of-experiments effects from ok runs: main effect = mean with the axis on minus mean with it "
    "off; A x B = two-factor interaction (half the change in the effect of A between B off and B on, coded -1/+1), its bar faded in "
    "the same colours; bars are % of the overall mean, absolute values in brackets. Tokens/s effects carry 95% bootstrap intervals (whiskers; over "
    "repeats when every config has them, else over measured steps in blocks); light blue: the interval contains 0, "
    f'"{metrics.NO_DIFFERENCE}".{{computed}}{{caution}}',
)
LOSS = ChartSpec(
    "loss",
    "Loss curves",
    (
        Panel(
            ("loss",),
            "lines",
            "one seed and data order: configs of the same batch, seq_len and data overlap unless numerics change; "
            "each starts after its own warmup",
            from_zero=False,
            xlabel="optimizer step (warmup steps come first and are not shown)",
        ),
    ),
    frames.loss,
    caption="Training loss (cross-entropy) of every measured step (steps table, phase='measure'), one line per config.",
)
CHARTS = {s.name: s for s in (THROUGHPUT, GPU, MEMORY, PARETO, BREAKDOWN, SCALING, HEATMAP, FACTORS, LOSS)}


# --------------------------------------------------------------------------------------------


def make_report(
    engine: Engine, sweep_ids: list[int], baseline: dict | None = None, where: str | None = None, top: int = TOP_BARS
) -> Report:
    """Load the runs of ``sweep_ids``, shape them, and draw every chart that fits (in memory)."""
    sweeps, runs = load_sweep_runs(engine, sweep_ids, where)
    try:
        configs = per_config(runs)
        steps = load_child(engine, "steps", [i for ids in configs["ok_run_ids"] for i in ids])
        throughput = throughputs(configs, runs, steps)
        configs, how = pick_baseline(configs, baseline, throughput, intervals_for=max(top, TOP_TABLE))
    except ValueError as exc:
        raise UserError(f"--baseline {','.join(f'{k}={v}' for k, v in (baseline or {}).items())}: {exc}") from None
    base = configs[configs["is_baseline"]]
    base_runs = runs["sweep_id"].isin(base["sweep_id"]) & runs["config_hash"].isin(base["config_hash"])
    # runs.csv carries the speedups this report shows (over --baseline), not the stored ones over the default
    shown, key = configs.set_index(config_key(configs)), config_key(runs)
    speedups = {c: key.map(shown[c]) for c in SPEEDUP}
    base_hash = base["config_hash"].iloc[0] if len(base) else None
    runs = runs.assign(
        **speedups, is_baseline=base_runs, baseline_config_hash=speedups["speedup"].notna().map({True: base_hash})
    )
    report = Report(engine, sweeps, runs, configs, throughput, how, where, top)
    report.rate = fmt.RATES[metrics.rate_unit(runs["tokens_per_s"], runs["samples_per_s"])]
    report.searches = load_batch_searches(engine, sweep_ids)
    context = shared_context(configs)
    for spec in (charts.for_rate(spec, report.rate) for spec in CHARTS.values()):
        chart = report.charts[spec.name] = Chart(spec.name, spec.title)
        try:
            chart.frame, note = spec.frame(report)
            title_note = "; ".join(n for n in (context, note) if n)
            chart.figure = charts.draw(spec, chart.frame, fmt.for_rate(title_note, report.rate))
            chart.caption = spec.caption.format(**spec.facts(chart.frame, note, report))
        except frames.Skip as why:
            chart.skipped = str(why)
    if (factors := report.charts["factors"].frame) is not None:
        table = factors.rename(columns={"label": "term"})[["term", "throughput effect", "peak memory effect"]]
        report.charts["factors"].extra_md = fmt.table(table, right=("throughput effect", "peak memory effect")) + "\n\n"
    return report


NBSP = "\u00a0"
"""A space a title is never wrapped at (textwrap breaks at ASCII whitespace alone)."""


def shared_context(configs: pd.DataFrame) -> str:
    """What every config of a report shares, for each chart's title: the model, the device, and
    batch x seq_len where neither varies. A chart pasted into a slide said "Throughput" and no
    more: which model, on what, was in report.md alone."""

    def one(column: str) -> Any:
        values = configs[column].dropna().unique() if column in configs else []
        return values[0] if len(values) == 1 else None

    parts = [str(m) for m in [one("model_name")] if m is not None]
    if (device := one("device_name")) is not None:
        parts.append(f"on {device}")
    if (batch := one("batch")) is not None and (seq := one("seq_len")) is not None:
        parts.append(f"batch {batch:g} x {seq:g}")
    # each part unbroken where a long title wraps: "batch 2 x" ended a line and "1024)" began the next
    return ", ".join(part.replace(" ", NBSP) for part in parts)


SCRATCH_PREFIX = ".perfsweep-writing-"
"""The folder a report is drawn into beside its ``--out`` (:func:`publishing`)."""
ABANDONED_AFTER_S = 60.0
"""A scratch folder this much older than its last change, and locked by no writer, was left by a
report killed mid-draw (SIGKILL, a power cut): the next report in that folder removes it."""


@contextmanager
def publishing(out_dir: Path, stale: Iterable[str] = ()) -> Iterator[Path]:
    """A folder to write a report's files into; when the block ends, they replace those of the same
    name in ``out_dir`` and the ``stale`` files there are removed, with Ctrl-C held for those few
    renames: ``out_dir`` holds the old report or the new one, whole. Written in place, a Ctrl-C
    while a chart was drawn left it missing or cut short (124 bytes of a PNG), under the old
    report.md that showed it. Other files in ``out_dir`` (``--out slides/``) stay as they are.

    A folder in ``out_dir`` with a file's name (``runs.csv/``) is an error before anything is
    replaced: renamed around it, that one file stayed old beside a new report.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out_dir))  # same filesystem: renames, not copies
    lock = _lock(tmp)
    try:
        yield tmp
        new = sorted(tmp.iterdir())
        blocked = [out_dir / p.name for p in new if _is_folder(out_dir / p.name)]
        if blocked:
            raise UserError(
                f"{blocked[0]} is a folder, where the report writes a file of that name; move it away or "
                "give another --out (the report there is left as it was)"
            )
        with interrupts.held("perfsweep: saving the report's files; stopping after that"):
            _swap(out_dir, new, [n for n in stale if not _is_folder(out_dir / n)], tmp / ".replaced")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if lock is not None:
            os.close(lock)


def _swap(out_dir: Path, new: list[Path], stale: list[str], aside: Path) -> None:
    """The old files (those ``new`` replaces, and ``stale``) moved ``aside``, then ``new`` moved in;
    where one cannot be moved (an immutable file, another user's in a sticky folder), what was
    done is undone and :class:`UserError` names it: renamed one by one, such a file had left the
    new report's first files beside the old report's others."""
    aside.mkdir()
    old = [n for n in [*(p.name for p in new), *stale] if os.path.lexists(out_dir / n)]
    moved: list[str] = []
    placed: list[str] = []
    name = ""
    try:
        for name in old:
            os.replace(out_dir / name, aside / name)
            moved.append(name)
        for path in new:
            name = path.name
            os.replace(path, out_dir / name)
            placed.append(name)
    except OSError as exc:
        for done in placed:
            with contextlib.suppress(OSError):
                os.replace(out_dir / done, aside.parent / done)
        for done in moved:
            with contextlib.suppress(OSError):
                os.replace(aside / done, out_dir / done)
        raise UserError(
            f"cannot replace {out_dir / name} ({exc.strerror or exc}); the report there is left as it was"
        ) from None


def _is_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()  # a link is replaced by the rename, whatever it points at


def _lock(folder: Path) -> int | None:
    """A descriptor holding an exclusive flock on ``folder`` while a report is drawn there; it
    goes with the process however that ends. None where the filesystem has no such lock (some
    NFS mounts): such a folder is then never taken for abandoned."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_abandoned(out_dir: Path) -> None:
    """Remove the scratch folders of reports killed while drawing into ``out_dir``: those no live
    writer holds locked (:func:`_lock`), unchanged for :data:`ABANDONED_AFTER_S` (a folder made
    this instant is not locked yet). They were left for good, a PNG each."""
    for folder in out_dir.glob(SCRATCH_PREFIX + "*"):
        try:
            if not _is_folder(folder) or time.time() - folder.stat().st_mtime < ABANDONED_AFTER_S:
                continue
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken: its writer is gone
        except OSError:
            continue  # a report still drawing there, or a lock this filesystem cannot give
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


def write_report(report: Report, out_dir: Path) -> Path:
    """PNGs, report.md and runs.csv into ``out_dir`` (:func:`publishing`); the PNGs of charts
    skipped now are removed."""
    skipped = [chart.file for chart in report.charts.values() if chart.figure is None]
    with publishing(out_dir, skipped) as new:
        _write_files(report, new)
    return out_dir


TYPED = ("overrides", "error")
"""runs.csv columns that hold what the user typed (a db.url with its password): shown as messages show it."""


def _write_files(report: Report, out_dir: Path) -> None:
    for chart in report.charts.values():
        if chart.figure is not None:
            charts.save(chart.figure, out_dir / chart.file)
    front = ["id", "sweep_id", "label", "status", "tokens_per_s", "samples_per_s", "throughput_per_s_lo"]
    front += [
        "throughput_per_s_hi",
        "speedup",
        "is_baseline",
        "peak_mem_bytes",
    ]  # runs.csv: what people look for first, then every runs column
    columns = front + [c for c in report.runs if c not in front and c != "ok"]
    hidden = {
        c: report.runs[c].map(lambda v: store.hide_password(v) if isinstance(v, str) else v)
        for c in TYPED
        if c in columns
    }
    report.runs[columns].assign(**hidden).to_csv(out_dir / "runs.csv", index=False)
    (out_dir / "report.md").write_text(report_md(report))


def default_out_dir(
    sweeps: pd.DataFrame, sweep_id: int | None, sub: str, elsewhere: str, *, variant: object = None
) -> Path:
    """``<sweep_dir>/<sub>`` of ``sweep_id`` when its folder exists, else ``./<elsewhere>``.

    ``variant`` is what makes this output differ from the plain one (a ``--where`` filter, a
    ``--baseline``): when given, both names get a short hash of it, so a filtered report never
    overwrites the full one every sweep writes at its end, and two different filters keep two
    folders (the filter itself is written in report.md).
    """
    if variant is not None:
        tag = hashlib.sha1(repr(variant).encode()).hexdigest()[:8]
        sub, elsewhere = f"{sub}_{tag}", f"{elsewhere}_{tag}"
    folder = sweeps.loc[sweeps["id"] == sweep_id, "sweep_dir"]
    if len(folder) and isinstance(folder.iloc[0], str) and Path(folder.iloc[0]).is_dir():
        return Path(folder.iloc[0]) / sub
    return Path.cwd() / elsewhere


def build_report(engine: Engine, sweep_ids: list[int], out_dir: Path | None = None, **options: Any) -> Path:
    """Write the report of ``sweep_ids`` and return its folder (``report.md`` is inside).

    ``options`` are :func:`make_report`'s: ``baseline`` selects the reference config by axis values,
    e.g. ``{"amp": False}`` (default: amp, ckpt and compile off); ``where`` is a filter over runs
    columns (see perfsweep.where); ``top`` caps the configs per bar chart.
    """
    ids = list(sweep_ids)
    report = make_report(engine, ids, **options)
    # what makes this report other than the one a sweep writes at its end: a --top one replaced that
    # full report with its top few, though the README promised a filtered report a folder of its own
    variant = {k: options[k] for k in ("where", "baseline") if options.get(k) is not None}
    if options.get("top", TOP_BARS) != TOP_BARS:
        variant["top"] = options["top"]
    default = default_out_dir(
        report.sweeps,
        ids[0] if len(ids) == 1 else None,
        "report",
        f"report_{'_'.join(map(str, ids))}",
        variant=variant or None,
    )
    return write_report(report, Path(out_dir) if out_dir is not None else default)


# --------------------------------------------------------------------------------------------
# report.md


def noise_text(step_time_ms_iqr: float, step_time_ms_median: float, step_time_ms_mean: float, rule: Any) -> str:
    """What made one run noisy, in figures: its IQR, or a mean that a few slow steps moved (the
    parts of :func:`perfsweep.metrics.noisy_steps` that fired; both when both did). A flag neither
    part explains was set by another rule (``runs.noisy_rule``, e.g. an imported row's), which is named."""
    iqr = metrics.iqr_fraction(step_time_ms_iqr, step_time_ms_median)
    tail = metrics.tail_fraction(step_time_ms_mean, step_time_ms_median)
    spread, stalls = metrics.noisy_parts(step_time_ms_iqr, step_time_ms_median, step_time_ms_mean)
    parts = [f"IQR {step_time_ms_iqr:,.1f} ms, {iqr:.0%} of the median {step_time_ms_median:,.1f} ms"] * spread
    if stalls:
        parts.append(f"mean {step_time_ms_mean:,.1f} ms, {tail:.0%} off the median: a few steps far from the rest")
    return "; ".join(parts) or f"by its stored rule, {rule if isinstance(rule, str) else 'unknown'}"


def _note(r: Any) -> str:
    """Why a config did not finish, why its timings are noisy (a run's stored flag, or repeats
    that disagree), and why it has no profile (runs.profile_error)."""
    if r.status != "ok":
        return first_line(r.error, 70)
    noisy = ""
    if r.noisy and r.runs == 1:
        noisy = "noisy: " + noise_text(r.step_time_ms_iqr, r.step_time_ms_median, r.step_time_ms_mean, r.noisy_rule)
    elif r.noisy:
        rule = r.noisy_rule if isinstance(r.noisy_rule, str) else NOISY_RULE
        steps = f"noisy ({rule}) in {r.noisy_runs} of {r.ok_runs} runs" if r.noisy_runs else ""
        noisy = (steps + (REPEATS if r.repeats_disagree else "")).removeprefix("; ")
    unprofiled = "not profiled: its profiled window ran out of memory" if isinstance(r.profile_error, str) else ""
    return "; ".join(t for t in (noisy, unprofiled) if t)


def results_table(configs: pd.DataFrame, limit: int = TOP_TABLE) -> tuple[str, str]:
    """The report.md table, one row per config (differing axes, runs when there are repeats, tokens/s with its
    range, speedup with its interval, memory, status) and a note."""
    rows, note = configs, ""
    if len(configs) > limit:
        rows = configs.sort_values("throughput_per_s", ascending=False, na_position="last").head(limit)
        note = f"Top {limit} of {len(configs):,} configs by tokens/s; every run is in runs.csv."
    axes = label_axes(configs) or ["batch", "seq_len"]
    out = pd.DataFrame({axis_name(a): [axis_text(a, v).split("=")[1] for v in rows[a]] for a in axes})
    left = [*out.columns, "status", "note"]
    if (configs["runs"] > 1).any():
        out["runs"] = [f"{n}" if k in (0, n) else f"{k} ok of {n}" for n, k in rows[["runs", "ok_runs"]].values]
    out["status"] = rows["status"].to_numpy()
    out["tokens/s"] = [fmt.num(v) for v in rows["throughput_per_s"]]
    out["range"] = [fmt.span(lo, hi) for lo, hi in rows[["throughput_per_s_lo", "throughput_per_s_hi"]].values]
    speed = rows[["is_baseline", "speedup", "speedup_ci_lo", "speedup_ci_hi", "speedup_verdict"]].itertuples(False)
    out["speedup"] = [
        "baseline" if b else fmt.speedup(s, lo, hi) + (f" {v}" if isinstance(v, str) else "")
        for b, s, lo, hi, v in speed
    ]
    spread = metrics.iqr_fraction(rows["step_time_ms_iqr"], rows["step_time_ms_median"])
    out["step ms (IQR, CV)"] = [
        fmt.num(m, "{:,.1f}") + ("" if fmt.missing(q) else f" ({q:.0%}, {cv:.0%})")
        for m, q, cv in zip(rows["step_time_ms_median"], spread, rows["step_time_cv"], strict=True)
    ]
    div, unit = fmt.scale("bytes", rows["peak_mem_bytes"])
    out[f"peak mem {unit}"] = [fmt.num(v / div, "{:,.1f}") for v in rows["peak_mem_bytes"]]
    if compiled(rows).any():
        out["compile s (payback)"] = compile_column(rows)
        note = f"{note} {COMPILE_NOTE}.".strip()
    if rows["mfu"].notna().any():
        out["MFU"] = mfu_column(rows)
        if old_mfu(rows).any():
            note = f"{note} {OLD_MFU_NOTE}.".strip()
    if rows["gpu_busy_fraction"].notna().any():
        out["GPU busy"] = [fmt.num(v, "{:.0%}") for v in rows["gpu_busy_fraction"]]
        out["bottleneck"] = rows["bottleneck"].fillna("-").to_numpy()
    if rows["nproc"].notna().any():  # data-parallel jobs: what one rank did, and what the allreduce cost it
        if "nproc" not in out.columns:  # one rank count for the whole table: say it here
            out["ranks"] = ["1, no DDP" if fmt.missing(v) else f"{v:.0f}" for v in rows["nproc"]]
        per_rank = rows["tokens_per_s_per_rank"].fillna(rows["samples_per_s_per_rank"])  # the sweep's unit
        out["tokens/s per rank"] = [fmt.num(v) for v in per_rank]
        out["allreduce ms/step"] = [fmt.num(v, "{:,.1f}") for v in rows["allreduce_ms_per_step"]]
    out["note"] = [_note(r) for r in rows.itertuples(index=False)]
    return fmt.table(out, right=[c for c in out.columns if c not in left]), note


LEDGER_PARTS = (
    ("params", "predicted_params_bytes"),
    ("grads", "predicted_grads_bytes"),
    ("optimizer", "predicted_optimizer_bytes"),
    ("activations", "predicted_activations_bytes"),
    ("logits", "predicted_logits_bytes"),
)


def ledger_md(configs: pd.DataFrame) -> str:
    """The memory ledger per config: predicted peak (perfsweep.ledger) by category next to the
    measured peak and the error; "" where nothing was predicted (models without a formula)."""
    rows = configs[configs["predicted_peak_bytes"].notna()]
    if rows.empty:
        return ""
    out = pd.DataFrame({"config": rows["label"].to_numpy(), "status": rows["status"].to_numpy()})
    out["measured"] = [fmt.mem(v) for v in rows["peak_allocated_bytes"]]
    out["predicted"] = [fmt.mem(v) for v in rows["predicted_peak_bytes"]]
    out["error"] = [fmt.num(v, "{:+.1%}") for v in rows["predicted_peak_error"]]
    out["peak at"] = rows["predicted_peak_phase"].fillna("-").str.replace("_", " ").to_numpy()
    for name, column in LEDGER_PARTS:
        out[name] = [fmt.mem(v) for v in rows[column]]
    errors = rows["predicted_peak_error"].abs().dropna()
    worst = f" The largest error here is {errors.max():.1%}." if not errors.empty else ""
    return (
        f"Predicted before each job trained, from the model's shape and the settings (`perfsweep/ledger.py` has the "
        f"formulas and their sources); measured is `peak_allocated_bytes`. The parts add up to the predicted peak at "
        f"the moment it happens: at the start of backward no gradient exists yet, at the end of backward the "
        f"loss's buffers are gone.{worst}\n\n"
        + fmt.table(out, right=[c for c in out.columns if c not in ("config", "status", "peak at")])
    )


def numerics_md(configs: pd.DataFrame) -> str:
    """The numerics audit per config (perfsweep.audit): its FP32-eager twin, the largest relative
    loss difference, the step it left the tolerance, fp16's GradScaler; "" where nothing was audited."""
    rows = configs[configs["numerics_warning"].notna() | configs["numerics_runs"].gt(0)]
    if rows.empty:
        return ""
    labels = dict(zip(configs["id"], configs["label"], strict=True))
    for ids, label in zip(configs["ok_run_ids"], configs["label"], strict=True):  # a twin may be any repeat
        labels.update(dict.fromkeys(ids, label))
    out = pd.DataFrame({"config": rows["label"].to_numpy()})
    out["twin"] = [labels.get(t, f"run {int(t)}") if pd.notna(t) else "-" for t in rows["numerics_twin_run_id"]]
    out["max loss diff"] = [fmt.num(v, "{:.2%}") for v in rows["loss_max_rel_diff"]]
    out["tolerance"] = [
        f"{LOSS_TOLERANCE[d if a else 'fp32']:.1%}" for a, d in zip(rows["amp"], rows["amp_dtype"], strict=True)
    ]
    out["diverged at step"] = [fmt.num(v) for v in rows["numerics_diverged_step"]]
    if rows["nonfinite_loss_steps"].fillna(0).gt(0).any():
        out["NaN/inf loss steps"] = [fmt.num(v) for v in rows["nonfinite_loss_steps"]]
    if rows["grad_scaler_final_scale"].notna().any():
        out["GradScaler scale"] = [fmt.num(v, "{:g}") for v in rows["grad_scaler_final_scale"]]
        out["skipped steps"] = [fmt.num(v) for v in rows["grad_scaler_skipped_steps"]]
    out["verdict"] = [
        "**numerics warning**" + (f" in {n} of {k} runs" if k > 1 else "") if n else "ok" if w == 0 else "-"
        for w, n, k in zip(rows["numerics_warning"], rows["numerics_runs"], rows["ok_runs"], strict=True)
    ]
    return (
        "Each run with AMP, checkpointing or compile on, against the sweep's run with the same settings and seed and all "
        "three off (FP32 eager), step by step over the steps both ran (`perfsweep/audit.py`): a step is out when its "
        "loss differs from the twin's by more than the tolerance of the run's compute dtype. Rows are the run "
        "nearest each config's median; the verdict counts every repeat. A run whose loss was NaN or infinite at a "
        "measured step is flagged whatever its settings: the training blew up.\n\n"
        + fmt.table(out, right=["max loss diff", "tolerance", "diverged at step", "NaN/inf loss steps"])
    )


def searches_md(searches: pd.DataFrame) -> str:
    """batch=max: per grid point the largest batch that trained, its throughput and memory, the
    first batch that ran out of memory and how many jobs it took; "" for a sweep without one."""
    if searches.empty:
        return ""
    out = pd.DataFrame({"config": [search_label(o) for o in searches["overrides"]]})
    out["seq_len"] = [fmt.num(v) for v in searches["seq_len"]]
    out["max batch"] = [
        "none fits" if s == "none_fit" else fmt.num(b) + (" (cap)" if c == 1 else "")
        for s, b, c in searches[["status", "max_batch", "capped"]].values
    ]
    out["tokens/s at max"] = [fmt.num(v) for v in searches["tokens_per_s"].fillna(searches["samples_per_s"])]
    out["peak mem at max"] = [fmt.mem(v) for v in searches["peak_allocated_bytes"]]
    out["first oom"] = [fmt.num(v) for v in searches["first_oom_batch"]]
    out["ledger predicted"] = [fmt.num(v) for v in searches["predicted_max_batch"]]
    out["calibrated"] = [fmt.num(v) for v in searches["calibrated_max_batch"]]
    out["jobs"] = [fmt.num(v) for v in searches["n_tried"]]
    out["status"] = [
        s if not isinstance(e, str) else f"{s}: {first_line(e, 60)}" for s, e in searches[["status", "error"]].values
    ]
    how = (
        "; where calibrated has a batch, a measured try's memory use calibrated the ledger, and that batch and its "
        "neighbours were tried next"
        if searches["calibrated_max_batch"].notna().any()
        else ""
    )
    return (
        "`batch=max` (`perfsweep/search.py`): real jobs tried batches from the memory ledger's prediction for the "
        "memory free to a job, growing or shrinking it, then bisecting between the largest batch that trained and the "
        f"smallest that ran out of memory{how}; every try is a row of `runs` (`batch_search_id`), the outcome a row of "
        "`batch_searches`.\n\n" + fmt.table(out, right=[c for c in out.columns if c not in ("config", "status")])
    )


def intervals_md(report: Report) -> str:
    """How the speedups' intervals were computed, and which speedups have none."""
    has = report.configs.loc[report.configs["ok"] & ~report.configs["is_baseline"], "speedup_ci_lo"].notna()
    if has.empty or not has.any():
        return "" if has.empty else "No speedup has an interval (no stored steps or repeats to resample)."
    return INTERVALS + ("" if has.all() else f" {(~has).sum()} without stored steps or repeats have none.")


def _spread(r: Any) -> str:
    """A config's tokens/s range in brackets (:data:`RANGE`), for the headline: none, where it has none."""
    text = fmt.span(r["throughput_per_s_lo"], r["throughput_per_s_hi"])
    return "" if text == "-" else f" (range {text})"


def headline_md(report: Report) -> list[str]:
    """The report's first lines: the baseline, the fastest and the leanest config, each tokens/s with
    its range, and what a reader must know before trusting them (failures, numerics, noise)."""
    configs, lines = report.configs, []
    ok, bad, base = configs[configs["ok"]], configs[configs["status"] != "ok"], configs[configs["is_baseline"]]
    flag = " (numerics warning: see Numerics below)"  # a training that blew up is no baseline and no win
    for _, b in base.iterrows():
        tokens, memory = f"{fmt.num(b['throughput_per_s'])} tokens/s{_spread(b)}", fmt.mem(b["peak_mem_bytes"])
        lines.append(
            f"- **Baseline:** {b['label']} ({report.baseline}): {tokens}, peak memory {memory}"
            + (flag if b["numerics_runs"] else "")
            + "."
        )
    if len(ok) > 1:
        fast = ok.loc[ok["throughput_per_s"].idxmax()]
        speed = fmt.speedup(fast["speedup"], fast["speedup_ci_lo"], fast["speedup_ci_hi"])
        lines.append(
            f"- **Fastest:** {fast['label']}: {fast['throughput_per_s']:,.0f} tokens/s{_spread(fast)}, {speed} vs the "
            "baseline" + (flag if fast["numerics_runs"] else "") + "."
        )
        if ok["peak_mem_bytes"].notna().any():
            lean = ok.loc[ok["peak_mem_bytes"].idxmin()]
            ratio = metrics.speedup(lean["peak_mem_bytes"], base["peak_mem_bytes"].sum())
            ratio_text = f" ({ratio:.2f}x the baseline)" if pd.notna(ratio) else ""
            lines.append(f"- **Least memory:** {lean['label']}: {fmt.mem(lean['peak_mem_bytes'])}{ratio_text}.")
    if not (samples_only := configs[unranked_samples(configs)]).empty:
        lines.append(
            f"- **Not ranked:** {fmt.listing(samples_only['label'], 4)} count samples, not tokens "
            "(`model.unit=samples`), so their throughput shows as - beside tokens/s; report them on their own "
            f'(`--where "{SAMPLES_ONLY_WHERE}"`).'
        )
    if not bad.empty:
        counts = ", ".join(f"{c} {s}" for s, c in bad["status"].value_counts().items())
        lines.append(f"- **Did not finish:** {counts}: {fmt.listing(bad['label'], 6)}.")
    if (flagged := ok[ok["numerics_runs"].gt(0)]).shape[0]:
        lines.append(
            f"- **Numerics warning:** {fmt.listing(flagged['label'], 4)}: the loss was NaN or infinite, left its "
            "FP32-eager twin's, or fp16's GradScaler skipped measured steps; see Numerics below before trusting "
            "their speed."
        )
    if (bound := ok[ok["data_bound"].eq(1)]).shape[0]:
        lines.append(
            f"- **Data-bound:** {fmt.listing(bound['label'], 4)} spent more than {DATA_BOUND_WAIT_FRACTION:.0%} of "
            "the measured steps waiting for the next batch: the loader sets their pace (raise `workers`)."
        )
    for sweep in report.sweeps.itertuples():
        if note := concurrency_note(sweep.parallel, sweep.hydra_launcher):
            lines.append(f"- **Jobs side by side** (sweep {sweep.id}): {note}")
    if noisy := noisy_md(configs):
        lines.append(
            f"- **Noisy timings:** {noisy} ({fmt.listing(ok.loc[ok['noisy'], 'label'], 4)}); compare them "
            "with care, or rerun with more `steps.measure` on a quieter machine."
        )
    return lines


def report_md(report: Report) -> str:
    """report.md, every text in the sweep's throughput unit (its pieces say tokens/s; fmt.for_rate)."""
    return fmt.for_rate(_report_md(report), report.rate)


def _report_md(report: Report) -> str:
    runs, sweeps, charts_ = report.runs, report.sweeps, report.charts.values()
    sources = [
        (s.id, what, v) for s in sweeps.itertuples() for what, v in (("command", s.command), ("folder", s.sweep_dir))
    ]
    lines = [f"- Sweep {i} {what}: `{store.hide_password(v)}`\n" for i, what, v in sources if isinstance(v, str)]
    lines += [f"- Filter (`--where`): `{report.where}`\n"] if report.where else []
    table = "\n\n".join(filter(None, results_table(report.configs)))
    drawn = [f"### {c.title}\n\n{c.caption}\n\n![{c.title}]({c.file})\n\n{c.extra_md}" for c in charts_ if c.figure]
    skipped = "".join(f"- `{c.file}` ({c.title}): {c.skipped}.\n" for c in charts_ if c.skipped)
    skipped = f"### Charts not drawn for this sweep\n\n{skipped}\n" if skipped else ""
    counts = ", ".join(f"{c} {s}" for s, c in runs["status"].value_counts().items())
    start, end = runs["started_at"].min(), runs["finished_at"].max()
    when = "" if pd.isna(start) else f", run {start:%Y-%m-%d %H:%M}" + (f" - {end:%H:%M}" if pd.notna(end) else "")
    names = f"{', '.join(map(str, sweeps['id']))} ({', '.join(dict.fromkeys(sweeps['name'].astype(str)))})"
    headline = "\n".join(headline_md(report))
    sections = "".join(
        f"\n## {title}\n\n{body}\n"
        for title, body in (
            ("Largest batch that fits", searches_md(report.searches)),
            ("Memory: predicted and measured", ledger_md(report.configs)),
            ("Numerics: loss against the FP32-eager twin", numerics_md(report.configs)),
        )
        if body
    )
    return f"""# perfsweep report: sweep {names}

{len(runs):,} run{"s" if len(runs) != 1 else ""} ({counts}){when} UTC; generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} from `{report.db}`.

{"".join(lines)}
## Headline

{headline}

## Results

One row per config: tokens/s is over all measured steps, the median over the config's ok runs (runs), and the \
other figures are those of the run nearest that median; range is {RANGE}; step ms is that run's median measured step \
with its IQR and coefficient of variation as shares of it; speedup is vs the baseline; peak mem is the peak of live \
tensors.{" " + intervals if (intervals := intervals_md(report)) else ""}

{table}
{sections}
## Charts

{"".join(drawn)}{skipped}## Environment

{fmt.environment({"value": runs})}

## Data

- `runs.csv`: every run with every `runs` column (but `config_json`) plus `label`, `is_baseline`, \
`throughput_per_s_lo`/`_hi` (the range of tokens_per_s, or of samples_per_s for models that count samples); its \
`speedup` columns are this report's, over its baseline ({report.baseline}; `baseline_config_hash`), as the table \
shows them; the database's are over each sweep's own default baseline.
- Database: `{report.db}`, e.g. `SELECT amp, ckpt, {report.rate.replace("/", "_per_")}, speedup, speedup_verdict FROM runs WHERE sweep_id = \
{sweeps["id"].iloc[0]}`; per-step times in `steps`, stage times in `stages`, top operators in `ops`, traces in \
`artifacts`.
"""
