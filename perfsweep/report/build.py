"""Build a sweep's report: which charts fit the sweep (:data:`CHARTS`), report.md and runs.csv.

:func:`make_report` loads and shapes everything and draws the figures in memory (tests look
at its frames and artists); :func:`write_report` puts them on disk; :func:`build_report` does
both and is what the end of every sweep calls (see perfsweep.summary).

A chart is drawn only when the sweep's differing axes make it meaningful (a heatmap needs
both batch and seq_len to vary, factor effects need a complete on/off grid, ...); report.md
lists the charts it left out and why, so a missing picture is never a silent failure.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from sqlalchemy.engine import Engine

from perfsweep import metrics
from perfsweep.cli import UserError
from perfsweep.names import BOTTLENECK_RULE, GPU_BOUND_BUSY_FRACTION, KERNEL_CATEGORIES, NOISY_STEP_TIME_RATIO, STAGES
from perfsweep.report import charts, fmt, frames
from perfsweep.report.charts import ChartSpec, Panel
from perfsweep.report.load import load_runs, load_sweeps

log = logging.getLogger(__name__)

TOP_BARS = 30
"""Most configs a bar chart shows; larger sweeps show the fastest ones (plus the baseline)."""
TOP_TABLE = 50
"""Most rows of the report.md table; runs.csv always has every run."""


@dataclass
class Chart:
    """A chart of one report: its figure and the frame it was drawn from, or why it was left out."""

    name: str
    title: str
    caption: str = ""
    figure: Figure | None = None
    frame: pd.DataFrame | None = None
    skipped: str | None = None
    seconds: float = 0.0
    extra_md: str = ""
    file = property(lambda self: f"{self.name}.png")


@dataclass
class Report:
    """What the charts are drawn from and report.md is written from; ``charts`` in their order."""

    engine: Engine
    sweeps: pd.DataFrame
    runs: pd.DataFrame
    baseline: frames.Baseline
    shown: pd.DataFrame  # the configs of the bar charts: all, or the ``top`` fastest plus the baseline
    shown_note: str
    mode: str  # frames.memory_mode
    where: str | None
    charts: dict[str, Chart] = field(default_factory=dict)
    load_seconds: float = 0.0
    db = property(lambda self: self.engine.url.render_as_string(hide_password=True))


# --------------------------------------------------------------------------------------------
# what the panels write and colour, and what report.md says about each chart


def _effects(metric: str, name: str, better: int) -> Panel:
    """Factor effects on ``metric`` in % of its mean, green where they help (``better``: the
    helpful sign) and faded for interactions; the absolute effect is written on each bar."""
    pct = f"effect_pct_{metric}"

    def colors(f: pd.DataFrame) -> list[Any]:
        helps = zip(f[pct] * better > 0, f["label"], strict=True)
        return [to_rgba(charts.GOOD if h else charts.BAD, 0.5 if " x " in term else 1.0) for h, term in helps]

    return Panel(
        (pct,),
        title=name,
        color=colors,
        text=lambda f: f[f"{name} effect"],
        label=f"effect on {name}, of the mean",
        ref=0,
    )


def _base_colors(f: pd.DataFrame) -> list[str]:
    return [charts.BASE if b else charts.BAR for b in f["is_baseline"]]


def _verdict_colors(f: pd.DataFrame) -> list[str]:
    return [charts.BOTTLENECK_COLORS.get(v, charts.BASE) for v in f["bottleneck"]]


def _speedup_text(f: pd.DataFrame) -> list[str]:
    rows = zip(f["is_baseline"], f["speedup"], f["tokens_per_s"], f["status"], strict=True)
    return [
        "base" if b else f"{s:.2f}x" if pd.notna(s) else fmt.si(t) if pd.notna(t) else st.upper()
        for b, s, t, st in rows
    ]


def _busy_text(f: pd.DataFrame) -> list[str]:
    busy = zip(f["gpu_busy_fraction"], f["bottleneck"], strict=True)
    return [f"{b:.0%} {v}" if pd.notna(b) else "no GPU profile" for b, v in busy]


def _caution(r: Report) -> str:
    ok = r.runs[r.runs["ok"]]
    if not (noisy := int(ok["noisy_p90_p10"].sum())):
        return ""
    return (
        f" Caution: {noisy} of {len(ok)} ok configs have noisy timings (p90/p10 step time > "
        f"{NOISY_STEP_TIME_RATIO}), so effects of that size can be noise."
    )


# --------------------------------------------------------------------------------------------
# the charts, in the order report.md shows them, and what report.md says about each

CAPTIONS = {
    "throughput": "Tokens per second over all measured steps (warmup excluded); whiskers span the throughput at the "
    "p90 and p10 step time; the label on each bar is the speedup vs the baseline.",
    "gpu": "GPU busy share = union of kernel intervals in a profiled step / the measured (unprofiled) median step. A "
    "GPU that is idle most of the step waits for the host to launch work: making its kernels faster then buys little "
    f"tokens/s. Kernel categories follow the name rules of perfsweep.trace. Verdict rule: {BOTTLENECK_RULE}.",
    "memory": "Peak memory over the measured steps: {memory}. Dashed line: the baseline.",
    "pareto": "Every finished config as tokens/s against peak memory; the orange staircase is the Pareto front (no "
    "other config is both faster and leaner). Configs that did not finish are marked x on the bottom edge. On the "
    "front, leanest first: {front}.",
    "breakdown": "Time per step in each stage (data_to_device, forward, backward, optimizer_step, zero_grad), averaged "
    "over the profiler's active steps; the dashed line is the measured (unprofiled) median step. {panels}",
    "scaling": "Throughput (top) and peak memory (bottom) against {axes}, one line per combination of the other "
    "differing axes; x at the bottom edge = run did not finish (e.g. OOM).",
    "heatmap": "tokens/s for every batch x seq_len cell (median of repeats); red cells did not finish and say why "
    "(OOM, FAILED, TIMEOUT).",
    "factors": "Design-of-experiments effects from ok runs: main effect = mean with the axis on minus mean with it "
    "off; A x B = two-factor interaction (how much the effect of A changes with B, coded -1/+1); bars are % of the "
    "overall mean, absolute values in brackets.{computed}{caution}",
    "loss": "Training loss of every measured step (steps table, phase='measure'), one line per config.",
}
"""Caption templates, filled by each chart's ``facts``."""
MEMORY_TEXT = {
    "cuda": "CUDA peak allocated (live tensors) and peak reserved (held by the caching allocator)",
    "cpu": "CPU peak allocated (live tensors: parameters, optimizer state and the peak of one step's allocations, "
    "counted by torch.profiler) beside the growth of the process's resident set during training, which also holds "
    "memory glibc kept after frees",
    "mixed": "peak bytes of live tensors on each run's device",
}
PANELS_TEXT = {
    True: "Left panel: CPU (host) time; right panel: GPU kernel time attributed to the stage.",
    False: "On CPU the device time equals the CPU time, so each config has one bar.",
}
STEP, TOKENS, RANGE = "step_time_ms_median", ("tokens_per_s",), (("tokens_per_s_lo", "tokens_per_s_hi"),)
MEMORY_COLUMNS = ("peak_allocated_bytes", "peak_reserved_bytes", "rss_growth_bytes", "peak_mem_bytes")
MEMORY_NAMES = ("peak allocated (tensors)", "peak reserved (caching allocator)", "process RSS growth during training")
MEMORY_NAMES += ("peak allocated (tensors, on each run's device)",)
MEMORY_COLORS = (charts.BAR, charts.LIGHT, charts.LIGHT, charts.BAR)
STAGE_PANEL = {"kind": "stacked", "names": STAGES, "colors": tuple(charts.STAGE_COLORS.values()), "marker": STEP}

