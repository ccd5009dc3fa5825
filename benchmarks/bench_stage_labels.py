"""What do the five stage labels of a training step cost when no profiler is running?

Every step enters five ``record_function`` ranges (data_to_device, forward, backward,
optimizer_step, zero_grad) so the profiler can split the step. This script times entering and
leaving five ranges against five no-op context managers, in alternating blocks in one process
(so drift hits both alike), and reports microseconds per step. perfsweep enters the ranges only
in profiled steps; the measured steps pay for the no-op. Usage:

    python benchmarks/bench_stage_labels.py [--rounds 10] [--steps 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
from datetime import datetime, timezone

import _bench  # benchmarks/_bench.py, beside this script
import torch

from perfsweep.envinfo import cpu_name
from perfsweep.names import STAGES
from perfsweep.profiling import stage


def _block(n: int, enter) -> float:
    """Microseconds per step of ``n`` steps, each entering and leaving one context per stage."""
    t0 = time.perf_counter()
    for _ in range(n):
        for name in STAGES:
            with enter(name):
                pass
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=_bench.at_least(1), default=10)
    ap.add_argument("--steps", type=int, default=20000)
    args = ap.parse_args()
    null = contextlib.nullcontext()
    labels: list[float] = []
    bare: list[float] = []
    _block(1000, stage), _block(1000, lambda _n: null)  # warm both paths
    for _ in range(args.rounds):
        labels.append(_block(args.steps, stage))
        bare.append(_block(args.steps, lambda _n: null))
    lab, nul = statistics.median(labels), statistics.median(bare)
    print(
        f"date: {datetime.now(timezone.utc):%Y-%m-%d}  machine: {cpu_name()}, {platform.node()}  "
        f"torch {torch.__version__}  {args.rounds} rounds x {args.steps} steps"
    )
    print(f"record_function x{len(STAGES)} per step: median {lab:.2f} us (rounds {min(labels):.2f}-{max(labels):.2f})")
    print(f"no-op context x{len(STAGES)} per step:    median {nul:.2f} us (rounds {min(bare):.2f}-{max(bare):.2f})")
    print(f"labels cost {lab - nul:.2f} us per step, {(lab - nul) / len(STAGES):.2f} us per range, outside a profiler")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
