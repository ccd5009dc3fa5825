"""timing=sync against timing=events on one config, alternating fresh jobs (issue 12, point 4).

sync ends every measured step with loss.item() and a device synchronisation, so the host cannot
queue step N+1 while the GPU runs step N; events keeps that overlap. On a launch-bound config
(MiniGPT, fp16 AMP, batch 2: the GPU is ~36% busy, see docs/benchmarks.md) the difference is
what this measures. Each job's last warmup steps are sync-timed in either mode; printed beside
the measured medians, they tell a mode that is slower from a process that is (on an H100 the
events jobs were slower in all 3 rounds, and sync jobs alone ranged from 88,905 to 118,742
tokens/s). Needs a CUDA device. Usage:

    python benchmarks/bench_timing_modes.py                      # minigpt_seed, fp16, 5 rounds
    python benchmarks/bench_timing_modes.py --rounds 3 batch=8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script

WARM_TAIL = "SELECT step_time_ms FROM steps WHERE run_id = {run_id:d} AND phase = 'warmup' ORDER BY step DESC LIMIT 5"
"""The job's last five warmup steps (sync-timed whatever ``timing`` is)."""

BASE = ["model=minigpt_seed", "amp=true", "amp_dtype=fp16", "batch=2", "seq_len=1024", "data.vocab_limit=10000"]


def run(mode: str, work: Path, i: int, extra: list[str]) -> dict:
    db = work / "timing.db"
    _bench.run_sweep(
        [
            sys.executable,
            "-m",
            "perfsweep",
            *BASE,
            "device=cuda",
            f"timing={mode}",
            "profile.enabled=false",
            f"db.url=sqlite:///{db}",
            f"hydra.run.dir={work / f'{mode}{i}'}",
            *extra,
        ],
        work,
        show=True,
    )
    from perfsweep.query import records

    (row,) = records(str(db), "SELECT * FROM runs ORDER BY id DESC LIMIT 1")
    # the last warmup steps are timed sync in both modes: the same process's own sync reference,
    # which tells a slower mode from a slower process (fresh jobs differ by up to a third)
    warm = [r["step_time_ms"] for r in records(str(db), WARM_TAIL.format(run_id=int(row["id"])))]
    row["warmup_tail_ms_median"] = statistics.median(warm) if warm else float("nan")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=_bench.at_least(2, _bench.SPREAD), default=5)
    ap.add_argument("overrides", nargs="*", default=[])
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_timing_modes: needs a CUDA device; torch sees none", file=sys.stderr)
        return 2
    from perfsweep.metrics import ratio_interval

    got: dict[str, list[dict]] = {"sync": [], "events": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for mode in ("sync", "events") if i % 2 == 0 else ("events", "sync"):
                got[mode].append(run(mode, Path(tmp), i, args.overrides))
            print(
                f"round {i + 1}: sync {got['sync'][-1]['tokens_per_s']:,.0f} tokens/s, "
                f"events {got['events'][-1]['tokens_per_s']:,.0f} tokens/s",
                flush=True,
            )
    tps = {m: [r["tokens_per_s"] for r in rows] for m, rows in got.items()}
    ratio = ratio_interval(tps["events"], tps["sync"])
    row = got["events"][0]
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d}  device: {row['device_name']}, torch {row['torch_version']}")
    print(f"command: python benchmarks/bench_timing_modes.py --rounds {args.rounds} {' '.join(args.overrides)}")
    for m in ("sync", "events"):
        med = statistics.median(tps[m])
        print(
            f"{m:6s}: median {med:,.0f} tokens/s over {args.rounds} jobs; step medians (ms) "
            f"{[round(r['step_time_ms_median'], 2) for r in got[m]]}; the same jobs' last warmup steps "
            f"(sync-timed in both modes) {[round(r['warmup_tail_ms_median'], 2) for r in got[m]]}"
        )
    print(f"events / sync tokens/s: {ratio.value:.3f} [95% CI {ratio.lo:.3f}-{ratio.hi:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
