"""The reporting layer: which charts a sweep gets, that their numbers are the database's, the
factorial effects, compare mode and the CLI.

Two kinds of data, never a mocked database: real tiny sweeps (session fixture in
conftest_report.py) and rows written through perfsweep.store into a temporary SQLite file
when a test needs numbers chosen by hand (known effects, CUDA memory, OOMs, noise).
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex, to_rgba
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from perfsweep import metrics, store, summary
from perfsweep.cli import UserError
from perfsweep.configs import CONFIG_AXES, config_labels, label_axes, parse_config_spec, per_config, prepare_runs
from perfsweep.metrics import StepRecord, summarize
from perfsweep.names import NOISY_RULE, STAGES
from perfsweep.report import charts, fmt, frames
from perfsweep.report.__main__ import main
from perfsweep.report.build import BREAKDOWN, INTERVALS, TOP_BARS, build_report, make_report, results_table
from perfsweep.report.compare import COMPARE, build_compare, compare_frame
from perfsweep.results import load_child, load_runs

if TYPE_CHECKING:
    from tests.conftest_report import ReportSweeps

pytest_plugins = ["tests.conftest_report"]

ALL_CHARTS = {
    "throughput",
    "memory",
    "pareto",
    "breakdown",
    "scaling",
    "heatmap",
    "factors",
    "loss",
}


# --------------------------------------------------------------------------------------------
# hand-made rows through perfsweep.store


def run_row(sweep_id: int, job: int, times: list[float] | None = None, **kw: Any) -> dict[str, Any]:
    """A complete ``runs`` row (with 3 measured steps and 5 stages) as a job would store it.

    With ``times``, those are the measured step times, and the step figures (tokens/s, IQR, the
    noisy flag, ...) are computed from them by :func:`metrics.summarize`, as a job does.
    """
    row: dict[str, Any] = {
        "sweep_id": sweep_id,
        "job_num": job,
        "amp": False,
        "ckpt": False,
        "batch": 8,
        "seq_len": 128,
        "compile": False,
        "workers": 0,
        "amp_dtype": "bf16",
        "model_name": "tiny",
        "data_name": "synthetic",
        "config_json": {},
        "config_hash": f"{sweep_id}-{job}",
        "status": "ok",
        "device_type": "cpu",
        "device_name": "Test CPU",
        "torch_version": "2.x",
        "hostname": "testhost",
        "step_time_ms_median": 100.0,
        "step_time_ms_p10": 95.0,
        "step_time_ms_p90": 105.0,
        "tokens_per_s": 10240.0,
        "peak_mem_bytes": 100 * 2**20,
        "measure_steps": 3,
        "warmup_steps": 1,
    }
    row.update(kw)
    if times is not None:
        records = [StepRecord(1 + i, "measure", t, 0.1, 9.0 - 0.1 * i) for i, t in enumerate(times)]
        figures = summarize(records, row["batch"] * row["seq_len"], row["batch"], sum(times)).row()
        row.update({k: v for k, v in figures.items() if k not in kw})
    if row["status"] != "ok":
        for k in ("step_time_ms_median", "step_time_ms_p10", "step_time_ms_p90", "tokens_per_s"):
            row.setdefault(k, None)
            if k not in kw:
                row[k] = None
        row.setdefault("error", f"{row['status']}: synthetic")
    else:
        row["steps"] = [
            {
                "step": 1 + i,
                "phase": "measure",
                "step_time_ms": t,
                "data_wait_ms": 0.1,
                "loss": 9.0 - 0.1 * i,
            }
            for i, t in enumerate(times or [row["step_time_ms_median"]] * 3)
        ]
        row["stages"] = [
            {
                "stage": s,
                "cpu_time_ms": t,
                "device_time_ms": t,
                "device_time_source": "same_as_cpu",
                "calls": 1,
            }
            for s, t in zip(STAGES, (1.0, 30.0, 60.0, 8.0, 1.0), strict=True)
        ]
    return row


def new_sweep(engine: Any, folder: Path, name: str = "handmade", make_dir: bool = True) -> int:
    if make_dir:
        folder.mkdir(parents=True, exist_ok=True)
    return store.get_or_create_sweep(engine, str(folder), name)


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = store.connect(f"sqlite:///{tmp_path / 'results.db'}")
    yield eng
    eng.dispose()


def tokens_from_db(db: Path, sweep_id: int) -> dict[int, float]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT id, tokens_per_s FROM runs WHERE sweep_id = ?", (sweep_id,)).fetchall())


def bar_values(ax: Any) -> list[float]:
    """The values the bars of ``ax`` were drawn with (bars lie down), in drawing order."""
    return [p.get_width() for p in ax.patches if isinstance(p, Rectangle)]


def line_data(ax: Any) -> dict[str, tuple[list[float], list[float]]]:
    """Each labelled line of ``ax``: its x and y data as drawn."""
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if not line.get_label().startswith("_") and line.get_marker() != charts.CROSS["marker"]
    }


# --------------------------------------------------------------------------------------------
# real sweeps


@pytest.mark.slow
def test_amp_ckpt_sweep_gets_its_charts_and_skips_the_rest(report_sweeps: ReportSweeps, tmp_path: Path) -> None:
    eng = store.connect(report_sweeps.url)
    out = build_report(eng, [report_sweeps.amp_ckpt], out_dir=tmp_path / "r")
    drawn = {p.stem for p in out.glob("*.png")}
    assert drawn == {"throughput", "memory", "pareto", "breakdown", "factors", "loss"}
    md = (out / "report.md").read_text()
    for name in drawn:
        assert f"]({name}.png)" in md  # embedded with a relative link
    assert "`scaling.png`" in md and "neither batch nor seq_len varies" in md
    assert "`heatmap.png`" in md and "needs both batch and seq_len to vary" in md
    assert "`gpu.png`" in md and "no GPU busy time" in md  # CPU: no verdict, no GPU chart
    # table shows only the differing axes
    header = next(line for line in md.splitlines() if line.startswith("| amp"))
    assert header.startswith("| amp | ckpt | status |")
    assert "| batch |" not in header
    csv = pd.read_csv(out / "runs.csv")
    assert len(csv) == 4 and "config_json" not in csv.columns
    assert "## Environment" in md and "| torch_version |" in md and "| hostname |" in md


@pytest.mark.slow
def test_a_first_sweep_on_a_new_machine_prints_no_other_librarys_notes(report_sweeps: ReportSweeps) -> None:
    """The sweep's report was its machine's first chart: matplotlib built its font list, and its
    INFO line "matplotlib.font_manager: generated new fontManager" stood among the sweep's own
    lines (Hydra sets the root logger to INFO). Every stderr line is perfsweep's: its notes, a
    job's header, progress and outcome."""
    from tests.conftest_report import FIRST_SWEEP_STDERR, FRESH_MATPLOTLIB

    assert list((report_sweeps.workdir / FRESH_MATPLOTLIB).glob("fontlist*.json"))  # the font list was built then
    lines = (report_sweeps.workdir / FIRST_SWEEP_STDERR).read_text().splitlines()
    assert any(line.startswith("[4/4] ") for line in lines), lines
    assert [line for line in lines if line and not line.startswith(("perfsweep", "[", "  "))] == []
    eng = store.connect(report_sweeps.url)
    rep = make_report(eng, [report_sweeps.batch_seq])
    drawn = {n for n, c in rep.charts.items() if c.figure is not None}
    assert drawn == {"throughput", "memory", "pareto", "breakdown", "scaling", "heatmap", "loss"}
    assert "amp, ckpt, compile" in (rep.charts["factors"].skipped or "")
    # the heatmap cells are the stored tokens/s
    heat = rep.charts["heatmap"].frame
    with sqlite3.connect(report_sweeps.db) as conn:
        stored = pd.read_sql_query(
            f"SELECT batch, seq_len, tokens_per_s FROM runs WHERE sweep_id = {report_sweeps.batch_seq}",
            conn,
        )
    merged = heat.merge(stored, on=["batch", "seq_len"], suffixes=("_chart", "_db"))
    assert len(merged) == 4
    np.testing.assert_allclose(merged["throughput_per_s"], merged["tokens_per_s"])
    # its colour scale starts at the lowest value, not 0: both ends carry their value (the darkest had none)
    bar = rep.charts["heatmap"].figure.axes[-1]
    ticks = bar.get_yticks()
    assert ticks[0] == pytest.approx(stored["tokens_per_s"].min()) and ticks[-1] == pytest.approx(
        stored["tokens_per_s"].max()
    )


@pytest.mark.slow
def test_throughput_bars_are_the_stored_tokens_per_s(report_sweeps: ReportSweeps) -> None:
    eng = store.connect(report_sweeps.url)
    rep = make_report(eng, [report_sweeps.amp_ckpt])
    chart = rep.charts["throughput"]
    stored = tokens_from_db(report_sweeps.db, report_sweeps.amp_ckpt)
    frame = chart.frame
    assert sorted(frame["id"]) == sorted(stored)
    for rid, tps in zip(frame["id"], frame["throughput_per_s"], strict=True):
        assert tps == pytest.approx(stored[rid])
    # and the drawn bars, in frame order
    np.testing.assert_allclose(bar_values(chart.figure.axes[0]), frame["throughput_per_s"].to_numpy(), rtol=1e-12)
    # speedup is relative to the default baseline (amp and ckpt off), the one the sweep stored its
    # speedups against: each bar's label is the stored speedup with its stored 95% interval
    base = frame[frame["is_baseline"]]
    assert list(base["label"]) == ["amp=off ckpt=off"]
    with sqlite3.connect(report_sweeps.db) as conn:
        speedups = pd.read_sql_query(
            "SELECT id, speedup, speedup_ci_lo, speedup_ci_hi, speedup_basis, speedup_verdict, baseline_config_hash, "
            f"config_hash FROM runs WHERE sweep_id = {report_sweeps.amp_ckpt}",
            conn,
        ).set_index("id")
    assert (speedups["baseline_config_hash"] == base["config_hash"].iloc[0]).all()
    labels = {t.get_text().strip() for t in chart.figure.axes[0].texts}
    for rid in frame.loc[~frame["is_baseline"], "id"]:
        s = speedups.loc[rid]
        assert s["speedup_basis"] == "steps" and s["speedup_ci_lo"] <= s["speedup"] <= s["speedup_ci_hi"]
        # as fmt.speedup writes it: a bound within 0.005 of 1 on an interval clear of 1 gets more
        # digits (a resampled 0.9996 read '1.00' in a CI run, and the test written to 2 failed)
        assert fmt.speedup(s["speedup"], s["speedup_ci_lo"], s["speedup_ci_hi"]) in labels
    np.testing.assert_allclose(frame["speedup"], speedups.loc[frame["id"], "speedup"])
    assert frame["speedup_verdict"].tolist() == speedups.loc[frame["id"], "speedup_verdict"].tolist()


@pytest.mark.slow
def test_sweep_end_already_wrote_the_report(report_sweeps: ReportSweeps) -> None:
    """perfsweep.summary calls build_report when a sweep ends: report/ lies in the sweep folder."""
    with sqlite3.connect(report_sweeps.db) as conn:
        sweep_dir = conn.execute("SELECT sweep_dir FROM sweeps WHERE id = ?", (report_sweeps.batch_seq,)).fetchone()[0]
    report = Path(sweep_dir) / "report"
    assert (report / "report.md").is_file()
    assert (report / "heatmap.png").is_file() and (report / "scaling.png").is_file()


@pytest.mark.slow
def test_cli_defaults_to_latest_sweep_and_its_folder(
    report_sweeps: ReportSweeps, capsys: pytest.CaptureFixture
) -> None:
    assert main(["--db", str(report_sweeps.db)]) == 0
    out = capsys.readouterr().out
    with sqlite3.connect(report_sweeps.db) as conn:
        sweep_dir = conn.execute("SELECT sweep_dir FROM sweeps WHERE id = ?", (report_sweeps.batch_seq,)).fetchone()[0]
    assert out.strip() == f"Report: {Path(sweep_dir) / 'report' / 'report.md'}"
    # the database as the user named it, not the read-only URI the report opened it with
    text = (Path(sweep_dir) / "report" / "report.md").read_text()
    assert f"- Database: `sqlite:///{report_sweeps.db}`, e.g." in text


