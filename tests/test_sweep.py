"""End-to-end: the CLI as a user runs it, fresh job processes, a real SQLite results.db."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from perfsweep import metrics, store
from perfsweep.names import STACKS_ENV, interrupted_tail
from perfsweep.report import fmt
from tests.util import (
    TINY,
    failing_model,
    finish,
    run_perfsweep,
    start_as_in_a_terminal,
    stopped_while_the_database_is_waited_for,
    training,
    wait_for,
)
from tests.util import sqlite_rows as rows


def cpu_model_from_proc() -> str:
    """The CPU's name as the kernel gives it (/proc/cpuinfo's "model name"), read here rather than
    through perfsweep.envinfo, the code that stores it; the platform's name where there is none."""
    import platform

    names = [
        ln.split(":", 1)[1].strip()
        for ln in Path("/proc/cpuinfo").read_text().splitlines()
        if ln.startswith("model name")
    ]
    return names[0] if names else platform.processor() or platform.machine()


@pytest.fixture(scope="module")
def default_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's default sweep (default model, stdlib corpus), with fewer steps."""
    cwd = tmp_path_factory.mktemp("default_sweep")
    # the launch directory is a git checkout with an uncommitted change: its state is provenance
    git = ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t"]
    (cwd / "train_notes.txt").write_text("v1\n")
    for cmd in (["init", "-q"], ["add", "train_notes.txt"], ["commit", "-q", "-m", "v1"]):
        subprocess.run([*git, *cmd], check=True)
    (cwd / "train_notes.txt").write_text("v2\n")
    res = run_perfsweep(
        [
            "-m",
            "amp=true,false",
            "ckpt=true,false",
            "seq_len=64",  # half the default's tokens: a bf16 step of this model takes ~14 s at 8 x 128
            "steps.warmup=1",  # on a CPU without bf16 units (AVX2 only), so this fixture set the suite's pace
            "steps.stable_window=0",
            "steps.measure=3",
            "profile.wait=0",
            "profile.warmup=0",
            "profile.active=1",
            "device=cpu",
        ],  # the assertions below are CPU semantics (allocator accounting, no verdict)
        cwd,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (cwd / "stdout.txt").write_text(res.stdout)
    (cwd / "stderr.txt").write_text(res.stderr)
    return cwd


def test_default_sweep_rows(default_sweep: Path):
    db = default_sweep / "results.db"
    head = subprocess.run(
        ["git", "-C", str(default_sweep), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    runs = rows(db, "SELECT * FROM runs ORDER BY job_num")
    assert [(r["amp"], r["ckpt"]) for r in runs] == [(1, 1), (1, 0), (0, 1), (0, 0)]
    for r in runs:
        assert r["status"] == "ok" and r["error"] is None
        assert (r["model_name"], r["data_name"], r["batch"], r["seq_len"]) == ("small", "stdlib", 8, 64)
        assert r["warmup_steps"] == 1 and r["measure_steps"] == 3 and r["steady_state"] is None  # check off
        assert r["step_time_ms_p10"] <= r["step_time_ms_median"] <= r["step_time_ms_p90"]
        # tokens/s is the measured steps' tokens over the window's wall time, which holds the steps
        steps = rows(db, f"SELECT * FROM steps WHERE run_id = {r['id']} AND phase = 'measure'")
        assert len(steps) == 3 and steps[0]["step"] == r["measure_start_step"] == r["warmup_steps"] >= 1
        total_ms = sum(s["step_time_ms"] for s in steps)
        assert total_ms <= r["measure_wall_ms"] < total_ms * 1.1
        assert r["tokens_per_s"] == pytest.approx(3 * 8 * 64 * 1000 / r["measure_wall_ms"], rel=1e-9)
        assert r["timing_mode"] == "sync" and r["repeat_index"] == 0
        q25, q75 = np.percentile([s["step_time_ms"] for s in steps], [25, 75])
        tail = abs(r["step_time_ms_mean"] - r["step_time_ms_median"]) / r["step_time_ms_median"]
        assert r["step_time_ms_iqr"] == pytest.approx(q75 - q25) and r["noisy"] == int(
            (q75 - q25) > 0.1 * r["step_time_ms_median"] or tail > 0.1
        )
        assert r["noisy_rule"] == "step-time IQR > 10% of the median, or mean more than 10% off the median"
        assert r["final_loss"] == steps[-1]["loss"]
        assert 0 < r["unk_token_share"] < 0.2 and r["vocab_size"] == 8192
        assert r["peak_rss_bytes"] > r["rss_before_train_bytes"] > 0
        assert r["rss_growth_bytes"] > 0
        # CPU: parameters + AdamW state (3 x 4 bytes a parameter) + the step's allocations
        assert r["peak_mem_bytes"] == r["peak_allocated_bytes"] > 3 * 4 * r["n_params"]
        assert r["peak_reserved_bytes"] is None  # no caching allocator on CPU
        # the memory ledger, predicted before the job trained, next to what was measured
        parts = [r[f"predicted_{k}_bytes"] for k in ("params", "grads", "optimizer", "activations", "logits")]
        assert sum(parts) == r["predicted_peak_bytes"] > 0 and r["predicted_slack_bytes"] == 0  # no slack on CPU
        assert r["predicted_peak_error"] == pytest.approx(r["predicted_peak_bytes"] / r["peak_allocated_bytes"] - 1)
        assert abs(r["predicted_peak_error"]) < 0.15, r  # the target; docs/benchmarks.md has the figures
        assert r["data_bound"] == int(r["data_wait_fraction"] > 0.10)
        assert r["device_type"] == "cpu" and r["torch_version"] and r["hostname"]
        # provenance: what can explain a difference between two runs' numbers
        assert r["cpu_model"] == cpu_model_from_proc() and r["cpu_count"] == os.cpu_count()
        assert (r["tf32_matmul"], r["cudnn_benchmark"]) == (0, 0)  # torch's defaults, as the job saw them
        assert r["cuda_alloc_conf"] == "expandable_segments:True"  # from the job's environment
        assert (r["gpu_driver_version"], r["gpu_total_memory_bytes"], r["gpu_compute_capability"]) == (None,) * 3
        assert (r["git_commit"], r["git_dirty"]) == (head, 1)  # HEAD of the launch directory, modified
        assert r["vocab_size_padded"] == 8192  # already a multiple of 128
        # no GPU: busy time, verdict and kernel categories stay null, never guessed
        assert (r["gpu_busy_ms"], r["gpu_busy_fraction"], r["bottleneck"], r["bottleneck_rule"]) == (None,) * 4
        assert rows(db, f"SELECT * FROM kernels WHERE run_id = {r['id']}") == []
        assert r["compile_cache"] is None  # compile off
        assert r["config_json"] and len(r["config_hash"]) == 64
        stages = rows(db, f"SELECT * FROM stages WHERE run_id = {r['id']}")
        assert {s["stage"] for s in stages} >= {"data_to_device", "forward", "backward", "optimizer_step"}
        for s in stages:  # CPU stages as before: device time is the CPU time
            assert s["device_time_source"] == "same_as_cpu" and s["device_time_ms"] == s["cpu_time_ms"] > 0
        arts = rows(db, f"SELECT kind, path, bytes FROM artifacts WHERE run_id = {r['id']}")
        trace = next(a for a in arts if a["kind"] == "trace")
        assert Path(trace["path"]).stat().st_size == trace["bytes"]
        assert Path(trace["path"]).parent == Path(r["job_dir"])
    # CPU utilisation is against the matmul peak measured on this machine in the run's compute
    # dtype, before the jobs or by any job of that dtype after its steps (the best, one for them
    # all), and never above 1: with the sweep's peak alone, another test's load during that
    # measurement gave 1.26
    (sweep,) = rows(db, "SELECT cpu_matmul_fp32_flops, cpu_matmul_bf16_flops FROM sweeps")
    assert sweep["cpu_matmul_fp32_flops"] > 1e9 and sweep["cpu_matmul_bf16_flops"] > 1e8
    assert len({r["torch_threads"] for r in runs}) == 1
    for r in runs:
        jobs = max(o["cpu_matmul_flops"] for o in runs if o["amp"] == r["amp"])
        peak = max(sweep["cpu_matmul_bf16_flops"] if r["amp"] else sweep["cpu_matmul_fp32_flops"], jobs)
        assert r["mfu_compute_dtype"] == ("bf16" if r["amp"] else "fp32") and r["mfu"] is None  # no GPU: no MFU
        assert r["cpu_flops_utilisation"] == pytest.approx(r["model_tflops_per_s"] * 1e12 / peak)
        assert 0 < r["cpu_flops_utilisation"] <= 1.0
    # the same config hashes apart when only amp/ckpt differ
    assert len({r["config_hash"] for r in runs}) == 4


def test_checkpointing_lowers_training_memory(default_sweep: Path):
    runs = rows(default_sweep / "results.db", "SELECT amp, ckpt, peak_mem_bytes FROM runs")
    mem = {(r["amp"], r["ckpt"]): r["peak_mem_bytes"] for r in runs}
    for amp in (0, 1):
        # allocator accounting is deterministic; we measured -23% (fp32) and -17% (bf16)
        assert mem[(amp, 1)] < 0.9 * mem[(amp, 0)], mem


def test_summary_and_progress_are_printed(default_sweep: Path):
    out = (default_sweep / "stdout.txt").read_text()
    err = (default_sweep / "stderr.txt").read_text()
    assert "(4 runs, 4 ok)" in out and "tokens/s" in out and "results.db" in out
    assert "[1/4]" in err and "[4/4]" in err and "left" in err
    # Hydra's launcher said the same again, timestamped, with perfsweep's sweep.* bookkeeping
    assert "Launching 4 jobs" not in out + err and "\t#0 : amp=True" not in out + err
    # stdout is the summary alone: perfsweep's notes (a corpus tokenized) go to stderr beside its
    # other lines, not among the table as "[<time>][HYDRA] ..."
    assert out.lstrip().startswith("Sweep 1 (4 runs, 4 ok)"), out[:2000]
    assert "][HYDRA]" not in err and "][WARNING]" not in err, err[:3000]
    # before the jobs, a CPU without bf16 units is named as such, from its measured matmul rates
    (peak,) = rows(default_sweep / "results.db", "SELECT cpu_matmul_fp32_flops, cpu_matmul_bf16_flops FROM sweeps")
    fp32, bf16 = peak["cpu_matmul_fp32_flops"], peak["cpu_matmul_bf16_flops"]
    notice = f"on this CPU bf16 matmuls run at {bf16 / 1e9:,.0f} GFLOP/s, {bf16 / fp32:.2f}x the fp32 rate"
    assert (notice in err) == (bf16 < 0.5 * fp32), err[:2000]


def test_rerun_adds_a_sweep_and_loses_nothing(default_sweep: Path):
    db = default_sweep / "results.db"
    before = rows(db, "SELECT * FROM runs ORDER BY id")
    res = run_perfsweep(["-m", "amp=true,false", "device=cpu", *TINY], default_sweep)
    assert res.returncode == 0, res.stderr[-2000:]
    after = rows(db, "SELECT * FROM runs ORDER BY id")
    assert after[: len(before)] == before
    assert len(after) == len(before) + 2
    assert len(rows(db, "SELECT id FROM sweeps")) == 2
    assert rows(db, "PRAGMA journal_mode")[0]["journal_mode"] == "wal"


def test_a_sweep_or_run_inside_another_sweeps_folder_is_refused(default_sweep: Path):
    """A new sweep into one of the default sweep's job folders ran (exit 0): its ``.hydra``,
    ``multirun.yaml``, marker and job folder were written in beside that job's trace, and a row
    stored for it. It is refused in one line, and so is a plain run further inside; nothing is
    written, nothing made."""
    import hashlib

    db = default_sweep / "results.db"
    (sweep_dir,) = {Path(r["sweep_dir"]) for r in rows(db, "SELECT sweep_dir FROM sweeps WHERE id = 1")}
    job = next(d for d in sorted(sweep_dir.iterdir()) if d.is_dir() and d.name[0].isdigit())
    before, job_entries = hashlib.md5(db.read_bytes()).hexdigest(), sorted(p.name for p in job.iterdir())
    for args in (["-m", f"hydra.sweep.dir='{job}'"], [f"hydra.run.dir={sweep_dir}/new/deeper"]):
        res = run_perfsweep([*args, *TINY], default_sweep)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-2000:]
        assert f"is inside the folder of another sweep ({sweep_dir}), whose jobs' folders" in res.stderr
    assert hashlib.md5(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in job.iterdir()) == job_entries and not (sweep_dir / "new").exists()


def test_failures_are_results_and_the_sweep_goes_on(tmp_path: Path):
    # A model that raises on its second forward passes every check before the jobs and fails
    # inside the job; a huge step count overruns the timeout. device=cpu: the 12 s timeout is
    # sized to a CPU job's start.
    tiny = [o for o in failing_model(tmp_path) if not o.startswith("steps.measure")]
    res = run_perfsweep(["-m", "steps.measure=3,100000000", "+model.fail_at=0,2", "timeout_s=12", *tiny], tmp_path)
    # exit 1 after the summary: some jobs did not finish ok
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        "perfsweep: 3 of 4 jobs did not finish ok (2 failed, 1 timeout); exit code 1 (allow_failures=true exits 0)"
    )
    runs = rows(
        tmp_path / "results.db",
        "SELECT measure_steps, status, error, tokens_per_s, duration_s, config_json FROM runs ORDER BY job_num",
    )
    status = [r["status"] for r in runs]
    assert status == ["ok", "failed", "timeout", "failed"], [(r["status"], r["error"]) for r in runs]
    assert runs[0]["tokens_per_s"] > 0
    assert "the model broke on its forward number 2" in runs[1]["error"]
    assert "timeout_s=12" in runs[2]["error"]
    # the stored time of a timed-out job ends at its deadline (start-up excluded), not after the kill
    assert 12 <= runs[2]["duration_s"] < 12 + 10, runs[2]["duration_s"]
    assert all(r["tokens_per_s"] is None for r in runs[1:])
    assert "(4 runs, 1 ok)" in res.stdout
    sweep = rows(tmp_path / "results.db", "SELECT status, finished_at FROM sweeps")
    assert sweep[0]["status"] == "done" and sweep[0]["finished_at"]


def test_every_job_failing_exits_1_after_the_summary(tmp_path: Path):
    res = run_perfsweep(["-m", "+model.fail_at=2,3", *failing_model(tmp_path)], tmp_path)
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1].startswith("perfsweep: 2 of 2 jobs did not finish ok (2 failed)")
    assert "(2 runs, 0 ok)" in res.stdout  # the summary was printed first
    assert [r["status"] for r in rows(tmp_path / "results.db", "SELECT status FROM runs")] == ["failed", "failed"]
    res = run_perfsweep(["-m", "+model.fail_at=2", "allow_failures=true", *failing_model(tmp_path)], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]


