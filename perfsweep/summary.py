"""End of a sweep: derived columns, the table people read in the terminal, and the report."""

from __future__ import annotations

import logging
import sys

import pandas as pd
from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from perfsweep import metrics, store
from perfsweep.cli import first_line
from perfsweep.names import GRID_AXES, NOISY_IQR_FRACTION, ON_OFF_AXES

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


def fill_cpu_utilisation(engine: Engine, sweep_id: int) -> None:
    """``cpu_flops_utilisation`` of the sweep's CPU runs against its measured matmul peaks."""
    Run = store.Run
    with store.session(engine) as s:
        sweep = s.get(store.Sweep, sweep_id)
        if sweep is None or not (sweep.cpu_matmul_fp32_flops or sweep.cpu_matmul_bf16_flops):
            return
        runs = s.scalars(select(Run).where(Run.sweep_id == sweep_id, Run.device_type == "cpu")).all()
        for r in runs:
            if sweep.cpu_matmul_threads is not None and r.torch_threads != sweep.cpu_matmul_threads:
                continue  # the peak was measured with another thread count: no figure, not a wrong one
            r.cpu_flops_utilisation = metrics.cpu_flops_utilisation(
                r.model_tflops_per_s, r.mfu_compute_dtype, sweep.cpu_matmul_fp32_flops, sweep.cpu_matmul_bf16_flops
            )


BASELINE_RULE = "the first config in grid order with amp, ckpt and compile off; else the grid's first ok config"


def fill_speedups(engine: Engine, sweep_id: int) -> None:
    """Write every ok run's ``speedup`` over the sweep's baseline config, with its 95% interval
    and verdict (:func:`perfsweep.metrics.config_speedup`), so SQL sees what the summary and
    the report show. Repeats of a config share one figure. Baseline: :data:`BASELINE_RULE`."""
    Run, Step = store.Run, store.Step
    with store.session(engine) as s:
        runs = s.scalars(
            select(Run)
            .where(Run.sweep_id == sweep_id, Run.status == "ok", Run.tokens_per_s.is_not(None))
            .order_by(Run.grid_index, Run.job_num, Run.id)  # grid order: the shuffle must not pick the baseline
        ).all()
        if not runs:
            return
        configs: dict[str, list[store.Run]] = {}
        for r in runs:
            configs.setdefault(r.config_hash or f"run {r.id}", []).append(r)
        base_key = next((k for k, rs in configs.items() if not any(getattr(rs[0], a) for a in ON_OFF_AXES)), None)
        base_key = base_key or next(iter(configs))
        times: dict[int, list[float]] = {}
        for run_id, ms in s.execute(
            select(Step.run_id, Step.step_time_ms)
            .where(Step.run_id.in_([r.id for r in runs]), Step.phase == "measure")
            .order_by(Step.run_id, Step.step)
        ):
            times.setdefault(run_id, []).append(ms)
        base = configs[base_key]
        for key, rs in configs.items():
            if key == base_key:
                values: dict[str, object] = {
                    "speedup": 1.0,
                    "speedup_ci_lo": None,
                    "speedup_ci_hi": None,
                    "speedup_basis": None,
                    "speedup_verdict": "baseline",
                }
            elif (len(rs) < 2 or len(base) < 2) and not (
                times.keys() & {r.id for r in rs} and times.keys() & {r.id for r in base}
            ):
                continue  # one run a side and no measured steps stored (an imported row): nothing to resample
            else:
                values = metrics.config_speedup(
                    [r.tokens_per_s for r in rs],
                    [r.tokens_per_s for r in base],
                    [t for r in rs for t in times.get(r.id, [])],
                    [t for r in base for t in times.get(r.id, [])],
                    rs[0].batch * rs[0].seq_len,
                    base[0].batch * base[0].seq_len,
                ).row()
            s.execute(update(Run).where(Run.id.in_([r.id for r in rs])).values(**values, baseline_config_hash=base_key))


SUMMARY_COLUMNS: tuple[str, ...] = (
    "job_num",
    "config_hash",
    "repeat_index",
    *GRID_AXES,
    "status",
    "tokens_per_s",
    "step_time_ms_median",
    "step_time_ms_iqr",
    "step_time_cv",
    "noisy",
    "steady_state",
    "speedup",
    "speedup_ci_lo",
    "speedup_ci_hi",
    "speedup_verdict",
    "peak_mem_bytes",
    "mfu",
    "gpu_busy_fraction",
    "bottleneck",
    "error",
)


def summary_frame(engine: Engine, sweep_id: int) -> pd.DataFrame:
    cols = ", ".join(SUMMARY_COLUMNS)
    return pd.read_sql_query(f"SELECT {cols} FROM runs WHERE sweep_id = {int(sweep_id)} ORDER BY job_num, id", engine)


