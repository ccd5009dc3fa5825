"""This process's control groups: the limits a container, a pod or a scheduler puts on it, read
from the kernel's own files. One home for finding them: cgroup v2 keeps one tree, v1 a tree per
controller, and either may show a container only its own part.

Torch-free: the sweep reads these before it imports torch, and so may the job server's start.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path, PurePosixPath

ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc/self/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")


def _read(path: Path) -> str | None:
    """A kernel file's text; a group name that is not UTF-8 is kept (surrogateescape), not fatal."""
    with contextlib.suppress(OSError):
        return path.read_text(errors="surrogateescape").strip()
    return None


def _membership(controller: str, proc: Path) -> tuple[str, str] | None:
    """('cpu,cpuacct', path) from the v1 line of ``proc`` that names ``controller``, else ('', path)
    from the v2 line; None where there is neither."""
    v2 = None
    for line in (_read(proc) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if controller in parts[1].split(","):
            return parts[1], parts[2]
        if parts[1] == "" and v2 is None:
            v2 = ("", parts[2])
    return v2


def _unescape(field: str) -> str:
    r"""mountinfo's octal escapes (``\040`` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount(controllers: str, controller: str, mountinfo: Path) -> tuple[Path, str] | None:
    """(mount point, the group path mounted there) of the v1 tree holding ``controller`` (where
    ``controllers`` is not empty) or of the v2 tree; None where mountinfo lists none."""
    for line in (_read(mountinfo) or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if not sep or len(fields) < 5 or len(fs) < 3:
            continue
        v1 = fs[0] == "cgroup" and controller in fs[2].split(",")
        if (v1 and controllers) or (fs[0] == "cgroup2" and not controllers):
            return Path(_unescape(fields[4])), _unescape(fields[3])
    return None


def group_dirs(controller: str, root: Path | None = None, proc: Path = PROC, mountinfo: Path = MOUNTINFO) -> list[Path]:
    """The folders of this process's group for ``controller`` (``cpu``, ``memory``) that exist: its
    own first, then each ancestor's up to the tree's mount point, each of whose limits applies too.

    The v1 tree is taken where a line of ``proc`` names the controller, else the v2 tree
    (``0::/path``): a hybrid host lists both and keeps its controllers in v1. Where the tree is
    mounted, and which group is mounted there, comes from ``mountinfo``: a container's mount shows
    its own group as the mount's root, and in a cgroup namespace the path may climb above the
    namespace's root (``/../other``), as the mount's root then does too. A group outside what is
    mounted leaves the mount point alone. ``root``: a tree laid out at that folder instead (v1's
    controllers under it, as at /sys/fs/cgroup), mounted whole."""
    member = _membership(controller, proc)
    if member is None:
        return []
    controllers, path = member
    mount = None if root is not None else _mount(controllers, controller, mountinfo)
    if mount is None:
        base = root if root is not None else ROOT
        if controllers:  # mounted at cpu,cpuacct, usually linked as cpu too
            base = base / controller if os.path.isdir(base / controller) else base / controllers
        mount = (base, "/")
    point, mounted = mount
    try:
        rel = PurePosixPath(path).relative_to(PurePosixPath(mounted))
    except ValueError:  # the group is outside what is mounted here
        rel = PurePosixPath()
    if ".." in rel.parts:
        rel = PurePosixPath()
    return [point / p for p in (rel, *rel.parents) if os.path.isdir(point / p)]


def cpu_quota(root: Path | None = None, proc: Path = PROC, mountinfo: Path = MOUNTINFO) -> float | None:
    """How many CPUs' worth of time per period this process may use (``docker --cpus``, a pod's CPU
    limit): the least over its group and the ancestors (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``
    over ``cpu.cfs_period_us``); None where nothing limits it, or nothing can be read.

    The kernel enforces it by stopping the group's threads for the rest of a period once they have
    used it. torch's default thread count is the cores it sees, not this: in a pod limited to 2
    CPUs on a 16-core host a job would run 16 threads, stopped for most of each period
    (benchmarks/bench_cpu_quota.py measures what that costs)."""
    limits = []
    for folder in group_dirs("cpu", root, proc, mountinfo):
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


def quota_cores(root: Path | None = None, proc: Path = PROC, mountinfo: Path = MOUNTINFO) -> int | None:
    """:func:`cpu_quota` as the threads that fit in it: whole CPUs, at least one (1.5 CPUs run one
    thread unthrottled; a second would be stopped for part of each period). None where unlimited."""
    quota = cpu_quota(root, proc, mountinfo)
    return None if quota is None else max(1, int(quota))
