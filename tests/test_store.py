"""perfsweep.store against real databases: a SQLite file and a throwaway PostgreSQL server.

Every test that takes ``db_url`` runs twice: on a new SQLite file under ``tmp_path`` and on a
new, empty database of the session's PostgreSQL server (``tests/pg.py``; skipped when the
server binaries are not installed). Nothing is mocked.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import re
import sqlite3
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, func, inspect, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from perfsweep import store
from tests.util import run_row

# The session-scoped ``pg_url`` fixture (a no-op when conftest.py already loads tests.pg).
pytest_plugins = ["tests.pg"]

TABLES = {"sweeps", "runs", "steps", "stages", "kernels", "ops", "artifacts", "batch_searches"}
CHILD_TABLES = ("steps", "stages", "kernels", "ops", "artifacts")
ALL_TABLES = ("sweeps", "runs", *CHILD_TABLES)
GiB = 2**30


# --------------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database nobody has used yet: a SQLite file (in a directory connect() must create)
    or a new database on the test PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'not-yet' / 'results.db'}"
    from tests.pg import new_database  # imported here so pytest_plugins loads tests.pg first

    return new_database(request.getfixturevalue("pg_url"))


@pytest.fixture
def engines():
    """``open(url)``: store.connect(url), disposed at teardown (``migrate=False``: make_engine)."""
    opened = []

    def open_(url: str, migrate: bool = True):
        engine = store.connect(url) if migrate else store.make_engine(url)
        opened.append(engine)
        return engine

    yield open_
    for engine in opened:
        engine.dispose()


# ---------------------------------------------------------------------------------- helpers


def head_revision() -> str:
    return ScriptDirectory(str(Path(store.__file__).parent / "migrations")).get_current_head()


def counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in ALL_TABLES}


def snapshot(engine) -> dict[str, list[tuple]]:
    """Every row of every table, in id order."""
    with engine.connect() as conn:
        return {t: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY id"))] for t in ALL_TABLES}


def as_utc(value: datetime) -> datetime:
    """The instant ``value`` names, reading a naive datetime as UTC (what SQLite hands back)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def full_result(sweep_id: int, job_num: int = 3) -> dict[str, Any]:
    """A finished job as the runner reports it: every runs column filled, plus children."""
    started = datetime(2026, 3, 14, 15, 9, 26, 535897, tzinfo=timezone.utc)
    return {
        "sweep_id": sweep_id,
        "job_num": job_num,
        "overrides": "amp=true ckpt=false batch=8 seq_len=256 compile=true workers=2",
        "amp": True,
        "ckpt": False,
        "batch": 8,
        "seq_len": 256,
        "compile": True,
        "workers": 2,
        "amp_dtype": "bf16",
        "model_name": "gpt-small",
        "data_name": "stdlib-tokens",
        "config_json": {
            "model": {
                "name": "gpt-small",
                "n_layer": 12,
                "dropout": 0.1,
                "tie": True,
                "extra": None,
            },
            "grid": [1, 2, 4, 8],
            "lr": 3e-4,
            "big": 2**40 + 7,
            "note": "café ✓ 测试",
        },
        "config_hash": "c0ffee" * 10 + "abcd",
        "status": "ok",
        "error": None,
        "started_at": started,
        "finished_at": started + timedelta(seconds=83, microseconds=250001),
        "duration_s": 83.250001,
        "process_start_ms": 9123.5,
        "setup_ms": 3456.25,
        "after_steps_ms": 4567.125,
        "job_dir": f"/sweeps/2026-03-14/job-{job_num}",
        "run_uid": f"{sweep_id:08x}{job_num:08x}" + "5eed" * 4,
        "pid": 4242,
        "heartbeat_at": started + timedelta(seconds=80),
        "hostname": "gpu-node-07",
        "device_type": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "cpu_count": 16,
        "cpu_affinity": "0-7",
        "cpus_allotted": 8,
        "cuda_visible_devices": "2,3",
        "slurm_job_id": "812_1",
        "nproc": 2,
        "global_batch": 16,
        "tokens_per_s_per_rank": 10114.061728394506,
        "samples_per_s_per_rank": 39.50805362654104,
        "slowest_rank": 1,
        "slowest_rank_step_time_ms_median": 201.75,
        "allreduce_ms_per_step": 3.25,
        "torch_threads": 8,
        "torch_version": "2.5.1+cu124",
        "cuda_version": "12.4",
        "python_version": "3.11.7",
        "git_commit": "5dd1071" + "0" * 33,
        "git_dirty": True,
        "cpu_model": "AMD EPYC 9654 96-Core Processor",
        "cudnn_version": "90100",
        "gpu_driver_version": "550.54.15",
        "gpu_total_memory_bytes": 85_045_231_616,  # > 2**32
        "gpu_compute_capability": "9.0",
        "tf32_matmul": False,
        "tf32_cudnn": True,
        "cudnn_benchmark": False,
        "cuda_alloc_conf": "expandable_segments:True",
        "repeat_index": 2,
        "grid_index": 1,
        "measure_start_step": 5,
        "steady_state": False,
        "timing_mode": "events",
        "step_time_ms_iqr": 2.125,
        "step_time_cv": 0.013956,
        "noisy": False,
        "noisy_rule": "step-time IQR > 10% of the median, or mean more than 10% off the median",
        "measure_wall_ms": 2025.0001,
        "cpu_flops_utilisation": 0.4375,
        "cpu_matmul_flops": 3.2e11,
        "speedup": 1.0625,
        "speedup_ci_lo": 0.998,
        "speedup_ci_hi": 1.125,
        "speedup_basis": "repeats",
        "speedup_verdict": "no measurable difference",
        "baseline_config_hash": "b" * 64,
        "n_params": 124_439_808,
        "n_params_non_embedding": 85_000_000_000,  # > 2**31
        "vocab_size": 50257,
        "vocab_size_padded": 50304,
        "unk_token_share": 0.000123456789,
        "optimizer_fused": False,
        "warmup_steps": 5,
        "measure_steps": 20,
        "first_step_ms": 10234.5678,
        "step_time_ms_median": 101.25,
        "step_time_ms_p10": 99.0001,
        "step_time_ms_p90": 0.1 + 0.2 + 104,  # not representable exactly in decimal
        "step_time_ms_mean": 101.33333333333333,
        "step_time_ms_std": 1.4142135623730951,
        "data_wait_ms_median": 0.015625,
        "data_wait_fraction": 1.5e-4,
        "data_bound": False,
        "batch_search_id": None,  # a reference: tests/test_search.py stores real ones
        "predicted_params_bytes": 2 * GiB + 3,
        "predicted_grads_bytes": 0,
        "predicted_optimizer_bytes": 4 * GiB + 6,
        "predicted_activations_bytes": 30 * GiB + 1,
        "predicted_logits_bytes": 40 * GiB + 7,
        "predicted_slack_bytes": 4 * GiB + 9,
        "predicted_peak_bytes": 76 * GiB + 17,
        "predicted_peak_phase": "backward_start",
        "predicted_peak_error": -0.0375,
        "grad_scaler_final_scale": 32768.0,
        "grad_scaler_skipped_steps": 2,
        "numerics_twin_run_id": 1,
        "loss_max_rel_diff": 0.0123,
        "numerics_diverged_step": 7,
        "numerics_warning": True,
        "tokens_per_s": 20228.123456789012,
        "samples_per_s": 79.01610725308208,
        "final_loss": 3.2188758248682006,
        "nonfinite_loss_steps": 0,
        "flops_per_token": 7.46e8,
        "flops_per_sample": 7.46e8 * 128,
        "flops_method": "formula",
        "model_tflops_per_s": 15.09,
        "mfu": 0.015257836198179979,
        "mfu_peak_flops": 989e12,
        "mfu_compute_dtype": "bf16",
        "gpu_busy_ms": 8.53125,
        "gpu_busy_fraction": 0.3562836,
        "bottleneck": "host",
        "bottleneck_rule": "data if data_wait_fraction > 0.1; else gpu if gpu_busy_fraction >= 0.7; else host",
        "profile_error": "not profiled: the profiled window ran out of memory after the measured steps",
        "peak_mem_bytes": 79 * GiB + 123_457,  # > 2**31 (and > 2**32)
        "peak_allocated_bytes": 71 * GiB + 1,
        "peak_reserved_bytes": 78 * GiB,
        "peak_active_bytes": 70 * GiB + 99,
        "rss_before_train_bytes": 3 * GiB + 5,
        "peak_rss_bytes": 5 * GiB + 17,
        "rss_growth_bytes": 2 * GiB + 12,
        "memory_limit_used_bytes": 300 * 2**20 - 5,
        "start_method": "forkserver",
        "num_alloc_retries": 2,
        "num_ooms": 0,
        "memory_snapshot_path": f"/sweeps/2026-03-14/job-{job_num}/memory.pickle",
        "compile_time_ms": 45678.9,
        "compile_payback_steps": 451.5,
        "n_graphs": 3,
        "n_graph_breaks": 2,
        "n_recompiles": 1,
        "graph_break_reasons": {"builtin print": 1, "data-dependent branch": 1},
        "compile_cache": "isolated",
        "compile_cache_hits": 0,
        "steps": [
            {
                "step": i,
                "phase": "warmup" if i < 2 else "measure",
                "step_time_ms": 100.0 + i / 3,
                "data_wait_ms": 0.01 * i,
                "loss": None if i == 0 else 4.0 - i / 7,
            }
            for i in range(6)
        ],
        "stages": [
            {
                "stage": "forward",
                "cpu_time_ms": 12.5,
                "device_time_ms": 40.25,
                "device_time_source": "cuda_events",
                "calls": 20,
            },
            {
                "stage": "backward",
                "cpu_time_ms": 8.0,
                "device_time_ms": None,
                "device_time_source": "none",
                "calls": 20,
            },
        ],
        "kernels": [
            {"category": "gemm", "ms_per_step": 12.75, "kernels_per_step": 195.0},
            {"category": "memcpy/memset", "ms_per_step": 0.0625, "kernels_per_step": 90.5},
        ],
        "ops": [
            {
                "sort_by": "self_device",
                "rank": 1,
                "name": "aten::mm",
                "calls": 480,
                "self_cpu_ms": 1.5,
                "self_device_ms": 30.125,
                "cpu_total_ms": 2.25,
                "device_total_ms": 30.125,
                "flops": 2**52 + 1,
                "calls_per_step": 240.0,
                "flops_per_step": (2**52 + 1) / 2,
            },
            {
                "sort_by": "self_cpu",
                "rank": 1,
                "name": "aten::copy_ (a very long op name " + "x" * 300 + ")",
                "calls": 7,
                "self_cpu_ms": 0.75,
                "self_device_ms": None,
                "cpu_total_ms": 0.8,
                "device_total_ms": None,
                "flops": None,
                "calls_per_step": 3.5,
                "flops_per_step": None,
            },
        ],
        "artifacts": [
            {
                "kind": "trace",
                "path": f"/sweeps/2026-03-14/job-{job_num}/trace.json",
                "bytes": 5 * GiB + 3,
            },
            {
                "kind": "memory_snapshot",
                "path": f"/sweeps/2026-03-14/job-{job_num}/memory.pickle",
                "bytes": 123,
            },
        ],
    }