def test_single_run_without_multirun(tmp_path: Path):
    res = run_perfsweep(TINY, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = rows(tmp_path / "results.db", "SELECT status, job_num, overrides FROM runs")
    # report=false is how the run behaves, not what it measured: not among the stored overrides
    assert runs == [{"status": "ok", "job_num": 0, "overrides": " ".join(o for o in TINY if o != "report=false")}]
    assert "(1 run, 1 ok)" in res.stdout
    assert (tmp_path / "outputs").is_dir()  # Hydra's run folder holds the job's trace
    assert "Report:" not in res.stdout and not list((tmp_path / "outputs").rglob("report.md"))  # report=false


def test_sweep_into_postgresql(tmp_path: Path, pg_url: str):
    """A sweep that spans machines writes to one PostgreSQL server; here, a real local one.

    The URL's password (the test server trusts local users, so any is accepted) is stored nowhere:
    it was kept, as typed, in sweeps.command, runs.overrides and runs.config_json, for every reader
    of the results to see. perfsweep resume still finishes the sweep, taking the database from --db."""
    import sqlalchemy as sa

    from perfsweep import resume
    from tests.pg import new_database

    url = new_database(pg_url).replace(
        "://postgres@", "://postgres:s3cret/PW x@"
    )  # a '/' and a space: both were left shown
    assert "s3cret/PW x" in url
    res = run_perfsweep(["-m", "amp=true,false", f"db.url={url}", *TINY], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (tmp_path / "results.db").exists()
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        got = conn.execute(sa.text("SELECT amp, status, tokens_per_s FROM runs ORDER BY job_num")).all()
        n_steps = conn.execute(sa.text("SELECT count(*) FROM steps")).scalar_one()
        command = conn.execute(sa.text("SELECT command FROM sweeps")).scalar_one()
        kept = conn.execute(sa.text("SELECT overrides, config_json::text FROM runs")).all()
        paths = conn.execute(sa.text("SELECT path FROM artifacts")).scalars().all()
    with sa.orm.Session(engine) as s:
        sweep = s.scalars(sa.select(store.Sweep)).one()  # as resume reads it
    engine.dispose()
    assert [(amp, status) for amp, status, _ in got] == [(True, "ok"), (False, "ok")]
    assert all(tps > 0 for *_, tps in got) and n_steps > 0
    assert "(2 runs, 2 ok)" in res.stdout
    # the trace's and profile's file names were made of every override, db.url's password included;
    # Hydra's files (.hydra/*.yaml in each job's folder, the sweep's multirun.yaml) held it in clear
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert paths and not [p for p in [*paths, *map(str, files)] if "s3cret" in p], paths
    assert not [p for p in files if b"s3cret" in p.read_bytes()], [p for p in files if b"s3cret" in p.read_bytes()]
    hydra_files = [p for p in files if p.parent.name == ".hydra" or p.name == "multirun.yaml"]
    assert len(hydra_files) == 7 and all(":***@" in p.read_text() for p in hydra_files), hydra_files
    hidden = url.replace("s3cret/PW x", "***")
    assert "s3cret" not in command + str(kept) + res.stdout + res.stderr and f"db.url={hidden}" in command, command
    # overrides as Hydra escapes them (db.url=postgresql+psycopg2\\://postgres\\:***@...)
    assert all(":***@" in overrides and f'"url": "{hidden}"' in config for overrides, config in kept), kept
    again = resume.command_for(sweep, db_url=url)  # what `perfsweep resume 1 --db URL` runs
    assert f"db.url={resume._quoted(url)}" in again and not any("***" in word for word in again), again


def test_ctrl_c_while_a_sweep_waits_for_a_locked_postgresql_table_stops_it_at_once(tmp_path: Path, pg_url: str):
    """Another session holds a lock on ``sweeps`` (a schema upgrade, a ``LOCK TABLE`` left open):
    the sweep says it waits. libpq waited inside C, where Python's handlers do not run, and a
    Ctrl-C did nothing for as long as the lock was held (20 s of 20, measured). It now stops the
    sweep at once (store._wait_stoppable), writes nothing, and leaves no folder."""
    import psycopg2
    from sqlalchemy.engine import make_url

    from tests.pg import new_database

    url = new_database(pg_url)
    store.connect(url).dispose()
    u = make_url(url)
    other = psycopg2.connect(host=u.host, port=u.port, user=u.username, dbname=u.database)
    try:
        other.cursor().execute("LOCK TABLE sweeps IN ACCESS EXCLUSIVE MODE")
        notice = "perfsweep: still waiting for the database postgresql+psycopg2://"
        stopped_while_the_database_is_waited_for(["-m", *TINY, f"db.url={url}"], tmp_path, notice)
    finally:
        other.rollback()
        other.close()
    with store.session(store.connect(url)) as s:
        assert s.scalars(store.select(store.Sweep)).all() == []
    assert not (tmp_path / "multirun").exists()


def test_a_second_ctrl_c_while_the_stopped_sweep_counts_its_finished_jobs_keeps_the_last_line(
    tmp_path: Path, pg_url: str
):
    """``runs`` locked by another session once the first job is stored: the second job's opening
    of the database waits, a Ctrl-C stops it, and the sweep's count of its finished jobs waits in turn (held). A
    second Ctrl-C there was delivered as the hold ended, before the count's line was set: the
    sweep said "interrupted before any job started" of a sweep whose first job was stored."""
    import signal

    import psycopg2
    from sqlalchemy.engine import make_url

    from tests.pg import new_database

    url = new_database(pg_url)
    store.connect(url).dispose()
    u = make_url(url)
    other = psycopg2.connect(host=u.host, port=u.port, user=u.username, dbname=u.database)
    other.autocommit = True
    watch = other.cursor()

    def waiting(statement: str) -> bool:  # a statement of the sweep's that waits for the lock
        watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
            (f"{statement}%",),
        )
        return watch.fetchone()[0] > 0

    said = tmp_path / "stderr.txt"
    tiny = [o for o in TINY if not o.startswith("steps.measure")]
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "-m", "steps.measure=3,100000000", *tiny, f"db.url={url}"], tmp_path, said
    )
    locker = psycopg2.connect(host=u.host, port=u.port, user=u.username, dbname=u.database)
    try:
        wait_for(lambda: "  -> ok" in said.read_text())
        locker.cursor().execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        wait_for(lambda: waiting("SELECT runs.id, runs.sweep_id"), 60)  # the second job's opening of it
        os.killpg(proc.pid, signal.SIGINT)
        wait_for(lambda: waiting("SELECT runs.job_num, runs.id, runs.status"), 60)  # the count, held
        os.killpg(proc.pid, signal.SIGINT)
        wait_for(lambda: "perfsweep: stopping the running jobs and storing them first" in said.read_text(), 60)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        locker.rollback()
        locker.close()
        other.close()
    _, err = finish(proc, 60)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"perfsweep: interrupted; 1 of 2 jobs finished and are stored; run the rest with: perfsweep resume 1 --db {url}"
    ), err[-3000:]
    assert "\nSweep 1 " not in said.read_text()  # the second stop skips the summary


