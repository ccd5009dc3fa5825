"""A container's or a pod's CPU quota: read from the cgroup files, taken as the job's cores.

The readers run on folders laid out as the kernel lays out each kind of host (v2, v1, a hybrid,
a container that sees only its own group). Where this process may make a real cgroup (root, a
writable cpu controller), a real sweep runs inside one limited to 1 CPU.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfsweep import cgroups, slots
from tests.util import TINY, NoCgroup, cpu_limited_group, perfsweep_in_group
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


def test_the_mount_says_which_group_is_where(tmp_path: Path):
    """mountinfo names each tree's mount point and the group mounted there: a cgroup namespace's
    process in a sibling group reads ``/../b`` against a mount of ``/..``; a pod's container has its
    own group mounted; a group outside the mount falls back to the mount point. (A reviewer's real
    namespace gave ``/../b``, and the quota was missed when the path was read as folders.)"""
    proc, info = tmp_path / "proc-self-cgroup", tmp_path / "mountinfo"
    v1 = tmp_path / "sys fs" / "cpu"  # a space in the mount point: mountinfo writes it \040
    _tree(v1, {"b/cpu.cfs_quota_us": "50000\n", "b/cpu.cfs_period_us": "100000\n", "cpu.cfs_quota_us": "-1\n"})
    mounted = str(v1).replace(" ", "\\040")
    info.write_text(
        f"31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        f"32 31 0:29 /.. {mounted} rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        f"41 31 0:38 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw\n"
    )
    proc.write_text("3:cpu,cpuacct:/../b\n0::/\n")
    assert cgroups.group_dirs("cpu", proc=proc, mountinfo=info) == [v1 / "b", v1]
    assert cgroups.cpu_quota(proc=proc, mountinfo=info) == 0.5
    proc.write_text("3:cpu,cpuacct:/elsewhere/../../x\n")  # outside the mount: its point alone
    assert cgroups.group_dirs("cpu", proc=proc, mountinfo=info) == [v1]
    # v2 in a pod: the container's own group is the mount's root, its path the same
    v2 = tmp_path / "cg2"
    _tree(v2, {"cpu.max": "200000 100000\n"})
    info.write_text(f"50 31 0:40 /kubepods/pod1/ctr {v2} rw - cgroup2 cgroup2 rw\n")
    proc.write_text("0::/kubepods/pod1/ctr\n")
    assert cgroups.group_dirs("cpu", proc=proc, mountinfo=info) == [v2]
    assert cgroups.cpu_quota(proc=proc, mountinfo=info) == 2.0


def test_a_group_name_that_is_not_utf8_is_read(tmp_path: Path):
    """A group named with a byte that is not UTF-8 stopped every sweep with UnicodeDecodeError."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    name = os.fsdecode(b"q\xff")
    _tree(root, {f"cpu/{name}/cpu.cfs_quota_us": "150000\n", f"cpu/{name}/cpu.cfs_period_us": "100000\n"})
    proc.write_bytes(b"3:cpu:/q\xff\n")
    assert cgroups.cpu_quota(root, proc) == 1.5


def test_nothing_to_read_is_no_limit(tmp_path: Path):
    assert cgroups.cpu_quota(tmp_path, tmp_path / "missing") is None
    (tmp_path / "proc").write_text("0::/a\n")
    assert cgroups.cpu_quota(tmp_path / "no-tree", tmp_path / "proc") is None
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert cgroups.cpu_quota(tmp_path, tmp_path / "proc") is None


@pytest.fixture
def one_cpu_group() -> Iterator[Path]:
    """A real cgroup limited to 1 CPU (tests.util.cpu_limited_group); skips where none can be made."""
    try:
        with cpu_limited_group(1.0) as group:
            yield group
    except NoCgroup as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
def test_a_sweep_in_a_pod_limited_to_one_cpu_runs_its_jobs_on_one(tmp_path: Path, one_cpu_group: Path):
    """In a cgroup limited to 1 CPU on this machine of 2 or more cores, a job runs one torch thread
    and stores cpus_allotted 1 (it ran torch's default, a thread per core, before), and the sweep
    times the CPU's peak with that one thread; two jobs side by side are refused before any job,
    naming the quota."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 or more cores, so that a quota of 1 CPU is fewer than the cores")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torch's default, as a user's

    def perfsweep(*args: str) -> subprocess.CompletedProcess:
        return perfsweep_in_group(one_cpu_group, list(args), tmp_path, env, timeout=300)

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
    assert "launcher.parallel=2" in line and "may use 1 CPU(s) (cores " in line, line
    assert "limited by its cgroup's CPU quota of 1)" in line, line


def test_the_cpu_peak_is_timed_with_the_jobs_default_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A job whose ``threads`` is null runs its allotted CPUs as threads where they are fewer than
    the cores (slots.default_threads: SLURM's allocation here, a cgroup quota alike); the sweep's
    matmul peak is timed with as many, so the jobs' utilisation has a base. It was timed with
    torch's default, a thread per core, and those jobs got no utilisation."""
    if len(os.sched_getaffinity(0)) < 2 or (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 or more cores, so that 1 allotted CPU is fewer than the cores")
    import torch

    from perfsweep import preflight
    from tests.util import tiny_job

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert slots.default_threads() == 1
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # torch's default on 2 cores (an xdist worker of this suite runs fewer)
    try:
        fields = preflight.cpu_sweep_fields([tiny_job(tmp_path).cfg])
    finally:
        torch.set_num_threads(before)
    assert fields["cpu_matmul_threads"] == 1 and fields["cpu_matmul_fp32_flops"] > 0
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    if cgroups.quota_cores() is None and len(os.sched_getaffinity(0)) == os.cpu_count():
        assert slots.default_threads() is None  # the whole machine: torch's default


def test_bf16_is_called_emulated_only_where_the_cpus_flags_lack_bf16_units():
    """The notice before a CPU sweep read "bf16 is emulated here (no bf16 units)" from a measured
    bf16 rate under half the fp32 one; on a busy machine whose flags list avx512_bf16 it was
    measured at 0.38x and said so. Emulation is read from the flags; the rates only say when."""
    from perfsweep import envinfo, preflight

    x86 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n"
    assert envinfo.cpu_bf16_units(x86) == ["avx512_bf16"]
    assert envinfo.cpu_bf16_units("flags\t\t: fpu avx2\n") == []
    assert envinfo.cpu_bf16_units("Features\t: fp asimd bf16 i8mm\n") == ["bf16"]  # Arm
    assert envinfo.cpu_bf16_units("processor : 0\n") is None  # no list: not known
    slow = {"cpu_matmul_fp32_flops": 184e9, "cpu_matmul_bf16_flops": 71e9}
    rates = "on this CPU bf16 matmuls run at 71 GFLOP/s, 0.39x the fp32 rate (184)"
    busy = preflight.cpu_notice(slow, ["avx512_bf16"])
    assert busy is not None and rates in busy and "emulated" not in busy and "(avx512_bf16)" in busy
    emulated = preflight.cpu_notice(slow, [])
    assert emulated is not None and rates in emulated and "bf16 is emulated here (no bf16 units" in emulated
    assert "bf16 is emulated here (it seems to have no bf16 units)" in (preflight.cpu_notice(slow, None) or "")
    fast = {"cpu_matmul_fp32_flops": 184e9, "cpu_matmul_bf16_flops": 413e9}
    assert preflight.cpu_notice(fast, []) is None and preflight.cpu_notice({}, []) is None
