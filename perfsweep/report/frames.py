"""Data shaping for the report: plain pandas, no drawing, so tests can check every number.

Every chart is drawn from a frame built here. The frames keep the database's column names
(units in the names) and add only columns whose names say what they are; derived figures
(throughput range, noise flag, speedup) come from :mod:`perfsweep.metrics`, never from a
formula here. A chart that does not fit the data raises :class:`Skip` with the reason.

One row of ``runs`` is one *config* in the charts. Configs are named by the axes that
differ between them (``amp=on ckpt=off``), so a label never repeats what every bar shares.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfsweep import metrics
from perfsweep.names import GRID_AXES, KERNEL_CATEGORIES, RUN_STATUSES, STAGES
from perfsweep.report import fmt
from perfsweep.report.load import load_kernels, load_stages, load_steps

CONFIG_AXES: tuple[str, ...] = (*GRID_AXES, "amp_dtype", "model_name", "data_name")
"""What identifies a measured configuration: the grid axes plus what they do not cover."""
BOOL_AXES: tuple[str, ...] = ("amp", "ckpt", "compile")
"""Two-level axes: the factors of the factorial analysis and of the default baseline."""
SHORT_NAMES: dict[str, str] = {"model_name": "model", "data_name": "data", "sweep_id": "sweep"}
STATUS_ORDER: tuple[str, ...] = ("ok", "oom", "failed", "timeout", "interrupted", "running")
"""Which status a batch x seq_len cell shows when its repeats differ: the most telling first."""
assert set(STATUS_ORDER) == set(RUN_STATUSES)
TOP_DETAIL = 8
"""Most configs in the stage breakdown and loss charts, which need a query per chart."""


class Skip(Exception):
    """A chart does not fit this sweep; the message is the reason shown in report.md."""


# --------------------------------------------------------------------------------------------
# runs: normalisation, labels, baseline


def prepare_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Normalise types across backends and add the columns every chart uses.

    SQLite hands booleans back as 0/1 integers and PostgreSQL as bools; both become bool. A
    column that is NULL in every run loads as object and becomes float, so it plots as empty.
    ``tokens_per_s_lo``/``_hi`` (:func:`metrics.throughput_range`) show how steady the measured
    steps were; ``noisy_p90_p10`` (:func:`metrics.noisy`) flags a spread too wide to trust small
    differences.
    """
    empty = {c: float for c in runs.columns if runs[c].dtype == object and runs[c].isna().all()}
    df = runs.astype(dict.fromkeys(BOOL_AXES, bool) | empty).sort_values(["sweep_id", "job_num", "id"], kind="stable")
    df = df.copy()  # one block per dtype: added columns do not fragment it
    tokens_per_step = df["batch"] * df["seq_len"]
    lo, hi = metrics.throughput_range(tokens_per_step, df["step_time_ms_p10"], df["step_time_ms_p90"])
    noisy = metrics.noisy(df["step_time_ms_p10"], df["step_time_ms_p90"])
    ok = (df["status"] == "ok") & df["tokens_per_s"].notna()
    df = df.assign(tokens_per_step=tokens_per_step, tokens_per_s_lo=lo, tokens_per_s_hi=hi, ok=ok, noisy_p90_p10=noisy)
    df = df.reset_index(drop=True)
    df["label"] = config_labels(df, label_axes(df))
    return df


def label_axes(df: pd.DataFrame) -> list[str]:
    """The config axes whose values differ between runs; ``sweep_id`` too when it disambiguates."""
    axes = [a for a in CONFIG_AXES if a in df.columns and df[a].nunique(dropna=False) > 1]
    if "sweep_id" in df.columns and df["sweep_id"].nunique() > 1 and df.duplicated(axes or list(CONFIG_AXES)).any():
        axes.append("sweep_id")
    return axes


def axis_text(axis: str, value: Any) -> str:
    """``amp=on``, ``batch=8``, ``model=tiny``: one axis of a config label."""
    if axis in BOOL_AXES:
        value = "on" if bool(value) else "off"
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{SHORT_NAMES.get(axis, axis)}={value}"


