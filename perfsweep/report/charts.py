"""Drawing: a chart is a :class:`ChartSpec` of :class:`Panel` s, and one function per kind of panel
(bars, stacked bars, lines, scatter, heatmap) draws that kind for every chart.

Charts are meant for a slide: a title that says what is plotted, a line above each panel that
says how to read it, units on every value axis (from :mod:`perfsweep.report.fmt`), values on
the marks, and runs that did not finish marked where they would have been. Figures are built
without pyplot, each with its own Agg canvas: no global figure registry to leak in a 10,000-run
report, no display needed, and importing this module never changes the caller's backend (a
notebook keeps its inline plots). Tests inspect the artists; :func:`save` writes the PNG.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib
import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cbook import STEP_LOOKUP_MAP
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.text import Annotation, Text
from matplotlib.ticker import EngFormatter, FuncFormatter, Locator, LogLocator, MaxNLocator, NullFormatter
from matplotlib.transforms import ScaledTranslation, blended_transform_factory

from perfsweep.names import KERNEL_CATEGORIES, STAGES
from perfsweep.report import fmt

DPI = 150
STYLE: dict[str, Any] = {
    "font.size": 11,
    "axes.titlesize": 10,
    "axes.titlecolor": "#444444",
    "axes.titlelocation": "left",
    "figure.titlesize": 15,
    "figure.titleweight": "bold",
    "axes.labelsize": 12,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.alpha": 0.3,
    "savefig.facecolor": "white",
}
DEEP = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")
"""seaborn's 'deep' palette: lines take its colours in order; the named colours below are from it."""
BAR, FRONT, GOOD, BAD, BASE, LIGHT = DEEP[0], DEEP[1], DEEP[2], DEEP[3], DEEP[7], "#9ECAE9"
STAGE_COLORS = dict(zip(STAGES, (DEEP[4], DEEP[0], DEEP[1], DEEP[2], DEEP[5]), strict=True))
KERNEL_COLORS = dict(zip(KERNEL_CATEGORIES, ("#1B3A6B", *(DEEP[i] for i in (6, 9, 5, 0, 8, 4, 7))), strict=True))
BOTTLENECK_COLORS = {"gpu": GOOD, "host": BAD, "data": FRONT}
MEASURED = "measured step (median)"
AXIS_TEXT = {"batch": "batch (sequences per step)", "seq_len": "seq_len (tokens per sequence)"}
BOX = {"boxstyle": "square,pad=0", "facecolor": "white", "edgecolor": "none"}
"""Behind a bar's value: opaque, as a baseline's dashed line showed through the digits of an 80% white one;
no padding, as the text's own spaces keep it off the bar (a padded opaque box bit a notch out of the bar's end)."""
POINT_LABEL = "point-label"
"""gid of a scatter point's name: :func:`_place_labels` moves it, :func:`_fit_texts` leaves it."""
VALUE_LABEL = "value-label"
"""gid of a line's value written at its point: :func:`_place_labels` puts it beside the point or hides it."""
MARKERS, DASHES = "o^Ph*p<>8", ("-", "--", "-.", ":")  # none of REASON_MARKS': a line's v read as "oom"
"""Each line's marker and line style, by its place among its panel's lines: colour alone left a line
that ran exactly under another (amp on and off at the same tokens/s) looking like part of it."""
CROSS = {"marker": "x", "ms": 9, "mew": 2.5, "ls": "none", "clip_on": False, "scaley": False}
FAILED_LABEL = "did not finish:"
"""The legend's words for a run that did not finish, before its reason (one entry per reason)."""
FAILED_MARK = "failed-mark"
"""gid of a run's mark in the band of runs that did not finish."""
REASON_MARKS = {"oom": "v", "failed": "X", "timeout": "D", "interrupted": "s", "skipped": "_"}
"""A failed run's mark in scaling.png, by its status: the shape says why, the colour which line."""


@dataclass(frozen=True)
class Panel:
    """One axes of a chart: which columns it draws and how; their unit follows from their names."""

    y: tuple[str, ...]  # value columns; those the frame lacks are left out, a panel with none is not drawn
    kind: str = "bars"  # bars (a series per y column), stacked, lines (one per group), scatter (Pareto), heatmap
    title: str = ""  # how to read the panel, written above it
    color: Callable[[pd.DataFrame], Sequence[Any]] | None = None  # bars: a colour per row, not per column
    text: Callable[[pd.DataFrame], Sequence[str]] | None = None  # bars: on each bar, or where it is missing
    label: str = ""  # value-axis label (default by unit, fmt.LABELS); the unit is added
    x: str = "x"  # lines, scatter, heatmap: the x column (bars: a bar per row, named by its ``label``)
    group: str = "line"  # lines: one line per value; heatmap: the rows
    colors: dict[str, str] | None = None  # legend name: colour of each y column (default: one unnamed, BAR);
    # lines: of each group (set by draw, so that facets never give one colour two meanings)
    err: tuple[tuple[str, str], ...] = ()  # bars: (low, high) whisker columns of each y column
    err_label: str = "whisker: range over repeats (one run: p90..p10 step)"
    ref: float | None = None  # a fixed line on the value axis (0 for bars of either sign)
    marker: str | None = None  # stacked: a column drawn as a dashed tick across each bar
    baseline: bool = False  # bars: the baseline config's value as a dashed line
    grid_x: bool = False  # lines: x is a grid axis: a tick per value, log2 over 4x, values on the points
    from_zero: bool = True
    xlabel: str = ""
    rate: str = "tokens/s"  # the unit of a throughput column (fmt.RATES): samples/s for models that count samples
    unit = property(lambda self: fmt.unit(self.y[0], self.rate))


def for_rate(spec: ChartSpec, rate: str) -> ChartSpec:
    """``spec`` for a sweep whose throughput is in ``rate``: its panels' unit and every text."""
    if rate == "tokens/s":
        return spec
    panels = tuple(
        replace(p, rate=rate, title=fmt.for_rate(p.title, rate), label=fmt.for_rate(p.label, rate)) for p in spec.panels
    )
    legend = tuple((fmt.for_rate(name, rate), color) for name, color in spec.legend)
    return replace(
        spec,
        panels=panels,
        legend=legend,
        title=fmt.for_rate(spec.title, rate),
        caption=fmt.for_rate(spec.caption, rate),
    )


