"""A run's life in the database: running, then an outcome; interrupted when its process is gone;
resumed until every grid point is ok once. (Results the database refuses: test_kept_results.py;
a sweep stopped by Ctrl-C or SIGTERM: test_stop.py.)

Real databases (a SQLite file, the test PostgreSQL server), real sweeps killed with real signals.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from perfsweep import store
from perfsweep.config import ConfigError
from perfsweep.names import HEARTBEAT_STALE_S, SWEEP_MARKER
from tests.util import (
    TINY,
    failing_model,
    finish,
    job_process,
    new_db_url,
    read_only,
    run_perfsweep,
    run_row,
    sqlite_script,
    start_as_in_a_terminal,
    stopped_while_the_database_is_waited_for,
    wait_for,
)
from tests.util import sqlite_rows as rows

pytest_plugins = ["tests.pg"]


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path):
    eng = store.connect(new_db_url(request, tmp_path))
    yield eng
    eng.dispose()


def base_row(sweep_id: int, job_num: int, **extra) -> dict:
    """A run as a job inserts it at start: no status yet (begin_run writes 'running')."""
    row = run_row(sweep_id, job_num=job_num, config_hash=f"h{job_num}", started_at=store.utcnow(), **extra)
    del row["status"], row["tokens_per_s"]
    return row


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_running_rows_of_gone_processes_become_interrupted(engine):
    here = socket.gethostname()
    sweep_alive = store.start_sweep(engine, "/s/alive", "alive", hostname=here, command="perfsweep -m amp=true,false")
    sweep_dead = store.start_sweep(engine, "/s/dead", "dead", hostname=here, command="perfsweep amp=true")
    store.begin_run(engine, base_row(sweep_alive, 0, hostname=here, pid=os.getpid()))
    store.begin_run(engine, base_row(sweep_alive, 1, hostname="elsewhere", pid=1))  # fresh heartbeat
    dead = store.begin_run(engine, base_row(sweep_dead, 0, hostname=here, pid=dead_pid()))
    stale = store.begin_run(engine, base_row(sweep_alive, 2, hostname="elsewhere", pid=1))
    finished = store.save_run(engine, {**base_row(sweep_dead, 1, hostname=here, pid=dead_pid()), "status": "ok"})
    with store.session(engine) as s:  # a heartbeat older than the stale limit, by the database's clock
        run = s.get(store.Run, stale)
        run.heartbeat_at = store._db_now(s) - timedelta(seconds=HEARTBEAT_STALE_S + 60)
        s.execute(store.update(store.Sweep).where(store.Sweep.id == sweep_dead).values(pid=dead_pid()))

    assert store.mark_interrupted(engine) == 2
    with store.session(engine) as s:
        status = dict(s.execute(select(store.Run.id, store.Run.status)).all())
        sweeps = dict(s.execute(select(store.Sweep.id, store.Sweep.status)).all())
        stale_run, dead_run = s.get(store.Run, stale), s.get(store.Run, dead)
    assert status[dead] == "interrupted" and status[stale] == "interrupted"
    assert status[finished] == "ok"  # a finished row is never touched
    assert sorted(status.values()) == ["interrupted", "interrupted", "ok", "running", "running"]
    assert stale_run.error.endswith("; perfsweep resume reruns it") and stale_run.finished_at is not None
    assert dead_run.error.endswith("; run its command again to measure it")  # a single run cannot be resumed
    assert sweeps == {sweep_alive: "running", sweep_dead: "interrupted"}
    assert store.mark_interrupted(engine) == 0  # idempotent


def test_a_refused_marking_of_dead_runs_is_said_once_a_process(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """A database that refuses the marking: each connection said so, and a resume's sweeper, which
    opens it several times, printed the line four times before its one-line refusal."""
    url = store.sqlite_url(tmp_path / "results.db")
    engine = store.connect(url)
    sweep = store.start_sweep(engine, "/s/dead", "dead", hostname=socket.gethostname(), command="perfsweep amp=true")
    store.begin_run(engine, base_row(sweep, 0, hostname=socket.gethostname(), pid=dead_pid()))
    engine.dispose()
    sqlite_script(
        tmp_path / "results.db",
        "CREATE TRIGGER refuse BEFORE UPDATE OF status ON runs BEGIN SELECT RAISE(ABORT, 'refused (test)'); END;",
    )
    with caplog.at_level(logging.DEBUG, logger="perfsweep.store"):
        for _ in range(3):
            store.connect(url).dispose()
    said = [r.levelno for r in caplog.records if r.getMessage().startswith("could not mark the runs of dead jobs")]
    assert said == [logging.WARNING, logging.DEBUG, logging.DEBUG], caplog.records


def test_heartbeat_uses_the_database_clock(engine, monkeypatch: pytest.MonkeyPatch):
    """A job's and a sweep's stamps come from the database's clock, which every host compares them
    with. This process's clock is put two days off: a stamp from it would be that far out (here
    the database runs on this host, so the two clocks agree otherwise and could not be told apart)."""
    sid = store.start_sweep(engine, "/s/beat", "beat")
    rid = store.begin_run(engine, base_row(sid, 0, hostname=socket.gethostname(), pid=os.getpid()))
    with store.session(engine) as s:
        s.get(store.Run, rid).heartbeat_at = store._db_now(s) - timedelta(hours=1)
        s.get(store.Sweep, sid).heartbeat_at = store._db_now(s) - timedelta(hours=1)
    skewed = store.utcnow() + timedelta(days=2)
    monkeypatch.setattr(store, "utcnow", lambda: skewed)
    store.heartbeat(engine, rid)
    store.sweep_heartbeat(engine, sid)
    with store.session(engine) as s:
        now = store._db_now(s)
        for beat in (s.get(store.Run, rid).heartbeat_at, s.get(store.Sweep, sid).heartbeat_at):
            assert abs((now - beat).total_seconds()) < 30, (now, beat)


def test_a_heartbeat_never_holds_the_job_while_the_database_is_locked(tmp_path: Path):
    """Another process holds SQLite's write lock: the stamp waits in its own thread, and the loop
    that drains the job's progress goes on (it waited up to 30 s, and the job's tokens/s with it)."""

    from perfsweep.launcher import Heartbeat

    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = store.connect(url)
    sid = store.start_sweep(engine, "/s/locked", "locked")
    rid = store.begin_run(engine, base_row(sid, 0, hostname=socket.gethostname(), pid=os.getpid()))
    other = sqlite3.connect(tmp_path / "results.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        beat = Heartbeat(engine, rid)
        beat.last -= 3600  # due
        started = time.monotonic()
        beat()
        assert time.monotonic() - started < 0.5
        assert beat._writing is not None and beat._writing.is_alive()  # the stamp waits for the lock, not the job
        beat.last -= 3600
        beat()  # due again while the first stamp waits: not a second thread
        assert [t.name for t in threading.enumerate()].count("perfsweep-run-heartbeat") == 1
    finally:
        other.execute("ROLLBACK")
        other.close()
    beat._writing.join(timeout=30)
    assert not beat._writing.is_alive()
    engine.dispose()


def test_a_sweep_waiting_for_a_locked_database_says_so_then_runs(tmp_path: Path):
    """A sqlite3 shell left inside a transaction holds the write lock: the sweep sat silent for as
    long as it was held (minutes, with the driver's retries). It now says what it waits for after
    a few seconds, and runs its job once the lock is let go.

    A Ctrl-C meanwhile took 27 s to stop it (SQLite waits in C, where Python's handlers do not
    run, until its 30 s busy timeout); it now stops it at once, and hands its folder back."""
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    notice = f"perfsweep: still waiting for the database sqlite:///{db} after 3 s: "
    try:
        (tmp_path / "stopped").mkdir()
        stopped_while_the_database_is_waited_for(["-m", *TINY, f"db.url=sqlite:///{db}"], tmp_path / "stopped", notice)
        assert not (tmp_path / "stopped" / "multirun").exists()  # the folder handed back: nothing of it left

        proc = start_as_in_a_terminal([sys.executable, "-m", "perfsweep", "-m", *TINY, "steps.measure=2"], tmp_path)
        said = next((line for line in iter(proc.stderr.readline, "") if line.startswith(notice)), "")
        assert said, "the sweep never said what it waits for"
        assert "sqlite3 shell left inside a transaction" in said and proc.poll() is None
    finally:
        other.execute("ROLLBACK")
        other.close()
    out, err = finish(proc, 300)
    assert proc.returncode == 0, err[-2000:]
    assert rows(db, "SELECT status FROM runs") == [{"status": "ok"}]


def test_a_job_process_starts_with_ctrl_c_blocked(tmp_path: Path):
    """Ctrl-C while a job's interpreter started printed "Fatal Python error: init_import_site" on
    the terminal; the job is started with SIGINT, SIGTERM and SIGHUP blocked (job_entry unblocks them, its
    output in job.log). In a fresh process: the first start of multiprocessing's resource tracker,
    inside the first job's start, unblocked both in the starting thread."""
    script = tmp_path / "spawn_one.py"
    script.write_text(
        "import multiprocessing as mp, signal\n"
        "from perfsweep import launcher\n"
        "def child(conn):\n"
        "    conn.send(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn')\n"
        "    parent, conn = ctx.Pipe(duplex=False)\n"  # as a job's: no semaphore, no tracker yet
        "    p = ctx.Process(target=child, args=(conn,))\n"
        "    with launcher.signals_blocked():\n"
        "        p.start()\n"
        "    print(parent.recv(), sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))\n"
        "    p.join()\n"
    )
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    held = sorted(int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))  # SIGHUP: a closed terminal
    assert res.stdout.split("]")[0] + "]" == str(held), res.stdout
    assert res.stdout.strip().endswith("[]")  # and this thread's mask is back as it was


