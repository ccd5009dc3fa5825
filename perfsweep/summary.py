"""End of a sweep: derived columns, the table people read in the terminal, and the report."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import or_, select, update
from sqlalchemy.engine import Engine, make_url

from perfsweep import audit, configs, interrupts, metrics, store
from perfsweep.cli import first_line, waiting_for_database
from perfsweep.configs import fewest_on, per_config, prepare_runs, value_text
from perfsweep.names import (
    DATA_BOUND_WAIT_FRACTION,
    FINAL_STATUSES,
    NOISY_IQR_FRACTION,
    NOISY_TAIL_FRACTION,
    ON_OFF_AXES,
    SETTING_PREFIX,
    UNSAVED_STATUS,
)
from perfsweep.report import fmt  # pandas and numpy only: no matplotlib
from perfsweep.results import load_batch_searches, load_runs, search_label

log = logging.getLogger(__name__)


def sweep_id_for(engine: Engine, sweep_dir: str) -> int | None:
    """The id of the sweep whose folder is ``sweep_dir``, if the database has one (store.sweep_of)."""
    found = store.sweep_of(engine, sweep_dir)
    return None if found is None else found[0]


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
    """``cpu_flops_utilisation`` of the sweep's CPU runs against the measured matmul peaks: the
    sweep's, and the best any of its runs measured after its steps in the same compute dtype with
    the same thread count (runs.cpu_matmul_flops). One denominator for all the runs it applies to:
    each run's own had been its own, taken at whatever load its moment had (110 and 389 GFLOP/s in
    one sweep of a review), and the utilisations then ranked the runs against their model FLOP/s."""
    Run = store.Run
    with store.session(engine) as s:
        sweep = s.get(store.Sweep, sweep_id)
        if sweep is None:
            return
        runs = s.scalars(select(Run).where(Run.sweep_id == sweep_id, Run.device_type == "cpu")).all()
        best: dict[tuple[Any, Any], float] = {}
        for r in runs:
            if r.nproc is None and r.cpu_matmul_flops:
                key = (r.mfu_compute_dtype, r.torch_threads)
                best[key] = max(best.get(key, 0.0), r.cpu_matmul_flops)
        for r in runs:
            if r.nproc is not None:
                continue  # its FLOP/s are all ranks' together, against one process's peak: no figure
            # the sweep's peaks were measured with its thread count: against a run with another,
            # only the runs' own (none: no figure, not a wrong one)
            same_threads = sweep.cpu_matmul_threads is None or r.torch_threads == sweep.cpu_matmul_threads
            r.cpu_flops_utilisation = metrics.cpu_flops_utilisation(
                r.model_tflops_per_s,
                r.mfu_compute_dtype,
                sweep.cpu_matmul_fp32_flops if same_threads else None,
                sweep.cpu_matmul_bf16_flops if same_threads else None,
                best.get((r.mfu_compute_dtype, r.torch_threads)),
            )


def fill_speedups(engine: Engine, sweep_id: int) -> None:
    """Write every ok run's ``speedup`` over the sweep's baseline config, with its 95% interval
    and verdict (:func:`perfsweep.metrics.speedups`), so SQL sees what the summary and
    the report show. Repeats of a config share one figure. Baseline: :data:`perfsweep.names.BASELINE_RULE`."""
    Run, Step = store.Run, store.Step
    with store.session(engine) as s:
        runs = s.scalars(
            select(Run)
            .where(
                Run.sweep_id == sweep_id,
                Run.status == "ok",
                or_(Run.tokens_per_s.is_not(None), Run.samples_per_s.is_not(None)),
            )
            .order_by(Run.grid_index, Run.job_num, Run.id)  # grid order: the shuffle must not pick the baseline
        ).all()
        unit = metrics.rate_unit([r.tokens_per_s for r in runs], [r.samples_per_s for r in runs])
        runs = [r for r in runs if getattr(r, f"{unit}_per_s") is not None]  # the headline of the report
        if not runs:
            return
        configs: dict[str, list[store.Run]] = {}
        for r in runs:
            configs.setdefault(r.config_hash or f"run {r.id}", []).append(r)
        keys = list(configs)  # grid order
        base_key = keys[fewest_on([{a: getattr(configs[k][0], a) for a in ON_OFF_AXES} for k in keys])[0]]
        times: dict[int, list[float]] = {}
        for run_id, ms in s.execute(
            select(Step.run_id, Step.step_time_ms)
            .where(Step.run_id.in_([r.id for r in runs]), Step.phase == "measure")
            .order_by(Step.run_id, Step.step)
        ):
            times.setdefault(run_id, []).append(ms)

        def throughput(rs: list[store.Run]) -> metrics.Throughput:
            return metrics.Throughput([getattr(r, f"{unit}_per_s") for r in rs], [times.get(r.id, []) for r in rs])

        others = [k for k in configs if k != base_key]
        figures = metrics.speedups([throughput(configs[k]) for k in others], throughput(configs[base_key]))
        rows: dict[str, dict[str, object]] = {
            base_key: {"speedup": 1.0, "speedup_ci_lo": None, "speedup_ci_hi": None, "speedup_basis": None}
            | {"speedup_verdict": "baseline"}
        }
        # None: one run a side and no measured steps stored (an imported row), nothing to resample
        rows |= {key: figure.row() for key, figure in zip(others, figures, strict=True) if figure is not None}
        for key, values in rows.items():
            ids = [r.id for r in configs[key]]
            s.execute(update(Run).where(Run.id.in_(ids)).values(**values, baseline_config_hash=base_key))


def summary_frame(
    engine: Engine, sweep_id: int, swept: Sequence[str] = (), kept: Sequence[dict[str, Any]] = ()
) -> pd.DataFrame:
    """The sweep's runs as the report reads them (:func:`perfsweep.configs.prepare_runs`), with a
    ``cfg.<key>`` column for each key of ``swept`` (the grid's override keys) outside the axes.
    ``kept``: results the database refused (their ``runs`` rows as kept in result.json), shown
    ``unsaved`` in place of their stored row, or beside the stored ones where the database took
    not even the job's first row."""
    settings = [k for k in swept if configs.axis_of(k).startswith(SETTING_PREFIX)]
    runs = load_runs(engine, [sweep_id], settings=settings)
    stored = {u for u, s in zip(runs["run_uid"], runs["status"], strict=True) if s in FINAL_STATUSES}
    kept = [r for r in kept if r["run_uid"] not in stored]
    if kept:
        have_rows = set(runs["run_uid"])
        rowless = [r for r in kept if r["run_uid"] not in have_rows]
        if rowless:
            rows = pd.DataFrame([_kept_row(r, runs.columns) for r in rowless]).assign(sweep_id=sweep_id)
            for col in ("started_at", "finished_at"):
                rows[col] = pd.to_datetime(rows[col], utc=True, errors="coerce", format="mixed")
            runs = pd.concat([runs, rows], ignore_index=True)
        runs.loc[runs["run_uid"].isin({r["run_uid"] for r in kept}), "status"] = UNSAVED_STATUS
    return prepare_runs(runs)


def _kept_row(run: dict[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    """A kept result's ``runs`` row in the columns of :func:`load_runs`, its ``cfg.<key>`` settings
    read from its config as ``perfsweep.results`` reads a stored row's (else a sweep over
    ``model.dropout`` showed the unsaved job's value as None)."""
    config = run.get("config_json")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            config = None
    flat = pd.json_normalize(store.json_safe(config)).iloc[0].to_dict() if isinstance(config, dict) else {}
    return {
        c: flat.get(c.removeprefix(SETTING_PREFIX)) if c.startswith(SETTING_PREFIX) else run.get(c) for c in columns
    }


def shown_axes(runs: pd.DataFrame, swept: Sequence[str] = ()) -> list[str]:
    """The axes a sweep's summary names its configs by: those the grid sweeps (``swept``, its
    override keys) and any other the runs differ in, as the report labels them (amp_dtype, model,
    data, a factory's setting); none for a sweep of one config."""
    varying = [a for a in configs.label_axes(runs) if a != "sweep_id"]
    grid = configs.swept_axes(swept, list(runs.columns))
    return [*grid, *(a for a in varying if a not in grid)]


def _speedup_text(verdict: str | None, value: float, lo: float, hi: float) -> str:
    if verdict == "baseline":
        return "baseline"
    if pd.isna(value):
        return "-"
    return fmt.speedup(value, lo, hi) + ("" if pd.isna(lo) else f" {verdict}")


def numerics_text(diverged_step: Any, scaler_skipped: Any, nonfinite: Any = None) -> str:
    """'loss NaN/inf at 3 steps', 'diverged at step 7', '3 steps skipped (fp16)', or several: why a
    run's numerics are flagged."""
    parts = []
    if pd.notna(nonfinite) and nonfinite:
        parts.append(f"loss NaN/inf at {int(nonfinite)} step{'s' if nonfinite != 1 else ''}")
    if pd.notna(diverged_step):
        parts.append(f"diverged at step {int(diverged_step)}")
    if pd.notna(scaler_skipped) and scaler_skipped:
        parts.append(f"{int(scaler_skipped)} steps skipped (fp16)")
    return ", ".join(parts) or "flagged"


def numerics_cell(warning: Any, why: str, flagged: int, ok_runs: int) -> str:
    """The numerics of a config: its representative run's (``warning``, ``why``), and how many of
    its ``ok_runs`` repeats were flagged where that is not all of them: a repeat that blew up is not
    hidden behind a clean median run."""
    share = f"{flagged} of {ok_runs} runs flagged"
    if pd.notna(warning) and warning:
        return why + (f" ({share})" if flagged < ok_runs else "")
    if flagged:
        return share
    return "-" if pd.isna(warning) else "ok"


def format_summary(runs: pd.DataFrame, swept: Sequence[str] = ()) -> str:
    """A compact table, one row per config (:func:`perfsweep.configs.per_config`: repeats
    combined, as the report shows them): only the axes that vary, tokens/s (samples/s for models
    that count samples; with repeats, their median and range), the median step time
    with its IQR and CV (with repeats, of the one nearest their median), the speedup over the baseline with its 95% interval (or "no measurable
    difference"), memory in MiB; ``!`` marks a noisy config, ``~`` one whose step time never
    settled in warmup. ``swept``: the grid's override keys, whose axes are shown even where the runs
    stored so far do not differ in them (a sweep stopped after one job)."""
    varying = shown_axes(runs, swept) or ["batch", "seq_len"]
    per = per_config(runs)
    out = pd.DataFrame({"job": per["first_job_num"].fillna(-1).astype(int) + 1})
    for a in varying:  # as the report's labels write them: amp on/off, batch 8 (not 8.0), nproc null
        out[configs.axis_name(a)] = per[a].map(lambda v, a=a: value_text(a, v))
    if (per["runs"] > 1).any():
        out["runs"] = per["runs"]
    out["status"] = per["statuses"]
    rate = f"{metrics.rate_unit(runs['tokens_per_s'], runs['samples_per_s'])}/s"
    repeats = per["ok_runs"] > 1  # a config's repeats: their median, and their range beside it
    out[rate] = [
        "-" if pd.isna(v) else f"{v:,.0f}" + (f" ({lo:,.0f}-{hi:,.0f})" if several else "")
        for v, lo, hi, several in zip(
            per["throughput_per_s"], per["throughput_per_s_lo"], per["throughput_per_s_hi"], repeats, strict=True
        )
    ]
    iqr = metrics.iqr_fraction(per["step_time_ms_iqr"], per["step_time_ms_median"]).fillna(0.0)
    out["step ms (IQR, CV)"] = [
        f"{m:.1f} ({q:.0%}, {cv:.0%}){'!' if noisy else ''}{'~' if unsettled else ''}" if pd.notna(m) else "-"
        for m, q, cv, noisy, unsettled in zip(
            per["step_time_ms_median"].where(per["ok"]),
            iqr,
            per["step_time_cv"].fillna(0.0),
            per["noisy"],
            per["unsettled"],
            strict=True,
        )
    ]
    if len(per) > 1 and per["speedup"].notna().any():
        speed = per[["speedup_verdict", "speedup", "speedup_ci_lo", "speedup_ci_hi"]].itertuples(index=False)
        out["speedup (95% CI)"] = [_speedup_text(*r) for r in speed]
    out["peak mem MiB"] = per["peak_mem_bytes"].map(lambda v: f"{v / 2**20:,.1f}" if pd.notna(v) else "-")
    if per["predicted_peak_bytes"].notna().any():  # perfsweep.ledger's prediction, and how far off it was
        out["predicted MiB (err)"] = [
            "-" if pd.isna(p) else f"{p / 2**20:,.1f}" + ("" if pd.isna(e) else f" ({e:+.0%})")
            for p, e in zip(per["predicted_peak_bytes"], per["predicted_peak_error"], strict=True)
        ]
    if configs.compiled(per).any():
        out["compile s (payback)"] = configs.compile_column(per)
    if per["numerics_runs"].gt(0).any():
        out["numerics"] = [
            numerics_cell(w, numerics_text(step, skipped, nonfinite), flagged, ok_runs)
            for w, step, skipped, nonfinite, flagged, ok_runs in zip(
                per["numerics_warning"],
                per["numerics_diverged_step"],
                per["grad_scaler_skipped_steps"],
                per["nonfinite_loss_steps"],
                per["numerics_runs"],
                per["ok_runs"],
                strict=True,
            )
        ]
    if per["data_bound"].eq(1).any():
        out["data wait"] = [
            "-" if pd.isna(f) else f"{f:.0%}" + (" bound" if bound == 1 else "")
            for f, bound in zip(per["data_wait_fraction"], per["data_bound"], strict=True)
        ]
    if per["mfu"].notna().any():  # GPUs with a known peak (perfsweep.envinfo.PEAK_FLOPS)
        out["MFU"] = configs.mfu_column(per)
    if per["bottleneck"].notna().any():  # GPU runs with a profiled window; never shown for CPU
        out["GPU busy"] = per["gpu_busy_fraction"].map(lambda v: f"{v:.0%}" if pd.notna(v) else "-")
        out["bound by"] = per["bottleneck"].fillna("-")
    key = runs["config_hash"].fillna(runs["id"].astype(str))
    # an interruption says nothing about a config that has since run ok (perfsweep resume): not its error
    resumed = runs["status"].eq("interrupted") & runs["ok"].groupby(key).transform("any")
    errors = runs["error"].where(runs["error"].map(lambda e: isinstance(e, str) and bool(e.strip())) & ~resumed)
    first_error = errors.groupby(key, sort=False).first()
    unprofiled = runs["profile_error"].astype(object).groupby(key, sort=False).first()  # an ok run without stages
    first_error = first_error.astype(object).fillna(unprofiled)  # a config's own failure comes first
    out["error"] = per["config_hash"].fillna(per["id"].astype(str)).map(first_error).map(lambda e: first_line(e, 70))
    if not out["error"].fillna("").astype(str).str.strip().astype(bool).any():  # all ok: no empty column
        out = out.drop(columns="error")
    text = out.to_string(index=False)
    notes = []
    if per["noisy"].any():
        notes.append(
            f"! noisy: step-time IQR above {NOISY_IQR_FRACTION:.0%} of the median, a few slow steps that moved the "
            f"mean more than {NOISY_TAIL_FRACTION:.0%} off it, or repeats whose throughput spreads as much"
        )
    if per["data_bound"].eq(1).any():
        notes.append(
            f"bound: more than {DATA_BOUND_WAIT_FRACTION:.0%} of the measured steps went to waiting for the next "
            "batch; the data loader sets the pace (raise workers, or prepare batches ahead)"
        )
    if per["numerics_runs"].gt(0).any():
        notes.append(
            "numerics: the loss was NaN or infinite at measured steps (the training blew up: its speed is not that "
            "of one that works), left the tolerance of its FP32-eager twin (names.LOSS_TOLERANCE) from the step "
            "shown, or fp16's GradScaler skipped measured steps; see runs.loss_max_rel_diff"
        )
    if repeats.any():
        notes.append(
            f"{rate} of a config with repeats: their median (their range); its step ms (IQR, CV), memory and the "
            "rest: the repeat nearest that median (on a tie, the earlier)"
        )
    if configs.compiled(per).any():
        notes.append(configs.COMPILE_NOTE)
    if configs.old_mfu(per).any():
        notes.append(configs.OLD_MFU_NOTE)
    if per["unsettled"].any():
        notes.append("~ the step time never settled in warmup (steps.max_warmup or steps.max_warmup_s reached)")
    if configs.unranked_samples(per).any():
        notes.append(
            "- beside tokens/s: a model that counts samples (model.unit=samples); "
            f'report it on its own with --where "{configs.SAMPLES_ONLY_WHERE}"'
        )
    return text + ("\n" + "; ".join(notes) if notes else "")


def format_searches(searches: pd.DataFrame) -> str:
    """One line per batch=max search: the largest batch that fits and what it bought."""
    if searches.empty:
        return ""
    lines = ["Largest batch that fits (batch=max):"]
    for s in searches.itertuples():
        where = search_label(s.overrides)
        if s.status == "done":
            rate = s.tokens_per_s if pd.notna(s.tokens_per_s) else s.samples_per_s
            unit = "tokens/s" if pd.notna(s.tokens_per_s) else "samples/s"
            above = f"oom at {int(s.first_oom_batch)}" if pd.notna(s.first_oom_batch) else "max_batch_cap reached"
            mem = f", {s.peak_allocated_bytes / 2**20:,.1f} MiB" if pd.notna(s.peak_allocated_bytes) else ""
            fig = f"{rate:,.0f} {unit}" if pd.notna(rate) else "no figure"
            lines.append(f"  {where}: batch {int(s.max_batch)} ({above}; {fig}{mem}; {int(s.n_tried)} jobs)")
        else:
            lines.append(f"  {where}: {s.status}" + (f" ({s.error})" if isinstance(s.error, str) else ""))
        if pd.notna(s.predicted_max_batch):
            lines[-1] += f"; the ledger predicted {int(s.predicted_max_batch)}"
        if pd.notna(s.calibrated_max_batch) and pd.notna(s.predicted_max_batch):
            lines[-1] += f", {int(s.calibrated_max_batch)} once calibrated by a measured try"
        elif pd.notna(s.calibrated_max_batch):  # no ledger: the line through two measured tries
            lines[-1] += f"; {int(s.calibrated_max_batch)} by the line through two measured tries"
    return "\n".join(lines)


def concurrency_note(engine: Engine, sweep_id: int) -> str:
    """The sweep's :func:`perfsweep.configs.concurrency_note`, from its row."""
    with store.session(engine) as s:
        sweep = s.get(store.Sweep, sweep_id)
        return configs.concurrency_note(sweep.parallel, sweep.hydra_launcher) if sweep is not None else ""


def fill_sweep_figures(engine: Engine, sweep_id: int) -> None:
    """The figures drawn from all of a sweep's runs together: compile payback, speedups over the
    baseline, CPU utilisation, the numerics audit, each batch=max search's figures at its largest
    batch. Written again whenever the runs change (the end of a sweep or a resume, ``perfsweep
    import``), so SQL never reads figures of an older set."""
    store.refresh_search_figures(engine, sweep_id)
    fill_compile_payback(engine, sweep_id)
    fill_speedups(engine, sweep_id)
    fill_cpu_utilisation(engine, sweep_id)
    audit.audit_sweep(engine, sweep_id)


def close_sweep(url: str, sweep_dir: str, status: str, late: bool = False) -> bool:
    """Store the sweep's end (done or interrupted) and the figures drawn from all its runs
    (compile payback, speedups, CPU utilisation, the numerics audit), with Ctrl-C and SIGTERM held
    until they are written: `perfsweep report` reads them, and a read never writes them later.
    Returns False when the database refused them (True also when it holds no such sweep: nothing
    to close). A failure is printed, never raised over the jobs' own
    outcome; the caller's last line then says how to write them later (:func:`unclosed_line`).
    ``late``: closed by ``perfsweep resume`` after the jobs ended (the end is the last run's)."""
    with interrupts.held(CLOSING_NOTE):  # from the connection on: a signal now waits for the last write
        try:
            with waiting_for_database(url):
                engine = store.connect(url)
            try:
                if (sweep_id := sweep_id_for(engine, sweep_dir)) is not None:
                    store.end_sweep(engine, sweep_id, status, at_last_run=late)
                    fill_sweep_figures(engine, sweep_id)
            finally:
                engine.dispose()
        except Exception as exc:  # noqa: BLE001
            print(
                f"perfsweep: could not mark the sweep {status} in {store.hide_password(url)}: {first_line(exc)}",
                file=sys.stderr,
            )
            return False
    return True


def close_late(url: str, sweep_dir: str) -> tuple[int | str, bool] | None:
    """Close, ``done``, a sweep all of whose jobs are stored but whose own end is not (the database
    refused the closing write, or the sweeper died after its last job): ``perfsweep resume``
    with nothing left to run, or ``--close``. None when the sweep is closed already; else its id
    ("ID" where the database could not even be read) and whether the end was written."""
    try:
        with waiting_for_database(url):
            engine = store.connect(url)
        try:
            with store.session(engine) as s:
                row = s.execute(
                    select(store.Sweep.id, store.Sweep.status).where(store.Sweep.sweep_dir == sweep_dir)
                ).one_or_none()
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - said; the caller's last line says what to run again
        print(
            f"perfsweep: could not read the sweep {sweep_dir} in {store.hide_password(url)}: {first_line(exc)}",
            file=sys.stderr,
        )
        return "ID", False
    if row is None or row.status == "done":
        return None
    return row.id, close_sweep(url, sweep_dir, "done", late=True)


def unfinished_points(engine: Engine, sweep_id: int) -> int:
    """How many of the sweep's grid points have no final run yet (never started, interrupted, or a
    ``batch=max`` search stopped half way): a sweep is closed by ``perfsweep resume --close`` only
    when there are none. A grid point's latest row (and latest search) decides; earlier ones are history."""
    with store.session(engine) as s:
        sweep = s.get(store.Sweep, sweep_id)
        runs = s.execute(
            select(store.Run.job_num, store.Run.status).where(store.Run.sweep_id == sweep_id).order_by(store.Run.id)
        ).all()
        searches = s.execute(
            select(store.BatchSearch.grid_index, store.BatchSearch.status)
            .where(store.BatchSearch.sweep_id == sweep_id)
            .order_by(store.BatchSearch.id)
        ).all()
    latest = dict(runs)
    numbered = [j for j in latest if j is not None]  # a row imported without its job number has none
    n_jobs = (sweep.n_jobs if sweep is not None else None) or max(1, 1 + max(numbered, default=-1))
    stopped = {g for g, status in dict(searches).items() if status in ("running", "interrupted")}
    return sum(latest.get(j) not in FINAL_STATUSES for j in range(n_jobs)) + len(stopped)


def unclosed_hint(url: str, sweep_id: int | str, after_import: bool = False) -> str:
    """What to do after :func:`close_sweep` failed: the runs are safe, and one command writes the
    rest once the database takes writes, running no job (after the import of kept results, which
    it needs stored)."""
    return (
        f"the sweep's end and closing figures (speedups, compile payback, CPU utilisation, the numerics audit) "
        f"are not stored; once the database takes writes{', and after the import' if after_import else ''}, "
        f"store them with: perfsweep resume {sweep_id} --close --db {db_arg(url)}"
    )


def unclosed_line(url: str, sweep_id: int | str, after_import: bool = False) -> str:
    """The last line of a sweep or run whose end the database refused (:func:`unclosed_hint`)."""
    return f"perfsweep: {unclosed_hint(url, sweep_id, after_import)}"


@contextlib.contextmanager
def hint_stored(url: str, sweep_id: int, kept: Callable[[], str | None]) -> Iterator[None]:
    """Ctrl-C or SIGTERM here came once the runs were stored: only the summary (or the report) is
    missing, so the last line names the report command, unless an earlier hint said more, or
    ``kept`` (perfsweep.importer.kept_hint) names the import of results the database refused."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if interrupts.hint_of(exc) is None:  # an earlier stop's hint wins (perfsweep.__main__)
            exc.perfsweep_hint = f"the runs are stored; see them with: {report_command(url, sweep_id)}"
            # set inside: a stop held here is raised as the hold ends, before a line set after it
            with interrupts.held():
                if (on_disk := kept()) is not None:
                    exc.perfsweep_hint = on_disk
        raise


CLOSING_NOTE = "perfsweep: storing the sweep's closing figures first"
"""Printed when Ctrl-C or SIGTERM arrives while :func:`close_sweep` writes."""


def run_statuses(url: str, sweep_id: int) -> list[str]:
    """The statuses of the sweep's runs, in the order they were written."""
    engine = store.connect(url)
    try:
        with store.session(engine) as s:
            return list(
                s.scalars(select(store.Run.status).where(store.Run.sweep_id == sweep_id).order_by(store.Run.id))
            )
    finally:
        engine.dispose()


def show_sweep(
    url: str,
    sweep_dir: str,
    make_report: bool = True,
    unsaved: Sequence[dict[str, Any]] = (),
    swept: Sequence[str] = (),
) -> None:
    """Print the summary of the sweep at ``sweep_dir`` from the database (closed by
    :func:`close_sweep`), then build its report. Writes nothing to the database. ``unsaved``: the
    ``runs`` rows of results the database refused, as kept in result.json
    (perfsweep.importer.kept_runs), shown so; ``swept``: the grid's override keys (:func:`format_summary`)."""
    engine = store.connect(url)
    try:
        sweep_id = sweep_id_for(engine, sweep_dir)
        if sweep_id is None:  # its row went with the file: the results are kept (the last line says so)
            print(
                f"perfsweep: no summary: the sweep {sweep_dir} is not in {store.hide_password(url)} ({store.gone_cause(url)})",
                file=sys.stderr,
            )
            return
        try:
            _print_summary(engine, sweep_id, make_report, unsaved, swept)
        except OSError as exc:
            # the pipe or terminal it prints to is gone (`| head` that stopped reading, or died with
            # a Ctrl-C): nobody reads the summary, but the report is still written
            if not interrupts.output_gone(exc):
                raise
            interrupts.silence_output()
            _print_summary(engine, sweep_id, make_report, unsaved, swept)
    finally:
        engine.dispose()


def _print_summary(
    engine: Engine,
    sweep_id: int,
    make_report: bool,
    unsaved: Sequence[dict[str, Any]] = (),
    swept: Sequence[str] = (),
) -> None:
    """The summary table, the query to type and (``make_report``) the report, from the database,
    and the results it refused from their result.json files."""
    # a finished job whose result the database refused reads 'running' (or 'interrupted') there,
    # or has no row at all: its result is not lost (the line after the summary says how to import it)
    df = summary_frame(engine, sweep_id, swept, kept=unsaved)
    kept = df["status"] == UNSAVED_STATUS
    n_ok = int((df["status"] == "ok").sum())
    print(
        f"\nSweep {sweep_id} ({len(df)} run{'s' if len(df) != 1 else ''}, {n_ok} ok{_not_started(engine, sweep_id, df)})"
    )
    if df.empty:  # stopped before any job had a row: no table, no query, no report to build
        return
    print(format_summary(df, swept))
    if kept.any():
        print(f"{UNSAVED_STATUS}: the job finished but the database refused its result, kept as result.json")
    if text := format_searches(load_batch_searches(engine, [sweep_id])):
        print(text)
    if text := concurrency_note(engine, sweep_id):
        print(f"Note: {text}")
    print(f"\nResults: {store.display_url(engine)} (sweep_id={sweep_id})")
    if engine.url.get_backend_name() == "sqlite":
        print(f"Query:   {query_hint(df, swept, str(engine.url.database), sweep_id)}")
    if make_report:
        _report(engine, sweep_id)


def query_hint(runs: pd.DataFrame, swept: Sequence[str], database: str, sweep_id: int) -> str:
    """The ``sqlite3`` command that lists a sweep's headline figures by what it varied: an axis
    with a ``runs`` column by name (nproc), a setting without one (threads, model.width) read from
    ``config_json``; amp and ckpt for a sweep of one config. The hint named amp and ckpt for a
    sweep over threads, which has no column of its own."""
    picks = []
    for axis in shown_axes(runs, swept):
        key = axis.removeprefix(SETTING_PREFIX)
        if key in runs.columns:
            picks.append(key)
        elif axis.startswith(SETTING_PREFIX):
            alias = re.sub(r"\W", "_", key)
            picks.append(f"json_extract(config_json, '$.{key}') AS {alias}")
    rate = metrics.rate_unit(runs["tokens_per_s"], runs["samples_per_s"])
    sql = f"select {', '.join(picks or ['amp', 'ckpt'])}, {rate}_per_s, peak_mem_bytes from runs where sweep_id={sweep_id}"
    if "'" in sql:  # a JSON path: the shell's double quotes, with $ kept from it
        escaped = sql.replace("$", "\\$")
        return f'sqlite3 {shlex.quote(database)} "{escaped}"'
    return f"sqlite3 {shlex.quote(database)} '{sql}'"


def _not_started(engine: Engine, sweep_id: int, runs: pd.DataFrame) -> str:
    """'; 1 of 4 jobs not started' for a sweep stopped before its last job got a row, else ''."""
    with store.session(engine) as s:
        sweep = s.get(store.Sweep, sweep_id)
        n_jobs = sweep.n_jobs if sweep is not None else None
    if not n_jobs:
        return ""
    started = runs["job_num"].dropna()
    missing = n_jobs - int(started[started < n_jobs].nunique())  # a batch search's later tries come after n_jobs
    return f"; {missing} of {n_jobs} jobs not started" if missing > 0 else ""


def db_arg(url: str) -> str:
    """``url`` as the ``--db`` of a command to type: a SQLite file's path, else the URL with its
    password hidden."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        return shlex.quote(parsed.database)
    return shlex.quote(store.hide_password(parsed.render_as_string(hide_password=True)))


def report_command(url: str, sweep: int | str | Path) -> str:
    """The ``perfsweep report`` command that builds the report of ``sweep`` (its id, or its folder)."""
    if isinstance(sweep, Path):
        engine = store.connect(url)
        try:
            sweep = sweep_id_for(engine, str(sweep)) or "ID"
        finally:
            engine.dispose()
    return f"perfsweep report --sweep {sweep} --db {db_arg(url)}"


def _report(engine: Engine, sweep_id: int) -> None:
    try:
        from perfsweep.report.build import build_report  # matplotlib is imported only when needed

        out = build_report(engine, [sweep_id])
        print(f"Report:  {out / 'report.md'}")
    except KeyboardInterrupt as exc:  # the runs are stored and the sweep is done: only the report is missing
        url = engine.url.render_as_string(hide_password=False)
        exc.perfsweep_hint = (
            f"the runs are stored; the report was not built; build it with: {report_command(url, sweep_id)}"
        )
        raise
    except Exception as exc:  # a plotting problem must not hide the results
        log.debug("report failed", exc_info=True)
        url = engine.url.render_as_string(hide_password=False)
        print(
            f"perfsweep: the report failed ({first_line(exc, 300)}); the summary above is from the database; "
            f"retry with: {report_command(url, sweep_id)}",
            file=sys.stderr,
        )
