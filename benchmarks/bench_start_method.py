"""launcher.start_method: forked jobs against spawned ones, side by side in one run.

Each round runs the same sweep twice, once per start method (the order alternating between
rounds), each from its own empty folder. Compared: the sweep's wall time, each job's
``duration_s`` (its row's start to its result), and what the jobs measured (tokens/s, peak
memory), which the start method must leave alone; those two are each job's figure over its grid
point's median in both methods, so that fast and slow grid points pool. ``forkserver-early`` and
``forkserver-late``: forkserver with the job server started as the grid is composed
(perfsweep.job_start.start_early), or by the first job. Usage:

    python benchmarks/bench_start_method.py                        # 6 tiny CPU jobs, 4 rounds
    python benchmarks/bench_start_method.py --rounds 2 model=small  # any overrides
    python benchmarks/bench_start_method.py --methods spawn forkserver device=cuda  # on a GPU
    python benchmarks/bench_start_method.py --methods forkserver-late forkserver-early seed=0 ...  # early server
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script
import numpy as np

from perfsweep.names import EARLY_JOB_SERVER_ENV

TINY = ["model=tiny", "data=synthetic", "batch=4", "seq_len=32", "steps.warmup=1", "steps.stable_window=0"]
DEFAULT = [*TINY, "steps.measure=10", "profile.active=1", "report=false", "device=cpu", "seed=0,1,2", "amp=true,false"]


def sweep(method: str, work: Path, extra: list[str]) -> tuple[float, list[dict]]:
    """Run one sweep with ``launcher.start_method=method`` in ``work``: (wall s, its runs' rows).
    ``forkserver-early`` and ``forkserver-late``: the job server started as the grid is composed,
    or by the first job (PERFSWEEP_EARLY_JOB_SERVER=1 or 0; plain ``forkserver``: where a core is spare)."""
    work.mkdir()
    stored, _, when = method.partition("-")
    env = {**os.environ, EARLY_JOB_SERVER_ENV: {"early": "1", "late": "0"}[when]} if when else None
    t0 = time.perf_counter()
    _bench.run_sweep(
        [sys.executable, "-m", "perfsweep", "-m", f"launcher.start_method={stored}", *extra], work, env=env
    )
    wall = time.perf_counter() - t0
    from perfsweep.query import records

    rows = records(str(work / "results.db"), "SELECT * FROM runs ORDER BY job_num")
    bad = [(r["status"], r["start_method"]) for r in rows if r["status"] != "ok" or r["start_method"] != stored]
    if bad:
        raise SystemExit(f"bench_start_method: a {method} sweep's runs were {bad}, not all ok and {stored}")
    return wall, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=_bench.at_least(2, _bench.SPREAD), default=4)
    ap.add_argument("--methods", nargs=2, default=["spawn", "forkserver"], metavar=("BASE", "OTHER"))
    ap.add_argument("overrides", nargs="*", help="sweep overrides (default: 6 tiny CPU jobs)")
    args = ap.parse_args()
    from perfsweep.metrics import ratio_interval

    extra = args.overrides or DEFAULT
    base, other = args.methods
    walls: dict[str, list[float]] = {base: [], other: []}
    rows: dict[str, list[dict]] = {base: [], other: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for method in (base, other) if i % 2 == 0 else (other, base):
                wall, got = sweep(method, Path(tmp) / f"{method}{i}", extra)
                walls[method].append(wall)
                rows[method].extend(got)
            print(
                f"round {i + 1}: sweep wall {base} {walls[base][-1]:.1f} s, {other} {walls[other][-1]:.1f} s",
                flush=True,
            )
    first = rows[base][0]
    print(
        f"date: {datetime.now(timezone.utc):%Y-%m-%d}  machine: {first['device_name']} ({platform.node()}), "
        f"{first['cpu_count']} cores, torch {first['torch_version']}"
    )
    print(
        f"command: python benchmarks/bench_start_method.py --rounds {args.rounds} --methods {base} {other} {' '.join(extra)}"
    )
    print(f"{len(rows[base]) // args.rounds} jobs a sweep, {args.rounds} sweeps per method")
    print(f"{'':32s} {base:>14s} {other:>14s}   {other} / {base} [95% CI]")

    def line(name: str, per: dict[str, list[float]], fmt: str) -> None:
        r = ratio_interval(per[other], per[base])
        med = {m: float(np.median(v)) for m, v in per.items()}
        print(f"{name:32s} {med[base]:>14{fmt}} {med[other]:>14{fmt}}   {r.value:.3f} [{r.lo:.3f}-{r.hi:.3f}]")

    line("sweep wall s", walls, ".1f")
    line("job duration_s", {m: [r["duration_s"] for r in rows[m]] for m in rows}, ".2f")
    for key in (
        "tokens_per_s",
        "peak_mem_bytes",
        "rss_before_train_bytes",
        "peak_rss_bytes",
    ):  # over the point's median
        point = {}  # in both methods, so that grid points of different speed pool
        for r in rows[base] + rows[other]:
            point.setdefault(r["overrides"], []).append(r[key])
        middle = {k: float(np.median(v)) for k, v in point.items()}
        line(f"{key} / point's", {m: [r[key] / middle[r["overrides"]] for r in rows[m]] for m in rows}, ".3f")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