def minimal_result(sweep_id: int, **extra: Any) -> dict[str, Any]:
    """Only the NOT NULL columns of runs."""
    return {
        "sweep_id": sweep_id,
        "amp": False,
        "ckpt": True,
        "batch": 1,
        "seq_len": 64,
        "compile": False,
        "workers": 0,
        "amp_dtype": "fp16",
        "model_name": "tiny",
        "data_name": "d",
        "config_json": {"seed": 1},
        "config_hash": "h1",
        "status": "failed",
        **extra,
    }


# --------------------------------------------------------------------------- schema / connect


def test_connect_creates_all_tables_at_alembic_head(db_url, engines):
    engine = engines(db_url)
    insp = inspect(engine)
    assert set(insp.get_table_names()) == TABLES | {"alembic_version"}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head_revision()]
        # the migrations build exactly what the models declare (a column added to a model
        # without a migration shows up here)
        assert compare_metadata(MigrationContext.configure(conn), store.Base.metadata) == []
    assert {c["name"] for c in insp.get_columns("runs")} == set(store.Run.__table__.columns.keys())
    assert {"amp", "ckpt", "tokens_per_s", "peak_mem_bytes"} <= {c["name"] for c in insp.get_columns("runs")}
    assert counts(engine) == dict.fromkeys(ALL_TABLES, 0)


def test_connect_again_is_a_noop_and_keeps_rows(db_url, engines):
    first = engines(db_url)
    sid = store.get_or_create_sweep(first, "/sweeps/a", "a")
    store.save_run(first, full_result(sid))
    before = snapshot(first)
    first.dispose()

    second = engines(db_url)
    store.upgrade(second)  # and once more on the same engine
    with second.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head_revision()]
    assert snapshot(second) == before
    assert counts(second)["runs"] == 1 and counts(second)["steps"] == 6


def test_a_foreign_table_of_our_name_is_refused_at_once_and_unrelated_tables_are_kept(db_url, engines, capsys):
    """Someone else's ``runs`` table: creating the schema failed as "already exists", which the
    upgrade took for another job's migration and retried for 5 s (saying it waited for a lock
    nobody held). Now one line at once, nothing added. A PostgreSQL database holding unrelated
    tables (shared by design) still gets perfsweep's beside them; a SQLite file holding another
    application's tables is that application's, and is left as it is."""
    from perfsweep.upgrade import main as upgrade_main

    raw = engines(db_url, migrate=False)
    if raw.dialect.name == "sqlite":
        Path(raw.url.database).parent.mkdir(parents=True, exist_ok=True)
    with raw.begin() as conn:
        conn.execute(text("CREATE TABLE runs (id INTEGER PRIMARY KEY, note TEXT)"))
        conn.execute(text("INSERT INTO runs (id, note) VALUES (1, 'theirs')"))
    start = time.monotonic()
    with pytest.raises(store.ForeignDatabase, match="holds table runs but no perfsweep schema version"):
        store.connect(db_url)
    assert upgrade_main(["--db", db_url]) == 2
    assert time.monotonic() - start < 3  # no retries
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a perfsweep results database" in err and "waiting" not in err
    assert set(inspect(raw).get_table_names()) == {"runs"}  # nothing added, nothing changed
    with raw.connect() as conn:
        assert conn.execute(text("SELECT id, note FROM runs")).all() == [(1, "theirs")]
        conn.execute(text("DROP TABLE runs"))
        conn.execute(text("CREATE TABLE their_notes (id INTEGER PRIMARY KEY)"))
        conn.commit()
    if raw.dialect.name == "sqlite":
        with pytest.raises(store.ForeignDatabase, match=r"holds another application's tables \(their_notes\)"):
            store.connect(db_url)
        assert upgrade_main(["--db", db_url]) == 2
        assert "perfsweep keeps a file of its own" in capsys.readouterr().err
        assert set(inspect(raw).get_table_names()) == {"their_notes"}
        return
    ours = engines(db_url)
    assert set(inspect(ours).get_table_names()) == TABLES | {"alembic_version", "their_notes"}


