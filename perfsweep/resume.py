"""``perfsweep resume SWEEP [--db URL] [--close]`` (an id or a name): finish a sweep that was interrupted or had failures.

Reruns, into the same sweep id and the same job folders, only the grid points that have no
``ok`` run: failed, out of memory, timed out, interrupted or never started. It runs the sweep's
own command again from the folder it was launched in, with ``hydra.sweep.dir`` pointing at
the sweep's folder and ``resume=true``; the sweeper then skips every grid point already done.
Earlier failed and interrupted rows stay in the database as history. With nothing left to run,
a sweep that was never closed (the database refused its end after the last job) is closed
``done`` with its closing figures; a single run, which is not rerun, is closed here.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

from sqlalchemy import select

from perfsweep import store
from perfsweep.cli import OneLineParser, UserError, first_line, waiting_for_database
from perfsweep.names import SWEEP_MARKER, is_multirun
from perfsweep.results import resolve_sweep


def _quoted(value: str) -> str:
    """A Hydra override value in single quotes, so paths and URLs with = : @ or spaces pass intact."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def command_for(sweep: store.Sweep, db_url: str | None = None) -> list[str]:
    """The argv that resumes ``sweep``: its own overrides, its folder, ``resume=true``; with
    ``db_url``, results go there whatever database the original command named."""
    words = shlex.split(sweep.command or "")
    if not words or words[0] != "perfsweep":
        raise ValueError(f"sweep {sweep.id} has no stored perfsweep command; it cannot be resumed")
    if not is_multirun(sweep.command):
        raise ValueError(
            f"sweep {sweep.id} was a single run ({store.hide_password(sweep.command or '')}); run that command again instead"
        )
    drop = ("hydra.sweep.dir=", "resume=", *(("db.url=",) if db_url else ()))
    keep = [w for w in words[1:] if not w.startswith(drop)]
    extra = [f"db.url={_quoted(db_url)}"] if db_url else []
    return [
        sys.executable,
        "-m",
        "perfsweep",
        *keep,
        f"hydra.sweep.dir={_quoted(sweep.sweep_dir)}",
        "resume=true",
        *extra,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="perfsweep resume", description=__doc__.splitlines()[0])
    parser.add_argument(
        "sweep", metavar="SWEEP", help="the sweep's id (sweeps.id) or name (sweeps.name; the latest with that name)"
    )
    parser.add_argument(
        "--db", default=store.DEFAULT_DB_ARG, help="SQLAlchemy URL or SQLite file (default: ./results.db)"
    )
    parser.add_argument(
        "--close",
        action="store_true",
        help="run no job: store the end and closing figures of a sweep whose every grid point has finished "
        "(ok or not) but whose end the database refused; a single run is closed so without it",
    )
    args = parser.parse_args(argv)
    url, db = None, store.hide_password(args.db)
    try:
        url = store.existing_url(args.db)
        if why := store.unreadable(url):  # SQLite's "unable to open database file" says neither
            raise UserError(f"--db {db}: {why}")
        probe = store.connect_read_only(url)
        try:  # an empty or foreign file is not given a schema only to be told it holds no sweep, nor
            # is a database upgraded, or its dead runs marked, for a sweep it does not hold
            if (revision := store.schema_revision(probe)) is None:
                raise UserError(f"--db {db}: not a perfsweep results database (no schema version)")
            if why := store.unknown_revision(revision, url):  # a newer perfsweep's: its tables are not read as ours
                raise UserError(f"--db {db}: {why}")
            try:
                sweep_id = resolve_sweep(probe, args.sweep, "SWEEP")
            except UserError as exc:
                raise UserError(
                    f"{exc}; list them with: perfsweep query 'select id, name, status, created_at from sweeps' "
                    f"--db {shlex.quote(db)}"
                ) from None
        finally:
            probe.dispose()
        with waiting_for_database(url):  # marks runs of dead processes interrupted first
            engine = store.connect(url)  # (and upgrades an older schema)
        try:
            with store.session(engine) as s:
                sweep = s.scalar(select(store.Sweep).where(store.Sweep.id == sweep_id))
        finally:
            engine.dispose()
    except UserError as exc:
        print(f"perfsweep resume: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the driver's first line says what
        hint = store.write_hint(url, exc) if url else ""
        print(f"perfsweep resume: cannot open --db {db}: {first_line(exc)}{hint}", file=sys.stderr)
        return 2
    if sweep.status == "running":
        print(
            f"perfsweep resume: sweep {sweep.id} is still running (pid {sweep.pid} on {sweep.hostname}); "
            "wait for it or stop it first",
            file=sys.stderr,
        )
        return 2
    single = bool(sweep.command) and not is_multirun(sweep.command)  # a sweep imported into has no command
    if args.close or single:  # runs no job: its folder may be gone
        if (stored := _store_kept(url, sweep)) is None:
            return 1
        if sweep.status != "done":
            return _close(url, sweep)
        if stored:  # closed without them: the figures are drawn again (store_kept), and the report
            _show(url, sweep)
            return 0
        if args.close:
            print(f"perfsweep resume: sweep {sweep.id} is closed already; nothing to store", file=sys.stderr)
            return 0
    if sweep.sweep_dir and not os.path.isfile(os.path.join(sweep.sweep_dir, SWEEP_MARKER)):
        print(
            f"perfsweep resume: sweep {sweep.id}'s folder {sweep.sweep_dir} is gone (moved or deleted), and its "
            "jobs go back into it; move it back, or run the sweep's command again for a new sweep",
            file=sys.stderr,
        )
        return 2
    launch_dir = sweep.launch_dir or os.getcwd()
    if not os.path.isdir(launch_dir):
        print(
            f"perfsweep resume: sweep {sweep.id} was launched in {launch_dir}, which no longer exists", file=sys.stderr
        )
        return 2
    try:  # the database named here, even when the sweep's command used the default one
        cmd = command_for(sweep, db_url=None if url == store.default_url(launch_dir) else url)
    except ValueError as exc:
        print(f"perfsweep resume: {exc}", file=sys.stderr)
        return 2
    shown = " ".join(map(store.hide_password_in_word, cmd[2:]))
    print(f"perfsweep resume: sweep {sweep.id} in {launch_dir}: {shown}", file=sys.stderr)
    proc = subprocess.Popen(cmd, cwd=launch_dir)
    # stop the sweep, not orphan it: SIGTERM, and SIGHUP (its terminal closed) unless under nohup
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # the sweep got the same Ctrl-C: let it mark its jobs and exit
            continue


def _close(url: str, sweep: store.Sweep) -> int:
    """``--close`` (and a single run that was not closed): store the sweep's end and closing
    figures, running no job, once every grid point has finished; its report is drawn again where
    the sweep had one (drawn before, without the closing figures)."""
    from perfsweep import summary  # pandas: only for a sweep to close

    multirun = not sweep.command or is_multirun(sweep.command)
    engine = store.connect(url)
    try:
        left = summary.unfinished_points(engine, sweep.id)
    finally:
        engine.dispose()
    if left:
        todo = (
            f"run {'them' if left != 1 else 'it'} with: perfsweep resume {sweep.id} --db {summary.db_arg(url)}"
            if multirun
            else "run its command again to measure it"
        )
        what = f"{left} grid point{'s' if left != 1 else ''}" if multirun else "its run"
        print(
            f"perfsweep resume: sweep {sweep.id}: {what} did not finish (interrupted or never started); {todo}",
            file=sys.stderr,
        )
        return 2
    late = summary.close_late(url, sweep.sweep_dir)
    if late is None:  # closed meanwhile
        print(f"perfsweep resume: sweep {sweep.id} is closed already; nothing to store", file=sys.stderr)
        return 0
    if not late[1]:
        print(summary.unclosed_line(url, sweep.id), file=sys.stderr)
        return 1
    statuses = summary.run_statuses(url, sweep.id)  # every row: a rerun point's earlier ones too
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    runs = f"{len(statuses)} run{'s' if len(statuses) != 1 else ''}"
    print(
        f"perfsweep resume: sweep {sweep.id} ({runs}: {counts}): its end and closing figures are stored; "
        "no job was run",
        file=sys.stderr,
    )
    _show(url, sweep)
    return 0


def _show(url: str, sweep: store.Sweep) -> None:
    """The sweep's summary, and its report drawn again where it had one (drawn before without
    what was stored since)."""
    from perfsweep import summary

    redraw = bool(sweep.sweep_dir) and os.path.isfile(os.path.join(sweep.sweep_dir, "report", "report.md"))
    summary.show_sweep(url, sweep.sweep_dir, make_report=redraw)
    if not redraw:  # none was drawn (report=false, or the sweep stopped first): said, not left to guess
        print(f"Report:  none drawn; draw it with: {summary.report_command(url, sweep.id)}")


def _store_kept(url: str, sweep: store.Sweep) -> list[str] | None:
    """``--close`` (and a single run) first stores the results the database refused and the jobs
    kept as result.json (perfsweep.importer.store_kept): without them their grid points read as
    unfinished, and a closed sweep as having nothing to store. None, said, where it still refuses."""
    from perfsweep import importer

    if not sweep.sweep_dir:
        return []
    try:
        stored = importer.store_kept(url, sweep.sweep_dir, "perfsweep resume")
    except importer.KeptRefused as exc:
        print(
            f"perfsweep resume: sweep {sweep.id}: the database refused a result it kept as {importer.RESULT_FILE} "
            f"({exc}); it stays on disk; run this again once the database takes writes (a file it refuses for "
            "good: move it out of the sweep's folder)",
            file=sys.stderr,
        )
        return None
    if stored:
        print(f"perfsweep resume: sweep {sweep.id}: {importer.stored_line(stored)}", file=sys.stderr)
    return stored


if __name__ == "__main__":
    sys.exit(main())
