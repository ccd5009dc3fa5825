"""Data shaping for the report: plain pandas, no drawing, so tests can check every number.

Every chart is drawn from a frame built here. The frames keep the database's column names
(units in the names) and add only columns whose names say what they are; derived figures come
from :mod:`perfsweep.metrics` or are read as stored (the noise flag, the speedup intervals),
never from a formula here. A chart that does not fit the data raises :class:`Skip` with the reason.

The charts and the results table show one row per *config* (:func:`perfsweep.configs.per_config`:
a config's repeats as one); runs.csv keeps one row per run.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from perfsweep import metrics
from perfsweep.configs import STATUS_ORDER, axis_name, axis_text, config_labels, label_axes
from perfsweep.names import (
    DEVICE_TIME_BEFORE_LAUNCH,
    DEVICE_TIME_SAME_AS_CPU,
    KERNEL_CATEGORIES,
    ON_OFF_AXES,
    STAGES,
)
from perfsweep.report import fmt
from perfsweep.results import load_child

TOP_DETAIL = 8
"""Most configs in the stage breakdown and loss charts, which need a query per chart."""


class Skip(Exception):
    """A chart does not fit this sweep; the message is the reason shown in report.md."""


# --------------------------------------------------------------------------------------------
# which configs a chart shows, and their labels


def relabel(subset: pd.DataFrame, full_axes: Sequence[str], unique: bool = True) -> tuple[pd.Series, str]:
    """Shorter labels for a subset of configs: only the axes that still differ within it, and the
    values it shares (e.g. ``"model=small"``) for a title, so 30 bars do not each repeat them."""
    if len(subset) < 2:
        return subset["label"], ""
    axes = [a for a in label_axes(subset) if a in full_axes or a == "sweep_id"]
    shared = " ".join(axis_text(a, subset[a].iloc[0]) for a in full_axes if a not in axes and a in subset)
    return config_labels(subset, axes or full_axes, unique), shared


def top_configs(configs: pd.DataFrame, pool: pd.DataFrame, n: int) -> tuple[pd.DataFrame, str]:
    """At most ``n`` configs of ``pool`` for a chart: all of them, or the fastest plus the baseline.

    Returns the rows and a note for titles ("" when nothing was left out). Sweep order is kept
    when everything fits, so the bars line up with the terminal summary; a cut subset is
    relabelled by what differs within it, and the note says what all of it shares.
    """
    if len(pool) <= n:
        return pool, ""
    fastest = pool[pool["ok"]].sort_values("throughput_per_s", ascending=False, kind="stable").head(n)
    base = pool[pool["is_baseline"] & ~pool.index.isin(fastest.index)]
    chosen = pd.concat([fastest, base])
    labels, shared = relabel(chosen, label_axes(configs))
    # as many as are drawn ("top 30" had stood over 26 bars), and those that did not finish, which the
    # cut leaves out wherever they stand, said
    note = f"the {len(fastest)} fastest of {len(configs):,} configs by tokens/s" + (
        " and the baseline" if len(base) else ""
    )
    if unfinished := int((~pool["ok"]).sum()):
        note += f"; {unfinished} that did not finish not shown (report.md lists them)"
    return chosen.assign(label=labels), note + (f"; all shown: {shared}" if shared else "")


# --------------------------------------------------------------------------------------------
# the frame of each chart, from the report (:class:`perfsweep.report.build.Report`): (frame, note)


def shown(r: Any) -> tuple[pd.DataFrame, str]:
    """The configs of the bar charts (all, or the ``top`` fastest plus the baseline), to compare."""
    if len(r.configs) < 2 or not r.configs["ok"].any():
        raise Skip("only one config: nothing to compare" if len(r.configs) < 2 else "no run finished ok")
    return r.shown, r.shown_note


def _batch_and_seq(r: Any, both: bool) -> None:
    varying = [a for a in ("batch", "seq_len") if r.configs[a].nunique() > 1]
    if both and len(varying) < 2:
        raise Skip(f"needs both batch and seq_len to vary (varying here: {', '.join(varying) or 'neither'})")
    if not varying:
        raise Skip("neither batch nor seq_len varies in this sweep")


def gpu(r: Any) -> tuple[pd.DataFrame, str]:
    """The shown configs with GPU busy time and ``kernel_ms_<category>``: GPU ms per profiled step
    in each kernel category (0 where a config has none), whose sum is a step's GPU work. Drawn for
    one config too: nothing else in the report shows its kernel categories and busy share."""
    if not r.configs["gpu_busy_fraction"].notna().any():
        raise Skip(
            "no GPU busy time: CPU runs, GPU runs without the profiled window, or runs stored by a perfsweep "
            "older than the busy-time columns (`perfsweep trace` on their trace files gives it)"
        )
    if (configs := r.shown[r.shown["ok"]].dropna(subset=["gpu_busy_fraction"])).empty:
        raise Skip("none of the configs shown has GPU busy time")
    kernels = load_child(r.engine, "kernels", configs["id"])
    wide = kernels.pivot_table(index="run_id", columns="category", values="ms_per_step", aggfunc="sum")
    cols = {f"kernel_ms_{c}": configs["id"].map(wide[c]).fillna(0.0) for c in KERNEL_CATEGORIES if c in wide}
    return configs.assign(**cols), r.shown_note


def memory(r: Any) -> tuple[pd.DataFrame, str]:
    """The shown configs with what their devices measured: peak allocated (else ``peak_mem_bytes``),
    peak reserved on CUDA and the growth of the process's RSS on CPU; columns no config has are dropped."""
    if not r.configs["peak_mem_bytes"].notna().any():
        raise Skip("no run recorded peak memory")
    f = shown(r)[0]
    f = f.assign(rss_growth_bytes=f["rss_growth_bytes"].where(f["device_type"] == "cpu"))
    drop = ["peak_mem_bytes"] if f["peak_allocated_bytes"].notna().any() else []
    drop += [c for c in ("peak_allocated_bytes", "peak_reserved_bytes", "rss_growth_bytes") if f[c].isna().all()]
    return f.drop(columns=drop), r.shown_note


