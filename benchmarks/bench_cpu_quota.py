"""A CPU quota (a container's ``--cpus``, a pod's CPU limit): what running a thread per visible core
costs against a thread per CPU of the quota, as perfsweep now chooses (perfsweep.cgroups).

Makes a cgroup limited to ``--cpus`` CPUs (root and a writable cgroupfs needed; v1 or v2) and runs
each round one sweep in it of two jobs, ``threads`` = the quota's whole CPUs and ``threads`` = every
core this process may use (torch's default, which perfsweep kept before), in alternating order.
Reports each setting's median tokens/s, step-time CV and p90/p10 over the rounds, and the ratios
with 95% bootstrap intervals. The cgroup comes from tests.util, as in the tests (the [test] extra). Usage:

    sudo python benchmarks/bench_cpu_quota.py                   # 1 CPU, 5 rounds, model=small on CPU
    sudo python benchmarks/bench_cpu_quota.py --cpus 2 --rounds 3 model=tiny batch=8
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.util: the cgroup helpers the tests use
import _bench  # benchmarks/_bench.py, beside this script

from tests.util import NoCgroup, cpu_limited_group, perfsweep_in_group  # noqa: E402

DEFAULT = ["model=small", "batch=4", "seq_len=128", "steps.measure=20", "profile.enabled=false", "report=false"]


def sweep(group: Path, work: Path, order: list[int], extra: list[str]) -> list[dict]:
    """The runs of one sweep of ``threads=order`` run inside ``group``."""
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    res = perfsweep_in_group(group, ["-m", f"threads={','.join(map(str, order))}", "device=cpu", *extra], work, env)
    if res.returncode != 0:
        raise SystemExit(f"bench_cpu_quota: the sweep failed: {res.stderr.strip().splitlines()[-1:]}")
    from perfsweep.query import records

    return records(str(work / "results.db"), "SELECT * FROM runs ORDER BY job_num")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", type=float, default=1.0, help="the cgroup's CPU quota")
    ap.add_argument("--rounds", type=_bench.at_least(2, _bench.SPREAD), default=5)
    ap.add_argument("overrides", nargs="*", help=f"sweep overrides (default: {' '.join(DEFAULT)})")
    args = ap.parse_args()
    from perfsweep.metrics import ratio_interval

    extra = args.overrides or DEFAULT
    cores = len(os.sched_getaffinity(0))
    quota = max(1, int(args.cpus))
    if quota >= cores:
        raise SystemExit(f"bench_cpu_quota: --cpus {args.cpus:g}: must leave fewer CPUs than the {cores} cores here")
    runs: dict[int, list[dict]] = {quota: [], cores: []}
    try:
        with cpu_limited_group(args.cpus, "perfsweep-bench") as group, tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                order = [quota, cores] if i % 2 == 0 else [cores, quota]
                for r in sweep(group, Path(tmp) / f"round{i}", order, extra):
                    runs[r["torch_threads"]].append(r)
                print(
                    f"round {i + 1}: "
                    + ", ".join(f"{t} threads {runs[t][-1]['tokens_per_s']:,.0f} tokens/s" for t in order)
                )
    except NoCgroup as exc:
        raise SystemExit(f"bench_cpu_quota: {exc}") from None
    first = runs[quota][0]
    print(
        f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  machine: {first['device_name']} ({platform.node()}), "
        f"{cores} cores, torch {first['torch_version']}; cgroup quota {args.cpus:g} CPU"
    )
    print(
        f"command: python benchmarks/bench_cpu_quota.py --cpus {args.cpus:g} --rounds {args.rounds} {' '.join(extra)}"
    )
    print(f"stored cpus_allotted: {sorted({r['cpus_allotted'] for rs in runs.values() for r in rs})}")
    print(f"{'':22s} {f'{quota} thread(s)':>14s} {f'{cores} threads':>14s}   {cores} / {quota} [95% CI]")
    for key, fmt in (("tokens_per_s", ",.0f"), ("step_time_ms_median", ".1f"), ("step_time_cv", ".3f")):
        a, b = [r[key] for r in runs[cores]], [r[key] for r in runs[quota]]
        ci = ratio_interval(a, b)
        print(f"{key:22s} {np.median(b):>14{fmt}} {np.median(a):>14{fmt}}   {ci.value:.3f} [{ci.lo:.3f}-{ci.hi:.3f}]")
    spread = {t: [r["step_time_ms_p90"] / r["step_time_ms_p10"] for r in rs] for t, rs in runs.items()}
    ci = ratio_interval(spread[cores], spread[quota])
    print(
        f"{'step p90 / p10':22s} {np.median(spread[quota]):>14.3f} {np.median(spread[cores]):>14.3f}   "
        f"{ci.value:.3f} [{ci.lo:.3f}-{ci.hi:.3f}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