def test_unreachable_database_stops_the_sweep_before_any_job(tmp_path: Path):
    res = run_perfsweep(["-m", "amp=true,false", "db.url=postgresql+psycopg2://u@127.0.0.1:1/x", *TINY], tmp_path)
    assert res.returncode == 2
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("perfsweep:")]
    assert len(line) == 1 and "db.url=" in line[0] and "no job was started" in line[0]
    assert not (tmp_path / "multirun").exists()


def test_a_postgresql_database_another_application_migrates_takes_perfsweep_in_a_schema_of_its_own(
    tmp_path: Path, pg_url: str
):
    """A team's database where another application keeps its own Alembic version (MLflow's
    tracking server, say) is refused with the way out: a schema of perfsweep's own, chosen by the
    URL's options. A sweep then writes there, and query and report read there: they had replaced
    the URL's options with their own read-only ones, and read the other application's schema."""
    import sqlalchemy as sa

    from tests.pg import new_database

    url = new_database(pg_url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('bd07f7e963c5')"))
    res = run_perfsweep(["-m", "amp=true,false", f"db.url={url}", *TINY], tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert "is another application's (its alembic_version table)" in line, line
    assert "run CREATE SCHEMA perfsweep; there, then add ?options=-csearch_path%3Dperfsweep to the URL" in line, line
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA perfsweep"))
    ours = f"{url}?options=-csearch_path%3Dperfsweep"
    res = run_perfsweep(["-m", "amp=true,false", f"db.url='{ours}'", *TINY], tmp_path)  # quoted for Hydra: its '='
    assert res.returncode == 0, res.stderr[-2000:]
    query = run_perfsweep(["query", "select amp, status from runs order by job_num", "--db", ours], tmp_path)
    assert query.returncode == 0, query.stderr[-2000:]
    assert [ln.split() for ln in query.stdout.strip().splitlines()[-2:]] == [["1", "ok"], ["0", "ok"]], query.stdout
    undo = f"{ours}%20-cdefault_transaction_read_only%3Doff"  # the URL's options come first: they cannot undo it
    query = run_perfsweep(
        ["query", "select current_setting('default_transaction_read_only') as ro", "--db", undo], tmp_path
    )
    assert query.returncode == 0 and query.stdout.split()[-1] == "on", query.stdout + query.stderr[-2000:]
    report = run_perfsweep(["report", "--db", ours], tmp_path)
    assert report.returncode == 0 and "Report:" in report.stdout, report.stderr[-2000:]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM public.alembic_version")).scalars().all() == [
            "bd07f7e963c5"
        ]
        assert conn.execute(sa.text("SELECT count(*) FROM perfsweep.runs")).scalar_one() == 2
        assert conn.execute(sa.text("SELECT to_regclass('public.runs')")).scalar_one() is None
    engine.dispose()


def test_ctrl_c_keeps_finished_jobs_and_leaves_no_process(tmp_path: Path):
    """On the CPU: a GPU's default timing (CUDA events) says a window's steps only as it ends, and
    this window never ends (steps.measure=100000000): the wait for its first step would not."""
    import os
    import signal
    import sys

    tiny = [o for o in TINY if not o.startswith("steps.measure")]
    # DataLoader workers in the job: stopping it must release their semaphores (no warning)
    said = tmp_path / "stderr.txt"
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "-m", "steps.measure=3,100000000", "workers=2", *tiny, "device=cpu"],
        tmp_path,
        said,
    )
    db = tmp_path / "results.db"
    try:  # the first job is stored and the second trains
        wait_for(lambda: db.exists() and rows(db, "SELECT count(*) AS n FROM runs WHERE status = 'ok'")[0]["n"] == 1)
        wait_for(lambda: training(said, serial_job="[2/2]"))
    except BaseException:  # the sweep would train on for ever
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole process group
    out, err = finish(proc, 60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "(2 runs, 1 ok)" in out
    assert "leaked semaphore" not in err, err[-2000:]
    # the job that was running when Ctrl-C came is stored as such, and so is the sweep
    runs = rows(db, "SELECT status, error FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == ["ok", "interrupted"]
    assert runs[1]["error"] == f"interrupted (SIGINT) {interrupted_tail(multirun=True)}", runs  # one line
    assert [r["status"] for r in rows(db, "SELECT status FROM sweeps")] == ["interrupted"]
    assert f"interrupted; 1 of 2 jobs finished and are stored; run the rest with: perfsweep resume 1 --db {db}" in err

    def group_alive() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    deadline = time.monotonic() + 15
    while group_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(), "a process of the interrupted sweep is still running"


def test_ctrl_c_in_a_single_run_says_to_run_it_again(tmp_path: Path):
    """A single run (no -m) cannot be resumed: its stored error and last line both say to run the
    command again (the stored error once said perfsweep resume, which refuses single runs). On
    the CPU, as the test above."""
    import signal
    import sys

    tiny = [o for o in TINY if not o.startswith("steps.measure")]
    said = tmp_path / "stderr.txt"
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "steps.measure=100000000", *tiny, "device=cpu"], tmp_path, said
    )
    db = tmp_path / "results.db"
    try:
        wait_for(lambda: training(said))  # the run trains
    except BaseException:  # it would train on for ever
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    os.killpg(proc.pid, signal.SIGINT)
    _, err = finish(proc, 60)
    assert proc.returncode == 130, err[-2000:]
    (run,) = rows(db, "SELECT status, error FROM runs")
    assert run == {"status": "interrupted", "error": f"interrupted (SIGINT) {interrupted_tail(multirun=False)}"}
    assert [r["status"] for r in rows(db, "SELECT status FROM sweeps")] == ["interrupted"]
    assert (
        err.strip().splitlines()[-1].endswith("the run is stored as interrupted; run the command again to measure it")
    )


