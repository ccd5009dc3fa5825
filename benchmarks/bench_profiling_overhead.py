"""Does the profiled window change the timed figures? tokens/s with profiling on vs off.

The profiler runs after the measured steps, so the ratio should be ~1.0 (target: >= 0.98).
Both settings run side by side in the same sweep, repeated, alternating, so drift in the
machine's speed hits both alike. Usage:

    python benchmarks/bench_profiling_overhead.py [--repeats 3] [extra perfsweep overrides...]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script
import pandas as pd
import sqlalchemy as sa


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("overrides", nargs="*", default=["steps.measure=20"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            order = "true,false" if i % 2 == 0 else "false,true"
            cmd = [sys.executable, "-m", "perfsweep", "-m", f"profile.enabled={order}", *args.overrides]
            print(f"[{i + 1}/{args.repeats}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            _bench.run_sweep(cmd, tmp, show=True)
        engine = sa.create_engine(f"sqlite:///{Path(tmp) / 'results.db'}")
        df = pd.read_sql_query(
            "SELECT json_extract(config_json, '$.profile.enabled') AS profiled, status, tokens_per_s,"
            " step_time_ms_p10, step_time_ms_p90, device_name FROM runs",
            engine,
        )
        engine.dispose()
    assert (df["status"] == "ok").all(), df
    on = df[df["profiled"] == 1]["tokens_per_s"].tolist()
    off = df[df["profiled"] == 0]["tokens_per_s"].tolist()
    ratio = statistics.median(on) / statistics.median(off)
    print(
        f"date: {datetime.now(timezone.utc):%Y-%m-%d}  machine: {df['device_name'].iloc[0]}, "
        f"{platform.node()}  overrides: {' '.join(args.overrides)}"
    )
    print(f"profiling on : tokens/s {', '.join(f'{v:,.0f}' for v in on)} (median {statistics.median(on):,.0f})")
    print(f"profiling off: tokens/s {', '.join(f'{v:,.0f}' for v in off)} (median {statistics.median(off):,.0f})")
    print(f"ratio on/off: {ratio:.3f} ({'meets' if ratio >= 0.98 else 'MISSES'} the >= 0.98 target)")
    return 0 if ratio >= 0.98 else 1


if __name__ == "__main__":
    raise SystemExit(main())
