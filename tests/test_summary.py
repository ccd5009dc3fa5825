"""The end-of-sweep figures and table (perfsweep.summary) on a real SQLite database."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfsweep import metrics, store, summary
from tests.util import run_row


def _sweep(tmp_path: Path, runs: list[dict]) -> tuple[object, int]:
    engine = store.connect(f"sqlite:///{tmp_path / 'results.db'}")
    sid = store.get_or_create_sweep(engine, str(tmp_path), "s")
    quiet = {"step_time_ms_median": 100.0, "step_time_ms_iqr": 2.0, "step_time_cv": 0.01, "noisy": False}
    for i, r in enumerate(runs):
        store.save_run(engine, run_row(sid, job_num=i, run_uid=f"u{i}", **{**quiet, **r}))
    return engine, sid


def test_repeats_combine_with_the_speedup_of_their_ok_runs(tmp_path: Path):
    """A config whose first run failed still shows its speedup; the baseline is chosen in grid
    order, not run order; a config whose repeats disagree is flagged noisy."""
    a = {"amp": False, "config_hash": "A", "grid_index": 0}
    b = {"amp": True, "config_hash": "B", "grid_index": 1}
    c = {"amp": False, "batch": 8, "config_hash": "C", "grid_index": 2}
    engine, sid = _sweep(
        tmp_path,
        [
            {**c, "tokens_per_s": 1000.0, "repeat_index": 0},  # C runs first (shuffled), but A is the baseline
            {**b, "status": "failed", "tokens_per_s": None, "error": "boom", "repeat_index": 0},
            {**a, "tokens_per_s": 1000.0, "repeat_index": 0},
            {**b, "tokens_per_s": 2000.0, "repeat_index": 1},
            {**a, "tokens_per_s": 1010.0, "repeat_index": 1},
            {**b, "tokens_per_s": 2100.0, "repeat_index": 2},
            {**c, "tokens_per_s": 2000.0, "repeat_index": 1},
            {**a, "tokens_per_s": 990.0, "repeat_index": 2},
        ],
    )
    summary.fill_speedups(engine, sid)
    df = summary.summary_frame(engine, sid)
    assert set(df.loc[df["config_hash"] == "A", "speedup_verdict"]) == {"baseline"}
    expected = metrics.ratio_interval([2000.0, 2100.0], [1000.0, 1010.0, 990.0])
    got = df[(df["config_hash"] == "B") & (df["status"] == "ok")].iloc[0]
    assert (got["speedup"], got["speedup_ci_lo"], got["speedup_ci_hi"]) == pytest.approx(
        (expected.value, expected.lo, expected.hi)
    )
    text = summary.format_summary(df)
    rows = {line.split()[0]: line for line in text.splitlines()[1:] if line.split() and line.split()[0].isdigit()}
    assert f"{expected.value:.2f}x ({expected.lo:.2f}-{expected.hi:.2f}) faster" in rows["2"]  # B: first run failed
    assert "2 ok, 1 failed" in rows["2"] and "baseline" in rows["3"]
    assert "!" in rows["1"] and "!" not in rows["3"]  # C's repeats: 1000 vs 2000 tokens/s
    engine.dispose()


def test_repeats_that_disagree_are_noisy_even_when_one_failed(tmp_path: Path):
    """A failed repeat has no tokens/s: it must not hide the spread of the ok ones."""
    d = {"config_hash": "D", "grid_index": 0}
    engine, sid = _sweep(
        tmp_path,
        [
            {**d, "tokens_per_s": 1000.0},
            {**d, "tokens_per_s": 1600.0},
            {**d, "status": "failed", "tokens_per_s": None, "error": "boom"},
        ],
    )
    df = summary.summary_frame(engine, sid)
    text = summary.format_summary(df)
    assert "!" in text.splitlines()[1] and "2 ok, 1 failed" in text.splitlines()[1]
    engine.dispose()


def test_cpu_utilisation_only_for_runs_with_the_measured_thread_count(tmp_path: Path):
    engine, sid = _sweep(
        tmp_path,
        [
            {"device_type": "cpu", "torch_threads": 2, "model_tflops_per_s": 0.05, "mfu_compute_dtype": "fp32"},
            {"device_type": "cpu", "torch_threads": 1, "model_tflops_per_s": 0.05, "mfu_compute_dtype": "fp32"},
            {"device_type": "cpu", "torch_threads": 2, "model_tflops_per_s": 0.004, "mfu_compute_dtype": "bf16"},
        ],
    )
    with store.session(engine) as s:
        sweep = s.get(store.Sweep, sid)
        sweep.cpu_matmul_fp32_flops, sweep.cpu_matmul_bf16_flops, sweep.cpu_matmul_threads = 100e9, 10e9, 2
    summary.fill_cpu_utilisation(engine, sid)
    with store.session(engine) as s:
        got = [r.cpu_flops_utilisation for r in s.query(store.Run).order_by(store.Run.job_num)]
    assert got[0] == pytest.approx(0.05e12 / 100e9) and got[2] == pytest.approx(0.004e12 / 10e9)  # fp32, bf16
    assert got[1] is None  # measured with 2 threads: a 1-thread run gets no figure, not a wrong one
    engine.dispose()


def test_cpu_utilisation_takes_the_best_of_the_sweeps_peak_and_its_runs_own(tmp_path: Path):
    """One denominator per compute dtype and thread count: the best of the sweep's matmul rate and
    those its jobs measured (runs.cpu_matmul_flops), so runs measured at different loads are still
    ranked by their model FLOP/s. A job's own stands where the sweep's was measured under load, and
    where the sweep's thread count differs."""
    own = {"device_type": "cpu", "model_tflops_per_s": 0.05, "mfu_compute_dtype": "fp32"}
    engine, sid = _sweep(
        tmp_path,
        [
            {**own, "torch_threads": 2, "cpu_matmul_flops": 200e9},  # the sweep's 100e9 was measured under load
            {**own, "torch_threads": 2, "cpu_matmul_flops": 50e9},  # this job's own was: the 200e9 stands for it too
            {**own, "torch_threads": 1, "cpu_matmul_flops": 80e9},  # not the sweep's thread count: runs' own only
            {**own, "torch_threads": 1, "mfu_compute_dtype": "bf16", "cpu_matmul_flops": 20e9},  # its dtype's own
            {**own, "torch_threads": 2, "nproc": 2, "cpu_matmul_flops": 80e9},  # all ranks' FLOP/s: no figure
        ],
    )
    with store.session(engine) as s:
        sweep = s.get(store.Sweep, sid)
        sweep.cpu_matmul_fp32_flops, sweep.cpu_matmul_threads = 100e9, 2
    summary.fill_cpu_utilisation(engine, sid)
    with store.session(engine) as s:
        got = [r.cpu_flops_utilisation for r in s.query(store.Run).order_by(store.Run.job_num)]
    assert got[:3] == pytest.approx([0.05e12 / 200e9, 0.05e12 / 200e9, 0.05e12 / 80e9])
    assert got[3] == pytest.approx(0.05e12 / 20e9) and got[4] is None
    engine.dispose()