def test_ctrl_c_before_a_single_runs_row_says_it_had_not_started(tmp_path: Path):
    """A Ctrl-C that comes before the run's row is written (a review saw one 2.1 s in) stores
    nothing of it; the last line said "the run is stored as interrupted" all the same. The
    driver sends it from inside the run's start, just before the row."""
    import signal
    import sys

    driver = (
        "import os, signal, sys\n"
        "from perfsweep import launcher\n"
        "real = launcher.sweep_fields\n"
        "def fields(spec):\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C would, before the row is written\n"
        "    return real(spec)\n"
        "launcher.sweep_fields = fields\n"
        "sys.argv = ['perfsweep', *sys.argv[1:]]\n"
        "from perfsweep.__main__ import cli\n"
        "cli()\n"
    )
    proc = start_as_in_a_terminal([sys.executable, "-c", driver, *TINY, "device=cpu"], tmp_path)
    _, err = finish(proc, 120)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    assert rows(tmp_path / "results.db", "SELECT status FROM runs") == []
    assert err.strip().splitlines()[-1].endswith("the run had not started; run the command again to measure it"), err
    assert "Traceback" not in err, err[-2000:]


def test_torchs_exit_lines_stay_off_the_terminal_after_an_import_cut_short(tmp_path: Path):
    """A Ctrl-C while the sweep's process imported torch (PERFSWEEP_EARLY_JOB_SERVER=0: its
    checks import it there) left torch's loggers at Hydra's INFO, never set to WARNING as the
    import's end sets them, and torch's exit handler (FakeTensor's cache stats, registered as
    that module is imported) printed its lines under the sweep's last one. The driver stands in
    for the import cut short: a handler of a torch logger's, registered before the sweep runs."""
    import sys

    driver = (
        "import atexit, logging, sys\n"
        "atexit.register(lambda: logging.getLogger('torch._subclasses.fake_tensor').info('FakeTensor cache stats:'))\n"
        "sys.argv = ['perfsweep', *sys.argv[1:]]\n"
        "from perfsweep.__main__ import cli\n"
        "cli()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", driver, "-m", *TINY, "device=cpu", "seed=0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "FakeTensor cache stats" not in res.stderr, res.stderr[-2000:]


def test_cpu_out_of_memory_is_status_oom(tmp_path: Path):
    """A model too big to allocate (16 TiB of MLP weights) is an oom result, not a crash.

    Under a job memory limit: without one, whether the allocation fails depends on the kernel's
    overcommit policy: where it allows any size, the job starts to fill 16 TiB of pages. On an H100
    machine the test was still running when the suite's 500 s were up, probably for that."""
    huge = [*TINY, "model.d_ff=17179869184", "device=cpu", "job_memory_limit_mib=1024"]
    res = run_perfsweep(huge, tmp_path)
    assert res.returncode == 1, res.stderr[-2000:]  # a single run that did not finish ok
    assert "1 of 1 job did not finish ok (1 oom)" in res.stderr
    again = run_perfsweep([*huge, "allow_failures=true"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    run, run_again = rows(tmp_path / "results.db", "SELECT status, error, tokens_per_s, hostname FROM runs")
    assert run_again["status"] == "oom"
    assert run["status"] == "oom" and run["tokens_per_s"] is None
    # what happened first, without the allocator's C++ check, so a cut line keeps it
    assert run["error"].startswith("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate")
    assert run["hostname"]  # the environment is stored with failures too


def test_every_way_a_memory_limit_runs_out_is_status_oom(tmp_path: Path):
    """Under job_memory_limit_mib the address space also runs out outside torch's allocator, and
    those runs were stored ``failed``: on this project's VM the tiny GPT at 5 MiB could not map its
    token file (OSError ENOMEM), at 10 MiB GNU OpenMP could not create a thread and exited the
    process (code 1, no result), at 20 MiB oneDNN could not create a primitive."""
    tiny = [o for o in TINY if not o.startswith("profile.")] + ["profile.enabled=false", "device=cpu"]
    res = run_perfsweep(["-m", "job_memory_limit_mib=5,10,20", *tiny, "allow_failures=true"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = rows(tmp_path / "results.db", "SELECT status, error FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == ["oom"] * 3, [(r["status"], r["error"][:300]) for r in runs]
    assert all(r["error"] for r in runs)


def test_which_errors_are_memory_running_out():
    """Under an address-space limit (a finite RLIMIT_AS, as job_memory_limit_mib sets; in a child
    process, so this one keeps none) oneDNN's bare "could not create a primitive" is memory, its
    "could not create a primitive descriptor for ..." (an operation it lacks) is not; ENOMEM is
    memory anywhere, another errno is not; C++'s std::bad_alloc, as torch passes it on, is memory anywhere too."""
    import subprocess
    import sys

    script = """
import errno, resource
from perfsweep.task import is_oom
cases = [
    RuntimeError("could not create a primitive"),
    RuntimeError("could not create a primitive descriptor for a matmul primitive"),
    RuntimeError("Resource temporarily unavailable"),
    OSError(errno.ENOMEM, "Cannot allocate memory"),
    OSError(errno.ENOENT, "No such file or directory"),
    RuntimeError("std::bad_alloc"),
    RuntimeError("[Errno 12] Cannot allocate memory"),
]
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
before = [is_oom(e) for e in cases] if soft == resource.RLIM_INFINITY else "limited already"
resource.setrlimit(resource.RLIMIT_AS, (2**46 if hard == resource.RLIM_INFINITY else hard, hard))
print(before, [is_oom(e) for e in cases])
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    limited = "[True, False, True, True, False, True, True]"
    assert res.stdout.strip() in (
        f"[False, False, False, True, False, True, True] {limited}",
        f"limited already {limited}",
    )


def test_openmp_running_out_of_threads_is_read_from_this_tries_lines_only(tmp_path: Path):
    """job.log is appended to: a resumed try that died of something else was stored oom for the
    libgomp line an earlier try left."""
    from perfsweep.launcher import OPENMP_NO_THREAD, _no_thread_for_openmp

    log = tmp_path / "job.log"
    log.write_text(f"step 1\nlibgomp: {OPENMP_NO_THREAD}\n")
    assert _no_thread_for_openmp(tmp_path)
    earlier = log.stat().st_size
    with log.open("a") as fh:
        fh.write("Traceback (most recent call last):\nSegmentation fault\n")
    assert not _no_thread_for_openmp(tmp_path, earlier)
    assert not _no_thread_for_openmp(tmp_path / "gone")


def test_a_bare_memory_error_says_what_it_means():
    """Python's MemoryError often has no message: the stored error was 'MemoryError: '."""
    from perfsweep.task import error_text

    assert error_text(MemoryError()) == (
        "MemoryError: an allocation failed: the process ran out of memory (or hit job_memory_limit_mib)"
    )
    assert error_text(ValueError("bad shape")) == "ValueError: bad shape"


def test_two_sweeps_started_at_once_in_one_folder_stay_apart(tmp_path: Path):
    """Same folder, same second: separate sweep rows, separate folders; a reused folder is refused."""
    import os
    import subprocess
    import sys

    tiny = [o for o in TINY if not o.startswith(("profile.", "report="))] + ["profile.enabled=false", "device=cpu"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "perfsweep", "-m", axis, *tiny],
            cwd=tmp_path,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        for axis in ("amp=true,false", "ckpt=true,false")
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    db = tmp_path / "results.db"
    sweeps = rows(db, "SELECT id, sweep_dir FROM sweeps ORDER BY id")
    assert len(sweeps) == 2 and sweeps[0]["sweep_dir"] != sweeps[1]["sweep_dir"]
    for sw in sweeps:
        runs = rows(db, f"SELECT overrides, job_dir FROM runs WHERE sweep_id = {sw['id']}")
        assert len(runs) == 2
        assert len({r["overrides"].split()[0].split("=")[0] for r in runs}) == 1  # amp-only or ckpt-only
        assert all(Path(r["job_dir"]).parent == Path(sw["sweep_dir"]) for r in runs)
        assert (Path(sw["sweep_dir"]) / "report" / "report.md").is_file()
    res = run_perfsweep(["-m", *tiny, f"hydra.sweep.dir={sweeps[0]['sweep_dir']}"], tmp_path)
    assert res.returncode == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "already holds another sweep" in err and err.endswith("no job was started")
    assert len(rows(db, "SELECT id FROM runs")) == 4  # nothing written by the refused sweep


def test_repeats_run_in_rounds_share_the_config_and_get_intervals(tmp_path: Path):
    """repeat=2 order=shuffle over 2 configs: 4 fresh processes in 2 rounds, never one config twice
    in a row; repeats share their config hash; the speedup over the baseline is over repeats."""
    res = run_perfsweep(
        ["-m", "amp=true,false", "repeat=2", "order=shuffle", "profile.enabled=false", "device=cpu", *TINY], tmp_path
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = rows(tmp_path / "results.db", "SELECT * FROM runs ORDER BY job_num")
    assert [r["job_num"] for r in runs] == list(range(4))
    rounds = [sorted(r["amp"] for r in runs[i : i + 2]) for i in (0, 2)]
    assert rounds == [[0, 1]] * 2  # every round runs every config once
    assert [r["repeat_index"] for r in runs] == [0, 0, 1, 1]
    assert all(a["amp"] != b["amp"] for a, b in zip(runs, runs[1:], strict=False))  # never back to back
    assert len({r["config_hash"] for r in runs}) == 2 and len({r["job_dir"] for r in runs}) == 4
    assert all("repeat" not in r["overrides"] and "sweep." not in r["overrides"] for r in runs)
    base = [r for r in runs if r["amp"] == 0]
    amp = [r for r in runs if r["amp"] == 1]
    assert {r["speedup_verdict"] for r in base} == {"baseline"}
    expected = metrics.ratio_interval([r["tokens_per_s"] for r in amp], [r["tokens_per_s"] for r in base])
    for r in amp:  # the stored interval is the bootstrap over the two repeats of each side
        assert r["speedup_basis"] == "repeats" and r["baseline_config_hash"] == base[0]["config_hash"]
        assert (r["speedup"], r["speedup_ci_lo"], r["speedup_ci_hi"]) == pytest.approx(
            (expected.value, expected.lo, expected.hi)
        )
        assert r["speedup_verdict"] == metrics.verdict(expected)
    summary = res.stdout[res.stdout.index("Sweep 1") :]
    assert "runs" in summary and "speedup (95% CI)" in summary and "baseline" in summary
    assert fmt.speedup(expected.value, expected.lo, expected.hi) in summary  # written as the report writes it


def test_a_sweep_that_seems_stuck_shows_where_each_thread_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """PERFSWEEP_STACKS_ON_SIGUSR1=1: SIGUSR1 prints every thread's stack and the sweep goes on;
    tests.util.finish fails a test whose sweep outlived its time with them."""
    monkeypatch.setenv(STACKS_ENV, "1")
    tiny = [o for o in TINY if not o.startswith("steps.measure")]
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "device=cpu", "steps.measure=100000000", *tiny], tmp_path
    )
    # the job's row: its process is being started (the database exists earlier, while the CPU peak is timed)
    db = tmp_path / "results.db"
    wait_for(lambda: db.exists() and rows(db, "SELECT id FROM runs"))
    with pytest.raises(pytest.fail.Exception) as failed:
        finish(proc, 3)
    text = str(failed.value)
    assert "still running after 3 s" in text and "(most recent call first)" in text
    main = [block for block in text.split("\n\n") if "in hydra_main" in block]  # the thread that runs the job
    assert len(main) == 1 and "in _run_in_child" in main[0]
    assert proc.returncode == -signal.SIGKILL  # alive after the dump, until finish killed it


def test_a_large_grid_says_how_long_its_checks_take_before_composing_them(tmp_path: Path):
    """From names.LARGE_GRID_POINTS points the first line, after ten are composed, says how many
    will be checked and how long composing them takes at that pace: 6,000 points were silent for
    112 s, 1,000 for 94 s. Said early: here before the grid's half-way point, which is refused,
    and nothing is claimed or written."""
    import re

    from perfsweep.names import LARGE_GRID_POINTS

    half = LARGE_GRID_POINTS // 2
    res = run_perfsweep(["-m", "workers=0,-1", f"seed=range({half})", *TINY], tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 2, res.stderr[-2000:]
    said = (
        rf"perfsweep: checking {2 * half} grid points before any job starts; composing them takes "
        r"~\d+(s|\.\dmin) at this machine's pace"
    )
    assert re.fullmatch(said, lines[0]), lines[0]
    assert f"workers=-1: must be >= 0 [grid point {half + 1}/{2 * half}: workers=-1 seed=0" in lines[1], lines[1]
    assert not (tmp_path / "results.db").exists() and not (tmp_path / "multirun").exists()


def test_no_sweep_estimate_while_a_batch_max_search_is_running_or_to_come(tmp_path: Path, capsys):
    """A search decides after each try whether another comes, so the jobs left are unknown both
    during it and before it (its grid's other jobs run first): no 'sweep ~' then, where a plain
    sweep's progress line has one. A try's count reads as the jobs so far."""
    from perfsweep import launcher
    from perfsweep.config import SweepContext
    from tests.util import tiny_job

    said = {}
    contexts = {
        "plain": SweepContext(n_jobs=3, id=1),
        "before a search": SweepContext(n_jobs=3, id=1, searches=1),
        "a try": SweepContext(n_jobs=3, id=1, searches=1, batch_search_id=1),
    }
    for name, context in contexts.items():
        progress = launcher.ProgressLine(tiny_job(tmp_path, job_num=1, sweep=context))
        progress.header()
        progress.update("measure", 5, 10, 100.0, 1.0)
        said[name] = capsys.readouterr().err
    assert said["plain"].startswith("[2/3] ") and "job ~" in said["plain"] and "sweep ~" in said["plain"]
    assert said["before a search"].startswith("[2/3] ") and "sweep ~" not in said["before a search"]
    assert said["a try"].startswith("[2/3 so far] ") and "sweep ~" not in said["a try"] and "job ~" in said["a try"]
