"""Data shaping for the report: plain pandas, no drawing, so tests can check every number.

Every chart in :mod:`perfsweep.report.charts` is drawn from a frame built here. The frames
keep the database's column names (units in the names) and add only derived columns whose
names say what they are, e.g. ``tokens_per_s_lo`` = tokens per step / p90 step time.

One row of ``runs`` is one *config* in the charts. Configs are named by the axes that
differ between them (``amp=on ckpt=off``), so a label never repeats what every bar shares.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perfsweep.names import GRID_AXES, KERNEL_CATEGORIES, STAGES

log = logging.getLogger(__name__)

CONFIG_AXES: tuple[str, ...] = (*GRID_AXES, "amp_dtype", "model_name", "data_name")
"""What identifies a measured configuration: the grid axes plus what they do not cover."""

BOOL_AXES: tuple[str, ...] = ("amp", "ckpt", "compile")
"""Two-level axes: the factors of the factorial analysis and of the default baseline."""

SHORT_NAMES: dict[str, str] = {"model_name": "model", "data_name": "data", "sweep_id": "sweep"}


# --------------------------------------------------------------------------------------------
# runs: normalisation, labels, baseline


def prepare_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Normalise types across backends and add the derived columns every chart uses.

    SQLite hands booleans back as 0/1 integers and PostgreSQL as bools; both become bool.
    ``tokens_per_s_lo``/``_hi`` turn the p90/p10 step times into a throughput range, so the
    error bars show how steady the measured steps were, not a standard error.
    """
    df = runs.copy()
    for axis in BOOL_AXES:
        df[axis] = df[axis].astype(bool)
    sort_cols = [c for c in ("sweep_id", "job_num", "id") if c in df.columns]
    df = df.sort_values(sort_cols, kind="stable", na_position="last").reset_index(drop=True)
    df["tokens_per_step"] = df["batch"] * df["seq_len"]
    with np.errstate(divide="ignore", invalid="ignore"):
        df["tokens_per_s_lo"] = df["tokens_per_step"] * 1000.0 / df["step_time_ms_p90"]
        df["tokens_per_s_hi"] = df["tokens_per_step"] * 1000.0 / df["step_time_ms_p10"]
    df["ok"] = (df["status"] == "ok") & df["tokens_per_s"].notna()
    axes = label_axes(df)
    df["label"] = config_labels(df, axes)
    return df


def label_axes(df: pd.DataFrame) -> list[str]:
    """The config axes whose values differ between runs; ``sweep_id`` too when it disambiguates."""
    axes = [a for a in CONFIG_AXES if a in df.columns and df[a].nunique(dropna=False) > 1]
    key = axes or list(CONFIG_AXES)
    if "sweep_id" in df.columns and df["sweep_id"].nunique() > 1 and df.duplicated(key).any():
        axes.append("sweep_id")
    return axes


def relabel(subset: pd.DataFrame, full_axes: Sequence[str]) -> tuple[pd.Series, str]:
    """Shorter labels for a subset of configs: only the axes that still differ within it.

    Returns the labels and the values the subset shares (e.g. ``"model=small"``) for a title,
    so 30 bars do not each repeat what all of them have in common.
    """
    if len(subset) < 2:
        return subset["label"], ""
    axes = [a for a in label_axes(subset) if a in full_axes or a == "sweep_id"]
    common = [a for a in full_axes if a not in axes]
    shared = " ".join(
        f"{SHORT_NAMES.get(a, a)}={format_axis_value(a, subset[a].iloc[0])}" for a in common if a in subset.columns
    )
    return config_labels(subset, axes), shared


def format_axis_value(axis: str, value: Any) -> str:
    if axis in BOOL_AXES:
        return "on" if bool(value) else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def config_labels(df: pd.DataFrame, axes: Sequence[str]) -> pd.Series:
    """``amp=on ckpt=off`` from the differing axes; run ids are appended only to break ties."""
    if not axes:
        labels = [
            f"{m} batch={b} seq_len={s}" for m, b, s in zip(df["model_name"], df["batch"], df["seq_len"], strict=True)
        ]
    else:
        columns = [df[a].tolist() for a in axes]
        labels = [
            " ".join(f"{SHORT_NAMES.get(a, a)}={format_axis_value(a, v)}" for a, v in zip(axes, vals, strict=True))
            for vals in zip(*columns, strict=True)
        ]
    out = pd.Series(labels, index=df.index, dtype=object)
    dup = out.duplicated(keep=False)
    if dup.any():
        out[dup] = out[dup] + " #" + df.loc[dup, "id"].astype(str)
    return out


