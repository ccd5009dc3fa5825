"""A sweep's configs: its runs grouped by what was measured (repeats as one), named by the axes
that differ, and set against a baseline config.

The terminal summary and the report both read configs from here, so a config with repeats shows
the same figures in both. A config is the runs of a sweep that share ``config_hash``; configs are
named by the axes that differ between them (``amp=on ckpt=off``), so a label never repeats what
every row shares. pandas only: importing this never imports torch or matplotlib.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from perfsweep import metrics
from perfsweep.names import GRID_AXES, ON_OFF_AXES, RUN_STATUSES, SETTING_PREFIX, UNSAVED_STATUS

CONFIG_AXES: tuple[str, ...] = (*GRID_AXES, "amp_dtype", "model_name", "data_name")
"""What identifies a measured configuration: the grid axes plus what they do not cover."""
SHORT_NAMES: dict[str, str] = {"model_name": "model", "data_name": "data", "sweep_id": "sweep"}
STATUS_ORDER: tuple[str, ...] = ("ok", UNSAVED_STATUS, "oom", "skipped", "failed", "timeout", "interrupted", "running")
"""Which run stands for a config, or a heatmap cell, whose runs' statuses differ: the most telling
first (``unsaved``: only in a sweep's summary, see perfsweep.names)."""
assert set(STATUS_ORDER) == {*RUN_STATUSES, UNSAVED_STATUS}


def prepare_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Normalise types across backends and add the columns every chart uses.

    SQLite hands booleans back as 0/1 integers and PostgreSQL as bools; both become bool. A
    column that is NULL in every run loads as object and becomes float, so it plots as empty.
    ``throughput_per_s_lo``/``_hi`` (:func:`metrics.throughput_range`) show how steady a run's
    measured steps were, around its headline.
    ``throughput_per_s`` is the headline every chart and table ranks by: ``tokens_per_s``, or
    ``samples_per_s`` where the runs count samples only (:func:`metrics.rate_unit`).
    """
    empty = {c: float for c in runs.columns if runs[c].dtype == object and runs[c].isna().all()}
    df = runs.astype(dict.fromkeys(ON_OFF_AXES, bool) | empty).sort_values(["sweep_id", "job_num", "id"], kind="stable")
    df = df.copy()  # one block per dtype: added columns do not fragment it
    unit = metrics.rate_unit(df["tokens_per_s"], df["samples_per_s"])
    df["throughput_per_s"] = df[f"{unit}_per_s"]  # a data-parallel job's: all ranks' samples
    lo, hi = metrics.throughput_range(
        df["throughput_per_s"], df["step_time_ms_median"], df["step_time_ms_p10"], df["step_time_ms_p90"]
    )
    ok = (df["status"] == "ok") & df["throughput_per_s"].notna()
    df = df.assign(throughput_per_s_lo=lo, throughput_per_s_hi=hi, ok=ok).reset_index(drop=True)
    return df.assign(label=config_labels(df, label_axes(df)))


SAMPLES_ONLY_WHERE = "tokens_per_s IS NULL AND samples_per_s IS NOT NULL"
"""The ``--where`` filter that reports the samples-counting runs of a mixed sweep on their own."""


def unranked_samples(df: pd.DataFrame) -> pd.Series:
    """Rows (of :func:`prepare_runs` or :func:`per_config`) that trained but have no headline: a
    samples-counting model beside token models, whose samples/s has no common unit with tokens/s."""
    return (df["status"] == "ok") & ~df["ok"] & df["samples_per_s"].notna()


def config_key(df: pd.DataFrame) -> pd.Series:
    """Which config a row (a run, or a config of :func:`per_config`) is: its sweep and
    ``config_hash``; a row without a hash (an old import) is a config of its own."""
    return df["sweep_id"].astype(str) + " " + df["config_hash"].fillna("run " + df["id"].astype(str))


def per_config(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per config (the runs of a sweep that share ``config_hash``), in order of first run.

    ``throughput_per_s`` is the median over the config's ok runs and ``throughput_per_s_lo``/``_hi`` their
    range (with one ok run: its throughput scaled to its p90 and p10 step time); ``runs``, ``ok_runs``
    and ``noisy_runs`` count them, the last by their stored ``noisy`` flag; ``numerics_runs``: the ok
    runs with ``numerics_warning``, so that a repeat that blew up shows whichever run stands for the
    config; ``repeats_disagree``: their
    tokens/s spread as much (:func:`metrics.noisy_iqr`); ``noisy``: either, as the summary flags it. Every
    other column is that of one run, the ok run nearest the median (on a tie, as two repeats always
    are, the earlier run), whose stages, kernels and loss the detail charts draw: the figures of a row
    belong together. Repeats share their stored speedup.
    Config-level columns besides: ``statuses`` ("ok", or "2 ok, 1 failed"), ``first_job_num``,
    ``unsettled`` (an ok run never reached steady state) and ``ok_run_ids`` (a tuple, for resampling).
    """
    key = config_key(runs)
    ok = runs["throughput_per_s"].where(runs["ok"])
    by = ok.groupby(key, sort=False)
    c = pd.DataFrame({"median": by.median(), "lo": by.min(), "hi": by.max(), "runs": by.size(), "ok_runs": by.count()})
    c["noisy_runs"] = (runs["noisy"].eq(1) & runs["ok"]).groupby(key, sort=False).sum()
    c["numerics_runs"] = (runs["numerics_warning"].eq(1) & runs["ok"]).groupby(key, sort=False).sum()
    c["unsettled"] = (runs["steady_state"].eq(0) & runs["ok"]).groupby(key, sort=False).any()
    c["first_job_num"] = runs["job_num"].groupby(key, sort=False).min()
    ok_ids = runs.loc[runs["ok"], "id"].to_numpy()  # one pass, no Python per group: 10,000 configs in ms
    where = key[runs["ok"]].groupby(key[runs["ok"]], sort=False).indices
    c["ok_run_ids"] = [tuple(int(i) for i in ok_ids[where[k]]) if k in where else () for k in c.index]
    c["statuses"] = runs["status"].groupby(key, sort=False).first()
    if (mixed := runs["status"].groupby(key, sort=False).nunique() > 1).any():
        counts = runs[key.map(mixed)].groupby(key)["status"].value_counts(sort=True)
        for k in mixed[mixed].index:
            c.loc[k, "statuses"] = ", ".join(f"{n} {status}" for status, n in counts[k].items())
    spread = ok[key.map(c["ok_runs"]) > 1].dropna().groupby(key).agg(metrics.iqr)  # failed repeats are not spread
    c["repeats_disagree"] = metrics.noisy_iqr(spread.reindex(c.index), c["median"])
    c["noisy"] = (c["noisy_runs"] > 0) | c["repeats_disagree"]
    c = c.loc[key].set_axis(runs.index)
    rank = runs.assign(
        _first=runs.index.to_series().groupby(key).transform("min"),
        # relative and rounded: two repeats lie equally far from their median, and the last bit of a
        # float picked either one (the later repeat for one config, the earlier for the next)
        _far=((ok - c["median"]).abs() / c["median"].abs()).round(9).fillna(np.inf),
        _status=runs["status"].map(STATUS_ORDER.index),
    )
    chosen = rank.sort_values(["_first", "_far", "_status"], kind="stable").drop_duplicates("_first").index
    several = c["ok_runs"] > 1
    out = runs.assign(
        throughput_per_s=c["median"],
        throughput_per_s_lo=c["lo"].where(several, runs["throughput_per_s_lo"]),
        throughput_per_s_hi=c["hi"].where(several, runs["throughput_per_s_hi"]),
        **{k: c[k] for k in c.columns if k not in ("median", "lo", "hi")},
    )
    out = out.loc[chosen].reset_index(drop=True)
    return out.assign(label=config_labels(out, label_axes(out))).copy()


def label_axes(df: pd.DataFrame) -> list[str]:
    """The config axes whose values differ between runs; ``sweep_id`` too when it disambiguates."""
    candidates = [*CONFIG_AXES, *setting_columns(df)]
    axes = [a for a in candidates if a in df.columns and df[a].nunique(dropna=False) > 1]
    if "sweep_id" in df.columns and df["sweep_id"].nunique() > 1 and df.duplicated(axes or list(CONFIG_AXES)).any():
        axes.append("sweep_id")
    return axes


def swept_axes(keys: Sequence[str], columns: Sequence[str]) -> list[str]:
    """The label axes of a grid's override keys (``amp``, ``model``, ``model.width``): what a summary
    shows for each axis the grid varies, also when the runs stored so far do not vary it (a sweep
    stopped after its first job). ``model``/``data`` are ``model_name``/``data_name``; a key
    outside the axes is its ``cfg.<key>`` setting column, where ``columns`` has one."""
    out = []
    for axis in map(axis_of, keys):
        if axis in columns and axis not in out:
            out.append(axis)
    return out


def axis_of(key: str) -> str:
    """The column a grid's override key labels configs by: its config axis (``model`` is
    ``model_name``), or else its ``cfg.<key>`` setting column (``model.width``, ``threads``)."""
    axis = {short: long for long, short in SHORT_NAMES.items()}.get(key, key)
    return axis if axis in CONFIG_AXES else SETTING_PREFIX + key


def setting_columns(df: pd.DataFrame) -> list[str]:
    """The ``cfg.<key>`` columns (:data:`perfsweep.names.SETTING_PREFIX`): settings outside the
    axes that tell configs apart, added by perfsweep.results where a sweep varies them."""
    return [c for c in df.columns if isinstance(c, str) and c.startswith(SETTING_PREFIX)]


def axis_name(axis: str) -> str:
    """How labels and tables name an axis: ``model`` for model_name, ``model.width`` for cfg.model.width."""
    return SHORT_NAMES.get(axis, axis.removeprefix(SETTING_PREFIX))


def value_text(axis: str, value: Any) -> str:
    """How a value of an axis is shown: ``on``/``off`` for a technique, ``8`` (not ``8.0``) for a
    number pandas made a float, ``null`` for a setting left unset (``nproc=null``: no DDP)."""
    if axis in ON_OFF_AXES:
        return "on" if bool(value) else "off"
    if isinstance(value, float) and value != value:  # NaN: the key was null in that config
        return "null"
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:  # lr=1e30: 1e+30, not 31 digits
        return str(int(value))
    return str(value)


OLD_MFU_NOTE = (
    "* MFU an older perfsweep stored (schema before 0004): over the device's bf16 peak whatever the run's "
    "dtype, so an fp32 run's share of its own peak is higher (on an H100 SXM: 989 against 67 TFLOP/s)"
)


def old_mfu(configs: pd.DataFrame) -> pd.Series:
    """Rows whose MFU an older perfsweep stored: taken over the bf16 peak whatever the run's dtype,
    and kept by the upgrade (migration 0004) without the peak it used. Shown marked, never as a
    share of the run's own dtype's peak, which they are not."""
    return configs["mfu"].notna() & configs["mfu_peak_flops"].isna()


COMPILE_NOTE = (
    "compile s: what the first compiled step took beyond a steady one (torch.compile's compile), and the steps "
    "after which its faster steps repay it against the same config eager (none shown: no eager twin, or not faster)"
)


def compiled(configs: pd.DataFrame) -> pd.Series:
    """Configs compiled with a measured compile time: the summary and report show that time."""
    return configs["compile"].astype(bool) & configs["compile_time_ms"].notna()


def compile_column(configs: pd.DataFrame) -> list[str]:
    """The summary's and report's ``compile s (payback)``: ``13.3 (403 steps)``, a compiled config's
    compile seconds and its payback (:data:`COMPILE_NOTE`); ``13.3`` where none is stored; ``-``
    for an eager config."""

    def text(is_compiled: bool, compile_time_ms: float, payback_steps: Any) -> str:
        if not is_compiled:
            return "-"
        paid = not pd.isna(payback_steps)
        return f"{compile_time_ms / 1000:,.1f}" + (f" ({payback_steps:,.0f} steps)" if paid else "")

    cells = zip(compiled(configs), configs["compile_time_ms"], configs["compile_payback_steps"], strict=True)
    return [text(*c) for c in cells]


def mfu_column(configs: pd.DataFrame) -> list[str]:
    """The summary's and report's MFU: ``48.1% of fp32``; ``3.2% of bf16*`` for an older row
    (:func:`old_mfu`, :data:`OLD_MFU_NOTE`); ``-`` where the device has no known peak."""

    def text(mfu: Any, compute_dtype: Any, peak_flops: Any) -> str:
        if pd.isna(mfu):
            return "-"
        if pd.isna(peak_flops):
            return f"{mfu:.1%} of bf16*"
        return f"{mfu:.1%}" + (f" of {compute_dtype}" if isinstance(compute_dtype, str) else "")

    return [text(*r) for r in configs[["mfu", "mfu_compute_dtype", "mfu_peak_flops"]].values]


def axis_text(axis: str, value: Any) -> str:
    """``amp=on``, ``batch=8``, ``model=tiny``, ``model.width=64``: one axis of a config label."""
    return f"{axis_name(axis)}={value_text(axis, value)}"


def config_labels(df: pd.DataFrame, axes: Sequence[str], unique: bool = True) -> pd.Series:
    """``amp=on ckpt=off`` from the differing axes; with ``unique``, run ids break ties (``#7``).

    With no differing axis (one config) the label names the model and shape, plus each technique
    that is on (``tiny batch=8 seq_len=256 amp=on compile=on``): a headline that hid a compiled or
    AMP run would read as a plain eager one."""
    if axes:
        labels = [" ".join(parts) for parts in zip(*([axis_text(a, v) for v in df[a]] for a in axes), strict=True)]
    else:
        techniques = [a for a in ON_OFF_AXES if a in df.columns]
        rows = df[["model_name", "batch", "seq_len", *techniques]].itertuples(False)
        labels = [
            f"{m} batch={b}"
            + ("" if pd.isna(s) else f" seq_len={s}")
            + "".join(f" {a}=on" for a, on in zip(techniques, flags, strict=True) if pd.notna(on) and bool(on))
            for m, b, s, *flags in rows
        ]
    out = pd.Series(labels, index=df.index, dtype=object)
    dup = out.duplicated(keep=False) & unique
    # built in Python: pandas 3.0 with pyarrow refuses object + its own str dtype (even when empty)
    out[dup] = [f"{label} #{run_id}" for label, run_id in zip(out[dup], df.loc[dup, "id"], strict=True)]
    return out


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
            like = difflib.get_close_matches(key, list(names), n=1)
            hint = f"did you mean {names[like[0]]}? " if like else ""
            raise ValueError(f"unknown axis {key!r} ({hint}axes: {', '.join(CONFIG_AXES)})")
        if axis in ON_OFF_AXES and value.lower() not in BOOL_WORDS:
            raise ValueError(f"{key}={value!r}: expected true or false")
        if axis in INT_AXES and not value.lstrip("-").isdigit():
            raise ValueError(f"{key}={value!r}: expected an integer")
        if axis in spec:  # batch=4,batch=8 kept the last without a word: one config has one value per axis
            raise ValueError(f"{key}={value!r}: {axis} is given twice; a baseline is one config, one value per axis")
        spec[axis] = BOOL_WORDS[value.lower()] if axis in ON_OFF_AXES else int(value) if axis in INT_AXES else value
    if not spec:
        raise ValueError("empty config; expected e.g. amp=false,ckpt=false")
    return spec


def fewest_on(settings: Sequence[Any]) -> list[int]:
    """Where names.BASELINE_RULE looks, among ok configs in grid order (each a mapping of its
    axes): the positions of those with the fewest of ON_OFF_AXES on. The first is the default
    baseline, of the stored speedups (perfsweep.summary.fill_speedups) and of a report alike."""
    on = [sum(bool(s[a]) for a in ON_OFF_AXES) for s in settings]
    fewest = min(on, default=0)
    return [i for i, n in enumerate(on) if n == fewest]


def baseline(
    configs: pd.DataFrame,
    spec: dict[str, Any] | None = None,
    throughput: Sequence[metrics.Throughput] | None = None,
    intervals_for: int | None = None,
) -> tuple[pd.DataFrame, str]:
    """The configs with ``is_baseline`` and their ``speedup`` over it, and how it was chosen: the
    first ok config in grid order matching ``spec``, by default the first with the fewest of amp,
    ckpt and compile on (the rule of the sweep's stored speedups, names.BASELINE_RULE).

    A given spec that matches no ok config is an error (the user asked for something absent).
    Where the baseline is the one a config's speedup was stored against (same sweep and
    ``baseline_config_hash``), the stored speedup, 95% interval and verdict are kept; elsewhere
    (a ``--baseline`` of your own, another sweep, runs from before intervals were stored) they are
    computed the same way from each config's ``throughput`` (:func:`metrics.speedups`), for the
    ``intervals_for`` fastest configs only when given (what a report shows: 10,000 intervals would
    take a minute), and without it (or without steps to resample) the speedup is the ratio of
    median tokens/s.
    """
    ok = configs[configs["ok"]].sort_values(["sweep_id", "grid_index"], kind="stable")  # grid order, not run order
    if spec:
        hits, how = ok[(ok[list(spec)] == pd.Series(spec)).all(axis=1)], "as requested"
        if hits.empty:
            raise ValueError(f"no ok run matches {','.join(f'{k}={v}' for k, v in spec.items())}")
    else:
        hits = ok.iloc[fewest_on(ok[list(ON_OFF_AXES)].to_dict("records"))]
        how = "default: amp, ckpt and compile off"
        if len(hits) and any(bool(hits.iloc[0][a]) for a in ON_OFF_AXES):
            how = "default: the fewest of amp, ckpt and compile on, none having all three off"
    if len(hits) > 1:
        how += f"; first of {len(hits)} matching configs"
    base = hits.iloc[0] if len(hits) else pd.Series({"throughput_per_s": None}, name=None)
    stored = configs["speedup"].notna() & configs["sweep_id"].eq(base.get("sweep_id"))
    stored &= configs["baseline_config_hash"].eq(base.get("config_hash"))
    point = metrics.speedup(configs["throughput_per_s"], base["throughput_per_s"])
    out = configs.assign(is_baseline=configs.index == base.name, speedup=configs["speedup"].where(stored, point))
    for c in ("speedup_ci_lo", "speedup_ci_hi", "speedup_basis", "speedup_verdict"):
        out[c] = configs[c].where(stored).astype(float if c.startswith("speedup_ci") else object)
    out.loc[out["is_baseline"], "speedup_verdict"] = "baseline"  # as fill_speedups stores it for its own
    if throughput is not None and base.name is not None:
        fastest = configs["throughput_per_s"].where(configs["ok"]).rank(ascending=False, method="first")
        shown = fastest <= (intervals_for or len(configs))
        todo = np.flatnonzero(~stored & configs["ok"] & ~out["is_baseline"] & shown)
        figures = metrics.speedups([throughput[i] for i in todo], throughput[configs.index.get_loc(base.name)])
        for i, figure in zip(todo, figures, strict=True):
            if figure is not None:
                out.loc[out.index[i], list(SPEEDUP)] = list(figure.row().values())
    return out, how


SPEEDUP = ("speedup", "speedup_ci_lo", "speedup_ci_hi", "speedup_basis", "speedup_verdict")


def throughputs(configs: pd.DataFrame, runs: pd.DataFrame, steps: pd.DataFrame) -> list[metrics.Throughput]:
    """What each config's tokens/s interval is resampled from (:class:`perfsweep.metrics.Throughput`):
    its ok runs' tokens/s and their measured step times (``steps``: run_id, step_time_ms, in order)."""
    by_run = runs.set_index("id")["throughput_per_s"]
    # a dict: a run id is a key, never a position. With no steps (runs an older perfsweep stored)
    # the grouped Series had an object index, and pandas 2 took .get(3) as its fourth element
    times = steps.groupby("run_id")["step_time_ms"].agg(list).to_dict()
    return [
        metrics.Throughput([by_run[i] for i in ids], [times.get(i, []) for i in ids]) for ids in configs["ok_run_ids"]
    ]


def concurrency_note(parallel: Any, hydra_launcher: Any) -> str:
    """A warning for a sweep whose jobs may have run side by side (``sweeps.parallel`` > 1): then a
    job was not alone on its machine, and its timings are not those of a job run alone. The
    terminal summary and report.md both show it."""
    if pd.isna(parallel) or parallel <= 1:
        return ""
    if hydra_launcher == "SlurmLauncher":
        return (
            f"Up to {parallel:.0f} jobs ran at a time on the cluster; jobs that shared a node shared its memory "
            "bandwidth, PCIe and host, and perturb each other's timings (runs.hostname, runs.cpu_affinity and "
            "runs.slurm_job_id say where each ran)."
        )
    how = (
        "launcher.parallel" if hydra_launcher in (None, "BasicLauncher") or pd.isna(hydra_launcher) else hydra_launcher
    )
    return (
        f"Up to {parallel:.0f} jobs ran at a time on this machine ({how}), sharing memory bandwidth, PCIe and "
        "the host: their timings perturb each other (runs.cpu_affinity and runs.cuda_visible_devices say what "
        "each job had). Compare configs within this sweep; for figures of a job alone, run one job at a time."
    )
