"""launcher.parallel: what running jobs side by side buys (sweep wall time) and costs (each job's
own throughput, perturbed by its neighbours), on this machine (issue 14).

The same grid runs as a sweep with ``launcher.parallel=1`` and one with ``launcher.parallel=N``,
alternating, ``--rounds`` times. Reported per setting: the sweep's wall time (median over rounds)
and each config's tokens/s (median over rounds), then the ratios N / 1. On a CPU each of N jobs
gets 1/N of the cores, so per-job throughput is expected to fall; on a multi-GPU box each job has
its own GPU and the ratio says how much the neighbours cost through the host and PCIe. Usage:

    python benchmarks/bench_parallel.py                                  # parallel 2, 2 rounds, CPU
    python benchmarks/bench_parallel.py --parallel 8 --rounds 3 device=cuda amp=true batch=8,16
"""

from __future__ import annotations

import argparse
import platform
import sqlite3
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script
import numpy as np

GRID = ["ckpt=true,false", "batch=4,8"]


def sweep(work: Path, parallel: int, overrides: list[str]) -> tuple[float, dict[str, float]]:
    """(wall seconds, tokens/s by overrides) of one sweep."""
    db = work / f"p{parallel}.db"
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "perfsweep", "-m", f"launcher.parallel={parallel}", f"db.url=sqlite:///{db}"]
    given = {o.partition("=")[0] for o in overrides}  # a key given here replaces the grid's (perfsweep refuses both)
    grid = [g for g in GRID if g.partition("=")[0] not in given]
    _bench.run_sweep([*cmd, "report=false", *grid, *overrides], work)
    wall = time.perf_counter() - t0
    con = sqlite3.connect(db)
    sweep_id = con.execute("SELECT max(id) FROM sweeps").fetchone()[0]
    sql = "SELECT 'ckpt=' || ckpt || ' batch=' || batch, tokens_per_s FROM runs WHERE sweep_id = ?"
    rows = con.execute(sql, (sweep_id,)).fetchall()
    con.close()
    return wall, dict(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("overrides", nargs="*", default=["device=cpu"])
    args = ap.parse_args()
    walls: dict[int, list[float]] = defaultdict(list)
    rates: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # the order alternates, so neither setting always runs first
            for p in (1, args.parallel) if r % 2 == 0 else (args.parallel, 1):
                wall, by_config = sweep(Path(tmp), p, args.overrides)
                walls[p].append(wall)
                for config, rate in by_config.items():
                    rates[p][config].append(rate)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"{when}, {platform.node()}, {platform.processor() or platform.machine()}; grid {' '.join(GRID)} "
        f"{' '.join(args.overrides)}; {args.rounds} rounds"
    )
    w1, wn = np.median(walls[1]), np.median(walls[args.parallel])
    print(f"sweep wall time: parallel=1 {w1:.1f} s, parallel={args.parallel} {wn:.1f} s: {w1 / wn:.2f}x faster")
    print(f"{'config':<40}{'tokens/s p=1':>14}{f'p={args.parallel}':>10}{'ratio':>8}")
    for config in sorted(rates[1]):
        a, b = np.median(rates[1][config]), np.median(rates[args.parallel][config])
        print(f"{config:<40}{a:>14,.0f}{b:>10,.0f}{b / a:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