@pytest.mark.slow
def test_cli_where_and_baseline(report_sweeps: ReportSweeps, tmp_path: Path) -> None:
    out = tmp_path / "w"
    rc = main(
        [
            "--db",
            report_sweeps.url,
            "--sweep",
            str(report_sweeps.amp_ckpt),
            "--where",
            "amp = 1",
            "--baseline",
            "amp=true,ckpt=true",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    csv = pd.read_csv(out / "runs.csv")
    assert len(csv) == 2 and csv["amp"].all()
    base = csv[csv["is_baseline"]]
    assert len(base) == 1 and bool(base["ckpt"].iloc[0])
    assert "**Baseline:** ckpt=on (as requested)" in (out / "report.md").read_text()


# --------------------------------------------------------------------------------------------
# repeats, stored speedup intervals and the stored noise flag (rows through perfsweep.store, the
# intervals written by perfsweep.summary.fill_speedups as at the end of a sweep)


def stored_runs(db: Path, columns: str) -> pd.DataFrame:
    with sqlite3.connect(db) as conn:
        return pd.read_sql_query(f"SELECT id, {columns} FROM runs ORDER BY id", conn).set_index("id")


def test_repeats_are_one_bar_at_their_median_with_their_range(engine: Any, tmp_path: Path) -> None:
    """amp=on three times (one run noisy), amp=off twice: one bar per config at the median of its
    runs' stored tokens/s, the whisker over their range, runs = N in the table, every run in runs.csv."""
    sid = new_sweep(engine, tmp_path / "sw")
    job = itertools.count()
    repeats = {True: ([50.0] * 4, [40.0] * 4, [45.0, 46.0, 60.0, 70.0]), False: ([100.0] * 4, [90.0] * 4)}
    for amp, times in repeats.items():
        for i, t in enumerate(times):
            store.save_run(engine, run_row(sid, next(job), t, amp=amp, config_hash=f"amp={amp}", repeat_index=i))
    summary.fill_speedups(engine, sid)
    db = stored_runs(tmp_path / "results.db", "amp, tokens_per_s, noisy, speedup, speedup_ci_lo, speedup_ci_hi")
    tokens = db.groupby("amp")["tokens_per_s"]
    assert db["noisy"].tolist() == [0, 0, 1, 0, 0]  # IQR/median of 45, 46, 60, 70 ms is 32%

    rep = make_report(engine, [sid])
    chart = rep.charts["throughput"]
    ax = chart.figure.axes[0]
    assert chart.frame["label"].tolist() == ["amp=on", "amp=off"] and chart.frame["runs"].tolist() == [3, 2]
    np.testing.assert_allclose(bar_values(ax), [tokens.median()[1], tokens.median()[0]])
    whiskers = [sorted(seg[:, 0]) for c in ax.collections for seg in c.get_segments()]
    np.testing.assert_allclose(whiskers, [[tokens.min()[a], tokens.max()[a]] for a in (1, 0)])
    # the bar for amp=on is the run nearest its median; its label, the stored interval (over repeats)
    on = db[db["amp"] == 1].iloc[0]
    assert chart.frame["id"].iloc[0] == db.index[db["tokens_per_s"] == tokens.median()[1]][0]
    texts = {t.get_text().strip() for t in ax.texts}
    assert f"{on['speedup']:.2f}x ({on['speedup_ci_lo']:.2f}-{on['speedup_ci_hi']:.2f})" in texts

    table, _ = results_table(rep.configs)
    lo, hi = tokens.min()[1], tokens.max()[1]
    assert f"| on | 3 | ok | {tokens.median()[1]:,.0f} | {lo:,.0f}-{hi:,.0f} | {on['speedup']:.2f}x (" in table
    # one run is noisy, and the runs' tokens/s spread more than 10% of their median: the summary's rule
    assert f"| noisy ({NOISY_RULE}) in 1 of 3 runs; the repeats' tokens/s disagree" in table
    assert "| off | 2 | ok |" in table and "| baseline |" in table
    assert "| 50.0 (0%, 0%) |" in table  # amp=on's run nearest the median: steady 50 ms steps, its IQR and CV
    out = build_report(engine, [sid], out_dir=tmp_path / "out")
    assert sorted(pd.read_csv(out / "runs.csv")["id"]) == sorted(db.index)  # runs.csv: one row per run
    assert INTERVALS in (out / "report.md").read_text()


def test_repeats_that_disagree_with_steady_steps_are_not_called_noisy_runs(engine: Any, tmp_path: Path) -> None:
    """Two steady runs 25% apart: the note says the repeats disagree, not "noisy in 0 of 2 runs"."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, times in enumerate(([100.0] * 4, [80.0] * 4)):
        store.save_run(engine, run_row(sid, job, times, config_hash="same", repeat_index=job))
    table, _ = results_table(make_report(engine, [sid]).configs)
    row = next(line for line in table.splitlines() if line.startswith("| 8 | 128 | 2 |"))
    assert row.endswith("| the repeats' tokens/s disagree (IQR/median > 10%) |") and "0 of" not in row, row


def test_a_data_parallel_row_counts_every_ranks_samples(engine: Any, tmp_path: Path) -> None:
    """A 2-rank job at batch 8 steps 16 sequences: its range brackets its tokens/s (it was half of it,
    from the per-rank batch), and the table shows per-rank tokens/s and the allreduce."""
    sid = new_sweep(engine, tmp_path / "sw")
    plain = {"config_json": {"nproc": None}}
    store.save_run(engine, run_row(sid, 0, global_batch=8, **plain))
    ddp = dict(nproc=2, global_batch=16, tokens_per_s=20480.0, tokens_per_s_per_rank=10240.0, slowest_rank=1)
    store.save_run(engine, run_row(sid, 1, **ddp, allreduce_ms_per_step=12.5, config_json={"nproc": 2}))
    old = dict(batch=4, seq_len=64, tokens_per_s=2560.0)  # stored before global_batch existed
    store.save_run(engine, run_row(sid, 2, **old, **plain))
    configs = make_report(engine, [sid]).configs
    ranges = configs[["throughput_per_s_lo", "throughput_per_s", "throughput_per_s_hi"]].to_numpy()
    assert (ranges[:, 0] < ranges[:, 1]).all() and (ranges[:, 1] < ranges[:, 2]).all(), ranges
    # 16 x 128 tokens at the p90 and p10 step (105, 95 ms)
    np.testing.assert_allclose(ranges[1, [0, 2]], [16 * 128 / 0.105, 16 * 128 / 0.095])
    table, _ = results_table(configs)
    header = table.splitlines()[0]
    assert header.startswith("| batch | seq_len | nproc |") and "ranks" not in header, header
    assert header.endswith("| tokens/s per rank | allreduce ms/step | note |"), header
    assert "| 8 | 128 | 2 | ok | 20,480 | 19,505-21,558 |" in table and "| 10,240 | 12.5 |" in table
    assert "| 4 | 64 | null | ok | 2,560 | 2,438-2,695 |" in table
    # a table of 2-rank jobs only names no nproc axis: a column says how many ranks
    table, _ = results_table(configs[configs["nproc"].notna()])
    assert table.splitlines()[0].endswith("| ranks | tokens/s per rank | allreduce ms/step | note |")
    assert "| 2 | 10,240 | 12.5 |" in table


def test_interval_verdicts_and_a_baseline_of_your_own(engine: Any, tmp_path: Path) -> None:
    """A config whose interval contains 1 is drawn in the neutral colour; against a baseline other
    than the stored one, the intervals are computed from the measured steps."""
    sid = new_sweep(engine, tmp_path / "sw")
    base = [100.0, 101.0, 99.0, 100.0, 102.0, 98.0]
    for job, (kw, times) in enumerate(
        (
            ({}, base),
            ({"ckpt": True}, [101.0, 100.0, 99.0, 102.0, 98.0, 100.0]),
            ({"amp": True}, [t / 2 for t in base]),
            ({"batch": 16}, [t * 3 for t in base]),
        )
    ):
        store.save_run(engine, run_row(sid, job, times, **kw))
    summary.fill_speedups(engine, sid)
    db = stored_runs(tmp_path / "results.db", "tokens_per_s, speedup, speedup_ci_lo, speedup_ci_hi, speedup_verdict")
    assert db["speedup_verdict"].tolist() == ["baseline", metrics.NO_DIFFERENCE, "faster", "slower"]

    rep = make_report(engine, [sid])
    ax = rep.charts["throughput"].figure.axes[0]
    assert [to_hex(p.get_facecolor()) for p in ax.patches] == [
        to_hex(c) for c in (charts.BASE, charts.LIGHT, charts.BAR, charts.BAD)
    ]
    legend = [t.get_text() for t in rep.charts["throughput"].figure.legends[0].get_texts()]
    assert metrics.NO_DIFFERENCE in legend and "measurably slower than the baseline" in legend
    texts = [t.get_text().strip() for t in ax.texts]
    for r in db.iloc[1:].itertuples():
        assert f"{r.speedup:.2f}x ({r.speedup_ci_lo:.2f}-{r.speedup_ci_hi:.2f})" in texts
    table, _ = results_table(rep.configs)
    assert f"{db['speedup'].iloc[1]:.2f}x ({db['speedup_ci_lo'].iloc[1]:.2f}-" in table
    assert "no measurable difference |" in table and "faster |" in table

    # against a baseline of your own the intervals are computed the same way, from the measured steps
    out = build_report(engine, [sid], out_dir=tmp_path / "own", baseline={"amp": True})
    md = (out / "report.md").read_text()
    own = make_report(engine, [sid], baseline={"amp": True}).configs
    np.testing.assert_allclose(own["speedup"], db["tokens_per_s"] / db["tokens_per_s"].iloc[2])
    amp = metrics.Throughput([db["tokens_per_s"].iloc[2]], [[t / 2 for t in base]])
    expected = metrics.Throughput([db["tokens_per_s"].iloc[0]], [base]).ratio(amp)
    first = own.iloc[0]
    assert (first["speedup"], first["speedup_ci_lo"], first["speedup_ci_hi"]) == pytest.approx(
        (expected.value, expected.lo, expected.hi)
    )
    assert own["speedup_verdict"].iloc[:2].tolist() == ["slower", "slower"] and own["speedup_basis"].iloc[0] == "steps"
    assert INTERVALS in md and f"| {expected.value:.2f}x ({expected.lo:.2f}-{expected.hi:.2f}) slower |" in md
    # runs.csv carries the same figures (it carried the stored ones, over the default baseline)
    csv = pd.read_csv(out / "runs.csv").sort_values("id")
    assert csv["speedup"].tolist() == pytest.approx(own["speedup"].tolist())
    assert csv["speedup_verdict"].tolist() == ["slower", "slower", "baseline", "slower"]
    assert csv["is_baseline"].tolist() == [False, False, True, False]
    # ...and report.md says so (it said they were the stored ones, over the default baseline)
    assert "its `speedup` columns are this report's, over its baseline (as requested; `baseline_config_hash`)" in md


def test_noise_is_the_stored_flag(engine: Any, tmp_path: Path) -> None:
    """The report flags what runs.noisy says, not a rule of its own: a run stored noisy with a
    narrow p10-p90 is flagged; one stored quiet with a wide p10-p90 and an IQR of 30% (what the
    IQR rule would flag) is not."""
    sid = new_sweep(engine, tmp_path / "sw")
    quiet_but_wide = {"step_time_ms_p10": 50.0, "step_time_ms_p90": 200.0, "step_time_ms_iqr": 30.0, "noisy": False}
    noisy = {"noisy": True, "step_time_ms_iqr": 15.0}
    for job, (amp, ckpt) in enumerate(itertools.product((False, True), repeat=2)):
        kw = noisy if (amp, ckpt) == (True, False) else quiet_but_wide if amp else {}
        store.save_run(engine, run_row(sid, job, amp=amp, ckpt=ckpt, tokens_per_s=1000.0 + 100 * job, **kw))
    flagged = stored_runs(tmp_path / "results.db", "noisy, step_time_ms_iqr, step_time_ms_median")
    row = flagged[flagged["noisy"] == 1].iloc[0]
    out = build_report(engine, [sid], out_dir=tmp_path / "out")
    md = (out / "report.md").read_text()
    assert f"noisy: IQR {row['step_time_ms_iqr']:.1f} ms, 15% of the median 100.0 ms" in md
    assert md.count("noisy: ") == 1  # amp=on ckpt=on, wide but stored quiet, is not flagged
    assert f"**Noisy timings:** 1 of 4 ok configs have noisy timings ({NOISY_RULE}" in md
    assert "that disagree) (amp=on ckpt=off);" in md
    assert "Caution: 1 of 4 ok configs have noisy timings" in md  # the factor effects' caption


def test_a_run_with_a_few_stalls_is_noisy_and_the_report_says_why(engine: Any, tmp_path: Path) -> None:
    """One step of 20 at 30x the median (IQR 0): the run is stored noisy by the tail rule, and
    report.md gives the mean and how far it is off the median, not an IQR that looks quiet. A row
    stored noisy by a rule whose parts do not fire today (an import's) names its stored rule."""
    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0, [100.0] * 19 + [3000.0], amp=True))
    store.save_run(engine, run_row(sid, 1, [100.0] * 20))
    other = {"noisy": True, "noisy_rule": "p90/p10 > 1.5", "step_time_ms_iqr": 1.0, "step_time_ms_mean": 100.0}
    store.save_run(engine, run_row(sid, 2, batch=16, **other))
    db = stored_runs(tmp_path / "results.db", "noisy, noisy_rule, step_time_ms_iqr")
    assert db["noisy"].tolist() == [1, 0, 1] and db["step_time_ms_iqr"].iloc[0] == 0.0
    assert db["noisy_rule"].tolist() == [NOISY_RULE, NOISY_RULE, "p90/p10 > 1.5"]
    md = (build_report(engine, [sid], out_dir=tmp_path / "out") / "report.md").read_text()
    assert "noisy: mean 245.0 ms, 145% off the median: a few steps far from the rest" in md
    assert "noisy: by its stored rule, p90/p10 > 1.5" in md
    assert "**Noisy timings:** 2 of 3 ok configs" in md


def test_a_sweep_judged_by_the_old_noisy_rule_is_reported_with_it(engine: Any, tmp_path: Path) -> None:
    """Runs stored before schema 0012 keep the flags the IQR rule gave them (runs.noisy_rule says
    so); report.md said they had been judged by today's rule, mean included, which they were not."""
    old = "step-time IQR > 10% of the median"
    sid = new_sweep(engine, tmp_path / "sw")
    flagged = {"noisy": True, "noisy_rule": old, "step_time_ms_iqr": 15.0}
    store.save_run(engine, run_row(sid, 0, amp=True, **flagged))
    store.save_run(engine, run_row(sid, 1, amp=True, **flagged, config_hash=f"{sid}-0", repeat_index=1))
    store.save_run(engine, run_row(sid, 2, noisy=False, noisy_rule=old))
    md = (build_report(engine, [sid], out_dir=tmp_path / "out") / "report.md").read_text()
    assert f"**Noisy timings:** 1 of 2 ok configs have noisy timings ({old}, or repeats that disagree)" in md
    assert f"noisy ({old}) in 2 of 2 runs" in md
    assert NOISY_RULE not in md


# --------------------------------------------------------------------------------------------
# factor effects on a hand-made 2x2 with known effects


def test_factor_effects_of_a_known_2x2(engine: Any, tmp_path: Path) -> None:
    # tokens/s: (amp, ckpt) -> off/off 100, on/off 150, off/on 80, on/on 170
    # main amp = (150+170)/2 - (100+80)/2 = 70; main ckpt = (80+170)/2 - (100+150)/2 = 0
    # amp x ckpt = (100+170)/2 - (150+80)/2 = 20; mean = 125
    tps = {(False, False): 100.0, (True, False): 150.0, (False, True): 80.0, (True, True): 170.0}
    mem = {(False, False): 400.0, (True, False): 300.0, (False, True): 200.0, (True, True): 100.0}
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (a, c) in enumerate(tps):
        store.save_run(
            engine,
            run_row(
                sid,
                job,
                amp=a,
                ckpt=c,
                tokens_per_s=tps[a, c],
                peak_mem_bytes=int(mem[a, c] * 2**20),
                times=[1024 * 1000 / tps[a, c] * f for f in (0.98, 1.02, 1.0, 0.99, 1.01, 1.0)],  # +-2% around it
            ),
        )
    rep = make_report(engine, [sid])
    chart = rep.charts["factors"]
    eff = chart.frame.set_index("label")  # one row per term
    assert list(eff.index) == ["amp", "ckpt", "amp x ckpt"]
    assert eff["effect_throughput_per_s"].tolist() == pytest.approx([70.0, 0.0, 20.0])
    assert eff["effect_pct_throughput_per_s"].tolist() == pytest.approx([56.0, 0.0, 16.0])
    assert eff["effect_peak_mem_bytes"].tolist() == pytest.approx([-100.0 * 2**20, -200.0 * 2**20, 0.0])
    # drawn: the bars are the effects in % of the mean, tokens/s left, memory right (mean 250 MiB)
    ax_tokens, ax_mem = chart.figure.axes[:2]
    assert bar_values(ax_tokens) == pytest.approx([56.0, 0.0, 16.0])
    assert bar_values(ax_mem) == pytest.approx([-40.0, -80.0, 0.0])
    # 95% intervals over the steps: amp and amp x ckpt are real, ckpt (no effect) is not
    lo, hi = eff["effect_pct_ci_lo_throughput_per_s"], eff["effect_pct_ci_hi_throughput_per_s"]
    assert lo["amp"] > 40 and hi["amp"] < 70 and lo["amp x ckpt"] > 0 and lo["ckpt"] < 0 < hi["ckpt"]
    assert eff["effect_verdict"].tolist() == ["", metrics.NO_DIFFERENCE, ""]
    whiskers = [seg for c in ax_tokens.collections for seg in c.get_segments()]
    np.testing.assert_allclose(sorted(seg[0][0] for seg in whiskers), sorted(lo))
    ckpt = f"| ckpt | +0 (+0.0%, 95% CI {lo['ckpt']:+.1f} to {hi['ckpt']:+.1f}%) {metrics.NO_DIFFERENCE} |"
    assert ckpt in chart.extra_md and "| amp x ckpt | +20 (+16.0%, 95% CI" in chart.extra_md
    assert_labels_fit(chart.figure)  # the memory panel's labels sit left of negative bars, past their whiskers


def test_factor_bars_say_the_effect_alone(engine: Any, tmp_path: Path) -> None:
    """factors.png of a noisy 2x2 (ckpt and amp x ckpt within the noise): "+150 (+0.9%) no measurable
    difference" was cut off by the memory panel and "-620 (-3.8%)" pushed over the amp tick label. The
    verdict is the bar's colour and the legend's, and report.md's table keeps the words."""
    tps = {(False, False): 16400.0, (True, False): 15780.0, (False, True): 16550.0, (True, True): 15930.0}
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (a, c) in enumerate(tps):
        times = [1024 * 1000 / tps[a, c] * f for f in (0.85, 1.15, 1.0, 0.9, 1.1, 1.0, 0.95, 1.05)]
        row = run_row(sid, job, amp=a, ckpt=c, tokens_per_s=tps[a, c], times=times, peak_mem_bytes=(4 - a - c) * 2**27)
        store.save_run(engine, row)
    chart = make_report(engine, [sid]).charts["factors"]
    assert chart.frame["effect_verdict"].tolist() == ["", metrics.NO_DIFFERENCE, metrics.NO_DIFFERENCE]
    charts.save(chart.figure, tmp_path / "factors.png")
    texts = [t.get_text().strip() for t in chart.figure.axes[0].texts]
    assert texts == ["-620 (-3.8%)", "+150 (+0.9%)", "+0 (+0.0%)"]
    assert_labels_fit(chart.figure)
    assert "| ckpt | +150 (+0.9%, 95% CI" in chart.extra_md and f"%) {metrics.NO_DIFFERENCE} |" in chart.extra_md
    # the interaction's bar is the faded one, and the caption says so (the legend names only the colours)
    alphas = [p.get_facecolor()[3] for p in chart.figure.axes[0].patches]
    assert alphas == [1.0, 1.0, 0.5] and "its bar faded in the same colours" in chart.caption


def assert_labels_fit(fig: Any) -> None:
    """Every value label at a bar's end lies inside its axes and clear of its own whisker (a label
    once ran over the y tick labels, and a negative bar's label covered its whisker)."""
    charts.fit_labels(fig)  # as charts.save does
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        whiskers = [seg for c in ax.collections for seg in c.get_segments()]
        for t in ax.texts:
            if t.get_horizontalalignment() not in ("left", "right") or not t.get_text().strip():
                continue
            ext = t.get_window_extent(renderer)
            assert box.x0 - 1 <= ext.x0 and ext.x1 <= box.x1 + 1, (t.get_text(), ext, box)
            y = t.get_position()[1]
            for seg in whiskers:
                if abs(seg[0][1] - y) < 1e-9:  # its own whisker: the text starts where the whisker ends
                    ends = ax.transData.transform([(min(seg[0][0], seg[1][0]), y), (max(seg[0][0], seg[1][0]), y)])
                    assert ext.x1 <= ends[0][0] + 1 or ext.x0 >= ends[1][0] - 1, (t.get_text(), ext, ends)


def test_factor_effects_use_only_complete_blocks(engine: Any, tmp_path: Path) -> None:
    """With batch varying too, a batch whose 2x2 has an OOM is left out of the effects."""
    sid = new_sweep(engine, tmp_path / "sw")
    job = itertools.count()
    for batch, (a, c) in itertools.product((8, 16), itertools.product((False, True), repeat=2)):
        oom = batch == 16 and a is False and c is False
        store.save_run(
            engine,
            run_row(
                sid,
                next(job),
                batch=batch,
                amp=a,
                ckpt=c,
                tokens_per_s=1000.0 + 500 * a + (5000 if batch == 16 else 0),
                status="oom" if oom else "ok",
            ),
        )
    runs = prepare_runs(load_runs(engine, [sid]))
    effects, note = frames.factorial_effects(per_config(runs))
    assert note.startswith("averaged over 1 of 2 combinations of batch")
    effects = effects.set_index("label")
    assert effects.loc["amp", "effect_throughput_per_s"] == pytest.approx(500.0)
    assert effects.loc["ckpt", "effect_throughput_per_s"] == pytest.approx(0.0)


def test_no_factors_when_no_block_is_complete(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (a, c) in enumerate(itertools.product((False, True), repeat=2)):
        store.save_run(engine, run_row(sid, job, amp=a, ckpt=c, status="oom" if a and c else "ok"))
    rep = make_report(engine, [sid])
    assert rep.charts["factors"].figure is None
    assert "incomplete" in rep.charts["factors"].skipped


# --------------------------------------------------------------------------------------------
# memory, failures, top-N, labels, baseline


def test_cuda_memory_chart_draws_allocated_and_reserved(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    alloc = {False: 3 * 2**30, True: 2 * 2**30}
    for job, amp in enumerate((False, True)):
        store.save_run(
            engine,
            run_row(
                sid,
                job,
                amp=amp,
                device_type="cuda",
                peak_mem_bytes=alloc[amp],
                peak_allocated_bytes=alloc[amp],
                peak_reserved_bytes=alloc[amp] + 2**29,
            ),
        )
    rep = make_report(engine, [sid])
    fig = rep.charts["memory"].figure
    # GiB, in drawing order: allocated (amp=off, amp=on), then reserved (each 0.5 GiB above)
    assert bar_values(fig.axes[0]) == pytest.approx([3.0, 2.0, 3.5, 2.5])
    assert "peak memory (GiB)" in fig.axes[0].get_xlabel()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == [
        "peak allocated (tensors)",
        "peak reserved (caching allocator)",
        "baseline peak allocated: 3 GiB",
        "baseline peak reserved: 3.5 GiB",
    ]


def test_baseline_line_never_strikes_a_bar_value_out(engine: Any, tmp_path: Path) -> None:
    """memory.png: the baseline's dashed line at 100 MiB runs through the values of the bars just short of
    it ("99.4", "98.7"); their box hides it (it was 80% opaque: the line showed through the digits)."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (amp, ckpt, mib) in enumerate(
        ((False, False, 100.0), (True, False, 99.4), (False, True, 60), (True, True, 98.7))
    ):
        store.save_run(engine, run_row(sid, job, amp=amp, ckpt=ckpt, peak_mem_bytes=int(mib * 2**20)))
    fig = make_report(engine, [sid]).charts["memory"].figure
    charts.save(fig, tmp_path / "memory.png")
    ax, renderer = fig.axes[0], fig.canvas.get_renderer()
    (line,) = [line for line in ax.get_lines() if line.get_label().startswith("baseline")]
    x = ax.transData.transform((line.get_xdata()[0], 0))[0]
    crossed = [t for t in ax.texts if t.get_window_extent(renderer).x0 < x < t.get_window_extent(renderer).x1]
    assert {t.get_text().strip() for t in crossed} >= {"99.4", "98.7"}
    for t in crossed:
        assert t.get_zorder() > line.get_zorder() and to_rgba(t.get_bbox_patch().get_facecolor()) == (1, 1, 1, 1)


def test_failed_runs_are_marked_not_dropped(engine: Any, tmp_path: Path) -> None:
    sid = failing_grid(engine, tmp_path)
    rep = make_report(engine, [sid])
    pareto = rep.charts["pareto"].frame
    assert set(pareto.loc[~pareto["ok"], "status"]) == {"oom", "failed"}
    assert not pareto.loc[~pareto["ok"], "on_front"].any()
    heat = rep.charts["heatmap"]
    assert heat.figure is not None
    texts = {t.get_text() for ax in heat.figure.axes for t in ax.texts}
    assert "OOM" in texts
    thr = rep.charts["throughput"].frame
    assert set(thr["status"]) == {"ok", "oom", "failed"}  # failed configs keep their slot
    md = (build_report(engine, [sid], out_dir=tmp_path / "out")).joinpath("report.md").read_text()
    assert "Did not finish:" in md and "oom" in md


def failing_grid(engine: Any, tmp_path: Path) -> int:
    """batch 4/8/16 x seq_len 64/128, tokens/s and memory proportional to tokens per step; the
    largest config ran out of memory, and one batch=16 config with workers=2 failed."""
    sid = new_sweep(engine, tmp_path / "sw")
    job = itertools.count()
    for batch, seq in itertools.product((4, 8, 16), (64, 128)):
        status = "oom" if batch == 16 and seq == 128 else "ok"
        tps = float(batch * seq * 10) if status == "ok" else None
        store.save_run(
            engine,
            run_row(
                sid,
                next(job),
                batch=batch,
                seq_len=seq,
                status=status,
                tokens_per_s=tps,
                peak_mem_bytes=batch * seq * 2**14,
            ),
        )
    store.save_run(engine, run_row(sid, next(job), batch=16, seq_len=64, workers=2, status="failed"))
    return sid


def test_a_heatmap_of_one_value_has_that_value_alone_on_its_colour_bar(engine: Any, tmp_path: Path) -> None:
    """One cell ran (12,345.678 tokens/s), the rest ran out of memory: the colour bar's ends read
    11.1111k and 13.5802k, values no run had (the scale is widened around one value)."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (seq, batch) in enumerate(itertools.product((64, 128), (4, 8))):
        ok = (seq, batch) == (64, 4)
        row = run_row(
            sid, job, batch=batch, seq_len=seq, status="ok" if ok else "oom", tokens_per_s=12345.678 if ok else None
        )
        store.save_run(engine, row)
    bar = make_report(engine, [sid]).charts["heatmap"].figure.axes[-1]
    assert list(bar.get_yticks()) == [pytest.approx(12345.678)]


@pytest.mark.parametrize(
    ("cells", "written"),
    [((12345.678, 12346.078, 12346.478, 12346.878), "12.3k"), ((12349.9, 12349.95, 12350.0, 12350.1), "12.3k")],
    ids=["one-text", "either-side-of-a-rounding-edge"],
)
def test_a_heatmap_whose_cells_write_alike_has_each_written_value_once_on_its_colour_bar(
    cells: tuple[float, ...], written: str, engine: Any, tmp_path: Path
) -> None:
    """Cells 0.01% apart (12,345.678 to 12,346.878 tokens/s) all write 12.3k: the bar had 12.3k at
    both ends, a scale from a value to itself, and the cells its darkest and brightest colours. The
    value is now on the bar once, and every cell has its colour. So too for cells 0.002% apart
    either side of 12,350, written 12.3k and 12.4k (a review found them darkest and brightest
    still, when "alike" meant "written alike")."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (seq, batch) in enumerate(itertools.product((64, 128), (4, 8))):
        store.save_run(engine, run_row(sid, job, batch=batch, seq_len=seq, tokens_per_s=cells[job]))
    figure = make_report(engine, [sid]).charts["heatmap"].figure
    bar = figure.axes[-1]
    labels = [t.get_text() for t in bar.get_yticklabels()]
    assert labels == [written] and list(bar.get_yticks()) == [pytest.approx(min(cells))], labels
    (image,) = [im for ax in figure.axes for im in ax.images if ax is not bar]
    colours = image.to_rgba(image.get_array()).reshape(-1, 4)
    assert len({tuple(c) for c in colours}) == 1, colours


def test_numbers_on_charts_are_rounded_before_their_suffix_is_chosen() -> None:
    """999.6 tokens/s was written '1e+03' beside a neighbour's '1k', and 999,600 '1e+03k'."""
    from perfsweep.report import fmt

    assert [fmt.si(v) for v in (999.6, 999_600, 14_109, 12_345.678, -1_234, 99.96, 0.00012, 0)] == [
        "1k", "1M", "14.1k", "12.3k", "-1.23k", "100", "0.00012", "0",
    ]  # fmt: skip
    assert fmt.alike(999.6, 1000.4) and fmt.alike(12349.9, 12350.1) and fmt.alike(0, 0)
    assert not fmt.alike(12300, 12360) and not fmt.alike(0, 0.001) and not fmt.alike(1.0, 2.0)


def test_an_interval_clear_of_1_never_prints_a_bound_of_1() -> None:
    """The H100 bf16 sweep's '1.02x (1.00-1.03) faster': its lower bound was 1.0049, and the
    interval read as touching 1 beside a verdict that says it does not. The summary and report
    write speedups alike (fmt.speedup)."""
    from perfsweep.report import fmt

    assert fmt.speedup(1.02, 1.0049, 1.03) == "1.020x (1.005-1.030)"
    assert fmt.speedup(0.98, 0.95, 0.9996) == "0.9800x (0.9500-0.9996)"
    assert fmt.speedup(1.003, 1.001, 1.005) == "1.003x (1.001-1.005)"  # '1.00x (1.001-1.005) faster' read as a tie
    assert fmt.speedup(1.35, 1.31, 1.40) == "1.35x (1.31-1.40)" and fmt.speedup(1.0, 0.97, 1.0) == "1.00x (0.97-1.00)"
    assert fmt.speedup(1.0, 0.996, 1.012) == "1.00x (1.00-1.01)"  # it holds 1: no more digits
    assert fmt.speedup(1.5, None, None) == "1.50x"
    assert summary._speedup_text("faster", 1.02, 1.0049, 1.03) == "1.020x (1.005-1.030) faster"


def test_scaling_lines_are_the_stored_runs(engine: Any, tmp_path: Path) -> None:
    sid = failing_grid(engine, tmp_path)
    rep = make_report(engine, [sid])
    chart = rep.charts["scaling"]
    ax_tps, ax_tps_seq, ax_mem, _ = chart.figure.axes[:4]  # rows: tokens/s, memory; columns: batch, seq_len
    assert ax_tps.get_title("left").startswith("vs batch") and ax_tps_seq.get_title("left").startswith("vs seq_len")
    lines = line_data(ax_tps)
    assert lines["seq_len=64 workers=0"] == ([4, 8, 16], [2560.0, 5120.0, 10240.0])
    assert lines["seq_len=128 workers=0"] == ([4, 8], [5120.0, 10240.0])  # batch 16 ran out of memory
    assert line_data(ax_mem)["seq_len=128 workers=0"] == ([4, 8], [8.0, 16.0])  # MiB
    assert "peak memory (MiB)" in ax_mem.get_ylabel()
    words = {w for t in ax_tps.texts for w in t.get_text().split("/")}
    assert {"OOM", "FAILED"} <= words  # the runs that did not finish are marked, not dropped
    frame = chart.frame[chart.frame["axis"] == "batch"].set_index("id")
    assert set(frame["status"]) == {"ok", "oom", "failed"}
    # one legend for both columns: a colour never means one line on the left and another on the right
    colours = [
        {line.get_color() for line in ax.lines if not line.get_label().startswith(("did not", "_"))}
        for ax in (ax_tps, ax_tps_seq)
    ]
    assert colours[0] and colours[1] and not colours[0] & colours[1], colours
    assert ax_mem.get_xlabel().startswith("batch")


def test_scaling_says_each_reason_once_where_lines_fail_at_the_same_x(engine: Any, tmp_path: Path) -> None:
    """Three lines end at batch 16, two out of memory and one failed: "OOM" was written twice on
    top of itself and "FAILED" over both, and the three x marks covered each other at 3% of the
    axes' height, among real values. Now they lie side by side, centred on their x, in a band under
    0, in their lines' colours, each reason written once under them; the marks' shapes say which
    line failed and which ran out of memory (the same x for all three did not)."""
    sid = new_sweep(engine, tmp_path / "sw")
    job = itertools.count()
    for seq, batch in itertools.product((64, 128, 256), (4, 8, 16)):
        status = "ok" if batch < 16 else "failed" if seq == 256 else "oom"
        tps = float(batch * seq * 10) if status == "ok" else None
        store.save_run(engine, run_row(sid, next(job), batch=batch, seq_len=seq, status=status, tokens_per_s=tps))
    chart = make_report(engine, [sid]).charts["scaling"]
    charts.save(chart.figure, tmp_path / "scaling.png")
    ax = chart.figure.axes[0]
    assert ax.get_title("left").startswith("vs batch")
    (reasons,) = [t for t in ax.texts if "OOM" in t.get_text() or "FAILED" in t.get_text()]
    assert reasons.get_text() == "OOM/FAILED" and reasons.xy[1] < 0
    renderer = chart.figure.canvas.get_renderer()
    marks = [line for line in ax.lines if line.get_gid() == charts.FAILED_MARK]
    legend = {h.get_label(): h for h in ax.lines if h.get_label().startswith(charts.FAILED_LABEL)}
    assert sorted(legend) == [f"{charts.FAILED_LABEL} failed", f"{charts.FAILED_LABEL} oom"]
    lines = {
        ln.get_color() for ln in ax.lines if ln.get_gid() != charts.FAILED_MARK and not ln.get_label().startswith("did")
    }
    assert all(h.get_color() == "black" and h.get_color() not in lines for h in legend.values())  # no line's colour
    assert not set(charts.MARKERS) & set(charts.REASON_MARKS.values())  # a line's marker never reads as a reason
    assert {legend[f"{charts.FAILED_LABEL} {s}"].get_marker() for s in ("oom", "failed")} == {"v", "X"}
    boxes = [m.get_window_extent(renderer) for m in marks]
    assert len(marks) == 3 and len({m.get_color() for m in marks}) == 3
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))  # side by side
    x16 = ax.transData.transform((16, 0))[0]
    centres = [(b.x0 + b.x1) / 2 for b in boxes]
    assert abs(np.mean(centres) - x16) < 1 and max(abs(c - x16) for c in centres) < 30  # on their x, not beside it
    colour_of = {label: color for label, color in ((ln.get_label(), ln.get_color()) for ln in ax.lines)}
    shape_of = {m.get_color(): m.get_marker() for m in marks}  # the shape says which line failed, and why
    assert shape_of[colour_of["seq_len=256"]] == "X"
    assert shape_of[colour_of["seq_len=64"]] == shape_of[colour_of["seq_len=128"]] == "v"
    zero = ax.transData.transform((16, 0))[1]
    assert all(b.y1 < zero for b in [*boxes, reasons.get_window_extent(renderer)])  # under 0, apart from data
    ticks = np.asarray(ax.get_yticks())
    assert ax.get_ylim()[0] < 0 and min(ticks[ticks >= ax.get_ylim()[0]]) == 0  # no tick value in the band


def test_scaling_says_when_its_grid_axis_is_log(engine: Any, tmp_path: Path) -> None:
    """batch 4, 8, 512 is drawn on a log2 axis (it was: 8 to 512 is six doublings wide, 4 to 8 one),
    but with a tick at each value only it read as a linear axis squashing 4 and 8: the label says so."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, batch in enumerate((4, 8, 512)):
        store.save_run(engine, run_row(sid, job, batch=batch, tokens_per_s=1000.0 * batch**0.5))
    ax_tokens, ax_mem = make_report(engine, [sid]).charts["scaling"].figure.axes
    assert ax_tokens.get_xscale() == ax_mem.get_xscale() == "log"
    assert [t.get_text() for t in ax_mem.get_xticklabels()] == ["4", "8", "512"]
    assert ax_mem.get_xlabel() == "batch (sequences per step, log scale)"
    two = new_sweep(engine, tmp_path / "two", name="two")
    for job, batch in enumerate((8, 16)):
        store.save_run(engine, run_row(two, job, batch=batch))
    ax_mem = make_report(engine, [two]).charts["scaling"].figure.axes[1]
    assert ax_mem.get_xscale() == "linear" and ax_mem.get_xlabel() == "batch (sequences per step)"


def eight_configs(engine: Any, tmp_path: Path, amp_gain: float = 1.03) -> int:
    """batch 8/16 x seq_len 128/256 x amp off/on, within 25% of each other in tokens/s and memory;
    with ``amp_gain`` 1 amp saves memory only, so each amp=on tokens/s line runs exactly on its amp=off one."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (batch, seq, amp) in enumerate(itertools.product((8, 16), (128, 256), (False, True))):
        tps = 15000 * (1.12 if batch == 16 else 1) * (0.92 if seq == 256 else 1) * (amp_gain if amp else 1)
        tps *= 1 + 0.004 * job * (amp_gain != 1)
        mem = 2**20 * (80 + batch * seq / 64 * (0.85 if amp else 1))
        row = run_row(sid, job, batch=batch, seq_len=seq, amp=amp, tokens_per_s=tps, peak_mem_bytes=int(mem))
        store.save_run(engine, row)
    return sid


def covers(box: Any, ax: Any) -> list[str]:
    """What of ``ax``'s data the window extent ``box`` lies over: its marks (scatter points and line
    markers, by their drawn radius) and its lines (sampled along each segment)."""
    px, hit = ax.figure.dpi / 72, []

    def near(xy: np.ndarray, r: np.ndarray) -> np.ndarray:
        dx = np.fmax(box.x0 - xy[:, 0], xy[:, 0] - box.x1).clip(0)
        return np.hypot(dx, np.fmax(box.y0 - xy[:, 1], xy[:, 1] - box.y1).clip(0)) < r

    for c in ax.collections:
        xy = c.get_offset_transform().transform(c.get_offsets())
        r = (np.sqrt(np.resize(c.get_sizes(), len(xy))) + np.resize(c.get_linewidths(), len(xy))) / 2 * px
        hit += [f"{c.get_label()} mark"] * int(near(xy, r).sum())
    for line in ax.get_lines():
        xy = line.get_transform().transform(np.c_[line.get_xdata(), line.get_ydata()].astype(float))
        if line.get_marker() not in ("None", "none", ""):
            hit += [f"{line.get_label()} marker"] * int(near(xy, (line.get_markersize() + 1) / 2 * px).sum())
        if line.get_drawstyle() == "steps-post":
            xy = np.c_[np.repeat(xy[:, 0], 2)[1:], np.repeat(xy[:, 1], 2)[:-1]]
        if line.get_linestyle() not in ("None", "none", "") and len(xy) > 1:
            t = np.linspace(0, 1, 200)[:, None, None]
            samples = (xy[:-1] + t * (xy[1:] - xy[:-1])).reshape(-1, 2)
            hit += [f"{line.get_label()} line"] * bool(near(samples, line.get_linewidth() / 2 * px).any())
    return hit


def test_scaling_values_stay_clear_of_each_other_and_the_lines(engine: Any, tmp_path: Path) -> None:
    """8 lines within 25% of each other: each value was written 7 pt above its point, so a line 3%
    below put its value over the next one's marks and line ("15.8k" over the 16.4k line's point).
    Once saved, no shown value covers another, a mark or a line, or lies nearer another line's point
    than its own, all lie inside their axes, and most are still shown (23 of 32: a value that could
    only go next to a neighbour's point is hidden, as it would be read as that point's)."""
    chart = make_report(engine, [eight_configs(engine, tmp_path)]).charts["scaling"]
    charts.save(chart.figure, tmp_path / "scaling.png")
    renderer, shown, written = chart.figure.canvas.get_renderer(), 0, 0
    for ax in chart.figure.axes:
        texts = [t for t in ax.texts if t.get_text().strip()]
        written += len(texts)
        boxes = [t.get_window_extent(renderer) for t in texts if t.get_visible()]
        shown, inside = shown + len(boxes), ax.get_window_extent(renderer)
        assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
        assert all(inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1 for b in boxes)
        assert not [covers(b, ax) for b in boxes if covers(b, ax)]
        assert strays(ax) == []
    assert written == 32 and shown >= 23, (written, shown)


def test_scaling_top_value_stays_under_the_panel_title(engine: Any, tmp_path: Path) -> None:
    """Values within 10% of each other: the margin over the top point was 15% of their spread, a
    few pixels, so its value ("16.8k") was written above the axes, over the panel's title."""
    sid = new_sweep(engine, tmp_path / "sw")
    tps = {(8, 128): 16000.0, (16, 128): 16800.0, (8, 256): 15400.0, (16, 256): 16100.0}
    for job, ((batch, seq), t) in enumerate(tps.items()):
        store.save_run(engine, run_row(sid, job, batch=batch, seq_len=seq, tokens_per_s=t))
    fig = make_report(engine, [sid]).charts["scaling"].figure
    charts.save(fig, tmp_path / "scaling.png")
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        title = [
            c.get_window_extent(renderer)
            for c in ax.get_children()
            if isinstance(c, Text) and c.get_text() == ax.get_title("left") != ""
        ]
        inside, boxes = (
            ax.get_window_extent(renderer),
            [t.get_window_extent(renderer) for t in ax.texts if t.get_visible()],
        )
        assert all(inside.y0 <= b.y0 and b.y1 <= inside.y1 and not any(b.overlaps(t) for t in title) for b in boxes)
    assert {"16.8k", "15.4k"} <= {t.get_text() for t in fig.axes[0].texts if t.get_visible()}


def test_scaling_lines_that_coincide_stay_apart(engine: Any, tmp_path: Path) -> None:
    """amp changes no tokens/s: each amp=on line runs exactly on its amp=off line, so each line has a
    marker and dashes of its own (colour alone left one looking like part of the other), the same in
    both rows, where the legend takes them from."""
    chart = make_report(engine, [eight_configs(engine, tmp_path, amp_gain=1.0)]).charts["scaling"]
    for ax in chart.figure.axes:
        drawn = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        assert len(drawn) == 4 and len({(line.get_marker(), line.get_linestyle()) for line in drawn}) == 4
        for a, b in itertools.combinations(drawn, 2):
            if list(a.get_ydata()) == list(b.get_ydata()):
                assert a.get_marker() != b.get_marker() and a.get_linestyle() != b.get_linestyle()
    styles = [{line.get_label(): line.get_marker() for line in ax.get_lines()} for ax in chart.figure.axes]
    assert styles[0] == styles[2] and styles[1] == styles[3]  # rows: tokens/s, memory; columns: batch, seq_len


def test_heatmap_cells_are_the_stored_tokens_per_s(engine: Any, tmp_path: Path) -> None:
    sid = failing_grid(engine, tmp_path)
    rep = make_report(engine, [sid])
    chart = rep.charts["heatmap"]
    with sqlite3.connect(tmp_path / "results.db") as conn:
        stored = dict(
            ((b, s), t) for b, s, t in conn.execute("SELECT batch, seq_len, tokens_per_s FROM runs WHERE workers = 0")
        )
    panels = {ax.get_title("left"): ax for ax in chart.figure.axes if ax.images}
    assert set(panels) == {"workers=0", "workers=2"}
    cells = np.ma.filled(panels["workers=0"].images[0].get_array(), np.nan)  # rows seq_len 64, 128; columns batch
    for (r, seq), (c, batch) in itertools.product(enumerate((64, 128)), enumerate((4, 8, 16))):
        expected = stored[batch, seq]
        assert (np.isnan(cells[r, c]) and expected is None) or cells[r, c] == pytest.approx(expected)
    assert "OOM" in {t.get_text() for t in panels["workers=0"].texts}
    assert "FAILED" in {t.get_text() for t in panels["workers=2"].texts}
    # one colour bar for both panels: its ends are the lowest and highest cells of either (the last
    # panel's alone, here none, left the darkest colour without a value)
    ticks = chart.figure.axes[-1].get_yticks()
    values = [t for t in stored.values() if t is not None]
    assert (ticks[0], ticks[-1]) == (pytest.approx(min(values)), pytest.approx(max(values)))


def test_pareto_points_and_front_are_the_stored_runs(engine: Any, tmp_path: Path) -> None:
    sid = failing_grid(engine, tmp_path)
    rep = make_report(engine, [sid])
    chart = rep.charts["pareto"]
    ax = chart.figure.axes[0]
    front = next(c for c in ax.collections if c.get_label().startswith("Pareto front"))
    ok = chart.frame[chart.frame["ok"]]
    # failing_grid's ok runs have tokens/s and memory both in proportion to batch x seq_len (256, 512
    # twice, 1024 twice tokens): the front is one point per size, (MiB, tokens/s), leanest first
    np.testing.assert_allclose(front.get_offsets(), [[4.0, 2560.0], [8.0, 5120.0], [16.0, 10240.0]])
    # every ok run is drawn once: the front plus the rest
    rest = next(c for c in ax.collections if c.get_label() == "config")
    assert len(front.get_offsets()) + len(rest.get_offsets()) == len(ok) == 5
    legend = [t.get_text() for t in chart.figure.legends[0].get_texts()]
    assert {"did not finish: 1 oom", "did not finish: 1 failed"} <= set(legend), legend


def test_pareto_marks_runs_that_did_not_finish_by_reason_side_by_side(engine: Any, tmp_path: Path) -> None:
    """Two runs out of memory at the same memory figure were one x (the other hidden under it), and
    no mark said why a run stopped; now they lie side by side, shaped by reason as in scaling.png,
    with a legend entry per reason (a run with no memory figure counted in its entry)."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, batch in enumerate((2, 4, 8)):  # a chart needs three that finished
        store.save_run(
            engine, run_row(sid, job, batch=batch, tokens_per_s=1000.0 * batch, peak_mem_bytes=2**20 * 10 * batch)
        )
    for job, (batch, status, mem) in enumerate(((16, "oom", 2**27), (32, "oom", 2**27), (64, "failed", None)), 3):
        store.save_run(engine, run_row(sid, job, batch=batch, status=status, tokens_per_s=None, peak_mem_bytes=mem))
    chart = make_report(engine, [sid]).charts["pareto"]
    charts.save(chart.figure, tmp_path / "pareto.png")
    ax = chart.figure.axes[0]
    marks = [line for line in ax.lines if line.get_gid() == charts.FAILED_MARK]
    assert [m.get_marker() for m in marks] == ["v", "v"]
    renderer = chart.figure.canvas.get_renderer()
    a, b = (m.get_window_extent(renderer) for m in marks)
    assert not a.overlaps(b)
    assert all(
        ax.get_window_extent(renderer).x0 < box.x0 and box.x1 < ax.get_window_extent(renderer).x1 for box in (a, b)
    )
    legend = {t.get_text() for t in chart.figure.legends[0].get_texts()}
    assert {"did not finish: 2 oom", "did not finish: 1 failed (not drawn: no memory figure)"} <= legend, legend


def test_pareto_names_never_cover_each_other(engine: Any, tmp_path: Path) -> None:
    """A crowded front (12 configs, 5 on the front, two of them 5 MiB and 3% apart): once saved, every
    front point and the baseline is named, no two names overlap, and each lies inside the axes."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (amp, ckpt, batch) in enumerate(itertools.product((False, True), (False, True), (4, 8, 16))):
        tps = 10000 * (1.5 if amp else 1) * (0.8 if ckpt else 1) * (1 + batch / 64) * (1 + 0.01 * (job % 3))
        mem = 2**20 * (50 + batch * (2 if ckpt else 6) * (0.7 if amp else 1))
        store.save_run(engine, run_row(sid, job, amp=amp, ckpt=ckpt, batch=batch, tokens_per_s=tps, peak_mem_bytes=mem))
    chart = make_report(engine, [sid]).charts["pareto"]
    charts.save(chart.figure, tmp_path / "pareto.png")
    ax = chart.figure.axes[0]
    renderer, inside = chart.figure.canvas.get_renderer(), ax.get_window_extent()
    names = [t for t in ax.texts if t.get_gid() == charts.POINT_LABEL]
    shown = [t for t in names if t.get_visible()]
    f = chart.frame[chart.frame["ok"]]
    assert len(shown) == len(names) == int((f["on_front"] | f["is_baseline"]).sum()) == 6
    boxes = [charts.text_box(t, renderer) for t in shown]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    assert all(inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1 for b in boxes)


def test_pareto_names_never_cover_a_point_or_the_front(engine: Any, tmp_path: Path) -> None:
    """8 configs in two tight rows, amp changing memory only: the leanest front point's name was put
    under it, across the baseline's ring next to it (marks were taken to reach 5 pt from their point,
    the ring reaches 7), and the baseline's name was crossed by the front's staircase."""
    chart = make_report(engine, [eight_configs(engine, tmp_path, amp_gain=1.0)]).charts["pareto"]
    charts.save(chart.figure, tmp_path / "pareto.png")
    ax, renderer = chart.figure.axes[0], chart.figure.canvas.get_renderer()
    names = [t for t in ax.texts if t.get_gid() == charts.POINT_LABEL]
    assert len(names) == 8 and all(t.get_visible() for t in names)
    boxes = [charts.text_box(t, renderer) for t in names]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    assert not {t.get_text(): covers(b, ax) for t, b in zip(names, boxes, strict=True) if covers(b, ax)}
    # the leanest front point sits beside the baseline's ring: its name, which can only be written
    # nearer the ring, has a leader line to its own point; none is nearer another point without one
    assert strays(ax) == [] and any(t.arrow_patch.get_visible() for t in names)


def strays(ax: Any) -> list[str]:
    """The shown point names and line values of ``ax`` that lie nearer another mark than the point
    they are written for (marks within a pixel of that point, drawn at the same place, do not count),
    with no leader line to their own point."""
    renderer, px = ax.figure.canvas.get_renderer(), ax.figure.dpi / 72
    marks = np.asarray(charts._marks(ax)[0])
    out = []
    for t in ax.texts:
        if t.get_gid() not in (charts.POINT_LABEL, charts.VALUE_LABEL) or not t.get_visible():
            continue
        if t.arrow_patch is not None and t.arrow_patch.get_visible():
            continue  # its leader line says whose it is
        box, own = charts.text_box(t, renderer), ax.transData.transform(t.xy)
        gap = (
            np.hypot(
                np.fmax(box.x0 - marks[:, 0], marks[:, 0] - box.x1).clip(0),
                np.fmax(box.y0 - marks[:, 1], marks[:, 1] - box.y1).clip(0),
            )
            - marks[:, 2]
        )
        at_own = np.hypot(*(marks[:, :2] - own).T) <= px
        if gap[at_own].min() >= gap[~at_own].min(initial=np.inf):
            out.append(t.get_text())
    return out


def test_a_point_name_is_written_nearer_its_own_point_than_any_other(engine: Any, tmp_path: Path) -> None:
    """A batch x seq_len grid as a CPU sweep measured it (tests/test_report.py's figures are those
    of a review's sweep): the baseline's name, kept off the front's staircase, went 18 pt up, and the
    next front point's name then went to its left, right over the baseline's ring, so the ring read
    "batch=2 seq_len=64". Once saved, every shown name is nearer its own point than any other."""
    sid = new_sweep(engine, tmp_path / "sw")
    figures = {  # (batch, seq_len): (tokens/s, peak MiB)
        (2, 32): (226.0, 9.7),
        (2, 64): (355.0, 15.9),
        (8, 32): (705.0, 28.5),
        (8, 64): (24176.0, 53.5),
        (32, 32): (11284.0, 103.7),
        (32, 64): (4552.0, 204.0),
    }
    for job, ((batch, seq), (tps, mib)) in enumerate(figures.items()):
        store.save_run(
            engine,
            run_row(sid, job, batch=batch, seq_len=seq, tokens_per_s=tps, peak_mem_bytes=mib * 2**20),
        )
    chart = make_report(engine, [sid]).charts["pareto"]
    charts.save(chart.figure, tmp_path / "pareto.png")
    ax = chart.figure.axes[0]
    named = {t.get_text() for t in ax.texts if t.get_gid() == charts.POINT_LABEL and t.get_visible()}
    assert {"batch=2 seq_len=32", "batch=8 seq_len=64"} <= named  # the baseline and the fastest
    assert strays(ax) == []


def test_side_by_side_panels_with_their_own_colours_get_a_legend_each(engine: Any, tmp_path: Path) -> None:
    """compare.png: A and B explain the left panel, faster/slower the right one; one legend under
    both mixed them. Panels that share their entries (the stage breakdown) keep one legend."""
    ref, new = new_sweep(engine, tmp_path / "ref", name="before"), new_sweep(engine, tmp_path / "new", name="after")
    noise = [100.0, 104.0, 96.0, 101.0, 99.0, 103.0, 97.0, 100.0, 102.0, 98.0]
    for sid, amp_times in ((ref, noise), (new, [t / 1.5 for t in noise])):
        store.save_run(engine, run_row(sid, 0, times=noise))
        store.save_run(engine, run_row(sid, 1, amp=True, times=amp_times))
    out = build_compare(engine, new, ref, out_dir=tmp_path / "cmp")
    assert (out / "compare.png").is_file()
    runs = prepare_runs(load_runs(engine, [new, ref]))
    a, b = (per_config(runs[runs["sweep_id"] == s]) for s in (new, ref))
    fig = charts.draw(COMPARE, compare_frame(a, b, runs, load_child(engine, "steps", runs["id"])), "A vs B")
    ax_tokens, ax_change = fig.axes[:2]
    assert not fig.legends
    left = [t.get_text() for t in ax_tokens.get_legend().get_texts()]
    right = [t.get_text() for t in ax_change.get_legend().get_texts()]
    assert left[:2] == ["A", "B"] and "faster" not in left
    assert {"faster", metrics.NO_DIFFERENCE} <= set(right) and "A" not in right and "95% interval" in right
    stages = {f"{k}_ms_{s}": [1.0] for k in ("cpu", "gpu") for s in STAGES}
    shared = charts.draw(BREAKDOWN, pd.DataFrame({"label": ["x"], "step_time_ms_median": [5.0], **stages}))
    assert len(shared.legends) == 1 and all(ax.get_legend() is None for ax in shared.axes)


def test_breakdown_and_loss_are_the_stored_stages_and_steps(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0))
    amp = run_row(sid, 1, amp=True, step_time_ms_median=80.0)
    for stage in amp["stages"]:  # each config its own stages and losses: a swap between them shows
        stage["cpu_time_ms"] = stage["device_time_ms"] = stage["cpu_time_ms"] / 2
    for step in amp["steps"]:
        step["loss"] -= 2.0
    store.save_run(engine, amp)
    rep = make_report(engine, [sid])
    breakdown = rep.charts["breakdown"]
    assert len(breakdown.figure.axes) == 1  # CPU runs: device time = CPU time, one panel
    assert "On CPU the device time equals the CPU time" in breakdown.caption
    ax = breakdown.figure.axes[0]
    # one stacked segment per stage and config, in step order: what was stored (1, 30, 60, 8, 1 ms; AMP's half)
    assert bar_values(ax) == pytest.approx([1.0, 0.5, 30.0, 15.0, 60.0, 30.0, 8.0, 4.0, 1.0, 0.5])
    assert [t.get_text().strip() for t in ax.texts if " of " in t.get_text()] == ["100 of 100 ms", "50 of 80 ms"]
    assert "profiler's own cost" not in breakdown.caption  # 100 and 50 ms profiled against 100 and 80 measured
    loss = line_data(rep.charts["loss"].figure.axes[0])
    assert loss == {"amp=off": ([1, 2, 3], [9.0, 8.9, 8.8]), "amp=on": ([1, 2, 3], pytest.approx([7.0, 6.9, 6.8]))}
    # a profiled step 2.5x the measured one (the profiler's cost on CPU): the caption says so
    store.save_run(engine, run_row(sid, 2, ckpt=True, step_time_ms_median=40.0))
    caption = make_report(engine, [sid]).charts["breakdown"].caption
    assert "The profiled steps took up to 2.5x the measured step: the profiler's own cost is in them" in caption