def test_ctrl_c_while_the_report_is_drawn_says_how_to_build_it(tmp_path: Path, monkeypatch, capsys):
    """The runs are stored and the sweep is done: the message names the report command, not resume."""
    from perfsweep.report import build

    engine, sid = _sweep(tmp_path, [{"tokens_per_s": 1000.0}])

    def ctrl_c(*_args, **_kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "build_report", ctrl_c)  # Ctrl-C arrives while matplotlib draws
    summary.close_sweep(str(engine.url), str(tmp_path), "done")
    with pytest.raises(KeyboardInterrupt) as stopped:
        summary.show_sweep(str(engine.url), str(tmp_path))
    db = tmp_path / "results.db"
    hint = f"the runs are stored; the report was not built; build it with: perfsweep report --sweep {sid} --db {db}"
    assert stopped.value.perfsweep_hint == hint
    assert f"Sweep {sid} (1 run, 1 ok)" in capsys.readouterr().out
    with store.session(engine) as s:
        assert s.get(store.Sweep, sid).status == "done"


def test_a_sweep_stopped_before_any_job_prints_its_count_only(tmp_path: Path, capsys):
    """Ctrl-C as the jobs launched: the summary printed pandas' "Empty DataFrame" block and then a
    report that failed with a traceback ("the sweep has no runs"). Now it says how many did not start."""
    engine, sid = _sweep(tmp_path, [])
    with store.session(engine) as s:
        s.get(store.Sweep, sid).n_jobs = 4
    summary.show_sweep(str(engine.url), str(tmp_path))
    out, err = capsys.readouterr()
    assert out.strip() == f"Sweep {sid} (0 runs, 0 ok; 4 of 4 jobs not started)" and err == ""
    assert not (tmp_path / "report").exists()
    engine.dispose()


