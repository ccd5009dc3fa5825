"""Command-line plumbing shared by perfsweep's subcommands (trace, query)."""

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
