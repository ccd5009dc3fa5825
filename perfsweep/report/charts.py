"""Drawing: one function per chart, each taking a frame from :mod:`perfsweep.report.frames`.

Charts are meant for a slide: a title that says what is plotted, a subtitle that says how to
read it, units on every axis, values written on the marks. Functions return a matplotlib
``Figure`` with its own Agg canvas, built without pyplot: no global figure registry to leak
in a 10,000-run report, no display needed, and importing this module never changes the
backend of the caller (a notebook keeps its inline plots). Tests inspect the artists, the
notebook displays the figures; :func:`save` writes the PNG.

Bar charts switch from vertical bars with one axis per label line to horizontal bars when
there are more than :data:`VERTICAL_MAX` configs, so long labels stay readable.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import blended_transform_factory

from perfsweep.names import GPU_BOUND_BUSY_FRACTION, KERNEL_CATEGORIES
from perfsweep.report import frames

VERTICAL_MAX = 12
"""Up to this many configs, bars stand vertically with a multi-line label under each."""

DPI = 150

STYLE: dict[str, Any] = {
    "font.size": 11,
    "axes.titlesize": 11,
    "axes.titlecolor": "#444444",
    "figure.titlesize": 15,
    "figure.titleweight": "bold",
    "axes.labelsize": 12,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 10,
    "legend.framealpha": 0.9,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "savefig.dpi": DPI,
    "savefig.facecolor": "white",
}

BAR = "#4C72B0"
BAR_2 = "#9ECAE9"
BASE = "#8C8C8C"
FRONT = "#DD8452"
BAD = "#C44E52"
GOOD = "#55A868"
STAGE_COLORS = {
    "data_to_device": "#8172B3",
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "optimizer_step": "#55A868",
    "zero_grad": "#937860",
}
LINE_COLORS = [
    "#4C72B0",
    "#DD8452",
    "#55A868",
    "#C44E52",
    "#8172B3",
    "#937860",
    "#DA8BC3",
    "#8C8C8C",
    "#CCB974",
    "#64B5CD",
    "#1B3A6B",
    "#7A3B00",
]
STATUS_TEXT = {"oom": "OOM", "failed": "FAILED", "timeout": "TIMEOUT"}
BOTTLENECK_COLORS = {"gpu": GOOD, "host": BAD, "data": FRONT}
KERNEL_COLORS = {
    "gemm": "#4C72B0",
    "attention": "#64B5CD",
    "elementwise/norm": "#CCB974",
    "reduction": "#8172B3",
    "optimizer": "#937860",
    "memcpy/memset": "#DA8BC3",
    "communication": "#1B3A6B",
    "other": "#8C8C8C",
}
assert set(KERNEL_COLORS) == set(KERNEL_CATEGORIES)


def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build the figure under :data:`STYLE` without touching the caller's rcParams."""

    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with rc_context(STYLE):
            return fn(*args, **kwargs)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def save(fig: Figure, path: Path) -> Path:
    with rc_context(STYLE):
        fig.savefig(path, dpi=DPI)
    return path


# --------------------------------------------------------------------------------------------
# formatting helpers


def si(v: float | None, digits: int = 3) -> str:
    """14109 -> '14.1k': short enough to write on a bar."""
    if v is None or not np.isfinite(v):
        return "-"
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.{digits}g}{suffix}"
    return f"{v:.{digits}g}"


def bytes_unit(values: Sequence[float] | pd.Series) -> tuple[float, str]:
    """(divisor, name): GiB when the largest value is at least 1 GiB, else MiB."""
    finite = [float(v) for v in values if v is not None and np.isfinite(v)]
    biggest = max(finite, default=0.0)
    return (2.0**30, "GiB") if biggest >= 2**30 else (2.0**20, "MiB")


def fmt_mem(v: float, div: float, unit: str) -> str:
    x = v / div
    return f"{x:.2f} {unit}" if x < 10 else f"{x:.1f} {unit}" if x < 100 else f"{x:,.0f} {unit}"


THOUSANDS = FuncFormatter(lambda v, _pos: f"{v:,.0f}")


def _wrap_label(label: str) -> str:
    return label.replace(" ", "\n")


def _subtitle(ax: Axes, *parts: str, right: bool = False) -> None:
    """How to read the chart, above the axes; ``right`` aligns it to the right edge, for
    horizontal bars whose long labels leave the space left of the axes empty."""
    ax.set_title("\n".join(p for p in parts if p), loc="right" if right else "left", fontsize=10)