THROUGHPUT = ChartSpec(
    "throughput",
    "Throughput",
    (
        Panel(
            TOKENS,
            title="label: speedup vs the baseline; whisker: throughput at the p90 and p10 step time",
            color=_base_colors,
            text=_speedup_text,
            err=RANGE,
            baseline=True,
        ),
    ),
    lambda r: (r.shown, r.shown_note),
    needs=(frames.several_configs, lambda r: None if r.runs["ok"].any() else "no run finished ok"),
    legend=(("tokens/s over all measured steps", charts.BAR), ("baseline config", charts.BASE)),
)
GPU = ChartSpec(
    "gpu",
    "GPU busy share and kernel time",
    (
        Panel(TOKENS, title="throughput\n(measured steps)"),
        Panel(
            ("gpu_busy_fraction",),
            title=f"GPU busy share and verdict\ndashed: {GPU_BOUND_BUSY_FRACTION:.0%}, gpu-bound at or above",
            color=_verdict_colors,
            text=_busy_text,
            label="GPU busy, of the measured step",
            ref=GPU_BOUND_BUSY_FRACTION,
        ),
        Panel(
            tuple(f"kernel_ms_{c}" for c in KERNEL_CATEGORIES),
            "stacked",
            "GPU work by kernel category\ndashed: the measured step",
            names=KERNEL_CATEGORIES,
            colors=tuple(charts.KERNEL_COLORS.values()),
            marker=STEP,
        ),
    ),
    frames.gpu,
    needs=(frames.several_configs,),
    side_by_side=True,
    horizontal=True,
    legend=tuple((f"{v}-bound", c) for v, c in charts.BOTTLENECK_COLORS.items()),
)
MEMORY = ChartSpec(
    "memory",
    "Peak memory",
    (Panel(MEMORY_COLUMNS, title="over the measured steps", names=MEMORY_NAMES, colors=MEMORY_COLORS, baseline=True),),
    frames.memory,
    lambda f, note, r: {"memory": MEMORY_TEXT[r.mode]},
    needs=(frames.several_configs,),
)
PARETO = ChartSpec(
    "pareto",
    "Throughput vs memory (Pareto front)",
    (
        Panel(
            TOKENS,
            "scatter",
            "front (orange): no other config is both faster and leaner; up and to the left is better",
            x="peak_mem_bytes",
        ),
    ),
    frames.pareto,
    lambda f, note, r: {"front": fmt.listing(f[f["on_front"]].sort_values("peak_mem_bytes")["label"], 4, "; ")},
)
BREAKDOWN = ChartSpec(
    "breakdown",
    "Step-time breakdown by stage",
    (
        Panel(
            tuple(f"cpu_ms_{s}" for s in STAGES),
            title="CPU (host) time, incl. kernel launches, per profiled step",
            **STAGE_PANEL,
        ),
        Panel(
            tuple(f"gpu_ms_{s}" for s in STAGES), title="GPU kernel time, by the stage that launched it", **STAGE_PANEL
        ),
    ),
    frames.breakdown,
    lambda f, note, r: {"panels": PANELS_TEXT["gpu_ms_forward" in f]},
    side_by_side=True,
)
SCALING = ChartSpec(
    "scaling",
    "Scaling with batch / seq_len",
    (
        Panel(TOKENS, "lines", x="x", group="line", grid_x=True),
        Panel(("peak_mem_bytes",), "lines", x="x", group="line", grid_x=True),
    ),
    frames.scaling,
    lambda f, note, r: {"axes": " and ".join(f["axis"].unique())},
    needs=(lambda r: frames.batch_and_seq(r, both=False),),
    facet="axis",
    facet_title="vs {}",
)
HEATMAP = ChartSpec(
    "heatmap",
    "batch x seq_len heatmap",
    (Panel(TOKENS, "heatmap", x="batch", group="seq_len"),),
    frames.heatmap,
    needs=(lambda r: frames.batch_and_seq(r, both=True),),
    facet="panel",
)
FACTORS = ChartSpec(
    "factors",
    "Factor effects",
    (_effects("tokens_per_s", "tokens/s", 1), _effects("peak_mem_bytes", "peak memory", -1)),
    frames.factors,
    lambda f, note, r: {"computed": f" Computed {note}." if note else "", "caution": _caution(r)},
    side_by_side=True,
    horizontal=True,
    legend=(("helps", charts.GOOD), ("hurts", charts.BAD)),
)
LOSS = ChartSpec(
    "loss",
    "Loss curves",
    (
        Panel(
            ("loss",),
            "lines",
            "same seed and data order in every config: curves overlap unless a setting changes numerics",
            label="training loss (cross-entropy)",
            x="step",
            group="label",
            from_zero=False,
            xlabel="optimizer step (warmup steps come first and are not shown)",
        ),
    ),
    frames.loss,
)
CHARTS = {s.name: s for s in (THROUGHPUT, GPU, MEMORY, PARETO, BREAKDOWN, SCALING, HEATMAP, FACTORS, LOSS)}