@dataclass(frozen=True)
class ChartSpec:
    """One chart: when it applies, the frame it is drawn from, its panels, what report.md says.

    ``frame`` returns the frame and a note for the title, or raises ``frames.Skip`` saying why the
    chart does not fit the sweep; ``facts`` of (frame, note, report) fill in the caption's blanks.
    """

    name: str
    title: str
    panels: tuple[Panel, ...]
    frame: Callable[[Any], tuple[pd.DataFrame, str]] | None = None
    facts: Callable[[pd.DataFrame, str, Any], dict[str, str]] = lambda frame, note, report: {}
    facet: str | None = None  # a column (a row, with one panel) of panels per value of this column
    facet_title: str = "{}"
    side_by_side: bool = False  # panels in a row, sharing the configs (bars) or the value axis
    same_scale: bool = False  # side-by-side bar panels of one unit share their value axis too
    legend: tuple[tuple[str, str], ...] = ()  # (name, colour) entries for colours given per row, where used
    caption: str = ""  # report.md's text under the chart, its {blanks} filled by ``facts``


class Scale(NamedTuple):
    """How a panel's values are shown: divided by ``div``, in ``unit``, over ``lo``..``hi``."""

    div: float
    unit: str
    lo: float
    hi: float


def save(fig: Figure, path: Path) -> Path:
    fit_labels(fig)
    _fit_segment_values(fig)
    with rc_context(STYLE):
        fig.savefig(path, dpi=DPI)
    return path