def test_a_refused_sqlite_file_of_another_application_is_left_byte_for_byte(tmp_path: Path):
    """The refusal above came after the connection had switched the file to WAL: a refused sweep or
    upgrade still rewrote another application's file (journal_mode delete -> wal)."""
    import hashlib
    import sqlite3

    from perfsweep.upgrade import main as upgrade_main

    path = tmp_path / "theirs.db"
    con = sqlite3.connect(path)  # as their application made it: a rollback journal, not WAL
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, note TEXT)")
    con.execute("INSERT INTO runs (id, note) VALUES (1, 'theirs')")
    con.commit()
    con.close()
    before = hashlib.md5(path.read_bytes()).hexdigest()
    with pytest.raises(store.ForeignDatabase, match="holds table runs but no perfsweep schema version"):
        store.connect(f"sqlite:///{path}", check=True)
    assert upgrade_main(["--db", str(path)]) == 2
    assert hashlib.md5(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]  # no -wal, no -shm left


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("bd07f7e963c5", "its schema version 'bd07f7e963c5' is another application's (its alembic_version table)"),
        ("9999", "its schema revision 9999 is newer than this perfsweep's"),
    ],
)
def test_a_schema_version_that_is_not_perfsweep_s_is_named_not_upgraded(version, said, db_url, engines, capsys):
    """An MLflow file (its own Alembic ``alembic_version``) given as --db: the report said "schema
    revision bd07f7e963c5 is older than this perfsweep's; upgrade it first", and the upgrade
    failed as "No such revision". A newer perfsweep's database read the same. Each is one line
    naming what it is, from every command, and the database is left as it was."""
    from perfsweep.query import main as query_main
    from perfsweep.report.__main__ import main as report_main
    from perfsweep.upgrade import main as upgrade_main

    raw = engines(db_url, migrate=False)
    if raw.dialect.name == "sqlite":
        Path(raw.url.database).parent.mkdir(parents=True, exist_ok=True)
    with raw.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": version})
    with pytest.raises(store.ForeignDatabase, match=re.escape(said)):
        store.connect(db_url)
    from perfsweep.resume import main as resume_main

    for command, argv in (
        (upgrade_main, ["--db", db_url]),
        (report_main, ["--db", db_url]),
        (resume_main, ["1", "--db", db_url]),  # it said "the database has no sweeps yet"
    ):
        assert command(argv) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err and "older" not in err, err
    assert query_main(["select version_num from alembic_version", "--db", db_url]) == 0  # plain SQL still reads it
    assert version in capsys.readouterr().out
    assert set(inspect(raw).get_table_names()) == {"alembic_version"}


def test_a_schema_of_its_own_is_kept_however_libpq_is_told_it(pg_url: str, monkeypatch: pytest.MonkeyPatch):
    """perfsweep in a schema of its own on a shared PostgreSQL database, chosen by libpq's options:
    in the URL beside another option (the key twice: psycopg2 refused the list), or in PGOPTIONS.
    Writes and read-only reads (query, report) land in that schema: the read-only commands' own
    options had replaced both. The refusal's hint adds to options the URL has, never a second key."""
    from tests.pg import new_database

    url = new_database(pg_url)
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('bd07f7e963c5')"))
        conn.execute(text("CREATE SCHEMA perfsweep"))
    timeout = f"{url}?options=-cstatement_timeout%3D60000"
    with pytest.raises(store.ForeignDatabase) as refused:
        store.connect(timeout)
    assert "then add %20-csearch_path%3Dperfsweep to the URL's options= (quoted" in str(refused.value), refused.value
    twice = f"{timeout}&options=-csearch_path%3Dperfsweep"
    assert store.pg_options(twice) == "-cstatement_timeout=60000 -csearch_path=perfsweep"
    store.connect(twice).dispose()
    reader = store.open_existing(twice)
    with reader.connect() as conn:
        shown = conn.exec_driver_sql("SELECT current_schema(), current_setting('statement_timeout')").one()
        assert tuple(shown) == ("perfsweep", "1min"), shown
    reader.dispose()
    monkeypatch.setenv("PGOPTIONS", "-csearch_path=perfsweep")
    assert store.pg_options(url) == "-csearch_path=perfsweep" and store.pg_options(twice).endswith("=perfsweep")
    store.connect(url).dispose()  # at head in perfsweep's schema: not refused for public's version
    reader = store.open_existing(url)
    with reader.connect() as conn:
        assert conn.exec_driver_sql("SELECT current_schema()").scalar_one() == "perfsweep"
    reader.dispose()
    with admin.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM public.alembic_version")).scalar_one() == "bd07f7e963c5"
    admin.dispose()


def test_interrupted_migration_leaves_no_partial_schema(db_url, engines):
    """A job killed half-way through the first migration must not leave some tables behind
    (a later connect() would then fail on "table already exists" forever)."""
    engine = store.make_engine(db_url)
    if db_url.startswith("sqlite"):
        Path(db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True)

    def crash(conn, cursor, statement, *args):
        if re.match(r"\s*CREATE TABLE runs\b", statement):
            raise RuntimeError("simulated crash during the migration")

    event.listen(engine, "before_cursor_execute", crash)
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            store.upgrade(engine)
    finally:
        engine.dispose()
    assert inspect(engines(db_url, migrate=False)).get_table_names() == []  # all or nothing
    assert set(inspect(engines(db_url)).get_table_names()) == TABLES | {"alembic_version"}


def _connect_worker(i: int, url: str, first_started, first_done, barrier, queue) -> None:
    """Job 0 migrates the empty database; jobs 1.. start while it is half-way through (hooks on
    this process's engines force it): the interleaving that concurrent first jobs hit by chance.
    Today they wait for job 0's lock (SQLite's BEGIN IMMEDIATE, PostgreSQL's advisory lock) and
    find the schema at head; the CREATE TABLE hook is for a change that lets one past the lock
    and into a migration of its own, which must then wait for job 0's commit and retry."""
    try:

        def pace(conn, cursor, statement, *args):
            if i == 0 and re.match(r"\s*CREATE TABLE alembic_version\b", statement):
                first_started.set()  # past any migration lock, nothing committed yet
            elif i == 0 and re.match(r"\s*INSERT INTO alembic_version\b", statement):
                time.sleep(0.3)  # the others look for the schema now and find none
            elif (
                i > 0
                and re.match(r"\s*CREATE TABLE alembic_version\b", statement)
                and not first_done.wait(timeout=30)  # ...and create it once job 0 has committed
            ):
                raise AssertionError("job 0 never finished migrating")

        event.listen(Engine, "before_cursor_execute", pace)  # this forked process only
        barrier.wait(timeout=60)
        # a wait that runs out means the interleaving did not happen: the race was not tested
        if i > 0 and not first_started.wait(timeout=30):
            raise AssertionError("job 0 never began migrating")
        engine = store.connect(url)
        if i == 0:
            first_done.set()
        queue.put(("ok", counts(engine)["sweeps"]))
        engine.dispose()
    except BaseException as exc:  # report, never hang the parent
        queue.put(("error", f"job {i}: {exc!r}"))


def _race(target, args: tuple, n: int = 4, n_events: int = 0) -> list:
    """Run ``target(i, *args, *events, barrier, queue)`` for i in range(n), each in a forked
    process; the barrier releases them together. Returns what each put on the queue."""
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    events = [ctx.Event() for _ in range(n_events)]
    procs = [ctx.Process(target=target, args=(i, *args, *events, barrier, queue)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=90) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [msg for kind, msg in results if kind == "error"]
    assert not errors, errors
    return [value for _, value in results]


def test_concurrent_first_connects_on_an_empty_database(db_url, engines, tmp_path, monkeypatch):
    """The first jobs of a sweep start together on a database nobody has migrated yet. A new SQLite
    file is migrated so only where the schema template cannot be made (a cache folder that is a
    file here): otherwise it is a copy, and no migration would race (next test)."""
    if db_url.startswith("sqlite"):
        Path(db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True)
        (tmp_path / "not-a-folder").write_text("")
        monkeypatch.setenv("PERFSWEEP_CACHE_DIR", str(tmp_path / "not-a-folder"))  # the forked jobs inherit it
    assert _race(_connect_worker, (db_url,), n_events=2) == [0, 0, 0, 0]
    engine = engines(db_url, migrate=False)
    assert set(inspect(engine).get_table_names()) == TABLES | {"alembic_version"}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head_revision()]


def _copy_worker(i: int, url: str, barrier, queue) -> None:
    """Open ``url`` (a SQLite file not there yet) as the others do, released together; each links
    its copy of the template into place once all have made one (the barrier again), so that they
    race for the name. Puts the sweeps it finds and whether its link won."""
    import os

    outcome = []
    link = os.link

    def link_when_all_have_copied(src, dst):
        barrier.wait(timeout=60)
        try:
            link(src, dst)
        except FileExistsError:
            outcome.append("lost")
            raise
        outcome.append("won")

    try:
        os.link = link_when_all_have_copied  # this forked process only
        barrier.wait(timeout=60)
        engine = store.connect(url)
        queue.put(("ok", (counts(engine)["sweeps"], *outcome)))
        engine.dispose()
    except BaseException as exc:  # report, never hang the parent
        queue.put(("error", f"job {i}: {exc!r}"))