def config_labels(df: pd.DataFrame, axes: Sequence[str], unique: bool = True) -> pd.Series:
    """``amp=on ckpt=off`` from the differing axes; with ``unique``, run ids break ties (``#7``)."""
    if axes:
        labels = [" ".join(parts) for parts in zip(*([axis_text(a, v) for v in df[a]] for a in axes), strict=True)]
    else:
        labels = [f"{m} batch={b} seq_len={s}" for m, b, s in df[["model_name", "batch", "seq_len"]].itertuples(False)]
    out = pd.Series(labels, index=df.index, dtype=object)
    dup = out.duplicated(keep=False) & unique
    out[dup] = out[dup] + " #" + df.loc[dup, "id"].astype(str)
    return out


def relabel(subset: pd.DataFrame, full_axes: Sequence[str], unique: bool = True) -> tuple[pd.Series, str]:
    """Shorter labels for a subset of configs: only the axes that still differ within it, and the
    values it shares (e.g. ``"model=small"``) for a title, so 30 bars do not each repeat them."""
    if len(subset) < 2:
        return subset["label"], ""
    axes = [a for a in label_axes(subset) if a in full_axes or a == "sweep_id"]
    shared = " ".join(axis_text(a, subset[a].iloc[0]) for a in full_axes if a not in axes and a in subset)
    return config_labels(subset, axes or full_axes, unique), shared


INT_AXES = ("batch", "seq_len", "workers")
BOOL_WORDS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


def parse_config_spec(text: str) -> dict[str, Any]:
    """``"amp=false,ckpt=false"`` -> ``{"amp": False, "ckpt": False}`` with each axis's type.

    Raises ValueError with a one-line message naming the offending item.
    """
    spec: dict[str, Any] = {}
    names = {SHORT_NAMES.get(a, a): a for a in CONFIG_AXES} | {a: a for a in CONFIG_AXES}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = (s.strip() for s in item.partition("="))
        if not equals:
            raise ValueError(f"{item!r} is not axis=value")
        if (axis := names.get(key)) is None:
            raise ValueError(f"unknown axis {key!r} (axes: {', '.join(CONFIG_AXES)})")
        if axis in BOOL_AXES and value.lower() not in BOOL_WORDS:
            raise ValueError(f"{key}={value!r}: expected true or false")
        if axis in INT_AXES and not value.lstrip("-").isdigit():
            raise ValueError(f"{key}={value!r}: expected an integer")
        spec[axis] = BOOL_WORDS[value.lower()] if axis in BOOL_AXES else int(value) if axis in INT_AXES else value
    if not spec:
        raise ValueError("empty config; expected e.g. amp=false,ckpt=false")
    return spec


@dataclass
class Baseline:
    """The run every speedup is relative to, and how it was chosen (said in report.md)."""

    index: int | None
    label: str
    how: str
    row: pd.Series | None = None

    def get(self, column: str) -> float | None:
        value = None if self.row is None else self.row.get(column)
        return None if value is None or pd.isna(value) else float(value)


def pick_baseline(df: pd.DataFrame, spec: dict[str, Any] | None = None) -> Baseline:
    """The first ok run matching ``spec``; by default all of amp, ckpt, compile off.

    A given spec that matches no ok run is an error (the user asked for something absent);
    the default falls back to the first ok run, which is what a sweep without an all-off
    config can offer.
    """
    ok = df[df["ok"]]
    wanted = spec or dict.fromkeys(BOOL_AXES, False)
    hits = ok[(ok[list(wanted)] == pd.Series(wanted)).all(axis=1)]
    if spec and hits.empty:
        raise ValueError(f"no ok run matches {','.join(f'{k}={v}' for k, v in spec.items())}")
    if spec:
        how = "as requested" if len(hits) == 1 else f"first of {len(hits)} ok runs matching the request"
    elif hits.empty:
        hits, how = ok, "first ok run (no run has amp, ckpt and compile all off)"
    else:
        how = "default: amp, ckpt and compile off" + (f"; first of {len(hits)} such runs" if len(hits) > 1 else "")
    if hits.empty:
        return Baseline(None, "-", "no ok run")
    return Baseline(int(hits.index[0]), str(df.at[hits.index[0], "label"]), how, df.loc[hits.index[0]])