def _per_config(df: pd.DataFrame) -> pd.DataFrame:
    """One row per config: repeats combined (medians over their ok runs), in order of first job."""
    df = df.assign(config_hash=df["config_hash"].fillna(df["job_num"].astype(str)), ok=df["status"] == "ok")

    def combine(g: pd.DataFrame) -> pd.Series:
        ok = g[g["ok"]]
        statuses = g["status"].value_counts()
        first = g.iloc[0]
        scored = g[g["speedup_verdict"].notna()]  # the config's speedup is on each of its ok runs
        figure = scored.iloc[0] if len(scored) else first
        return pd.Series(
            {
                "job_num": g["job_num"].min(),
                **{a: first[a] for a in GRID_AXES},
                "runs": len(g),
                "status": statuses.index[0]
                if len(statuses) == 1
                else ", ".join(f"{n} {k}" for k, n in statuses.items()),
                "tokens_per_s": ok["tokens_per_s"].median(),
                "step_time_ms_median": ok["step_time_ms_median"].median(),
                "iqr_fraction": metrics.iqr_fraction(ok["step_time_ms_iqr"], ok["step_time_ms_median"]).median(),
                "step_time_cv": ok["step_time_cv"].median(),
                # noisy within a run, or across its repeats (their tokens/s spread the same way)
                "noisy": bool(ok["noisy"].fillna(False).astype(bool).any())
                or (len(ok) > 1 and metrics.noisy_iqr(metrics.iqr(ok["tokens_per_s"]), ok["tokens_per_s"].median())),
                "unsettled": bool((ok["steady_state"] == False).any()),  # noqa: E712 - null: not checked
                **{c: figure[c] for c in ("speedup", "speedup_ci_lo", "speedup_ci_hi", "speedup_verdict")},
                "peak_mem_bytes": ok["peak_mem_bytes"].median(),
                "mfu": ok["mfu"].median(),
                "gpu_busy_fraction": ok["gpu_busy_fraction"].median(),
                "bottleneck": ok["bottleneck"].mode().iloc[0] if ok["bottleneck"].notna().any() else None,
                "error": next((e for e in g["error"] if isinstance(e, str) and e), None),
            }
        )

    groups = [combine(g) for _, g in df.groupby("config_hash", sort=False)]
    return pd.DataFrame(groups).sort_values("job_num", kind="stable").reset_index(drop=True)


def _speedup_text(r: pd.Series) -> str:
    if r["speedup_verdict"] == "baseline":
        return "baseline"
    if pd.isna(r["speedup"]):
        return "-"
    if pd.isna(r["speedup_ci_lo"]):
        return f"{r['speedup']:.2f}x"
    return f"{r['speedup']:.2f}x ({r['speedup_ci_lo']:.2f}-{r['speedup_ci_hi']:.2f}) {r['speedup_verdict']}"


def format_summary(df: pd.DataFrame) -> str:
    """A compact table, one row per config (repeats combined): only the axes that vary, tokens/s,
    the median step time with its IQR and CV, the speedup over the baseline with its 95% interval
    (or "no measurable difference"), memory in MiB; ``!`` marks a noisy config, ``~`` one whose
    step time never settled in warmup."""
    varying = [a for a in GRID_AXES if df[a].nunique() > 1] or ["batch", "seq_len"]
    per = _per_config(df)
    out = pd.DataFrame({"job": per["job_num"].fillna(-1).astype(int) + 1})
    for a in varying:
        out[a] = per[a]
    if (per["runs"] > 1).any():
        out["runs"] = per["runs"]
    out["status"] = per["status"]
    out["tokens/s"] = per["tokens_per_s"].map(lambda v: f"{v:,.0f}" if pd.notna(v) else "-")
    out["step ms (IQR, CV)"] = [
        f"{m:.1f} ({q:.0%}, {cv:.0%}){'!' if noisy else ''}{'~' if unsettled else ''}" if pd.notna(m) else "-"
        for m, q, cv, noisy, unsettled in zip(
            per["step_time_ms_median"],
            per["iqr_fraction"].fillna(0.0),
            per["step_time_cv"].fillna(0.0),
            per["noisy"],
            per["unsettled"],
            strict=True,
        )
    ]
    if len(per) > 1 and per["speedup"].notna().any():
        out["speedup (95% CI)"] = [_speedup_text(r) for _, r in per.iterrows()]
    out["peak mem MiB"] = per["peak_mem_bytes"].map(lambda v: f"{v / 2**20:,.1f}" if pd.notna(v) else "-")
    if per["mfu"].notna().any():  # GPUs with a known peak (perfsweep.envinfo.PEAK_FLOPS)
        out["MFU"] = per["mfu"].map(lambda v: f"{v:.1%}" if pd.notna(v) else "-")
    if per["bottleneck"].notna().any():  # GPU runs with a profiled window; never shown for CPU
        out["GPU busy"] = per["gpu_busy_fraction"].map(lambda v: f"{v:.0%}" if pd.notna(v) else "-")
        out["bound by"] = per["bottleneck"].fillna("-")
    out["error"] = per["error"].map(lambda e: first_line(e, 70))
    text = out.to_string(index=False)
    notes = []
    if per["noisy"].any():
        notes.append(f"! noisy: step-time (or repeats' tokens/s) IQR above {NOISY_IQR_FRACTION:.0%} of the median")
    if per["unsettled"].any():
        notes.append("~ the step time never settled in warmup (steps.max_warmup reached)")
    return text + ("\n" + "; ".join(notes) if notes else "")


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
        fill_speedups(engine, sweep_id)
        fill_cpu_utilisation(engine, sweep_id)
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
