"""``perfsweep query``: reads, never writes, on SQLite and the real PostgreSQL test server (issue 10.2)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import text

from perfsweep import importer, store
from perfsweep.cli import UserError
from perfsweep.query import QueryError, main, read_only_engine, run_query
from tests.util import read_only, run_row

WRITES = [
    "DELETE FROM runs",
    "UPDATE runs SET tokens_per_s = 0",
    "DROP TABLE runs",
    "ATTACH DATABASE 'other.db' AS other",
    "SELECT 1; DELETE FROM runs",
    "select 1 /* ; */ ; update runs set batch = 0",
    "PRAGMA journal_mode = DELETE",
    "SET default_transaction_read_only = off",
    # reading keywords that can still write on PostgreSQL: only the read-only session stops them
    "WITH gone AS (DELETE FROM runs RETURNING id) SELECT * FROM gone",
    "EXPLAIN ANALYZE DELETE FROM runs",
    # text the server quotes differently from a plain '...': a check that read it as quoted hid the
    # rest, and on PostgreSQL the read-only session was ended and a write committed
    "select $$'$$ as a; rollback; begin read write; delete from runs; commit; select $$'$$ as b",
    "select $q$'$q$ as a; commit; set default_transaction_read_only = off; delete from runs; commit",
    "select E'\\'' as a; rollback; begin read write; delete from runs; commit; select ''''",
    "select 1 /* nested /* */ ; delete from runs",
    # ...and what PostgreSQL's lexer quotes and a check's lexer did not: a tag of any letter, an E''
    # string continued on the next line, a -- comment ended by a carriage return
    "select $€$'$€$;rollback;begin read write;create table pwned1(x int);commit;select '1'",
    "select E'a'\n'\\'';rollback;begin read write;create table pwned2(x int);commit;select '1'",
    "select 1 --\r;rollback;begin read write;create table pwned3(x int);commit;select 2",
    "select 'a;b'",
]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'results.db'}"
    else:
        from tests.pg import new_database

        url = new_database(request.getfixturevalue("pg_url"))
    engine = store.connect(url)
    sid = store.get_or_create_sweep(engine, "/sweeps/q", "q")
    for batch in (4, 8):
        store.save_run(
            engine,
            run_row(
                sid, batch=batch, amp=batch == 8, model_name="it's; fine", config_json={"batch": batch, "amp": True}
            ),
        )
    engine.dispose()
    return url.removeprefix("sqlite:///")


def snapshot(db: str) -> list:
    engine = store.make_engine(db if "://" in db else f"sqlite:///{db}")
    with engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(text("SELECT id, batch, tokens_per_s FROM runs ORDER BY id"))]
    engine.dispose()
    return rows


@pytest.mark.parametrize("sql", WRITES)
def test_writes_are_refused_in_one_line(db, sql, capsys):
    before = snapshot(db)
    assert main([sql, "--db", db]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("perfsweep query: ") and "\n" not in err
    assert snapshot(db) == before


def test_the_connection_itself_cannot_write(db):
    """Second lock: even a write that got past the text check is refused by the database."""
    engine = read_only_engine(db)
    try:
        with pytest.raises(Exception, match=r"(?i)read.?only"), engine.connect() as conn:
            conn.execute(text("DELETE FROM runs"))
    finally:
        engine.dispose()
    assert len(snapshot(db)) == 2


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_formats(db, fmt, capsys):
    # a ';' in a text is written chr(59): the check refuses every ';' but a last one (test_writes_are_refused)
    semicolon = "chr(59)" if "://" in db else "char(59)"  # PostgreSQL's, SQLite's
    sql = f"SELECT batch, model_name FROM runs WHERE model_name = 'it''s' || {semicolon} || ' fine' ORDER BY batch;"
    assert main([sql, "--db", db, "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert json.loads(out) == [{"batch": 4, "model_name": "it's; fine"}, {"batch": 8, "model_name": "it's; fine"}]
    elif fmt == "csv":
        assert out.splitlines() == ["batch,model_name", "4,it's; fine", "8,it's; fine"]
    else:
        assert out.split()[:2] == ["batch", "model_name"] and "it's; fine" in out


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_null_stays_null_and_integers_stay_integers(db, fmt, capsys):
    """A plain run has no ``nproc``: the column holds 2 and NULL, printed as 2 and NULL (pandas'
    default would turn it into 2.0 and NaN)."""
    sql = (
        "SELECT batch, CASE WHEN batch = 8 THEN 2 END AS nproc,"
        " CASE WHEN batch = 4 THEN 0.5 END AS gpu_busy_fraction FROM runs ORDER BY batch"
    )
    assert main([sql, "--db", db, "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert json.loads(out) == [
            {"batch": 4, "nproc": None, "gpu_busy_fraction": 0.5},
            {"batch": 8, "nproc": 2, "gpu_busy_fraction": None},
        ]
    elif fmt == "csv":
        assert out.splitlines() == ["batch,nproc,gpu_busy_fraction", "4,,0.5", "8,2,"]
    else:
        assert [line.split() for line in out.splitlines()] == [
            ["batch", "nproc", "gpu_busy_fraction"],
            ["4", "NULL", "0.5"],
            ["8", "2", "NULL"],
        ]


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_booleans_print_as_1_and_0_from_either_database(db, fmt, capsys):
    """PostgreSQL hands back True/False, SQLite its stored 1/0: both print 1 and 0."""
    assert main(["SELECT batch, amp, ckpt FROM runs ORDER BY batch", "--db", db, "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert json.loads(out) == [{"batch": 4, "amp": 0, "ckpt": 0}, {"batch": 8, "amp": 1, "ckpt": 0}]
        assert "true" not in out and "false" not in out  # json's true == 1 in Python: look at the text
    elif fmt == "csv":
        assert out.splitlines() == ["batch,amp,ckpt", "4,0,0", "8,1,0"]
    else:
        assert [line.split() for line in out.splitlines()] == [
            ["batch", "amp", "ckpt"],
            ["4", "0", "0"],
            ["8", "1", "0"],
        ]


def test_json_keeps_every_digit_of_a_float(db, capsys):
    """--format json prints a float as CSV does, all its digits (pandas' to_json kept 10)."""
    sql = "SELECT 1.0 / 3 AS third, 123456.78901234567 AS big FROM runs WHERE batch = 4"
    assert main([sql, "--db", db, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert main([sql, "--db", db, "--format", "csv"]) == 0
    csv_row = dict(zip(*[line.split(",") for line in capsys.readouterr().out.splitlines()], strict=True))
    assert {k: float(v) for k, v in csv_row.items()} == row
    assert row == {"third": 1 / 3, "big": 123456.78901234567}  # 10 digits would give 0.3333333333, 123456.789


def test_timestamps_print_as_iso_text_from_either_database(db, capsys):
    """SQLite hands back its stored text, PostgreSQL a datetime: --format json prints both as ISO
    8601 (pandas' default wrote PostgreSQL's as epoch milliseconds)."""
    assert main(["SELECT created_at FROM sweeps", "--db", db, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    when = datetime.fromisoformat(row["created_at"])
    assert abs(when.replace(tzinfo=None) - datetime.now(timezone.utc).replace(tzinfo=None)) < timedelta(minutes=5)


def test_a_null_timestamp_is_null_in_json(db, capsys):
    """A timestamp column with a NULL (PostgreSQL's datetimes become NaT, which is a datetime too)."""
    sql = (
        "SELECT r.batch, CASE WHEN r.batch = 4 THEN s.created_at END AS t "
        "FROM runs r JOIN sweeps s ON s.id = r.sweep_id ORDER BY r.batch"
    )
    assert main([sql, "--db", db, "--format", "json"]) == 0
    first, second = json.loads(capsys.readouterr().out)
    assert isinstance(first["t"], str) and second == {"batch": 8, "t": None}


def test_json_columns_stay_json(db, capsys):
    """runs.config_json comes back as a dict from PostgreSQL and as JSON text from SQLite; --format
    json prints the same object either way (not Python's repr of it)."""
    assert main(["SELECT config_json FROM runs WHERE batch = 4", "--db", db, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    value = row["config_json"]
    assert (json.loads(value) if isinstance(value, str) else value) == {"batch": 4, "amp": True}


def test_sqlite_file_is_untouched_by_a_query(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = store.connect(url)
    store.save_run(engine, run_row(store.get_or_create_sweep(engine, "/s", "s")))
    engine.dispose()
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    exe = Path(sys.executable).with_name("perfsweep")
    proc = subprocess.run(
        [str(exe), "query", "SELECT COUNT(*) AS n FROM runs", "--db", str(tmp_path / "results.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.split() == ["n", "1"], proc.stderr
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()} == files


def test_a_percent_sign_is_a_percent_sign(db, capsys):
    """psycopg2 took '%' for a parameter once the query went through exec_driver_sql: 7 % 3 and
    like 'x%' were tracebacks, and 'a%%b' came back as 'a%b'."""
    for sql, expect in (("select 7 % 3 as m", "1"), ("select 'a%%b' as s", "a%%b"), ("select '%s' as s", "%s")):
        assert main([sql, "--db", db, "--format", "csv"]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.split()[1] == expect
    assert main(["select count(*) as n from runs where model_name like 'it%'", "--db", db, "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["n", "2"]


def test_reads_as_written_run(db, capsys):
    """Valid reads the check once refused or SQLAlchemy mangled: no space after the keyword, a
    parenthesised query, and ':x' in quoted text (taken for a bind parameter: a traceback)."""
    reads = ("select*from runs", "values(1),(2)", *(["(select batch from runs)"] if "://" in db else []))
    for sql in reads:  # (SQLite has no parenthesised statement)
        assert main([sql, "--db", db, "--format", "csv"]) == 0, capsys.readouterr().err
        assert len(capsys.readouterr().out.strip().splitlines()) == 3
    quoted = "select 'ratio :x' as s" + (", $$a:b$$ as t" if "://" in db else "")  # dollar quotes: PostgreSQL's
    assert main([quoted, "--db", db]) == 0, capsys.readouterr().err
    assert "ratio :x" in capsys.readouterr().out


def test_a_file_named_with_url_characters_is_the_file_read(tmp_path: Path, capsys):
    """SQLite's URI filenames decode %XX and end at '#': 'pct%41.db' was read as 'pctA.db' (another
    file, without a word) and 'res#1.db' as a new empty 'res' file, created by a read. Given as a
    path, 'pct%41.db' was also written as 'pctA.db' (SQLAlchemy decodes the URL made of it)."""
    for name, other in (("pct%41.db", "pctA.db"), ("res#1.db", None)):
        for file, batch in ((name, 7), (other, 99)):
            if file:
                engine = store.connect(store.url_from_arg(str(tmp_path / file)))
                store.save_run(engine, run_row(store.get_or_create_sweep(engine, "/s", "s"), batch=batch))
                engine.dispose()
        assert main(["select batch from runs", "--db", str(tmp_path / name), "--format", "csv"]) == 0
        assert capsys.readouterr().out.split() == ["batch", "7"]
        assert not (tmp_path / "res").exists()
        engine = read_only_engine(str(tmp_path / name))
        assert store.display_url(engine) == store.url_from_arg(str(tmp_path / name))
        engine.dispose()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pct%41.db", "pctA.db", "res#1.db"]


def test_a_path_with_a_question_mark_names_its_own_file_or_is_refused(tmp_path: Path, capsys):
    """SQLAlchemy 2.0 (what Python 3.10 installs) ends a URL's file at a '?' and decodes no %XX:
    'a?b.db' given as a path was written to a file 'a'. With 2.1 the '?' is escaped and the file is
    the one named; with 2.0 the path is refused in one line, and nothing is written."""
    path = tmp_path / "a?b.db"
    if not store._decodes_database():
        with pytest.raises(UserError, match=r"cannot open a SQLite file whose path holds a '\?'"):
            store.url_from_arg(str(path))
        assert main(["select 1", "--db", str(path)]) == 2
        assert not list(tmp_path.iterdir())
        return
    engine = store.connect(store.url_from_arg(str(path)))
    store.save_run(engine, run_row(store.get_or_create_sweep(engine, "/s", "s"), batch=5))
    engine.dispose()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a?b.db"]
    assert main(["select batch from runs", "--db", str(path), "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["batch", "5"]


def test_bad_database_and_bad_sql(tmp_path: Path):
    with pytest.raises(QueryError, match="database file not found"):
        read_only_engine(str(tmp_path / "missing.db"))
    with pytest.raises(QueryError, match="empty query"):
        run_query(None, "  ;  ")  # type: ignore[arg-type]


def test_a_database_whose_driver_is_missing_is_one_line_exit_2(tmp_path: Path, capsys):
    """A PostgreSQL URL naming a driver that is not installed (pg8000 here): one line, as report
    and resume answer it; query printed a traceback, upgrade exited 1."""
    from perfsweep.query import main as query_main
    from perfsweep.upgrade import main as upgrade_main

    try:
        import pg8000  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pg8000 is installed here: pick a driver that is not")
    url = "postgresql+pg8000://me@dbhost/perfsweep"
    assert query_main(["select 1", "--db", url]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"perfsweep query: --db {url}: cannot open the database (No module named 'pg8000')", err
    assert upgrade_main(["--db", url]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"perfsweep upgrade: --db {url}: cannot upgrade (No module named 'pg8000')"
    ]
    (tmp_path / "notes.txt").write_text("not a database")
    assert upgrade_main(["--db", str(tmp_path / "notes.txt")]) == 2
    assert "notes.txt: is not a SQLite database file" in capsys.readouterr().err
    # a query that reads no table read the text file as an empty database, and answered it
    assert query_main(["select 1", "--db", str(tmp_path / "notes.txt")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"perfsweep query: --db {tmp_path / 'notes.txt'}: is not a SQLite database file (its first bytes are not SQLite's)"
    )


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


def test_a_query_an_older_schema_cannot_answer_names_the_upgrade(tmp_path: Path, capsys):
    """The H100 run's database (schema 0001) has no gpu_busy_ms: a query of it said only "no such
    column" (a review found it), where a report names the upgrade. It is still answered where the
    older columns do, and nothing is written."""
    folder = tmp_path / "db"
    folder.mkdir()
    db = folder / "results.db"
    db.write_bytes((Path(__file__).parent / "fixtures" / "h100" / "results-fp16-seed-snapshot-gpt2.db").read_bytes())
    before = _files(folder)
    assert main(["SELECT gpu_busy_ms FROM runs", "--db", str(db)]) == 2
    assert capsys.readouterr().err.strip() == (
        "perfsweep query: the database refused the query (no such column: gpu_busy_ms); schema revision 0001 is "
        f"older than this perfsweep's {store.head_revision()}; upgrade it first with: perfsweep upgrade --db {db}"
    )
    assert main(["SELECT count(*) AS n FROM runs", "--db", str(db)]) == 0
    assert capsys.readouterr().out.split() == ["n", "6"]
    assert _files(folder) == before
    from perfsweep.upgrade import main as upgrade_main

    assert upgrade_main(["--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["SELECT no_such_column FROM runs", "--db", str(db)]) == 2  # at head: the refusal alone
    assert capsys.readouterr().err.strip() == (
        "perfsweep query: the database refused the query (no such column: no_such_column)"
    )


def test_report_never_writes_and_names_the_upgrade_command(tmp_path: Path, capsys):
    """An older database (the H100 run's, schema 0001) is not upgraded by a report: it says how."""
    from perfsweep.report.__main__ import main as report_main
    from perfsweep.upgrade import main as upgrade_main

    folder = tmp_path / "db"
    folder.mkdir()
    db = folder / "results.db"
    db.write_bytes((Path(__file__).parent / "fixtures" / "h100" / "results-fp16-seed-snapshot-gpt2.db").read_bytes())
    before = _files(folder)
    assert report_main(["--db", str(db), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"perfsweep report: --db {db}: schema revision 0001 is older than this perfsweep's "
        f"{store.head_revision()}; upgrade it first with: perfsweep upgrade --db {db}"
    )
    assert _files(folder) == before  # not a byte changed, no -wal/-shm created
    with read_only(db), read_only(folder):  # read-only media: upgrading in place would fail, so it says so
        assert report_main(["--db", str(db), "--out", str(tmp_path / "r")]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"upgrade it first with: perfsweep upgrade --db {db} (the file is read-only here: upgrade a copy)")
    )

    assert upgrade_main(["--db", str(db)]) == 0
    assert upgrade_main(["--db", str(db)]) == 0  # idempotent
    assert "already at" in capsys.readouterr().out
    upgraded = _files(folder)
    assert report_main(["--db", str(db), "--sweep", "1", "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.md").is_file()
    assert _files(folder) == upgraded  # the report read it without writing


def test_report_reads_through_a_read_only_connection(db, tmp_path: Path):
    """SQLite immutable or PostgreSQL read-only session: the report is built all the same."""
    from perfsweep.report.__main__ import main as report_main

    before = snapshot(db)
    assert report_main(["--db", db, "--out", str(tmp_path / "r")]) == 0
    assert "2 runs" in (tmp_path / "r" / "report.md").read_text()
    assert snapshot(db) == before


def test_query_and_report_on_read_only_media(tmp_path: Path):
    """A results folder nobody may write to (a read-only mount, an archive): query and report work."""
    folder = tmp_path / "archive"
    folder.mkdir()
    db = folder / "results.db"
    engine = store.connect(f"sqlite:///{db}")
    store.save_run(engine, run_row(store.get_or_create_sweep(engine, "/s", "s")))
    engine.dispose()
    before = _files(folder)
    exe = Path(sys.executable).with_name("perfsweep")
    with read_only(folder), read_only(db):
        q = subprocess.run(
            [str(exe), "query", "SELECT status FROM runs", "--db", str(db), "--format", "csv"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        r = subprocess.run(
            [str(exe), "report", "--db", str(db), "--out", str(tmp_path / "r")],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert q.returncode == 0 and q.stdout.split() == ["status", "ok"], q.stderr
    assert r.returncode == 0 and (tmp_path / "r" / "report.md").is_file(), r.stderr
    assert _files(folder) == before


def test_output_piped_into_head_ends_quietly(tmp_path: Path):
    """``perfsweep query ... | head -1``: the reader goes away, perfsweep stops without a traceback."""
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) SELECT x FROM c"
    exe = Path(sys.executable).with_name("perfsweep")
    proc = subprocess.Popen(
        [str(exe), "query", sql, "--db", str(db), "--format", "csv"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "x\n"
    proc.stdout.close()  # what head does after its line
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1 and err == "", err


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_two_columns_of_one_name_keep_their_own_values(db, fmt, capsys):
    """A join names two columns alike (a.phase, b.phase): each keeps its value; JSON, whose keys
    must differ, says to rename one instead of raising."""
    code = main(["SELECT a.batch, b.batch FROM runs a JOIN runs b ON a.batch < b.batch", "--db", db, "--format", fmt])
    out, err = capsys.readouterr()
    if fmt == "json":
        assert code == 2 and out == "" and "'batch' names two: rename one with AS" in err, err
    elif fmt == "csv":
        assert code == 0 and out.splitlines() == ["batch,batch", "4,8"]
    else:
        assert code == 0 and [line.split() for line in out.splitlines()] == [["batch", "batch"], ["4", "8"]]


def test_an_infinite_value_is_strict_json(db, capsys):
    """A computed infinity printed as the bare word Infinity, which strict JSON parsers refuse; it
    is the string stored JSON uses, and NaN is null."""
    sql = "SELECT 1e308 * 10 AS up, -1e308 * 10 AS down, 2.5 AS plain FROM runs WHERE batch = 4"
    assert main([sql, "--db", db, "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert "Infinity" not in out
    assert json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == [
        {"up": "inf", "down": "-inf", "plain": 2.5}
    ]


def test_records_gives_plain_rows_and_writes_nothing(db):
    """perfsweep.query.records, the scripts' and notebooks' way to rows: the runs as dicts, typed as
    the query prints them, and a write refused as ``perfsweep query`` refuses it."""
    from perfsweep.query import records

    before = snapshot(db)
    got = records(db, "SELECT batch, amp, model_name FROM runs ORDER BY batch")
    # typed as printed: booleans are 1 and 0 from either database (False == 0 in Python: the types too)
    typed = [{k: (type(v), v) for k, v in row.items()} for row in got]
    assert typed == [
        {"batch": (int, 4), "amp": (int, 0), "model_name": (str, "it's; fine")},
        {"batch": (int, 8), "amp": (int, 1), "model_name": (str, "it's; fine")},
    ]
    with pytest.raises(QueryError):
        records(db, "DELETE FROM runs")
    assert snapshot(db) == before


def test_a_refused_resume_changes_nothing(tmp_path: Path, capsys):
    """``resume`` of a sweep the database does not hold upgraded an older schema (0001 to the
    current one) and marked the runs of dead processes interrupted before it said so."""
    import socket

    from perfsweep import resume

    old = tmp_path / "old.db"
    old.write_bytes((Path(__file__).parent / "fixtures/h100/results-fp16-seed-snapshot-gpt2.db").read_bytes())
    stale = tmp_path / "stale.db"
    engine = store.connect(f"sqlite:///{stale}")
    sid = store.get_or_create_sweep(engine, "/s", "s")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no process has now
    store.save_run(engine, run_row(sid, status="running", pid=dead.pid, hostname=socket.gethostname()))
    engine.dispose()
    for db in (old, stale):
        before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
        assert resume.main(["nosuch", "--db", str(db)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("perfsweep resume: SWEEP nosuch: no sweep with that id or name") and "\n" not in err
        assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()} == before


def test_a_log_without_its_index_on_read_only_media_is_named_not_called_damaged(tmp_path: Path):
    """A database copied with its write-ahead log but not its index (-shm) into a folder SQLite
    may not write: SQLite cannot open it ("unable to open database file"), and report and
    upgrade called the healthy file damaged: "restore it from a backup"."""
    import sqlite3

    live = tmp_path / "live.db"
    engine = store.connect(f"sqlite:///{live}")
    store.save_run(engine, run_row(store.get_or_create_sweep(engine, "/s", "s")))
    engine.dispose()
    writer = sqlite3.connect(live)  # a sweep still writing: its last rows are in the log
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("UPDATE runs SET batch = 5")
    writer.commit()
    archive = tmp_path / "archive"
    archive.mkdir()
    for name in ("live.db", "live.db-wal"):
        (archive / name).write_bytes((tmp_path / name).read_bytes())
    writer.close()
    exe = str(Path(sys.executable).with_name("perfsweep"))
    db = str(archive / "live.db")
    (tmp_path / "job").mkdir()
    importer.write_result_file(
        tmp_path / "job" / "result.json", {"sweep_dir": "/s", "name": "s"}, run_row(0, run_uid="u")
    )
    with read_only(archive):
        runs = [
            subprocess.run([exe, *args, "--db", db], capture_output=True, text=True, timeout=120)
            for args in (
                ["query", "select batch from runs"],
                ["report", "--out", str(tmp_path / "r")],
                ["upgrade"],
                ["resume", "1"],
                ["import", str(tmp_path / "job")],
            )
        ]
    for r in runs:
        err = r.stderr.strip()
        assert r.returncode == 2 and "\n" not in err, err
        assert "write-ahead log (live.db-wal) but no index (live.db-shm)" in err and "backup" not in err, err
    assert sorted(p.name for p in archive.iterdir()) == ["live.db", "live.db-wal"]


def test_a_password_in_a_database_url_is_never_printed(tmp_path: Path, capsys):
    """Every command named the URL it could not open as typed, password and all, into the terminal's
    scrollback or a CI log; SQLAlchemy's own form hides it (``***``), as report.md already did."""
    from perfsweep import importer, resume, upgrade
    from perfsweep.report.__main__ import main as report_main

    url = "postgresql+psycopg2://me:s3cretPW@127.0.0.1:1/results"
    importer.write_result_file(
        tmp_path / "result.json", {"sweep_dir": str(tmp_path), "name": "s"}, run_row(0, run_uid="u")
    )
    for command, args in (
        (main, ["select 1", "--db", url]),
        (report_main, ["--db", url]),
        (upgrade.main, ["--db", url]),
        (resume.main, ["1", "--db", url]),
        (importer.main, [str(tmp_path), "--db", url]),
    ):
        assert command(args) == 2
        out = capsys.readouterr()
        assert "s3cretPW" not in out.err + out.out, (command, out)
        assert command is main or "me:***@127.0.0.1" in out.err, (command, out)  # query names the server alone


@pytest.mark.parametrize("command", ["query", "report", "report-out", "trace", "import", "upgrade", "resume"])
def test_a_path_that_cannot_be_looked_at_is_one_line(command: str, tmp_path: Path):
    """A name over 255 bytes (or a folder this user may not enter) made ``Path.exists()`` raise, and
    each command ended in a traceback; ``upgrade`` alone answered it."""
    long = str(tmp_path / ("y" * 300))
    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    argv = {
        "query": ["select 1", "--db", long],
        "report": ["--db", long],
        "report-out": ["--db", str(db), "--out", long],
        "trace": [long],
        "import": [long],
        "upgrade": ["--db", long],
        "resume": ["1", "--db", long],
    }[command]
    proc = subprocess.run(
        [sys.executable, "-m", "perfsweep", command.split("-")[0], *argv], capture_output=True, text=True, timeout=120
    )
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "File name too long" in err, err


def test_an_empty_or_in_memory_database_or_folder_is_refused(tmp_path: Path, capsys, monkeypatch):
    """``import --db sqlite://`` said "1 imported" of a result gone at its exit; ``--db ""`` was
    ./results.db, and ``report --out ""`` wrote the report's files into the current folder."""
    from perfsweep import importer, upgrade
    from perfsweep.report.__main__ import main as report_main

    monkeypatch.chdir(tmp_path)
    result = tmp_path / "job" / "result.json"
    result.parent.mkdir()
    importer.write_result_file(result, {"sweep_dir": str(tmp_path), "name": "s"}, run_row(0, run_uid="u"))
    for command, args, said in (
        (importer.main, [str(result), "--db", ""], "--db is empty"),
        (importer.main, [str(result), "--db", "sqlite://"], "in-memory"),
        (importer.main, [str(result), "--db", "sqlite+pysqlite://"], "in-memory"),
        (upgrade.main, ["--db", "sqlite:///:memory:"], "in-memory"),
        (main, ["select 1", "--db", "sqlite://"], "in-memory"),
    ):
        assert command(args) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err, err
    db = tmp_path / "results.db"
    assert not db.exists()
    assert importer.main([str(result), "--db", str(db)]) == 0
    with pytest.raises(SystemExit) as stop:
        report_main(["--db", str(db), "--out", ""])
    assert stop.value.code == 2 and "--out: is empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job", "results.db"]


def test_passwords_are_hidden_in_any_text_that_holds_a_url():
    """Textual, so that a command line holding a db.url is hidden too, and a URL SQLAlchemy cannot
    parse (a port that is no number: a ValueError traceback) still is."""
    cases = {
        "postgresql://u:s3cret@host:notaport/db": "postgresql://u:***@host:notaport/db",
        "postgresql://u:p@ss@host/db": "postgresql://u:***@ss@host/db",  # SQLAlchemy's reading: p, host ss@host
        # only a database URL: a model's hub URL was stored as hub.local:***@v2, and resume reran that
        "+model.uri=http://hub.local:8080/org/model@v2": "+model.uri=http://hub.local:8080/org/model@v2",
        "db.url=postgresql://u:pw@h/db?application_name=me@box": "db.url=postgresql://u:***@h/db?application_name=me@box",
        # a URL with no user took everything up to a later word's '@' for its password (report.md lost the rest)
        "perfsweep 'db.url=postgresql://127.0.0.1:5432/m3?user=me' +model.uri=http://hub:8080/x@v2 device=cpu": (
            "perfsweep 'db.url=postgresql://127.0.0.1:5432/m3?user=me' +model.uri=http://hub:8080/x@v2 device=cpu"
        ),
        "cannot open db.url='postgresq1://me:SEKRIT@h/db'": "cannot open db.url='postgresq1://me:***@h/db'",  # a typo
        "http://me:pw@proxy:3128/x": "http://me:***@proxy:3128/x",
        # as Hydra escapes an override (runs.overrides): the scheme's check missed it, and stored it
        "db.url=postgresql+psycopg2\\://me\\:s3/cret\\ x@h\\:5432/x": "db.url=postgresql+psycopg2\\://me\\:***@h\\:5432/x",
        "postgresql://u@host/db?password=s3cret&sslmode=require": "postgresql://u@host/db?password=***&sslmode=require",
        "perfsweep -m amp=true db.url=postgresql+psycopg2://me:s3cret@h:5432/x": (
            "perfsweep -m amp=true db.url=postgresql+psycopg2://me:***@h:5432/x"
        ),
        "postgresql://me@host/db": "postgresql://me@host/db",
        # SQLAlchemy takes a '/' and a space as part of a password: a generated one (Top/Secret9) was shown
        "postgresql://u:Top/Secret9@host/db": "postgresql://u:***@host/db",
        "postgresql://u:Top Secret/9@host/db": "postgresql://u:***@host/db",
        "could not mark the sweep done in postgresql://u:Top/Secret9@h/db: gone": (
            "could not mark the sweep done in postgresql://u:***@h/db: gone"
        ),
        "/data/my results.db": "/data/my results.db",
        # a quote closing the option, then ':': a plain run's refusal lost its "':" to the ***
        "cannot open db.url='postgresql://u@h/db?password=s3cret': refused": (
            "cannot open db.url='postgresql://u@h/db?password=***': refused"
        ),
        "run postgresql://u@h/db?password=ab:cd now": "run postgresql://u@h/db?password=*** now",
        # one '/' after the scheme: SQLAlchemy cannot read it, and the refusal's hint showed it again
        "db.url='postgresql:/u:s3cret@h/db' (sqlite:////tmp/postgresql:/u:s3cret@h/db)": (
            "db.url='postgresql:/u:***@h/db' (sqlite:////tmp/postgresql:/u:***@h/db)"
        ),
    }
    assert {k: store.hide_password(k) for k in cases} == cases
    # a db.url is a database's URL whatever its scheme (one SQLAlchemy lacks was shown whole)
    from perfsweep.cli import hide_db_url

    assert hide_db_url("nosuch://u:Top/Secret 9@h/db") == "nosuch://u:***@h/db"
    # and to the last '@' before the query: a bare '@' in the password showed what followed it
    assert hide_db_url("postgresql://u:p@ss:w0rd@h/db?application_name=me@box") == (
        "postgresql://u:***@h/db?application_name=me@box"
    )
    assert hide_db_url("postgresql://user@server:s3cret@h/db") == "postgresql://user@server:***@h/db"
    assert store.hide_password("nosuch://u:Top/Secret 9@h/db") == "nosuch://u:Top/Secret 9@h/db"  # could be a hub URL
    word = "db.url=postgresql+psycopg2://u:pa ss/x@h/db"  # one word of a command line: its password may hold a space
    assert store.hide_password_in_word(word) == "db.url=postgresql+psycopg2://u:***@h/db"
    # a quoted override keeps its closing quote (Hydra's files hold it, and parse it again)
    quoted = "db.url='postgresql://u@h/db?password=Qpw77'"
    assert store.hide_password_in_word(quoted) == "db.url='postgresql://u@h/db?password=***'"
    assert store.hide_password(f"run {quoted} now") == "run db.url='postgresql://u@h/db?password=***' now"
    assert store.hide_password_in_word("postgresql://u@h/db?password=a'b&x=1") == "postgresql://u@h/db?password=***&x=1"
    # SQLAlchemy's own hiding (the summary's Results: line, the --db of every hint) left a ?password= option
    from sqlalchemy import create_engine

    from perfsweep.summary import db_arg

    option = "postgresql+psycopg2://u@h/db?password=Pq7Zz"
    assert "Pq7Zz" not in db_arg(option) + store.display_url(create_engine(option))
    assert all(store.in_memory(u) for u in ("sqlite://", "sqlite+pysqlite://", "sqlite://?cache=shared"))
    assert not any(store.in_memory(u) for u in ("sqlite:///results.db", "results.db", "postgresql://u@h/db"))


def test_sigterm_ends_a_long_query_at_once(tmp_path: Path):
    """With a Python SIGTERM handler installed for the read-only commands, ``kill`` waited for the
    query to finish; the default ends the process at once."""
    import signal
    import time

    db = tmp_path / "results.db"
    store.connect(f"sqlite:///{db}").dispose()
    slow = "with recursive n(i) as (select 1 union all select i + 1 from n where i < 1000000000) select count(*) from n"
    proc = subprocess.Popen([sys.executable, "-m", "perfsweep", "query", slow, "--db", str(db)], stderr=subprocess.PIPE)
    time.sleep(3)  # its imports done, the query running
    assert proc.poll() is None
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert time.monotonic() - start < 2 and proc.returncode == -signal.SIGTERM


def test_ctrl_c_while_a_query_waits_for_a_postgresql_lock_is_one_line(pg_url: str, tmp_path: Path):
    """Another session holds ``runs`` locked: Ctrl-C cancels the waiting query (store._wait_stoppable)
    and psycopg2 closes its connection behind SQLAlchemy's back, whose pool then logged a
    20-line traceback ("connection already closed") before the command's one line."""
    import signal
    import time

    import psycopg2
    from sqlalchemy.engine import make_url

    from tests.pg import new_database
    from tests.util import finish, start_as_in_a_terminal, wait_for

    url = new_database(pg_url)
    store.connect(url).dispose()
    u = make_url(url)
    other = psycopg2.connect(host=u.host, port=u.port, user=u.username, dbname=u.database)
    watch = psycopg2.connect(host=u.host, port=u.port, user=u.username, dbname=u.database)
    watch.autocommit = True
    try:
        other.cursor().execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        proc = start_as_in_a_terminal(
            [sys.executable, "-m", "perfsweep", "query", "select count(*) from runs", "--db", url], tmp_path
        )

        def waiting() -> bool:  # the query's backend queued for the lock
            with watch.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                return cur.fetchone()[0] > 0 or proc.poll() is not None

        wait_for(waiting, timeout=60)
        os.killpg(proc.pid, signal.SIGINT)
        asked = time.monotonic()
        _, err = finish(proc, 60)
        assert time.monotonic() - asked < 10 and proc.returncode == 130, err[-2000:]
        assert err.strip() == "perfsweep query: interrupted", err[-3000:]
    finally:
        other.rollback()
        other.close()
        watch.close()


def test_a_plain_postgresql_url_uses_the_driver_that_is_installed(pg_url: str, tmp_path: Path, capsys):
    """``postgresql://`` (no +driver), the form perfsweep's own messages suggest: SQLAlchemy 2.1
    takes it for psycopg 3, which the ``[postgres]`` extra does not install, and every command
    failed as "No module named 'psycopg'"."""
    from perfsweep import importer
    from perfsweep.report.__main__ import main as report_main
    from tests.pg import new_database

    plain = new_database(pg_url).replace("postgresql+psycopg2://", "postgresql://")
    assert plain.startswith("postgresql://")
    importer.write_result_file(
        tmp_path / "result.json", {"sweep_dir": str(tmp_path), "name": "s"}, run_row(0, run_uid="u")
    )
    assert importer.main([str(tmp_path / "result.json"), "--db", plain]) == 0
    assert main(["select count(*) as n from runs", "--db", plain, "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["n", "1"]
    assert report_main(["--db", plain, "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").is_file()


@pytest.mark.parametrize("command", ["query", "resume", "import", "upgrade"])
def test_help_reads_as_text_and_says_what_each_option_does(command: str, capsys) -> None:
    """The descriptions come from docstrings: ``perfsweep resume SWEEP`` was printed with its
    reStructuredText quotes, and query's --format had no help at all."""
    import importlib

    module = {"query": "perfsweep.query", "resume": "perfsweep.resume", "import": "perfsweep.importer"}
    main_of = importlib.import_module(module.get(command, f"perfsweep.{command}")).main
    with pytest.raises(SystemExit) as exit_:
        main_of(["--help"])
    text = capsys.readouterr().out
    assert exit_.value.code == 0 and text.startswith(f"usage: perfsweep {command}")
    assert "``" not in text, text
    if command == "query":
        assert "json: a list of objects" in text
    else:  # the docstring's first line, its command written plainly
        assert text.split("\n\n")[1].startswith(f"perfsweep {command} "), text


def test_a_server_that_is_down_is_named_as_such_not_as_a_refused_query(capsys):
    """A PostgreSQL server that is not listening (a port nobody holds): the line said "the
    database refused the query", as for a bad column; no query was sent."""
    import socket

    with socket.socket() as s:  # a free port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver is an extra ([postgres])")
    assert main(["SELECT 1", "--db", f"postgresql+psycopg2://nobody@127.0.0.1:{port}/perfsweep"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("perfsweep query: cannot connect to the database (") and "refused the query" not in err
    assert "\n" not in err, err
