"""End of a sweep: derived columns, the table people read in the terminal, and the report."""

from __future__ import annotations

import logging
import sys

import pandas as pd
from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from perfsweep import metrics, store
from perfsweep.cli import first_line
from perfsweep.names import GRID_AXES

log = logging.getLogger(__name__)


def sweep_id_for(engine: Engine, sweep_dir: str) -> int | None:
    with store.session(engine) as s:
        return s.scalar(select(store.Sweep.id).where(store.Sweep.sweep_dir == sweep_dir))


def fill_compile_payback(engine: Engine, sweep_id: int) -> None:
    """Fill ``compile_payback_steps`` of the compiled runs that have an eager twin config in the
    sweep (same settings, compile off); see :func:`perfsweep.metrics.compile_payback_steps`."""
    with store.session(engine) as s:
        runs = s.scalars(select(store.Run).where(store.Run.sweep_id == sweep_id, store.Run.status == "ok")).all()

        def key(r: store.Run) -> tuple:
            return (r.amp, r.ckpt, r.batch, r.seq_len, r.workers, r.amp_dtype, r.model_name, r.data_name)

        eager = {key(r): r for r in runs if not r.compile}
        for r in runs:
            twin = eager.get(key(r))
            if not r.compile or twin is None or r.compile_time_ms is None:
                continue
            payback = metrics.compile_payback_steps(r.compile_time_ms, twin.step_time_ms_median, r.step_time_ms_median)
            s.execute(update(store.Run).where(store.Run.id == r.id).values(compile_payback_steps=payback))


def summary_frame(engine: Engine, sweep_id: int) -> pd.DataFrame:
    cols = ", ".join(
        [
            "job_num",
            *GRID_AXES,
            "status",
            "tokens_per_s",
            "step_time_ms_median",
            "step_time_ms_p10",
            "step_time_ms_p90",
            "peak_mem_bytes",
            "mfu",
            "gpu_busy_fraction",
            "bottleneck",
            "error",
        ]
    )
    return pd.read_sql_query(f"SELECT {cols} FROM runs WHERE sweep_id = {int(sweep_id)} ORDER BY job_num, id", engine)


def format_summary(df: pd.DataFrame) -> str:
    """A compact table: only the axes that vary, step time with its p10-p90 spread, memory in MiB."""
    varying = [a for a in GRID_AXES if df[a].nunique() > 1] or ["batch", "seq_len"]
    out = pd.DataFrame({"job": df["job_num"].fillna(-1).astype(int) + 1})
    for a in varying:
        out[a] = df[a]
    out["status"] = df["status"]
    out["tokens/s"] = df["tokens_per_s"].map(lambda v: f"{v:,.0f}" if pd.notna(v) else "-")
    out["step ms (p10-p90)"] = [
        f"{m:.1f} ({lo:.1f}-{hi:.1f})" if pd.notna(m) else "-"
        for m, lo, hi in zip(df["step_time_ms_median"], df["step_time_ms_p10"], df["step_time_ms_p90"], strict=True)
    ]
    out["peak mem MiB"] = df["peak_mem_bytes"].map(lambda v: f"{v / 2**20:,.1f}" if pd.notna(v) else "-")
    if df["mfu"].notna().any():  # GPUs with a known peak (perfsweep.envinfo.PEAK_FLOPS)
        out["MFU"] = df["mfu"].map(lambda v: f"{v:.1%}" if pd.notna(v) else "-")
    if df["bottleneck"].notna().any():  # GPU runs with a profiled window; never shown for CPU
        out["GPU busy"] = df["gpu_busy_fraction"].map(lambda v: f"{v:.0%}" if pd.notna(v) else "-")
        out["bound by"] = df["bottleneck"].fillna("-")
    out["error"] = df["error"].map(lambda e: first_line(e, 70))
    return out.to_string(index=False)


def finish_sweep(url: str, sweep_dir: str, make_report: bool = True, status: str = "done") -> None:
    """Mark the sweep at ``sweep_dir`` ``status`` (done or interrupted), print its summary from the
    database, then build its report."""
    engine = store.connect(url)
    try:
        sweep_id = sweep_id_for(engine, sweep_dir)
        if sweep_id is None:
            print(f"perfsweep: no sweep {sweep_dir} in {url}", file=sys.stderr)
            return
        store.end_sweep(engine, sweep_id, status)
        fill_compile_payback(engine, sweep_id)
        df = summary_frame(engine, sweep_id)
        n_ok = int((df["status"] == "ok").sum())
        print(f"\nSweep {sweep_id} ({len(df)} run{'s' if len(df) != 1 else ''}, {n_ok} ok)")
        print(format_summary(df))
        where = engine.url.render_as_string(hide_password=True)
        print(f"\nResults: {where} (sweep_id={sweep_id})")
        if engine.url.get_backend_name() == "sqlite":
            print(
                f"Query:   sqlite3 {engine.url.database} 'select amp, ckpt, tokens_per_s, peak_mem_bytes "
                f"from runs where sweep_id={sweep_id}'"
            )
        if make_report:
            _report(engine, sweep_id)
    finally:
        engine.dispose()


def _report(engine: Engine, sweep_id: int) -> None:
    try:
        from perfsweep.report.build import build_report  # matplotlib is imported only when needed

        out = build_report(engine, [sweep_id])
        print(f"Report:  {out / 'report.md'}")
    except Exception as exc:  # a plotting problem must not hide the results
        log.exception("report failed")
        print(
            f"perfsweep: report failed ({exc}); the runs are stored (sweep_id={sweep_id}); "
            f"retry with: perfsweep report --sweep {sweep_id}",
            file=sys.stderr,
        )