def test_cpu_memory_chart_draws_allocated_and_rss_growth(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    for job, amp in enumerate((False, True)):
        store.save_run(
            engine,
            run_row(
                sid,
                job,
                amp=amp,
                peak_mem_bytes=(100 - 40 * amp) * 2**20,
                peak_allocated_bytes=(100 - 40 * amp) * 2**20,
                rss_growth_bytes=(300 - 50 * amp) * 2**20,
            ),
        )
    rep = make_report(engine, [sid])
    fig = rep.charts["memory"].figure
    ax = fig.axes[0]
    assert bar_values(ax) == pytest.approx([100.0, 60.0, 300.0, 250.0])  # MiB: allocated, then RSS growth
    assert ax.get_xlabel() == "peak memory (MiB)"
    # the legend's four long entries fit the figure: three columns ran "...RSS growth during training:
    # 250 MiB" off its right edge and the first marker off its left (the README's quick start)
    charts.save(fig, tmp_path / "memory.png")
    (legend,) = fig.legends
    assert "baseline process RSS growth during training: 300 MiB" in [t.get_text() for t in legend.get_texts()]
    box, page = legend.get_window_extent(fig.canvas.get_renderer()), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1, (box, page)


def test_pareto_front(engine: Any, tmp_path: Path) -> None:
    tps = pd.Series([10.0, 20.0, 15.0, 30.0, 5.0])
    mem = pd.Series([1.0, 2.0, 3.0, 4.0, 0.5])
    assert frames.pareto_mask(tps, mem).tolist() == [True, True, False, True, True]


def test_big_sweep_bar_charts_show_top_n_plus_baseline(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (batch, seq) in enumerate(itertools.product(range(1, 11), (32, 64, 128, 256, 512))):
        store.save_run(engine, run_row(sid, job, batch=batch, seq_len=seq, tokens_per_s=float(batch * seq)))
    rep = make_report(engine, [sid], top=10)
    frame = rep.charts["throughput"].frame
    assert len(frame) == 11 and frame["is_baseline"].sum() == 1
    assert rep.shown_note.startswith("the 10 fastest of 50 configs by tokens/s and the baseline")
    best = frame[~frame["is_baseline"]]["throughput_per_s"]
    assert best.tolist() == sorted(best, reverse=True)
    assert best.min() == pytest.approx(sorted(b * s for b in range(1, 11) for s in (32, 64, 128, 256, 512))[-10])
    # fewer ok configs than the cap: the note says how many are drawn, and names the ones that did not
    # finish, which no bar shows ("top 30 of 36" stood over 26 bars)
    for job in range(50, 55):
        store.save_run(engine, run_row(sid, job, batch=64, seq_len=job, status="oom", tokens_per_s=None))
    rep = make_report(engine, [sid], top=52)
    assert len(rep.charts["throughput"].frame) == 50
    assert rep.shown_note.startswith("the 50 fastest of 55 configs by tokens/s; 5 that did not finish not shown")


def test_labels_name_only_differing_axes() -> None:
    df = pd.DataFrame({"id": [1, 2], **{a: [0, 0] for a in CONFIG_AXES}})
    df["amp"] = [True, False]
    df["batch"] = [8, 16]
    assert config_labels(df, label_axes(df)).tolist() == [
        "amp=on batch=8",
        "amp=off batch=16",
    ]


def test_a_large_float_setting_is_labelled_as_written() -> None:
    """lr=1e30 (a training sent to NaN on purpose) is a float that is an integer: not 31 digits."""
    df = pd.DataFrame({"id": [1, 2], **{a: [0, 0] for a in CONFIG_AXES}, "cfg.lr": [1e-3, 1e30]})
    assert config_labels(df, label_axes(df)).tolist() == ["lr=0.001", "lr=1e+30"]


@pytest.mark.parametrize("ids", [[1, 2, 3], [1, 2]], ids=["with-ties", "without-ties"])
def test_tied_labels_take_their_run_id_with_the_str_dtype(ids: list[int]) -> None:
    """Run ids break ties, and a label without a tie is left as it is, whatever pandas stores
    strings in: pandas 3.0 with pyarrow refused ``object + str`` even with no tie to break, and
    every summary and report crashed on the H100 image (2026-11-26)."""
    df = pd.DataFrame({"id": ids, **{a: [0] * len(ids) for a in CONFIG_AXES}})
    df["batch"] = [8, 8, 16] if len(ids) == 3 else [8, 16]
    want = ["batch=8 #1", "batch=8 #2", "batch=16"] if len(ids) == 3 else ["batch=8", "batch=16"]
    assert config_labels(df, label_axes(df)).tolist() == want


def test_one_config_label_names_the_techniques_that_are_on() -> None:
    """A single compiled AMP run (nothing differs) is not labelled like a plain eager one."""
    df = pd.DataFrame({"id": [1], **{a: [0] for a in CONFIG_AXES}}).assign(model_name="tiny", batch=8, seq_len=256)
    assert config_labels(df, label_axes(df)).tolist() == ["tiny batch=8 seq_len=256"]
    df = df.assign(amp=True, compile=True)
    assert config_labels(df, label_axes(df)).tolist() == ["tiny batch=8 seq_len=256 amp=on compile=on"]


def test_parse_baseline_spec() -> None:
    assert parse_config_spec("amp=false, ckpt=on,batch=8,model=tiny") == {
        "amp": False,
        "ckpt": True,
        "batch": 8,
        "model_name": "tiny",
    }
    with pytest.raises(ValueError, match="expected true or false"):
        parse_config_spec("amp=maybe")
    with pytest.raises(ValueError, match=r"unknown axis 'speed' \(axes: amp, ckpt, batch"):
        parse_config_spec("speed=11")
    with pytest.raises(ValueError, match=r"unknown axis 'bach' \(did you mean batch\? axes: "):  # as a sweep's typo
        parse_config_spec("bach=8")
    with pytest.raises(ValueError, match="batch is given twice"):  # the last value was kept without a word
        parse_config_spec("batch=4,batch=8")


def test_baseline_falls_back_to_first_ok_run(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0, amp=True, status="oom"))
    store.save_run(engine, run_row(sid, 1, amp=True, batch=4, tokens_per_s=500.0))
    store.save_run(engine, run_row(sid, 2, amp=True, batch=2, tokens_per_s=250.0))
    rep = make_report(engine, [sid])
    assert rep.configs.loc[rep.configs["is_baseline"], "label"].tolist() == ["batch=4"]
    assert "default: the fewest of amp, ckpt and compile on, none having all three off" in rep.baseline
    with pytest.raises(UserError, match="no ok run matches amp=False"):
        make_report(engine, [sid], baseline={"amp": False})


def test_without_a_config_all_off_the_baseline_has_the_fewest_techniques_on(engine: Any, tmp_path: Path) -> None:
    """experiments/compile.yaml holds amp on and sweeps compile=true,false: its first config, the
    compiled one, was the baseline, and eager read 0.63x slower, where compile is the technique
    measured. The config with the fewest techniques on is the baseline, in the stored speedups
    (the summary) and in the report alike; among equals, the first in grid order."""
    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0, amp=True, compile=True, tokens_per_s=800.0, grid_index=0))
    store.save_run(engine, run_row(sid, 1, amp=True, compile=False, tokens_per_s=500.0, grid_index=1))
    store.save_run(engine, run_row(sid, 2, amp=True, ckpt=True, compile=False, tokens_per_s=400.0, grid_index=2))
    summary.fill_speedups(engine, sid)
    rep = make_report(engine, [sid])
    base = rep.configs[rep.configs["is_baseline"]]
    assert base[["compile", "ckpt"]].values.tolist() == [[False, False]], rep.configs
    assert "the fewest of amp, ckpt and compile on" in rep.baseline
    with engine.connect() as conn:
        stored = dict(conn.exec_driver_sql("SELECT grid_index, speedup FROM runs ORDER BY grid_index").all())
    assert stored == {0: pytest.approx(1.6), 1: 1.0, 2: pytest.approx(0.8)}