def test_concurrent_first_connects_share_one_copy_of_the_schema_template(tmp_path: Path):
    """Jobs that find no file at once each copy the template beside it and link their copy into
    place: one link wins, the others find the file there and use it; no copy is left behind."""
    store.connect(store.sqlite_url(tmp_path / "first.db")).dispose()  # the template exists: no migration
    db = tmp_path / "results.db"
    assert sorted(_race(_copy_worker, (store.sqlite_url(db),), n=6)) == [(0, "lost")] * 5 + [(0, "won")]
    assert db.is_file() and not [p.name for p in tmp_path.iterdir() if p.name.startswith(".results.db.")]
    assert _sqlite_schema(db) == _sqlite_schema(tmp_path / "first.db")


def _sqlite_schema(path: Path) -> tuple[list, list, list]:
    """Everything a new results file holds, through sqlite3: its schema, version row, journal mode."""
    con = sqlite3.connect(path)
    try:
        return (
            sorted(con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall(), key=str),
            con.execute("SELECT version_num FROM alembic_version").fetchall(),
            con.execute("PRAGMA journal_mode").fetchall(),
        )
    finally:
        con.close()


def test_the_head_revision_read_from_the_file_names_is_alembics():
    """perfsweep reads its schema's head from the migration files' names, without Alembic: each
    name starts with its revision, each revision follows the one before, and the highest is the
    head Alembic finds by parsing the scripts. A migration named otherwise fails here."""
    scripts = ScriptDirectory(str(Path(store.__file__).parent / "migrations"))
    by_file = {Path(s.path).name: s for s in scripts.walk_revisions()}
    assert by_file and all(store.MIGRATION_FILE.fullmatch(name) for name in by_file), sorted(by_file)
    for name, script in by_file.items():
        number = int(name[:4])
        assert script.revision == f"{number:04d}", name
        assert script.down_revision == (f"{number - 1:04d}" if number > 1 else None), name
    assert store.head_revision() == head_revision() == max(by_file)[:4]


def test_a_database_at_head_is_opened_without_importing_alembic(tmp_path: Path):
    """A sweep, import or resume on a database at the current schema, and every query and report,
    open it without Alembic (160 ms of imports in each command); one that is behind is upgraded
    by Alembic as before."""
    import subprocess
    import sys

    old = tmp_path / "old.db"
    engine = store.make_engine(store.sqlite_url(old))
    with engine.begin() as conn:  # an older perfsweep's database: migrated to 0015 only
        from alembic import command

        cfg = store._alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, f"{int(head_revision()) - 1:04d}")
    engine.dispose()
    store.connect(store.sqlite_url(tmp_path / "current.db")).dispose()
    script = """
import sys
from perfsweep import store
for name in sys.argv[1:]:
    store.connect(store.sqlite_url(name)).dispose()
    store.open_existing(name).dispose()
    print(name, "alembic" in sys.modules)
"""
    res = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "current.db"), str(old)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == [str(tmp_path / "current.db"), "False", str(old), "True"]
    assert _sqlite_schema(old)[1] == [(head_revision(),)]


