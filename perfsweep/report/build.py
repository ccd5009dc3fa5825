"""Build a sweep's report: decide which charts fit the sweep, draw them, write report.md and runs.csv.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from sqlalchemy.engine import Engine

from perfsweep.cli import UserError
from perfsweep.names import BOTTLENECK_RULE
from perfsweep.report import charts, frames
from perfsweep.report import markdown as md
from perfsweep.report.load import (
    load_kernels,
    load_runs,
    load_stages,
    load_steps,
    load_sweeps,
)

log = logging.getLogger(__name__)

TOP_BARS = 30
"""Most configs a bar chart shows; larger sweeps show the fastest ones (plus the baseline)."""
TOP_DETAIL = 8
"""Most configs in the stage breakdown and loss charts, which need a query per chart."""
TOP_TABLE = 50
"""Most rows of the report.md table; runs.csv always has every run."""
NOISY_RATIO = 1.5
"""p90/p10 step-time ratio above which a config's timing is flagged as noisy."""


class Skip(Exception):
    """A chart does not fit this sweep; the message is the reason shown in report.md."""


@dataclass
class Chart:
    name: str
    title: str
    caption: str = ""
    figure: Figure | None = None
    frame: pd.DataFrame | None = None
    skipped: str | None = None
    seconds: float = 0.0
    extra_md: str = ""

    @property
    def file(self) -> str:
        return f"{self.name}.png"


@dataclass
class Report:
    """Everything report.md is written from; ``charts`` in the order they appear."""

    sweeps: pd.DataFrame
    runs: pd.DataFrame
    baseline: frames.Baseline
    shown: pd.DataFrame
    shown_note: str
    mode: str
    where: str | None
    db: str
    charts: dict[str, Chart] = field(default_factory=dict)
    load_seconds: float = 0.0


@dataclass
class _Ctx:
    engine: Engine
    runs: pd.DataFrame
    shown: pd.DataFrame
    note: str
    base: frames.Baseline
    mode: str


# --------------------------------------------------------------------------------------------
# one function per chart: return (frame, figure, caption) or raise Skip


