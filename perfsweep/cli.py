"""Command-line plumbing shared by perfsweep's commands: one-line usage errors, one-line causes."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

SLOW_DATABASE_S = 3.0
"""After this long opening or first writing a database, a command says it is still waiting."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers a usage mistake in one line (``prog: message; see --help``), exit 2.

    argparse's default prints the whole usage block first; a script reading stderr, or a person,
    needs only what was wrong.
    """

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}; see {self.prog} --help", file=sys.stderr)
        sys.exit(2)

    def format_help(self) -> str:
        """The help without the docstrings' reStructuredText quotes (``perfsweep resume SWEEP``), which
        the descriptions are taken from."""
        return super().format_help().replace("``", "")


class UserError(Exception):
    """A problem the user can fix (a wrong option value, a missing file, an empty selection):
    printed as one line, no traceback, exit 2."""


def user_cache_dir() -> Path:
    """perfsweep's cache folder for this user: ``PERFSWEEP_CACHE_DIR``, else ``~/.cache/perfsweep``
    (tokenized corpora, perfsweep.corpus; a new results file's schema, perfsweep.store)."""
    if env := os.environ.get("PERFSWEEP_CACHE_DIR"):
        return Path(env).expanduser()
    return Path.home() / ".cache" / "perfsweep"


def seconds_text(s: float) -> str:
    """A duration people read at a glance, for progress lines and estimates: '42s', '1.9min'."""
    s = max(0.0, s)
    return f"{s:.0f}s" if s < 90 else f"{s / 60:.1f}min"


def first_line(what: BaseException | str | None, width: int | None = None) -> str:
    """The first line of an error or a stored message, cut to ``width`` characters with "...".

    Later lines of a driver's or library's message repeat SQL, paths or tracebacks. SQLAlchemy
    wraps the driver's exception; its ``orig`` holds the driver's own words (e.g. 'no such
    column: x') without SQLAlchemy's echo of the SQL. A wrapper raised ``from`` such an error is
    unwrapped to it. An exception with no message is named by its type.
    """
    if isinstance(what, BaseException):
        exc = what
        while getattr(exc, "orig", None) is None and exc.__cause__ is not None:
            exc = exc.__cause__
        text = str(getattr(exc, "orig", None) or exc).strip() or type(exc).__name__
    else:
        text = what.strip() if isinstance(what, str) else ""
    line = text.splitlines()[0] if text else ""
    return line if width is None or len(line) <= width else line[: width - 3] + "..."


DATABASE_URL = r"\b(?:(?:postgres(?:ql)?|mysql|mariadb|sqlite|oracle|mssql|cockroachdb)(?:\+\w+)?|[a-z]+\+\w+)\\?://?"
"""The start of a database URL (SQLAlchemy's dialect, maybe with its driver), whose password may
hold a '/' (:func:`hide_password`). Another scheme's ``user:password@`` is hidden only where no
'/' comes before the '@': a model's ``http://hub.local:8080/org/model@v2`` reads like one, and
hidden, it was stored as ``hub.local:***@v2`` and rerun so by perfsweep resume. The ``\\`` before
``://``: as Hydra escapes it in an override (``runs.overrides``). One '/' is enough: SQLAlchemy
cannot read ``postgresql:/u:pw@h/db``, and its refusal showed the password twice."""

ANY_SCHEME = r"\b[a-z][\w+.-]*\\?://?"
"""Any URL's start: what :func:`hide_db_url` takes for a database's, since its text is one."""


def hide_password(db: str) -> str:
    """``db`` (a ``--db`` or ``db.url``, or any text holding one, a sweep's command) as messages show
    it: every database URL's password as ``***``, so that a line does not put it in a terminal's
    scrollback or a CI log; a ``password=`` option too. The password runs to the first ``@``, as
    SQLAlchemy reads it ('/' and spaces included: a generated Top/Secret9 was shown; an '@' in a
    password is written %40). Textual, not SQLAlchemy's parse, which raised for a URL with a port
    that is no number (a traceback where the line said the URL was wrong)."""
    return _hidden(db, alone=re.match(DATABASE_URL, db) is not None)  # a URL alone: its password may hold a space


def hide_password_in_word(word: str) -> str:
    """:func:`hide_password` for one command-line word (an override, a URL), whose password may
    hold a space."""
    return _hidden(word, alone=True)


def hide_db_url(url: str) -> str:
    """:func:`hide_password` for a ``db.url`` as given, which is a database's URL whatever its
    scheme: a dialect SQLAlchemy lacks (``nosuch://u:Top/Secret 9@h/db``) was shown whole. Its
    password runs to the last '@' before the query: one written with a bare '@' (``u:p@ss:w0rd@h``,
    which SQLAlchemy cannot read and perfsweep refuses) showed all after the first."""
    # (the user name may hold an '@' too: user@server:pw@host, as SQLAlchemy reads it)
    return _hidden(url, alone=True, start=ANY_SCHEME + r"[^/\s:]*:", password=r"[^?]*")


def _hidden(db: str, alone: bool, start: str = DATABASE_URL + r"[^/\s:@]*:", password: str | None = None) -> str:
    # ``start``: the URL up to its password (the scheme, the user name, ':').
    # In a longer text a password ends at a space: a URL with no user (h:5432/db?user=me) took
    # everything up to a later word's '@' for its password
    if password is None:
        password = r"[^@]*" if alone else r"(?:\\\s|[^@\s])*"  # Hydra's escaped space (\ ) is no end
    hidden = re.sub(f"({start}){password}@", r"\1***@", db)
    # any other scheme's user:password@ too (a mistyped postgresq1://), where no '/' comes before the
    # '@': http://hub.local:8080/org/model@v2 is a host, a port and a path
    hidden = re.sub(r"(\b[a-z][\w+.-]*\\?://[^/\s:@]*:)[^@/\s]*@", r"\1***@", hidden)
    # the option runs to the next option, the word's end (a space, in a longer text), or a quote that
    # closes the word: db.url='...?password=x' lost its closing quote, and Hydra could not parse it
    # (in a longer text, a quote and then ':' or ',' closes it too: "db.url='...?password=x': refused"
    # lost its "':" to the ***)
    option = r"[^&]*?(?=['\"]?$|&)" if alone else r"[^&\s]*?(?=['\"](?:[\s:;,)]|$)|\s|$|&)"
    return re.sub(f"(?i)([?&]password=){option}", r"\1***", hidden)


@contextmanager
def waiting_for_database(url: str, after_s: float = SLOW_DATABASE_S) -> Iterator[None]:
    """Say once on stderr that the database at ``url`` is still being waited for, when opening or
    first writing it takes over ``after_s``.

    A database whose write lock another process holds (a sqlite3 shell left inside a transaction,
    another sweep migrating it) made a sweep sit silent for as long as the lock was held, minutes
    with the driver's retries, before its first job; a person could not tell that from a hang.
    """
    shell = "a sqlite3 shell" if url.startswith("sqlite") else "a session"
    said = (
        f"perfsweep: still waiting for the database {hide_password(url)} after {after_s:.0f} s: another process may hold its lock "
        f"(a sweep or import writing, a schema upgrade, {shell} left inside a transaction); this goes on "
        "once it is free"
    )

    def say() -> None:  # a stop is held while results are stored (interrupts.held): Ctrl-C waits too
        interrupts = sys.modules.get("perfsweep.interrupts")  # a hold is made only where it is loaded
        held = interrupts is not None and interrupts.holding()  # (this module imports none of perfsweep)
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # started with `&` in a script: it does nothing
        print(said + ("" if held or ignored else " (Ctrl-C stops it)"), file=sys.stderr, flush=True)

    with said_if_slow(say, after_s):
        yield


@contextmanager
def said_if_slow(say: Callable[[], None], after_s: float) -> Iterator[None]:
    """Call ``say`` once, from a timer thread, if the block is still running after ``after_s``: a
    wait is explained where it is long enough to be taken for a hang, and a quick step adds no
    line (a bad input's answer stays one line)."""
    timer = threading.Timer(after_s, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
