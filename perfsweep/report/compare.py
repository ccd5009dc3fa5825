"""Compare two sweeps config by config: did throughput change, and is the change real?

Configs are matched on what was measured (:data:`perfsweep.configs.CONFIG_AXES`: the grid axes
plus amp_dtype, model and data), not on job numbers, so sweeps run in a different order or with
extra configs still line up. Each change comes with a 95% bootstrap interval
(:meth:`perfsweep.metrics.Throughput.ratio`: over repeats when both configs have them, else over
measured steps in blocks); a change whose interval contains 0 is "no measurable difference",
whatever its sign. Runs without stored steps (imported rows) fall back to comparing throughput
ranges: no difference when they overlap.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy.engine import Engine

from perfsweep import metrics
from perfsweep.cli import UserError
from perfsweep.configs import CONFIG_AXES, config_labels, label_axes, per_config, setting_columns, throughputs
from perfsweep.names import NOISY_IQR_FRACTION
from perfsweep.report import charts, fmt
from perfsweep.report.build import default_out_dir, publishing, stored_rules
from perfsweep.report.charts import ChartSpec, Panel
from perfsweep.results import load_child, load_sweep_runs

log = logging.getLogger(__name__)

TOP_COMPARE = 30
"""Most configs in compare.png (the largest changes); compare.md lists all of them."""
VALUES = (
    "id",
    "status",
    "throughput_per_s",
    "throughput_per_s_lo",
    "throughput_per_s_hi",
    "peak_mem_bytes",
    "step_time_ms_median",
    "noisy",
    "noisy_rule",
    "numerics_runs",
)
CHANGE = ("change_pct", "change_pct_ci_lo", "change_pct_ci_hi", "change_basis")
VERDICT_COLORS = {"faster": charts.GOOD, "slower": charts.BAD, metrics.NO_DIFFERENCE: charts.LIGHT}
COMPARE = ChartSpec(
    "compare",
    "tokens/s per config",
    (
        Panel(
            ("throughput_per_s_a", "throughput_per_s_b"),
            colors={"A": charts.BAR, "B": charts.BASE},
            err=(
                ("throughput_per_s_lo_a", "throughput_per_s_hi_a"),
                ("throughput_per_s_lo_b", "throughput_per_s_hi_b"),
            ),
        ),
        Panel(
            ("change_pct",),
            title="whisker: 95% interval of the change",
            color=lambda f: [VERDICT_COLORS.get(v, charts.BASE) for v in f["verdict"]],
            text=lambda f: [f"{c:+.1f}%" if pd.notna(c) else v for c, v in f[["change_pct", "verdict"]].values],
            label="change in tokens/s, A vs B",
            err=(("change_pct_ci_lo", "change_pct_ci_hi"),),
            err_label="95% interval",
            ref=0,
        ),
    ),
    side_by_side=True,
    legend=tuple(VERDICT_COLORS.items()),
)


def compare_frame(a: pd.DataFrame, b: pd.DataFrame, runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Matched configs of sweep A (candidate) and B (reference) with the change and its verdict.

    ``a`` and ``b`` are configs (:func:`perfsweep.configs.per_config`); a config measured twice
    otherwise counts with its last row. ``runs`` has their runs' tokens/s, ``steps`` (run_id,
    step_time_ms) their measured steps, which are resampled. ``change_pct`` is A's tokens/s over
    B's, less 1, in %, with its interval and ``change_basis`` (repeats, steps, or ranges where there
    was nothing to resample); ``verdict`` is faster / slower / no measurable difference, or says
    which side is missing or did not finish.
    """
    axes = [*CONFIG_AXES, *setting_columns(runs)]  # and the settings a sweep varies beyond the axes
    cols = [*axes, *VALUES, "error", "throughput"]
    a, b = (c.assign(throughput=throughputs(c, runs, steps)).sort_values("id") for c in (a, b))
    a, b = (c.drop_duplicates(axes, keep="last")[cols] for c in (a, b))
    m = a.merge(b, on=axes, how="outer", suffixes=("_a", "_b"), indicator="side")
    m["label"] = config_labels(m.assign(id=m["id_a"].fillna(m["id_b"]).astype("Int64")), label_axes(m))
    m[[*CHANGE, "verdict"]] = pd.DataFrame([_change(r) for r in m.itertuples(index=False)], index=m.index)
    both = [f"{c}_{s}" for c in (*VALUES, "error") for s in "ab"]
    return m[["label", "verdict", *CHANGE, *both, *axes]]


