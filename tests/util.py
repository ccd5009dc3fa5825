"""Helpers shared by the tests: the tiny job settings and a way to run the CLI as a user does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Small enough that a job takes a few seconds on 2 cores, real enough to exercise every path.
TINY = [
    "model=tiny",
    "data=synthetic",
    "batch=4",
    "seq_len=32",
    "steps.warmup=1",
    "steps.measure=3",
    "profile.wait=0",
    "profile.warmup=0",
    "profile.active=1",
]


def run_perfsweep(args: list[str], cwd: Path, timeout: float = 600,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the CLI exactly as a user would, in ``cwd`` (where results.db lands)."""
    return subprocess.run(
        [sys.executable, "-m", "perfsweep", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