def _fig(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # render with Agg whatever backend the process uses
    return fig


def _bar_figsize(n: int, horizontal: bool, per: float = 0.95) -> tuple[float, float]:
    if horizontal:
        return 11.0, max(4.5, 0.32 * n + 2.0)
    return max(7.5, per * n + 3.0), 6.0


def _config_axis(ax: Axes, labels: Sequence[str], horizontal: bool) -> np.ndarray:
    """Positions for the configs and their tick labels; horizontal lists the first on top."""
    pos = np.arange(len(labels), dtype=float)
    if horizontal:
        ax.set_yticks(pos, labels)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.grid(axis="y", visible=False)
    else:
        ax.set_xticks(pos, [_wrap_label(str(lab)) for lab in labels])
        ax.set_xlim(-0.6, len(labels) - 0.4)
        ax.grid(axis="x", visible=False)
    return pos


def _value_axis(ax: Axes, horizontal: bool) -> Any:
    return ax.xaxis if horizontal else ax.yaxis


def _ref_line(ax: Axes, value: float, horizontal: bool, **kw: Any) -> None:
    (ax.axvline if horizontal else ax.axhline)(value, **kw)


def _write_status(ax: Axes, pos: float, status: str, horizontal: bool) -> None:
    """Mark a config that has no bar because it did not finish."""
    text = STATUS_TEXT.get(status, status.upper())
    if horizontal:
        tr = blended_transform_factory(ax.transAxes, ax.transData)
        ax.text(0.01, pos, text, transform=tr, color=BAD, fontweight="bold", va="center", fontsize=9)
    else:
        tr = blended_transform_factory(ax.transData, ax.transAxes)
        ax.text(
            pos,
            0.02,
            text,
            transform=tr,
            color=BAD,
            fontweight="bold",
            ha="center",
            va="bottom",
            rotation=90,
            fontsize=10,
        )


# --------------------------------------------------------------------------------------------
# throughput


@styled
def throughput(df: pd.DataFrame, baseline_label: str | None = None, note: str = "") -> Figure:
    """Bars of tokens/s per config with p10-p90 ranges and the speedup vs the baseline on each.

    ``df`` is :func:`frames.throughput_frame`; rows without tokens/s (failed, oom, timeout)
    keep their slot and say why they are empty.
    """
    n = len(df)
    horizontal = n > VERTICAL_MAX
    fig = _fig(*_bar_figsize(n, horizontal))
    ax = fig.add_subplot()
    pos = _config_axis(ax, df["label"].tolist(), horizontal)
    tps = df["tokens_per_s"].to_numpy(dtype=float)
    lo = df["tokens_per_s_lo"].to_numpy(dtype=float)
    hi = df["tokens_per_s_hi"].to_numpy(dtype=float)
    colors = [BASE if b else BAR for b in df["is_baseline"]]
    heights = np.nan_to_num(tps)
    (ax.barh if horizontal else ax.bar)(pos, heights, 0.65, color=colors, zorder=2)
    err = np.vstack([np.clip(tps - lo, 0, None), np.clip(hi - tps, 0, None)])
    ok = np.isfinite(tps) & np.isfinite(lo) & np.isfinite(hi)
    if ok.any():
        kw = {"xerr" if horizontal else "yerr": err[:, ok]}
        xy = (tps[ok], pos[ok]) if horizontal else (pos[ok], tps[ok])
        ax.errorbar(*xy, **kw, fmt="none", ecolor="#222222", elinewidth=1.2, capsize=4, zorder=3)
    top = np.nanmax(np.where(ok, hi, tps)) if np.isfinite(tps).any() else 1.0
    for p, t, s, status, is_base in zip(pos, tps, df["speedup"], df["status"], df["is_baseline"], strict=True):
        if not np.isfinite(t):
            _write_status(ax, p, str(status), horizontal)
            continue
        text = "base" if is_base else (f"{s:.2f}x" if np.isfinite(s) else si(t))
        box = {
            "boxstyle": "round,pad=0.2",
            "facecolor": "white",
            "edgecolor": "none",
            "alpha": 0.85,
        }
        if horizontal:
            ax.text(
                t + 0.01 * top,
                p,
                text,
                va="center",
                fontsize=9,
                fontweight="bold",
                bbox=box,
                zorder=5,
            )
        else:
            ax.text(
                p,
                t + 0.012 * top,
                text,
                ha="center",
                va="bottom",
                fontsize=10,
                fontweight="bold",
                bbox=box,
                zorder=5,
            )
    handles: list[Any] = [
        Patch(color=BAR, label="tokens/s over all measured steps"),
        Patch(color=BASE, label="baseline config"),
    ]
    if ok.any():
        handles.append(Line2D([], [], color="#222222", marker="_", ms=10, label="range at p90..p10 step time"))
    base = df.loc[df["is_baseline"], "tokens_per_s"]
    if len(base) and np.isfinite(base.iloc[0]):
        _ref_line(ax, float(base.iloc[0]), horizontal, color=BASE, ls="--", lw=1.2, zorder=1)
        handles.append(Line2D([], [], color=BASE, ls="--", label=f"baseline: {si(float(base.iloc[0]))} tokens/s"))
    if horizontal:
        ax.set_xlim(0, top * 1.12)
    else:
        ax.set_ylim(0, top * 1.12)
    _value_axis(ax, horizontal).set_major_formatter(THOUSANDS)
    (ax.set_xlabel if horizontal else ax.set_ylabel)("throughput (tokens/s)")
    fig.suptitle("Training throughput per config" + (f" ({note})" if note else ""))
    _subtitle(
        ax,
        f"label: speedup vs the baseline ({baseline_label})" if baseline_label else "",
        "whisker: throughput at the p90 (low end) and p10 (high end) step time",
        right=horizontal,
    )
    fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False)
    return fig


# --------------------------------------------------------------------------------------------
# GPU busy share and kernel categories


