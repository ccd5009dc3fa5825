"""``perfsweep import PATH... [--db URL]``: results a job kept on disk, written into a database.

When a job's database write fails (the server went down, the disk filled, the file became
read-only) the launcher keeps the whole result, steps and profiler tables included, as
``result.json`` in the job's folder. This command writes such files into any database later.
Importing is idempotent: every result carries the run's ``run_uid``, a result already stored
with a final status is skipped, and a row the job left ``running`` or ``interrupted`` is
completed in place, so importing twice adds nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from perfsweep import metrics, store
from perfsweep.cli import OneLineParser, UserError, first_line, waiting_for_database
from perfsweep.names import FINAL_STATUSES, NOISY_RULE_IQR_ONLY, RUN_STATUSES

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"
FORMAT = "perfsweep-result/1"


def write_result_file(path: Path, sweep: dict[str, Any], run: dict[str, Any]) -> None:
    """Keep a job's result on disk in the form :func:`import_file` reads (atomic: write, rename)."""
    from perfsweep.store import json_default

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "sweep": sweep, "run": run}, default=json_default, indent=1))
    tmp.replace(path)


def result_files(paths: list[str]) -> list[Path]:
    """``result.json`` files named directly or found under job and sweep folders, sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            found.extend(sorted(p.rglob(RESULT_FILE)))
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return found


def read_result(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a perfsweep result ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a perfsweep result (no format={FORMAT!r})")
    sweep, run = doc.get("sweep"), doc.get("run")
    # what import_file reads before the database: a file short of it was a KeyError that stopped the
    # whole import, or was blamed on the database ("the database refused the write ('sweep_dir')")
    missing = [
        key
        for key, part, field in (("sweep.sweep_dir", sweep, "sweep_dir"), ("sweep.name", sweep, "name"))
        + (("run.run_uid", run, "run_uid"),)
        if not isinstance(part, dict) or not isinstance(part.get(field), str)
    ]
    if missing:
        raise ValueError(f"{path}: not a whole perfsweep result (no {', '.join(missing)})")
    if problem := _field_problem(sweep, run):
        raise ValueError(f"{path}: not a perfsweep result as written ({problem})")
    return sweep, run


SWEEP_FIELDS = ("sweep_dir", "name", "command", "n_jobs", "hostname", "launch_dir")
"""What :func:`import_file` takes from a result's ``sweep`` (the rest is the sweep's own)."""


def _field_problem(sweep: dict[str, Any], run: dict[str, Any]) -> str | None:
    """The first field the tables would not take as it is (:func:`perfsweep.store.field_problem`),
    checked before the database is opened: a file edited by hand, or by another tool, was stored
    with ``status: 5`` or ``config_json`` as text, and the sweep's report failed later."""
    if not run["run_uid"].strip():
        return "run.run_uid is empty"
    fields = {k: v for k, v in run.items() if k not in store.RUN_CHILDREN}
    problem = store.field_problem(store.Sweep, {k: sweep[k] for k in SWEEP_FIELDS if k in sweep}, "sweep")
    problem = problem or store.field_problem(store.Run, fields, "run")
    if problem is None and run.get("status") not in RUN_STATUSES:  # "bogus" was stored, and broke the report
        problem = f"run.status is {store.shown_value(run.get('status'))}; it is one of {', '.join(RUN_STATUSES)}"
    for attr, cls in store.RUN_CHILDREN.items():
        rows = run.get(attr) or []
        if problem is None and not isinstance(rows, list):
            problem = f"run.{attr} is {store.shown_value(rows)}, not a list of {cls.__tablename__} rows"
        for i, row in enumerate(rows if isinstance(rows, list) else []):
            problem = problem or store.field_problem(cls, row, f"run.{attr}[{i}]")
    return problem


