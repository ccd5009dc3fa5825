"""``perfsweep query "SQL"``: a user's SELECT on a read-only connection, printed as a table, CSV or JSON.

Two locks, so a query can never change results: the connection itself is read-only (SQLite opened
with ``mode=ro``; PostgreSQL sessions with ``default_transaction_read_only``), and the text must be
one statement that reads (SELECT, WITH, VALUES or EXPLAIN). ``ATTACH``, ``PRAGMA``, ``SET`` and
anything after a ``;`` are refused before the database sees them.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
import math
import re
import sys
from typing import Any

import pandas as pd
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from perfsweep import store
from perfsweep.cli import OneLineParser, UserError, first_line

READ_KEYWORDS = ("select", "with", "values", "explain")


class QueryError(ValueError):
    """A query or database perfsweep will not run; the message is one line."""


def _first_word(sql: str) -> str | None:
    """The first word of ``sql`` past whitespace, parentheses and comments (``--`` to a line's end,
    a carriage return's too; ``/* */`` nested, as PostgreSQL nests them), lower-cased; None where
    nothing else is there. What one statement does is the read-only session's to hold, and
    :func:`check_read_only` counts the statements on the raw text: no quoting rules are needed."""
    i, n = 0, len(sql)
    while i < n:
        if sql[i].isspace() or sql[i] == "(":
            i += 1
        elif sql.startswith("--", i):
            ends = [j for j in (sql.find("\n", i), sql.find("\r", i)) if j >= 0]
            i = min(ends, default=n)
        elif sql.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if sql.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        else:
            return re.match(r"\w*", sql[i:]).group().lower()  # "select*from", "(select 1)"
    return None


def check_read_only(sql: str) -> str:
    """``sql`` without a trailing ``;`` if it is one reading statement; QueryError otherwise.

    A ``;`` anywhere but at the end is refused, inside quotes and comments too: a server splits
    statements at ``;`` alone, so with none there is one statement, whatever the server's quoting
    rules. Reading them as the server does was not enough: ``$€$'$€$``, an ``E''`` string continued
    on the next line and a ``--`` comment ended by a carriage return each hid a ``;`` from the
    check, and on PostgreSQL ``rollback; begin read write; create table ...`` ran. (Write
    ``chr(59)``, SQLite's ``char(59)``, for a ``;`` inside a text.)"""
    body = sql.strip().rstrip(";").rstrip()
    if ";" in body:
        raise QueryError(
            "one statement at a time: the query holds a ';' before its end (inside quotes or a comment too; "
            "for one in a text write chr(59) on PostgreSQL, char(59) on SQLite)"
        )
    first = _first_word(body)
    if first is None:
        raise QueryError("empty query")
    if first not in READ_KEYWORDS:
        raise QueryError(f"{first.upper()} is refused: perfsweep query only reads (SELECT, WITH, VALUES, EXPLAIN)")
    return sql.strip().rstrip(";")


def read_only_engine(db: str) -> Engine:
    """A read-only engine for ``--db`` (a SQLite file path or URL, or a PostgreSQL URL)."""
    try:
        url, db = store.existing_url(db), store.hide_password(db)
    except UserError as exc:
        raise QueryError(str(exc)) from None
    if not url.startswith(("sqlite:///", "postgresql")):  # only these two have a read-only session
        raise QueryError(f"--db {db}: use a SQLite file path or a postgresql:// URL")
    if why := store.unreadable(url):
        raise QueryError(f"--db {db}: {why}")
    try:
        return store.connect_read_only(url)
    except Exception as exc:  # noqa: BLE001 - its driver is not installed, an unparsable URL...
        raise QueryError(f"--db {db}: cannot open the database ({first_line(exc)})") from None


def run_query(engine: Engine, sql: str) -> pd.DataFrame:
    """The rows of a read-only ``sql``, each column typed by the values the database returned
    (:func:`typed_column`)."""
    sql = check_read_only(sql)
    try:
        connection = engine.connect()
    except (DBAPIError, engine.dialect.loaded_dbapi.Error) as exc:  # a server down: no query was sent
        raise QueryError(f"cannot connect to the database ({first_line(exc)})") from None
    try:
        with connection as conn:
            # to the driver's cursor as typed, with no parameters: SQLAlchemy's text() took ':x' for one,
            # even in quotes, and exec_driver_sql gave psycopg2 an empty set, so '%' in 7 % 3 was one too
            cursor = conn.connection.dbapi_connection.cursor()
            try:
                cursor.execute(sql)
                keys = [d[0] for d in cursor.description or []]
                rows = cursor.fetchall() if cursor.description else []
            except KeyboardInterrupt:
                # a stop cancels the statement and psycopg2 closes the connection (store._wait_stoppable),
                # behind SQLAlchemy's back: its pool's rollback of it logged a traceback
                conn.invalidate()
                raise
            finally:
                with contextlib.suppress(Exception):  # closed with its connection
                    cursor.close()
    except (DBAPIError, engine.dialect.loaded_dbapi.Error) as exc:
        raise QueryError(f"the database refused the query ({first_line(exc)})") from None
    raw = pd.DataFrame([tuple(r) for r in rows], columns=range(len(keys)), dtype=object)
    typed = pd.concat([typed_column(raw[i]) for i in range(len(keys))], axis=1) if keys else raw
    return typed.set_axis(keys, axis=1)  # by position: a join may name two columns alike (a.phase, b.phase)


def _older_schema(engine: Engine, db: str) -> str:
    """For a refused query: where the database's schema is older than this perfsweep's, what says
    so and how to upgrade it (a column it lacks, gpu_busy_ms in a database from before it, was
    only "no such column"); else nothing. A query is not refused for an old schema: what it asks
    of the older columns is answered."""
    try:
        revision = store.schema_revision(engine)
        if revision is None or revision >= store.head_revision():
            return ""
        return f"; {store.older_schema(revision, store.existing_url(db), store.hide_password(db))}"
    except Exception:  # noqa: BLE001 - the refusal stands as it is
        return ""


def records(db: str, sql: str) -> list[dict[str, Any]]:
    """The rows of a read-only ``sql`` on ``db`` (a SQLite file path or URL, or a PostgreSQL URL)
    as dicts: for a script or a notebook that wants plain rows, read as ``perfsweep query`` reads."""
    engine = read_only_engine(db)
    try:
        return run_query(engine, sql).to_dict("records")
    finally:
        engine.dispose()


def typed_column(values: pd.Series) -> pd.Series:
    """Integers stay integers next to a NULL (``nproc`` of a plain run: pandas alone would make it
    2.0 and NaN), booleans are 1 and 0 (as SQLite stores them, so a query prints the same from
    either database: PostgreSQL's True/False broke scripts written against SQLite's output), other
    numbers become floats (NULL and a stored NaN both print as NULL), timestamps datetimes; anything else
    (text, JSON a PostgreSQL driver returns as dicts) keeps the driver's Python values."""
    present = values[values.notna()]
    kinds = {type(v) for v in present}
    if not kinds:
        return values
    if kinds <= {int, bool}:
        return values.astype("Int64")
    if kinds <= {int, float, decimal.Decimal}:  # PostgreSQL's numeric (a literal 0.5, AVG) comes as Decimal
        return values.astype("float64")
    if all(isinstance(v, (datetime.datetime, datetime.date)) for v in present):
        return pd.to_datetime(values)
    return values


def as_table(df: pd.DataFrame) -> str:
    """The rows as aligned text, NULL written as NULL (pandas would print NaN, <NA> or None,
    depending on the column's type); floats keep pandas' formatting."""
    cols = [df.iloc[:, i] for i in range(df.shape[1])]  # by position: two columns may share a name
    shown = pd.concat(
        [s if pd.api.types.is_float_dtype(s.dtype) else s.astype(object).where(s.notna(), "NULL") for s in cols], axis=1
    )
    return shown.set_axis(df.columns, axis=1).to_string(index=False, na_rep="NULL")


def as_json(df: pd.DataFrame) -> str:
    """The rows as a JSON array of objects. Floats keep every digit (Python's shortest repr, as
    the CSV does; pandas' ``to_json`` rounds to 10 significant digits), NULL and NaN are null,
    timestamps ISO 8601 text (as SQLite stores them), a JSON column from PostgreSQL its object,
    an infinite float the string ``"inf"`` or ``"-inf"`` (as stored JSON keeps it: a bare
    ``Infinity`` is not JSON, and strict parsers refused the whole output)."""

    def plain(value: object) -> object:
        if value is None or value is pd.NA or value is pd.NaT:  # NaT first: it is a datetime too
            return None
        if isinstance(value, (datetime.datetime, datetime.date)):  # pd.Timestamp is a datetime
            return value.isoformat()
        if hasattr(value, "item"):  # a numpy scalar (int64, bool_, float64) as its Python value
            value = value.item()
        if isinstance(value, decimal.Decimal):
            value = float(value)
        if isinstance(value, float) and value in (math.inf, -math.inf):
            return str(value)
        return None if value != value else value  # NaN

    rows = [dict(zip(df.columns, map(plain, row), strict=True)) for row in df.itertuples(index=False, name=None)]
    return json.dumps(rows, indent=2, default=str)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="perfsweep query",
        description="Run one read-only SQL query on a results database and print the rows.",
    )
    parser.add_argument("sql", help='e.g. "SELECT amp, ckpt, tokens_per_s FROM runs WHERE sweep_id = 1"')
    parser.add_argument("--db", default="results.db", help="SQLite file or postgresql:// URL (default: %(default)s)")
    parser.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="table: aligned for people (default); csv: a header and comma-separated rows; json: a list of "
        "objects, one per row (booleans as 1/0 from either database, times in ISO 8601)",
    )
    args = parser.parse_args(argv)
    try:
        engine = read_only_engine(args.db)
        try:
            try:
                df = run_query(engine, args.sql)
            except QueryError as exc:
                raise QueryError(f"{exc}{_older_schema(engine, args.db)}") from None
        finally:
            engine.dispose()
    except QueryError as exc:
        print(f"perfsweep query: {exc}", file=sys.stderr)
        return 2
    if args.format == "csv":
        df.to_csv(sys.stdout, index=False)
    elif args.format == "json":
        if (twice := df.columns[df.columns.duplicated()]).any():
            print(
                f"perfsweep query: --format json needs one name per column; {twice[0]!r} names two: "
                "rename one with AS (e.g. b.phase AS phase_b)",
                file=sys.stderr,
            )
            return 2
        print(as_json(df))
    else:
        print(as_table(df) if len(df) else f"(no rows; columns: {', '.join(df.columns)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
