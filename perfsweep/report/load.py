"""Reading the result database for a report: which sweeps, which runs, and their detail rows.

Runs come back in one query (all ``runs`` columns but the JSON config), so a report over
10,000 runs costs one round trip. The child tables (``stages``, ``steps``) are read only for
the few configs a chart actually draws.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
from sqlalchemy import literal_column, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from perfsweep import store
from perfsweep.report.where import WhereError, parse_where

log = logging.getLogger(__name__)

DEFAULT_DB = "sqlite:///./results.db"

SKIP_RUN_COLUMNS: frozenset[str] = frozenset({"config_json"})
"""Large JSON blobs no chart or table needs; leaving them out keeps the runs query fast."""


class ReportError(Exception):
    """A problem the user can fix (wrong option value, empty selection); one line, no traceback."""


def db_url(db: str) -> str:
    """A SQLAlchemy URL from ``--db``: URLs pass through, plain paths become sqlite URLs."""
    if db.startswith("sqlite:///"):
        path = db.removeprefix("sqlite:///")
        if path and path != ":memory:" and not Path(path).is_absolute():
            return f"sqlite:///{Path(path).resolve()}"  # report.md then says where the file is
        return db
    if "://" in db:
        return db
    return f"sqlite:///{Path(db).expanduser().resolve()}"


def existing_db_url(db: str) -> str:
    """:func:`db_url` of ``db``; a missing SQLite file is an error, not a new empty file."""
    url = db_url(db)
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if str(path) != ":memory:" and not path.is_file():
            raise ReportError(f"--db {db}: database file not found ({path})")
    return url


def open_db(db: str) -> Engine:
    """Open an existing database read-only; a missing SQLite file is an error, not a new empty file.

    A report never writes, so it works on read-only media. A database whose schema is older than
    this perfsweep is not upgraded behind the user's back: the error names the command that does.
    """
    url = existing_db_url(db)
    try:
        engine = store.connect_read_only(url)
        revision = store.schema_revision(engine)
    except Exception as exc:  # driver missing, server unreachable, not a database...
        raise ReportError(f"--db {db}: cannot open the database ({db_error_line(exc)})") from exc
    head = store.head_revision()
    if revision != head:
        engine.dispose()
        if revision is None:
            raise ReportError(f"--db {db}: not a perfsweep results database (no schema version)")
        raise ReportError(
            f"--db {db}: schema revision {revision} is older than this perfsweep's {head}; "
            f"upgrade it first with: perfsweep upgrade --db {db}"
        )
    return engine


def db_error_line(exc: BaseException) -> str:
    """The driver's own message (e.g. 'no such column: x'), without SQLAlchemy's SQL echo."""
    while getattr(exc, "orig", None) is None and exc.__cause__ is not None:
        exc = exc.__cause__
    orig = getattr(exc, "orig", None) or exc
    text_ = str(orig).strip()
    return text_.splitlines()[0] if text_ else type(exc).__name__


def _ids_sql(ids: Iterable[int]) -> str:
    return ", ".join(str(int(i)) for i in ids)


def load_sweeps(engine: Engine, sweep_ids: Sequence[int] | None = None) -> pd.DataFrame:
    sql = "SELECT id, name, sweep_dir, command, n_jobs, hostname, created_at FROM sweeps"
    if sweep_ids is not None:
        sql += f" WHERE id IN ({_ids_sql(sweep_ids) or 'NULL'})"
    return pd.read_sql_query(sql + " ORDER BY id", engine)


def resolve_sweep(engine: Engine, spec: str | int | None, option: str = "--sweep") -> int:
    """Sweep id for ``spec``: an id, a sweeps.name (latest with that name), or None for the latest."""
    sweeps = load_sweeps(engine)
    if sweeps.empty:
        raise ReportError(f"{option}: the database has no sweeps yet")
    if spec is None:
        return int(sweeps["id"].iloc[-1])
    text_spec = str(spec).strip()
    if text_spec.isdigit():
        sid = int(text_spec)
        if sid not in set(sweeps["id"]):
            known = ", ".join(str(i) for i in sweeps["id"].tail(10))
            raise ReportError(f"{option} {text_spec}: no sweep with id {sid} (latest ids: {known})")
        return sid
    named = sweeps[sweeps["name"] == text_spec]
    if named.empty:
        names = ", ".join(sorted(set(sweeps["name"].astype(str)))[:10])
        raise ReportError(f"{option} {text_spec}: no sweep with that id or name (names: {names})")
    return int(named["id"].iloc[-1])


def run_columns() -> list[str]:
    return [c.name for c in store.Run.__table__.columns if c.name not in SKIP_RUN_COLUMNS]


def load_runs(engine: Engine, sweep_ids: Sequence[int], where: str | None = None) -> pd.DataFrame:
    """All runs of ``sweep_ids``, optionally filtered by ``where`` (see perfsweep.report.where).

    The filter is parsed into an expression over ``runs`` columns with bound values, never
    pasted into SQL, so it can neither write nor reach runs of other sweeps.
    """
    runs = store.Run.__table__
    # untyped result columns: values come back as the driver gives them (JSON as text), as before
    query = (
        select(*(literal_column(name) for name in run_columns()))
        .select_from(runs)
        .where(runs.c.sweep_id.in_([int(i) for i in sweep_ids]))
    )
    if where:
        try:
            query = query.where(parse_where(where, runs, skip=SKIP_RUN_COLUMNS))
        except WhereError as exc:
            raise ReportError(f"--where {where!r}: {exc}") from None
    try:
        df = pd.read_sql_query(query, engine)
    except (DBAPIError, pd.errors.DatabaseError) as exc:
        if where:
            raise ReportError(f"--where {where!r}: the database rejected it ({db_error_line(exc)})") from exc
        raise
    for col in ("started_at", "finished_at"):
        df[col] = pd.to_datetime(df[col], utc=True, errors="coerce", format="mixed")
    log.debug("loaded %d runs of sweeps %s", len(df), list(sweep_ids))
    return df


def load_stages(engine: Engine, run_ids: Iterable[int]) -> pd.DataFrame:
    ids = _ids_sql(run_ids)
    sql = (
        "SELECT run_id, stage, cpu_time_ms, device_time_ms, device_time_source, calls FROM stages "
        f"WHERE run_id IN ({ids or 'NULL'})"
    )
    return pd.read_sql_query(sql, engine)


def load_kernels(engine: Engine, run_ids: Iterable[int]) -> pd.DataFrame:
    ids = _ids_sql(run_ids)
    sql = f"SELECT run_id, category, ms_per_step, kernels_per_step FROM kernels WHERE run_id IN ({ids or 'NULL'})"
    return pd.read_sql_query(sql, engine)


def load_steps(engine: Engine, run_ids: Iterable[int], phase: str = "measure") -> pd.DataFrame:
    ids = _ids_sql(run_ids)
    sql = (
        "SELECT run_id, step, step_time_ms, data_wait_ms, loss FROM steps "
        f"WHERE run_id IN ({ids or 'NULL'}) AND phase = :phase ORDER BY run_id, step"
    )
    return pd.read_sql_query(text(sql), engine, params={"phase": phase})