def draw(spec: ChartSpec, frame: pd.DataFrame, note: str = "") -> Figure:
    """The figure of ``spec`` drawn from ``frame``: its panels (and facets) in a grid, one legend."""
    panels = [p for p in spec.panels if any(c in frame for c in p.y)]
    facets = list(dict.fromkeys(frame[spec.facet])) if spec.facet else [None]
    if spec.side_by_side or len(panels) > 1:
        nrow, ncol = (1, len(panels)) if spec.side_by_side else (len(panels), len(facets))
    else:
        nrow, ncol = math.ceil(len(facets) / 2), min(len(facets), 2)
    if panels[0].kind in ("bars", "stacked"):  # bars lie down, a config per row, its name wrapped (config_name)
        lines = max((config_name(s).count("\n") + 1 for s in frame["label"]), default=1) if "label" in frame else 1
        width, height = max(11.0, 4.2 * ncol + 3.0), max(4.5, (0.38 + 0.2 * (lines - 1)) * len(frame) + 2.8)
    else:
        width, height = 6.5 * ncol + 2.5, 4.2 * nrow + 1.8
        if panels[0].kind == "lines" and panels[0].group in frame:  # room for the legend's wrapped names
            names = [config_name(g) for g in dict.fromkeys(frame[panels[0].group])]
            per_row = max(1, int(width // 4.5))
            rows = math.ceil(len(names) / per_row)
            tallest = max((n.count("\n") + 1 for n in names), default=1)
            height += max(0.0, 0.22 * tallest * rows - 0.6)  # a legend row of one-line names fit before
    with rc_context(STYLE):
        fig = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasAgg(fig)  # render with Agg whatever backend the process uses
        grid = fig.subplots(
            nrow,
            ncol,
            squeeze=False,
            sharey=spec.side_by_side,
            sharex="all" if spec.same_scale else "col" if nrow > 1 else False,
        )
        axes = [[grid[0][i]] if spec.side_by_side else list(grid.flat[i * len(facets) :]) for i in range(len(panels))]
        for p, row in zip(panels, axes, strict=True):
            values = frame[[c for c in (*p.y, *sum(p.err, ())) if c in frame]].to_numpy(dtype=float)
            div, unit = fmt.scale(p.unit, values)
            shown = values[np.isfinite(values)] / div
            scale = Scale(div, unit, *((shown.min(), shown.max()) if shown.size else (0.0, 1.0)))
            label = f"{p.label or fmt.LABELS.get(p.unit, '')} ({unit})" if unit else p.label
            drawn = p
            if p.kind == "lines":  # one colour per line across every facet: the legend is shared
                groups = dict.fromkeys(frame[p.group])
                # more lines than DEEP has colours (two panels' 12 lines): tab20's 20, so that no colour
                # names two configs in the one legend
                palette = DEEP if len(groups) <= len(DEEP) else matplotlib.colormaps["tab20"].colors
                drawn = replace(p, colors={g: palette[k % len(palette)] for k, g in enumerate(groups)})
            for ax, facet in zip(row, facets, strict=False):
                sub = frame if facet is None else frame[frame[spec.facet] == facet].reset_index(drop=True)
                image = KINDS[p.kind](ax, sub, drawn, scale)
                heading = spec.facet_title.format(facet) if facet is not None and p is panels[0] else ""
                title = "\n".join(t for t in (heading, p.title) if t)
                ax.set_title(_wrap(title, 9 * width / ncol))  # about the axes' width, not the figure's
                if p.kind != "heatmap":
                    (ax.set_xlabel if p.kind in ("bars", "stacked") else ax.set_ylabel)(_log_note(ax, label, "y"))
                if p.kind == "lines" and (p is panels[-1] or spec.side_by_side):
                    ax.set_xlabel(_log_note(ax, p.xlabel or AXIS_TEXT.get(facet, str(facet))))
            if image is not None:
                bar = fig.colorbar(image, ax=grid.ravel().tolist(), shrink=0.9, label=label)
                _colour_scale(bar, [im.get_array() for ax in grid.flat for im in ax.images])
        for ax in grid.flat[len(panels) * (1 if spec.side_by_side else len(facets)) :]:
            ax.set_visible(False)
        fig.suptitle(_wrap(spec.title + (f" ({note})" if note else ""), 7 * width))
        entries = [(ax, _legend_entries(ax, spec.legend)) for ax in grid.flat if ax.get_visible()]
        names = [name for _, e in entries for name in e]
        if spec.side_by_side and len(names) == len(set(names)) and sum(bool(e) for _, e in entries) > 1:
            _legends_under(fig, [(ax, e) for ax, e in entries if e])  # panels that share no entry: each its own
        elif handles := {name: h for _, e in entries for name, h in e.items()}:
            _legend_below(fig, handles)
    return fig


def _legend_below(fig: Figure, handles: dict[str, Artist]) -> None:
    """One legend under the figure, in as many columns as fit its width: a column count from the
    width alone ran long entries ("baseline process RSS growth during training: 44.5 MiB") off
    both edges of memory.png."""
    renderer = fig.canvas.get_renderer()
    for ncols in range(len(handles), 0, -1):
        legend = fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=ncols, frameon=False)
        if ncols == 1 or legend.get_window_extent(renderer).width <= 0.97 * fig.bbox.width:
            return
        legend.remove()


def _log_note(ax: Axes, label: str, axis: str = "x") -> str:
    """``label`` saying "log scale" when its axis is: with a tick at each grid value only (4, 8, 512),
    nothing else told a reader that the gap from 8 to 512 is six doublings, not 504 sequences."""
    if (ax.get_xscale() if axis == "x" else ax.get_yscale()) != "log":
        return label
    return f"{label[:-1]}, log scale)" if label.endswith(")") else f"{label} (log scale)"


def _legend_entries(ax: Axes, legend: Sequence[tuple[str, str]]) -> dict[str, Artist]:
    """What ``ax`` needs explained: the ``legend`` colours its bars use, then its labelled artists,
    filled marks (bars) before lines and whiskers."""
    used = {to_rgba(p.get_facecolor(), 1.0) for p in ax.patches if p.get_facecolor()[3] > 0}
    entries: dict[str, Artist] = {name: Patch(color=color) for name, color in legend if to_rgba(color) in used}
    labelled = sorted(zip(*ax.get_legend_handles_labels(), strict=True), key=lambda e: not _filled(e[0]))
    entries |= {name: h for h, name in labelled if name not in entries}
    return entries


def _filled(handle: Any) -> bool:
    return isinstance(handle, Patch | BarContainer)


def _legends_under(fig: Figure, entries: Sequence[tuple[Axes, dict[str, Artist]]]) -> None:
    """A legend under each panel, below its axis label, as many columns as fit the panel's width.

    One legend under the whole figure mixed the panels' entries (A and B beside faster and slower),
    so a reader had to work out which panel a colour belongs to. The drop below the axes is the
    height of its tick labels and axis label, measured in a draw; it is fixed in inches, so the
    legend stays under the label however the layout then moves the axes to make room for it.
    """
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax, handles in entries:
        box = ax.get_window_extent(renderer)
        drop = (box.y0 - ax.get_tightbbox(renderer).y0) / fig.dpi + 0.08
        under = ax.transAxes + ScaledTranslation(0.0, -drop, fig.dpi_scale_trans)
        for ncols in range(len(handles), 0, -1):
            kw = {"loc": "upper center", "bbox_to_anchor": (0.5, 0.0), "bbox_transform": under, "frameon": False}
            legend = ax.legend(handles.values(), handles.keys(), ncols=ncols, **kw)
            if ncols == 1 or legend.get_window_extent(renderer).width <= box.width * 1.15:
                break


SEGMENT_VALUE = "segment-value"
"""gid of a stacked segment's value, written on it in white: :func:`_fit_segment_values` keeps it
where it fits."""


def _fit_segment_values(fig: Figure) -> None:
    """Hide each stacked segment's value that is wider than its segment, once the figure is laid out:
    chosen by a share of the panel's largest bar, "4.69" ran past its segment in white and "8.14",
    crossing the y axis, read as "3.14", when panels came to share a wider scale."""
    values = [t for ax in fig.axes for t in ax.texts if t.get_gid() == SEGMENT_VALUE]
    if not values:
        return
    with rc_context(STYLE):
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        for t in values:
            lo, hi = (t.axes.transData.transform((x, 0))[0] for x in t.segment)  # type: ignore[attr-defined]
            t.set_visible(t.get_window_extent(renderer).width + 4 <= hi - lo)


def fit_labels(fig: Figure) -> None:
    """Widen each bar panel's x range until its value labels fit (:func:`_fit_texts`) and move each
    scatter point's name and each line's values clear of the others (:func:`_place_labels`). Both need
    the laid-out axes, a draw of their own, so they run when a figure is saved, not for one only looked at."""
    axes = [ax for ax in fig.axes if ax.get_visible() and any(not t.get_in_layout() for t in ax.texts)]
    if axes:
        with rc_context(STYLE):
            fig.draw_without_rendering()  # lays the axes out: their width in pixels is known from here
            for ax in axes:
                _fit_texts(ax)
                _place_labels(ax)


def _fit_texts(ax: Axes, pad_px: float = 8.0) -> None:
    """Widen the x range until every value label written at a bar's end fits inside the axes.
    A fixed share of the range was kept for labels before, so a long label ("-31 (-8.3%, 95% CI
    -9.4 to -7.1%)") ran over the axis and its tick labels, and a lopsided range (+5,900% beside
    -98%) kept room for neither. The room a label needs is its width in pixels, a share of the
    axes' width; as the range grows the same label covers more of it, hence the few rounds."""
    renderer = ax.figure.canvas.get_renderer()
    width_px = ax.get_window_extent(renderer).width
    texts = [t for t in ax.texts if not t.get_in_layout() and t.get_text() and t.get_gid() is None]  # _write's
    ends = [
        (t.get_position()[0], t.get_window_extent(renderer).width + pad_px, t.get_horizontalalignment()) for t in texts
    ]
    if not ends or width_px <= 0:
        return
    lo, hi = ax.get_xlim()
    share = sum(max((w for _, w, ha in ends if ha == side), default=0.0) for side in ("left", "right")) / width_px
    if share > 0.7:  # labels about as wide as the axes: the bars keep 30% of it, the labels run past its edge
        ends = [(x, w * 0.7 / share, ha) for x, w, ha in ends]
    for _ in range(12):
        span = (hi - lo) / width_px  # data units per pixel
        hi = max([hi, *(x + w * span for x, w, ha in ends if ha == "left")])  # a list: one side may have none
        lo = min([lo, *(x - w * span for x, w, ha in ends if ha == "right")])
    ax.set_xlim(lo, hi)


def _place_labels(ax: Axes) -> None:
    """Give each scatter point's name and each line's value the first spot around its point (:func:`_spots`)
    that covers no label placed before it, no mark (at its drawn size: the baseline's ring reaches
    7 pt from its point, not the 5 pt once assumed) and no line (the front's staircase, the other lines), and stays
    inside the axes; failing that, the spot that covers least. A label that would still cover an
    earlier one is hidden (they come in order of priority, and report.md has every figure), and so
    is one that would leave the axes (over the panel's title, off the figure, over the ticks), lie
    nearer another point than its own (:data:`ASTRAY_MARGIN_PT`), or, for a value, lie on a mark or a
    line, where it reads as another point's. Names alternating above and below their points were not enough: two
    configs close in memory and throughput were written over each other; values written 7 pt above
    their points covered the values and marks of lines a few % above ("16.8k" over "15.4k").
    """
    labels = [t for t in ax.texts if t.get_gid() in (POINT_LABEL, VALUE_LABEL)]
    if not labels:
        return
    renderer, inside, px = ax.figure.canvas.get_renderer(), ax.get_window_extent(), ax.figure.dpi / 72
    marks, paths = _marks(ax)
    placed = [t.get_window_extent(renderer) for t in ax.texts if t not in labels and t.get_text().strip()]
    page = ax.figure.bbox
    # what a name beside the axes must not cover: the ticks' values and the axis labels
    furniture = [
        a.get_window_extent(renderer)
        for a in (*ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label, ax.yaxis.label)
        if a.get_visible() and a.get_text().strip()
    ]
    for t in labels:
        value = t.get_gid() == VALUE_LABEL
        own = np.hypot(*(marks[:, :2] - ax.transData.transform(t.xy)).T) <= px  # its point, and any drawn on it
        best: tuple[tuple[int, int], tuple[float, float, str, str]] | None = None
        for spot in _spots(t.get_ha() == "right", value):
            t.xyann, (ha, va) = spot[:2], spot[2:]
            t.set(ha=ha, va=va)
            box = text_box(t, renderer)
            near = np.hypot(
                np.fmax(box.x0 - marks[:, 0], marks[:, 0] - box.x1).clip(0),
                np.fmax(box.y0 - marks[:, 1], marks[:, 1] - box.y1).clip(0),
            )
            covered = 2 * int((near < marks[:, 2] + px).sum()) + sum(_crosses(box, path, w + px) for path, w in paths)
            fits = inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
            gap = near - marks[:, 2]  # from the label to each mark's edge
            # another point at least as near as its own: the label reads as that point's
            others = gap[~own].min(initial=np.inf)
            astray = own.any() and others < gap[own].min() + ASTRAY_MARGIN_PT * px
            # a name may stand beside the axes, not over the ticks' values or off the figure (it ran over
            # "100k" and past the figure's edge), nor above or below them (titles, the x axis); a value
            # must stay inside (over the panel's title, it read as the panel's)
            legible = fits or (
                not value
                and page.x0 <= box.x0
                and box.x1 <= page.x1
                and inside.y0 <= box.y0
                and box.y1 <= inside.y1
                and not any(box.overlaps(b) for b in furniture)
            )
            clash = sum(box.overlaps(b) for b in placed) + (not legible) + (value and covered > 0)
            # a name nearer another point gets a leader line to its own; a value is hidden
            cost = (100 * clash + 50 * astray + covered + 10 * (not fits), clash + (value and astray), astray)
            if best is None or cost < best[0]:
                best = (cost, spot)
            if cost[0] == 0:
                break
        assert best is not None
        t.xyann, (ha, va) = best[1][:2], best[1][2:]
        t.set(ha=ha, va=va, visible=best[0][1] == 0)
        if t.arrow_patch is not None:
            t.arrow_patch.set_visible(t.get_visible() and bool(best[0][2]))
        if t.get_visible():
            placed.append(text_box(t, renderer))


def text_box(t: Text, renderer: Any) -> Any:
    """Where ``t``'s text is drawn, in pixels: an annotation's own extent also holds its leader line,
    hidden or not, which would have counted as text covering the point it leads to."""
    if isinstance(t, Annotation):
        t.update_positions(renderer)
    return Text.get_window_extent(t, renderer)


LEADER = {"arrowstyle": "-", "color": "#777777", "lw": 0.8, "shrinkA": 2, "shrinkB": 6}
"""The line from a point's name to its point, where the name could only go nearer another point."""

ASTRAY_MARGIN_PT = 1.5
"""How much nearer (points) a label must be to its own point than to any other: at equal distance
(5.6 px either side) a name read as the neighbour's."""


def _marks(ax: Axes) -> tuple[np.ndarray, list[tuple[np.ndarray, float]]]:
    """What a label must not cover, in pixels: every mark (scatter points, a line's markers) as x, y and
    its radius, and every drawn line as its path and half its width."""
    px, marks, paths = ax.figure.dpi / 72, [], []
    for c in ax.collections:
        xy = c.get_offset_transform().transform(c.get_offsets()) if len(c.get_offsets()) else np.empty((0, 2))
        sizes, widths = np.resize(c.get_sizes(), len(xy)), np.resize(c.get_linewidths(), len(xy))
        marks.append(np.c_[xy, (np.sqrt(sizes) + widths) / 2 * px])
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.c_[line.get_xdata(), line.get_ydata()].astype(float))
        if line.get_marker() not in (None, "", " ", "None", "none"):
            marks.append(np.c_[xy, np.full(len(xy), (line.get_markersize() + line.get_markeredgewidth()) / 2 * px)])
        if line.get_linestyle() not in ("None", "none", "", " ") and len(xy) > 1:
            paths.append(
                (
                    np.column_stack(STEP_LOOKUP_MAP[line.get_drawstyle() or "default"](*xy.T)),
                    line.get_linewidth() / 2 * px,
                )
            )
    points = np.asarray(np.concatenate(marks)) if marks else np.empty((0, 3))  # plain: a log axis gives masked arrays
    return points[np.isfinite(points).all(axis=1)], paths