def test_a_resume_typed_by_hand_must_name_the_sweeps_database_and_grid(tmp_path: Path):
    """resume=true without the sweep's db.url started a new sweep in ./results.db inside the old
    sweep's folder (and wrote over its report); with an override changed, the new grid's points
    were appended to the old sweep. Both are refused before any job and write no sweep; the same grid resumes.

    A resume the database refuses (read-only here; a full disk, a revoked grant alike) removed the
    sweep's folder marker as it handed back a folder that was never its own: every later resume was
    answered "holds no perfsweep sweep". The marker stays."""
    db = tmp_path / "kept" / "results.db"
    grid = ["-m", "+model.fail_at=0,2", *failing_model(tmp_path)]  # one point ok, one failed: to resume
    res = run_perfsweep([*grid, f"db.url=sqlite:///{db}"], tmp_path)
    assert res.returncode == 1 and "1 of 2 jobs did not finish ok (1 failed)" in res.stderr, res.stderr[-2000:]
    (sweep_dir,) = {r["sweep_dir"] for r in rows(db, "SELECT sweep_dir FROM sweeps")}
    again = [f"hydra.sweep.dir={sweep_dir}", "resume=true"]

    elsewhere = run_perfsweep([*grid, *again], tmp_path)  # ./results.db: not where the sweep is
    assert elsewhere.returncode == 2 and elsewhere.stderr.count("\n") == 1, elsewhere.stderr[-2000:]
    assert f"holds no sweep for {sweep_dir}; give the db.url the sweep was run with" in elsewhere.stderr
    changed = [o.replace("seq_len=32", "seq_len=16") for o in grid]
    other_grid = run_perfsweep([*changed, *again, f"db.url=sqlite:///{db}"], tmp_path)
    assert other_grid.returncode == 2 and other_grid.stderr.count("\n") == 1, other_grid.stderr[-2000:]
    assert "resume=true: the grid is not that of sweep 1 in " in other_grid.stderr
    assert "; here seq_len=16, in the sweep seq_len=32; resume it with" in other_grid.stderr  # what differs
    assert f"perfsweep resume 1 --db sqlite:///{db}" in other_grid.stderr
    assert len(rows(db, "SELECT id FROM runs")) == 2
    assert not (tmp_path / "results.db").exists()  # the refusal made no database (it made an empty one)

    # the folder removed, a new grid into it is refused, not appended to sweep 1 (6 runs of another
    # grid were, on n_jobs=2, and its resume was refused after); the folder is marked sweep 1's again
    shutil.rmtree(sweep_dir)
    another_grid = ["-m", "+model.fail_at=0,3", *failing_model(tmp_path), f"db.url=sqlite:///{db}", again[0]]
    other = run_perfsweep(another_grid, tmp_path)
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr[-2000:]
    assert (
        "holds sweep 1 of this folder already, though none of its jobs is in the folder now; continue it with: "
        in other.stderr
    )
    assert len(rows(db, "SELECT id FROM runs")) == 2 and len(rows(db, "SELECT id FROM sweeps")) == 1
    assert (Path(sweep_dir) / SWEEP_MARKER).read_text().endswith("sweep_id=1\n")
    # its marker unstamped, its process gone (a sweep killed as its row was written): taken over,
    # and then refused all the same, in one line, without a "took the folder over" first
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (Path(sweep_dir) / SWEEP_MARKER).write_text(f"pid={gone.pid} host={socket.gethostname()} started=0\n")
    taken = run_perfsweep(another_grid, tmp_path)
    assert taken.returncode == 2 and taken.stderr.count("\n") == 1, taken.stderr[-2000:]
    assert "holds sweep 1 of this folder already" in taken.stderr and "took the folder over" not in taken.stderr
    assert len(rows(db, "SELECT id FROM runs")) == 2 and (Path(sweep_dir) / SWEEP_MARKER).read_text().endswith(
        "sweep_id=1\n"
    )

    # last, as read_only skips where root may not set the immutable attribute
    with read_only(db):
        refused = run_perfsweep([*grid, *again, f"db.url=sqlite:///{db}"], tmp_path)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.splitlines()[-1].startswith(f"perfsweep: cannot write to db.url='sqlite:///{db}': ")
    assert (Path(sweep_dir) / SWEEP_MARKER).is_file()
    same = run_perfsweep([*grid, *again, f"db.url=sqlite:///{db}"], tmp_path)
    assert same.returncode == 1 and "1 of 2 jobs already ok, 1 to run" in same.stderr, same.stderr[-2000:]
    assert [r["status"] for r in rows(db, "SELECT status FROM runs ORDER BY id")] == ["ok", "failed", "failed"]