def top_configs(runs: pd.DataFrame, pool: pd.DataFrame, n: int, base: Baseline) -> tuple[pd.DataFrame, str]:
    """At most ``n`` configs of ``pool`` for a chart: all of them, or the fastest plus the baseline.

    Returns the rows and a note for titles ("" when nothing was left out). Sweep order is kept
    when everything fits, so the bars line up with the terminal summary; a cut subset is
    relabelled by what differs within it, and the note says what all of it shares.
    """
    if len(pool) <= n:
        return pool, ""
    chosen = pool[pool["ok"]].sort_values("tokens_per_s", ascending=False, kind="stable").head(n)
    if base.index in pool.index and base.index not in chosen.index:
        chosen = pd.concat([chosen, pool.loc[[base.index]]])
    labels, shared = relabel(chosen, label_axes(runs))
    note = f"top {n} of {len(runs):,} configs by tokens/s" + (f"; all shown: {shared}" if shared else "")
    return chosen.assign(label=labels), note


def memory_mode(df: pd.DataFrame) -> str:
    """'cuda' when every ok run has allocator figures, 'cpu' when none is on CUDA, else 'mixed'."""
    ok = df[df["ok"]]
    on_cuda = ok["device_type"].eq("cuda")
    if len(ok) and on_cuda.all() and ok["peak_allocated_bytes"].notna().all():
        return "cuda"
    return "mixed" if on_cuda.any() else "cpu"


# --------------------------------------------------------------------------------------------
# the frame of each chart, from the report (:class:`perfsweep.report.build.Report`): (frame, note)


def several_configs(r: Any) -> str | None:
    return "only one config: nothing to compare" if len(r.runs) < 2 else None


def batch_and_seq(r: Any, both: bool) -> str | None:
    varying = [a for a in ("batch", "seq_len") if r.runs[a].nunique() > 1]
    if both and len(varying) < 2:
        return f"needs both batch and seq_len to vary (varying here: {', '.join(varying) or 'neither'})"
    return None if varying else "neither batch nor seq_len varies in this sweep"


def gpu(r: Any) -> tuple[pd.DataFrame, str]:
    """The shown configs with GPU busy time and ``kernel_ms_<category>``: GPU ms per profiled step
    in each kernel category (0 where a config has none), whose sum is a step's GPU work."""
    if not r.runs["gpu_busy_fraction"].notna().any():
        raise Skip("no GPU busy time: CPU runs, or GPU runs without the profiled window")
    if (configs := r.shown[r.shown["gpu_busy_fraction"].notna()]).empty:
        raise Skip("none of the configs shown has GPU busy time")
    kernels = load_kernels(r.engine, configs["id"])
    wide = kernels.pivot_table(index="run_id", columns="category", values="ms_per_step", aggfunc="sum")
    cols = {f"kernel_ms_{c}": configs["id"].map(wide[c]).fillna(0.0) for c in KERNEL_CATEGORIES if c in wide}
    return configs.assign(**cols), r.shown_note


MEMORY_FIGURES = {
    "cuda": ("peak_allocated_bytes", "peak_reserved_bytes"),
    "cpu": ("peak_allocated_bytes", "rss_growth_bytes"),
}


def memory(r: Any) -> tuple[pd.DataFrame, str]:
    """The shown configs with the memory figures of the report's device (:func:`memory_mode`):
    CUDA allocated and reserved, CPU allocated and RSS growth, or on mixed devices peak_mem_bytes."""
    if not r.runs["peak_mem_bytes"].notna().any():
        raise Skip("no run recorded peak memory")
    drop = {"peak_allocated_bytes", "peak_reserved_bytes", "rss_growth_bytes", "peak_mem_bytes"}
    return r.shown.drop(columns=list(drop - set(MEMORY_FIGURES.get(r.mode, ("peak_mem_bytes",))))), r.shown_note


def pareto_mask(tokens_per_s: pd.Series, mem: pd.Series) -> pd.Series:
    """True for points no other point beats on both throughput (higher) and memory (lower).

    Sorted by memory (ties: faster first), a point is on the front when it is faster than every
    leaner one: one sort and a running maximum, fine for 10,000 runs.
    """
    t = pd.DataFrame({"t": tokens_per_s, "m": mem}).dropna().sort_values(["m", "t"], ascending=[True, False])["t"]
    return (t > t.cummax().shift(fill_value=-np.inf)).reindex(tokens_per_s.index, fill_value=False)


def pareto(r: Any) -> tuple[pd.DataFrame, str]:
    """Every run, ``on_front`` when it is on the Pareto front of tokens/s against peak memory."""
    if (n := int((r.runs["ok"] & r.runs["peak_mem_bytes"].notna()).sum())) < 3:
        raise Skip(f"needs at least 3 configs that finished with a memory figure (has {n})")
    return r.runs.assign(on_front=pareto_mask(r.runs["tokens_per_s"].where(r.runs["ok"]), r.runs["peak_mem_bytes"])), ""