def test_compile_time_and_payback_are_shown_beside_the_speed(engine: Any, tmp_path: Path) -> None:
    """experiments/compile.yaml says 'steady-state speed and compile latency reported apart', but
    compile_time_ms and compile_payback_steps were in SQL and runs.csv only. Now the summary and
    report.md show them for compiled configs: 13.3 s, repaid after 13,312 / (100 - 60) = 333 steps."""
    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0, amp=True, compile=True, step_time_ms_median=60.0, compile_time_ms=13312.0))
    store.save_run(engine, run_row(sid, 1, amp=True, compile=False, step_time_ms_median=100.0, compile_time_ms=4.0))
    summary.fill_compile_payback(engine, sid)
    text = summary.format_summary(summary.summary_frame(engine, sid))
    table, note = results_table(make_report(engine, [sid]).configs)
    assert "compile s (payback)" in text and "13.3 (333 steps)" in text, text
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("|")]
    header, body = rows[0], [r for r in rows[2:]]
    cells = {r[header.index("compile")]: r[header.index("compile s (payback)")] for r in body}
    assert cells == {"on": "13.3 (333 steps)", "off": "-"}  # an eager config's first-step excess is no compile
    assert "compile s: what the first compiled step took" in text and "compile s: what the first" in note


def test_single_config_skips_comparisons_and_says_why(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0))
    out = build_report(engine, [sid], out_dir=tmp_path / "out")
    md = (out / "report.md").read_text()
    assert "only one config" in md
    assert (out / "breakdown.png").is_file() and (out / "loss.png").is_file()
    assert not (out / "throughput.png").exists()