BOOL_WORDS = {
    "true": True,
    "on": True,
    "yes": True,
    "1": True,
    "false": False,
    "off": False,
    "no": False,
    "0": False,
}


def parse_config_spec(text: str) -> dict[str, Any]:
    """``"amp=false,ckpt=false"`` -> ``{"amp": False, "ckpt": False}`` with each axis's type.

    Raises ValueError with a one-line message naming the offending item.
    """
    spec: dict[str, Any] = {}
    names = {SHORT_NAMES.get(a, a): a for a in CONFIG_AXES} | {a: a for a in CONFIG_AXES}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" not in item:
            raise ValueError(f"{item!r} is not axis=value")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in names:
            raise ValueError(f"unknown axis {key!r} (axes: {', '.join(CONFIG_AXES)})")
        axis = names[key]
        if axis in BOOL_AXES:
            if value.lower() not in BOOL_WORDS:
                raise ValueError(f"{key}={value!r}: expected true or false")
            spec[axis] = BOOL_WORDS[value.lower()]
        elif axis in ("batch", "seq_len", "workers"):
            try:
                spec[axis] = int(value)
            except ValueError:
                raise ValueError(f"{key}={value!r}: expected an integer") from None
        else:
            spec[axis] = value
    if not spec:
        raise ValueError("empty config; expected e.g. amp=false,ckpt=false")
    return spec


def match_config(df: pd.DataFrame, spec: dict[str, Any]) -> pd.Series:
    mask = pd.Series(True, index=df.index)
    for axis, value in spec.items():
        mask &= df[axis] == value
    return mask


@dataclass
class Baseline:
    """The run every speedup is relative to, and how it was chosen (said in report.md)."""

    index: int | None
    label: str
    how: str
    tokens_per_s: float | None = None
    peak_mem_bytes: float | None = None
    peak_allocated_bytes: float | None = None
    peak_reserved_bytes: float | None = None


def pick_baseline(df: pd.DataFrame, spec: dict[str, Any] | None = None) -> Baseline:
    """The first ok run matching ``spec``; by default all of amp, ckpt, compile off.

    A given spec that matches no ok run is an error (the user asked for something absent);
    the default falls back to the first ok run, which is what a sweep without an all-off
    config can offer.
    """
    ok = df[df["ok"]]
    if spec:
        hits = ok[match_config(ok, spec)]
        if hits.empty:
            wanted = ",".join(f"{k}={v}" for k, v in spec.items())
            raise ValueError(f"no ok run matches {wanted}")
        how = "as requested" if len(hits) == 1 else f"first of {len(hits)} ok runs matching the request"
    else:
        hits = ok[match_config(ok, {a: False for a in BOOL_AXES})]
        how = "default: amp, ckpt and compile off"
        if len(hits) > 1:
            how += f"; first of {len(hits)} such runs"
        if hits.empty:
            hits = ok
            how = "first ok run (no run has amp, ckpt and compile all off)"
    if hits.empty:
        return Baseline(None, "-", "no ok run")
    i = int(hits.index[0])
    row = df.loc[i]
    return Baseline(
        i,
        str(row["label"]),
        how,
        _num(row["tokens_per_s"]),
        _num(row["peak_mem_bytes"]),
        _num(row.get("peak_allocated_bytes")),
        _num(row.get("peak_reserved_bytes")),
    )


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def add_speedup(df: pd.DataFrame, base: Baseline) -> pd.DataFrame:
    df = df.copy()
    df["is_baseline"] = df.index == base.index
    df["speedup"] = df["tokens_per_s"] / base.tokens_per_s if base.tokens_per_s else np.nan
    return df


def select_configs(df: pd.DataFrame, top: int, base: Baseline) -> tuple[pd.DataFrame, str]:
    """At most ``top`` configs for the bar charts: all of them, or the fastest plus the baseline.

    Returns the rows and a note for titles ("" when nothing was left out). Sweep order is
    kept when everything fits, so the bars line up with the terminal summary.
    """
    if len(df) <= top:
        return df, ""
    ok = df[df["ok"]].sort_values("tokens_per_s", ascending=False, kind="stable")
    chosen = ok.head(top)
    if base.index is not None and base.index not in chosen.index:
        chosen = pd.concat([chosen, df.loc[[base.index]]])
    return top_subset(df, chosen, f"top {top} of {len(df):,} configs by tokens/s")