def _change(r: Any) -> tuple[float, float, float, str | None, str]:
    """(change %, its interval, basis, verdict) of a matched row."""
    nan = float("nan")
    if r.side != "both":
        return nan, nan, nan, None, "only in A" if r.side == "left_only" else "only in B"
    if r.status_a != "ok" or pd.isna(r.throughput_per_s_a):
        return nan, nan, nan, None, f"{r.status_a} in A" + ("" if r.status_b == "ok" else f", {r.status_b} in B")
    if r.status_b != "ok" or pd.isna(r.throughput_per_s_b):
        return nan, nan, nan, None, f"{r.status_b} in B"
    if (basis := r.throughput_a.basis(r.throughput_b)) is not None:
        iv = r.throughput_a.ratio(r.throughput_b)
        return 100 * (iv.value - 1), 100 * (iv.lo - 1), 100 * (iv.hi - 1), basis, metrics.verdict(iv)
    change = float(metrics.change_pct(r.throughput_per_s_a, r.throughput_per_s_b))
    overlap = metrics.ranges_overlap(
        r.throughput_per_s_lo_a, r.throughput_per_s_hi_a, r.throughput_per_s_lo_b, r.throughput_per_s_hi_b
    )
    verdict = metrics.NO_DIFFERENCE if overlap else "faster" if change > 0 else "slower"
    return change, nan, nan, "ranges", verdict


def build_compare(engine: Engine, a: int, b: int, out_dir: Path | None = None, where: str | None = None) -> Path:
    """Write compare.png, compare.md and compare.csv of sweep ``a`` against reference sweep ``b``;
    returns their folder (default: ``compare_vs_<b>`` in the folder of sweep ``a``)."""
    sweeps, runs = load_sweep_runs(engine, [a, b], where)
    sides = {s: runs[runs["sweep_id"] == s] for s in (a, b)}
    if empty := [s for s, r in sides.items() if r.empty]:
        raise UserError(f"sweep {empty[0]} has no runs" + (f" matching --where {where!r}" if where else ""))
    configs = [per_config(r) for r in sides.values()]
    steps = load_child(engine, "steps", [i for c in configs for ids in c["ok_run_ids"] for i in ids])
    cmp = compare_frame(*configs, runs, steps)
    if cmp["verdict"].isin(["only in A", "only in B"]).all():
        raise UserError(
            f"sweeps {a} and {b} have no config in common (configs are matched on {', '.join(CONFIG_AXES)}); "
            "compare sweeps that ran the same grid points, or use perfsweep report --sweep A --sweep B"
        )
    rate = fmt.RATES[metrics.rate_unit(runs["tokens_per_s"], runs["samples_per_s"])]
    out = (
        Path(out_dir)
        if out_dir is not None
        else default_out_dir(sweeps, a, f"compare_vs_{b}", f"compare_{a}_vs_{b}", variant=where or None)
    )
    names = {s: f"sweep {s} ({sweeps.loc[sweeps['id'] == s, 'name'].iloc[0]})" for s in (a, b)}
    shown, note = cmp[~cmp["verdict"].isin(["only in A", "only in B"])], f"A: {names[a]}, B: {names[b]}"
    if len(shown) > TOP_COMPARE:
        shown = shown.loc[shown["change_pct"].abs().sort_values(ascending=False).index[:TOP_COMPARE]]
        note += f"; {TOP_COMPARE} largest changes of {len(cmp):,} configs"
    with publishing(out, [] if not shown.empty else ["compare.png"]) as new:
        if not shown.empty:
            charts.save(
                charts.draw(charts.for_rate(COMPARE, rate), shown.reset_index(drop=True), note), new / "compare.png"
            )
        md = compare_md(cmp, sides[a], sides[b], names[a], names[b], not shown.empty, where)
        (new / "compare.md").write_text(fmt.for_rate(md, rate))  # its texts say tokens/s
        cmp.to_csv(new / "compare.csv", index=False)
    log.info("compare of sweep %s vs %s: %s", a, b, out)
    return out