def _crosses(box: Any, path: np.ndarray, pad: float) -> bool:
    """Whether a line through ``path``'s vertices (pixels) passes within ``pad`` of ``box``: the
    segments, sampled every pixel or so, so a steep one between two points far apart is caught."""
    a, b = path[:-1], path[1:]
    ok = np.isfinite(a).all(axis=1) & np.isfinite(b).all(axis=1)
    a, b = a[ok], b[ok]
    steps = np.ceil(np.hypot(*(b - a).T).max(initial=0.0)) + 1
    at = np.linspace(0.0, 1.0, int(min(steps, 4000)) + 1)[:, None, None]
    xy = (a + at * (b - a)).reshape(-1, 2)
    return bool(
        (
            (box.x0 - pad < xy[:, 0])
            & (xy[:, 0] < box.x1 + pad)
            & (box.y0 - pad < xy[:, 1])
            & (xy[:, 1] < box.y1 + pad)
        ).any()
    )


def _spots(left: bool, value: bool = False) -> list[tuple[float, float, str, str]]:
    """Offsets (points) and alignments of a point's name, nearest first, on the ``left`` side first;
    of a line's ``value``: above its point, below it, then at its corners."""
    if value:
        corners = (
            (dx, dy, ha, va)
            for dy, va in ((7.0, "bottom"), (-7.0, "top"))
            for dx, ha in ((8.0, "left"), (-8.0, "right"))
        )
        return [(0.0, 7.0, "center", "bottom"), (0.0, -7.0, "center", "top"), *corners]
    side = [(-8.0, "right"), (8.0, "left")]
    near, far = side if left else side[::-1]
    return [
        *((dx, dy, ha, va) for dx, ha in (near, far) for dy, va in ((5.0, "bottom"), (-5.0, "top"))),
        (0.0, 10.0, "center", "bottom"),
        (0.0, -10.0, "center", "top"),
        *((dx, dy, ha, va) for dx, ha in (near, far) for dy, va in ((18.0, "bottom"), (-18.0, "top"))),
    ]


