"""The README's default sweep from a cold start: wall time, and what it measured.

Cold start = an empty token cache (the stdlib corpus is tokenized inside the timing) and a
new results.db. Targets: under 3 minutes on 2 CPU cores; ckpt=true shows a lower training
memory figure (peak_mem_bytes) than ckpt=false. Usage:

    python benchmarks/bench_default_sweep.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script
import pandas as pd
import sqlalchemy as sa


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PERFSWEEP_CACHE_DIR": str(Path(tmp) / "cache")}
        t0 = time.perf_counter()
        _bench.run_sweep(
            [sys.executable, "-m", "perfsweep", "-m", "amp=true,false", "ckpt=true,false"], tmp, show=True, env=env
        )
        wall = time.perf_counter() - t0
        engine = sa.create_engine(f"sqlite:///{Path(tmp) / 'results.db'}")
        df = pd.read_sql_query(
            "SELECT amp, ckpt, status, tokens_per_s, step_time_ms_median, step_time_ms_p10,"
            " step_time_ms_p90, peak_mem_bytes, device_name, torch_version, cpu_count FROM runs",
            engine,
        )
        engine.dispose()
    env_row = df.iloc[0]
    print(
        f"date: {datetime.now(timezone.utc):%Y-%m-%d}  machine: {env_row['device_name']}, "
        f"{env_row['cpu_count']} cores, torch {env_row['torch_version']}"
    )
    print(f"cold-start wall time: {wall:.1f} s ({'meets' if wall < 180 else 'MISSES'} the < 180 s target)")
    df["peak_mem_MiB"] = df["peak_mem_bytes"] / 2**20
    print(
        df[
            [
                "amp",
                "ckpt",
                "status",
                "tokens_per_s",
                "step_time_ms_median",
                "step_time_ms_p10",
                "step_time_ms_p90",
                "peak_mem_MiB",
            ]
        ].to_string(index=False, float_format=lambda v: f"{v:,.1f}")
    )
    mem = {(r.amp, r.ckpt): r.peak_mem_bytes for r in df.itertuples()}
    ok = all(mem[(a, 1)] < mem[(a, 0)] for a in (0, 1))
    for a in (0, 1):
        print(f"amp={a}: ckpt changes training memory by {100 * (mem[(a, 1)] / mem[(a, 0)] - 1):+.1f}%")
    return 0 if ok and wall < 180 and (df["status"] == "ok").all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