def top_subset(df: pd.DataFrame, chosen: pd.DataFrame, note: str) -> tuple[pd.DataFrame, str]:
    """``chosen`` relabelled by what differs within it; the shared values go into the note."""
    chosen = chosen.copy()
    chosen["label"], shared = relabel(chosen, label_axes(df))
    return chosen, note + (f"; all shown: {shared}" if shared else "")


# --------------------------------------------------------------------------------------------
# per-chart frames


def throughput_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per config: tokens/s, its p10-p90 range in tokens/s, speedup, status."""
    cols = [
        "id",
        "label",
        "status",
        "tokens_per_s",
        "tokens_per_s_lo",
        "tokens_per_s_hi",
        "speedup",
        "is_baseline",
    ]
    return df[cols].reset_index(drop=True)


def memory_mode(df: pd.DataFrame) -> str:
    """'cuda' when every ok run has allocator figures, 'cpu' when none is on CUDA, else 'mixed'."""
    ok = df[df["ok"]]
    if ok.empty:
        return "cpu"
    on_cuda = ok["device_type"].eq("cuda")
    if on_cuda.all() and ok["peak_allocated_bytes"].notna().all():
        return "cuda"
    return "cpu" if not on_cuda.any() else "mixed"


def memory_frame(df: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "id",
        "label",
        "status",
        "device_type",
        "peak_mem_bytes",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "rss_growth_bytes",
        "is_baseline",
    ]
    out = df[cols].reset_index(drop=True)
    for c in ("peak_mem_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "rss_growth_bytes"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype(float)  # all-NULL columns load as object
    return out


def pareto_mask(tokens_per_s: pd.Series, mem: pd.Series) -> pd.Series:
    """True for points no other point beats on both throughput (higher) and memory (lower).

    Sort by memory ascending (ties: faster first) and keep each point that is faster than
    everything cheaper: O(n log n), fine for 10,000 runs.
    """
    valid = tokens_per_s.notna() & mem.notna()
    pts = pd.DataFrame({"t": tokens_per_s[valid], "m": mem[valid]})
    pts = pts.sort_values(["m", "t"], ascending=[True, False], kind="stable")
    best = -np.inf
    front: list[Any] = []
    for idx, t in zip(pts.index, pts["t"], strict=True):
        if t > best:
            front.append(idx)
            best = t
    mask = pd.Series(False, index=tokens_per_s.index)
    mask[front] = True
    return mask


def pareto_frame(df: pd.DataFrame) -> pd.DataFrame:
    axes = [a for a in CONFIG_AXES if a in df.columns]
    out = df[["id", "label", "status", "ok", "tokens_per_s", "peak_mem_bytes", "is_baseline", *axes]].copy()
    out["on_front"] = pareto_mask(out["tokens_per_s"].where(out["ok"]), out["peak_mem_bytes"].where(out["ok"]))
    return out.reset_index(drop=True)


def breakdown_frame(stages: pd.DataFrame, configs: pd.DataFrame) -> pd.DataFrame:
    """Stage times per config in step order, with each config's measured median step time."""
    st = stages.merge(configs[["id", "label", "step_time_ms_median"]], left_on="run_id", right_on="id")
    st["stage"] = pd.Categorical(st["stage"], categories=_stage_categories(st["stage"]), ordered=True)
    order = {rid: i for i, rid in enumerate(configs["id"])}
    st["config_order"] = st["run_id"].map(order)
    cols = [
        "run_id",
        "label",
        "stage",
        "cpu_time_ms",
        "device_time_ms",
        "device_time_source",
        "step_time_ms_median",
        "config_order",
    ]
    return st[cols].sort_values(["config_order", "stage"]).reset_index(drop=True)