# --------------------------------------------------------------------------------------------


def make_report(
    engine: Engine, sweep_ids: list[int], baseline: dict | None = None, where: str | None = None, top: int = TOP_BARS
) -> Report:
    """Load the runs of ``sweep_ids``, shape them, and draw every chart that fits (in memory)."""
    t0 = time.perf_counter()
    sweeps, runs = load_report_runs(engine, sweep_ids, where)
    try:
        base = frames.pick_baseline(runs, baseline)
    except ValueError as exc:
        raise UserError(f"--baseline {','.join(f'{k}={v}' for k, v in (baseline or {}).items())}: {exc}") from None
    runs = runs.assign(
        is_baseline=runs.index == base.index, speedup=metrics.speedup(runs["tokens_per_s"], base.get("tokens_per_s"))
    )
    report = Report(
        engine, sweeps, runs, base, *frames.top_configs(runs, runs, top, base), frames.memory_mode(runs), where
    )
    report.load_seconds = time.perf_counter() - t0
    for spec in CHARTS.values():
        t = time.perf_counter()
        chart = report.charts[spec.name] = Chart(spec.name, spec.title)
        try:
            chart.skipped = next(filter(None, (need(report) for need in spec.needs)), None)
            if chart.skipped is None:
                chart.frame, note = spec.frame(report)
                chart.figure = charts.draw(spec, chart.frame, note)
                chart.caption = CAPTIONS[spec.name].format(**spec.facts(chart.frame, note, report))
        except frames.Skip as why:
            chart.skipped = str(why)
        chart.seconds = time.perf_counter() - t
        log.info("chart %s: %s (%.2f s)", spec.name, chart.skipped or "drawn", chart.seconds)
    if (factors := report.charts["factors"].frame) is not None:
        table = factors.rename(columns={"label": "term"})[["term", "tokens/s effect", "peak memory effect"]]
        report.charts["factors"].extra_md = fmt.table(table, right=("tokens/s effect", "peak memory effect"))
    return report


