"""Compare two sweeps config by config: did throughput change, and is the change bigger than noise?

Configs are matched on what was measured (:data:`frames.CONFIG_AXES`: the grid axes plus
amp_dtype, model and data), not on job numbers, so sweeps run in a different order or with extra
configs still line up. A change counts as real only when the two throughput ranges (over a config's
repeats, or for one run its p10-p90) do not overlap (:func:`metrics.ranges_overlap`); otherwise it
is "within noise", whatever its sign.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy.engine import Engine

from perfsweep import metrics
from perfsweep.cli import UserError
from perfsweep.report import charts, fmt, frames
from perfsweep.report.build import default_out_dir, load_report_runs
from perfsweep.report.charts import ChartSpec, Panel

log = logging.getLogger(__name__)

TOP_COMPARE = 30
"""Most configs in compare.png (the largest changes); compare.md lists all of them."""
VALUES = ("id", "status", "tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi", "peak_mem_bytes", "step_time_ms_median")
VERDICT_COLORS = {"faster": charts.GOOD, "slower": charts.BAD, "within noise": charts.BASE}
COMPARE = ChartSpec(
    "compare",
    "tokens/s per config",
    (
        Panel(
            ("tokens_per_s_a", "tokens_per_s_b"),
            title="within noise: the throughput ranges of the two sweeps overlap",
            colors={"A": charts.BAR, "B": charts.BASE},
            err=(("tokens_per_s_lo_a", "tokens_per_s_hi_a"), ("tokens_per_s_lo_b", "tokens_per_s_hi_b")),
        ),
        Panel(
            ("change_pct",),
            color=lambda f: [VERDICT_COLORS.get(v, charts.BASE) for v in f["verdict"]],
            text=lambda f: [f"{c:+.1f}% {v}" if pd.notna(c) else v for c, v in f[["change_pct", "verdict"]].values],
            label="change in tokens/s, A vs B",
            ref=0,
        ),
    ),
    side_by_side=True,
    legend=tuple(VERDICT_COLORS.items()),
)


def compare_frame(configs_a: pd.DataFrame, configs_b: pd.DataFrame) -> pd.DataFrame:
    """Matched configs of sweep A (candidate) and B (reference) with change and verdict.

    The inputs are configs (:func:`frames.per_config`: repeats as one, their median tokens/s and
    range); a config measured twice otherwise counts with its last row. ``change_pct`` is A's
    tokens/s relative to B's (:func:`metrics.change_pct`); ``within_noise`` is True when the
    ranges overlap; ``verdict`` is faster / slower / within noise, or says which side is missing
    or did not finish.
    """
    axes, cols = list(frames.CONFIG_AXES), [*frames.CONFIG_AXES, *VALUES, "error"]
    a, b = (r.sort_values("id").drop_duplicates(axes, keep="last")[cols] for r in (configs_a, configs_b))
    m = a.merge(b, on=axes, how="outer", suffixes=("_a", "_b"), indicator="side")
    m["label"] = frames.config_labels(m.assign(id=m["id_a"].fillna(m["id_b"]).astype("Int64")), frames.label_axes(m))
    m["change_pct"] = metrics.change_pct(m["tokens_per_s_a"], m["tokens_per_s_b"])
    overlap = metrics.ranges_overlap(*(m[f"tokens_per_s_{end}_{s}"] for s in "ab" for end in ("lo", "hi")))
    m["within_noise"] = overlap & m["tokens_per_s_a"].notna() & m["tokens_per_s_b"].notna()
    m["verdict"] = [_verdict(r) for r in m.itertuples(index=False)]
    both = [f"{c}_{s}" for c in (*VALUES, "error") for s in "ab"]
    return m[["label", "verdict", "change_pct", "within_noise", *both, *axes]]


def _verdict(r: Any) -> str:
    if r.side != "both":
        return "only in A" if r.side == "left_only" else "only in B"
    if r.status_a != "ok" or pd.isna(r.tokens_per_s_a):
        return f"{r.status_a} in A" if r.status_b == "ok" else f"{r.status_a} in A, {r.status_b} in B"
    if r.status_b != "ok" or pd.isna(r.tokens_per_s_b):
        return f"{r.status_b} in B"
    return "within noise" if r.within_noise else "faster" if r.change_pct > 0 else "slower"


def build_compare(engine: Engine, a: int, b: int, out_dir: Path | None = None, where: str | None = None) -> Path:
    """Write compare.png, compare.md and compare.csv of sweep ``a`` against reference sweep ``b``;
    returns their folder (default: ``compare_vs_<b>`` in the folder of sweep ``a``)."""
    sweeps, runs = load_report_runs(engine, [a, b], where)
    sides = {s: runs[runs["sweep_id"] == s] for s in (a, b)}
    if empty := [s for s, r in sides.items() if r.empty]:
        raise UserError(f"sweep {empty[0]} has no runs" + (f" matching --where {where!r}" if where else ""))
    cmp = compare_frame(*(frames.per_config(r) for r in sides.values()))
    out = Path(out_dir) if out_dir is not None else default_out_dir(sweeps, a, f"compare_vs_{b}", f"compare_{a}_vs_{b}")
    out.mkdir(parents=True, exist_ok=True)
    names = {s: f"sweep {s} ({sweeps.loc[sweeps['id'] == s, 'name'].iloc[0]})" for s in (a, b)}
    shown, note = cmp[~cmp["verdict"].isin(["only in A", "only in B"])], f"A: {names[a]}, B: {names[b]}"
    if len(shown) > TOP_COMPARE:
        shown = shown.loc[shown["change_pct"].abs().sort_values(ascending=False).index[:TOP_COMPARE]]
        note += f"; {TOP_COMPARE} largest changes of {len(cmp):,} configs"
    (out / "compare.png").unlink(missing_ok=True)
    if not shown.empty:
        charts.save(charts.draw(COMPARE, shown.reset_index(drop=True), note), out / "compare.png")
    (out / "compare.md").write_text(compare_md(cmp, sides[a], sides[b], names[a], names[b], not shown.empty))
    cmp.to_csv(out / "compare.csv", index=False)
    log.info("compare of sweep %s vs %s: %s", a, b, out)
    return out


def compare_md(cmp: pd.DataFrame, runs_a: pd.DataFrame, runs_b: pd.DataFrame, a: str, b: str, chart: bool) -> str:
    """compare.md: every matched config with both sweeps' figures and the verdict, then the
    environment of each sweep, since a change there can explain a change in speed."""
    table = pd.DataFrame({"config": cmp["label"]})
    for s in "ab":
        table[f"tokens/s {s.upper()}"] = cmp[f"tokens_per_s_{s}"].map(fmt.num)
        ranges = zip(cmp[f"tokens_per_s_lo_{s}"], cmp[f"tokens_per_s_hi_{s}"], strict=True)
        table[f"range {s.upper()}"] = [fmt.span(lo, hi) for lo, hi in ranges]
    table = table.assign(change=[fmt.num(v, "{:+.1f}%") for v in cmp["change_pct"]], verdict=cmp["verdict"])
    table["peak mem A"], table["peak mem B"] = (
        cmp["peak_mem_bytes_a"].map(fmt.mem),
        cmp["peak_mem_bytes_b"].map(fmt.mem),
    )
    counts = ", ".join(f"{c} {v}" for v, c in cmp["verdict"].value_counts().items())
    image = "![compare](compare.png)\n\n" if chart else ""
    return f"""# perfsweep compare: {a} vs {b}

A = {a} is compared with the reference B = {b}. Configs are matched on {", ".join(frames.CONFIG_AXES)}. \
change = tokens/s of A / tokens/s of B - 1. A change is **within noise** when the throughput ranges of A and B \
overlap: the range over a config's repeats, or for a config with one run the throughput at its p90 and p10 step time.

**{len(cmp)} configs:** {counts}.

{image}{fmt.table(table, right=[c for c in table.columns if c not in ("config", "verdict")])}

## Environment

A change in any of these can explain a change in speed.

{fmt.environment({"A": runs_a, "B": runs_b})}

`compare.csv` has every column of this comparison.
"""