def _wrap(text: str, width: float) -> str:
    return "\n".join(textwrap.fill(line, int(width)) for line in text.splitlines())


LABEL_WIDTH = 40
"""Characters per line of a config's name on a chart: a longer one is wrapped between its settings.
A report over several sweeps named each config by eight settings (about 100 characters), and
its bars were slivers beside them."""


def config_name(label: object) -> str:
    """``label`` wrapped at :data:`LABEL_WIDTH`, between its ``key=value`` settings."""
    return textwrap.fill(str(label), LABEL_WIDTH, break_long_words=False, break_on_hyphens=False)


def _categories(ax: Axes, labels: pd.Series) -> np.ndarray:
    """Positions of the configs and their tick labels, the first on top."""
    pos = np.arange(len(labels), dtype=float)
    ax.set(yticks=pos, yticklabels=[config_name(s) for s in labels], ylim=(len(pos) - 0.5, -0.5))
    ax.grid(axis="y", visible=False)
    return pos


def _write(ax: Axes, at: float, x: float, text: str, **kw: Any) -> None:
    """``text`` at the end of the bar of value ``x`` at position ``at``."""
    # out of the layout: the axes get their full width, then _fit_texts widens the range for the text
    ax.text(x, at, f" {text} ", ha="left" if x >= 0 else "right", va="center", fontsize=9, in_layout=False, **kw)


def _limits(ax: Axes, lo: float, hi: float, margin: float = 0.05) -> None:
    """From 0 (or below, for negative values) to a ``margin`` past the largest value (room for
    labels is :func:`_fit_texts`'s); an axis shared with another panel keeps covering that
    panel's values too."""
    lo, hi = min(0.0, lo), max(0.0, hi)
    span, now = (hi - lo) or 1.0, ax.get_xlim()
    ax.set_xlim(min(now[0], lo - margin * span if lo < 0 else 0.0), max(now[1], hi + margin * span))


def bars(ax: Axes, df: pd.DataFrame, p: Panel, s: Scale) -> None:
    """A bar per row and y column with its value written on it, whiskers, the baseline's value as a
    dashed line, and where a bar is missing, why (OOM, FAILED, ... or the panel's text)."""
    pos = _categories(ax, df["label"])
    cols = [c for c in p.y if c in df]
    status = df["status"].where(df["status"] != "ok", "").str.upper() if "status" in df else [""] * len(df)
    base = df["is_baseline"].to_numpy(dtype=bool) if p.baseline else np.zeros(len(df), bool)
    for k, col in enumerate(cols):
        n, width = p.y.index(col), 0.8 / len(cols)
        at, v = pos + (k - (len(cols) - 1) / 2) * width, df[col].to_numpy(dtype=float) / s.div
        end = v  # where the bar's text goes: past its whisker, if any
        name, color = list(p.colors.items())[n] if p.colors else (None, BAR)
        # colours by row (whose legend is the chart's): none where there is no value (a config that did
        # not finish), whose zero-length bar in the faster colour listed that colour for a chart of none
        rows = [c if np.isfinite(x) else "none" for c, x in zip(p.color(df), v, strict=True)] if p.color else color
        ax.barh(at, np.nan_to_num(v), width * 0.85, color=rows, label=name, zorder=2)
        if n < len(p.err):
            lo, hi = (df[c].to_numpy(dtype=float) / s.div for c in p.err[n])
            ok = np.isfinite(v) & np.isfinite(lo) & np.isfinite(hi)
            end = np.where(v < 0, np.fmin(v, lo), np.fmax(v, hi))  # the text goes past the whisker, either way
            err = np.vstack([v - lo, hi - v]).clip(0)[:, ok]
            ax.errorbar(v[ok], at[ok], xerr=err, fmt="none", ecolor="#222222", capsize=4, zorder=3, label=p.err_label)
        texts = p.text(df) if p.text else [fmt.si(x) if np.isfinite(x) else st for x, st in zip(v, status, strict=True)]
        for a, x, e, text in zip(at, v, end, texts, strict=True):
            if np.isfinite(x):
                _write(ax, a, e, text, fontweight="bold" if len(cols) == 1 else "normal", bbox=BOX)
            elif text and k == 0:
                _write(ax, a, 0.0, text, color=BAD, fontweight="bold")
        if base.any() and np.isfinite(v[base][0]):
            what, line = f"baseline{f' {name}'.split(' (')[0] if len(cols) > 1 else ''}", "--" if k == 0 else ":"
            ax.axvline(v[base][0], color="#555555", ls=line, zorder=1, label=f"{what}: {fmt.si(v[base][0])} {s.unit}")
    if p.ref is not None:
        ax.axvline(p.ref / s.div, color="#444444", ls="--" if p.ref else "-", lw=1)
    _limits(ax, s.lo, s.hi)
    if p.unit == p.rate:
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))