def test_a_marker_left_before_any_row_is_taken_over_and_no_other(tmp_path: Path):
    """A sweep killed (SIGKILL) before its row was written left its folder's marker: the same
    command was refused as "another sweep". Only such a marker is taken over: unstamped, of this
    host, of a process that is gone, and alone in its folder but for Hydra's own files."""
    from perfsweep import preflight

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()

    def folder(name: str, marker: str, *others: str) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / SWEEP_MARKER).write_text(marker)
        for other in others:
            (tmp_path / name / other).mkdir()
        return tmp_path / name

    left = folder("left", f"pid={gone.pid} host={host} started=0\n", ".hydra")
    assert preflight._abandoned(left).startswith(f"pid {gone.pid} on this host") and not list(
        left.glob(f"{SWEEP_MARKER}*")
    )
    # an empty marker (a sweep killed between making it and writing it) names no process: taken
    # over once it is older than any sweep takes to write it (it was never, before)
    empty = folder("empty", "")
    past = time.time() - preflight.EMPTY_MARK_AGE_S - 1
    os.utime(empty / SWEEP_MARKER, (past, past))
    assert preflight._abandoned(empty) == "its mark was empty: killed as it made it" and not list(empty.iterdir())
    for kept in (
        folder("stamped", f"pid={gone.pid} host={host} started=0\nsweep_id=3\n"),  # its row was written
        folder("alive", f"pid={os.getpid()} host={host} started=0\n"),
        folder("elsewhere", f"pid={gone.pid} host=not-{host} started=0\n"),  # a shared filesystem
        folder("with-jobs", f"pid={gone.pid} host={host} started=0\n", "0_amp=true"),
        folder("unreadable", "written by hand\n"),
        folder("being-taken", f"pid={gone.pid} host={host} started=0\n", f"{SWEEP_MARKER}.taking"),
        folder("just-made", ""),  # empty and new: its sweep may be about to write it
    ):
        before = (kept / SWEEP_MARKER).read_text()
        assert preflight._abandoned(kept) is None and (kept / SWEEP_MARKER).read_text() == before, kept.name
    assert (tmp_path / "being-taken" / f"{SWEEP_MARKER}.taking").exists()  # another's lock is left alone
    # a lock left by a sweep killed while it held it keeps the marker for good: the refusal names
    # it, where before it said "another sweep" whatever the marker held
    lock = folder("stale-lock", f"pid={gone.pid} host={host} started=0\n") / preflight.TAKING_LOCK
    lock.touch()
    with pytest.raises(ConfigError) as fresh:
        preflight.claim_folder(lock.parent, "hydra.sweep.dir")
    assert "already holds another sweep" in str(fresh.value)  # a lock just taken: another sweep is looking
    past = time.time() - preflight.TAKING_LOCK_AGE_S - 1
    os.utime(lock, (past, past))
    with pytest.raises(ConfigError) as stale:
        preflight.claim_folder(lock.parent, "hydra.sweep.dir")
    assert f"{lock}, left by a sweep killed while it looked" in str(stale.value), stale.value
    assert f"remove {preflight.TAKING_LOCK} there if no perfsweep is starting" in str(stale.value)
    lock.unlink()  # as the line says: the marker is then looked at, and taken over
    assert preflight.claim_folder(lock.parent, "hydra.sweep.dir").took_over.startswith(f"pid {gone.pid} ")
    # a folder inside a multirun sweep's is refused, but not where the command was launched in or
    # under that sweep's folder (hydra.sweep.dir=. made the launch folder a sweep's): later sweeps'
    # and runs' default folders are there
    outer = folder("outer", f"pid={os.getpid()} host={host} started=0\nsweep_id=9\n", "0_job")
    (outer / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(ConfigError, match=f"is inside the folder of another sweep \\({outer}\\)"):
        preflight.claim_folder(outer / "0_job", "hydra.sweep.dir", launch_dir=tmp_path)
    assert not list((outer / "0_job").iterdir())
    for launched in (outer, outer / "0_job"):
        assert preflight.claim_folder(outer / "multirun" / launched.name, "hydra.sweep.dir", launch_dir=launched).owned
    # a folder where the marker would be: named as such, not as "a file stands where the folder would be"
    (tmp_path / "odd" / SWEEP_MARKER).mkdir(parents=True)
    with pytest.raises(ConfigError) as odd:
        preflight.claim_folder(tmp_path / "odd", "hydra.sweep.dir")
    assert f"its {SWEEP_MARKER} is a folder or a link, not perfsweep's mark" in str(odd.value), odd.value

    # sweeps started at once into such a folder: one claims it, the others are refused
    raced = folder("raced", f"pid={gone.pid} host={host} started=0\n")
    start, outcomes = threading.Barrier(8), []

    def claim() -> None:
        start.wait()
        try:
            outcomes.append(preflight.claim_folder(raced, "hydra.sweep.dir"))
        except ConfigError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(o, preflight.Claim) for o in outcomes) == 1, outcomes
    assert all("already holds another sweep" in str(o) for o in outcomes if isinstance(o, ConfigError))
    assert f"pid={os.getpid()} " in (raced / SWEEP_MARKER).read_text() and not list(raced.glob("*.taking"))

    # a real one: the sweep killed while it measured the CPU's peak; the same command then runs
    args = ["-m", *TINY, "device=cpu", f"db.url=sqlite:///{tmp_path}/r.db", f"hydra.sweep.dir={tmp_path}/sw"]
    proc = start_as_in_a_terminal([sys.executable, "-m", "perfsweep", *args], tmp_path)
    wait_for(lambda: (tmp_path / "sw" / SWEEP_MARKER).exists() or proc.poll() is not None, timeout=60)
    os.killpg(proc.pid, signal.SIGKILL)
    finish(proc, timeout=30)
    again = run_perfsweep(args, tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"hydra.sweep.dir={tmp_path}/sw held only the mark of a sweep that ended before any job" in again.stderr
    assert f"pid {proc.pid} on this host" in again.stderr
    assert [r["status"] for r in rows(tmp_path / "r.db", "SELECT status FROM runs")] == ["ok"]
    assert (tmp_path / "sw" / SWEEP_MARKER).read_text().endswith("sweep_id=1\n")
    assert (tmp_path / "sw" / SWEEP_MARKER).stat().st_mode & 0o111 == 0  # a mark, not a program (it was 0755)


def test_a_plain_run_stopped_as_hydra_makes_its_folder_leaves_none(tmp_path: Path):
    """A SIGTERM the moment Hydra has made a plain run's default folder, before perfsweep's own code
    runs: the empty ``outputs/<date>/<time>`` was left (5 times in 5)."""
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", *TINY, f"db.url=sqlite:///{tmp_path}/r.db"], tmp_path
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "outputs").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)  # a millisecond: close to the folder's making, without starving the sweep
    os.kill(proc.pid, signal.SIGTERM)
    _, err = finish(proc, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert not (tmp_path / "outputs").exists(), [str(p) for p in (tmp_path / "outputs").rglob("*")]


def test_a_stop_between_the_mkdirs_of_a_run_folder_leaves_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The test above, at the moment it failed once in a full run: ``outputs/`` made and not yet
    its date folder. The clean-up stopped at the first parent it could not remove, the date folder
    that was not there, and left ``outputs/``."""
    from perfsweep import preflight

    folder = tmp_path / "outputs" / "2026-11-28" / "18-00-00"
    monkeypatch.setattr(preflight, "_RUN_FOLDER_BEFORE", (folder, tmp_path, None))
    (tmp_path / "outputs").mkdir()
    preflight.remove_refused_run_folder()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("mode", "sig", "after_s"),
    [("multirun", signal.SIGTERM, 0.0), ("multirun", signal.SIGTERM, 0.5), ("run", signal.SIGHUP, 0.0)],
)
def test_a_sweep_stopped_before_its_row_is_written_hands_its_folder_back(
    mode: str, sig: int, after_s: float, tmp_path: Path
):
    """A stop in a sweep's first seconds, after it claimed its folder and while it measured the
    CPU's peak (2.5 s), left the folder's marker without a sweep row: the same command was then
    refused as "another sweep", and resume=true as "no sweep". The folder goes, as on a refusal.
    ``after_s`` 0: the signal the moment the marker is there, as the claim is made (it left the
    marker 8 times in 8, 5 of them empty, before the claim held signals). ``device=cpu``: a sweep
    of CUDA jobs measures no CPU peak, and on an H200 its first job had started 0.5 s after the
    claim (2026-11-28)."""
    folder = tmp_path / "mine"
    args = [*TINY, "device=cpu", f"db.url=sqlite:///{tmp_path}/r.db"]
    args += ["-m", "amp=true,false", f"hydra.sweep.dir={folder}"] if mode == "multirun" else [f"hydra.run.dir={folder}"]
    proc = start_as_in_a_terminal([sys.executable, "-m", "perfsweep", *args], tmp_path)
    deadline = time.monotonic() + 60
    while not (folder / SWEEP_MARKER).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)  # a millisecond: close to the claim, without starving the sweep of a core
    assert proc.poll() is None, "the sweep ended before it claimed its folder"
    time.sleep(after_s)
    os.kill(proc.pid, sig)
    _, err = finish(proc, timeout=60)
    assert proc.returncode == 128 + sig, err[-2000:]
    if sig == signal.SIGTERM:  # a SIGHUP's last line says so too: its stderr is a pipe still read
        assert err.rstrip().endswith("perfsweep: terminated (SIGTERM) before any job started"), err[-2000:]
    else:
        assert err.rstrip().endswith("perfsweep: hung up (SIGHUP) before any job started"), err[-2000:]
    assert not folder.exists(), sorted(p.name for p in folder.iterdir())
    assert not (tmp_path / "r.db").exists() or not rows(tmp_path / "r.db", "SELECT id FROM sweeps")


def test_a_job_killed_with_sigkill_by_a_user_is_not_blamed_on_memory(tmp_path: Path):
    """``kill -9`` of a job's process: its row said "SIGKILL often means the kernel's OOM killer",
    which sent users lowering the batch. Where the memory cgroup's OOM kill count is readable and
    did not change, the row says the OOM killer did not do it; the sweep goes on to the next job."""
    from perfsweep.envinfo import oom_kills

    db = tmp_path / "results.db"
    tiny = [o for o in TINY if not o.startswith("steps.measure")]
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "-m", "device=cpu", "steps.measure=100000000,3", *tiny], tmp_path
    )
    wait_for(lambda: db.exists() and rows(db, "SELECT count(*) AS n FROM runs")[0]["n"] == 1)
    try:
        os.kill(job_process(proc.pid), signal.SIGKILL)
    except BaseException:  # no job found: the sweep, with its 100,000,000 steps, goes too
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    out, err = finish(proc, 120)
    assert proc.returncode == 1, err[-2000:]
    killed, other = rows(db, "SELECT status, error FROM runs ORDER BY job_num")
    assert killed["status"] == "failed" and other["status"] == "ok", (killed, other)
    if oom_kills() is None:  # the kernel does not say here: the likely cause, as a hint
        assert killed["error"] == "job process killed by SIGKILL (often the kernel's OOM killer; check dmesg)"
    else:
        assert killed["error"].startswith("job process killed by SIGKILL, not by the kernel's OOM killer ("), killed


def test_a_kernel_oom_kill_is_an_oom_run_and_the_count_is_read_from_the_cgroup(tmp_path: Path):
    """The OOM killer's SIGKILL (the cgroup's count rose while the job ran) is status ``oom``: the
    config does not fit the host's memory. The count is read from cgroup v1's memory.oom_control
    or v2's memory.events, whichever this process's /proc/self/cgroup names, at the group's root."""
    from perfsweep.envinfo import oom_kills, sigkill_outcome

    status, error, _ = sigkill_outcome("job process", 3, 4)
    assert status == "oom" and "kernel's OOM killer: memory ran out" in error and "rose by 1 while" in error
    assert sigkill_outcome("rank 1", 3, 3)[:2] == (
        "failed",
        "rank 1 killed by SIGKILL, not by the kernel's OOM "
        "killer (the memory cgroup's OOM kill count did not change): another process, a user or a scheduler sent it",
    )
    assert sigkill_outcome("job process", None, 3)[0] == "failed"
    groups = Path("/proc/self/cgroup").read_text()
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 2\noom_kill 5\noom_group_kill 0\n")
    v1 = any(line.split(":")[1] and "memory" in line.split(":")[1].split(",") for line in groups.splitlines())
    assert oom_kills(tmp_path) == (7 if v1 else 5)
    assert oom_kills(tmp_path / "nothing") is None