def test_default_out_dir(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    present = new_sweep(engine, tmp_path / "present")
    gone = new_sweep(engine, tmp_path / "gone", make_dir=False)
    for sid in (present, gone):
        store.save_run(engine, run_row(sid, 0))
        store.save_run(engine, run_row(sid, 1, amp=True))
    assert build_report(engine, [present]) == tmp_path / "present" / "report"
    assert build_report(engine, [gone]) == tmp_path / f"report_{gone}"


def test_filtered_report_keeps_the_full_one(engine: Any, tmp_path: Path) -> None:
    """A --where, --baseline or --top report without --out gets a folder of its own next to report/
    (which every sweep writes at its end), one per filter, and names its filter; so does compare.
    A --top report had replaced the full one with its top few."""
    sid, ref = new_sweep(engine, tmp_path / "sw"), new_sweep(engine, tmp_path / "ref")
    for s in (sid, ref):
        store.save_run(engine, run_row(s, 0))
        store.save_run(engine, run_row(s, 1, amp=True))
    full = build_report(engine, [sid])
    assert full == tmp_path / "sw" / "report"
    assert build_report(engine, [sid], top=TOP_BARS) == full  # the default is the full report
    # read after the last full report: it says when it was made (a minute's change failed this once)
    before = (full / "report.md").read_text()
    amp_only = build_report(engine, [sid], where="amp = true")
    fp32_base = build_report(engine, [sid], baseline={"amp": True})
    again = build_report(engine, [sid], where="amp = true")
    top_one = build_report(engine, [sid], top=1)
    assert len({full, amp_only, fp32_base, top_one}) == 4 and again == amp_only
    assert amp_only.parent == full.parent and amp_only.name.startswith("report_")
    assert (full / "report.md").read_text() == before
    assert "- Filter (`--where`): `amp = true`" in (amp_only / "report.md").read_text()
    plain, filtered = build_compare(engine, sid, ref), build_compare(engine, sid, ref, where="amp = true")
    assert plain == tmp_path / "sw" / f"compare_vs_{ref}" and filtered.parent == plain.parent and filtered != plain
    assert "Filter (`--where`): `amp = true`" in (filtered / "compare.md").read_text()
    assert "Filter" not in (plain / "compare.md").read_text()


def test_stale_charts_are_removed_when_skipped(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0))
    out = tmp_path / "out"
    out.mkdir()
    (out / "heatmap.png").write_bytes(b"old")
    build_report(engine, [sid], out_dir=out)
    assert not (out / "heatmap.png").exists()