def test_a_report_that_fails_is_one_line_naming_the_command_to_retry(tmp_path: Path, monkeypatch, capsys):
    from perfsweep.report import build

    engine, sid = _sweep(tmp_path, [{"tokens_per_s": 1000.0}])

    def broken(*_args, **_kw):
        raise RuntimeError("no such table: steps\n[SQL: SELECT run_id, step FROM steps ...]")

    monkeypatch.setattr(build, "build_report", broken)
    summary.show_sweep(str(engine.url), str(tmp_path))
    out, err = capsys.readouterr()
    assert f"Sweep {sid} (1 run, 1 ok)" in out
    assert err == (
        "perfsweep: the report failed (no such table: steps); the summary above is from the database; "
        f"retry with: perfsweep report --sweep {sid} --db {tmp_path / 'results.db'}\n"
    )
    engine.dispose()


@pytest.mark.parametrize("during", ["sweep_id_for", "fill_compile_payback"])
def test_ctrl_c_while_the_sweep_closes_is_held_until_its_figures_are_stored(
    during: str, tmp_path: Path, monkeypatch, capsys
):
    """A real SIGINT that arrives while the sweep is looked up or its closing figures are written
    is delivered after them: the sweep is marked and every figure is there for `perfsweep report`,
    which never writes."""
    import signal

    engine, sid = _sweep(
        tmp_path,
        [{"config_hash": "A", "tokens_per_s": 1000.0}, {"config_hash": "B", "amp": True, "tokens_per_s": 2000.0}],
    )
    real = getattr(summary, during)

    def ctrl_c_then_go_on(*args, **kw):
        signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C before anything is written
        return real(*args, **kw)

    monkeypatch.setattr(summary, during, ctrl_c_then_go_on)
    with pytest.raises(KeyboardInterrupt):
        summary.close_sweep(str(engine.url), str(tmp_path), "interrupted")
    assert summary.CLOSING_NOTE in capsys.readouterr().err
    with store.session(engine) as s:
        assert s.get(store.Sweep, sid).status == "interrupted"
        verdicts = {r.config_hash: (r.speedup, r.speedup_verdict) for r in s.query(store.Run).all()}
    assert verdicts["A"] == (1.0, "baseline")  # written before the Ctrl-C was delivered
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back


def test_a_resumed_config_shows_no_interruption_as_its_error(tmp_path: Path):
    """Interrupted, then run ok by perfsweep resume: the row is ok with no error; a failed repeat
    beside ok ones still shows its error (it says something about the config)."""
    engine, sid = _sweep(
        tmp_path,
        [
            {"config_hash": "A", "status": "interrupted", "tokens_per_s": None, "error": "interrupted (SIGINT) ..."},
            {"config_hash": "B", "amp": True, "status": "failed", "tokens_per_s": None, "error": "boom"},
            {"config_hash": "A", "tokens_per_s": 1000.0},
            {"config_hash": "B", "amp": True, "tokens_per_s": 2000.0},
        ],
    )
    lines = summary.format_summary(summary.summary_frame(engine, sid)).splitlines()
    a, b = (next(line for line in lines if line.split()[1] == amp) for amp in ("off", "on"))
    assert a.split()[-6:] == ["ok", "1,000", "100.0", "(2%,", "1%)", "-"], a  # no error column text
    assert b.split()[-3:] == ["1%)", "-", "boom"], b


def test_the_query_hint_names_what_the_sweep_varied(tmp_path: Path, capsys):
    engine, sid = _sweep(
        tmp_path,
        [
            {"config_hash": "A", "config_json": {"nproc": None}},
            {"config_hash": "B", "config_json": {"nproc": 2}, "nproc": 2},
        ],
    )
    summary.show_sweep(str(engine.url), str(tmp_path), make_report=False)
    query = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Query:"))
    assert "'select nproc, tokens_per_s, peak_mem_bytes from runs where sweep_id=" in query, query


