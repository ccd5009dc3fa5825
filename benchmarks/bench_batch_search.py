"""batch=max: how many jobs a search takes with the calibration from its first ok try's measured
memory use (perfsweep.search.Calibration) and without it (the ledger's prediction, then growth,
shrinking and bisection alone), on this machine.

Both run as real ``-m batch=max`` sweeps, alternating, ``--rounds`` times. "Without" is the same
perfsweep with ``Calibration.estimate`` answering None, set in the sweep's own process before
Hydra starts, so every other part (jobs, limits, storage) is the one users run. Reported per
search: the ledger's prediction, the calibrated estimate, the largest batch found, the jobs it
took, and the sweep's wall time. Usage:

    python benchmarks/bench_batch_search.py                      # the tiny GPT under a 300 MiB limit, 3 rounds
    python benchmarks/bench_batch_search.py --rounds 2 job_memory_limit_mib=600 seq_len=64
    python benchmarks/bench_batch_search.py device=cuda model=small   # on a GPU: peak reserved bytes calibrate
"""

from __future__ import annotations

import argparse
import platform
import sqlite3
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script
import numpy as np

POINT = [
    "model=tiny",
    "data=synthetic",
    "data.synthetic_vocab=2048",
    "seq_len=32",
    "threads=2",
    "job_memory_limit_mib=300",
    "steps.warmup=1",
    "steps.stable_window=0",
    "steps.measure=2",
    "profile.enabled=false",
    "device=cpu",
]

UNCALIBRATED = (
    "import sys, runpy; from perfsweep import search; "
    "search.Calibration.estimate = lambda self, batch, used: None; "
    "sys.argv = ['perfsweep', *sys.argv[1:]]; runpy.run_module('perfsweep', run_name='__main__')"
)


def one_search(work: Path, calibrated: bool, overrides: list[str]) -> dict[str, float]:
    db = work / f"{'cal' if calibrated else 'plain'}-{time.monotonic_ns()}.db"
    head = [sys.executable, "-m", "perfsweep"] if calibrated else [sys.executable, "-c", UNCALIBRATED]
    cmd = [*head, "-m", "batch=max", f"db.url=sqlite:///{db}", "report=false", *POINT, *overrides]
    t0 = time.perf_counter()
    _bench.run_sweep(cmd, work)
    wall = time.perf_counter() - t0
    con = sqlite3.connect(db)
    predicted, cal, found, tried = con.execute(
        "SELECT predicted_max_batch, calibrated_max_batch, max_batch, n_tried FROM batch_searches"
    ).fetchone()
    con.close()
    return {"predicted": predicted, "calibrated": cal, "max_batch": found, "jobs": tried, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="added to (and overriding) the tiny GPT's point")
    args = parser.parse_args()
    rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for calibrated in (r % 2 == 0, r % 2 == 1):  # alternate which goes first
                rows[calibrated].append(one_search(Path(tmp), calibrated, args.overrides))
    import torch

    print(
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}, {platform.node()}, {platform.processor() or platform.machine()}"
        f", torch {torch.__version__}; overrides: {' '.join([*POINT, *args.overrides])}"
    )
    print("| search | round | ledger predicted | calibrated | max batch | jobs | sweep wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for calibrated in (True, False):
        for i, r in enumerate(rows[calibrated], 1):
            cal = r["calibrated"] if r["calibrated"] is not None else "-"
            label = "calibrated" if calibrated else "ledger only"
            print(f"| {label} | {i} | {r['predicted']} | {cal} | {r['max_batch']} | {r['jobs']} | {r['wall_s']:.1f} |")
    jobs = {c: float(np.median([r["jobs"] for r in rows[c]])) for c in rows}
    wall = {c: float(np.median([r["wall_s"] for r in rows[c]])) for c in rows}
    print(
        f"\nmedian jobs: calibrated {jobs[True]:g}, ledger only {jobs[False]:g} (ratio {jobs[True] / jobs[False]:.2f}); "
        f"median sweep wall: {wall[True]:.1f} s against {wall[False]:.1f} s (ratio {wall[True] / wall[False]:.2f})"
    )


if __name__ == "__main__":
    main()