# --------------------------------------------------------------------------------------------
# compare


def test_compare_gives_each_change_an_interval_and_a_verdict(engine: Any, tmp_path: Path) -> None:
    """Changes with 95% bootstrap intervals over steps, over repeats, or (no stored steps) by ranges."""
    ref = new_sweep(engine, tmp_path / "ref", name="before")
    new = new_sweep(engine, tmp_path / "new", name="after")
    noise = [100.0, 104.0, 96.0, 101.0, 99.0, 103.0, 97.0, 100.0, 102.0, 98.0]
    base, fast = noise, [t / 1.5 for t in noise]
    store.save_run(engine, run_row(ref, 0, times=base))  # amp off: the same steps, shifted by 1 ms
    store.save_run(engine, run_row(new, 0, times=[t + 1.0 for t in base[::-1]]))
    store.save_run(engine, run_row(ref, 1, amp=True, times=base))  # amp on: 1.5x faster steps
    store.save_run(engine, run_row(new, 1, amp=True, times=fast))
    for sid, tps in ((ref, (1000.0, 1010.0, 990.0)), (new, (1200.0, 1190.0, 1215.0))):  # batch=4: three repeats
        for k, t in enumerate(tps):
            store.save_run(engine, run_row(sid, 2 + k, batch=4, tokens_per_s=t, config_hash=f"{sid}-b4"))
    for sid, t in ((ref, 1000.0), (new, 1030.0)):  # seq_len=64: an imported row, no steps; ranges overlap
        row = run_row(sid, 5, seq_len=64, tokens_per_s=t, step_time_ms_p10=60.0, step_time_ms_p90=70.0)
        store.save_run(engine, {**row, "steps": []})
    store.save_run(engine, run_row(new, 6, ckpt=True))  # only in the new sweep
    store.save_run(engine, run_row(ref, 7, compile=True))
    store.save_run(engine, run_row(new, 7, compile=True, status="oom"))

    runs = prepare_runs(load_runs(engine, [new, ref]))
    a, b = (per_config(runs[runs["sweep_id"] == s]) for s in (new, ref))
    steps = load_child(engine, "steps", runs["id"])
    cmp = compare_frame(a, b, runs, steps).set_index("label")
    same, amp = (
        cmp.loc["amp=off ckpt=off batch=8 seq_len=128 compile=off"],
        cmp.loc["amp=on ckpt=off batch=8 seq_len=128 compile=off"],
    )
    assert same["verdict"] == metrics.NO_DIFFERENCE and same["change_basis"] == "steps"
    assert same["change_pct"] == pytest.approx(100 * (np.mean(base) / (np.mean(base) + 1.0) - 1))
    assert same["change_pct_ci_lo"] < 0 < same["change_pct_ci_hi"]
    assert amp["verdict"] == "faster" and amp["change_pct"] == pytest.approx(50.0)
    assert 0 < amp["change_pct_ci_lo"] < 50.0 < amp["change_pct_ci_hi"]
    repeats = cmp.loc["amp=off ckpt=off batch=4 seq_len=128 compile=off"]
    expected = metrics.ratio_interval([1200.0, 1190.0, 1215.0], [1000.0, 1010.0, 990.0])
    assert repeats["change_basis"] == "repeats" and repeats["verdict"] == "faster"
    got = repeats[["change_pct", "change_pct_ci_lo", "change_pct_ci_hi"]].to_numpy(dtype=float)
    np.testing.assert_allclose(got, [100 * (v - 1) for v in (expected.value, expected.lo, expected.hi)])
    imported = cmp.loc["amp=off ckpt=off batch=8 seq_len=64 compile=off"]
    assert imported["change_basis"] == "ranges" and imported["verdict"] == metrics.NO_DIFFERENCE
    assert imported["change_pct"] == pytest.approx(3.0) and np.isnan(imported["change_pct_ci_lo"])
    assert cmp.loc["amp=off ckpt=on batch=8 seq_len=128 compile=off", "verdict"] == "only in A"
    assert cmp.loc["amp=off ckpt=off batch=8 seq_len=128 compile=on", "verdict"] == "oom in A"

    fig = charts.draw(COMPARE, cmp.reset_index(), "A vs B")
    ax_tokens, ax_change = fig.axes[:2]
    expected = cmp.reset_index()
    drawn = bar_values(ax_tokens)  # A's bars, then B's: tokens/s, 0 where none
    np.testing.assert_allclose(drawn, np.nan_to_num([*expected["throughput_per_s_a"], *expected["throughput_per_s_b"]]))
    np.testing.assert_allclose(bar_values(ax_change), np.nan_to_num(expected["change_pct"]))
    assert "oom in A" in {t.get_text().strip() for t in ax_change.texts}

    out = build_compare(engine, new, ref, out_dir=tmp_path / "cmp")
    md = (out / "compare.md").read_text()
    assert (out / "compare.png").is_file() and "![compare](compare.png)" in md
    row = next(line for line in md.splitlines() if line.startswith("| amp=on ckpt=off batch=8 seq_len=128"))
    assert f"+50.0% ({amp['change_pct_ci_lo']:+.1f} to {amp['change_pct_ci_hi']:+.1f}) | faster |" in row
    assert "sweep " in md and "(after) vs sweep" in md