def compare_md(
    cmp: pd.DataFrame,
    runs_a: pd.DataFrame,
    runs_b: pd.DataFrame,
    a: str,
    b: str,
    chart: bool,
    where: str | None = None,
) -> str:
    """compare.md: every matched config with both sweeps' figures and the verdict, then the
    environment of each sweep, since a change there can explain a change in speed; the
    ``--where`` filter, when one was given, so a filtered comparison says it is one."""
    table = pd.DataFrame({"config": cmp["label"]})
    for s in "ab":
        table[f"tokens/s {s.upper()}"] = cmp[f"throughput_per_s_{s}"].map(fmt.num)
        ranges = zip(cmp[f"throughput_per_s_lo_{s}"], cmp[f"throughput_per_s_hi_{s}"], strict=True)
        table[f"range {s.upper()}"] = [fmt.span(lo, hi) for lo, hi in ranges]
    change = cmp[["change_pct", "change_pct_ci_lo", "change_pct_ci_hi"]].itertuples(index=False)
    table["change (95% CI)"] = [
        fmt.num(v, "{:+.1f}%") + ("" if fmt.missing(lo) else f" ({lo:+.1f} to {hi:+.1f})") for v, lo, hi in change
    ]
    flags = pd.DataFrame({s.upper(): cmp[f"noisy_{s}"].eq(True) for s in "ab"})  # NaN: that side has no run
    table = table.assign(
        verdict=cmp["verdict"],
        **{f"peak mem {s.upper()}": cmp[f"peak_mem_bytes_{s}"].map(fmt.mem) for s in "ab"},
        noisy=[", ".join(flags.columns[row]) for row in flags.to_numpy()],
    )
    numerics = pd.DataFrame({s.upper(): cmp[f"numerics_runs_{s}"].gt(0) for s in "ab"})  # perfsweep.audit's flag
    if numerics.any(axis=None):
        table["numerics"] = [", ".join(numerics.columns[row]) for row in numerics.to_numpy()]
    counts = ", ".join(f"{c} {v}" for v, c in cmp["verdict"].value_counts().items())
    if flags.any(axis=None):
        flagged = pd.concat([cmp.loc[flags[s.upper()], f"noisy_rule_{s}"] for s in "ab"]).rename("noisy_rule")
        counts += (
            f". **noisy**: that side's step times broke the rule stored with its runs ({stored_rules(flagged.to_frame())}), "
            f"or its repeats' tokens/s spread by more than {NOISY_IQR_FRACTION:.0%} of their median; its verdict may "
            "not hold on a quieter machine"
        )
    if numerics.any(axis=None):
        counts += (
            ". **numerics**: a run of that side had a loss that was NaN or infinite, left its FP32-eager twin's, or "
            "fp16's GradScaler skipped measured steps (see each sweep's report): its speed is not that of the "
            "training you meant"
        )
    image = "![compare](compare.png)\n\n" if chart else ""
    scope = f"\n\nFilter (`--where`): `{where}`" if where else ""
    return f"""# perfsweep compare: {a} vs {b}

A = {a} is compared with the reference B = {b}. Configs are matched on {", ".join(CONFIG_AXES)}. \
change = tokens/s of A / tokens/s of B - 1, with its 95% bootstrap interval: over repeats when both configs have \
them, else over measured steps resampled in blocks. A change whose interval contains 0 is **{metrics.NO_DIFFERENCE}**. \
Runs with no stored steps have no interval: there the throughput ranges decide (range: over a config's repeats, or \
for one run its tokens/s scaled to its p90 and p10 step time).

**{len(cmp)} config{"s" if len(cmp) != 1 else ""}:** {counts}.{scope}

{image}{fmt.table(table, right=[c for c in table.columns if c not in ("config", "verdict", "noisy", "numerics")])}

## Environment

Where the two sweeps ran differently; a change in any of these can explain a change in speed.

{fmt.environment({"A": runs_a, "B": runs_b})}

`compare.csv` has every column of this comparison.
"""