def test_a_sweep_stopped_early_names_every_axis_its_grid_sweeps(tmp_path: Path, capsys):
    """A 2x2 amp x ckpt x model.width grid stopped after its first two jobs (amp on, width 32 in
    both): the summary named its configs by ckpt alone and queried ckpt alone, so the row did not
    say it was amp on; the grid's keys are shown whatever the stored runs vary."""
    width = {"model": {"width": 32}}
    engine, sid = _sweep(
        tmp_path,
        [
            {"config_hash": "A", "amp": True, "ckpt": True, "config_json": width},
            {"config_hash": "B", "amp": True, "ckpt": False, "config_json": width, "status": "interrupted"},
        ],
    )
    before = summary.format_summary(summary.summary_frame(engine, sid)).splitlines()[0].split()
    assert before[:3] == ["job", "ckpt", "status"]  # what it showed: amp and width are not told
    swept = ["amp", "ckpt", "model.width"]
    header = summary.format_summary(summary.summary_frame(engine, sid, swept), swept).splitlines()[0].split()
    assert header[:5] == ["job", "amp", "ckpt", "model.width", "status"], header
    summary.show_sweep(str(engine.url), str(tmp_path), make_report=False, swept=swept)
    out = capsys.readouterr().out.splitlines()
    first = out[out.index(next(ln for ln in out if ln.split()[:2] == ["job", "amp"])) + 1].split()
    assert first[:5] == ["1", "on", "on", "32", "ok"], out
    query = next(line for line in out if line.startswith("Query:"))
    # model.width has no runs column: the hint reads it from config_json, in the shell's double quotes
    assert query.endswith(
        "\"select amp, ckpt, json_extract(config_json, '\\$.model.width') AS model_width, tokens_per_s, "
        f'peak_mem_bytes from runs where sweep_id={sid}"'
    ), query
    engine.dispose()


def test_the_query_hint_of_a_sweep_over_a_setting_without_a_column_runs_as_printed(tmp_path: Path, capsys):
    """threads=1,2 has no runs column (torch_threads is what torch ran with): the hint named amp and
    ckpt, which the sweep did not vary. It selects the swept value from config_json, and the
    command runs in a shell as printed."""
    import subprocess

    engine, sid = _sweep(
        tmp_path,
        [
            {"config_hash": "A", "config_json": {"threads": 1}, "tokens_per_s": 1000.0},
            {"config_hash": "B", "config_json": {"threads": 2}, "tokens_per_s": 1500.0},
        ],
    )
    summary.show_sweep(str(engine.url), str(tmp_path), make_report=False, swept=["threads"])
    query = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Query:"))
    command = query.removeprefix("Query:").strip()
    assert "json_extract(config_json, '\\$.threads') AS threads, tokens_per_s" in command, command
    engine.dispose()
    # bash parses the command as printed; without the sqlite3 shell (a bare CI machine) Python's
    # sqlite3 runs the SQL bash handed it, printed as the shell would
    shim = (
        "command -v sqlite3 >/dev/null || sqlite3() { python3 -c 'import sqlite3, sys\n"
        'for row in sqlite3.connect(sys.argv[1]).execute(sys.argv[2]): print("|".join(map(str, row)))\' "$@"; }\n'
    )
    out = subprocess.run(["bash", "-c", shim + command], capture_output=True, text=True, check=True).stdout
    assert [line.split("|")[:2] for line in out.splitlines()] == [["1", "1000.0"], ["2", "1500.0"]], out


def test_a_samples_model_beside_token_models_says_why_it_shows_a_dash(tmp_path: Path):
    engine, sid = _sweep(
        tmp_path,
        [
            {"model_name": "tiny", "config_hash": "lm", "tokens_per_s": 1000.0},
            {"model_name": "cnn", "config_hash": "cnn", "tokens_per_s": None, "samples_per_s": 50.0},
        ],
    )
    text = summary.format_summary(summary.summary_frame(engine, sid))
    header, _, cnn = text.splitlines()[:3]
    assert header.split().index("tokens/s") == header.split().index("status") + 1
    assert cnn.split()[0] == "2" and cnn.split()[header.split().index("status") :][:2] == ["ok", "-"]
    assert text.splitlines()[-1].endswith(
        "- beside tokens/s: a model that counts samples (model.unit=samples); report it on its own with "
        '--where "tokens_per_s IS NULL AND samples_per_s IS NOT NULL"'
    )
    engine.dispose()


