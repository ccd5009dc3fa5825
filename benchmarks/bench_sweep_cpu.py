"""The CPU time a tiny sweep costs, this checkout against another commit, interleaved.

On the 2-core CI machine the test suite is CPU-bound (its two workers kept both cores 96% busy
over test_bad_input.py and test_sweep.py), so what a sweep costs in CPU seconds, not its wall
time alone, decides the suite's time; and a user's first sweep on a laptop pays the same. A
sweep's processes (the command, the job server, the jobs it forks) are not all children the
command waits for, so their time is read machine-wide, from /proc/stat, around each sweep: run
this on an otherwise idle machine.

    python benchmarks/bench_sweep_cpu.py --base COMMIT [--rounds 3] [--jobs 4]

makes a git worktree of COMMIT in a temporary folder, runs the same tiny CPU sweep (``--jobs``
grid points) from it and from this checkout in turn (PYTHONPATH picks the source), and prints
each round's CPU and wall seconds, then each side's median and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script

ROOT = Path(__file__).resolve().parent.parent
TINY = _bench.TINY
GRIDS = {1: [], 2: ["amp=true,false"], 4: ["amp=true,false", "ckpt=true,false"]}


def busy_seconds() -> float:
    """CPU seconds every core has spent busy since boot (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def one_sweep(source: Path, jobs: int, cwd: Path) -> tuple[float, float]:
    """CPU and wall seconds of one sweep run from ``source``'s perfsweep, in a fresh ``cwd``."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    cmd = [sys.executable, "-m", "perfsweep", *(["-m"] if jobs > 1 else []), *GRIDS[jobs], *TINY]
    cpu, wall = busy_seconds(), time.perf_counter()
    _bench.run_sweep(cmd, cwd, env=env)
    wall = time.perf_counter() - wall
    time.sleep(0.5)  # the job server's exit, after the command's
    return busy_seconds() - cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (a SHA, a branch, HEAD~3)")
    parser.add_argument("--rounds", type=_bench.at_least(2, _bench.SPREAD), default=3)
    parser.add_argument("--jobs", type=int, choices=sorted(GRIDS), default=4, help="grid points of the sweep")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        made = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.base],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise SystemExit(f"bench_sweep_cpu: --base {args.base}: {made.stderr.strip().splitlines()[-1]}")
        try:
            sides = {"base": base, "this": ROOT}
            seen: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
            one_sweep(ROOT, 1, Path(tempfile.mkdtemp(dir=tmp)))  # the token cache and the page cache, warm
            for r in range(args.rounds):
                for name, source in sides.items():
                    cpu, wall = one_sweep(source, args.jobs, Path(tempfile.mkdtemp(dir=tmp)))
                    seen[name].append((cpu, wall))
                    print(f"round {r + 1}  {name:4}  cpu {cpu:6.2f} s  wall {wall:6.2f} s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    med = {name: [statistics.median(v[i] for v in seen[name]) for i in (0, 1)] for name in seen}
    for name in seen:
        print(f"median {name:4}  cpu {med[name][0]:6.2f} s  wall {med[name][1]:6.2f} s")
    print(
        f"this/base: cpu {med['this'][0] / med['base'][0]:.3f}, wall {med['this'][1] / med['base'][1]:.3f} "
        f"({args.jobs}-job tiny sweep, {args.rounds} rounds, {os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    main()
