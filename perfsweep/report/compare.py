"""Compare two sweeps config by config: did throughput change, and is the change bigger than noise?

Configs are matched on what was measured (:data:`MATCH_AXES`: the grid axes plus amp_dtype,
model and data), not on job numbers, so sweeps run in a different order or with extra
configs still line up. A change counts as real only when the two p10-p90 throughput ranges
do not overlap; otherwise it is reported as "within noise", whatever its sign.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy.engine import Engine

from perfsweep.cli import UserError
from perfsweep.report import charts, frames
from perfsweep.report import markdown as md
from perfsweep.report.load import load_runs, load_sweeps

log = logging.getLogger(__name__)

MATCH_AXES: tuple[str, ...] = frames.CONFIG_AXES
TOP_COMPARE = 30
"""Most configs in compare.png (the largest changes); compare.md lists all of them."""

_VALUE_COLS = (
    "id",
    "status",
    "tokens_per_s",
    "tokens_per_s_lo",
    "tokens_per_s_hi",
    "peak_mem_bytes",
    "step_time_ms_median",
    "error",
)


def latest_per_config(runs: pd.DataFrame) -> pd.DataFrame:
    """One run per config: the last one (highest id) when a sweep measured a config twice."""
    return runs.sort_values("id").drop_duplicates(list(MATCH_AXES), keep="last")


def compare_frame(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> pd.DataFrame:
    """Matched configs of sweep A (candidate) and B (reference) with change and verdict.

    Both inputs are prepared runs (:func:`frames.prepare_runs`). ``change_pct`` is
    A's tokens/s relative to B's, in %; ``within_noise`` is True when the p10-p90 ranges
    overlap; ``verdict`` is faster / slower / within noise, or says which side is missing
    or did not finish.
    """
    a = latest_per_config(runs_a)[[*MATCH_AXES, *_VALUE_COLS]]
    b = latest_per_config(runs_b)[[*MATCH_AXES, *_VALUE_COLS]]
    m = a.merge(b, on=list(MATCH_AXES), how="outer", suffixes=("_a", "_b"), indicator="side")
    axes = frames.label_axes(m[list(MATCH_AXES)].assign(id=0))
    m["label"] = frames.config_labels(m.assign(id=m["id_a"].fillna(m["id_b"]).astype("Int64")), axes)
    m["change_pct"] = (m["tokens_per_s_a"] / m["tokens_per_s_b"] - 1.0) * 100.0
    overlap = np.maximum(m["tokens_per_s_lo_a"], m["tokens_per_s_lo_b"]) <= np.minimum(
        m["tokens_per_s_hi_a"], m["tokens_per_s_hi_b"]
    )
    both_ok = m["tokens_per_s_a"].notna() & m["tokens_per_s_b"].notna()
    m["within_noise"] = overlap & both_ok
    m["verdict"] = [_verdict(r) for r in m.itertuples(index=False)]
    order = [
        "label",
        "verdict",
        "change_pct",
        "within_noise",
        *[f"{c}_{s}" for c in _VALUE_COLS for s in ("a", "b")],
        *MATCH_AXES,
    ]
    return m[order].reset_index(drop=True)


def _verdict(r: object) -> str:
    merge = r.side  # type: ignore[attr-defined]
    if merge == "left_only":
        return "only in A"
    if merge == "right_only":
        return "only in B"
    sa, sb = r.status_a, r.status_b  # type: ignore[attr-defined]
    if sa != "ok" or pd.isna(r.tokens_per_s_a):  # type: ignore[attr-defined]
        return f"{sa} in A" if sb == "ok" else f"{sa} in A, {sb} in B"
    if sb != "ok" or pd.isna(r.tokens_per_s_b):  # type: ignore[attr-defined]
        return f"{sb} in B"
    if r.within_noise:  # type: ignore[attr-defined]
        return "within noise"
    return "faster" if r.change_pct > 0 else "slower"  # type: ignore[attr-defined]


def _sweep_name(sweeps: pd.DataFrame, sid: int) -> str:
    row = sweeps[sweeps["id"] == sid].iloc[0]
    return f"sweep {sid} ({row['name']})"


def build_compare(
    engine: Engine,
    sweep_a: int,
    sweep_b: int,
    out_dir: Path | None = None,
    where: str | None = None,
) -> Path:
    """Write compare.png and compare.md for sweep A against reference sweep B; returns the folder."""
    sweeps = load_sweeps(engine, [sweep_a, sweep_b])
    for sid in (sweep_a, sweep_b):
        if sid not in set(sweeps["id"]):
            raise UserError(f"--sweep/--vs {sid}: no sweep with id {sid}")
    runs = load_runs(engine, [sweep_a, sweep_b], where)
    if runs.empty:
        raise UserError(f"--where {where!r}: no runs match" if where else "neither sweep has runs")
    runs = frames.prepare_runs(runs)
    ra, rb = runs[runs["sweep_id"] == sweep_a], runs[runs["sweep_id"] == sweep_b]
    for sid, r in ((sweep_a, ra), (sweep_b, rb)):
        if r.empty:
            raise UserError(f"sweep {sid} has no runs" + (f" matching --where {where!r}" if where else ""))
    cmp = compare_frame(ra, rb)
    name_a, name_b = _sweep_name(sweeps, sweep_a), _sweep_name(sweeps, sweep_b)
    out = Path(out_dir) if out_dir is not None else default_compare_dir(sweeps, sweep_a, sweep_b)
    out.mkdir(parents=True, exist_ok=True)
    matched = cmp[cmp["tokens_per_s_a"].notna() | cmp["tokens_per_s_b"].notna()]
    matched = matched[~matched["verdict"].isin(["only in A", "only in B"])]
    note = ""
    if len(matched) > TOP_COMPARE:
        order = matched["change_pct"].abs().sort_values(ascending=False, na_position="last").index
        matched = matched.loc[order[:TOP_COMPARE]]
        note = f"{TOP_COMPARE} largest changes of {len(cmp):,} configs"
    if not matched.empty:
        fig = charts.compare(matched, f"A: {name_a}", f"B: {name_b}", note)
        charts.save(fig, out / "compare.png")
    else:
        (out / "compare.png").unlink(missing_ok=True)
    (out / "compare.md").write_text(compare_md(cmp, runs, sweeps, sweep_a, sweep_b, has_chart=not matched.empty))
    cmp.to_csv(out / "compare.csv", index=False)
    log.info("compare of sweep %s vs %s: %s", sweep_a, sweep_b, out)
    return out


def default_compare_dir(sweeps: pd.DataFrame, sweep_a: int, sweep_b: int) -> Path:
    row = sweeps[sweeps["id"] == sweep_a]
    sweep_dir = row["sweep_dir"].iloc[0] if not row.empty else None
    if isinstance(sweep_dir, str) and Path(sweep_dir).is_dir():
        return Path(sweep_dir) / f"compare_vs_{sweep_b}"
    return Path.cwd() / f"compare_{sweep_a}_vs_{sweep_b}"


_ENV_COLS = (
    "device_name",
    "torch_version",
    "cuda_version",
    "python_version",
    "hostname",
    "git_commit",
    "torch_threads",
)


def compare_md(
    cmp: pd.DataFrame,
    runs: pd.DataFrame,
    sweeps: pd.DataFrame,
    sweep_a: int,
    sweep_b: int,
    has_chart: bool = True,
) -> str:
    name_a, name_b = _sweep_name(sweeps, sweep_a), _sweep_name(sweeps, sweep_b)
    counts = cmp["verdict"].value_counts()
    summary = ", ".join(f"{c} {v}" for v, c in counts.items())
    parts = [
        f"# perfsweep compare: {name_a} vs {name_b}",
        "",
        f"A = {name_a} is compared with the reference B = {name_b}. Configs are matched on "
        f"{', '.join(MATCH_AXES)}. change = tokens/s of A / tokens/s of B - 1. A change is "
        "**within noise** when the p10-p90 throughput ranges of A and B overlap.",
        "",
        f"**{len(cmp)} configs:** {summary}.",
        "",
    ]
    if has_chart:
        parts += ["![compare](compare.png)", ""]
    table = pd.DataFrame(
        {
            "config": cmp["label"],
            "tokens/s A": cmp["tokens_per_s_a"].map(md.num),
            "p10-p90 A": [
                md.tokens_range(lo, hi)
                for lo, hi in zip(cmp["tokens_per_s_lo_a"], cmp["tokens_per_s_hi_a"], strict=True)
            ],
            "tokens/s B": cmp["tokens_per_s_b"].map(md.num),
            "p10-p90 B": [
                md.tokens_range(lo, hi)
                for lo, hi in zip(cmp["tokens_per_s_lo_b"], cmp["tokens_per_s_hi_b"], strict=True)
            ],
            "change": cmp["change_pct"].map(lambda v: md.num(v, "{:+.1f}%")),
            "verdict": cmp["verdict"],
            "peak mem A": cmp["peak_mem_bytes_a"].map(md.mem),
            "peak mem B": cmp["peak_mem_bytes_b"].map(md.mem),
        }
    )
    parts += [
        md.table(
            table,
            right=(
                "tokens/s A",
                "p10-p90 A",
                "tokens/s B",
                "p10-p90 B",
                "change",
                "peak mem A",
                "peak mem B",
            ),
        ),
        "",
    ]
    env_rows = []
    for col in _ENV_COLS:
        va = _values(runs[runs["sweep_id"] == sweep_a], col)
        vb = _values(runs[runs["sweep_id"] == sweep_b], col)
        env_rows.append({"": col, "A": va, "B": vb, "same": "yes" if va == vb else "**no**"})
    parts += [
        "## Environment",
        "",
        "A change in any of these can explain a change in speed.",
        "",
        md.table(pd.DataFrame(env_rows)),
        "",
    ]
    parts += ["`compare.csv` has every column of this comparison.", ""]
    return "\n".join(parts)


def _values(runs: pd.DataFrame, col: str) -> str:
    vals = [str(v) for v in dict.fromkeys(runs[col].dropna())]
    return "; ".join(vals) if vals else "-"