def test_the_error_column_is_shown_only_when_a_run_has_one(tmp_path: Path):
    """An all-ok sweep's table ended in an empty ``error`` column (trailing blanks on every line)."""
    engine, sid = _sweep(tmp_path, [{"config_hash": "A", "tokens_per_s": 1000.0}])
    header = summary.format_summary(summary.summary_frame(engine, sid)).splitlines()[0]
    assert header.split()[-1] != "error", header
    engine.dispose()
    (tmp_path / "failed").mkdir()
    engine, sid = _sweep(
        tmp_path / "failed",
        [
            {"config_hash": "A", "tokens_per_s": 1000.0},
            {"config_hash": "B", "amp": True, "status": "failed", "tokens_per_s": None, "error": "boom"},
        ],
    )
    text = summary.format_summary(summary.summary_frame(engine, sid))
    assert text.splitlines()[0].split()[-1] == "error" and text.splitlines()[2].endswith("boom"), text
    engine.dispose()


def test_a_config_shows_its_failure_before_a_repeats_missing_profile(tmp_path: Path):
    """Repeat 0 trained but lost its profile (runs.profile_error), repeat 1 ran out of memory: the
    error column shows the failure; a config whose runs all trained shows why it has no stages."""
    unprofiled = "not profiled: the profiled window ran out of memory after the measured steps"
    engine, sid = _sweep(
        tmp_path,
        [
            {"config_hash": "A", "tokens_per_s": 1000.0, "profile_error": unprofiled, "repeat_index": 0},
            {"config_hash": "A", "status": "oom", "tokens_per_s": None, "error": "OutOfMemoryError: boom"},
            {"config_hash": "B", "batch": 8, "tokens_per_s": 900.0, "profile_error": unprofiled},
        ],
    )
    text = summary.format_summary(summary.summary_frame(engine, sid))
    rows = {line.split()[0]: line for line in text.splitlines()[1:] if line.split() and line.split()[0].isdigit()}
    assert "OutOfMemoryError: boom" in rows["1"] and "not profiled" not in rows["1"]
    assert "not profiled: the profiled window ran out of memory" in rows["3"]
    engine.dispose()


def test_the_table_shows_the_model_when_the_sweep_compares_models(tmp_path: Path):
    """`-m model=tiny,gpt2_small`: the rows are told apart by the model, as the report labels them
    (the table showed batch and seq_len, the same in both rows)."""
    engine, sid = _sweep(
        tmp_path,
        [
            {"config_hash": "A", "model_name": "tiny", "tokens_per_s": 1000.0},
            {"config_hash": "B", "model_name": "gpt2_small", "tokens_per_s": 500.0},
        ],
    )
    header, *rows = summary.format_summary(summary.summary_frame(engine, sid)).splitlines()
    assert header.split()[:2] == ["job", "model"], header
    assert [r.split()[1] for r in rows[:2]] == ["tiny", "gpt2_small"]


def test_repeats_show_their_range_and_the_earlier_of_two_equally_near_runs(tmp_path: Path):
    """Two repeats lie equally far from their median: the row's step time came from either, by the
    last bit of a float (a review saw 11,576 tokens/s beside one repeat's 20.3 ms). It is the earlier
    run's now, whatever the figures, and the median is shown with the repeats' range."""
    rows = []
    for grid, (first, second) in enumerate(((1294.0, 21857.0), (3000.0, 1000.0), (0.1, 0.3))):
        for rep, (tps, ms) in enumerate(((first, 40.0 + grid), (second, 90.0 + grid))):
            rows.append(
                {"config_hash": f"C{grid}", "grid_index": grid, "batch": 4 * (grid + 1), "repeat_index": rep}
                | {"tokens_per_s": tps, "step_time_ms_median": ms}
            )
    engine, sid = _sweep(tmp_path, rows)
    df = summary.summary_frame(engine, sid)
    text = summary.format_summary(df)
    lines = {line.split()[0]: line for line in text.splitlines()[1:] if line.split() and line.split()[0].isdigit()}
    assert "11,576 (1,294-21,857)" in lines["1"] and " 40.0 (" in lines["1"]
    assert "2,000 (1,000-3,000)" in lines["3"] and " 41.0 (" in lines["3"]
    assert " 42.0 (" in lines["5"]
    assert "the repeat nearest that median (on a tie, the earlier)" in text
    engine.dispose()