@styled
def gpu(df: pd.DataFrame, note: str = "") -> Figure:
    """Three panels per config: tokens/s, GPU busy share with the verdict, GPU work by category.

    ``df`` is :func:`frames.gpu_frame`. Read left to right: a config whose GPU work shrank (right
    panel) but whose tokens/s rose less is one whose GPU now waits for the host (middle panel).
    """
    n = len(df)
    fig = _fig(15.0, max(3.8, 0.55 * n + 2.2))
    ax_t, ax_b, ax_k = fig.subplots(1, 3, sharey=True, gridspec_kw={"width_ratios": [1.0, 0.9, 1.4]})
    labels = df["label"].tolist()
    pos = _config_axis(ax_t, labels, horizontal=True)
    verdict_colors = [BOTTLENECK_COLORS.get(str(v), BASE) for v in df["bottleneck"]]

    tps = df["tokens_per_s"].to_numpy(dtype=float)
    ax_t.barh(pos, np.nan_to_num(tps), 0.65, color=BAR, zorder=2)
    for p, t, status in zip(pos, tps, df["status"], strict=True):
        if np.isfinite(t):
            ax_t.text(t, p, f" {si(t)}", va="center", fontsize=9)
        else:
            _write_status(ax_t, p, str(status), horizontal=True)
    ax_t.set_xlim(0, (np.nanmax(tps) if np.isfinite(tps).any() else 1.0) * 1.25)
    ax_t.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: si(v)))
    ax_t.set_xlabel("tokens/s")
    ax_t.set_title("throughput\n(measured steps)", loc="left", fontsize=10)

    busy = df["gpu_busy_fraction"].to_numpy(dtype=float) * 100.0
    ax_b.barh(pos, np.nan_to_num(busy), 0.65, color=verdict_colors, zorder=2)
    ax_b.axvline(GPU_BOUND_BUSY_FRACTION * 100.0, color="#444444", ls="--", lw=1.0, zorder=3)
    for p, b, v in zip(pos, busy, df["bottleneck"], strict=True):
        text = f" {b:.0f}% {v}" if np.isfinite(b) else " no GPU profile"
        ax_b.text(np.nan_to_num(b), p, text, va="center", fontsize=9, fontweight="bold")
    ax_b.set_xlim(0, max(125.0, float(np.nanmax(busy, initial=0.0)) * 1.25))
    ax_b.set_xlabel("GPU busy, % of the measured step")
    ax_b.set_title(
        f"GPU busy share and verdict\ndashed: {GPU_BOUND_BUSY_FRACTION:.0%}, gpu-bound at or above",
        loc="left",
        fontsize=10,
    )

    left = np.zeros(n)
    handles: list[Any] = []
    for cat in KERNEL_CATEGORIES:
        col = f"kernel_ms_{cat}"
        if col not in df.columns:
            continue
        vals = df[col].to_numpy(dtype=float)
        ax_k.barh(pos, vals, 0.65, left=left, color=KERNEL_COLORS[cat], zorder=2)
        left += vals
        handles.append(Patch(color=KERNEL_COLORS[cat], label=cat))
    step = df["step_time_ms_median"].to_numpy(dtype=float)
    ax_k.scatter(step, pos, marker="|", s=400, color="#222222", zorder=4)
    for p, k, st in zip(pos, left, step, strict=True):
        if np.isfinite(st):
            ax_k.text(max(k, st), p, f"  {k:.1f} of {st:.1f} ms", va="center", fontsize=9)
    ax_k.set_xlim(0, float(np.nanmax(np.fmax(left, np.nan_to_num(step)), initial=1.0)) * 1.45)
    ax_k.set_xlabel("ms per step")
    ax_k.set_title("GPU work by kernel category\nblack tick: the measured step", loc="left", fontsize=10)
    handles.append(Line2D([], [], color="#222222", marker="|", ls="none", ms=14, label="measured step"))
    handles += [Patch(color=c, label=f"{v}-bound") for v, c in BOTTLENECK_COLORS.items()]
    fig.suptitle("Where the GPU time goes" + (f" ({note})" if note else ""))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(6, len(handles)), frameon=False)
    return fig


# --------------------------------------------------------------------------------------------
# memory


@styled
def memory(df: pd.DataFrame, mode: str, note: str = "") -> Figure:
    """Peak memory per config: allocated vs reserved on CUDA, allocated vs RSS growth on CPU."""
    n = len(df)
    horizontal = n > VERTICAL_MAX
    fig = _fig(*_bar_figsize(n, horizontal, per=1.1 if mode == "cuda" else 0.95))
    ax = fig.add_subplot()
    pos = _config_axis(ax, df["label"].tolist(), horizontal)
    if mode == "cuda":
        series = [
            ("peak_allocated_bytes", "peak allocated (tensors)", BAR),
            ("peak_reserved_bytes", "peak reserved (caching allocator)", BAR_2),
        ]
        subtitle = "CUDA caching allocator over the measured steps; reserved - allocated = cached/fragmented"
    elif mode == "cpu":
        series = [
            ("peak_allocated_bytes", "peak allocated (tensors)", BAR),
            ("rss_growth_bytes", "process RSS growth during training", BAR_2),
        ]
        subtitle = "CPU: allocator-counted tensor peak; RSS also holds memory glibc kept after frees"
    else:
        series = [("peak_mem_bytes", "peak allocated (tensors)", BAR)]
        subtitle = "mixed devices: peak bytes of live tensors on each run's device"
    div, unit = bytes_unit(pd.concat([df[c] for c, _, _ in series]))
    width = 0.8 / len(series)
    top = 0.0
    for k, (col, name, color) in enumerate(series):
        vals = df[col].to_numpy(dtype=float) / div
        offset = (k - (len(series) - 1) / 2) * width
        p = pos + offset
        (ax.barh if horizontal else ax.bar)(p, np.nan_to_num(vals), width * 0.92, color=color, label=name, zorder=2)
        top = max(top, np.nanmax(vals) if np.isfinite(vals).any() else 0.0)
        for pi, v in zip(p, vals, strict=True):
            if not np.isfinite(v):
                continue
            label = f"{v:.3g}"
            if horizontal:
                ax.text(v, pi, " " + label, va="center", fontsize=8)
            else:
                ax.text(pi, v, label, ha="center", va="bottom", fontsize=9 if len(series) == 1 else 8)
        base = df.loc[df["is_baseline"], col]
        if len(base) and np.isfinite(base.iloc[0]):
            _ref_line(
                ax,
                float(base.iloc[0]) / div,
                horizontal,
                color="#333333" if k == 0 else "#777777",
                ls="--" if k == 0 else ":",
                lw=1.2,
                zorder=1,
                label=f"baseline {name.split(' (')[0]}: {fmt_mem(float(base.iloc[0]), div, unit)}",
            )
    for p, status, v in zip(pos, df["status"], df[series[0][0]], strict=True):
        if status != "ok" and not (v is not None and np.isfinite(v)):
            _write_status(ax, p, str(status), horizontal)
    (ax.set_xlim if horizontal else ax.set_ylim)(0, max(top, 1e-9) * 1.15)
    (ax.set_xlabel if horizontal else ax.set_ylabel)(f"peak memory ({unit})")
    fig.suptitle("Peak memory per config" + (f" ({note})" if note else ""))
    _subtitle(ax, subtitle, right=horizontal)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), 2), frameon=False)
    return fig