def stacked(ax: Axes, df: pd.DataFrame, p: Panel, s: Scale) -> None:
    """The y columns stacked per row, large segments labelled, the total (and the ``marker``
    column, e.g. the measured step, as a dashed tick) at the end of each bar."""
    pos, end, segments = _categories(ax, df["label"]), np.zeros(len(df)), []
    for col, (name, color) in zip(p.y, (p.colors or {}).items(), strict=True):
        if col in df:
            v = np.nan_to_num(df[col].to_numpy(dtype=float) / s.div)
            ax.barh(pos, v, 0.6, end, color=color, label=name, edgecolor="white", zorder=2)
            segments, end = [*segments, (end, v)], end + v
    mark = df[p.marker].to_numpy(dtype=float) / s.div if p.marker else np.full(len(df), np.nan)
    top = float(np.max(np.fmax(end, np.nan_to_num(mark)), initial=1e-9))
    for start, v in segments:
        for i in np.flatnonzero(v > 0):  # each kept only where it fits its segment (_fit_segment_values)
            kw = {"ha": "center", "va": "center", "fontsize": 8, "color": "white", "gid": SEGMENT_VALUE}
            t = ax.text(start[i] + v[i] / 2, pos[i], f"{v[i]:.3g}", **kw)
            t.segment = (start[i], start[i] + v[i])  # type: ignore[attr-defined]
    if p.marker:
        ax.vlines(mark, pos - 0.42, pos + 0.42, colors="black", linestyles="--", lw=1.5, zorder=4, label=MEASURED)
    for at, total, m in zip(pos, end, mark, strict=True):
        text = f"{total:.3g}" + (f" of {m:.3g}" if np.isfinite(m) else "") + f" {s.unit}"
        _write(ax, at, max(total, np.nan_to_num(m)), text)
    _limits(ax, 0.0, top)