def pareto_mask(throughput_per_s: pd.Series, mem: pd.Series) -> pd.Series:
    """True for points no other point beats on both throughput (higher) and memory (lower).

    Sorted by memory (ties: faster first), a point is on the front when it is faster than every
    leaner one: one sort and a running maximum, fine for 10,000 runs.
    """
    t = pd.DataFrame({"t": throughput_per_s, "m": mem}).dropna().sort_values(["m", "t"], ascending=[True, False])["t"]
    return (t > t.cummax().shift(fill_value=-np.inf)).reindex(throughput_per_s.index, fill_value=False)


def pareto(r: Any) -> tuple[pd.DataFrame, str]:
    """Every config, ``on_front`` when it is on the Pareto front of tokens/s against peak memory."""
    if (n := int((r.configs["ok"] & r.configs["peak_mem_bytes"].notna()).sum())) < 3:
        raise Skip(f"needs at least 3 configs that finished with a memory figure (has {n})")
    return r.configs.assign(
        on_front=pareto_mask(r.configs["throughput_per_s"].where(r.configs["ok"]), r.configs["peak_mem_bytes"])
    ), ""


def _detail(r: Any, table: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The configs of the charts that need a query each (the shown ok ones, at most TOP_DETAIL)
    and their rows of a child ``table``."""
    configs, note = top_configs(r.configs, r.shown[r.shown["ok"]], TOP_DETAIL)
    if configs.empty:
        raise Skip("no run finished ok")
    return configs, load_child(r.engine, table, configs["id"]), note or r.shown_note


def breakdown(r: Any) -> tuple[pd.DataFrame, str]:
    """The configs that have stage rows, with ``cpu_ms_<stage>`` and ``gpu_ms_<stage>``: time per
    step in each stage, in step order. GPU columns only where device time was measured (CUDA),
    not copied from the CPU time (``device_time_source = 'same_as_cpu'``)."""
    configs, stages, note = _detail(r, "stages")
    if stages.empty:
        raise Skip("no stage rows for these runs (profiling was off: profile.enabled=false)")
    cols = {}
    source = stages["device_time_source"]
    measured = stages[~source.isin([DEVICE_TIME_SAME_AS_CPU, DEVICE_TIME_BEFORE_LAUNCH])]
    for kind, rows, value in (("cpu", stages, "cpu_time_ms"), ("gpu", measured, "device_time_ms")):
        wide = rows.pivot_table(index="run_id", columns="stage", values=value, aggfunc="sum")
        cols |= {f"{kind}_ms_{s}": configs["id"].map(wide[s]) for s in STAGES if s in wide}
    missed = bool((source == DEVICE_TIME_BEFORE_LAUNCH).any())  # an older perfsweep's: backward's kernels missing
    if missed:
        old = "no GPU time: stored by a perfsweep that missed backward's kernels; perfsweep trace gives it"
        note = f"{note}; {old}" if note else old
    frame = configs.assign(**cols)[configs["id"].isin(stages["run_id"])]
    frame.attrs["gpu_time_not_drawn"] = missed  # the caption says why (perfsweep.report.build)
    return frame, note


def loss(r: Any) -> tuple[pd.DataFrame, str]:
    """Measured steps with a loss (``x``: the step), one ``line`` per config, in the configs' order."""
    configs, steps, note = _detail(r, "steps")
    configs = configs.reset_index(drop=True).reset_index().set_index("id")[["index", "label", "status"]]
    frame = steps.dropna(subset=["loss"]).join(configs, on="run_id", how="inner").sort_values(["index", "step"])
    if frame.empty:
        raise Skip("no measured steps with a loss recorded")
    return frame.rename(columns={"step": "x", "label": "line"}).reset_index(drop=True), note


def _groups(df: pd.DataFrame, axes: Sequence[str], keep: int, noun: str) -> tuple[pd.Series, str]:
    """Each run's combination of ``axes`` as a label (``seq_len=128 workers=0``), for one line or
    one panel per combination. With more than ``keep`` combinations, only those with the highest
    peak tokens/s keep a label (the rest get NaN), relabelled by what still differs between them."""
    if not axes:
        return pd.Series("", index=df.index), ""
    group = config_labels(df, axes, unique=False)
    best = df["throughput_per_s"].where(df["ok"]).groupby(group).max().sort_values(ascending=False, na_position="last")
    if len(best) <= keep:
        return group, ""
    labels, shared = relabel(df[group.isin(best.index[:keep])], axes, unique=False)
    note = f"{keep} of {len(best)} {noun} (highest peak tokens/s)" + (f"; all {noun}: {shared}" if shared else "")
    return labels.reindex(df.index), note


def scaling(r: Any, max_lines: int = 10) -> tuple[pd.DataFrame, str]:
    """Runs against each of batch and seq_len that varies (``axis``, ``x``), one ``line`` per
    combination of the other differing axes. Not drawn when no run finished ok: the failed ones
    alone are x marks on empty axes whose ticks read as figures."""
    _batch_and_seq(r, both=False)
    if not r.configs["ok"].any():
        raise Skip("no run finished ok")
    parts, notes = [], []
    for axis in (a for a in ("batch", "seq_len") if r.configs[a].nunique() > 1):
        line, note = _groups(r.configs, [a for a in label_axes(r.configs) if a != axis], max_lines, "lines")
        parts.append(
            r.configs.assign(axis=axis, x=r.configs[axis], line=line.replace("", "all runs")).dropna(subset=["line"])
        )
        notes.append(note)
    frame = pd.concat(parts)
    rank = {line: i for i, line in enumerate(sorted(frame["line"].unique(), key=_numbers_as_numbers))}
    frame = frame.assign(_rank=frame["line"].map(rank)).sort_values(["axis", "_rank", "x"], kind="stable")
    return frame.drop(columns="_rank").reset_index(drop=True), "; ".join(dict.fromkeys(n for n in notes if n))


def _numbers_as_numbers(label: str) -> list[tuple[int, float | str]]:
    """A sort key that reads the numbers in a label as numbers: batch=2, 8, 32, 512, not 2, 32, 512, 8."""
    parts = re.split(r"(-?\d+(?:\.\d+)?)", label)
    return [(1, float(p)) if i % 2 else (0, p) for i, p in enumerate(parts)]


def heatmap(r: Any, max_panels: int = 4) -> tuple[pd.DataFrame, str]:
    """One row per batch x seq_len cell of each ``panel`` (a combination of the other differing
    axes), every cell of the grid present: the config's median tokens/s over its ok runs, or
    ``status`` saying why it has none (see :data:`STATUS_ORDER`), NaN if never run."""
    _batch_and_seq(r, both=True)
    others = [a for a in label_axes(r.configs) if a not in ("batch", "seq_len")]
    panel, note = _groups(r.configs, others, max_panels, "panels")
    configs, keys = r.configs.assign(panel=panel).dropna(subset=["panel"]), ["panel", "seq_len", "batch"]
    levels = [configs["panel"].unique(), sorted(configs["seq_len"].unique()), sorted(configs["batch"].unique())]
    grid = pd.MultiIndex.from_product(levels, names=keys)
    cells = configs.sort_values("status", key=lambda s: s.map(STATUS_ORDER.index), kind="stable").drop_duplicates(keys)
    return cells.set_index(keys)[["status", "throughput_per_s"]].reindex(grid).reset_index(), note


def factorial_effects(df: pd.DataFrame, throughput: Sequence[Any] | None = None) -> tuple[pd.DataFrame, str]:
    """Main effects and two-factor interactions of the two-level axes that vary, design-of-experiments
    style, on tokens/s and peak memory; :class:`Skip` when no block has the complete on/off grid.

    One row per term (``label``: ``amp``, ``ckpt``, ``amp x ckpt``) with, per metric,
    ``effect_<metric>`` = mean at +1 minus mean at -1 (coded levels: off=-1, on=+1; for an
    interaction the product of the codes), in the metric's own unit, ``effect_pct_<metric>``
    = that as % of the overall mean, and both as text (``throughput effect``, ``peak memory effect``).
    Only complete blocks enter: combinations of the other differing axes (e.g. batch, seq_len) in
    which every on/off combination ran ok; the note says how many of them there were. With each
    config's ``throughput`` (:func:`perfsweep.configs.throughputs`), the tokens/s effects get 95%
    bootstrap intervals (:func:`perfsweep.metrics.effect_intervals`, ``effect_pct_ci_lo/hi_throughput_per_s``)
    and ``effect_verdict``: "no measurable difference" where the interval contains 0.
    """
    if not (factors := [a for a in ON_OFF_AXES if df[a].nunique() > 1]):
        raise Skip("none of amp, ckpt, compile varies")
    blocks = [a for a in label_axes(df) if a not in factors]
    ok = df.assign(_t=list(throughput) if throughput is not None else None)[df["ok"]]
    grouped = ok.groupby([*blocks, *factors], dropna=False)
    cells = (
        grouped[["throughput_per_s", "peak_mem_bytes"]].mean().reset_index().assign(_t=grouped["_t"].agg(list).values)
    )
    by_block = cells.groupby(blocks, dropna=False) if blocks else cells.groupby(np.zeros(len(cells)))
    if (cells := cells[by_block["throughput_per_s"].transform("size") == 2 ** len(factors)]).empty:
        raise Skip(f"the on/off grid over {', '.join(factors)} is incomplete among ok runs")
    coded = {f: np.where(cells[f].astype(bool), 1, -1) for f in factors}
    terms = coded | {f"{a} x {b}": coded[a] * coded[b] for a, b in itertools.combinations(factors, 2)}
    out = pd.DataFrame({"label": list(terms)})
    for metric, name in (("throughput_per_s", "throughput"), ("peak_mem_bytes", "peak memory")):
        effect, pct = metrics.effects(cells[metric].to_numpy(dtype=float), list(terms.values()))
        out[f"effect_{metric}"], out[f"effect_pct_{metric}"] = effect, pct
        absolute = [fmt.mem(v, signed=True) if metric == "peak_mem_bytes" else f"{v:+,.0f}" for v in effect]
        out[f"{name} effect"] = [f"{a} ({p:+.1f}%)" for a, p in zip(absolute, pct, strict=True)]
        # the chart's, as compare.png's: the effect alone; the colour, the legend and a whisker across 0 say
        # "no measurable difference" (written out too, the label ran off the panel); report.md's table writes it
        out[f"{name} bar label"] = out[f"{name} effect"]
    if throughput is not None:
        ivs = metrics.effect_intervals(cells["_t"].tolist(), list(terms.values()))
        out = out.assign(
            **{f"effect_pct_ci_{end}_throughput_per_s": [getattr(i, end) for i in ivs] for end in ("lo", "hi")}
        )
        out["effect_verdict"] = [metrics.NO_DIFFERENCE if i.contains(0.0) else "" for i in ivs]
        text = [
            f"{t[:-1]}, 95% CI {i.lo:+.1f} to {i.hi:+.1f}%)" if np.isfinite(i.lo) else t
            for t, i in zip(out["throughput effect"], ivs, strict=True)
        ]
        verdict = [f" {v}" if v else "" for v in out["effect_verdict"]]
        out["throughput effect"] = [t + v for t, v in zip(text, verdict, strict=True)]
    if not blocks:
        return out, ""
    used, total = cells.groupby(blocks, dropna=False).ngroups, df.groupby(blocks, dropna=False).ngroups
    note = f"averaged over {used} of {total} combinations of {', '.join(axis_name(a) for a in blocks)}"
    return out, note + (" (the others lack an ok run for some on/off combination)" if used < total else "")