def test_a_resumed_points_earlier_outcome_is_not_counted_finished_after_a_ctrl_c(tmp_path: Path):
    """What the line after a Ctrl-C counts: the points a resume did not run (ok already), and the
    outcomes of this launch. A resumed point's earlier timeout was counted, and a Ctrl-C as a
    resume began said "every job had finished and is stored; see them with: perfsweep report",
    and closed the sweep done, the point never run again. (Read directly: from outside, a
    Ctrl-C cannot be timed into the moment between the launch and the job's first row.)"""
    from hydra_plugins.perfsweep_sweeper import _finished_count, _last_run_id

    url = store.sqlite_url(tmp_path / "results.db")
    engine = store.connect(url)
    sweep_id = store.get_or_create_sweep(engine, str(tmp_path / "multirun"), "s")
    with store.session(engine) as s:  # the first launch: point 0 ok, point 1 timed out
        s.add_all(
            [store.Run(**run_row(sweep_id, job_num=0)), store.Run(**run_row(sweep_id, job_num=1, status="timeout"))]
        )
    since = _last_run_id(url, sweep_id)  # as the resume starts, with point 1 to run
    assert since > 0
    assert _finished_count(url, sweep_id, 2, [1], since) == 1
    assert _finished_count(url, sweep_id, 2, [0, 1], 0) == 2  # the first launch's own outcomes
    with store.session(engine) as s:
        s.add(store.Run(**run_row(sweep_id, job_num=1, status="running")))
    assert _finished_count(url, sweep_id, 2, [1], since) == 1
    with store.session(engine) as s:
        s.add(store.Run(**run_row(sweep_id, job_num=1, status="oom")))  # an outcome of this launch
    assert _finished_count(url, sweep_id, 2, [1], since) == 2
    engine.dispose()
    gone = tmp_path / "gone.db"  # deleted while the sweep ran: it cannot say, and is not made again
    assert _finished_count(store.sqlite_url(gone), sweep_id, 2, [1], since) is None and not gone.exists()