def import_file(engine: Engine, path: Path) -> tuple[str, int]:
    """Write one result file; returns 'imported', 'completed' or 'already stored', and its sweep's id."""
    sweep, run = read_result(path)
    run = dict(run)
    run.pop("id", None)
    if run.get("noisy") is not None and "noisy_rule" not in run:  # kept by a perfsweep older than schema 0012
        run["noisy_rule"] = NOISY_RULE_IQR_ONLY
    if run.get("final_loss") is not None and "nonfinite_loss_steps" not in run:  # older than schema 0013
        measured = [s.get("loss") for s in run.get("steps") or [] if s.get("phase") == "measure"]
        run["nonfinite_loss_steps"] = metrics.nonfinite_count(x for x in measured if x is not None)
    run["sweep_id"] = store.get_or_create_sweep(
        engine,
        sweep["sweep_dir"],
        sweep["name"],
        **{k: sweep.get(k) for k in SWEEP_FIELDS[2:]},
    )
    with store.session(engine) as s:  # a sweep that exists only through imported results has ended
        s.execute(
            update(store.Sweep)
            .where(store.Sweep.id == run["sweep_id"], store.Sweep.status.is_(None))
            .values(status="done", finished_at=_when(run.get("finished_at")))
        )
    with store.session(engine) as s:
        existing = s.scalar(select(store.Run).where(store.Run.run_uid == run["run_uid"]))
        if existing is not None and existing.status in FINAL_STATUSES:
            return "already stored", run["sweep_id"]
        run_id = existing.id if existing is not None else None
    store.save_run(engine, run, run_id=run_id)
    return "completed" if run_id is not None else "imported", run["sweep_id"]