def _throughput(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    _need_configs(c.runs)
    if not c.runs["ok"].any():
        raise Skip("no run finished ok")
    frame = frames.throughput_frame(c.shown)
    fig = charts.throughput(frame, c.base.label, c.note)
    return (
        frame,
        fig,
        (
            "Tokens per second over all measured steps (warmup excluded); whiskers span the "
            "throughput at the p90 and p10 step time; the label on each bar is the speedup vs the baseline."
        ),
    )


def _gpu(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    _need_configs(c.runs)
    if not c.runs["gpu_busy_fraction"].notna().any():
        raise Skip("no GPU busy time: CPU runs, or GPU runs without the profiled window")
    configs = c.shown[c.shown["gpu_busy_fraction"].notna()]
    if configs.empty:
        raise Skip("none of the configs shown has GPU busy time")
    frame = frames.gpu_frame(configs, load_kernels(c.engine, configs["id"]))
    fig = charts.gpu(frame, c.note)
    caption = (
        "GPU busy share = union of kernel intervals in a profiled step / the measured (unprofiled) median "
        "step. A GPU that is idle most of the step waits for the host to launch work: making its kernels "
        "faster then buys little tokens/s. Kernel categories follow the name rules of perfsweep.trace. "
        f"Verdict rule: {BOTTLENECK_RULE}."
    )
    return frame, fig, caption


def _memory(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    _need_configs(c.runs)
    if not c.runs["peak_mem_bytes"].notna().any():
        raise Skip("no run recorded peak memory")
    frame = frames.memory_frame(c.shown)
    fig = charts.memory(frame, c.mode, c.note)
    what = {
        "cuda": "CUDA peak allocated (live tensors) and peak reserved (held by the caching allocator)",
        "cpu": "CPU peak allocated (live tensors: parameters, optimizer state and the peak of one "
        "step's allocations, counted by torch.profiler) beside the growth of the process's resident "
        "set during training, which also holds memory glibc kept after frees",
    }.get(c.mode, "peak bytes of live tensors on each run's device")
    return frame, fig, f"Peak memory over the measured steps: {what}. Dashed line: the baseline."


def _pareto(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    n = int((c.runs["ok"] & c.runs["peak_mem_bytes"].notna()).sum())
    if n < 3:
        raise Skip(f"needs at least 3 configs that finished with a memory figure (has {n})")
    frame = frames.pareto_frame(c.runs)
    fig = charts.pareto(frame, c.mode)
    front = frame[frame["on_front"]].sort_values("peak_mem_bytes")
    caption = (
        "Every finished config as tokens/s against peak memory; the orange staircase is the Pareto "
        "front (no other config is both faster and leaner). Configs that did not finish are "
        "marked x on the bottom edge. "
        + (f"On the front, leanest first: {'; '.join(front['label'].head(4))}" if len(front) else "")
        + (f" ... ({len(front)} configs)" if len(front) > 4 else "")
        + "."
    )
    return frame, fig, caption


def _detail_configs(c: _Ctx) -> tuple[pd.DataFrame, str]:
    ok = c.shown[c.shown["ok"]]
    if len(ok) <= TOP_DETAIL:
        return ok, c.note
    chosen = ok.sort_values("tokens_per_s", ascending=False).head(TOP_DETAIL)
    if c.base.index is not None and c.base.index in ok.index and c.base.index not in chosen.index:
        chosen = pd.concat([chosen, ok.loc[[c.base.index]]])
    return frames.top_subset(c.runs, chosen, f"top {TOP_DETAIL} of {len(c.runs):,} configs by tokens/s")


def _breakdown(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    configs, note = _detail_configs(c)
    if configs.empty:
        raise Skip("no run finished ok")
    stages = load_stages(c.engine, configs["id"])
    if stages.empty:
        raise Skip("no stage rows for these runs (profiling was off: profile.enabled=false)")
    frame = frames.breakdown_frame(stages, configs)
    fig = charts.breakdown(frame, note)
    same = bool((frame["device_time_source"] == "same_as_cpu").all())
    caption = (
        "Time per step in each stage (data_to_device, forward, backward, optimizer_step, zero_grad), "
        "averaged over the profiler's active steps; the dashed line is the measured (unprofiled) median step. "
        + (
            "On CPU the device time equals the CPU time, so each config has one bar."
            if same
            else "Left bar: CPU (host) time; right hatched bar: GPU kernel time attributed to the stage."
        )
    )
    return frame, fig, caption


def _scaling(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    axes = frames.scaling_axes(c.runs)
    if not axes:
        raise Skip("neither batch nor seq_len varies in this sweep")
    by_axis = {a: frames.scaling_frame(c.runs, a) for a in axes}
    fig = charts.scaling(by_axis, c.mode)
    frame = pd.concat([f.assign(axis=a) for a, (f, _) in by_axis.items()], ignore_index=True)
    return (
        frame,
        fig,
        (
            f"Throughput (top) and peak memory (bottom) against {' and '.join(axes)}, one line per "
            "combination of the other differing axes; x at the bottom edge = run did not finish (e.g. OOM)."
        ),
    )


def _heatmap(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    varying = [a for a in ("batch", "seq_len") if c.runs[a].nunique() > 1]
    if len(varying) < 2:
        raise Skip(f"needs both batch and seq_len to vary (varying here: {', '.join(varying) or 'neither'})")
    panels, note = frames.heatmap_panels(c.runs)
    fig = charts.heatmap(panels, note)
    frame = pd.concat(
        [p.tokens_per_s.stack().rename("tokens_per_s").reset_index().assign(panel=p.title) for p in panels],
        ignore_index=True,
    )
    return (
        frame,
        fig,
        "tokens/s for every batch x seq_len cell (median of repeats); red cells did not finish and say why (OOM, FAILED, TIMEOUT).",
    )


def _factors(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    varying = [a for a in frames.BOOL_AXES if c.runs[a].nunique() > 1]
    if not varying:
        raise Skip("none of amp, ckpt, compile varies")
    result = frames.factorial_effects(c.runs)
    if result is None:
        raise Skip(f"the on/off grid over {', '.join(varying)} is incomplete among ok runs")
    note = ""
    if result.block_axes:
        names = ", ".join(frames.SHORT_NAMES.get(a, a) for a in result.block_axes)
        note = f"averaged over {result.blocks_used} of {result.blocks_total} combinations of {names}"
        if result.blocks_used < result.blocks_total:
            note += " (the others lack an ok run for some on/off combination)"
    fig = charts.factors(result.effects, note)
    caption = (
        "Design-of-experiments effects from ok runs: main effect = mean with the axis on minus mean "
        "with it off; A x B = two-factor interaction (how much the effect of A changes with B, "
        "coded -1/+1); bars are % of the overall mean, absolute values in brackets."
        + (f" Computed {note}." if note else "")
    )
    ok = c.runs[c.runs["ok"]]
    noisy = int((ok["step_time_ms_p90"] / ok["step_time_ms_p10"] > NOISY_RATIO).sum())
    if noisy:
        caption += (
            f" Caution: {noisy} of {len(ok)} ok configs have noisy timings (p90/p10 step time > "
            f"{NOISY_RATIO}), so effects of that size can be noise."
        )
    chart_md = _effects_md(result.effects)
    return result.effects, fig, caption + "\n\n" + chart_md


def _effects_md(effects: pd.DataFrame) -> str:
    rows = []
    for term in dict.fromkeys(effects["term"]):
        e = effects[effects["term"] == term].set_index("metric")
        t = e.loc["tokens_per_s"] if "tokens_per_s" in e.index else None
        m = e.loc["peak_mem_bytes"] if "peak_mem_bytes" in e.index else None
        rows.append(
            {
                "term": term,
                "tokens/s effect": f"{t['effect']:+,.0f} ({t['effect_pct']:+.1f}%)" if t is not None else "-",
                "peak memory effect": f"{_signed_mem(m['effect'])} ({m['effect_pct']:+.1f}%)" if m is not None else "-",
            }
        )
    return md.table(pd.DataFrame(rows), right=("tokens/s effect", "peak memory effect"))


def _signed_mem(v: float) -> str:
    if pd.isna(v):
        return "-"
    return ("+" if v >= 0 else "-") + md.mem(abs(v))


def _loss(c: _Ctx) -> tuple[pd.DataFrame, Figure, str]:
    configs, note = _detail_configs(c)
    if configs.empty:
        raise Skip("no run finished ok")
    steps = load_steps(c.engine, configs["id"], phase="measure")
    frame = frames.loss_frame(steps, configs)
    if frame.empty:
        raise Skip("no measured steps with a loss recorded")
    fig = charts.loss(frame, note)
    return (
        frame,
        fig,
        "Training loss of every measured step (steps table, phase='measure'), one line per config.",
    )


def _need_configs(runs: pd.DataFrame) -> None:
    if len(runs) < 2:
        raise Skip("only one config: nothing to compare")


CHARTS: list[tuple[str, str, Callable[[_Ctx], tuple[pd.DataFrame, Figure, str]]]] = [
    ("throughput", "Throughput", _throughput),
    ("gpu", "GPU busy share and kernel time", _gpu),
    ("memory", "Peak memory", _memory),
    ("pareto", "Throughput vs memory (Pareto front)", _pareto),
    ("breakdown", "Step-time breakdown by stage", _breakdown),
    ("scaling", "Scaling with batch / seq_len", _scaling),
    ("heatmap", "batch x seq_len heatmap", _heatmap),
    ("factors", "Factor effects", _factors),
    ("loss", "Loss curves", _loss),
]


# --------------------------------------------------------------------------------------------


def make_report(
    engine: Engine,
    sweep_ids: list[int],
    baseline: dict[str, Any] | None = None,
    where: str | None = None,
    top: int = TOP_BARS,
) -> Report:
    """Load the runs of ``sweep_ids``, shape them, and draw every chart that fits (in memory)."""
    t0 = time.perf_counter()
    if not sweep_ids:
        raise UserError("no sweep given")
    sweeps = load_sweeps(engine, sweep_ids)
    missing = sorted(set(sweep_ids) - set(sweeps["id"]))
    if missing:
        raise UserError(f"--sweep {missing[0]}: no sweep with id {missing[0]}")
    raw = load_runs(engine, sweep_ids, where)
    if raw.empty:
        which = ", ".join(str(s) for s in sweep_ids)
        raise UserError(
            f"--where {where!r}: no runs of sweep {which} match" if where else f"--sweep {which}: the sweep has no runs"
        )
    runs = frames.prepare_runs(raw)
    try:
        base = frames.pick_baseline(runs, baseline)
    except ValueError as exc:
        spec = ",".join(f"{k}={v}" for k, v in (baseline or {}).items())
        raise UserError(f"--baseline {spec}: {exc}") from None
    runs = frames.add_speedup(runs, base)
    shown, note = frames.select_configs(runs, top, base)
    report = Report(
        sweeps=sweeps,
        runs=runs,
        baseline=base,
        shown=shown,
        shown_note=note,
        mode=frames.memory_mode(runs),
        where=where,
        db=engine.url.render_as_string(hide_password=True),
        load_seconds=time.perf_counter() - t0,
    )
    ctx = _Ctx(engine, runs, shown, note, base, report.mode)
    for name, title, fn in CHARTS:
        chart = Chart(name, title)
        t = time.perf_counter()
        try:
            frame, fig, caption = fn(ctx)
        except Skip as why:
            chart.skipped = str(why)
            log.debug("chart %s skipped: %s", name, why)
        else:
            caption, _, extra = caption.partition("\n\n")
            chart.frame, chart.figure, chart.caption, chart.extra_md = frame, fig, caption, extra
        chart.seconds = time.perf_counter() - t
        report.charts[name] = chart
    return report


def write_report(report: Report, out_dir: Path) -> Path:
    """PNGs, report.md and runs.csv into ``out_dir``; stale PNGs of now-skipped charts are removed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for chart in report.charts.values():
        path = out_dir / chart.file
        if chart.figure is None:
            path.unlink(missing_ok=True)
            continue
        t = time.perf_counter()
        charts.save(chart.figure, path)
        chart.seconds += time.perf_counter() - t
        log.debug("chart %s: %.2f s", chart.file, chart.seconds)
    t = time.perf_counter()
    runs_csv(report.runs).to_csv(out_dir / "runs.csv", index=False)
    (out_dir / "report.md").write_text(report_md(report))
    log.debug("report.md + runs.csv: %.2f s", time.perf_counter() - t)
    return out_dir


def default_out_dir(sweeps: pd.DataFrame, sweep_ids: list[int]) -> Path:
    """``<sweep_dir>/report`` for one sweep whose folder exists, else ``./report_<ids>``."""
    if len(sweep_ids) == 1:
        row = sweeps[sweeps["id"] == sweep_ids[0]]
        if not row.empty and isinstance(row["sweep_dir"].iloc[0], str) and Path(row["sweep_dir"].iloc[0]).is_dir():
            return Path(row["sweep_dir"].iloc[0]) / "report"
    return Path.cwd() / ("report_" + "_".join(str(i) for i in sweep_ids))


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
    (default: amp, ckpt and compile off); ``where`` is SQL over runs columns that filters
    the runs; ``top`` caps the configs per bar chart.
    """
    t0 = time.perf_counter()
    report = make_report(engine, list(sweep_ids), baseline=baseline, where=where, top=top)
    out = Path(out_dir) if out_dir is not None else default_out_dir(report.sweeps, list(sweep_ids))
    write_report(report, out)
    log.debug(
        "report of %d runs in %.2f s (loading %.2f s): %s",
        len(report.runs),
        time.perf_counter() - t0,
        report.load_seconds,
        out,
    )
    return out


# --------------------------------------------------------------------------------------------
# report.md


def runs_csv(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs as loaded plus the report's derived columns, first the ones people look for."""
    front = [
        "id",
        "sweep_id",
        "label",
        "status",
        "tokens_per_s",
        "tokens_per_s_lo",
        "tokens_per_s_hi",
        "speedup",
        "is_baseline",
        "peak_mem_bytes",
    ]
    rest = [c for c in runs.columns if c not in front and c != "ok"]
    return runs[front + rest]


def results_table(runs: pd.DataFrame, limit: int = TOP_TABLE) -> tuple[str, str]:
    """The report.md table (differing axes, tokens/s with range, speedup, memory, status)."""
    axes = frames.label_axes(runs)
    rows = runs
    note = ""
    if len(runs) > limit:
        rows = runs.sort_values("tokens_per_s", ascending=False, na_position="last").head(limit)
        note = f"Top {limit} of {len(runs):,} runs by tokens/s; every run is in runs.csv."
    out = pd.DataFrame(index=rows.index)
    for a in axes or ["batch", "seq_len"]:
        out[frames.SHORT_NAMES.get(a, a)] = [frames.format_axis_value(a, v) for v in rows[a]]
    out["status"] = rows["status"]
    out["tokens/s"] = rows["tokens_per_s"].map(md.num)
    out["p10-p90 tokens/s"] = [
        md.tokens_range(lo, hi) for lo, hi in zip(rows["tokens_per_s_lo"], rows["tokens_per_s_hi"], strict=True)
    ]
    out["speedup"] = [
        "baseline" if b else md.num(s, "{:.2f}x") for s, b in zip(rows["speedup"], rows["is_baseline"], strict=True)
    ]
    out["step ms (median)"] = rows["step_time_ms_median"].map(lambda v: md.num(v, "{:,.1f}"))
    unit, fmt = md.mem_formatter(rows["peak_mem_bytes"])
    out[f"peak mem {unit}"] = rows["peak_mem_bytes"].map(fmt)
    if rows["peak_reserved_bytes"].notna().any():
        unit_r, fmt_r = md.mem_formatter(rows["peak_reserved_bytes"])
        out[f"reserved {unit_r}"] = rows["peak_reserved_bytes"].map(fmt_r)
    if rows["mfu"].notna().any():
        out["MFU"] = [
            md.num(v, "{:.1%}") + (f" of {d}" if isinstance(d, str) else "")
            for v, d in zip(rows["mfu"], rows["mfu_compute_dtype"], strict=True)
        ]
    if rows["gpu_busy_fraction"].notna().any():
        out["GPU busy"] = rows["gpu_busy_fraction"].map(lambda v: md.num(v, "{:.0%}"))
        out["bottleneck"] = rows["bottleneck"].fillna("-")
    notes = []
    for _, r in rows.iterrows():
        bits = []
        if r["status"] != "ok":
            bits.append(md.first_line(r["error"], 70))
        elif _noisy(r):
            bits.append(f"noisy: p90/p10 = {r['step_time_ms_p90'] / r['step_time_ms_p10']:.1f}")
        notes.append("; ".join(b for b in bits if b))
    out["note"] = notes
    right = [
        c for c in out.columns if c not in ("status", "note") and c not in {frames.SHORT_NAMES.get(a, a) for a in axes}
    ]
    return md.table(out, right=right), note


def _noisy(r: pd.Series) -> bool:
    p10, p90 = r["step_time_ms_p10"], r["step_time_ms_p90"]
    return bool(pd.notna(p10) and pd.notna(p90) and p10 > 0 and p90 / p10 > NOISY_RATIO)


def _distinct(runs: pd.DataFrame, col: str) -> str:
    vals = [str(v) for v in dict.fromkeys(runs[col].dropna())]
    if not vals:
        return "-"
    return "; ".join(vals[:4]) + (f" (+{len(vals) - 4} more)" if len(vals) > 4 else "")


def environment_md(runs: pd.DataFrame) -> str:
    ok = runs[runs["device_type"].notna()]
    src = ok if not ok.empty else runs
    start, end = runs["started_at"].min(), runs["finished_at"].max()
    date = "-"
    if pd.notna(start):
        date = f"{start:%Y-%m-%d %H:%M} - {end:%H:%M} UTC" if pd.notna(end) else f"{start:%Y-%m-%d %H:%M} UTC"
    rows = [
        ("device", f"{_distinct(src, 'device_type')}: {_distinct(src, 'device_name')}"),
        (
            "CPUs / torch threads",
            f"{_distinct(src, 'cpu_count')} / {_distinct(src, 'torch_threads')}",
        ),
        ("torch", _distinct(src, "torch_version")),
        ("CUDA", _distinct(src, "cuda_version")),
        ("python", _distinct(src, "python_version")),
        ("hostname", _distinct(src, "hostname")),
        ("git commit", _distinct(src, "git_commit")),
        ("model / data", f"{_distinct(src, 'model_name')} / {_distinct(src, 'data_name')}"),
        (
            "steps (warmup + measured)",
            f"{_distinct(src, 'warmup_steps')} + {_distinct(src, 'measure_steps')}",
        ),
        ("date", date),
    ]
    return md.table(pd.DataFrame(rows, columns=["", "value"]))


def headline_md(report: Report) -> list[str]:
    runs, base = report.runs, report.baseline
    lines = []
    ok = runs[runs["ok"]]
    if base.index is not None:
        lines.append(
            f"- **Baseline:** {base.label} ({base.how}): {md.num(base.tokens_per_s)} tokens/s, "
            f"peak memory {md.mem(base.peak_mem_bytes)}."
        )
    if len(ok) > 1:
        fast = ok.loc[ok["tokens_per_s"].idxmax()]
        lines.append(
            f"- **Fastest:** {fast['label']}: {fast['tokens_per_s']:,.0f} tokens/s"
            + (f", {fast['speedup']:.2f}x the baseline." if pd.notna(fast["speedup"]) else ".")
        )
        mem_ok = ok.dropna(subset=["peak_mem_bytes"])
        if not mem_ok.empty:
            lean = mem_ok.loc[mem_ok["peak_mem_bytes"].idxmin()]
            ratio = (
                f" ({lean['peak_mem_bytes'] / base.peak_mem_bytes:.2f}x the baseline)" if base.peak_mem_bytes else ""
            )
            lines.append(f"- **Least memory:** {lean['label']}: {md.mem(lean['peak_mem_bytes'])}{ratio}.")
    bad = runs[runs["status"] != "ok"]
    if not bad.empty:
        counts = ", ".join(f"{c} {s}" for s, c in bad["status"].value_counts().items())
        names = ", ".join(bad["label"].head(6)) + (" ..." if len(bad) > 6 else "")
        lines.append(f"- **Did not finish:** {counts}: {names}.")
    noisy = ok[ok["step_time_ms_p90"] / ok["step_time_ms_p10"] > NOISY_RATIO]
    if not noisy.empty:
        lines.append(
            f"- **Noisy timings:** {len(noisy)} of {len(ok)} ok configs have a p90 step time more than "
            f"{NOISY_RATIO}x their p10 ({', '.join(noisy['label'].head(4))}{' ...' if len(noisy) > 4 else ''}); "
            "compare them with care, or rerun with more `steps.measure` on a quieter machine."
        )
    return lines


def report_md(report: Report) -> str:
    runs, sweeps = report.runs, report.sweeps
    ids = ", ".join(str(i) for i in sweeps["id"])
    names = ", ".join(dict.fromkeys(sweeps["name"].astype(str)))
    counts = ", ".join(f"{c} {s}" for s, c in runs["status"].value_counts().items())
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"# perfsweep report: sweep {ids} ({names})", ""]
    parts.append(f"{len(runs):,} runs ({counts}); generated {now} from `{report.db}`.")
    parts.append("")
    for _, s in sweeps.iterrows():
        if isinstance(s["command"], str):
            parts.append(f"- Sweep {s['id']} command: `{s['command']}`")
        if isinstance(s["sweep_dir"], str):
            parts.append(f"- Sweep {s['id']} folder: `{s['sweep_dir']}`")
    if report.where:
        parts.append(f"- Filter (`--where`): `{report.where}`")
    parts += ["", "## Headline", "", *headline_md(report), "", "## Results", ""]
    table, note = results_table(runs)
    parts += [
        "tokens/s is over all measured steps; the p10-p90 range is the throughput at the p90 and p10 step "
        "time; speedup is vs the baseline; peak memory is "
        + {
            "cuda": "CUDA peak allocated (reserved beside it)",
            "cpu": "peak allocated bytes of live tensors (see Peak memory)",
        }.get(report.mode, "peak allocated bytes of live tensors")
        + ".",
        "",
        table,
    ]
    if note:
        parts += ["", note]
    parts += ["", "## Charts", ""]
    drawn = [c for c in report.charts.values() if c.figure is not None]
    for c in drawn:
        parts += [f"### {c.title}", "", c.caption, "", f"![{c.title}]({c.file})", ""]
        if c.extra_md:
            parts += [c.extra_md, ""]
    skipped = [c for c in report.charts.values() if c.skipped]
    if skipped:
        parts += ["### Charts not drawn for this sweep", ""]
        parts += [f"- `{c.file}` ({c.title}): {c.skipped}." for c in skipped]
        parts.append("")
    parts += ["## Environment", "", environment_md(runs), ""]
    parts += [
        "## Data",
        "",
        "- `runs.csv`: every run with every `runs` column (but `config_json`) plus `label`, `speedup`, "
        "`tokens_per_s_lo`/`_hi`.",
        f"- Database: `{report.db}`, e.g. `SELECT amp, ckpt, tokens_per_s, peak_mem_bytes FROM runs "
        f"WHERE sweep_id = {sweeps['id'].iloc[0]}`; per-step times in `steps`, stage times in `stages`, "
        "top operators in `ops`, traces in `artifacts`.",
        "",
    ]
    return "\n".join(parts)