def test_the_line_after_a_stop_counts_results_kept_as_result_json(tmp_path: Path):
    """Finished jobs whose results the database refused read as unfinished there: the line after
    a Ctrl-C said "no job had finished" of a sweep whose every job had (the summary above it
    showed them ``unsaved``), and named the resume, which ran them again. They are counted, and
    where none is left to run the line names the import (tests/test_kept_results.py stops a real
    sweep in its second job)."""
    from hydra_plugins.perfsweep_sweeper import _stopped_hint, _sweep_gone
    from perfsweep import importer

    url = store.sqlite_url(tmp_path / "results.db")
    sweep_dir = tmp_path / "multirun"
    kept = []
    for num, status in ((0, "ok"), (1, "oom"), (2, "running")):  # a 'running' result is no outcome
        (sweep_dir / str(num)).mkdir(parents=True)
        kept.append(sweep_dir / str(num) / importer.RESULT_FILE)
        run = run_row(1, job_num=num, status=status, run_uid=f"uid{num}")
        importer.write_result_file(kept[-1], {"sweep_dir": str(sweep_dir), "name": "s"}, run)
    resume, store_them = f"perfsweep resume 1 --db {tmp_path / 'results.db'}", f"perfsweep import {sweep_dir} --db"
    assert _stopped_hint(url, 1, sweep_dir, 2, [0, 1], 0, kept[:2]) == (
        f"every job had finished, kept as result.json, which the database refused; store them with: {store_them} "
        f"{tmp_path / 'results.db'}",
        True,
    )
    assert _stopped_hint(url, 1, sweep_dir, 4, [1, 2, 3], 1, kept) == (
        "2 of 4 jobs finished, 1 of them kept as result.json, which the database refused; store it and run the "
        f"rest with: {resume}",
        False,
    )
    assert _stopped_hint(url, 1, sweep_dir, 3, [0, 1, 2], 0, []) == (
        f"no job had finished; run them with: {resume}",
        False,
    )
    assert _stopped_hint(url, 1, sweep_dir, 3, [2], 2, kept)[0].startswith("2 of 3 jobs finished and are stored")
    # the database file replaced while the sweep ran: no resume finds the sweep there, the import does
    store.connect(url).dispose()
    assert _sweep_gone(url, 1, sweep_dir)
    engine = store.connect(url)
    store.get_or_create_sweep(engine, str(sweep_dir), "s")
    engine.dispose()
    assert not _sweep_gone(url, 1, sweep_dir) and _sweep_gone(url, 1, tmp_path / "another")
    assert _stopped_hint(url, 1, sweep_dir, 2, [0, 1], None, kept[:1]) == (
        "the database no longer holds the sweep (its file was deleted or replaced after the sweep began); 1 "
        f"finished result is kept as result.json; store it with: {store_them} {tmp_path / 'results.db'}, then run "
        f"the rest with: perfsweep resume N --db {tmp_path / 'results.db'}, N the sweep it names",
        False,
    )


