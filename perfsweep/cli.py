"""Command-line plumbing shared by perfsweep's commands: one-line usage errors, one-line causes."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse that answers a usage mistake in one line (``prog: message; see --help``), exit 2.

    argparse's default prints the whole usage block first; a script reading stderr, or a person,
    needs only what was wrong.
    """

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}; see {self.prog} --help", file=sys.stderr)
        sys.exit(2)


class UserError(Exception):
    """A problem the user can fix (a wrong option value, a missing file, an empty selection):
    printed as one line, no traceback, exit 2."""


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
