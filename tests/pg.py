"""A throwaway PostgreSQL server for the test session (real server, no mocks).

``postgres_server()`` runs ``initdb`` into a fresh temporary directory, starts the server
with ``pg_ctl -w start`` listening only on 127.0.0.1 (on a free port) and on a unix socket
inside that directory, creates one database and yields its SQLAlchemy URL (trust auth, user
``postgres``). On exit the server is stopped with ``pg_ctl -m immediate stop`` and the
directory is deleted. PostgreSQL refuses to run as root, so when the tests run as root every
server command runs as the ``postgres`` OS user (``runuser``, else ``su``) and the directory
is handed to that user.

The session-scoped fixture ``pg_url`` wraps it and skips when no server binaries exist
(``apt-get install postgresql`` provides them under /usr/lib/postgresql/<version>/bin).
Load it with ``pytest_plugins = ["tests.pg"]``. ``new_database(pg_url)`` gives a test its
own empty database on that server (milliseconds, instead of a new server).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SKIP_REASON = "PostgreSQL server binaries (initdb) not installed: apt-get install postgresql"
PG_USER = "postgres"  # OS user that runs the server when the tests run as root
DB_USER = "postgres"  # database superuser created by initdb
DEFAULT_DB = "perfsweep_test"

_db_counter = itertools.count(1)


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: from PATH, else the newest
    /usr/lib/postgresql/<version>/bin; None when PostgreSQL's server is not installed."""
    candidates = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", Path(path).parent.parent.name)) or (0,)

    for initdb in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True):
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(cmd: list[str]) -> list[str]:
    """``cmd`` wrapped to run as the postgres OS user when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", PG_USER, "--", *cmd]
    return ["su", PG_USER, "-s", "/bin/sh", "-c", shlex.join(cmd)]


def _run(cmd: list[str], cwd: Path, what: str, log: Path | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    proc = subprocess.run(_as_server_user(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        detail = proc.stdout + proc.stderr
        if log is not None and log.exists():
            detail += "\n--- server log ---\n" + log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{what} failed ({shlex.join(cmd)}), exit {proc.returncode}:\n{detail}")


def pg_url_for(port: int, dbname: str) -> str:
    return f"postgresql+psycopg2://{DB_USER}@127.0.0.1:{port}/{dbname}"


def new_database(url: str, name: str | None = None) -> str:
    """Create an empty database on the server behind ``url``; return the URL for it."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = name or f"perfsweep_t{os.getpid()}_{next(_db_counter)}"
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"unsafe database name {name!r}")
    admin = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@contextmanager
def postgres_server(dbname: str = DEFAULT_DB) -> Iterator[str]:
    """Start a throwaway PostgreSQL server; yield the SQLAlchemy URL of database ``dbname``."""
    bindir = find_bindir()
    if bindir is None:
        raise FileNotFoundError(SKIP_REASON)
    root = Path(tempfile.mkdtemp(prefix="perfsweep-pg-"))
    data, sockdir, log = root / "data", root / "sock", root / "server.log"
    sockdir.mkdir()
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam(PG_USER)
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"running as root but there is no {PG_USER!r} OS user to run PostgreSQL as") from None
        for path in (root, sockdir):
            os.chown(path, user.pw_uid, user.pw_gid)
    os.chmod(root, 0o700)
    pg_ctl = str(bindir / "pg_ctl")
    try:
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                DB_USER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
                "--no-instructions",
            ],
            cwd=root,
            what="initdb",
        )
        with open(data / "postgresql.conf", "a") as conf:  # appended settings win
            conf.write(
                "\n# perfsweep test server\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{sockdir}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "max_connections = 100\nshared_buffers = 32MB\n"
            )
        for attempt in range(3):  # the free port can be taken between probing and binding
            port = _free_port()
            try:
                _run(
                    [
                        pg_ctl,
                        "-D",
                        str(data),
                        "-l",
                        str(log),
                        "-o",
                        f"-p {port}",
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ],
                    cwd=root,
                    what="pg_ctl start",
                    log=log,
                )
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        yield new_database(pg_url_for(port, "postgres"), dbname)
    finally:
        try:
            if (data / "postmaster.pid").exists():  # also after a start that timed out
                _run(
                    [pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
                    cwd=root,
                    what="pg_ctl stop",
                )
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of an empty database on a PostgreSQL server started for this test session."""
    if find_bindir() is None:
        pytest.skip(SKIP_REASON)
    with postgres_server() as url:
        yield url
