"""This process's control groups: the limits a container, a pod or a scheduler puts on it, read
from the kernel's own files. One home for finding them: cgroup v2 keeps one tree, v1 a tree per
controller, and either may show a container only its own part.

Torch-free: the sweep reads these before it imports torch, and so may the job server's start.
"""

from __future__ import annotations

import contextlib
from pathlib import Path, PurePosixPath

ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc/self/cgroup")


def group_dirs(controller: str, root: Path = ROOT, proc: Path = PROC) -> list[Path]:
    """The folders of this process's group for ``controller`` (``cpu``, ``memory``) that exist: its
    own first, then each ancestor's up to the tree's root, each of whose limits applies too.

    The v1 tree is taken where a line of ``proc`` names the controller (mounted at
    ``root/controller`` or at ``root/cpu,cpuacct`` as the line lists them); else the v2 tree
    (``0::/path``, at ``root``). A hybrid host lists both
    and keeps its controllers in v1. In a container the group's path is often outside its view:
    then the root folder is the group."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return []
    base, path = None, ""
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, where = parts
        if controller in controllers.split(","):  # mounted as root/cpu,cpuacct, usually linked as root/cpu too
            base = root / controller if (root / controller).is_dir() else root / controllers
            path = where
            break
        if controllers == "" and base is None:
            base, path = root, where
    if base is None:
        return []
    rel = PurePosixPath(path.lstrip("/"))
    return [base / p for p in (rel, *rel.parents) if (base / p).is_dir()]


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return path.read_text().strip()
    return None


def cpu_quota(root: Path = ROOT, proc: Path = PROC) -> float | None:
    """How many CPUs' worth of time per period this process may use (``docker --cpus``, a pod's CPU
    limit): the least over its group and the ancestors (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``
    over ``cpu.cfs_period_us``); None where nothing limits it, or nothing can be read.

    The kernel enforces it by stopping the group's threads for the rest of a period once they have
    used it. torch's default thread count is the cores it sees, not this: in a pod limited to 2
    CPUs on a 16-core host a job would run 16 threads, stopped for most of each period
    (benchmarks/bench_cpu_quota.py measures what that costs)."""
    limits = []
    for folder in group_dirs("cpu", root, proc):
        with contextlib.suppress(ValueError, IndexError, ZeroDivisionError):
            v2 = _read(folder / "cpu.max")  # "max 100000" or "200000 100000"
            if v2 is not None:
                quota, period = v2.split()[:2]
                if quota != "max":
                    limits.append(int(quota) / int(period))
                continue
            quota_us, period_us = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            if quota_us is not None and period_us is not None and int(quota_us) > 0:  # -1: no limit
                limits.append(int(quota_us) / int(period_us))
    return min(limits) if limits else None


def quota_cores(root: Path = ROOT, proc: Path = PROC) -> int | None:
    """:func:`cpu_quota` as the threads that fit in it: whole CPUs, at least one (1.5 CPUs run one
    thread unthrottled; a second would be stopped for part of each period). None where unlimited."""
    quota = cpu_quota(root, proc)
    return None if quota is None else max(1, int(quota))