def test_sweep_killed_with_sigkill_then_resumed(tmp_path: Path):
    db = tmp_path / "results.db"
    proc = subprocess.Popen(
        # three grid points: the first is done, the second killed midway, the third never starts
        [sys.executable, "-m", "perfsweep", "-m", "batch=2,3,4", "report=true"]
        + [o for o in TINY if not o.startswith(("batch", "report"))],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # after the first job is stored and while the second one runs
        wait_for(lambda: db.exists() and rows(db, "SELECT group_concat(status) AS s FROM runs")[0]["s"] == "ok,running")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its running job, with no chance to clean up
        proc.wait()
    assert "running" in {r["status"] for r in rows(db, "SELECT status FROM runs")}
    # --close runs no job: two grid points never finished, so it refuses and says what runs them
    res = run_perfsweep(["resume", "1", "--close"], tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        "perfsweep resume: sweep 1: 2 grid points did not finish (interrupted or never started); "
        f"run them with: perfsweep resume 1 --db {db}"
    ), res.stderr[-3000:]

    res = run_perfsweep(["resume", "1"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "already ok" in res.stderr
    runs = rows(db, "SELECT job_num, status, config_hash FROM runs ORDER BY id")
    ok = [r["job_num"] for r in runs if r["status"] == "ok"]
    assert sorted(ok) == [0, 1, 2], runs  # every grid point done exactly once
    assert [r["job_num"] for r in runs if r["status"] == "interrupted"] == [1]
    assert "running" not in {r["status"] for r in runs}
    assert {r["status"] for r in runs} <= {"ok", "interrupted"}
    assert rows(db, "SELECT status FROM sweeps") == [{"status": "done"}]
    assert rows(db, "PRAGMA integrity_check") == [{"integrity_check": "ok"}]
    # a resumed job lands in its original folder, named by the grid point, not by resume=true
    sweep_dir = next((tmp_path / "multirun").glob("*/*"))
    dirs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert [d.split("_")[0] for d in dirs if d[0].isdigit()] == ["0", "1", "2"]
    # the resumed sweep built its report; without it, a resume with nothing to run says how to build it
    shutil.rmtree(sweep_dir / "report")
    res = run_perfsweep(["resume", "1"], tmp_path)
    assert res.returncode == 0 and "3 of 3 jobs already ok, 0 to run" in res.stderr, res.stderr[-3000:]
    assert f"build it with: perfsweep report --sweep 1 --db {db}" in res.stdout
    assert not any("resume" in d for d in dirs)

    ended = rows(db, "SELECT finished_at FROM sweeps")
    res = run_perfsweep(["resume", "config"], tmp_path)  # by name; nothing left: no job, no row, nothing rewritten
    assert res.returncode == 0 and "0 to run" in res.stderr
    assert len(rows(db, "SELECT id FROM runs")) == len(runs)
    assert rows(db, "SELECT finished_at FROM sweeps") == ended