# --------------------------------------------------------------------------------------------
# pareto


@styled
def pareto(df: pd.DataFrame, mode: str, max_labels: int = 8) -> Figure:
    """tokens/s against peak memory with the Pareto front; configs that did not finish marked."""
    ok = df[df["ok"] & df["peak_mem_bytes"].notna()]
    fig = _fig(10 if len(ok) <= max_labels else 15, 6.5)
    ax = fig.add_subplot()
    bad = df[~df["ok"]]
    div, unit = bytes_unit(df["peak_mem_bytes"])
    n = len(ok)
    size = 60 if n <= 50 else 25 if n <= 1000 else 8
    rest = ok[~ok["on_front"]]
    ax.scatter(
        rest["peak_mem_bytes"] / div,
        rest["tokens_per_s"],
        s=size,
        color=BAR,
        alpha=0.6 if n > 50 else 0.9,
        label="config",
        zorder=2,
        edgecolor="none",
    )
    front = ok[ok["on_front"]].sort_values("peak_mem_bytes")
    ax.step(
        front["peak_mem_bytes"] / div,
        front["tokens_per_s"],
        where="post",
        color=FRONT,
        lw=1.5,
        zorder=3,
    )
    ax.scatter(
        front["peak_mem_bytes"] / div,
        front["tokens_per_s"],
        s=max(size, 40) * 1.6,
        color=FRONT,
        edgecolor="black",
        linewidth=0.6,
        zorder=4,
        label=f"Pareto front ({len(front)})",
    )
    base = ok[ok["is_baseline"]]
    if not base.empty:
        ax.scatter(
            base["peak_mem_bytes"] / div,
            base["tokens_per_s"],
            s=max(size, 40) * 2.4,
            facecolor="none",
            edgecolor="black",
            linewidth=1.5,
            zorder=5,
            label="baseline",
        )
    log_x = _pad_limits(ax, ok["peak_mem_bytes"] / div, ok["tokens_per_s"], bad["peak_mem_bytes"] / div)
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    to_label = _pareto_labels(ok, front, base, max_labels, log_x, div, (x0, x1), y1 - y0)
    numbered = n > max_labels  # crowded: numbers at the points, the configs listed beside the plot
    listing = []
    for i, (_, r) in enumerate(to_label.sort_values("peak_mem_bytes").iterrows()):
        x = r["peak_mem_bytes"] / div
        xf = (np.log(x / x0) / np.log(x1 / x0)) if log_x else (x - x0) / ((x1 - x0) or 1.0)
        right_half = xf > 0.6
        y_frac = (r["tokens_per_s"] - y0) / ((y1 - y0) or 1.0)
        if numbered:
            ax.annotate(
                str(i + 1),
                (x, r["tokens_per_s"]),
                xytext=(-9, 6),
                textcoords="offset points",
                fontsize=9,
                fontweight="bold",
                ha="right",
                zorder=7,
                bbox={
                    "boxstyle": "circle,pad=0.15",
                    "facecolor": "white",
                    "edgecolor": "#555555",
                    "lw": 0.6,
                },
            )
            listing.append(
                f"{i + 1}: {r['label']}\n    {si(r['tokens_per_s'])} tok/s, {fmt_mem(r['peak_mem_bytes'], div, unit)}"
            )
            continue
        above = y_frac < 0.15 or (y_frac < 0.9 and i % 2 == 0)
        ax.annotate(
            r["label"],
            (x, r["tokens_per_s"]),
            xytext=(-8 if right_half else 8, 8 if above else -14),
            textcoords="offset points",
            fontsize=9,
            ha="right" if right_half else "left",
            fontweight="bold" if r["on_front"] else "normal",
            zorder=6,
        )
    if listing:
        ax.text(
            1.02,
            1.0,
            "labelled configs (front + baseline)\n\n" + "\n".join(listing),
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=8.5,
            linespacing=1.35,
        )
    if not bad.empty:
        # at the bottom edge: x = the memory it had reached if known, else the right edge
        known = bad["peak_mem_bytes"].notna().to_numpy()
        xs = np.where(known, bad["peak_mem_bytes"].to_numpy(dtype=float) / div, 0.97)
        what = ", ".join(f"{c} {s}" for s, c in bad["status"].value_counts().items())
        data_x = blended_transform_factory(ax.transData, ax.transAxes)
        for mask, tr in ((known, data_x), (~known, ax.transAxes)):
            if mask.any():
                ax.plot(
                    xs[mask],
                    np.full(int(mask.sum()), 0.03),
                    transform=tr,
                    ls="none",
                    marker="x",
                    ms=9,
                    mew=2.5,
                    color=BAD,
                    zorder=6,
                    clip_on=False,
                    scalex=False,
                    scaley=False,
                )
        ax.plot(
            [],
            [],
            ls="none",
            marker="x",
            ms=9,
            mew=2.5,
            color=BAD,
            label=f"did not finish: {what} (bottom edge)",
        )
        if len(bad) <= max_labels:
            for j, (x, k, (_, r)) in enumerate(zip(xs, known, bad.iterrows(), strict=True)):
                ax.annotate(
                    f"{r['label']} ({r['status']})",
                    (x, 0.03),
                    xycoords=data_x if k else ax.transAxes,
                    xytext=(0, 9 + 12 * (j % 3)),
                    textcoords="offset points",
                    fontsize=8,
                    color=BAD,
                    ha="right" if not k else "center",
                )
    ax.yaxis.set_major_formatter(THOUSANDS)
    ax.set_ylabel("throughput (tokens/s)")
    what_mem = {"cuda": "peak allocated", "cpu": "peak allocated"}.get(mode, "peak memory")
    ax.set_xlabel(f"{what_mem} ({unit}{', log scale' if log_x else ''})")
    if log_x:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    fig.suptitle("Throughput vs memory: the Pareto front")
    _subtitle(
        ax,
        "front (orange): no other config is both faster and leaner; up and to the left is better",
    )
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=4, frameon=False)
    return fig


