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


def first_line(exc: BaseException) -> str:
    """A driver's or library's message, first line only (their later lines repeat SQL or paths).

    SQLAlchemy wraps the driver's exception; its ``orig`` holds the driver's own words (e.g. 'no
    such column: x') without SQLAlchemy's echo of the SQL. A wrapper raised ``from`` such an error
    is unwrapped to it.
    """
    while getattr(exc, "orig", None) is None and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