def lines(ax: Axes, df: pd.DataFrame, p: Panel, s: Scale) -> None:
    """One line per ``group``, the first widest and each with its own marker and dashes
    (:data:`MARKERS`) so that lines on top of each other still show; runs that did not finish are
    a mark in their line's colour in a band under the axis's 0, shaped by reason, side by side where
    several fail at one x, with the reasons under them (:func:`_failures`). With few points, each value is written at
    its point, once per value and place; :func:`_place_labels` moves it clear when saved."""
    y, ok = p.y[0], df["ok"] if "ok" in df else df[p.y[0]].notna()
    groups, written, failed = list(dict.fromkeys(df[p.group])), set(), {}
    for k, group in enumerate(groups):
        color = (p.colors or {}).get(group, DEEP[k % len(DEEP)])
        wide = (len(groups) - 1 - k) / max(len(groups) - 1, 1)
        good, bad = df[(df[p.group] == group) & ok], df[(df[p.group] == group) & ~ok]
        style = {"marker": MARKERS[k % len(MARKERS)], "ls": DASHES[k % len(DASHES)], "lw": 1.5 + 4 * wide}
        ax.plot(good[p.x], good[y] / s.div, ms=4 + 5 * wide, color=color, alpha=0.85, label=config_name(group), **style)
        for x, v in zip(good[p.x], good[y] / s.div, strict=True):
            if p.grid_x and ok.sum() <= 16 and (x, fmt.si(v)) not in written:
                written.add((x, fmt.si(v)))
                kw = {"textcoords": "offset points", "ha": "center", "va": "bottom", "fontsize": 8, "color": color}
                ax.annotate(fmt.si(v), (x, v), (0, 7), gid=VALUE_LABEL, in_layout=False, **kw)
        for x, status in zip(bad[p.x], bad["status"], strict=True):
            failed.setdefault(x, []).append((status, color))
    if failed:  # their x in the axis's range (their marks, shifted apart, are not data to autoscale by)
        ax.update_datalim(np.c_[list(failed), np.zeros(len(failed))], updatey=False)
    if p.grid_x:
        xs = sorted(df[p.x].unique())
        if xs[0] > 0 and xs[-1] / xs[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(x=0.08, y=0.15)
    if p.from_zero:  # the margin above the top point is 15% of 0..top: the data's own span left no room for its value
        top = ax.dataLim.y1
        ax.set_ylim(0, top * 1.15 if np.isfinite(top) and top > 0 else None)
    if p.unit == p.rate:
        ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    if failed:
        _failures(ax, failed)


class _NotBelowZero(Locator):
    """``base``'s ticks at 0 and above."""

    def __init__(self, base: Locator) -> None:
        self.base = base

    def set_axis(self, axis: Any) -> None:
        super().set_axis(axis)
        self.base.set_axis(axis)

    def __call__(self) -> list[float]:
        return [t for t in self.base() if t >= 0]

    def tick_values(self, vmin: float, vmax: float) -> list[float]:
        return [t for t in self.base.tick_values(vmin, vmax) if t >= 0]


FAILED_BAND = 0.16
"""Height of the band under 0 that holds the runs that did not finish, as a share of the axis above 0."""


def _failures(ax: Axes, failed: dict[Any, list[tuple[str, str]]]) -> None:
    """The runs that did not finish, by x: a mark per run in its line's colour, side by side and
    centred on their x, in a band under the axis's 0; its shape says why (:data:`REASON_MARKS`,
    in the legend) and the reasons are written once under them. Drawn at 3% of the axes' height
    before, they sat among real low values (226 tokens/s beside 24k), a line ran through them,
    several at one x covered each other; with one mark and the reasons joined ("FAILED/OOM") under
    all of them, which line failed and which ran out of memory was not said."""
    lo, hi = ax.get_ylim()
    band = FAILED_BAND * (hi - max(lo, 0.0))
    ax.set_ylim(-band, hi)
    ax.axhspan(-band, 0, color=BAD, alpha=0.08, lw=0, zorder=0)
    ax.axhline(0, color="#888888", lw=0.8, zorder=1)
    ax.yaxis.set_major_locator(_NotBelowZero(ax.yaxis.get_major_locator()))  # the band is no scale
    order = list(REASON_MARKS)
    for x, runs in failed.items():
        runs = sorted(runs, key=lambda r: order.index(r[0]) if r[0] in order else len(order))  # a reason's together
        for j, (status, color) in enumerate(runs):
            beside = ax.transData + _beside(ax, j, len(runs))
            ax.plot(x, -0.62 * band, transform=beside, **_reason_mark(status, color), gid=FAILED_MARK)
        reasons = "/".join(dict.fromkeys(status.upper() for status, _ in runs))
        kw = {"textcoords": "offset points", "fontsize": 7, "ha": "center", "va": "top", "color": BAD}
        ax.annotate(reasons, (x, -0.62 * band), (0, -8), **kw)
    # the legend's marks in black: in the last failing line's colour one read as "batch=512 did not
    # finish"; in grey, as the eighth line's
    for status in dict.fromkeys(s for runs in failed.values() for s, _ in sorted(runs)):
        ax.plot([], [], **_reason_mark(status, "black"), label=f"{FAILED_LABEL} {status}", in_layout=False)


def _beside(ax: Axes, j: int, n: int) -> ScaledTranslation:
    """The shift of the ``j``-th of ``n`` marks at one x, side by side and centred on it (one mark
    had covered the others)."""
    return ScaledTranslation((j - (n - 1) / 2) * CROSS["ms"] * 1.3 / 72, 0, ax.figure.dpi_scale_trans)


def _reason_mark(status: str, color: str) -> dict[str, Any]:
    shape = REASON_MARKS.get(status, "x")
    if shape in ("x", "_"):  # drawn by its edge alone
        return {**CROSS, "marker": shape, "color": color}
    if shape == "X":
        return {**CROSS, "marker": shape, "color": color, "mew": 0.8, "mec": "white"}
    return {**CROSS, "marker": shape, "color": color, "ms": 9 if shape == "v" else 7.5, "mew": 0.8, "mec": "white"}


def scatter(ax: Axes, df: pd.DataFrame, p: Panel, s: Scale, max_labels: int = 8) -> None:
    """``y`` against ``x`` (bytes) for the ok runs, the Pareto front (``on_front``) as a staircase,
    the baseline ringed, and the runs that did not finish as an x on the bottom edge, at the memory they
    had reached (one with no memory figure has no place on this axis: the legend counts it). Each
    axis is logarithmic where its values span more than 20x."""
    y, ok, bad = p.y[0], df[df["ok"] & df[p.x].notna()], df[~df["ok"]]
    div, unit = fmt.scale("bytes", df[p.x])
    size = 60 if len(ok) <= 50 else 25 if len(ok) <= 1000 else 8
    front, rest, base = ok[ok["on_front"]].sort_values(p.x), ok[~ok["on_front"]], ok[ok["is_baseline"]]
    ax.scatter(rest[p.x] / div, rest[y], s=size, color=BAR, alpha=0.6 if len(ok) > 50 else 0.9, label="config")
    ax.step(front[p.x] / div, front[y], where="post", color=FRONT, lw=1.5, zorder=3)
    ring, big = {"edgecolor": "black", "zorder": 4}, max(size, 40)
    ax.scatter(front[p.x] / div, front[y], s=big * 1.6, color=FRONT, **ring, label=f"Pareto front ({len(front)})")
    ax.scatter(base[p.x] / div, base[y], s=big * 2.4, facecolor="none", lw=1.5, **ring, label="baseline")
    xs = pd.concat([ok[p.x], bad[p.x]]).dropna() / div
    log = bool(len(xs) and xs.min() > 0 and xs.max() / xs.min() > 20)  # else the lean end is squashed
    ax.set_xscale("log" if log else "linear")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    # the same for tokens/s: 226 to 24k on a linear axis put four configs' points, and their names, in a heap
    # on the bottom edge, where a name could only go next to a neighbour's point
    ys = ok[y].dropna()
    log_y = bool(len(ys) and ys.min() > 0 and ys.max() / ys.min() > 20)
    ax.set_yscale("log" if log_y else "linear")
    if log_y:  # 1k and 10k alone left the lean points (226, 355, 705 tokens/s) with no tick near them
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.margins(0.1)
    if not log_y:
        ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]))
    ax.set_xlabel(f"peak memory, allocated ({unit}{', log scale' if log else ''})")
    # names in order of priority, for _place_labels: the baseline, the front fastest first, the rest
    named = pd.concat([base, front.sort_values(y, ascending=False), ok.sort_values(y, ascending=False)])
    named = named.drop_duplicates("id")
    if len(ok) > max_labels:  # a crowd: only the baseline and the front are named
        named = named[named["is_baseline"] | named["on_front"]].head(max_labels + len(base))
    middle = np.sqrt(xs.min() * xs.max()) if log else (xs.min() + xs.max()) / 2 if len(xs) else 0.0
    # each named by what tells it from every config of the chart, not from the named ones alone: in a
    # report of five sweeps the baseline was "batch=4 sweep=1", and sweep 1 had four batch=4 configs
    for (_, r), text in zip(named.iterrows(), named["label"], strict=True):
        right, weight = r[p.x] / div > middle, "bold" if r["on_front"] else "normal"
        ha, kw = "right" if right else "left", {"fontsize": 9, "fontweight": weight, "in_layout": False}
        x, dy = (-8 if right else 8), 5  # moved clear of other names and points when saved (_place_labels)
        name = ax.annotate(
            config_name(text),
            (r[p.x] / div, r[y]),
            (x, dy),
            "data",
            "offset points",
            ha=ha,
            va="bottom",
            gid=POINT_LABEL,
            arrowprops=LEADER,
            **kw,
        )
        name.arrow_patch.set_visible(False)  # shown where the name had to go nearer another point (_place_labels)
    if len(bad):
        _unfinished_on_edge(ax, bad[p.x] / div, bad["status"])