def _when(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def spare_folder(sweep_dir: str | Path) -> Path:
    """Where a sweep's results go when the database refused them and a job's own folder could not
    take the file either (deleted, or its disk full): under the system's temporary folder."""
    return Path(tempfile.gettempdir()) / "perfsweep-unsaved" / Path(sweep_dir).name


def import_command(url: str, sweep_dir: str | Path, files: list[Path]) -> str:
    """The command that stores ``files`` (kept in ``sweep_dir`` or its :func:`spare_folder`)."""
    spare = spare_folder(sweep_dir)
    from perfsweep.summary import db_arg  # pandas: only for a hint to print

    places = [str(sweep_dir)] + ([str(spare)] if any(spare in f.parents for f in files) else [])
    # quoted, to run as pasted: a folder with a space or a '#' in its name split the command or ended it
    return f"perfsweep import {' '.join(map(shlex.quote, places))} --db {db_arg(url)}"


def kept_of_sweep(url: str, sweep_dir: str) -> list[Path]:
    """The result files of the sweep in ``sweep_dir`` (its job folders, or its :func:`spare_folder`)
    whose run ``url`` does not hold with a final status; all of them where it cannot be read. Only
    this sweep's: the spare folder is named after the sweep folder's last part, so another sweep's
    results may lie there too."""
    found = kept_of_sweep_if_known(url, sweep_dir)
    return _of_sweep(_result_files(sweep_dir), sweep_dir) if found is None else found


def kept_of_sweep_if_known(url: str, sweep_dir: str) -> list[Path] | None:
    """:func:`kept_of_sweep`, or None where the database cannot be read: a stopped sweep's count
    of its finished jobs took an earlier launch's stored file for one of this launch's then."""
    pending = _pending(url, _result_files(sweep_dir))
    return None if pending is None else _of_sweep(pending, sweep_dir)


def _result_files(sweep_dir: str) -> list[Path]:
    return sorted(f for folder in (Path(sweep_dir), spare_folder(sweep_dir)) for f in folder.rglob(RESULT_FILE))


def _pending(url: str, files: list[Path]) -> list[Path] | None:
    """The readable results among ``files`` whose run ``url`` does not hold with a final status;
    None when it cannot be read. Through a read-only connection: a locked SQLite file is read at
    once (a writing one waited 30 s to mark dead runs, and 30 more for the write lock), and one
    deleted is not made again."""
    if not files:
        return []
    uids: dict[str, Path] = {}
    for f in files:
        try:
            uids[read_result(f)[1]["run_uid"]] = f
        except (ValueError, KeyError):
            continue
    try:
        engine = store.connect_read_only(url)
        try:
            with store.session(engine) as s:
                stored = set(
                    s.scalars(
                        select(store.Run.run_uid).where(
                            store.Run.run_uid.in_(list(uids)), store.Run.status.in_(FINAL_STATUSES)
                        )
                    )
                )
        finally:
            engine.dispose()
    except Exception:  # noqa: BLE001 - unreachable, gone or locked out: it cannot say what is stored
        return None
    return [f for uid, f in uids.items() if uid not in stored]


def _of_sweep(files: list[Path], sweep_dir: str) -> list[Path]:
    found = []
    for f in files:
        with contextlib.suppress(ValueError):  # not a result: `perfsweep import` names it
            if read_result(f)[0]["sweep_dir"] == sweep_dir:
                found.append(f)
    return found


def _unreadable_kept(sweep_dir: str) -> list[str]:
    """Why each result file under ``sweep_dir`` that is no result is not (truncated by a full
    disk, edited): a resume skipped them without a word, and ran their grid points again. (The
    spare folder is not looked in: whose such a file there is, nothing says.)"""
    said = []
    for f in sorted(Path(sweep_dir).rglob(RESULT_FILE)):
        try:
            read_result(f)
        except ValueError as exc:
            said.append(str(exc))
    return said


class KeptRefused(Exception):
    """The database refused a result a sweep kept as result.json; the message is the driver's
    first line and what to do about it. That file and those after it stay on disk."""


def store_kept(url: str, sweep_dir: str, say_as: str) -> list[str]:
    """Store the results the database refused to the sweep in ``sweep_dir`` and its jobs kept as
    result.json; returns the statuses of those stored. A resume does this first (``perfsweep
    resume`` and ``resume=true``, each saying it as ``say_as``): those grid points read as
    unfinished in the database, so it ran their jobs again (and a later import stored each point
    twice). A result file that is no result is said, and skipped; :class:`KeptRefused` where the
    database refuses one."""
    for why in _unreadable_kept(sweep_dir):
        print(f"{say_as}: {why}; not stored", file=sys.stderr)
    try:
        files = kept_of_sweep(url, sweep_dir)
        if not files:
            return []
        engine = store.connect(url)
        statuses: list[str] = []
        sweep_ids: set[int] = set()
        try:
            for f in files:
                outcome, sweep_id = import_file(engine, f)
                log.debug("%s: %s", f, outcome)  # stored_line says how many
                if outcome != "already stored":
                    statuses.append(str(read_result(f)[1].get("status")))
                    sweep_ids.add(sweep_id)
            _redraw(engine, sweep_ids)  # a sweep closed already (every job had finished) is not closed again
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - the driver's first line says what
        raise KeptRefused(f"{first_line(exc)}{store.write_hint(url, exc)}") from exc
    return statuses


def stored_line(statuses: list[str]) -> str:
    """What :func:`store_kept` did, for a person: ``stored 2 results this sweep kept as
    result.json when the database refused them (1 ok, 1 failed)``. The statuses tell which grid
    points a resume still runs (any but ok), so it does not say they are done."""
    many = len(statuses) != 1
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    return (
        f"stored {len(statuses)} result{'s' if many else ''} this sweep kept as {RESULT_FILE} when the database "
        f"refused {'them' if many else 'it'} ({counts})"
    )


def kept_hint(url: str, sweep_dir: str) -> str | None:
    """The last line's advice after a stop that came once every job had ended (the sweep being
    closed, its summary printed), where some results are only on disk: it said "the runs are
    stored", and ``resume --close`` then found nothing to do. None where none is kept."""
    try:
        kept = kept_of_sweep(url, sweep_dir)
    except Exception:  # noqa: BLE001 - the database cannot say: the summary above shows what is kept
        return None
    if not kept:
        return None
    them = f"{len(kept)} results" if len(kept) != 1 else "a result"
    return (
        f"{them} the database refused {'are' if len(kept) != 1 else 'is'} kept as {RESULT_FILE}; "
        f"store {'them' if len(kept) != 1 else 'it'} with: {import_command(url, sweep_dir, kept)}"
    )


def kept_runs(files: Sequence[Path]) -> list[dict[str, Any]]:
    """The ``runs`` rows kept in the readable result files among ``files`` (each with its run_uid)."""
    runs = []
    for f in files:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            run = read_result(f)[1]
            if isinstance(run.get("run_uid"), str):
                runs.append(run)
    return runs


def _redraw(engine: Engine, sweep_ids: set[int]) -> None:
    """The closing figures (speedups, numerics audit, ...) of the sweeps imported into: drawn at
    the sweep's end without the runs imported now, they would leave SQL reading stale speedups."""
    if not sweep_ids:
        return
    from perfsweep.summary import fill_sweep_figures  # pandas, only when something was stored

    for sweep_id in sorted(sweep_ids):
        try:
            fill_sweep_figures(engine, sweep_id)
        except Exception as exc:  # noqa: BLE001 - the runs are stored; only the derived figures are missing
            print(
                f"perfsweep import: sweep {sweep_id}: the runs are stored, but its speedups and numerics could "
                f"not be redrawn ({first_line(exc)}); run the import again to redraw them",
                file=sys.stderr,
            )


def _next_steps(engine: Engine, url: str, sweep_ids: set[int]) -> list[str]:
    """What to type next for each sweep imported into: its report (the one in its folder was drawn
    without these results), or, for a sweep never closed (its end was refused too, or its sweeper
    stopped), ``perfsweep resume``: ``--close`` where every grid point has finished, which runs
    no job, else plain, which runs what is missing and then closes it."""
    from perfsweep.summary import db_arg, report_command, unfinished_points

    try:
        with store.session(engine) as s:
            rows = s.execute(select(store.Sweep.id, store.Sweep.status).where(store.Sweep.id.in_(sweep_ids))).all()
        left = {i: unfinished_points(engine, i) for i, status in rows if status != "done"}
    except Exception:  # noqa: BLE001 - the import itself is done and said; only the hint is missing
        return []
    lines = []
    for i in sorted(sweep_ids):
        if i not in left:
            lines.append(f"sweep {i}: see it with: {report_command(url, i)}")
        elif left[i]:
            lines.append(
                f"sweep {i} is not closed: run what is missing and close it with: perfsweep resume {i} --db {db_arg(url)}"
            )
        else:
            lines.append(f"sweep {i} is not closed: close it with: perfsweep resume {i} --close --db {db_arg(url)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="perfsweep import", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="PATH", help="result.json files, job folders or sweep folders")
    parser.add_argument("--db", default=None, help="SQLAlchemy URL or SQLite file (default: ./results.db)")
    args = parser.parse_args(argv)

    try:
        files = result_files(args.paths)
    except FileNotFoundError as exc:
        print(f"perfsweep import: {exc}", file=sys.stderr)
        return 2
    if not files:
        print(f"perfsweep import: no {RESULT_FILE} under {' '.join(args.paths)}; nothing to import", file=sys.stderr)
        return 2
    try:
        url = store.url_from_arg(store.DEFAULT_DB_ARG if args.db is None else args.db)
    except UserError as exc:
        print(f"perfsweep import: {exc}", file=sys.stderr)
        return 2
    unreadable = set()
    for f in files:  # read first: a database is neither created nor opened for files that are no results
        try:
            read_result(f)
        except ValueError as exc:  # not a result (truncated, foreign): said; the others are still imported
            print(f"perfsweep import: {exc}", file=sys.stderr)
            unreadable.add(f)
    if len(unreadable) == len(files):
        print(f"{len(files)} result file{'s' if len(files) != 1 else ''}: {len(files)} unreadable; nothing written")
        return 2
    try:
        with waiting_for_database(url):
            engine = store.connect(url, check=True)
    except Exception as exc:  # noqa: BLE001 - the driver's first line says what
        print(
            f"perfsweep import: cannot open --db {store.hide_password(url)}: {first_line(exc)}{store.write_hint(url, exc)}",
            file=sys.stderr,
        )
        return 2
    counts: dict[str, int] = {}
    touched: set[int] = set()  # their closing figures are drawn again (also when nothing was new: a retry)
    try:
        for f in files:
            try:
                if f in unreadable:  # said above
                    outcome = "unreadable"
                else:
                    outcome, sweep_id = import_file(engine, f)
                    touched.add(sweep_id)
            except ValueError as exc:  # changed since it was read, or a field runs does not have
                print(f"perfsweep import: {exc if str(exc).startswith(str(f)) else f'{f}: {exc}'}", file=sys.stderr)
                outcome = "unreadable"
            except Exception as exc:  # noqa: BLE001 - the database refused; the file stays for a retry
                print(
                    f"perfsweep import: {f}: the database refused the write ({first_line(exc)}"
                    f"{store.write_hint(url, exc)}); the file is kept",
                    file=sys.stderr,
                )
                outcome = "not stored"
            counts[outcome] = counts.get(outcome, 0) + 1
            log.info("%s: %s", f, outcome)
    finally:
        try:
            _redraw(engine, touched)
            after = _next_steps(engine, url, touched) if "not stored" not in counts else []
        finally:
            engine.dispose()
    summary = ", ".join(f"{n} {what}" for what, n in counts.items())
    print(f"{len(files)} result file{'s' if len(files) != 1 else ''}: {summary} ({store.hide_password(url)})")
    for line in after:
        print(line)
    if counts.get("unreadable") == len(files):
        return 2
    return 1 if "not stored" in counts or "unreadable" in counts else 0


if __name__ == "__main__":
    sys.exit(main())