def _detail(r: Any, load: Any) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The configs of the charts that need a query each (the shown ok ones, at most TOP_DETAIL)
    and their rows ``load``-ed from a child table."""
    configs, note = top_configs(r.runs, r.shown[r.shown["ok"]], TOP_DETAIL, r.baseline)
    if configs.empty:
        raise Skip("no run finished ok")
    return configs, load(r.engine, configs["id"]), note or r.shown_note


def breakdown(r: Any) -> tuple[pd.DataFrame, str]:
    """The configs that have stage rows, with ``cpu_ms_<stage>`` and ``gpu_ms_<stage>``: time per
    step in each stage, in step order. GPU columns only where device time was measured (CUDA),
    not copied from the CPU time (``device_time_source = 'same_as_cpu'``)."""
    configs, stages, note = _detail(r, load_stages)
    if stages.empty:
        raise Skip("no stage rows for these runs (profiling was off: profile.enabled=false)")
    cols = {}
    measured = stages[stages["device_time_source"] != "same_as_cpu"]
    for kind, rows, value in (("cpu", stages, "cpu_time_ms"), ("gpu", measured, "device_time_ms")):
        wide = rows.pivot_table(index="run_id", columns="stage", values=value, aggfunc="sum")
        cols |= {f"{kind}_ms_{s}": configs["id"].map(wide[s]) for s in STAGES if s in wide}
    return configs.assign(**cols)[configs["id"].isin(stages["run_id"])], note


def loss(r: Any) -> tuple[pd.DataFrame, str]:
    """Measured steps with a loss, with their config's label and status, in the configs' order."""
    configs, steps, note = _detail(r, load_steps)
    configs = configs.reset_index(drop=True).reset_index().set_index("id")[["index", "label", "status"]]
    frame = steps.dropna(subset=["loss"]).join(configs, on="run_id", how="inner").sort_values(["index", "step"])
    if frame.empty:
        raise Skip("no measured steps with a loss recorded")
    spread = frame.groupby("step")["loss"].agg(lambda v: v.max() - v.min()).max() if len(configs) > 1 else 0
    spread_note = f"largest difference between configs at one step: {spread:.3g} nats" if spread else ""
    return frame.reset_index(drop=True), "; ".join(n for n in (note, spread_note) if n)


def _groups(df: pd.DataFrame, axes: Sequence[str], keep: int, noun: str) -> tuple[pd.Series, str]:
    """Each run's combination of ``axes`` as a label (``seq_len=128 workers=0``), for one line or
    one panel per combination. With more than ``keep`` combinations, only those with the highest
    peak tokens/s keep a label (the rest get NaN), relabelled by what still differs between them."""
    if not axes:
        return pd.Series("", index=df.index), ""
    group = config_labels(df, axes, unique=False)
    best = df["tokens_per_s"].where(df["ok"]).groupby(group).max().sort_values(ascending=False, na_position="last")
    if len(best) <= keep:
        return group, ""
    labels, shared = relabel(df[group.isin(best.index[:keep])], axes, unique=False)
    note = f"{keep} of {len(best)} {noun} (highest peak tokens/s)" + (f"; all {noun}: {shared}" if shared else "")
    return labels.reindex(df.index), note


def scaling(r: Any, max_lines: int = 10) -> tuple[pd.DataFrame, str]:
    """Runs against each of batch and seq_len that varies (``axis``, ``x``), one ``line`` per
    combination of the other differing axes."""
    parts, notes = [], []
    for axis in (a for a in ("batch", "seq_len") if r.runs[a].nunique() > 1):
        line, note = _groups(r.runs, [a for a in label_axes(r.runs) if a != axis], max_lines, "lines")
        parts.append(
            r.runs.assign(axis=axis, x=r.runs[axis], line=line.replace("", "all runs")).dropna(subset=["line"])
        )
        notes.append(note)
    frame = pd.concat(parts).sort_values(["axis", "line", "x"], kind="stable").reset_index(drop=True)
    return frame, "; ".join(dict.fromkeys(n for n in notes if n))


def heatmap(r: Any, max_panels: int = 4) -> tuple[pd.DataFrame, str]:
    """One row per batch x seq_len cell of each ``panel`` (a combination of the other differing
    axes), every cell of the grid present: ``tokens_per_s`` is the median over the cell's ok runs;
    ``status`` says why a cell has none (see :data:`STATUS_ORDER`), NaN if never run."""
    others = [a for a in label_axes(r.runs) if a not in ("batch", "seq_len")]
    panel, note = _groups(r.runs, others, max_panels, "panels")
    runs, keys = r.runs.assign(panel=panel).dropna(subset=["panel"]), ["panel", "seq_len", "batch"]
    grid = pd.MultiIndex.from_product(
        [runs["panel"].unique(), *(sorted(runs[k].unique()) for k in keys[1:])], names=keys
    )
    cells = runs.sort_values("status", key=lambda s: s.map(STATUS_ORDER.index), kind="stable").drop_duplicates(keys)
    cells = cells.set_index(keys)[["status"]].assign(
        tokens_per_s=runs[runs["ok"]].groupby(keys)["tokens_per_s"].median()
    )
    return cells.reindex(grid).reset_index(), note


def factorial_effects(df: pd.DataFrame) -> tuple[pd.DataFrame, str] | None:
    """Main effects and two-factor interactions of the two-level axes that vary, design-of-experiments
    style, on tokens/s and peak memory; None when no block has the complete on/off grid.

    One row per term (``label``: ``amp``, ``ckpt``, ``amp x ckpt``) with, per metric,
    ``effect_<metric>`` = mean at +1 minus mean at -1 (coded levels: off=-1, on=+1; for an
    interaction the product of the codes), in the metric's own unit, and ``effect_pct_<metric>``
    = that as % of the overall mean. Only complete blocks enter: combinations of the other
    differing axes (e.g. batch, seq_len) in which every on/off combination ran ok; the note says
    how many of them there were.
    """
    if not (factors := [a for a in BOOL_AXES if df[a].nunique() > 1]):
        return None
    blocks = [a for a in label_axes(df) if a not in factors]
    cells = df[df["ok"]].groupby([*blocks, *factors], dropna=False)[["tokens_per_s", "peak_mem_bytes"]].mean()
    cells = cells.reset_index()
    by_block = cells.groupby(blocks, dropna=False) if blocks else cells.groupby(np.zeros(len(cells)))
    cells = cells[by_block["tokens_per_s"].transform("size") == 2 ** len(factors)]
    if cells.empty:
        return None
    coded = {f: np.where(cells[f].astype(bool), 1, -1) for f in factors}
    terms = coded | {f"{a} x {b}": coded[a] * coded[b] for a, b in itertools.combinations(factors, 2)}
    out = pd.DataFrame({"label": list(terms)})
    for metric in ("tokens_per_s", "peak_mem_bytes"):
        y = cells[metric].to_numpy(dtype=float)
        effect = np.array([np.nanmean(y[sign > 0]) - np.nanmean(y[sign < 0]) for sign in terms.values()])
        out[f"effect_{metric}"], out[f"effect_pct_{metric}"] = effect, 100.0 * effect / np.nanmean(y)
    if not blocks:
        return out, ""
    used, total = cells.groupby(blocks, dropna=False).ngroups, df.groupby(blocks, dropna=False).ngroups
    note = f"averaged over {used} of {total} combinations of {', '.join(SHORT_NAMES.get(a, a) for a in blocks)}"
    return out, note + (" (the others lack an ok run for some on/off combination)" if used < total else "")


def factors(r: Any) -> tuple[pd.DataFrame, str]:
    """:func:`factorial_effects`, with each effect as text: in its unit and in % of the mean."""
    if (result := factorial_effects(r.runs)) is None:
        varying = ", ".join(a for a in BOOL_AXES if r.runs[a].nunique() > 1)
        raise Skip(
            f"the on/off grid over {varying} is incomplete among ok runs"
            if varying
            else "none of amp, ckpt, compile varies"
        )
    wide, note = result
    tokens = zip(wide["effect_tokens_per_s"], wide["effect_pct_tokens_per_s"], strict=True)
    memory = zip(wide["effect_peak_mem_bytes"], wide["effect_pct_peak_mem_bytes"], strict=True)
    wide["tokens/s effect"] = [f"{v:+,.0f} ({p:+.1f}%)" for v, p in tokens]
    wide["peak memory effect"] = [f"{fmt.mem(v, signed=True)} ({p:+.1f}%)" for v, p in memory]
    return wide, note
