"""What the benchmarks beside this file share: running perfsweep as a user types it, where a sweep
that fails ends the benchmark in one line saying why (perfsweep's own last line), not in a
CalledProcessError's traceback with perfsweep's reason thrown away; and counts of rounds that
must be at least so many (a ratio of one round a side has no spread to give an interval from).

A benchmark with a target (overhead.py, bench_profiling_overhead.py, bench_report.py,
bench_default_sweep.py) prints "meets" or "MISSES" and exits 1 where it misses it; one that fails
to measure exits non-zero with one line."""

from __future__ import annotations

import argparse
import collections
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

TINY = [
    "model=tiny",
    "data=synthetic",
    "batch=4",
    "seq_len=32",
    "steps.warmup=1",
    "steps.stable_window=0",
    "steps.measure=3",
    "profile.wait=0",
    "profile.warmup=0",
    "profile.active=1",
    "report=false",
    "device=cpu",
]
"""A CPU sweep's tiny settings, for benchmarks of perfsweep's own cost: a step takes a few ms, so
what is measured is the processes, imports and bookkeeping around it."""


def run_sweep(cmd: list[str], cwd: Path | str, show: bool = False, env: dict[str, str] | None = None) -> None:
    """Run ``cmd`` (``[sys.executable, "-m", "perfsweep", ...]``) in ``cwd`` (with ``env``, else
    this environment), its stdout (the summary; benchmarks read the database) dropped and its
    stderr shown as it comes where ``show``; exit with one line naming the benchmark, the command
    and perfsweep's last line where it fails."""
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            if show:
                sys.stderr.write(line)
            if line.strip():
                tail.append(line.rstrip("\n"))
    if proc.returncode != 0:
        said = tail[-1] if tail else "(nothing on stderr)"
        args = ["-c", "SCRIPT", *cmd[3:]] if cmd[1:2] == ["-c"] else cmd[1:]  # a -c script's lines stay out
        raise SystemExit(f"{Path(sys.argv[0]).stem}: {shlex.join(args)} exited {proc.returncode}: {said}")


def at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``minimum``, else argparse's one error line."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {minimum}{f' ({why})' if why else ''}")
        return value

    return parse


SPREAD = "one round a side has no spread: its 95% interval would be the ratio itself"