def _pareto_labels(
    ok: pd.DataFrame,
    front: pd.DataFrame,
    base: pd.DataFrame,
    max_labels: int,
    log_x: bool,
    div: float,
    xlim: tuple[float, float],
    y_span: float,
) -> pd.DataFrame:
    """Which points get a label: all when few; else front points far enough apart, and the baseline.

    Labels are shortened to the axes that differ among the labelled points.
    """
    if len(ok) <= max_labels:
        return ok

    def xpos(v: float) -> float:  # position along the x axis, 0..1, as drawn
        v = v / div
        if log_x:
            return float(np.log(max(v, 1e-12) / xlim[0]) / np.log(xlim[1] / xlim[0]))
        return (v - xlim[0]) / ((xlim[1] - xlim[0]) or 1.0)

    picked: list[Any] = []
    for idx, r in front.sort_values("tokens_per_s", ascending=False).iterrows():
        far = all(
            abs(r["tokens_per_s"] - front.at[j, "tokens_per_s"]) > 0.05 * y_span
            or abs(xpos(r["peak_mem_bytes"]) - xpos(front.at[j, "peak_mem_bytes"])) > 0.05
            for j in picked
        )
        if far:
            picked.append(idx)
        if len(picked) >= max_labels:
            break
    chosen = pd.concat([front.loc[picked], base]).drop_duplicates("id").copy()
    if len(chosen) > 1:
        axes = [a for a in frames.CONFIG_AXES if a in ok.columns and ok[a].nunique(dropna=False) > 1]
        chosen["label"], _ = frames.relabel(chosen, axes)
    return chosen


def _pad_limits(ax: Axes, xs: pd.Series, ys: pd.Series, extra_x: pd.Series) -> bool:
    """Limits around the points (not from zero: on a Pareto plot the spread is the message).

    Memory spanning more than 20x goes on a log axis so the lean end is not squashed; returns
    whether it did.
    """
    x = pd.concat([xs, extra_x]).dropna()
    y = ys.dropna()
    log_x = bool(len(x) and x.min() > 0 and x.max() / x.min() > 20)
    if log_x:
        ax.set_xscale("log")
        ax.set_xlim(float(x.min()) / 1.4, float(x.max()) * 1.4)
    elif len(x):
        lo, hi = float(x.min()), float(x.max())
        pad = 0.12 * (hi - lo) if hi > lo else 0.1 * abs(hi) or 1.0
        ax.set_xlim(max(0.0, lo - pad), hi + pad)
    if len(y):
        lo, hi = float(y.min()), float(y.max())
        pad = 0.15 * (hi - lo) if hi > lo else 0.1 * abs(hi) or 1.0
        ax.set_ylim(max(0.0, lo - 1.5 * pad), hi + pad)
    return log_x


# --------------------------------------------------------------------------------------------
# breakdown


