"""A container's or a pod's CPU quota: read from the cgroup files, taken as the job's cores.

The readers run on folders laid out as the kernel lays out each kind of host (v2, v1, a hybrid,
a container that sees only its own group). Where this process may make a real cgroup (root, a
writable cpu controller), a real sweep runs inside one limited to 1 CPU.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfsweep import cgroups, slots
from tests.util import TINY
from tests.util import sqlite_rows as rows


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_v2_the_least_quota_over_the_group_and_its_ancestors(tmp_path: Path):
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    _tree(
        root,
        {
            "cpu.stat": "",  # the root group has no cpu.max
            "kubepods/cpu.max": "max 100000\n",
            "kubepods/pod1/cpu.max": "150000 100000\n",  # the pod: 1.5 CPUs
            "kubepods/pod1/ctr/cpu.max": "400000 100000\n",  # the container asks for more than its pod has
        },
    )
    assert cgroups.cpu_quota(root, proc) == 1.5
    assert cgroups.quota_cores(root, proc) == 1  # a second thread would be stopped for part of each period
    (root / "kubepods/pod1/cpu.max").write_text("max 100000\n")
    assert cgroups.cpu_quota(root, proc) == 4.0
    (root / "kubepods/pod1/ctr/cpu.max").write_text("max 100000\n")
    assert cgroups.cpu_quota(root, proc) is None and cgroups.quota_cores(root, proc) is None


def test_v1_and_a_container_that_sees_only_its_own_group(tmp_path: Path):
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    proc.write_text("5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n")
    # the container's view: its own group is the cpu tree's root (no /docker/abc under it)
    _tree(root, {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroups.group_dirs("cpu", root, proc) == [root / "cpu"]
    assert cgroups.cpu_quota(root, proc) == 0.5 and cgroups.quota_cores(root, proc) == 1
    # the host's view: the group's folder under the tree, unlimited (-1), its parent limited
    _tree(
        root,
        {
            "cpu/docker/abc/cpu.cfs_quota_us": "-1\n",
            "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
            "cpu/docker/cpu.cfs_quota_us": "300000\n",
            "cpu/docker/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cgroups.group_dirs("cpu", root, proc) == [root / "cpu/docker/abc", root / "cpu/docker", root / "cpu"]
    assert cgroups.cpu_quota(root, proc) == 0.5  # the least of 3.0 and the root's 0.5
    (root / "cpu/cpu.cfs_quota_us").write_text("-1\n")
    assert cgroups.cpu_quota(root, proc) == 3.0


def test_a_hybrid_host_reads_the_cpu_controller_from_v1(tmp_path: Path):
    """systemd's hybrid layout lists the v2 tree (``0::``) too, without controllers in it."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    proc.write_text("0::/user.slice\n4:cpu,cpuacct:/user.slice\n")
    _tree(
        root,
        {
            "user.slice/cgroup.procs": "",
            "cpu/user.slice/cpu.cfs_quota_us": "200000\n",
            "cpu/user.slice/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cgroups.cpu_quota(root, proc) == 2.0
    (root / "cpu").rename(root / "cpu,cpuacct")  # mounted under the joint name, with no link
    assert cgroups.cpu_quota(root, proc) == 2.0


def test_nothing_to_read_is_no_limit(tmp_path: Path):
    assert cgroups.cpu_quota(tmp_path, tmp_path / "missing") is None
    (tmp_path / "proc").write_text("0::/a\n")
    assert cgroups.cpu_quota(tmp_path / "no-tree", tmp_path / "proc") is None
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert cgroups.cpu_quota(tmp_path, tmp_path / "proc") is None


@contextlib.contextmanager
def _real_cpu_group(cpus: float) -> Iterator[Path]:
    """A new cgroup limited to ``cpus`` CPUs; yields its cgroup.procs. Skips where none can be
    made (not root, a read-only cgroupfs, no cpu controller)."""
    name = f"perfsweep-test-{uuid.uuid4().hex[:8]}"
    v1 = cgroups.ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / name
        files = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(int(cpus * 100000))}
    elif "cpu" in (cgroups.ROOT / "cgroup.subtree_control").read_text(errors="replace").split():
        group = cgroups.ROOT / name
        files = {"cpu.max": f"{int(cpus * 100000)} 100000"}
    else:
        pytest.skip("no cgroup cpu controller this process can use (neither v1's cpu tree nor v2's)")
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup here ({exc.strerror}): needs root and a writable cgroupfs")
    try:
        for file, value in files.items():
            (group / file).write_text(value)
        yield group / "cgroup.procs"
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()  # its processes have exited


@pytest.mark.slow
def test_a_sweep_in_a_pod_limited_to_one_cpu_runs_its_jobs_on_one(tmp_path: Path):
    """In a cgroup limited to 1 CPU on this machine of 2 or more cores, a job runs one torch thread
    and stores cpus_allotted 1 (it ran torch's default, a thread per core, before), and the sweep
    times the CPU's peak with that one thread; two jobs side by side are refused before any job,
    naming the quota."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 or more cores, so that a quota of 1 CPU is fewer than the cores")
    with _real_cpu_group(1.0) as procs:
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torch's default, as a user's

        def perfsweep(*args: str) -> subprocess.CompletedProcess:
            script = f'echo $$ > "{procs}" && exec "{sys.executable}" -m perfsweep "$@"'
            return subprocess.run(
                ["sh", "-c", script, "sh", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
            )

        tiny = [*TINY, "device=cpu", "profile.enabled=false"]
        res = perfsweep("-m", "amp=false", *tiny)
        assert res.returncode == 0, res.stderr[-3000:]
        (run,) = rows(tmp_path / "results.db", "SELECT cpus_allotted, torch_threads, cpu_affinity FROM runs")
        assert (run["cpus_allotted"], run["torch_threads"]) == (1, 1), run
        assert run["cpu_affinity"] == slots.cpu_list(os.sched_getaffinity(0))  # the quota limits time, not cores
        # the CPU's matmul peak was timed with the jobs' one thread, so their utilisation has a base
        (sweep,) = rows(tmp_path / "results.db", "SELECT cpu_matmul_threads, cpu_matmul_fp32_flops FROM sweeps")
        assert sweep["cpu_matmul_threads"] == 1 and sweep["cpu_matmul_fp32_flops"] > 0
        refused = perfsweep("-m", "amp=true,false", "launcher.parallel=2", *tiny)
        assert refused.returncode == 2, refused.stderr[-3000:]
        (line,) = refused.stderr.strip().splitlines()
        assert "launcher.parallel=2" in line and "its cgroup's CPU quota: 1 CPU)" in line, line
