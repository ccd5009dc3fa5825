"""A finished job's result is never lost: where the database refuses it (a full disk, a revoked
permission, a file deleted while the job ran), the result is kept on disk beside the job, the
summary says so, and ``perfsweep import`` or a resume stores it once.

Real SQLite files made to refuse with triggers and permissions, a PostgreSQL address nothing listens
on; real sweeps.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

from perfsweep import importer, interrupts, job_entry, store
from perfsweep.names import RUN_STATUSES
from tests.util import (
    REFUSE_CLOSE,
    TINY,
    failing_model,
    finish,
    job_process,
    read_only,
    run_perfsweep,
    run_row,
    sqlite_script,
    start_as_in_a_terminal,
    start_perfsweep,
    tiny_job,
    training,
    wait_for,
)
from tests.util import sqlite_rows as rows

# A real SQLite database that refuses to record outcomes: the job's 'running' row goes in, the
# final write is aborted by the database, as a full disk or a revoked permission would.
REFUSE_OUTCOMES = """
CREATE TRIGGER refuse_outcomes BEFORE UPDATE OF status ON runs WHEN NEW.status != 'running'
BEGIN SELECT RAISE(ABORT, 'disk I/O error (test trigger)'); END;
"""


def test_failed_database_write_is_kept_and_imported_once(tmp_path: Path, capsys: pytest.CaptureFixture):
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    con = sqlite3.connect(db)
    con.executescript(REFUSE_OUTCOMES)
    con.close()

    res = run_perfsweep(["-m", "amp=true,false", "device=cpu", *TINY], tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "2 results could not be written" in last and "perfsweep import" in last, last
    assert "[SQL:" not in res.stdout + res.stderr  # the driver's first line, not SQLAlchemy's dump
    # the summary says the runs finished and where they are, not that they are still 'running'
    table = res.stdout[res.stdout.index("Sweep 1 (2 runs, 0 ok)") :].splitlines()
    assert [line.split()[2] for line in table[2:4]] == ["unsaved", "unsaved"], table
    assert table[4] == "unsaved: the job finished but the database refused its result, kept as result.json"
    files = sorted(tmp_path.glob("multirun/*/*/*/result.json"))
    assert len(files) == 2
    kept = json.loads(files[0].read_text())
    assert kept["run"]["status"] == "ok" and kept["run"]["steps"] and kept["run"]["tokens_per_s"] > 0

    sweep_dir = files[0].parent.parent
    res = run_perfsweep(["import", str(sweep_dir), "--db", str(db)], tmp_path)
    assert res.returncode == 1, res.stderr  # the database still refuses: said per file, nothing lost
    assert res.stderr.count("database refused") == 2 and "test trigger" in res.stderr
    assert all(f.exists() for f in files)
    con = sqlite3.connect(db)
    con.execute("DROP TRIGGER refuse_outcomes")
    con.commit()
    con.close()

    (tmp_path / "ro").mkdir()  # a copy in a folder nobody may write to: said, with what to check
    shutil.copy(db, tmp_path / "ro" / "results.db")
    with read_only(tmp_path / "ro"):
        assert importer.main([str(sweep_dir), "--db", str(tmp_path / "ro" / "results.db")]) == 2
    (refused,) = capsys.readouterr().err.strip().splitlines()
    assert refused.startswith("perfsweep import: cannot open --db sqlite:///") and refused.endswith(
        "; a SQLite file and its folder must be writable"
    ), refused
    assert all(f.exists() for f in files)

    res = run_perfsweep(["import", str(sweep_dir), "--db", str(db)], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "2 completed" in res.stdout
    # the report in the sweep's folder was drawn without them
    assert res.stdout.strip().splitlines()[-1] == f"sweep 1: see it with: perfsweep report --sweep 1 --db {db}"
    runs = rows(db, "SELECT status, tokens_per_s, run_uid FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == ["ok", "ok"] and all(r["tokens_per_s"] > 0 for r in runs)
    # the sweep's closing figures were drawn when neither run was stored: the import draws them again
    speedups = rows(db, "SELECT amp, speedup, speedup_verdict FROM runs ORDER BY amp")
    assert speedups[0]["speedup_verdict"] == "baseline" and speedups[0]["speedup"] == 1.0, speedups
    assert speedups[1]["speedup"] > 0 and speedups[1]["speedup_verdict"] not in (None, "baseline"), speedups
    n_steps = rows(db, "SELECT count(*) AS n FROM steps")[0]["n"]
    assert n_steps == sum(len(json.loads(f.read_text())["run"]["steps"]) for f in files)

    res = run_perfsweep(["import", str(sweep_dir), "--db", str(db)], tmp_path)  # twice: nothing added
    assert res.returncode == 0 and "2 already stored" in res.stdout
    assert len(rows(db, "SELECT id FROM runs")) == 2
    assert rows(db, "SELECT count(*) AS n FROM steps")[0]["n"] == n_steps

    other = tmp_path / "other.db"  # into a database that never saw the sweep
    for expected in ("2 imported", "2 already stored"):
        res = run_perfsweep(["import", *map(str, files), "--db", str(other)], tmp_path)
        assert res.returncode == 0 and expected in res.stdout, res.stdout + res.stderr
    assert rows(other, "SELECT count(*) AS n FROM runs")[0]["n"] == 2
    swept = rows(other, "SELECT sweep_dir, status, finished_at FROM sweeps")
    assert [(r["sweep_dir"], r["status"]) for r in swept] == [(str(sweep_dir), "done")] and swept[0]["finished_at"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["multirun", "single"])
def test_a_sweep_whose_end_the_database_refused_exits_1_and_resume_closes_it(mode: str, tmp_path: Path):
    """The runs were stored, then the database refused the sweep's end: the sweep exited 0 with a
    warning in the middle of its output, left 'running' (then 'interrupted') without its speedups,
    and no command wrote them without running jobs again. It exits 1 saying what is missing and the
    command that stores it, after the line on the jobs that failed; that command runs no job (a
    failed job is not run again)."""
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    sqlite_script(db, REFUSE_CLOSE)
    # a model that raises on its second forward passes every check and fails inside the job
    grid = ["-m", "+model.fail_at=0,2"] if mode == "multirun" else ["+model.fail_at=2"]
    res = run_perfsweep([*grid, *failing_model(tmp_path)], tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    close = f"perfsweep resume 1 --close --db {db}"
    unclosed = (
        "perfsweep: the sweep's end and closing figures (speedups, compile payback, CPU utilisation, the numerics "
        f"audit) are not stored; once the database takes writes, store them with: {close}"
    )
    n_runs = 2 if mode == "multirun" else 1
    failed, last = res.stderr.strip().splitlines()[-2:]
    assert last == unclosed, res.stderr[-3000:]
    assert failed.startswith(f"perfsweep: 1 of {n_runs} job") and "(1 failed)" in failed, res.stderr[-3000:]
    assert "could not mark the sweep done" in res.stderr and "test trigger" in res.stderr
    statuses = ["ok", "failed"] if mode == "multirun" else ["failed"]
    runs = rows(db, "SELECT status, speedup_verdict FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == statuses and all(r["speedup_verdict"] is None for r in runs), runs

    res = run_perfsweep(["resume", "1", "--close", "--db", str(db)], tmp_path)  # still refused: said, nothing run
    assert res.returncode == 1 and res.stderr.strip().splitlines()[-1] == unclosed, res.stderr[-3000:]
    assert len(rows(db, "SELECT id FROM runs")) == n_runs

    sqlite_script(db, "DROP TRIGGER refuse_close;")
    res = run_perfsweep(["resume", "1", "--close", "--db", str(db)], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    counts = "2 runs: 1 ok, 1 failed" if mode == "multirun" else "1 run: 1 failed"
    assert f"perfsweep resume: sweep 1 ({counts}): its end and closing figures are stored; no job was run" in res.stderr
    assert f"({n_runs} run{'s' if n_runs > 1 else ''}, {n_runs - 1} ok)" in res.stdout, res.stdout
    # report=false: none to redraw, and the line says how to draw one (it said nothing of the report)
    assert res.stdout.strip().splitlines()[-1].startswith("Report:  none drawn; draw it with: perfsweep report"), (
        res.stdout
    )
    (sweep,) = rows(db, "SELECT status, finished_at FROM sweeps")
    end = rows(db, "SELECT max(finished_at) AS t FROM runs")[0]["t"]
    assert sweep == {"status": "done", "finished_at": end}  # the end is the last run's, not the resume's
    runs = rows(db, "SELECT status, speedup_verdict FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == statuses  # the failed job was not run again
    assert mode == "single" or runs[0]["speedup_verdict"] == "baseline", runs

    res = run_perfsweep(["resume", "1", "--close", "--db", str(db)], tmp_path)  # closed: changes nothing
    assert res.returncode == 0 and "sweep 1 is closed already; nothing to store" in res.stderr, res.stderr[-3000:]
    assert rows(db, "SELECT status, finished_at FROM sweeps") == [sweep]


@pytest.mark.slow
def test_a_job_the_database_took_no_row_of_is_summarised_unsaved_not_as_not_started(tmp_path: Path):
    """The database went read-only after the first job: the second job could not write even its
    'running' row, ran, and kept its result; nor could the sweep's end be written. The summary
    counted the job "not started" and left it out of the table, beside a last line saying its
    result was kept; after the import the sweep stayed 'interrupted' and its report stale, and
    nothing said so. The import now names the command that closes the sweep."""
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    sqlite_script(
        db,
        "CREATE TRIGGER refuse_second BEFORE INSERT ON runs WHEN (SELECT count(*) FROM runs) >= 1 "
        "BEGIN SELECT RAISE(ABORT, 'attempt to write a readonly database (test trigger)'); END;" + REFUSE_CLOSE,
    )
    res = run_perfsweep(["-m", "model.dropout=0.0,0.1", "device=cpu", *TINY], tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    table = res.stdout[res.stdout.index("Sweep 1 ") :].splitlines()
    assert table[0] == "Sweep 1 (2 runs, 1 ok)", table  # no "1 of 2 jobs not started"
    # the setting swept is read from the kept config (it showed None)
    assert [line.split()[:3] for line in table[2:4]] == [["1", "0", "ok"], ["2", "0.1", "unsaved"]], table
    imported, unclosed = res.stderr.strip().splitlines()[-2:]
    assert imported.startswith("perfsweep: 1 result could not be written") and "perfsweep import" in imported
    close = f"perfsweep resume 1 --close --db {db}"
    assert unclosed.endswith(f"once the database takes writes, and after the import, store them with: {close}")
    assert len(rows(db, "SELECT id FROM runs")) == 1

    sqlite_script(db, "DROP TRIGGER refuse_second; DROP TRIGGER refuse_close;")
    res = run_perfsweep(["import", str(tmp_path / "multirun"), "--db", str(db)], tmp_path)
    assert res.returncode == 0 and "1 imported" in res.stdout, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1] == f"sweep 1 is not closed: close it with: {close}"
    assert [r["status"] for r in rows(db, "SELECT status FROM runs ORDER BY job_num")] == ["ok", "ok"]
    res = run_perfsweep(["resume", "1", "--db", str(db)], tmp_path)  # plain resume: nothing to run, then closed
    assert res.returncode == 0 and "2 of 2 jobs already ok, 0 to run" in res.stderr, res.stderr[-3000:]
    assert "stored the sweep's end and closing figures, missing until now" in res.stderr
    assert rows(db, "SELECT status FROM sweeps") == [{"status": "done"}]
    assert len(rows(db, "SELECT id FROM runs")) == 2


def test_a_result_outlives_its_database_file_and_job_folder_deleted_while_it_ran(tmp_path: Path):
    """Fault injection: results.db and the job's folder are deleted while the job trains. The
    pooled connection kept writing into the deleted file and the result.json fallback raised into
    the void: a finished result was lost without a word. It is now kept where a file can still be
    written, named in the last line, and imported from there, as the ok run it was.

    The job is stopped (SIGSTOP) while both go, so that it cannot finish first; it had trained
    1,500 steps (20 s of CPU) to make that unlikely. device=cpu: the faults are the database's and
    the folder's, not the device's; on a CPU 300 steps take over a second, time enough to stop it."""
    tiny = [o for o in TINY if not o.startswith(("steps.measure", "profile."))]
    proc = start_perfsweep(
        ["-m", "steps.measure=300", "profile.enabled=false", "device=cpu", *tiny],
        tmp_path,
        env={"TMPDIR": str(tmp_path / "tmp")},
    )
    (tmp_path / "tmp").mkdir()
    db = tmp_path / "results.db"
    # the job trains: its 'running' row comes before its process starts, and a process still
    # starting makes its folder again (CI, under load, once kept the result there)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    wait_for(lambda: any("measure step" in line for line in said))
    job = job_process(proc.pid)
    os.kill(job, signal.SIGSTOP)  # it trains on once both are gone
    try:
        assert [r["status"] for r in rows(db, "SELECT status FROM runs")] == ["running"], "it finished first"
        (job_dir,) = [p for p in (tmp_path / "multirun").glob("*/*/0_*")]
        db.unlink()  # another connection may create an empty one in its place: 'replaced' then
        shutil.rmtree(job_dir)
    except BaseException:
        os.kill(job, signal.SIGKILL)
        proc.kill()
        raise
    try:
        with read_only(job_dir.parent):  # nor can the job's folder be made again (a full disk does the same)
            os.kill(job, signal.SIGCONT)
            proc.wait(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(job, signal.SIGCONT)  # never left stopped
    reader.join(timeout=30)
    err = "".join(said)
    assert proc.returncode == 1, err[-3000:]
    assert "database write failed (the database file " in err and " while the job ran)" in err, err[-3000:]
    kept_files = list((tmp_path / "tmp" / "perfsweep-unsaved").rglob("result.json"))
    assert len(kept_files) == 1, (sorted(str(p) for p in tmp_path.rglob("result.json")), err[-3000:])
    kept = kept_files[0]
    last = err.strip().splitlines()[-1]
    assert "1 result could not be written" in last and f"perfsweep import {job_dir.parent} {kept.parents[1]}" in last
    fresh = tmp_path / "fresh.db"
    assert importer.main([str(kept.parents[1]), "--db", str(fresh)]) == 0
    (run,) = rows(fresh, "SELECT status, error, tokens_per_s FROM runs")  # it trained to the end
    assert run["status"] == "ok" and run["error"] is None and run["tokens_per_s"] > 0, run


def test_a_job_whose_folder_cannot_be_made_reports_so(tmp_path: Path):
    """The same fault when it lands before the job has started: its folder goes before the spawned
    process opens its job.log there. The process exited with code 1, and the sweep could only
    say that it had reported nothing (a race the test above lost on a slower machine)."""
    parent = tmp_path / "sweep"
    parent.mkdir()
    job_dir = parent / "0_amp=false"
    receiver, sender = multiprocessing.Pipe(duplex=False)
    with read_only(parent):
        job_entry.main(str(job_dir), sender, b"not reached")
    kind, status, message, tb, partial = receiver.recv()
    assert (kind, status, tb, partial) == ("error", "failed", "", {})
    assert str(job_dir) in message and "resume the sweep" in message, message
    assert not job_dir.exists()


def test_a_single_run_whose_result_the_database_refused_is_shown_unsaved(tmp_path: Path):
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    con = sqlite3.connect(db)
    con.executescript(REFUSE_OUTCOMES)
    con.close()
    res = run_perfsweep([*TINY, "device=cpu"], tmp_path)  # no -m: perfsweep.__main__'s own path
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Sweep 1 (1 run, 0 ok)" in res.stdout and " unsaved " in res.stdout, res.stdout
    (kept,) = tmp_path.glob("outputs/**/result.json")
    assert (
        res.stderr.strip().splitlines()[-1].startswith(f"perfsweep: the result could not be written to sqlite:///{db}")
    )
    assert str(kept) in res.stderr.strip().splitlines()[-1]


def test_a_result_kept_before_the_noisy_rule_was_stored_is_imported_with_the_rule_that_judged_it(tmp_path: Path):
    """A result.json written by a perfsweep older than schema 0012 has a noisy flag and no
    noisy_rule: imported, its row names the IQR rule (the report said "by its stored rule, unknown");
    a result that carries its rule keeps it."""
    from perfsweep.names import NOISY_RULE, NOISY_RULE_IQR_ONLY

    sweep = {"sweep_dir": str(tmp_path / "sw"), "name": "old"}
    old = {k: v for k, v in run_row(0, run_uid="old", noisy=True).items() if k not in ("sweep_id", "noisy_rule")}
    new = {**run_row(0, run_uid="new", noisy=False, noisy_rule=NOISY_RULE), "sweep_id": None}
    for name, run in (("old", old), ("new", new)):
        (tmp_path / name).mkdir()
        importer.write_result_file(tmp_path / name / importer.RESULT_FILE, sweep, run)
    db = tmp_path / "results.db"
    assert importer.main([str(tmp_path / "old"), str(tmp_path / "new"), "--db", str(db)]) == 0
    stored = rows(db, "SELECT run_uid, noisy, noisy_rule FROM runs ORDER BY run_uid")
    assert stored == [
        {"run_uid": "new", "noisy": 0, "noisy_rule": NOISY_RULE},
        {"run_uid": "old", "noisy": 1, "noisy_rule": NOISY_RULE_IQR_ONLY},
    ]


def test_a_result_kept_before_nonfinite_losses_were_counted_is_imported_with_its_count(tmp_path: Path):
    """A result.json older than schema 0013 has NaN losses (JSON's NaN) and no count: imported, the
    run counts its non-finite measured losses (warmup's not), stores the NaN ones as NULL, and the
    audit that runs after an import flags it."""
    nan, inf = float("nan"), float("inf")
    steps = [("warmup", nan), ("measure", 2.0), ("measure", nan), ("measure", inf)]
    run = {k: v for k, v in run_row(0, run_uid="old", final_loss=inf).items() if k != "sweep_id"}
    run["steps"] = [
        {"step": i, "phase": phase, "step_time_ms": 5.0, "data_wait_ms": 0.0, "loss": loss}
        for i, (phase, loss) in enumerate(steps)
    ]
    importer.write_result_file(tmp_path / importer.RESULT_FILE, {"sweep_dir": str(tmp_path / "sw"), "name": "s"}, run)
    db = tmp_path / "results.db"
    assert importer.main([str(tmp_path / importer.RESULT_FILE), "--db", str(db)]) == 0
    (stored,) = rows(db, "SELECT id, nonfinite_loss_steps, numerics_warning FROM runs")
    assert stored == {"id": stored["id"], "nonfinite_loss_steps": 2, "numerics_warning": 1}
    losses = rows(db, "SELECT loss FROM steps ORDER BY step")
    assert [r["loss"] for r in losses] == [None, 2.0, None, inf]


def test_import_refuses_what_is_not_a_result(tmp_path: Path, capsys: pytest.CaptureFixture):
    (tmp_path / "result.json").write_text("{}")
    assert importer.main([str(tmp_path / "nothing")]) == 2
    assert importer.main([str(tmp_path), "--db", str(tmp_path / "r.db")]) == 2
    # one truncated file among good ones: said, and the good ones are still imported (exit 1)
    good = tmp_path / "job" / "result.json"
    good.parent.mkdir()
    importer.write_result_file(good, {"sweep_dir": str(tmp_path / "s"), "name": "s"}, run_row(0, run_uid="u1"))
    capsys.readouterr()
    assert importer.main([str(tmp_path), "--db", str(tmp_path / "r.db")]) == 1
    out, err = capsys.readouterr()
    assert "not a perfsweep result" in err and "2 result files: 1 imported, 1 unreadable" in out, (out, err)
    # files that say they are results and are not whole: each named and skipped, the others stored (a
    # KeyError had stopped the whole import; an empty sweep was blamed on the database)
    halves = {
        "bare": {"format": importer.FORMAT},
        "empty": {"format": importer.FORMAT, "sweep": {}, "run": {}},
        "odd_field": None,
    }
    for name, doc in halves.items():
        (tmp_path / name).mkdir()
        if doc is None:
            run = run_row(0, run_uid="u2") | {"no_such_column": 1}
            importer.write_result_file(
                tmp_path / name / "result.json", {"sweep_dir": str(tmp_path / "s"), "name": "s"}, run
            )
        else:
            (tmp_path / name / "result.json").write_text(json.dumps(doc))
    good2 = tmp_path / "job2" / "result.json"
    good2.parent.mkdir()
    importer.write_result_file(good2, {"sweep_dir": str(tmp_path / "s"), "name": "s"}, run_row(0, run_uid="u3"))
    assert importer.main([str(tmp_path), "--db", str(tmp_path / "r.db")]) == 1
    out, err = capsys.readouterr()
    assert "6 result files: 4 unreadable, 1 already stored, 1 imported" in out, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 4 and all(ln.startswith(f"perfsweep import: {tmp_path}/") for ln in lines), err
    assert "no sweep.sweep_dir, sweep.name, run.run_uid" in err and "no_such_column" in err, err
    assert [r["run_uid"] for r in rows(tmp_path / "r.db", "SELECT run_uid FROM runs ORDER BY run_uid")] == ["u1", "u3"]


WRONGLY_TYPED = {
    # file name -> (field edited in a result.json, its value, what the one line says: field, value, what is allowed)
    "status": ("status", 5, "run.status is 5 (a number); runs.status takes text"),
    "config_json": (
        "config_json",
        '{"amp": false}',
        """run.config_json is '{"amp": false}' (text); runs.config_json takes a JSON object""",
    ),
    "run_uid": ("run_uid", "  ", "run.run_uid is empty"),
    "batch": ("batch", True, "run.batch is True (true/false); runs.batch takes a whole number"),
    "amp": ("amp", "yes", "run.amp is 'yes' (text); runs.amp takes true or false"),
    "tokens_per_s": ("tokens_per_s", "fast", "run.tokens_per_s is 'fast' (text); runs.tokens_per_s takes a number"),
    "finished_at": (
        "finished_at",
        "yesterday",
        "run.finished_at is 'yesterday' (text); runs.finished_at takes an ISO 8601 time",
    ),
    "model_name": ("model_name", None, "run.model_name is null; runs.model_name takes text"),
    "steps": ("steps", "none", "run.steps is 'none' (text), not a list of steps rows"),
    "stages": ("stages", [{"stage": "forward"}], "run.stages[0] has no cpu_time_ms, device_time_source, calls"),
    # the report failed later ("tuple.index(x): x not in tuple"), or the driver's refusal was blamed on the database
    "status_unknown": ("status", "bogus", "run.status is 'bogus' (text); it is one of " + ", ".join(RUN_STATUSES)),
    "job_num_huge": (
        "job_num",
        10**30,
        f"run.job_num is {10**30} (a number); runs.job_num takes a whole number under 2**31",
    ),
    "amp_dtype_long": ("amp_dtype", "x" * 300, "run.amp_dtype is 300 characters long; runs.amp_dtype takes at most 8"),
}


def test_import_names_a_field_of_the_wrong_type_and_stores_nothing_of_that_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A result.json edited by hand or by another tool: ``status: 5`` or ``config_json`` as text
    was stored, and the sweep's report failed later; a type the driver refused was blamed on the
    database ("the database refused the write"). Each is now one line naming the file, the field,
    its value and what the column takes, before the database is opened; the good file is stored."""
    sweep = {"sweep_dir": str(tmp_path / "s"), "name": "s"}
    for name, (field, value, _) in WRONGLY_TYPED.items():
        importer.write_result_file(
            (tmp_path / name).with_suffix(".json"), sweep, run_row(0, run_uid=f"bad-{name}") | {field: value}
        )
    importer.write_result_file(tmp_path / "good.json", sweep, run_row(0, run_uid="good"))
    files = [str((tmp_path / f).with_suffix(".json")) for f in [*WRONGLY_TYPED, "good"]]
    db = tmp_path / "r.db"
    assert importer.main([*files, "--db", str(db)]) == 1
    out, err = capsys.readouterr()
    said = err.strip().splitlines()
    assert said == [
        f"perfsweep import: {(tmp_path / name).with_suffix('.json')}: not a perfsweep result as written ({line})"
        for name, (_, _, line) in WRONGLY_TYPED.items()
    ]
    assert f"{len(files)} result files: {len(WRONGLY_TYPED)} unreadable, 1 imported" in out, out
    assert [r["run_uid"] for r in rows(db, "SELECT run_uid FROM runs")] == ["good"]


def test_a_job_starting_while_the_database_is_down_runs_and_keeps_its_result(tmp_path: Path):
    """The server went away between two jobs of a sweep: the next job still trains, and its
    result waits in its folder for perfsweep import (it was an exception before any training:
    the grid point was silently missing)."""
    from perfsweep import launcher
    from perfsweep.config import DbConfig, SweepContext

    spec = tiny_job(
        tmp_path,
        job_num=1,
        db=DbConfig(url="postgresql+psycopg2://perfsweep@127.0.0.1:1/gone"),  # nothing listens on port 1
        sweep=SweepContext(n_jobs=2, id=7),
    )
    run_id, status = launcher.run_job(spec)
    assert (run_id, status) == (None, "ok")
    kept = json.loads((tmp_path / "job" / "result.json").read_text())
    assert kept["run"]["status"] == "ok" and kept["run"]["tokens_per_s"] > 0 and kept["run"]["job_num"] == 1


@pytest.mark.slow
def test_a_database_file_deleted_between_jobs_is_named_not_a_foreign_key(tmp_path: Path):
    """results.db is deleted while the first job runs: the next job's connection made an empty one
    in its place, and its writes failed as "FOREIGN KEY constraint failed", the summary as "no
    sweep ... in ..." (found by a new-user review). Each line now says the file went; both results
    are kept and imported."""
    tiny = [o for o in TINY if not o.startswith(("steps.measure", "profile."))]
    proc = start_perfsweep(["-m", "steps.measure=50,3", "profile.enabled=false", "device=cpu", *tiny], tmp_path)
    db = tmp_path / "results.db"
    wait_for(lambda: db.exists() and rows(db, "SELECT count(*) AS n FROM runs WHERE status = 'running'")[0]["n"] == 1)
    for f in tmp_path.glob("results.db*"):
        f.unlink()
    out, err = finish(proc, 300)
    assert proc.returncode == 1, err[-3000:]
    assert "FOREIGN KEY" not in out + err, (out + err)[-3000:]
    gone = "sweep 1 is not in the database: its file was deleted or replaced after the sweep began"
    assert f"could not write the running row ({gone})" in out + err, (out + err)[-3000:]
    assert f"database write failed ({gone}); result kept in" in err, err[-3000:]
    assert (
        "perfsweep: no summary: the sweep " in err and "(its file was deleted or replaced after the sweep began)" in err
    )
    assert err.strip().splitlines()[-1].startswith("perfsweep: 2 results could not be written"), err[-3000:]
    assert importer.main([str(next((tmp_path / "multirun").glob("*/*"))), "--db", str(db)]) == 0
    assert [r["status"] for r in rows(db, "SELECT status FROM runs ORDER BY job_num")] == ["ok", "ok"]


@pytest.mark.slow
def test_a_stopped_sweep_counts_its_kept_results_and_a_resume_stores_them_before_running_the_rest(tmp_path: Path):
    """The database refused the first job's result (kept as result.json) and Ctrl-C came in the
    second: the last line said "no job had finished; run them with: perfsweep resume", under a
    summary that showed the first ``unsaved``, and that resume ran the finished job again (a later
    import then stored its grid point twice). The line now counts it; the resume stores it first,
    and is refused, before any job, while the database still refuses it."""
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    sqlite_script(db, REFUSE_OUTCOMES)
    tiny = [o for o in TINY if not o.startswith("steps.measure")]

    def stopped_in_second_job(args: list[str], log: Path) -> str:
        proc = start_as_in_a_terminal([sys.executable, "-m", "perfsweep", *args], tmp_path, log)
        try:
            wait_for(lambda: training(log, serial_job="[2/2]"))
        except BaseException:  # the second job would train on for ever
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        os.killpg(proc.pid, signal.SIGINT)
        _, err = finish(proc, 60)
        assert proc.returncode == 130, err[-3000:]
        return err.strip().splitlines()[-1]

    last = stopped_in_second_job(["-m", "steps.measure=2,100000000", "device=cpu", *tiny], tmp_path / "sweep.txt")
    resume = f"perfsweep resume 1 --db {db}"
    assert last == (
        "perfsweep: interrupted; 1 of 2 jobs finished, kept as result.json, which the database refused; "
        f"store it and run the rest with: {resume}"
    ), last
    (kept,) = tmp_path.glob("multirun/*/*/0_*/result.json")
    uid = json.loads(kept.read_text())["run"]["run_uid"]

    res = run_perfsweep(["resume", "1", "--db", str(db)], tmp_path)  # the database still refuses
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"perfsweep: resume=true: the database sqlite:///{db} refused a result this sweep kept as result.json "
        "(disk I/O error (test trigger)); it stays on disk, and the resume stores it first once the database "
        "takes writes (a file it refuses for good: move it out of the sweep's folder, and its grid point runs "
        "again); no job was started"
    ), res.stderr[-3000:]
    assert "[1/2]" not in res.stderr and kept.exists()

    sqlite_script(db, "DROP TRIGGER refuse_outcomes;")
    (cut,) = tmp_path.glob("multirun/*/*/1_*")  # a result cut short (a full disk): said, not skipped silently
    (cut / "result.json").write_text('{"format": "perfsweep-result/1", "sweep": {')
    said = tmp_path / "resume.txt"
    last = stopped_in_second_job(["resume", "1", "--db", str(db)], said)
    text = said.read_text()
    assert "perfsweep: stored 1 result this sweep kept as result.json when the database refused it (1 ok)\n" in text
    assert f"perfsweep: {cut / 'result.json'}: not a perfsweep result (" in text and "); not stored\n" in text
    assert "1 of 2 jobs already ok, 1 to run" in text and "\n[1/2] " not in text, text[-3000:]
    assert last == f"perfsweep: interrupted; 1 of 2 jobs finished and are stored; run the rest with: {resume}"
    runs = rows(db, "SELECT job_num, status, run_uid FROM runs ORDER BY id")
    assert [(r["job_num"], r["status"]) for r in runs] == [(0, "ok"), (1, "interrupted"), (1, "interrupted")], runs
    assert runs[0]["run_uid"] == uid  # its own row, completed in place: the grid point has one ok run


@pytest.mark.slow
@pytest.mark.parametrize("close", [False, True], ids=["resume", "resume-close"])
def test_a_resume_of_a_sweep_whose_every_result_was_kept_stores_them_and_draws_its_figures(close: bool, tmp_path: Path):
    """Every job finished and the database refused both results: a resume stores them (and runs
    nothing), draws the speedups the sweep's end drew without them, and shows the summary.
    ``--close`` said "sweep 1 is closed already; nothing to store" (found by a fault-injection pass).

    The plain resume's database refused even the jobs' ``running`` rows: a resume typed by hand
    for another grid then found no row to refuse it by, stored the results, and was refused only
    after (a refused command changed the database). The kept results count in the grid check."""
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    refuse = "refuse_outcomes" if close else "refuse_rows"
    no_rows = "CREATE TRIGGER refuse_rows BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'disk full (test)'); END;"
    sqlite_script(db, REFUSE_OUTCOMES if close else no_rows)
    res = run_perfsweep(["-m", "amp=false,true", "device=cpu", *TINY], tmp_path)
    assert res.returncode == 1 and "2 results could not be written" in res.stderr, res.stderr[-3000:]
    sqlite_script(db, f"DROP TRIGGER {refuse};")
    if not close:
        (sweep_dir,) = tmp_path.glob("multirun/*/*")
        other_grid = ["-m", "amp=false,true", "device=cpu", *(o for o in TINY if not o.startswith("seq_len"))]
        res = run_perfsweep([*other_grid, "seq_len=16", f"hydra.sweep.dir={sweep_dir}", "resume=true"], tmp_path)
        assert res.returncode == 2 and "the grid is not that of sweep 1" in res.stderr, res.stderr[-3000:]
        assert rows(db, "SELECT count(*) AS n FROM runs") == [{"n": 0}]
    res = run_perfsweep(["resume", "1", "--db", str(db), *(["--close"] if close else [])], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "stored 2 results this sweep kept as result.json when the database refused them (2 ok)" in res.stderr
    assert "[1/2]" not in res.stderr and ("0 to run" in res.stderr) != close, res.stderr[-3000:]
    assert "Sweep 1 (2 runs, 2 ok)" in res.stdout, res.stdout[-3000:]
    runs = rows(db, "SELECT status, speedup_verdict FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == ["ok", "ok"] and runs[0]["speedup_verdict"] == "baseline", runs
    assert runs[1]["speedup_verdict"] is not None, runs


def test_a_stop_after_the_last_job_names_the_import_of_the_results_kept_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A stop while the sweep is closed, after its last job: the line said "the runs are stored;
    see them with: perfsweep report" of results the database had refused, kept as result.json
    (found by a fault-injection pass). Only this sweep's files count: the spare folder under the
    system's temporary folder is named by the sweep folder's last part, which another sweep's
    folder may share."""
    import tempfile

    from perfsweep import summary

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the spare folder's parent
    url = store.sqlite_url(tmp_path / "results.db")
    store.connect(url).dispose()
    mine, other = tmp_path / "a" / "sw", tmp_path / "b" / "sw"
    for sweep_dir, job in ((mine, mine / "0_job"), (other, importer.spare_folder(mine) / "1_job")):
        job.mkdir(parents=True)
        run = run_row(1, job_num=int(job.name[0]), run_uid=f"uid-{sweep_dir.parent.name}")
        importer.write_result_file(job / importer.RESULT_FILE, {"sweep_dir": str(sweep_dir), "name": "s"}, run)
    assert importer.kept_of_sweep(url, str(mine)) == [mine / "0_job" / importer.RESULT_FILE]
    with (
        pytest.raises(KeyboardInterrupt) as stopped,
        summary.hint_stored(url, 1, lambda: importer.kept_hint(url, str(mine))),
    ):
        raise KeyboardInterrupt
    assert stopped.value.perfsweep_hint == (
        f"a result the database refused is kept as result.json; store it with: perfsweep import {mine} --db "
        f"{tmp_path / 'results.db'}"
    )
    with (
        pytest.raises(KeyboardInterrupt) as stopped,
        summary.hint_stored(url, 1, lambda: importer.kept_hint(url, str(tmp_path / "c"))),
    ):
        raise KeyboardInterrupt
    assert stopped.value.perfsweep_hint.startswith("the runs are stored; see them with: perfsweep report")

    def second_stop_in_the_read() -> str | None:  # held, and raised as the hold ends
        os.kill(os.getpid(), signal.SIGINT)
        return importer.kept_hint(url, str(mine))

    with pytest.raises(KeyboardInterrupt) as stopped, summary.hint_stored(url, 1, second_stop_in_the_read):
        raise KeyboardInterrupt
    assert stopped.value.__context__ is not None  # the second stop: the line is still the first one's
    assert interrupts.hint_of(stopped.value).startswith("a result the database refused is kept as result.json")

    # a database that cannot be read: the summary lists every file, the count after a stop none
    gone = store.sqlite_url(tmp_path / "gone.db")
    assert importer.kept_of_sweep(gone, str(mine)) == [mine / "0_job" / importer.RESULT_FILE]
    assert importer.kept_of_sweep_if_known(gone, str(mine)) is None and not (tmp_path / "gone.db").exists()