def _unfinished_on_edge(ax: Axes, x: pd.Series, status: pd.Series) -> None:
    """Runs that did not finish as marks on the bottom edge at the memory they had reached, shaped
    by reason as in scaling.png (:data:`REASON_MARKS`), side by side where they reached the same
    memory (one x covered the others), a legend entry per reason; one with no memory figure has no
    place on this axis and is counted in its entry. Out of the layout: a legend entry with no mark
    sat at the figure's origin and pushed the axes up."""
    edge = blended_transform_factory(ax.transData, ax.transAxes)
    at = x.dropna().value_counts().to_dict()  # runs at each memory figure
    if at:  # in the axis's range: marks shifted apart are not autoscaled by
        ax.update_datalim(np.c_[list(at), np.ones(len(at))], updatey=False)
        ax.autoscale_view(scaley=False)
    seen: dict[float, int] = {}
    for reason, xs in x.groupby(status, sort=False):
        unplaced = int(xs.isna().sum())
        label = f"{FAILED_LABEL} {len(xs)} {reason}"
        label += f" ({'' if unplaced == len(xs) else f'{unplaced} '}not drawn: no memory figure)" if unplaced else ""
        ax.plot([], [], **_reason_mark(str(reason), BAD), label=label, in_layout=False)
        for v in xs.dropna():
            j, seen[v] = seen.get(v, 0), seen.get(v, 0) + 1
            mark = _reason_mark(str(reason), BAD)
            ax.plot([v], [0.03], transform=edge + _beside(ax, j, at[v]), **mark, in_layout=False, gid=FAILED_MARK)


def _colour_scale(bar: Any, panels: list[Any]) -> None:
    """Ticks at the lowest and highest values shown and round values between: the bar's scale runs
    from the lowest value, not 0, and with round ticks alone the darkest colour had no value. The
    values are the cells', not the bar's ends: a scale widened around one value (all cells equal)
    has ends no run had. Every panel's cells (``panels``): the bar is theirs, and with the last one's
    alone the darkest colour, in another panel, had no value again. One tick per written value:
    cells 0.01% apart wrote "12.3k" at both ends, as if the scale ran from a value to itself; cells
    that write alike (:func:`fmt.alike`) are one colour (:func:`heatmap`), and that value's tick."""
    cells = np.concatenate([np.ma.masked_invalid(np.ma.asarray(a, dtype=float)).compressed() for a in panels])
    if not len(cells):
        return
    lo, hi = float(cells.min()), float(cells.max())
    gap = 0.1 * (hi - lo)  # an inner tick this near an end would print over the end's value
    ticks = {fmt.si(lo): lo}
    if not fmt.alike(lo, hi):
        for t in [hi, *(t for t in bar.get_ticks() if lo + gap < t < hi - gap)]:  # the ends first
            ticks.setdefault(fmt.si(t), t)
    bar.set_ticks(sorted(ticks.values()))
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt.si(v)))  # as the cells write them: 38k


def heatmap(ax: Axes, df: pd.DataFrame, p: Panel, s: Scale) -> Any:
    """``y`` over ``group`` (rows) x ``x`` (columns) on one colour scale for all panels; a cell
    that did not finish is red and says why, a cell never run says so. Cells that all write alike
    (:func:`fmt.alike`: 12.3k) get one colour: 0.01% apart, they had been drawn darkest and
    brightest, a difference the chart's own numbers did not show."""
    z = df.pivot(index=p.group, columns=p.x, values=p.y[0]).astype(float)
    status = df.pivot(index=p.group, columns=p.x, values="status").to_numpy()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#EEEEEE")
    lo, hi = (s.lo, s.lo) if fmt.alike(s.lo, s.hi) else (s.lo, s.hi)
    image = ax.imshow(np.ma.masked_invalid(z), origin="lower", cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
    ax.set(xticks=range(z.shape[1]), xticklabels=z.columns, xlabel=AXIS_TEXT.get(p.x, p.x))
    ax.set(yticks=range(z.shape[0]), yticklabels=z.index, ylabel=AXIS_TEXT.get(str(p.group), p.group))
    ax.grid(False)
    ax.spines[:].set_visible(False)
    for (r, c), v in np.ndenumerate(z.to_numpy()):
        if np.isfinite(v):
            text, color = fmt.si(v), "black" if hi > lo and (v - lo) / (hi - lo) > 0.6 else "white"
        elif isinstance(status[r, c], str):
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor="#F6D5D5", edgecolor="white"))
            text, color = status[r, c].upper(), BAD
        else:
            text, color = "not run", "#888888"
        if z.size <= 80:
            ax.text(c, r, text, ha="center", va="center", fontsize=9, color=color, fontweight="bold")
    return image


KINDS: dict[str, Callable[..., Any]] = {f.__name__: f for f in (bars, stacked, lines, scatter, heatmap)}