def gpu_frame(configs: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """Per config: tokens/s, GPU busy share, verdict, measured step and GPU ms per kernel category.

    One ``kernel_ms_<category>`` column per category present (ms per profiled step, 0 where a
    config has none), in :data:`perfsweep.names.KERNEL_CATEGORIES` order; their sum is the GPU
    work of a step, drawn against the measured step time to show how much of it the GPU idles.
    """
    cols = [
        "id",
        "label",
        "status",
        "tokens_per_s",
        "gpu_busy_fraction",
        "gpu_busy_ms",
        "bottleneck",
        "step_time_ms_median",
    ]
    out = configs[cols].reset_index(drop=True)
    wide = kernels.pivot_table(index="run_id", columns="category", values="ms_per_step", aggfunc="sum")
    for cat in KERNEL_CATEGORIES:
        if cat in wide.columns:
            out[f"kernel_ms_{cat}"] = out["id"].map(wide[cat]).fillna(0.0)
    return out


def _stage_categories(stages: pd.Series) -> list[str]:
    known = [s for s in STAGES if s in set(stages)]
    return known + sorted(set(stages) - set(STAGES))


def scaling_axes(df: pd.DataFrame) -> list[str]:
    return [a for a in ("batch", "seq_len") if df[a].nunique() > 1]


def scaling_frame(df: pd.DataFrame, axis: str, max_lines: int = 10) -> tuple[pd.DataFrame, str]:
    """Runs along ``axis``, one line per combination of the other differing axes.

    With more combinations than ``max_lines``, the lines with the highest peak tokens/s are
    kept and the note says so.
    """
    others = [a for a in label_axes(df) if a != axis]
    out = df[["id", "status", "ok", axis, "tokens_per_s", "peak_mem_bytes", *others]].copy()
    out = out.rename(columns={axis: "x"})
    out["line"] = config_labels(df, others).str.replace(r" #\d+$", "", regex=True) if others else "all runs"
    best = out.groupby("line", sort=False)["tokens_per_s"].max().sort_values(ascending=False, na_position="last")
    note = ""
    if len(best) > max_lines:
        keep = set(best.index[:max_lines])
        out = out[out["line"].isin(keep)]
        note = f"{max_lines} of {len(best)} lines (highest peak tokens/s)"
        kept_axes = [a for a in others if out[a].nunique(dropna=False) > 1]
        shared = " ".join(
            f"{SHORT_NAMES.get(a, a)}={format_axis_value(a, out[a].iloc[0])}" for a in others if a not in kept_axes
        )
        if kept_axes:
            out["line"] = config_labels(out.assign(id=0), kept_axes).str.replace(r" #\d+$", "", regex=True)
        if shared:
            note += f"; all lines: {shared}"
    out = out.sort_values(["line", "x"], kind="stable")
    return out.reset_index(drop=True), note


@dataclass
class HeatPanel:
    """One batch x seq_len grid: cell values (tokens/s) and what to write in failed cells."""

    title: str
    tokens_per_s: pd.DataFrame  # index seq_len, columns batch
    status: pd.DataFrame  # same shape; "ok", "oom", "failed", "timeout" or NaN when not run


def heatmap_panels(df: pd.DataFrame, max_panels: int = 4) -> tuple[list[HeatPanel], str]:
    """batch x seq_len tables of tokens/s, one per combination of the other differing axes.

    A cell holds the median over repeated ok runs; a cell with no ok run carries the status
    of its runs (oom before failed before timeout) so the chart can say why it is empty.
    With more combinations than ``max_panels``, those with the highest peak tokens/s are kept
    (chosen with one groupby, so 10,000 runs in 2,000 combinations stay fast).
    """
    others = [a for a in label_axes(df) if a not in ("batch", "seq_len")]
    batches = sorted(df["batch"].unique())
    seqs = sorted(df["seq_len"].unique())
    cell = [*others, "seq_len", "batch"]
    ok = df[df["ok"]]
    tps = ok.groupby(cell, dropna=False)["tokens_per_s"].median()
    status = (
        df.assign(_rank=df["status"].map(_STATUS_RANK).fillna(9))
        .sort_values("_rank", kind="stable")
        .drop_duplicates(cell)
        .set_index(cell)["status"]
    )
    note = ""
    if others:
        best = tps.groupby(level=list(range(len(others))), dropna=False).max()
        keys = list(df[others].drop_duplicates().itertuples(index=False, name=None))
        if len(keys) > max_panels:
            note = (
                f"{max_panels} of {len(keys)} combinations of {', '.join(SHORT_NAMES.get(a, a) for a in others)}"
                " (highest peak tokens/s)"
            )
            rank = {k: best.get(k if len(others) > 1 else k[0], -1.0) for k in keys}
            keys = sorted(keys, key=lambda k: rank[k], reverse=True)[:max_panels]
    else:
        keys = [()]
    panels = []
    for key in keys:
        title = " ".join(f"{SHORT_NAMES.get(a, a)}={format_axis_value(a, v)}" for a, v in zip(others, key, strict=True))
        t, st = (_cells(tps, key), _cells(status, key)) if others else (tps, status)
        panels.append(
            HeatPanel(
                title,
                t.unstack("batch").reindex(index=seqs, columns=batches) if len(t) else _empty_grid(seqs, batches),
                st.unstack("batch").reindex(index=seqs, columns=batches),
            )
        )
    return panels, note


def _cells(series: pd.Series, key: tuple) -> pd.Series:
    """The (seq_len, batch) cells of one combination of the other axes; empty if it has none."""
    levels = list(range(len(key)))
    try:
        return series.xs(key, level=levels, drop_level=True)
    except KeyError:
        return series.iloc[0:0].droplevel(levels)


def _empty_grid(seqs: list[Any], batches: list[Any]) -> pd.DataFrame:
    return pd.DataFrame(np.nan, index=pd.Index(seqs, name="seq_len"), columns=pd.Index(batches, name="batch"))


_STATUS_RANK = {"ok": 0, "oom": 1, "failed": 2, "timeout": 3, "interrupted": 4, "running": 5}


# --------------------------------------------------------------------------------------------
# factorial analysis


@dataclass
class Factorial:
    """Main effects and two-factor interactions of two-level axes, design-of-experiments style.

    ``effects`` has one row per term (``amp``, ``ckpt``, ``amp x ckpt``) and per metric:
    ``effect`` = mean at +1 minus mean at -1 (coded levels: off=-1, on=+1; for an
    interaction the product of the codes), in the metric's own unit, and ``effect_pct`` =
    effect as % of the overall mean. Only complete blocks enter: combinations of the other
    differing axes (e.g. batch, seq_len) in which every on/off combination ran ok.
    """

    factors: list[str]
    effects: pd.DataFrame
    cells: pd.DataFrame
    blocks_used: int
    blocks_total: int
    block_axes: list[str] = field(default_factory=list)


FACTOR_METRICS: tuple[str, ...] = ("tokens_per_s", "peak_mem_bytes")


def factorial_effects(df: pd.DataFrame, metrics: Sequence[str] = FACTOR_METRICS) -> Factorial | None:
    """Effects of the boolean axes that vary; None when no block has the complete grid."""
    factors = [a for a in BOOL_AXES if df[a].nunique() > 1]
    if not factors:
        return None
    blocks = [a for a in label_axes(df) if a not in factors]
    ok = df[df["ok"]]
    group_cols = [*blocks, *factors]
    cells = ok.groupby(group_cols, sort=True, dropna=False)[list(metrics)].mean().reset_index()
    n_levels = 2 ** len(factors)
    if blocks:
        size = cells.groupby(blocks, dropna=False)[factors[0]].transform("size")
        blocks_total = int(df.groupby(blocks, dropna=False).ngroups)
        cells = cells[size == n_levels]
        blocks_used = int(cells.groupby(blocks, dropna=False).ngroups) if not cells.empty else 0
    else:
        blocks_total = 1
        blocks_used = 1 if len(cells) == n_levels else 0
        if not blocks_used:
            cells = cells.iloc[0:0]
    if cells.empty:
        return None
    effects = effects_table(cells, factors, metrics)
    return Factorial(factors, effects, cells.reset_index(drop=True), blocks_used, blocks_total, blocks)


def effects_table(cells: pd.DataFrame, factors: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """Effect of each main term and two-factor interaction on each metric, from balanced cells."""
    coded = {f: np.where(cells[f].astype(bool), 1, -1) for f in factors}
    terms: list[tuple[str, np.ndarray]] = [(f, coded[f]) for f in factors]
    terms += [(f"{a} x {b}", coded[a] * coded[b]) for a, b in itertools.combinations(factors, 2)]
    rows = []
    for metric in metrics:
        y = cells[metric].to_numpy(dtype=float)
        mean = float(np.nanmean(y)) if len(y) else np.nan
        for term, sign in terms:
            effect = float(np.nanmean(y[sign > 0]) - np.nanmean(y[sign < 0]))
            rows.append(
                {
                    "metric": metric,
                    "term": term,
                    "kind": "interaction" if " x " in term else "main",
                    "effect": effect,
                    "effect_pct": 100.0 * effect / mean if mean else np.nan,
                    "mean": mean,
                }
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# loss


def loss_frame(steps: pd.DataFrame, configs: pd.DataFrame) -> pd.DataFrame:
    st = steps.merge(configs[["id", "label"]], left_on="run_id", right_on="id")
    order = {rid: i for i, rid in enumerate(configs["id"])}
    st["config_order"] = st["run_id"].map(order)
    st = st.dropna(subset=["loss"])
    return (
        st[["run_id", "label", "step", "loss", "config_order"]]
        .sort_values(["config_order", "step"])
        .reset_index(drop=True)
    )