def test_compare_lists_only_the_environment_differences(engine: Any, tmp_path: Path) -> None:
    a, b = new_sweep(engine, tmp_path / "a"), new_sweep(engine, tmp_path / "b")
    store.save_run(engine, run_row(a, 0, torch_version="2.12.0", cudnn_version="91002"))
    store.save_run(engine, run_row(b, 0, torch_version="2.13.0", cudnn_version="91002"))
    md = (build_compare(engine, a, b, out_dir=tmp_path / "cmp") / "compare.md").read_text()
    env = md.split("## Environment")[1]
    assert "| torch_version | 2.12.0 | 2.13.0 |" in env
    assert "| hostname" not in env and "| cudnn_version" not in env  # the same in both: named, not tabled
    assert "Same in both:" in env and "hostname" in env and "cudnn_version" in env


def test_cli_compare_by_name(engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = new_sweep(engine, tmp_path / "a", name="before")
    b = new_sweep(engine, tmp_path / "b", name="after")
    for sid in (a, b):
        store.save_run(engine, run_row(sid, 0))
        store.save_run(engine, run_row(sid, 1, amp=True))
    db = tmp_path / "results.db"
    assert main(["--db", str(db), "--sweep", "after", "--vs", "before"]) == 0
    assert capsys.readouterr().out.strip() == f"Compare: {tmp_path / 'b' / f'compare_vs_{a}' / 'compare.md'}"


# --------------------------------------------------------------------------------------------
# CLI errors: one line, naming the option and the value


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--db", "{tmp}/missing.db"], "--db {tmp}/missing.db: database file not found"),
        (["--db", "{tmp}"], "--db {tmp}: is a folder, not a database file"),  # was "database file not found"
        (["--db", "/dev/null"], "--db /dev/null: is not a regular file"),
        (["--sweep", "99"], "--sweep 99: no sweep with id 99"),
        (["--sweep", "nosuchname"], "--sweep nosuchname: no sweep with that id or name"),
        (
            ["--where", "no_such_column > 1"],
            "--where 'no_such_column > 1': unknown column 'no_such_column'",
        ),
        (["--where", "batch > 1000"], "--where 'batch > 1000': no runs of sweep 1 match"),
        (
            ["--baseline", "amp=perhaps"],
            "--baseline amp=perhaps: amp='perhaps': expected true or false",
        ),
        (["--baseline", "batch=3"], "--baseline batch=3: no ok run matches batch=3"),
        (["--vs", "1"], "--vs 1: is the same sweep as the latest sweep with runs, compared when --sweep is not given"),
        (["--sweep", "1", "--vs", "1"], "--vs 1: is the same sweep as --sweep (1); give --sweep ID"),
        (["--vs", "1", "--top", "3"], "--top does not apply with --vs (each config is compared with its own twin)"),
        (["--vs", "1", "--baseline", "amp=false"], "--baseline does not apply with --vs"),
        (["--where", " "], "--where is empty: give a filter or leave the option out"),
        (["--baseline", ""], "--baseline is empty"),
        (["--out", "{tmp}/afile.txt"], "--out {tmp}/afile.txt: is a file; give a folder"),
        (
            ["--out", "{tmp}/afile.txt/sub"],
            "--out {tmp}/afile.txt/sub: cannot write {tmp}/afile.txt/sub (Not a directory)",
        ),
    ],
)
def test_cli_errors(engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    assert sid == 1
    store.save_run(engine, run_row(sid, 0))
    store.save_run(engine, run_row(sid, 1, amp=True))
    (tmp_path / "afile.txt").write_text("notes")
    argv = [a.format(tmp=tmp_path) for a in args]
    if "--db" not in argv:
        argv = ["--db", str(tmp_path / "results.db"), *argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("perfsweep report: " + message.format(tmp=tmp_path)), err
    assert "\n" not in err


def test_a_sweep_folder_it_cannot_write_is_named_with_the_option_that_avoids_it(
    engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Without --out the report goes into the sweep's folder; where that cannot be written (another
    user's sweep) the line named the report's scratch file and said nothing of --out."""
    from tests.util import read_only

    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0))
    (tmp_path / "sw" / "report").mkdir()
    with read_only(tmp_path / "sw" / "report"):
        assert main(["--db", str(tmp_path / "results.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"perfsweep report: cannot write the report folder {tmp_path / 'sw' / 'report'} ("), err
    assert err.endswith("); give another with --out DIR") and "\n" not in err, err


def test_without_sweep_the_latest_sweep_with_runs_is_reported(
    engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A sweep stopped before its first job holds no runs: ``perfsweep report`` with no --sweep
    answered "--sweep 2: the sweep has no runs", an option the user never gave. It reports the
    latest sweep with runs and says so; with none, one line says that none has runs."""
    empty = new_sweep(engine, tmp_path / "first")
    db = ["--db", str(tmp_path / "results.db"), "--out", str(tmp_path / "out")]
    assert main(db) == 2
    assert capsys.readouterr().err.strip() == "perfsweep report: --sweep: none of the database's 1 sweep has runs yet"
    ok = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(ok, 0))
    later = new_sweep(engine, tmp_path / "stopped")  # stopped before any job
    assert empty < ok < later
    assert main(db) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"Report: {tmp_path / 'out' / 'report.md'}"
    assert err.strip() == (
        f"perfsweep report: sweep {ok}, the latest with runs (sweep {later} has none); --sweep ID picks another"
    )
    assert f"sweep {ok}" in (tmp_path / "out" / "report.md").read_text()
    assert main([*db, "--vs", str(ok)]) == 2  # compared with itself: --sweep was not given, so say what was
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"--vs {ok}: is the same sweep as the latest sweep with runs, compared when --sweep is not given ({ok}); "
            "give --sweep ID"
        )
    )


