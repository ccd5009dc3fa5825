"""How long a sweep takes to end after a Ctrl-C in its first seconds, while its job server imports.

Each try starts a 2-job CPU sweep as a terminal would (a process group of its own), sends SIGINT
to the group after a delay, and times the sweep's exit from there. The job server is started as
the grid is composed (PERFSWEEP_EARLY_JOB_SERVER=1), so the delays cover its imports and the
sweep's first request to it (the CPU's matmul peak). Side by side with another tree of perfsweep
(a ``git worktree`` of an older commit), the trees' tries interleaved:

    git worktree add /tmp/before <commit>
    python benchmarks/bench_ctrl_c.py --tree before=/tmp/before --tree now=. --rounds 2

prints each try, then per tree the median and the longest time to exit and the exit codes.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script

SWEEP = ["-m", *_bench.TINY, "seed=0,1"]


def tree(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not (Path(path) / "perfsweep" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"--tree {text!r}: give NAME=PATH, PATH a checkout with perfsweep/__init__.py")
    return name, Path(path).resolve()


def seconds(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"--delays {text!r}: give seconds >= 0, separated by commas")
    return values


def exit_after_ctrl_c(checkout: Path, delay: float, cwd: Path) -> tuple[float, int | None]:
    """Seconds from the Ctrl-C to the sweep's exit, and its exit code (None: killed at 60 s)."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "PERFSWEEP_EARLY_JOB_SERVER": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfsweep", *SWEEP],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(delay)
    sent = time.perf_counter()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        exit_code: int | None = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        exit_code = None
    return time.perf_counter() - sent, exit_code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=tree, action="append", help="NAME=PATH of a perfsweep checkout (repeatable)")
    parser.add_argument("--delays", type=seconds, default=seconds("0.8,1.1,1.4,1.7,2.0,2.3,2.6"))
    parser.add_argument("--rounds", type=_bench.at_least(1), default=1)
    args = parser.parse_args()
    trees = args.tree or [("this", Path(__file__).resolve().parents[1])]
    took: dict[str, list[float]] = {name: [] for name, _ in trees}
    codes: dict[str, set[int | None]] = {name: set() for name, _ in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for delay in args.delays:
                for name, checkout in trees if r % 2 == 0 else list(reversed(trees)):
                    cwd = Path(tempfile.mkdtemp(dir=tmp))
                    t, exit_code = exit_after_ctrl_c(checkout, delay, cwd)
                    took[name].append(t)
                    codes[name].add(exit_code)
                    print(
                        f"round {r + 1}  Ctrl-C at {delay:.1f} s  {name:<10} ended {t:5.2f} s after, exit {exit_code}"
                    )
    print()
    for name, times in took.items():
        print(
            f"{name:<10} median {statistics.median(times):5.2f} s  longest {max(times):5.2f} s  "
            f"exit codes {sorted(codes[name], key=str)}  ({len(times)} tries)"
        )


if __name__ == "__main__":
    main()
