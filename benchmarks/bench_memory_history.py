"""What does recording CUDA allocator history cost per training step? (needs a CUDA device)

``profile.memory_snapshot=true`` records a Python stack on every allocation. perfsweep pauses
recording over the measured steps; this script measures what it would have cost: the same
trainer, blocks of steps with recording off and on (``context="alloc"``, as perfsweep records),
alternating so drift hits both alike, in one process. Usage:

    python benchmarks/bench_memory_history.py [--rounds 6] [--steps 20] [perfsweep overrides...]

Default model: minigpt_seed (fp16 AMP), checkpointing off; add ``ckpt=true`` to compare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script
import torch
from hydra import compose, initialize_config_module

from perfsweep import corpus
from perfsweep.__main__ import register
from perfsweep.config import to_run_config
from perfsweep.memory import MemorySnapshot
from perfsweep.runner import build, resolve_device


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=_bench.at_least(1), default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("overrides", nargs="*", default=[])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_memory_history: needs a CUDA device; torch sees none", file=sys.stderr)
        return 2
    register()  # the schema, and the sweeper config.yaml names
    base = [
        "model=minigpt_seed",
        "device=cuda",
        "amp=true",
        "amp_dtype=fp16",
        "batch=2",
        "seq_len=1024",
        "data.vocab_limit=10000",
    ]
    with initialize_config_module(version_base="1.3", config_module="perfsweep.conf"):
        cfg = to_run_config(compose(config_name="config", overrides=[*base, *args.overrides]))
    device = resolve_device(cfg.device)
    trainer, _ = build(cfg, device, corpus.prepare(cfg.data))
    snap = MemorySnapshot(Path("."), "bench", cfg.profile.memory_snapshot_max_entries)
    for _ in range(10):
        trainer.step()
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            if mode == "on":
                snap.resume()
            times[mode] += [trainer.step()[0] for _ in range(args.steps)]
            if mode == "on":
                snap.pause()
    med = {m: statistics.median(v) for m, v in times.items()}
    print(
        f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {torch.cuda.get_device_name(device)}, "
        f"torch {torch.__version__}, overrides: {' '.join(args.overrides) or '(none)'}"
    )
    for m, v in times.items():
        q = statistics.quantiles(v, n=10)
        print(f"history {m:>3}: step ms median {med[m]:.2f} (p10 {q[0]:.2f}, p90 {q[-1]:.2f}), {len(v)} steps")
    print(f"cost of recording: {med['on'] / med['off']:.3f}x the step time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