def test_compare_names_the_noisy_side(engine: Any, tmp_path: Path) -> None:
    """report.md flags noisy configs; compare.md said faster/slower for them with no caveat."""
    a, b = new_sweep(engine, tmp_path / "a"), new_sweep(engine, tmp_path / "b")
    store.save_run(engine, run_row(a, 0, [100.0, 150.0, 300.0]))  # IQR far over 10% of the median
    store.save_run(engine, run_row(b, 0, [200.0, 201.0, 202.0]))
    md = (build_compare(engine, a, b, out_dir=tmp_path / "cmp") / "compare.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| tiny batch=8 seq_len=128"))
    assert row.rstrip(" |").endswith("| A"), row
    assert f"**noisy**: that side's step times broke the rule stored with its runs ({NOISY_RULE})" in md
    # a side judged before schema 0012 is named by the rule that judged it, not today's
    old = new_sweep(engine, tmp_path / "old")
    store.save_run(engine, run_row(old, 0, [100.0, 150.0, 300.0], noisy_rule="step-time IQR > 10% of the median"))
    md = (build_compare(engine, old, b, out_dir=tmp_path / "cmp-old") / "compare.md").read_text()
    assert "broke the rule stored with its runs (step-time IQR > 10% of the median), or its repeats'" in md
    c = new_sweep(engine, tmp_path / "c")
    store.save_run(engine, run_row(c, 0, [100.0, 101.0, 102.0]))
    quiet = (build_compare(engine, c, b, out_dir=tmp_path / "quiet") / "compare.md").read_text()
    assert "**noisy**" not in quiet


def test_compare_of_sweeps_with_no_config_in_common_is_refused(engine: Any, tmp_path: Path, capsys) -> None:
    """seq_len 64 against seq_len 32: every config is 'only in A' or 'only in B', so there is
    nothing to compare; said in one line instead of an empty comparison and exit 0."""
    a, b = new_sweep(engine, tmp_path / "a"), new_sweep(engine, tmp_path / "b")
    store.save_run(engine, run_row(a, 0, seq_len=64))
    store.save_run(engine, run_row(b, 0, seq_len=32))
    assert main(["--db", str(tmp_path / "results.db"), "--sweep", str(a), "--vs", str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"perfsweep report: sweeps {a} and {b} have no config in common") and "\n" not in err
    assert not (tmp_path / "a" / f"compare_vs_{b}").exists()


def test_sweep_where_nothing_finished_still_gets_a_report(engine: Any, tmp_path: Path) -> None:
    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0, status="oom", peak_mem_bytes=None, batch=256))
    store.save_run(engine, run_row(sid, 1, amp=True, status="timeout", peak_mem_bytes=None, batch=512))
    out = build_report(engine, [sid], out_dir=tmp_path / "out")
    assert not list(out.glob("*.png"))  # scaling.png too: x marks on axes whose ticks read as figures
    md = (out / "report.md").read_text()
    assert "- `scaling.png` (Scaling with batch / seq_len): no run finished ok." in md
    assert "- `throughput.png` (Throughput): no run finished ok." in md
    assert "| off | 256 | oom |" in md and "| on | 512 | timeout |" in md


def test_numerics_table_names_a_twin_by_its_config_whichever_repeat_it_is(engine: Any, tmp_path: Path) -> None:
    """amp=off ran twice; the audit paired amp=on with the repeat the report does not draw. The
    twin is still named by its config, as every other cell of the table is, not as "run 2"."""
    from perfsweep.report.build import numerics_md

    sid = new_sweep(engine, tmp_path / "sw")
    off = [store.save_run(engine, run_row(sid, j, [100.0] * 3, config_hash="off", repeat_index=j)) for j in (0, 1)]
    store.save_run(
        engine,
        run_row(
            sid,
            2,
            [50.0] * 3,
            amp=True,
            config_hash="on",
            numerics_twin_run_id=off[1],
            numerics_warning=False,
            loss_max_rel_diff=0.004,
        ),
    )
    rep = make_report(engine, [sid])
    assert rep.configs.loc[rep.configs["label"] == "amp=off", "id"].item() == off[0]  # the drawn repeat
    (row,) = [line for line in numerics_md(rep.configs).splitlines() if line.startswith("| amp=on")]
    assert [c.strip() for c in row.strip("|").split("|")][:3] == ["amp=on", "amp=off", "0.40%"], row


def test_a_samples_model_beside_token_models_is_named_not_dropped(engine: Any, tmp_path: Path) -> None:
    """A sweep of a token model and a samples model (model.unit=samples) has no common unit: the
    headline says which configs are not ranked and how to report them on their own."""
    from perfsweep.report.build import headline_md

    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0, [100.0] * 3, model_name="tiny", config_hash="lm"))
    store.save_run(
        engine,
        run_row(sid, 1, [50.0] * 3, model_name="cnn", config_hash="cnn", tokens_per_s=None, samples_per_s=160.0),
    )
    rep = make_report(engine, [sid])
    (line,) = [ln for ln in headline_md(rep) if ln.startswith("- **Not ranked:**")]
    assert (
        "model=cnn count samples, not tokens" in line
        and '--where "tokens_per_s IS NULL AND samples_per_s IS NOT NULL"' in line
    )
    apart = make_report(engine, [sid], where="tokens_per_s IS NULL AND samples_per_s IS NOT NULL")
    assert apart.configs["throughput_per_s"].tolist() == [160.0]  # on its own it is ranked by samples/s
    assert not [ln for ln in headline_md(apart) if ln.startswith("- **Not ranked:**")]


def test_a_repeat_that_blew_up_is_flagged_whichever_run_stands_for_its_config(engine: Any, tmp_path: Path) -> None:
    """amp=on ran three times and one repeat's loss went NaN (the audit flagged it). The config is
    drawn from the run nearest its median, a clean one; the summary, the headline and the numerics
    table still say that one of its three runs was flagged, not ok."""
    from perfsweep.report.build import headline_md, numerics_md

    sid = new_sweep(engine, tmp_path / "sw")
    store.save_run(engine, run_row(sid, 0, [100.0] * 3, config_hash="off"))
    blown = dict(numerics_warning=True, nonfinite_loss_steps=3, final_loss=None)
    for i, (times, flags) in enumerate((([100.0] * 3, {}), ([90.0] * 3, blown), ([110.0] * 3, {}))):
        clean = dict(numerics_warning=False, nonfinite_loss_steps=0, numerics_twin_run_id=1, loss_max_rel_diff=0.001)
        row = run_row(sid, 1 + i, times, amp=True, config_hash="on", repeat_index=i, **{**clean, **flags})
        store.save_run(engine, row)
    rep = make_report(engine, [sid])
    on = rep.configs[rep.configs["label"] == "amp=on"]
    assert on["numerics_warning"].item() == 0  # the run drawn for the config is a clean repeat
    flagged = [ln for ln in headline_md(rep) if ln.startswith("- **Numerics warning:**")]
    assert [ln.split(": the loss")[0] for ln in flagged] == ["- **Numerics warning:** amp=on"]
    rows = [ln for ln in numerics_md(rep.configs).splitlines() if ln.startswith("| amp=on")]
    assert [r.rsplit("|", 2)[1].strip() for r in rows] == ["**numerics warning** in 1 of 3 runs"]
    text = summary.format_summary(summary.summary_frame(engine, sid))
    assert "1 of 3 runs flagged" in text and "numerics:" in text, text


def test_the_headline_says_when_the_fastest_config_or_the_baseline_blew_up(engine: Any, tmp_path: Path) -> None:
    """With lr=1e30 every loss is NaN, and on a CPU NaN arithmetic can run at another speed than
    a working training: the fastest config and the baseline it is measured against say so where
    they are named, not only in a later line."""
    from perfsweep.report.build import headline_md

    sid = new_sweep(engine, tmp_path / "sw")
    blown = dict(numerics_warning=True, nonfinite_loss_steps=3, final_loss=None)
    store.save_run(engine, run_row(sid, 0, [500.0] * 3, config_hash="off", **blown))
    store.save_run(engine, run_row(sid, 1, [10.0] * 3, amp=True, config_hash="on", **blown))
    lines = headline_md(make_report(engine, [sid]))
    fastest = next(ln for ln in lines if ln.startswith("- **Fastest:** amp=on"))
    baseline = next(ln for ln in lines if ln.startswith("- **Baseline:** amp=off"))
    assert fastest.endswith("vs the baseline (numerics warning: see Numerics below)."), fastest
    assert baseline.endswith("(numerics warning: see Numerics below)."), baseline


def test_compare_says_which_side_blew_up(engine: Any, tmp_path: Path) -> None:
    """Sweep A's amp=on trained into NaN losses (flagged by the audit); B's did not. compare.md does
    not hand the blown-up side its verdict unqualified: a numerics column names A, and says why."""
    ref, new = (new_sweep(engine, tmp_path / n, n) for n in ("ref", "new"))
    for sid in (ref, new):
        store.save_run(engine, run_row(sid, 0, [100.0] * 3, config_hash=f"{sid}-off"))
    store.save_run(engine, run_row(ref, 1, [100.0] * 3, amp=True, numerics_warning=False, nonfinite_loss_steps=0))
    blown = dict(numerics_warning=True, nonfinite_loss_steps=3, final_loss=None)
    store.save_run(engine, run_row(new, 1, [50.0] * 3, amp=True, **blown))
    md = (build_compare(engine, new, ref, tmp_path / "cmp") / "compare.md").read_text()
    header = next(ln for ln in md.splitlines() if ln.startswith("| config |"))
    assert header.endswith("| noisy | numerics |"), header
    amp = next(ln for ln in md.splitlines() if ln.startswith("| amp=on"))
    assert amp.endswith("| A |"), amp
    assert "**numerics**: a run of that side had a loss that was NaN or infinite" in md


def test_long_config_names_are_wrapped_between_their_settings(engine: Any, tmp_path: Path) -> None:
    """Configs that differ in seven settings (a report over several sweeps): each name ran about 100
    characters on one line and the bars beside it were slivers. Names wrap between settings, and
    the figure grows with their lines."""
    sid = new_sweep(engine, tmp_path / "sw")
    settings = [
        {"amp": a, "ckpt": c, "batch": b, "seq_len": 1024 * b // 2, "compile": a, "amp_dtype": d, "model_name": m}
        for a, c, b, d, m in [
            (True, True, 2, "fp16", "minigpt_seed"),
            (False, False, 16, "bf16", "gpt2_small_with_a_long_name"),
            (True, False, 4, "bf16", "gpt2_small_with_a_long_name"),
        ]
    ]
    for job, kw in enumerate(settings):
        store.save_run(engine, run_row(sid, job, tokens_per_s=1000.0 * (job + 1), **kw))
    chart = make_report(engine, [sid]).charts["throughput"]
    ax = chart.figure.axes[0]
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert len(names) == 3 and all(len(line) <= charts.LABEL_WIDTH for n in names for line in n.splitlines())
    assert [n.replace("\n", " ") for n in names] == list(chart.frame["label"])  # every setting kept, in order
    assert max(n.count("\n") for n in names) >= 1 and chart.figure.get_figheight() > 4.5


def test_chart_titles_say_what_every_config_shares(engine: Any, tmp_path: Path) -> None:
    """A chart pasted into a slide said "Throughput" and no more; now its title names the model,
    the device and batch x seq_len, where every config shares them (an axis that varies is not named)."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, amp in enumerate((False, True)):
        store.save_run(engine, run_row(sid, job, amp=amp, tokens_per_s=1000.0 * (job + 1)))
    rep = make_report(engine, [sid])
    title = rep.charts["throughput"].figure.get_suptitle().replace("\u00a0", " ")  # parts are never wrapped
    assert title == "Throughput (tiny, on Test CPU, batch 8 x 128)"
    store.save_run(engine, run_row(sid, 2, amp=True, batch=16, tokens_per_s=3000.0))
    title = make_report(engine, [sid]).charts["throughput"].figure.get_suptitle()
    assert title.replace("\u00a0", " ") == "Throughput (tiny, on Test CPU)"


def test_the_throughput_legend_names_only_colours_drawn(engine: Any, tmp_path: Path) -> None:
    """A baseline, a slower config and one that failed: the failed config's bar of no length was
    drawn in the "faster" colour, so the legend listed "faster" for a chart with no faster bar."""
    sid = new_sweep(engine, tmp_path / "sw")
    base = [100.0, 101.0, 99.0, 100.0, 102.0, 98.0]
    store.save_run(engine, run_row(sid, 0, base))
    store.save_run(engine, run_row(sid, 1, [t * 2 for t in base], ckpt=True))
    store.save_run(engine, run_row(sid, 2, amp=True, status="failed", tokens_per_s=None))
    summary.fill_speedups(engine, sid)
    chart = make_report(engine, [sid]).charts["throughput"]
    legend = [t.get_text() for t in chart.figure.legends[0].get_texts()]
    assert "measurably slower than the baseline" in legend and "baseline config" in legend
    assert not [t for t in legend if "faster" in t], legend
    ax = chart.figure.axes[0]
    assert [to_hex(p.get_facecolor(), keep_alpha=True)[-2:] for p in ax.patches][-1] == "00"  # the failed row's: none


def test_no_colour_names_two_lines_in_one_legend(engine: Any, tmp_path: Path) -> None:
    """Two scaling panels of 10 lines each share one legend: with the 10 colours of one palette, blue,
    orange and green each named two configs."""
    sid = new_sweep(engine, tmp_path / "sw")
    for job, (batch, seq, workers) in enumerate(itertools.product((4, 8), (64, 128), range(6))):
        tps = float(batch * seq * (10 + workers))
        store.save_run(engine, run_row(sid, job, batch=batch, seq_len=seq, workers=workers, tokens_per_s=tps))
    fig = make_report(engine, [sid]).charts["scaling"].figure
    colours: dict[str, set[str]] = {}
    for ax in fig.axes:
        for line in ax.lines:
            if not line.get_label().startswith(("_", "did not")):
                colours.setdefault(to_hex(line.get_color()), set()).add(line.get_label())
    assert len(colours) > 10 and all(len(names) == 1 for names in colours.values()), colours