def test_the_schema_version_is_read_past_another_writers_lock(tmp_path: Path):
    """Whether a file is at head is a read of its last commit: it took perfsweep's write lock, and
    with another process holding one (a sqlite3 shell inside BEGIN IMMEDIATE) waited the whole
    busy timeout (30 s) before upgrade's own tries waited again."""
    db = tmp_path / "results.db"
    store.connect(store.sqlite_url(db)).dispose()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        engine = store.make_engine(store.sqlite_url(db))
        started = time.monotonic()
        assert store._at_head(engine)
        assert time.monotonic() - started < 5
        engine.dispose()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_new_sqlite_file_is_the_migrated_schema_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A new results file is a copy of one migrated once for this schema (in the user's cache,
    named by the revision, the migrations' text and the library versions): the same tables,
    indexes, version and journal mode as a file taken through every migration, in a few ms. The
    template is made once, not per file; one that is not a SQLite file is not copied."""
    monkeypatch.setenv("PERFSWEEP_CACHE_DIR", str(tmp_path / "cache"))
    migrated = store.make_engine(store.sqlite_url(tmp_path / "migrated.db"))
    store.upgrade(migrated)
    migrated.dispose()
    store.connect(store.sqlite_url(tmp_path / "a.db"), check=True).dispose()
    (template,) = (tmp_path / "cache" / "schema").iterdir()
    assert template.name == f"results-{store.schema_key()}.db" and template.name.startswith(
        f"results-{head_revision()}-"
    )
    made = template.stat().st_mtime_ns
    store.connect(store.sqlite_url(tmp_path / "b.db")).dispose()
    assert template.stat().st_mtime_ns == made and len(list(template.parent.iterdir())) == 1
    assert (
        _sqlite_schema(tmp_path / "a.db")
        == _sqlite_schema(tmp_path / "b.db")
        == _sqlite_schema(tmp_path / "migrated.db")
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "b.db", "cache", "migrated.db"]  # no copy left over
    template.write_bytes(b"not a database")  # damaged by hand: migrated as before, not copied
    store.connect(store.sqlite_url(tmp_path / "c.db"), check=True).dispose()
    assert _sqlite_schema(tmp_path / "c.db") == _sqlite_schema(tmp_path / "migrated.db")
    # truncated with its header whole (a disk that filled): the copy is checked before it is linked,
    # the file is migrated instead (a copy had been refused as malformed, every sweep) and the template made again
    store.connect(store.sqlite_url(tmp_path / "d.db")).dispose()
    template.write_bytes(template.read_bytes()[:4096])
    store.connect(store.sqlite_url(tmp_path / "e.db"), check=True).dispose()
    assert _sqlite_schema(tmp_path / "e.db") == _sqlite_schema(tmp_path / "migrated.db")
    assert not template.exists()
    store.connect(store.sqlite_url(tmp_path / "f.db")).dispose()
    assert template.stat().st_size > 4096


def test_a_cache_that_cannot_be_written_leaves_a_new_file_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("PERFSWEEP_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    store.connect(store.sqlite_url(tmp_path / "new.db"), check=True).dispose()
    assert _sqlite_schema(tmp_path / "new.db")[1] == [(head_revision(),)]


# ------------------------------------------------------------------------------------ sweeps


def test_get_or_create_sweep_same_dir_same_id_other_dir_other_id(db_url, engines):
    engine = engines(db_url)
    a = store.get_or_create_sweep(
        engine, "/sweeps/a", "a", command="perfsweep -m amp=true,false", n_jobs=4, hostname="h1"
    )
    assert store.get_or_create_sweep(engine, "/sweeps/a", "a") == a
    # asking again with other fields finds the existing row, it does not overwrite it
    assert store.get_or_create_sweep(engine, "/sweeps/a", "other", n_jobs=99) == a
    b = store.get_or_create_sweep(engine, "/sweeps/b", "a")  # same name, other dir: other sweep
    assert b != a
    with Session(engine) as s:
        rows = {sw.sweep_dir: sw for sw in s.scalars(select(store.Sweep))}
    assert set(rows) == {"/sweeps/a", "/sweeps/b"}
    sa = rows["/sweeps/a"]
    assert (sa.id, sa.name, sa.command, sa.n_jobs, sa.hostname) == (
        a,
        "a",
        "perfsweep -m amp=true,false",
        4,
        "h1",
    )
    assert abs(as_utc(sa.created_at) - datetime.now(timezone.utc)) < timedelta(minutes=5)


def _sweep_worker(_i: int, url: str, sweep_dirs: list[str], barrier, queue) -> None:
    try:
        engine = store.connect(url)
        ids = []
        for sweep_dir in sweep_dirs:
            barrier.wait(timeout=60)  # all processes ask for the same new sweep at once
            ids.append(store.get_or_create_sweep(engine, sweep_dir, "race", n_jobs=4))
        engine.dispose()
        queue.put(("ok", ids))
    except BaseException as exc:
        queue.put(("error", repr(exc)))


def test_get_or_create_sweep_concurrent_processes_make_one_row(db_url, engines):
    engine = engines(db_url)
    engine.dispose()  # nothing open across fork
    dirs = [f"/sweeps/race-{i}" for i in range(3)]
    per_process = _race(_sweep_worker, (db_url, dirs))
    for i in range(len(dirs)):
        assert len({ids[i] for ids in per_process}) == 1, per_process  # everyone got the same id
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT sweep_dir, id FROM sweeps ORDER BY sweep_dir")).all()
    assert [tuple(r) for r in rows] == [(d, per_process[0][i]) for i, d in enumerate(dirs)]


# ------------------------------------------------------------------------------------- runs


def test_save_run_round_trip(db_url, engines):
    writer = engines(db_url)
    sid = store.get_or_create_sweep(writer, "/sweeps/rt", "rt")
    result = full_result(sid)
    missing = set(store.Run.__table__.columns.keys()) - set(result) - {"id"}
    assert not missing, f"full_result() does not exercise these runs columns: {sorted(missing)}"
    rid = store.save_run(writer, result)
    assert isinstance(rid, int)

    reader = engines(db_url, migrate=False)  # fresh engine: nothing cached
    with Session(reader) as s:
        run = s.get(store.Run, rid)
        for key, want in result.items():
            if key in CHILD_TABLES:
                continue
            got = getattr(run, key)
            if isinstance(want, datetime):
                assert as_utc(got) == want, key
            else:
                assert got == want, key
                assert type(got) is type(want), (key, type(got))  # bools stay bools, ints ints
        assert run.sweep.sweep_dir == "/sweeps/rt"
        for table in CHILD_TABLES:
            got_rows = sorted(getattr(run, table), key=lambda row: row.id)
            assert [row.run_id for row in got_rows] == [rid] * len(result[table])
            assert [
                {k: getattr(row, k) for k in want} for row, want in zip(got_rows, result[table], strict=True)
            ] == result[table], table
    assert counts(reader) == {
        "sweeps": 1,
        "runs": 1,
        "steps": 6,
        "stages": 2,
        "kernels": 2,
        "ops": 2,
        "artifacts": 2,
    }


def test_save_run_keeps_timezone_aware_datetimes(db_url, engines):
    engine = engines(db_url)
    sid = store.get_or_create_sweep(engine, "/sweeps/tz", "tz")
    ist = timezone(timedelta(hours=5, minutes=30))
    started = datetime(2026, 7, 1, 9, 0, 0, 250000, tzinfo=ist)
    finished = "2026-07-01T03:31:00.500000+00:00"  # save_run parses ISO strings, as isoformat() writes them
    rid = store.save_run(engine, minimal_result(sid, started_at=started, finished_at=finished))
    with Session(engines(db_url, migrate=False)) as s:
        run = s.get(store.Run, rid)
        assert run.started_at.tzinfo is not None and run.finished_at.tzinfo is not None
        assert run.started_at == started  # the same instant (03:30:00.25 UTC)
        assert run.finished_at - run.started_at == timedelta(seconds=60.25)
        sweep = s.get(store.Sweep, sid)
        assert sweep.created_at.tzinfo is not None


def test_a_nan_is_null_on_every_backend_and_infinities_are_kept(db_url, engines):
    """SQLite has no NaN and stores NULL; PostgreSQL would keep it. A blown-up run must read the
    same wherever it was stored (``final_loss IS NULL``, the audit's NULL loss), so every float
    column stores a NaN as NULL; infinities, which both keep, stay."""
    import numpy as np

    engine = engines(db_url)
    sid = store.get_or_create_sweep(engine, "/sweeps/nan", "nan")
    steps = [
        {"step": i, "phase": "measure", "step_time_ms": 5.0, "data_wait_ms": 0.0, "loss": loss}
        for i, loss in enumerate([2.5, math.nan, math.inf, np.float32("nan")])
    ]
    nan_fields = {"final_loss": math.nan, "step_time_cv": np.float64("nan"), "loss_max_rel_diff": math.inf}
    rid = store.save_run(engine, minimal_result(sid, status="ok", nonfinite_loss_steps=3, steps=steps, **nan_fields))
    with engines(db_url, migrate=False).connect() as c:
        losses = c.execute(text("SELECT loss FROM steps WHERE run_id = :r ORDER BY step"), {"r": rid}).scalars().all()
        assert losses == [2.5, None, math.inf, None]
        row = c.execute(text("SELECT final_loss, step_time_cv, loss_max_rel_diff FROM runs WHERE id = :r"), {"r": rid})
        assert tuple(row.one()) == (None, None, math.inf)
        blown_up = "SELECT COUNT(*) FROM runs WHERE final_loss IS NULL AND nonfinite_loss_steps > 0"
        assert c.execute(text(blown_up)).scalar() == 1


def test_upgrade_counts_the_nonfinite_losses_of_rows_stored_before_0013(db_url, engines):
    """Rows stored at schema 0013's predecessor: PostgreSQL kept their NaN, and no row has a
    count, so a blown-up training read as clean. The upgrade makes every NaN NULL and counts an
    ok run's NaN or infinite measured losses from its steps, warned about as the audit does now;
    a run it cannot count stays NULL. Another application's table in the same database, and a NOT
    NULL column (NULL would be refused and block every later connect), keep their NaN."""
    from alembic import command

    if db_url.startswith("sqlite:///"):
        Path(db_url.removeprefix("sqlite:///")).parent.mkdir()
    engine = engines(db_url, migrate=False)
    cfg = store._alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0013")
    sid = store.get_or_create_sweep(engine, "/sweeps/old", "old")
    meta = sa.MetaData()
    with engine.begin() as conn:  # reflected tables: plain floats, so PostgreSQL keeps a NaN as perfsweep once did
        runs, steps = (sa.Table(t, meta, autoload_with=conn) for t in ("runs", "steps"))
        conn.execute(text("CREATE TABLE other_app (id INTEGER PRIMARY KEY, reading FLOAT)"))
        conn.execute(text("INSERT INTO other_app VALUES (1, :nan)"), {"nan": math.nan})

        def run(losses: list[tuple[str, float]] | None, **kw) -> int:
            row = {k: v for k, v in run_row(sid, **kw).items() if k in runs.c}
            rid = conn.execute(runs.insert().values(row)).inserted_primary_key[0]
            for i, (phase, loss) in enumerate(losses or []):
                conn.execute(
                    steps.insert().values(
                        run_id=rid, step=i, phase=phase, step_time_ms=5.0, data_wait_ms=0.0, loss=loss
                    )
                )
            return rid

        blew_up = run(
            [("warmup", math.nan), ("measure", 2.5), ("measure", math.nan), ("measure", math.inf)],
            final_loss=math.inf,
            step_time_cv=math.nan,
        )
        clean = run([("warmup", 3.0), ("measure", 2.5), ("measure", 2.4)], final_loss=2.4)
        warmup_only_nan = run([("warmup", math.nan), ("measure", 2.5)], final_loss=2.5)
        no_steps = run(None, final_loss=math.nan)
        failed = run([("measure", math.nan)], status="failed")
        counted = run([("measure", 2.5)], nonfinite_loss_steps=7)  # a count already there is not redone
        audited = run([("measure", math.nan)], numerics_warning=False)  # the audit skipped its NULL loss
        not_null = run([("measure", 2.5)])
        if engine.dialect.name == "postgresql":  # SQLite would store NULL, which NOT NULL refuses
            nan_step = {"step_time_ms": math.nan, "data_wait_ms": 0.0, "loss": 2.5}
            conn.execute(steps.insert().values(run_id=not_null, step=1, phase="warmup", **nan_step))
    engines(db_url)  # perfsweep opens it: upgrade to head
    with engine.connect() as c:
        got = dict(c.execute(text("SELECT id, nonfinite_loss_steps FROM runs")).all())
        assert got == {
            **{blew_up: 2, clean: 0, warmup_only_nan: 0, no_steps: None, failed: None, counted: 7},
            **{audited: 1, not_null: 0},
        }
        warned = c.execute(text("SELECT id FROM runs WHERE numerics_warning")).scalars().all()
        assert sorted(warned) == sorted([blew_up, counted, audited])
        if engine.dialect.name == "postgresql":  # SQLite has no NaN
            assert math.isnan(c.execute(text("SELECT reading FROM other_app")).scalar())
            kept = text("SELECT step_time_ms FROM steps WHERE run_id = :r AND step = 1")
            assert math.isnan(c.execute(kept, {"r": not_null}).scalar())
        floats = [
            *c.execute(text("SELECT loss FROM steps")).scalars(),  # loss is nullable: its NaN went
            *c.execute(text("SELECT step_time_cv FROM runs")).scalars(),
        ]
        assert not any(isinstance(x, float) and math.isnan(x) for x in floats)
        assert c.execute(text("SELECT COUNT(*) FROM steps WHERE loss IS NULL")).scalar() == 5
        row = c.execute(text("SELECT final_loss, step_time_cv FROM runs WHERE id = :r"), {"r": blew_up}).one()
        assert tuple(row) == (math.inf, None)


def test_an_infinite_or_nan_setting_is_stored_as_json_every_reader_parses(db_url, engines):
    """Python writes inf as the bare word Infinity, which is not JSON: PostgreSQL refused the row
    (a factory argument ``max_norm=inf`` lost the run's database write) and SQLite's json_extract
    called it malformed. Such a value is stored as the string "inf", "-inf" or "nan"."""
    engine = engines(db_url)
    sid = store.get_or_create_sweep(engine, "/sweeps/inf", "inf")
    config = {"model": {"args": {"max_norm": math.inf, "floor": -math.inf}}, "betas": [0.9, math.nan], "lr": 3e-4}
    rid = store.save_run(engine, minimal_result(sid, config_json=config, graph_break_reasons={"ratio": math.inf}))

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} is not JSON")

    with engines(db_url, migrate=False).connect() as c:
        raw = c.execute(text("SELECT config_json, graph_break_reasons FROM runs WHERE id = :r"), {"r": rid}).one()
        stored = [json.loads(v, parse_constant=refuse) if isinstance(v, str) else v for v in raw]
        assert stored == [
            {"model": {"args": {"max_norm": "inf", "floor": "-inf"}}, "betas": [0.9, "nan"], "lr": 3e-4},
            {"ratio": "inf"},
        ]
        extract = (
            "SELECT json_extract(config_json, '$.model.args.max_norm') FROM runs WHERE id = :r"
            if db_url.startswith("sqlite")
            else "SELECT config_json::jsonb #>> '{model,args,max_norm}' FROM runs WHERE id = :r"
        )
        assert float(c.execute(text(extract), {"r": rid}).scalar()) == math.inf


def test_a_json_column_left_out_stays_sql_null(db_url, engines):
    """graph_break_reasons of a running or eager run is SQL NULL, as it was with plain JSON
    (a TypeDecorator does not inherit JSON's should_evaluate_none: it wrote JSON 'null')."""
    engine = engines(db_url)
    sid = store.get_or_create_sweep(engine, "/sweeps/null", "null")
    row = minimal_result(sid)
    row.pop("status")
    rid = store.begin_run(engine, row)
    store.save_run(engine, {**minimal_result(sid), "status": "ok", "graph_break_reasons": None}, run_id=rid)
    with engine.connect() as c:
        assert c.execute(text("SELECT COUNT(*) FROM runs WHERE graph_break_reasons IS NULL")).scalar() == 1


def test_save_run_unknown_field_raises_and_writes_nothing(db_url, engines):
    engine = engines(db_url)
    sid = store.get_or_create_sweep(engine, "/sweeps/u", "u")
    store.save_run(engine, minimal_result(sid))
    before = snapshot(engine)

    bad = full_result(sid)
    bad["tokens_per_sec"] = 1.0  # a typo of tokens_per_s
    with pytest.raises(ValueError, match="tokens_per_sec"):
        store.save_run(engine, bad)
    assert snapshot(engine) == before

    bad_child = full_result(sid)
    bad_child["steps"][-1]["gpu_ms"] = 3.0  # an unknown field in a child row
    with pytest.raises((TypeError, ValueError), match="gpu_ms"):
        store.save_run(engine, bad_child)
    assert snapshot(engine) == before


@pytest.mark.parametrize("breakage", ["run_not_null", "child_not_null", "missing_sweep"])
def test_failed_save_rolls_back_everything(db_url, engines, breakage):
    engine = engines(db_url)
    sid = store.get_or_create_sweep(engine, "/sweeps/f", "f")
    store.save_run(engine, minimal_result(sid))
    before = snapshot(engine)

    bad = full_result(sid)
    if breakage == "run_not_null":
        bad["status"] = None
    elif breakage == "child_not_null":  # the run row and earlier children were already sent
        bad["artifacts"][-1]["bytes"] = None
    else:  # foreign key (SQLite enforces it only with PRAGMA foreign_keys=ON)
        bad["sweep_id"] = sid + 1000
    with pytest.raises(IntegrityError):
        store.save_run(engine, bad)
    assert snapshot(engine) == before  # no run row, no orphan children

    rid = store.save_run(engine, full_result(sid))  # the engine is still usable afterwards
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM steps WHERE run_id = :r"), {"r": rid}).scalar_one() == 6
    assert counts(engine)["runs"] == 2


def test_reopen_and_add_a_new_sweep_loses_nothing(db_url, engines):
    first = engines(db_url)
    old = store.get_or_create_sweep(first, "/sweeps/monday", "monday", n_jobs=2)
    for job in range(2):
        store.save_run(first, full_result(old, job_num=job))
    store.save_run(first, minimal_result(old, job_num=2, error="CUDA out of memory", status="oom"))
    before = snapshot(first)
    first.dispose()

    second = engines(db_url)  # a later sweep, a new process
    new = store.get_or_create_sweep(second, "/sweeps/tuesday", "tuesday")
    assert new != old
    assert store.get_or_create_sweep(second, "/sweeps/monday", "monday") == old
    store.save_run(second, full_result(new, job_num=0))

    after = snapshot(second)
    for table in ALL_TABLES:
        assert after[table][: len(before[table])] == before[table], table  # old rows untouched
    assert counts(second) == {
        "sweeps": 2,
        "runs": 4,
        "steps": 18,
        "stages": 6,
        "kernels": 6,
        "ops": 6,
        "artifacts": 6,
    }
    with Session(second) as s:
        per_sweep = dict(s.execute(select(store.Run.sweep_id, func.count()).group_by(store.Run.sweep_id)).all())
    assert per_sweep == {old: 3, new: 1}


def test_plain_sql_question_needs_no_join(db_url, engines):
    engine = engines(db_url)
    sid = store.get_or_create_sweep(engine, "/sweeps/q", "q")
    store.save_run(engine, full_result(sid))
    store.save_run(engine, minimal_result(sid))

    raw = engine.raw_connection()  # the DB-API connection: plain SQL, no SQLAlchemy types
    try:
        cur = raw.cursor()
        cur.execute("SELECT amp, ckpt, tokens_per_s, peak_mem_bytes FROM runs ORDER BY id")
        rows = cur.fetchall()
    finally:
        raw.close()
    (amp, ckpt, tps, peak), (amp2, ckpt2, tps2, peak2) = rows
    assert (bool(amp), bool(ckpt), tps, peak) == (
        True,
        False,
        20228.123456789012,
        79 * GiB + 123_457,
    )
    assert (bool(amp2), bool(ckpt2), tps2, peak2) == (False, True, None, None)


# ------------------------------------------------------------------------------ SQLite only


def test_sqlite_wal_mode_and_busy_timeout(tmp_path, engines):
    path = tmp_path / "results.db"
    url = store.default_url(tmp_path)
    assert url == f"sqlite:///{path.resolve()}"
    engines(url).dispose()

    engine = engines(url, migrate=False)  # a fresh engine, a fresh connection
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() >= 5000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
    # WAL is a property of the file: a plain sqlite3 connection (sqlite3 CLI, pandas) sees it too
    plain = sqlite3.connect(path)
    try:
        assert plain.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        plain.close()


def test_a_sqlite_lock_wait_ends_at_its_timeout_and_a_table_lock_fails_at_once(tmp_path, monkeypatch):
    """A transaction waits for another writer's lock in 100 ms slices (store._sqlite_begin, so a
    stop comes within one) up to the busy timeout, then fails wrapped as SQLAlchemy's error. A
    shared cache's table lock (SQLITE_LOCKED, "database table is locked") is no such wait: it
    failed at once before the slices, and retrying it in them spun a core until the timeout."""
    monkeypatch.setattr(store, "SQLITE_BUSY_TIMEOUT_MS", 1500)
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    engine = store.make_engine(f"sqlite:///{db}")
    try:
        started, cpu = time.monotonic(), time.process_time()
        with pytest.raises(sa.exc.OperationalError, match="database is locked"), engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        assert 1.4 < time.monotonic() - started < 5 and time.process_time() - cpu < 0.5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with engine.connect() as conn:  # the slices' busy timeout is put back on the pooled connection
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == 1500
    engine.dispose()

    shared = f"sqlite:///file:{tmp_path}/shared.db?cache=shared&uri=true"
    first, second = store.make_engine(shared), store.make_engine(shared)
    with first.connect() as a:
        a.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        a.commit()
        a.exec_driver_sql("INSERT INTO t VALUES (1)")  # a write transaction holds t's table lock
        started, cpu = time.monotonic(), time.process_time()
        with pytest.raises(sa.exc.OperationalError, match="locked"), second.connect() as b:
            b.exec_driver_sql("SELECT x FROM t")
        assert time.monotonic() - started < 1.0 and time.process_time() - cpu < 0.5
    first.dispose()
    second.dispose()


def test_waiting_for_the_database_says_ctrl_c_stops_it_unless_a_stop_is_held(capsys):
    """The line a long wait for the database prints: "(Ctrl-C stops it)", but where the wait is
    inside results being stored (interrupts.held), where Ctrl-C waits for them, nothing of it."""
    from perfsweep import interrupts
    from perfsweep.cli import waiting_for_database

    with waiting_for_database("sqlite:///x.db", after_s=0.05):
        time.sleep(0.3)
    assert capsys.readouterr().err.rstrip().endswith("once it is free (Ctrl-C stops it)")
    with interrupts.held(), waiting_for_database("sqlite:///x.db", after_s=0.05):
        time.sleep(0.3)
    assert capsys.readouterr().err.rstrip().endswith("once it is free")


def test_a_postgresql_server_that_never_answers_is_given_up_at_connect_timeout():
    """perfsweep's psycopg2 wait callback (store._wait_stoppable, for a stoppable lock wait) makes
    psycopg2 connect asynchronously, where libpq applies no connect_timeout: a server that
    accepted and never answered was waited for without end. The URL's timeout holds again."""
    import socket

    pytest.importorskip("psycopg2")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        url = f"postgresql+psycopg2://u@127.0.0.1:{silent.getsockname()[1]}/db?connect_timeout=2"
        engine = store.make_engine(url)
        started = time.monotonic()
        with pytest.raises(sa.exc.OperationalError, match=r"timeout expired \(connect_timeout=2 s\)"):
            engine.connect()
        assert 1.9 < time.monotonic() - started < 6
        engine.dispose()
    finally:
        silent.close()


def old_h100_db(tmp_path: Path) -> Path:
    """A copy of the H100 fixture database (tests/fixtures/h100, schema 0001) to upgrade."""
    import shutil

    db = tmp_path / "old.db"
    shutil.copy(Path(__file__).parent / "fixtures" / "h100" / "results-fp16-seed-snapshot-gpt2.db", db)
    return db


def test_upgrade_fills_per_step_operator_columns_of_old_rows(tmp_path: Path):
    """The H100 database (schema 0001) upgraded: each old ops row gets calls and FLOPs per step,
    its window totals divided by its run's profile.active; the totals themselves are unchanged."""
    import sqlite3

    db = old_h100_db(tmp_path)
    con = sqlite3.connect(db)
    before = con.execute("SELECT id, calls, flops FROM ops ORDER BY id").fetchall()
    con.close()
    store.connect(f"sqlite:///{db}").dispose()
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT o.id, o.calls, o.flops, o.calls_per_step, o.flops_per_step, "
        "json_extract(r.config_json, '$.profile.active') FROM ops o JOIN runs r ON r.id = o.run_id "
        "ORDER BY o.id"
    ).fetchall()
    con.close()
    assert len(rows) == len(before) > 0
    assert [r[:3] for r in rows] == before
    for _, calls, flops, calls_per_step, flops_per_step, active in rows:
        assert calls_per_step == pytest.approx(calls / active)
        assert (flops_per_step is None) if flops is None else flops_per_step == pytest.approx(flops / active)


def test_upgrade_to_provenance_fills_git_dirty_and_changes_no_value(tmp_path: Path):
    """Schema 0005 on an old database: the new columns exist, git_dirty is read off the old
    "-dirty" suffix, and every value stored before is unchanged."""
    import sqlite3

    db = old_h100_db(tmp_path)
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET git_commit = 'abc123-dirty' WHERE id = (SELECT MIN(id) FROM runs)")
    con.commit()
    before = con.execute("SELECT * FROM runs ORDER BY id").fetchall()
    old_columns = [d[1] for d in con.execute("PRAGMA table_info(runs)")]
    con.close()
    store.connect(f"sqlite:///{db}").dispose()
    con = sqlite3.connect(db)
    after = con.execute(f"SELECT {', '.join(old_columns)} FROM runs ORDER BY id").fetchall()
    dirty = con.execute("SELECT git_commit, git_dirty FROM runs ORDER BY id").fetchall()
    new_columns = {d[1] for d in con.execute("PRAGMA table_info(runs)")} - set(old_columns)
    con.close()
    assert after == before
    assert {"git_dirty", "cpu_model", "gpu_driver_version", "tf32_matmul", "cuda_alloc_conf"} <= new_columns
    for commit, flag in dirty:
        assert flag == (None if commit is None else int(commit.endswith("-dirty")))
    assert any(flag == 1 for _, flag in dirty)


def test_upgrade_to_statistics_derives_spread_of_old_rows_from_their_steps(tmp_path: Path):
    """Schema 0006 on the H100 database: IQR, CV, noisy and the window time of each old run come
    from its stored measured steps (numpy here), timing_mode is sync, steady_state stays null."""
    import sqlite3

    import numpy as np

    db = old_h100_db(tmp_path)
    store.connect(f"sqlite:///{db}").dispose()
    con = sqlite3.connect(db)
    runs = con.execute(
        "SELECT id, step_time_ms_iqr, step_time_cv, noisy, measure_wall_ms, timing_mode, steady_state, "
        "measure_start_step, warmup_steps FROM runs WHERE status = 'ok'"
    ).fetchall()
    checked = 0
    for run_id, iqr, cv, noisy, wall, mode, steady, start, warmup in runs:
        t = [
            r[0]
            for r in con.execute("SELECT step_time_ms FROM steps WHERE run_id = ? AND phase = 'measure'", (run_id,))
        ]
        assert (mode, steady, start) == ("sync", None, warmup)
        if not t:
            continue
        q25, q75 = np.percentile(t, [25, 75])
        assert iqr == pytest.approx(q75 - q25) and wall == pytest.approx(sum(t))
        assert cv == pytest.approx(np.std(t, ddof=1) / np.mean(t))
        assert noisy == int((q75 - q25) / np.median(t) > 0.10)
        checked += 1
    con.close()
    assert checked >= 6


def test_upgrade_to_noisy_rule_names_the_iqr_rule_on_old_rows_and_keeps_their_flags(tmp_path: Path):
    """Schema 0012 on the H100 database: the flags stored by the IQR rule are not recomputed by the
    rule that also judges the mean; each judged row says which rule it had, unjudged rows stay null."""
    import sqlite3

    from alembic import command

    db = old_h100_db(tmp_path)
    engine = create_engine(f"sqlite:///{db}")
    cfg = store._alembic_config()
    with engine.begin() as conn:  # the H100 rows as schema 0011 left them
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0011")
    con = sqlite3.connect(db)
    before = con.execute("SELECT id, noisy FROM runs ORDER BY id").fetchall()
    con.execute("UPDATE runs SET noisy = 1 WHERE id = 2")  # a flag the IQR rule set, whatever today's says
    con.commit()
    con.close()
    store.connect(f"sqlite:///{db}").dispose()
    engine.dispose()
    con = sqlite3.connect(db)
    after = con.execute("SELECT id, noisy, noisy_rule FROM runs ORDER BY id").fetchall()
    con.close()
    assert [(i, 1 if i == 2 else n) for i, n in before] == [(i, n) for i, n, _ in after]
    assert sum(n is not None for _, n, _ in after) >= 6
    assert all(rule == ("step-time IQR > 10% of the median" if n is not None else None) for _, n, rule in after)


def test_upgrade_to_any_model_keeps_every_row_and_lets_seq_len_be_null(tmp_path: Path):
    """Schema 0007 on the H100 database: SQLite copies ``runs`` to make seq_len nullable (with its
    child rows' references intact), old rows get flops_method 'formula' and FLOPs per sample =
    per token x seq_len, and a samples model's row (seq_len null) can then be stored."""
    import sqlite3

    db = old_h100_db(tmp_path)
    con = sqlite3.connect(db)
    before = con.execute("SELECT id, seq_len, flops_per_token, tokens_per_s FROM runs ORDER BY id").fetchall()
    children = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("steps", "stages", "ops")}
    con.close()
    engine = store.connect(f"sqlite:///{db}")
    con = sqlite3.connect(db)
    after = con.execute("SELECT id, seq_len, flops_per_token, tokens_per_s FROM runs ORDER BY id").fetchall()
    assert after == before and len(before) >= 6
    assert {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in children} == children
    assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    for per_token, seq_len, per_sample, method in con.execute(
        "SELECT flops_per_token, seq_len, flops_per_sample, flops_method FROM runs"
    ):
        if per_token is None:
            assert (per_sample, method) == (None, None)
        else:
            assert per_sample == pytest.approx(per_token * seq_len) and method == "formula"
    nullable = {r[1]: not r[3] for r in con.execute("PRAGMA table_info(runs)")}
    con.close()
    assert nullable["seq_len"]
    sid = store.get_or_create_sweep(engine, "/sweeps/cnn", "cnn")
    rid = store.save_run(engine, run_row(sid, seq_len=None, tokens_per_s=None, samples_per_s=120.0))
    with store.session(engine) as s:
        row = s.get(store.Run, rid)
        assert (row.seq_len, row.tokens_per_s, row.samples_per_s) == (None, None, 120.0)
    engine.dispose()


def _upgraded_h100(tmp_path: Path, table: str) -> tuple[list[tuple], list]:
    """``table``'s rows of the shared H100 database (an older schema) before and after perfsweep
    upgrades it to head: (plain tuples, sqlite3.Row objects), in id order; every row still there
    with the values of the columns it had."""
    import sqlite3

    db = old_h100_db(tmp_path)
    con = sqlite3.connect(db)
    before = con.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    con.close()
    store.connect(f"sqlite:///{db}").dispose()
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    after = con.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    con.close()
    assert len(after) == len(before)
    for old, new in zip(before, after, strict=True):
        assert tuple(new)[: len(old)] == tuple(old)  # the columns it had, in place and unchanged
    return before, after


def test_upgrade_to_the_memory_ledger_adds_columns_and_the_data_bound_flag(tmp_path: Path):
    """Schema 0008 on the H100 database: every row and child row kept, no stored value changed,
    data_bound from the stored data_wait_fraction, the ledger and audit null (never predicted)."""
    _, after = _upgraded_h100(tmp_path, "runs")
    assert len(after) >= 6
    for new in after:
        assert new["data_bound"] == (
            None if new["data_wait_fraction"] is None else int(new["data_wait_fraction"] > 0.1)
        )
        assert (new["predicted_peak_bytes"], new["numerics_warning"]) == (None, None)


def test_upgrade_to_scale_out_keeps_rows_and_fills_global_batch(tmp_path: Path):
    """Schema 0009 on the H100 database: every row kept with its values, global_batch = batch
    (old runs were single processes: nproc stays null), sweeps ran one job at a time."""
    _, runs = _upgraded_h100(tmp_path, "runs")
    assert len(runs) >= 6
    for new in runs:
        assert (new["global_batch"], new["nproc"], new["slurm_job_id"]) == (new["batch"], None, None)
    (tmp_path / "again").mkdir()
    _, sweeps = _upgraded_h100(tmp_path / "again", "sweeps")
    assert {s["parallel"] for s in sweeps} == {1} and {s["hydra_launcher"] for s in sweeps} == {None}


def test_a_sweep_whose_database_folder_is_missing_says_it_made_it(tmp_path: Path, capsys: pytest.CaptureFixture):
    """db.url in a folder that does not exist: the folder and a new database are made, as before,
    but said in one line (a typo in the path scattered results into a database of its own, unsaid);
    an existing folder says nothing."""
    from perfsweep import preflight
    from perfsweep.names import SWEEP_MARKER

    url = f"sqlite:///{tmp_path / 'typo' / 'nested' / 'results.db'}"
    claim = preflight.claim_folder(tmp_path / "sweep", "hydra.sweep.dir")
    sweep_id, _ = preflight.reserve_sweep(url, str(tmp_path / "sweep"), "s", claim, command="perfsweep -m", n_jobs=1)
    assert sweep_id == 1 and (tmp_path / "typo" / "nested" / "results.db").is_file()
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"perfsweep: db.url's folder {tmp_path / 'typo' / 'nested'} did not exist; created it with a new database"
    )
    claim = preflight.claim_folder(tmp_path / "sweep2", "hydra.sweep.dir")
    preflight.reserve_sweep(url, str(tmp_path / "sweep2"), "s", claim, command="perfsweep -m", n_jobs=1)
    assert claim.kept and (tmp_path / "sweep2" / SWEEP_MARKER).is_file()  # the row holds the folder now
    assert capsys.readouterr().err == ""


def test_a_sweep_closed_late_ends_at_its_last_run_and_counts_its_unfinished_points(db_url, engines):
    """``perfsweep resume --close`` writes a sweep's end after the fact: the end is its last run's,
    on both databases (PostgreSQL compares timestamps across zones); a grid point whose latest row
    is not final, one never started, or a search stopped half way keeps it from closing."""
    from perfsweep import summary

    engine = engines(db_url)
    sid = store.start_sweep(engine, "/sweeps/late", "late", command="perfsweep -m batch=1,2,3", n_jobs=3)
    ends = [datetime(2026, 11, 26, 10, m, tzinfo=timezone.utc) for m in (1, 7, 4)]
    for job, end in enumerate(ends[:2]):
        store.save_run(engine, run_row(sid, job_num=job, finished_at=end))
    assert summary.unfinished_points(engine, sid) == 1  # job 2 never started
    store.save_run(engine, run_row(sid, job_num=2, status="oom", finished_at=ends[2]))
    assert summary.unfinished_points(engine, sid) == 0  # oom is final: --close does not rerun it
    store.begin_run(engine, {k: v for k, v in run_row(sid, job_num=1).items() if k != "status"})
    assert summary.unfinished_points(engine, sid) == 1  # job 1's latest row is running
    store.end_sweep(engine, sid, "done", at_last_run=True)
    with Session(engine) as s:
        sweep = s.get(store.Sweep, sid)
        end = sweep.finished_at if sweep.finished_at.tzinfo else sweep.finished_at.replace(tzinfo=timezone.utc)
    assert sweep.status == "done" and end == max(ends)


def test_resume_points_refuses_a_missing_sqlite_file_without_making_it(tmp_path: Path):
    """resume=true with a SQLite file that does not exist is refused without creating it (an empty
    database and its folder were left); one that exists is read."""
    from perfsweep import preflight
    from perfsweep.config import ConfigError

    db = tmp_path / "r.db"
    engine = store.connect(f"sqlite:///{db}")
    store.start_sweep(engine, "/sweeps/a", "a", command="perfsweep -m amp=true,false", n_jobs=2)
    engine.dispose()
    assert preflight.resume_points(f"sqlite:///{db}", "/sweeps/a", [(0, "h0"), (1, "h1")], set()) == set()
    with pytest.raises(ConfigError, match="holds no sweep for /sweeps/a"):
        preflight.resume_points(f"sqlite:///{tmp_path}/nodir/nope.db", "/sweeps/a", [(0, "h0")], set())
    assert not (tmp_path / "nodir").exists()