@styled
def breakdown(df: pd.DataFrame, note: str = "") -> Figure:
    """Stacked per-stage step time per config: CPU time, and device time beside it on CUDA.

    On CPU the profiler's device time is the CPU time (``same_as_cpu``), so only one bar is
    drawn per config and the subtitle says why.
    """
    labels = list(dict.fromkeys(df["label"]))
    stages = list(df["stage"].cat.categories) if hasattr(df["stage"], "cat") else sorted(df["stage"].unique())
    has_device = bool((df["device_time_source"] != "same_as_cpu").any())
    n = len(labels)
    fig = _fig(max(8.0, (1.6 if has_device else 1.0) * n + 3.5), 6.5)
    ax = fig.add_subplot()
    pos = _config_axis(ax, labels, horizontal=False)
    kinds = (
        [("cpu_time_ms", -0.2, None), ("device_time_ms", 0.2, "///")] if has_device else [("cpu_time_ms", 0.0, None)]
    )
    width = 0.38 if has_device else 0.6
    step = df.drop_duplicates("label").set_index("label").reindex(labels)["step_time_ms_median"].to_numpy(dtype=float)
    totals: list[tuple[np.ndarray, np.ndarray, str]] = []
    for col, offset, hatch in kinds:
        table = df.pivot_table(index="label", columns="stage", values=col, aggfunc="sum", observed=False)
        table = table.reindex(index=labels, columns=stages).fillna(0.0)
        bottom = np.zeros(n)
        segments = []
        for stage in stages:
            vals = table[stage].to_numpy(dtype=float)
            ax.bar(
                pos + offset,
                vals,
                width,
                bottom=bottom,
                color=STAGE_COLORS.get(stage, "#CCCCCC"),
                hatch=hatch,
                edgecolor="white",
                linewidth=0.6,
                zorder=2,
            )
            segments.append((bottom.copy(), vals))
            bottom += vals
        totals.append((pos + offset, bottom, "" if not has_device else ("CPU " if hatch is None else "GPU ")))
        for seg_bottom, vals in segments:
            for p, b, v in zip(pos + offset, seg_bottom, vals, strict=True):
                if v > 0.07 * max(float(np.nanmax(step)) if np.isfinite(step).any() else 0.0, bottom.max()):
                    ax.text(
                        p,
                        b + v / 2,
                        f"{v:.3g}",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white",
                        fontweight="bold",
                        zorder=3,
                    )
    half = 0.42 if has_device else 0.36
    ax.hlines(step, pos - half, pos + half, colors="black", linestyles="--", lw=1.5, zorder=4)
    top = max(
        [float(t.max(initial=0.0)) for _, t, _ in totals] + [float(np.nanmax(step)) if np.isfinite(step).any() else 0.0]
    )
    for xs, tot, tag in totals:
        for x, t, st in zip(xs, tot, step, strict=True):
            y = max(t, st if np.isfinite(st) else 0.0)
            ax.text(
                x,
                y + 0.01 * top,
                f"{tag}{t:.3g} ms",
                ha="center",
                va="bottom",
                fontsize=9,
                rotation=90 if has_device else 0,
            )
    ax.set_ylim(0, top * (1.3 if has_device else 1.15) if top > 0 else 1)
    ax.set_ylabel("time per step (ms)")
    handles: list[Any] = [Patch(color=STAGE_COLORS.get(s, "#CCCCCC"), label=s) for s in reversed(stages)]
    if has_device:
        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="///", label="GPU kernel time"))
    handles.append(Line2D([], [], color="black", ls="--", label="measured step (median, unprofiled)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.suptitle("Step time by stage" + (f" ({note})" if note else ""))
    if has_device:
        sub = "per profiled step; left bar: CPU time (host, incl. kernel launches), right hatched bar: GPU kernel time"
    else:
        sub = "per profiled step; CPU run: device time = CPU time, so one bar per config"
    _subtitle(ax, sub, "profiler overhead can make the stage sum exceed the measured step")
    return fig


# --------------------------------------------------------------------------------------------
# scaling


def _log2_axis(ax: Axes, values: Sequence[float]) -> None:
    vals = sorted({float(v) for v in values})
    if vals and vals[0] > 0 and vals[-1] / vals[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(vals, [f"{v:g}" for v in vals])
    ax.minorticks_off()


def _scaling_legend(top: Axes, bottom: Axes, frame: pd.DataFrame, n_lines: int) -> None:
    """Few lines: a legend inside the throughput panel; many: a list under the column."""
    handles, names = top.get_legend_handles_labels()
    if not frame["ok"].all():
        handles.append(Line2D([], [], marker="x", color="#333333", ls="none", ms=9, mew=2.5))
        names.append("did not finish (x in the line's colour)")
    if n_lines <= 1 and frame["ok"].all():
        return
    if len(handles) <= 4:
        top.legend(handles, names, fontsize=9, loc="best")
    else:
        bottom.legend(
            handles,
            names,
            fontsize=9,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.2),
            ncols=1,
            frameon=False,
        )


@styled
def scaling(frames_by_axis: dict[str, tuple[pd.DataFrame, str]], mode: str) -> Figure:
    """tokens/s (top) and peak memory (bottom) against batch and/or seq_len, one line per rest."""
    axes_names = list(frames_by_axis)
    ncol = len(axes_names)
    fig = _fig(6.5 * ncol + 2.5, 8.5)
    grid = fig.subplots(2, ncol, squeeze=False, sharex="col")
    all_mem = pd.concat([f["peak_mem_bytes"] for f, _ in frames_by_axis.values()])
    div, unit = bytes_unit(all_mem)
    for c, axis in enumerate(axes_names):
        frame, note = frames_by_axis[axis]
        lines = list(dict.fromkeys(frame["line"]))
        annotate = frame["ok"].sum() <= 16
        for r, (metric, scale) in enumerate((("tokens_per_s", 1.0), ("peak_mem_bytes", div))):
            ax = grid[r][c]
            placed: dict[Any, list[float]] = {}
            y_span = float(np.nanmax(frame[metric])) / scale if frame[metric].notna().any() else 1.0
            for k, line in enumerate(lines):
                color = LINE_COLORS[k % len(LINE_COLORS)]
                g = frame[frame["line"] == line]
                good = g[g["ok"]]
                ax.plot(good["x"], good[metric] / scale, marker="o", color=color, lw=2, ms=6, label=line)
                if annotate:
                    for x, y in zip(good["x"], good[metric] / scale, strict=True):
                        if any(abs(y - other) < 0.05 * y_span for other in placed.setdefault(x, [])):
                            continue  # another line's label is already there
                        placed[x].append(y)
                        text = si(y) if metric == "tokens_per_s" else f"{y:.3g}"
                        ax.annotate(
                            text,
                            (x, y),
                            xytext=(0, 7),
                            textcoords="offset points",
                            ha="center",
                            fontsize=8,
                            color=color,
                        )
                bad = g[~g["ok"]]
                if not bad.empty:
                    tr = blended_transform_factory(ax.transData, ax.transAxes)
                    ax.scatter(
                        bad["x"],
                        np.full(len(bad), 0.03),
                        transform=tr,
                        marker="x",
                        s=80,
                        color=color,
                        linewidths=2.5,
                        zorder=5,
                        clip_on=False,
                    )
                    if annotate:
                        for x, st in zip(bad["x"], bad["status"], strict=True):
                            ax.annotate(
                                STATUS_TEXT.get(st, st),
                                (x, 0.03),
                                xycoords=tr,
                                xytext=(0, 8),
                                textcoords="offset points",
                                ha="center",
                                fontsize=8,
                                color=BAD,
                            )
            ax.set_ylim(bottom=0)
            ax.margins(y=0.15)
            _log2_axis(ax, frame["x"])
            if r == 0:
                ax.yaxis.set_major_formatter(THOUSANDS)
                ax.set_ylabel("throughput (tokens/s)")
                ax.set_title(
                    "\n".join(([f"vs {axis}"] if ncol > 1 else []) + ([textwrap.fill(note, 90)] if note else [])),
                    loc="center",
                    fontsize=12 if not note else 10,
                    fontweight="bold",
                    color="black",
                )
            else:
                what = {"cuda": "peak allocated", "cpu": "peak allocated"}.get(mode, "peak memory")
                ax.set_ylabel(f"{what} ({unit})")
                ax.set_xlabel(
                    {
                        "batch": "batch (sequences per step)",
                        "seq_len": "seq_len (tokens per sequence)",
                    }[axis]
                )
        _scaling_legend(grid[0][c], grid[1][c], frame, len(lines))
    fig.suptitle("Scaling with " + " and ".join(axes_names))
    fig.supxlabel(
        "one line per combination of the other differing axes; x at the bottom edge: did not finish",
        fontsize=9,
        color="#444444",
    )
    return fig


# --------------------------------------------------------------------------------------------
# heatmap


@styled
def heatmap(panels: Sequence[Any], note: str = "") -> Figure:
    """batch x seq_len cells of tokens/s; cells that did not finish say why, cells not run say '-'."""
    k = len(panels)
    ncol = min(3 if panels[0].tokens_per_s.shape[1] <= 6 else 2, k)
    nrow = math.ceil(k / ncol)
    first = panels[0]
    nb, ns = first.tokens_per_s.shape[1], first.tokens_per_s.shape[0]
    cell_w = max(0.7, min(1.4, 8.0 / max(nb, 1)))
    fig = _fig(max(7.0, ncol * (nb * cell_w + 1.5) + 1.5), max(4.5, nrow * (ns * 0.6 + 1.6) + 1.0))
    grid = fig.subplots(nrow, ncol, squeeze=False)
    values = np.concatenate([p.tokens_per_s.to_numpy(dtype=float).ravel() for p in panels])
    finite = values[np.isfinite(values)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#EEEEEE")
    image = None
    small = nb * ns <= 80
    for i, panel in enumerate(panels):
        ax = grid[i // ncol][i % ncol]
        z = panel.tokens_per_s.to_numpy(dtype=float)
        image = ax.imshow(np.ma.masked_invalid(z), origin="lower", cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.grid(False)
        ax.set_xticks(range(z.shape[1]), [str(b) for b in panel.tokens_per_s.columns])
        ax.set_yticks(range(z.shape[0]), [str(s) for s in panel.tokens_per_s.index])
        ax.set_xlabel("batch (sequences per step)")
        ax.set_ylabel("seq_len (tokens)")
        if panel.title:
            ax.set_title(panel.title, fontsize=11, color="black")
        status = panel.status.to_numpy(dtype=object)
        for (r, c), v in np.ndenumerate(z):
            st = status[r, c]
            if np.isfinite(v):
                if small:
                    bright = (v - vmin) / (vmax - vmin or 1) > 0.6
                    ax.text(
                        c,
                        r,
                        si(v),
                        ha="center",
                        va="center",
                        fontsize=10 if nb <= 8 else 9,
                        color="black" if bright else "white",
                        fontweight="bold",
                    )
            elif isinstance(st, str) and st != "ok":
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor="#F6D5D5", edgecolor="white", lw=1.0))
                if small:
                    ax.text(
                        c,
                        r,
                        STATUS_TEXT.get(st, st),
                        ha="center",
                        va="center",
                        fontsize=9,
                        color=BAD,
                        fontweight="bold",
                    )
            elif small:
                ax.text(c, r, "not run", ha="center", va="center", fontsize=8, color="#888888")
        for spine in ax.spines.values():
            spine.set_visible(False)
    for j in range(k, nrow * ncol):
        grid[j // ncol][j % ncol].set_visible(False)
    if image is not None:
        cb = fig.colorbar(image, ax=grid.ravel().tolist(), shrink=0.9, format=THOUSANDS)
        cb.set_label("throughput (tokens/s)")
    fig.suptitle("Throughput over batch x seq_len" + (f"\n({note})" if note else ""))
    return fig


# --------------------------------------------------------------------------------------------
# factors


METRIC_NAMES = {"tokens_per_s": "tokens/s", "peak_mem_bytes": "peak memory"}


@styled
def factors(effects: pd.DataFrame, blocks_note: str = "") -> Figure:
    """Main effects and two-factor interactions as % of the mean, one panel per metric.

    Colour says good or bad for a performance engineer: more tokens/s is green, more memory red.
    """
    metrics = list(dict.fromkeys(effects["metric"]))
    terms = list(dict.fromkeys(effects["term"]))
    fig = _fig(6.0 * len(metrics) + 1.0, max(3.8, 0.65 * len(terms) + 2.6))
    grid = fig.subplots(1, len(metrics), squeeze=False, sharey=True)
    for c, metric in enumerate(metrics):
        ax = grid[0][c]
        e = effects[effects["metric"] == metric].set_index("term").reindex(terms)
        pct = e["effect_pct"].to_numpy(dtype=float)
        better = pct > 0 if metric == "tokens_per_s" else pct < 0
        colors = [to_rgba(GOOD if b else BAD, 0.5 if " x " in t else 1.0) for b, t in zip(better, terms, strict=True)]
        pos = np.arange(len(terms))
        ax.barh(pos, np.nan_to_num(pct), 0.6, color=colors, zorder=2)
        ax.set_yticks(pos, terms)
        ax.set_ylim(len(terms) - 0.5, -0.5)
        ax.axvline(0, color="black", lw=1)
        span = _set_signed_xlim(ax, pct, room=0.75, low_pad=0.1, high_pad=0.1)
        for p, v, absval in zip(pos, pct, e["effect"].to_numpy(dtype=float), strict=True):
            if not np.isfinite(v):
                continue
            if metric == "peak_mem_bytes":
                div, unit = bytes_unit([abs(absval)])
                absolute = f"{absval / div:+.3g} {unit}"
            else:
                absolute = f"{si(absval)} tok/s" if absval < 0 else f"+{si(absval)} tok/s"
            ax.text(
                v + (0.04 * span if v >= 0 else -0.04 * span),
                p,
                f"{v:+.1f}%\n({absolute})",
                va="center",
                ha="left" if v >= 0 else "right",
                fontsize=9,
            )
        ax.grid(axis="y", visible=False)
        ax.set_xlabel(f"effect on {METRIC_NAMES.get(metric, metric)} (% of mean)")
        ax.set_title(
            METRIC_NAMES.get(metric, metric),
            loc="center",
            fontsize=12,
            fontweight="bold",
            color="black",
        )
    fig.suptitle("Factor effects (2-level full factorial, ok runs)")
    fig.supxlabel(
        "effect = mean with the axis on - mean with it off, as % of the overall mean; A x B = "
        "interaction (faded)" + (f"\n{blocks_note}" if blocks_note else ""),
        fontsize=9,
        color="#444444",
    )
    return fig


# --------------------------------------------------------------------------------------------
# loss


@styled
def loss(df: pd.DataFrame, note: str = "") -> Figure:
    """Loss of every measured step, one line per config.

    Configs with the same seed often give identical curves; the first lines are drawn
    widest so that lines on top of each other still show as nested outlines, and the
    subtitle says how far apart the curves are at most.
    """
    fig = _fig(10, 5.5)
    ax = fig.add_subplot()
    labels = list(dict.fromkeys(df["label"]))
    n = len(labels)
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    for k, label in enumerate(labels):
        g = df[df["label"] == label]
        wide = (n - 1 - k) / max(n - 1, 1)  # 1 for the first line, 0 for the last
        ax.plot(
            g["step"],
            g["loss"],
            marker=markers[k % len(markers)],
            ms=4 + 5 * wide,
            lw=1.5 + 5 * wide,
            color=LINE_COLORS[k % len(LINE_COLORS)],
            label=label,
            alpha=0.85,
        )
    spread = df.groupby("step")["loss"].agg(lambda v: v.max() - v.min()).max() if n > 1 else np.nan
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step (warmup steps come first and are not shown)")
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.margins(y=0.2)
    fig.suptitle("Loss over the measured steps" + (f" ({note})" if note else ""))
    _subtitle(
        ax,
        "same seed and data order in every config: curves overlap unless a setting changes numerics",
        f"largest difference between configs at one step: {spread:.3g} nats" if np.isfinite(spread) else "",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


# --------------------------------------------------------------------------------------------
# compare


VERDICT_COLORS = {"faster": GOOD, "slower": BAD, "within noise": BASE}


@styled
def compare(df: pd.DataFrame, name_a: str, name_b: str, note: str = "") -> Figure:
    """Two sweeps side by side per matched config: tokens/s with ranges, and the change in %."""
    n = len(df)
    fig = _fig(13, max(4.5, 0.5 * n + 2.5))
    ax_v, ax_c = fig.subplots(1, 2, sharey=True, width_ratios=[1.3, 1])
    pos = np.arange(n, dtype=float)
    for ax in (ax_v, ax_c):
        ax.grid(axis="y", visible=False)
    ax_v.set_yticks(pos, df["label"].tolist())
    ax_v.set_ylim(n - 0.5, -0.5)
    for col, offset, color, name in (("a", -0.17, BAR, name_a), ("b", 0.17, BASE, name_b)):
        t = df[f"tokens_per_s_{col}"].to_numpy(dtype=float)
        lo = df[f"tokens_per_s_lo_{col}"].to_numpy(dtype=float)
        hi = df[f"tokens_per_s_hi_{col}"].to_numpy(dtype=float)
        err = np.vstack([np.clip(t - lo, 0, None), np.clip(hi - t, 0, None)])
        ok = np.isfinite(t) & np.isfinite(lo) & np.isfinite(hi)
        ax_v.errorbar(
            t[ok],
            pos[ok] + offset,
            xerr=err[:, ok],
            fmt="o",
            color=color,
            ms=7,
            capsize=4,
            elinewidth=1.5,
            label=name,
        )
    ax_v.set_xlim(left=0)
    ax_v.margins(x=0.1)
    ax_v.xaxis.set_major_formatter(THOUSANDS)
    ax_v.set_xlabel("throughput (tokens/s); whisker: p10-p90")
    change = df["change_pct"].to_numpy(dtype=float)
    colors = [VERDICT_COLORS.get(v, BASE) for v in df["verdict"]]
    ax_c.barh(pos, np.nan_to_num(change), 0.6, color=colors, zorder=2)
    ax_c.axvline(0, color="black", lw=1)
    span = _set_signed_xlim(ax_c, change, room=1.2, low_pad=0.05, high_pad=0.6)
    for p, v, verdict in zip(pos, change, df["verdict"], strict=True):
        if np.isfinite(v):
            ax_c.text(
                v + (0.05 * span if v >= 0 else -0.05 * span),
                p,
                f"{v:+.1f}% {verdict}",
                va="center",
                ha="left" if v >= 0 else "right",
                fontsize=9,
            )
        else:
            ax_c.text(0, p, f" {verdict}", va="center", ha="left", fontsize=9, color=BAD)
    ax_c.set_xlabel("change in tokens/s, A vs B (%)")
    handles, labels = ax_v.get_legend_handles_labels()
    handles += [Patch(color=c, label=v) for v, c in VERDICT_COLORS.items()]
    labels += list(VERDICT_COLORS)
    fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), frameon=False)
    fig.suptitle(f"{name_a} vs {name_b}: tokens/s per config" + (f" ({note})" if note else ""))
    _subtitle(ax_v, "within noise: the p10-p90 ranges of the two sweeps overlap")
    return fig


def _set_signed_xlim(ax: Any, values: np.ndarray, room: float, low_pad: float, high_pad: float) -> float:
    """x limits for bars of either sign around 0; returns the data span for placing labels.

    A side with bars gets ``room`` x span for its value labels, a side without bars only
    ``low_pad``/``high_pad`` x span. NaNs are ignored.
    """
    finite = values[np.isfinite(values)]
    lo, hi = (min(0.0, float(finite.min())), max(0.0, float(finite.max()))) if finite.size else (-1.0, 1.0)
    span = (hi - lo) or 1.0
    ax.set_xlim(lo - (room * span if lo < 0 else low_pad * span), hi + (room * span if hi > 0 else high_pad * span))
    return span
