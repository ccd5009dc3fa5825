"""What a DistributedDataParallel job costs over a plain one: ``nproc=1`` (one rank, in DDP, started
by torch.distributed's elastic launch) against ``nproc=null`` (a plain process), same config,
repeats interleaved in one sweep (issue 14).

One rank has nothing to exchange, but DDP still buckets the gradients and runs an allreduce over
them each step (gloo on CPU, NCCL on CUDA) and its forward hooks; this measures that wrapper.
The figure is the ratio of median tokens/s over repeats, with a 95% bootstrap interval over them
(perfsweep.metrics.ratio_interval). Usage:

    python benchmarks/bench_ddp_overhead.py                      # device=auto, model=small, 4 repeats
    python benchmarks/bench_ddp_overhead.py --repeat 6 device=cuda model=minigpt_seed amp=true batch=8
"""

from __future__ import annotations

import argparse
import platform
import sqlite3
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script
import numpy as np

from perfsweep.metrics import ratio_interval


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=_bench.at_least(2, _bench.SPREAD), default=4)
    ap.add_argument("overrides", nargs="*", default=[])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cmd = [sys.executable, "-m", "perfsweep", "-m", "nproc=null,1", f"repeat={args.repeat}", "order=shuffle"]
        cmd += ["report=false", "profile.enabled=false", *args.overrides]
        _bench.run_sweep(cmd, work, show=True)
        con = sqlite3.connect(work / "results.db")
        rows = con.execute("SELECT nproc, tokens_per_s, device_name FROM runs WHERE status = 'ok'").fetchall()
        con.close()
    plain = np.array([t for n, t, _ in rows if n is None])
    ddp = np.array([t for n, t, _ in rows if n == 1])
    ratio = ratio_interval(ddp, plain)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{when}, {rows[0][2]}, {platform.node()}; overrides: {' '.join(args.overrides) or '(none)'}")
    print(f"plain (nproc=null): median {np.median(plain):,.0f} tokens/s over {len(plain)} runs {np.round(plain)}")
    print(f"DDP   (nproc=1):    median {np.median(ddp):,.0f} tokens/s over {len(ddp)} runs {np.round(ddp)}")
    print(f"nproc=1 / plain: {ratio.value:.3f} [95% CI {ratio.lo:.3f}-{ratio.hi:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