def load_report_runs(engine: Engine, sweep_ids: list[int], where: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The sweeps and their prepared runs (:func:`frames.prepare_runs`); a missing sweep or no run is a UserError."""
    sweeps = load_sweeps(engine, sweep_ids)
    missing = sorted(set(sweep_ids) - set(sweeps["id"])) or ([] if sweep_ids else ["(none)"])
    if missing:
        raise UserError(f"--sweep {missing[0]}: no sweep with id {missing[0]}")
    runs = load_runs(engine, sweep_ids, where)
    if runs.empty:
        which = ", ".join(str(s) for s in sweep_ids)
        raise UserError(
            f"--where {where!r}: no runs of sweep {which} match" if where else f"--sweep {which}: the sweep has no runs"
        )
    return sweeps, frames.prepare_runs(runs)


def write_report(report: Report, out_dir: Path) -> Path:
    """PNGs, report.md and runs.csv into ``out_dir``; stale PNGs of now-skipped charts are removed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for chart in report.charts.values():
        t = time.perf_counter()
        if chart.figure is None:
            (out_dir / chart.file).unlink(missing_ok=True)
        else:
            charts.save(chart.figure, out_dir / chart.file)
        chart.seconds += time.perf_counter() - t
    front = ["id", "sweep_id", "label", "status", "tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi", "speedup"]
    front += ["is_baseline", "peak_mem_bytes"]  # runs.csv: what people look for first, then every runs column
    rest = [c for c in report.runs.columns if c not in front and c not in ("ok", "noisy_p90_p10")]
    report.runs[front + rest].to_csv(out_dir / "runs.csv", index=False)
    (out_dir / "report.md").write_text(report_md(report))
    return out_dir


def default_out_dir(sweeps: pd.DataFrame, sweep_id: int | None, sub: str, elsewhere: str) -> Path:
    """``<sweep_dir>/<sub>`` of ``sweep_id`` when its folder exists, else ``./<elsewhere>``."""
    folder = sweeps.loc[sweeps["id"] == sweep_id, "sweep_dir"]
    if len(folder) and isinstance(folder.iloc[0], str) and Path(folder.iloc[0]).is_dir():
        return Path(folder.iloc[0]) / sub
    return Path.cwd() / elsewhere


def build_report(
    engine: Engine,
    sweep_ids: list[int],
    out_dir: Path | None = None,
    baseline: dict | None = None,
    where: str | None = None,
    top: int = TOP_BARS,
) -> Path:
    """Write the report of ``sweep_ids`` and return its folder (``report.md`` is inside).

    ``baseline`` selects the reference config by axis values, e.g. ``{"amp": False}``
    (default: amp, ckpt and compile off); ``where`` is a filter over runs columns (see
    perfsweep.where); ``top`` caps the configs per bar chart.
    """
    ids = list(sweep_ids)
    report = make_report(engine, ids, baseline=baseline, where=where, top=top)
    default = default_out_dir(
        report.sweeps, ids[0] if len(ids) == 1 else None, "report", f"report_{'_'.join(map(str, ids))}"
    )
    return write_report(report, Path(out_dir) if out_dir is not None else default)


# --------------------------------------------------------------------------------------------
# report.md


def results_table(runs: pd.DataFrame, limit: int = TOP_TABLE) -> tuple[str, str]:
    """The report.md table (differing axes, tokens/s with range, speedup, memory, status) and a note."""
    rows, note = runs, ""
    if len(runs) > limit:
        rows = runs.sort_values("tokens_per_s", ascending=False, na_position="last").head(limit)
        note = f"Top {limit} of {len(runs):,} runs by tokens/s; every run is in runs.csv."
    axes = frames.label_axes(runs) or ["batch", "seq_len"]
    out = pd.DataFrame(
        {frames.SHORT_NAMES.get(a, a): [frames.axis_text(a, v).split("=")[1] for v in rows[a]] for a in axes}
    )
    left = [*out.columns, "status", "note"]
    out["status"] = rows["status"].to_numpy()
    out["tokens/s"] = [fmt.num(v) for v in rows["tokens_per_s"]]
    out["p10-p90 tokens/s"] = [
        fmt.tokens_range(lo, hi) for lo, hi in zip(rows["tokens_per_s_lo"], rows["tokens_per_s_hi"], strict=True)
    ]
    out["speedup"] = [
        "baseline" if b else fmt.num(s, "{:.2f}x") for s, b in zip(rows["speedup"], rows["is_baseline"], strict=True)
    ]
    out["step ms (median)"] = [fmt.num(v, "{:,.1f}") for v in rows["step_time_ms_median"]]
    for col, name in (("peak_mem_bytes", "peak mem"), ("peak_reserved_bytes", "reserved")):
        if col == "peak_mem_bytes" or rows[col].notna().any():
            div, unit = fmt.scale("bytes", rows[col])
            out[f"{name} {unit}"] = [fmt.num(v / div, "{:,.1f}") for v in rows[col]]
    if rows["mfu"].notna().any():
        mfu = zip(rows["mfu"], rows["mfu_compute_dtype"], strict=True)
        out["MFU"] = [fmt.num(v, "{:.1%}") + (f" of {d}" if isinstance(d, str) else "") for v, d in mfu]
    if rows["gpu_busy_fraction"].notna().any():
        out["GPU busy"] = [fmt.num(v, "{:.0%}") for v in rows["gpu_busy_fraction"]]
        out["bottleneck"] = rows["bottleneck"].fillna("-").to_numpy()
    notes = rows[["status", "error", "noisy_p90_p10", "step_time_ms_p10", "step_time_ms_p90"]].itertuples(index=False)
    out["note"] = [
        fmt.clip(error, 70) if status != "ok" else f"noisy: p10-p90 step time {p10:,.1f}-{p90:,.1f} ms" if noisy else ""
        for status, error, noisy, p10, p90 in notes
    ]
    return fmt.table(out, right=[c for c in out.columns if c not in left]), note


def headline_md(report: Report) -> list[str]:
    runs, base = report.runs, report.baseline
    ok, bad, lines = runs[runs["ok"]], runs[runs["status"] != "ok"], []
    if base.index is not None:
        lines.append(
            f"- **Baseline:** {base.label} ({base.how}): {fmt.num(base.get('tokens_per_s'))} tokens/s, "
            f"peak memory {fmt.mem(base.get('peak_mem_bytes'))}."
        )
    if len(ok) > 1:
        fast = ok.loc[ok["tokens_per_s"].idxmax()]
        speed = f", {fast['speedup']:.2f}x the baseline." if pd.notna(fast["speedup"]) else "."
        lines.append(f"- **Fastest:** {fast['label']}: {fast['tokens_per_s']:,.0f} tokens/s{speed}")
        if ok["peak_mem_bytes"].notna().any():
            lean = ok.loc[ok["peak_mem_bytes"].idxmin()]
            ratio = metrics.speedup(lean["peak_mem_bytes"], base.get("peak_mem_bytes"))
            ratio_text = f" ({ratio:.2f}x the baseline)" if pd.notna(ratio) else ""
            lines.append(f"- **Least memory:** {lean['label']}: {fmt.mem(lean['peak_mem_bytes'])}{ratio_text}.")
    if not bad.empty:
        counts = ", ".join(f"{c} {s}" for s, c in bad["status"].value_counts().items())
        lines.append(f"- **Did not finish:** {counts}: {fmt.listing(bad['label'], 6)}.")
    if ok["noisy_p90_p10"].any():
        noisy = ok.loc[ok["noisy_p90_p10"], "label"]
        lines.append(
            f"- **Noisy timings:** {len(noisy)} of {len(ok)} ok configs have a p90 step time more than "
            f"{NOISY_STEP_TIME_RATIO}x their p10 ({fmt.listing(noisy, 4)}); compare them with care, or rerun with "
            "more `steps.measure` on a quieter machine."
        )
    return lines


def environment_md(runs: pd.DataFrame) -> str:
    def values(*cols: str, sep: str = " / ") -> str:  # the distinct values of each column, at most 4 each
        return sep.join(fmt.listing(list(dict.fromkeys(src[c].dropna().astype(str))), 4, "; ") or "-" for c in cols)

    src = runs[runs["device_type"].notna()] if runs["device_type"].notna().any() else runs
    start, end = runs["started_at"].min(), runs["finished_at"].max()
    date = "-" if pd.isna(start) else f"{start:%Y-%m-%d %H:%M}" + (f" - {end:%H:%M}" if pd.notna(end) else "") + " UTC"
    rows = {
        "device": values("device_type", "device_name", sep=": "),
        "CPUs / torch threads": values("cpu_count", "torch_threads"),
        "torch": values("torch_version"),
        "CUDA": values("cuda_version"),
        "python": values("python_version"),
        "hostname": values("hostname"),
        "git commit": values("git_commit"),
        "model / data": values("model_name", "data_name"),
        "steps (warmup + measured)": values("warmup_steps", "measure_steps", sep=" + "),
        "date": date,
    }
    return fmt.table(pd.DataFrame({"": list(rows), "value": list(rows.values())}))


def report_md(report: Report) -> str:
    runs, sweeps, charts_ = report.runs, report.sweeps, report.charts.values()
    sources = (("command", "command"), ("folder", "sweep_dir"))
    sweep_lines = [
        f"- Sweep {s['id']} {what}: `{s[c]}`"
        for _, s in sweeps.iterrows()
        for what, c in sources
        if isinstance(s[c], str)
    ]
    sweep_lines += [f"- Filter (`--where`): `{report.where}`"] if report.where else []
    memory = {
        "cuda": "CUDA peak allocated (reserved beside it)",
        "cpu": "peak allocated bytes of live tensors (see Peak memory)",
    }
    table, note = results_table(runs)
    drawn = [
        f"### {c.title}\n\n{c.caption}\n\n![{c.title}]({c.file})\n\n" + (c.extra_md and f"{c.extra_md}\n\n")
        for c in charts_
        if c.figure
    ]
    skipped = "".join(f"- `{c.file}` ({c.title}): {c.skipped}.\n" for c in charts_ if c.skipped)
    skipped = f"### Charts not drawn for this sweep\n\n{skipped}\n" if skipped else ""
    counts = ", ".join(f"{c} {s}" for s, c in runs["status"].value_counts().items())
    names = ", ".join(dict.fromkeys(sweeps["name"].astype(str)))
    headline = "\n".join(headline_md(report))
    return f"""# perfsweep report: sweep {", ".join(map(str, sweeps["id"]))} ({names})

{len(runs):,} runs ({counts}); generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} from `{report.db}`.

{"".join(line + chr(10) for line in sweep_lines)}
## Headline

{headline}

## Results

tokens/s is over all measured steps; the p10-p90 range is the throughput at the p90 and p10 step time; speedup is \
vs the baseline; peak memory is {memory.get(report.mode, "peak allocated bytes of live tensors")}.

{table}{note and f"{chr(10)}{chr(10)}{note}"}

## Charts

{"".join(drawn)}{skipped}## Environment

{environment_md(runs)}

## Data

- `runs.csv`: every run with every `runs` column (but `config_json`) plus `label`, `speedup`, `tokens_per_s_lo`/`_hi`.
- Database: `{report.db}`, e.g. `SELECT amp, ckpt, tokens_per_s, peak_mem_bytes FROM runs WHERE sweep_id = \
{sweeps["id"].iloc[0]}`; per-step times in `steps`, stage times in `stages`, top operators in `ops`, traces in \
`artifacts`.
"""
