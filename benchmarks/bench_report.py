"""How long does a report over a big sweep take? Target: 10,000 runs in under 10 s.

Synthesises a sweep of N runs on a CUDA-like device (every grid axis varies, a share of the
configs run out of memory, a few fail or time out) plus their child rows at realistic counts
(10 steps and 5 stages per finished run) into a temporary SQLite file through
``perfsweep.store``, then times :func:`perfsweep.report.build.build_report` on it.

    python benchmarks/bench_report.py                 # 10,000 runs, best of 3
    python benchmarks/bench_report.py --runs 2000 --repeat 1 --keep /tmp/bench   # keep DB + report

The numbers are a model (throughput from tokens per step, AMP/ckpt/compile factors and
log-normal noise), not measurements: they exist to give the report realistic shapes.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import _bench  # benchmarks/_bench.py, beside this script
from sqlalchemy import insert

from perfsweep import store
from perfsweep.metrics import bottleneck_verdict
from perfsweep.names import STAGES
from perfsweep.report import charts
from perfsweep.report.build import CHARTS, build_report, make_report
from perfsweep.results import load_sweep_runs

GIB = 2**30
DEVICE_BYTES = 80 * GIB
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
SEQ_LENS = [128, 256, 512, 1024, 2048]
WORKERS = [0, 2, 4, 8, 16]
MODELS = {  # name: (n_params, d_model, n_layers)
    "small": (30e6, 512, 6),
    "medium": (125e6, 768, 12),
    "large": (350e6, 1024, 24),
    "xl": (760e6, 1536, 24),
    "xxl": (1.3e9, 2048, 24),
}


def grid() -> list[dict[str, Any]]:
    points = itertools.product([True, False], [True, False], [True, False], BATCHES, SEQ_LENS, WORKERS, list(MODELS))
    keys = ("amp", "ckpt", "compile", "batch", "seq_len", "workers", "model_name")
    return [dict(zip(keys, p, strict=True)) for p in points]


def synth_run(
    rid: int, sweep_id: int, job: int, cfg: dict[str, Any], rng: random.Random, t0: datetime
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    n_params, d_model, n_layers = MODELS[cfg["model_name"]]
    tokens = cfg["batch"] * cfg["seq_len"]
    flops_per_token = 6 * n_params + 12 * n_layers * d_model * cfg["seq_len"]
    speed = 400e12 * (1.9 if cfg["amp"] else 1.0) * (0.75 if cfg["ckpt"] else 1.0) * (1.2 if cfg["compile"] else 1.0)
    util = tokens / (tokens + 4096)  # small steps cannot fill the GPU
    step_ms = 1000 * tokens * flops_per_token / (speed * util) + 3.0 + (0.0 if cfg["workers"] else 1.5)
    act = tokens * d_model * n_layers * 34 * (0.5 if cfg["amp"] else 1.0) * (0.15 if cfg["ckpt"] else 1.0)
    allocated = int(n_params * 16 + act)
    started = t0 + timedelta(seconds=20 * job)
    row: dict[str, Any] = {
        "id": rid,
        "sweep_id": sweep_id,
        "job_num": job,
        "overrides": " ".join(f"{k}={v}" for k, v in cfg.items()),
        **cfg,
        "amp_dtype": "bf16",
        "data_name": "stdlib",
        "config_json": {},
        "config_hash": f"{rid:064x}",
        "started_at": started,
        "finished_at": started + timedelta(seconds=18),
        "duration_s": 18.0,
        "hostname": "bench",
        "device_type": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "cpu_count": 16,
        "torch_threads": 8,
        "torch_version": "2.5.1",
        "cuda_version": "12.4",
        "python_version": "3.11.9",
        "git_commit": "bench",
        "warmup_steps": 2,
        "measure_steps": 8,
    }
    r = rng.random()
    if allocated > DEVICE_BYTES:
        row.update(
            status="oom",
            error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        )
        return row, [], [], []
    if r < 0.005:
        row.update(status="failed", error="RuntimeError: synthetic failure")
        return row, [], [], []
    if r < 0.007:
        row.update(status="timeout", error="job exceeded timeout_s=900 and was killed")
        return row, [], [], []
    times = sorted(step_ms * math.exp(rng.gauss(0, 0.04)) for _ in range(8))
    p10, p90 = times[0] + 0.7 * (times[1] - times[0]), times[6] + 0.3 * (times[7] - times[6])
    total_s = sum(times) / 1000
    row.update(
        status="ok",
        first_step_ms=step_ms * (30 if cfg["compile"] else 3),
        step_time_ms_median=statistics.median(times),
        step_time_ms_p10=p10,
        step_time_ms_p90=p90,
        step_time_ms_mean=statistics.fmean(times),
        step_time_ms_std=statistics.stdev(times),
        data_wait_ms_median=0.2,
        data_wait_fraction=0.2 / step_ms,
        tokens_per_s=tokens * 8 / total_s,
        samples_per_s=cfg["batch"] * 8 / total_s,
        final_loss=7.0 - rng.random(),
        flops_per_token=flops_per_token,
        n_params=int(n_params),
        peak_mem_bytes=allocated,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=int(allocated * (1.05 + 0.1 * rng.random())),
        rss_growth_bytes=200 * 2**20,
        # small steps leave the GPU waiting for launches: busy share grows with the step's work
        **bottleneck_verdict(step_ms * (0.15 + 0.8 * util), statistics.median(times), 0.2 / step_ms).row(),
    )
    steps = [
        {
            "run_id": rid,
            "step": i,
            "phase": "warmup" if i < 2 else "measure",
            "step_time_ms": (times[i - 2] if i >= 2 else step_ms * 3),
            "data_wait_ms": 0.2,
            "loss": 9.0 - 0.2 * i + rng.gauss(0, 0.02),
        }
        for i in range(10)
    ]
    shares = {
        "data_to_device": 0.02,
        "forward": 0.3,
        "backward": 0.6,
        "optimizer_step": 0.07,
        "zero_grad": 0.01,
    }
    stages = [
        {
            "run_id": rid,
            "stage": s,
            "cpu_time_ms": step_ms * shares[s] * 0.3,
            "device_time_ms": step_ms * shares[s],
            "device_time_source": "cuda_kernels_by_launch",
            "calls": 2,
        }
        for s in STAGES
    ]
    kernel_shares = {
        "gemm": 0.55,
        "attention": 0.15,
        "elementwise/norm": 0.15,
        "reduction": 0.07,
        "optimizer": 0.06,
        "memcpy/memset": 0.02,
    }
    busy = row["gpu_busy_ms"]
    kernels = [
        {"run_id": rid, "category": c, "ms_per_step": busy * f, "kernels_per_step": 100.0 * f * n_layers}
        for c, f in kernel_shares.items()
    ]
    return row, steps, stages, kernels


def synthesize(url: str, n_runs: int, seed: int = 0) -> tuple[Any, int]:
    """Write one sweep of ``n_runs`` runs (+ steps, stages) to ``url``; returns (engine, sweep id)."""
    engine = store.connect(url)
    sweep_id = store.get_or_create_sweep(
        engine,
        f"/nonexistent/bench-{n_runs}",
        "bench",
        n_jobs=n_runs,
        command=f"bench_report.py --runs {n_runs}",
        hostname="bench",
    )
    rng = random.Random(seed)
    points = grid()
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    runs, steps, stages, kernels = [], [], [], []
    for job in range(n_runs):
        row, st, sg, kn = synth_run(job + 1, sweep_id, job, points[job % len(points)], rng, t0)
        runs.append(row)
        steps += st
        stages += sg
        kernels += kn
    keys = set().union(*runs)
    runs = [{k: r.get(k) for k in keys} for r in runs]  # executemany wants one column set
    with engine.begin() as conn:
        conn.execute(insert(store.Run.__table__), runs)
        conn.execute(insert(store.Step.__table__), steps)
        conn.execute(insert(store.Stage.__table__), stages)
        conn.execute(insert(store.Kernel.__table__), kernels)
    return engine, sweep_id


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=_bench.at_least(1), default=10_000)
    p.add_argument(
        "--repeat",
        type=_bench.at_least(1),
        default=3,
        help="time build_report this many times; best and median shown",
    )
    p.add_argument("--keep", type=Path, help="write the database and report here instead of a temp folder")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        db = folder / "bench.db"
        db.unlink(missing_ok=True)
        t = time.perf_counter()
        engine, sweep_id = synthesize(f"sqlite:///{db}", args.runs)
        insert_s = time.perf_counter() - t
        with engine.connect() as conn:
            counts = {
                tbl: conn.exec_driver_sql(f"SELECT count(*) FROM {tbl}").scalar() for tbl in ("runs", "steps", "stages")
            }
        on_disk = sum(
            f.stat().st_size for f in (db, db.with_name(db.name + "-wal")) if f.exists()
        )  # WAL not folded in yet
        print(
            f"synthesised {counts['runs']:,} runs, {counts['steps']:,} steps, {counts['stages']:,} stages "
            f"in {insert_s:.1f} s ({on_disk / 2**20:.1f} MiB)"
        )

        out = folder / "report"
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            build_report(engine, [sweep_id], out_dir=out)
            times.append(time.perf_counter() - t)
        print(
            f"build_report over {args.runs:,} runs: best {min(times):.2f} s, median {statistics.median(times):.2f} s "
            f"({args.repeat} runs: {', '.join(f'{x:.2f}' for x in times)})"
        )

        t = time.perf_counter()
        load_sweep_runs(engine, [sweep_id], None)
        parts, load_s = [], time.perf_counter() - t
        report = make_report(engine, [sweep_id])
        for spec in CHARTS.values():  # each chart again: its frame, drawing and PNG
            if report.charts[spec.name].skipped:
                parts.append(f"{spec.name} skipped")
                continue
            t = time.perf_counter()
            charts.save(charts.draw(spec, *spec.frame(report)), out / f"{spec.name}.png")
            parts.append(f"{spec.name} {time.perf_counter() - t:.2f} s")
        print(f"breakdown: loading and shaping {load_s:.2f} s; " + ", ".join(parts))
        engine.dispose()
        if args.keep:
            print(f"kept: {db} and {out / 'report.md'}")
        return 0 if min(times) < 10.0 else 1


if __name__ == "__main__":
    sys.exit(main())
