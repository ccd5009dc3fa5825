"""The throwaway SLURM cluster of tests/slurm.py works: a batch job (and an srun step in it) runs and
writes its output, a cancelled job is CANCELLED within seconds, and stopping a cluster leaves no
process behind.

Real daemons (munged, slurmctld, slurmd) and real client commands; skipped without them or root.
"""

from __future__ import annotations

import os
import time

import pytest

pytest_plugins = ["tests.slurm"]


@pytest.mark.slow
def test_batch_job_runs_and_writes_its_output(slurm_cluster, tmp_path):
    out = tmp_path / "job.out"
    script = "hostname; echo cpus=$SLURM_CPUS_PER_TASK; echo job=$SLURM_JOB_ID; nproc; srun hostname"  # srun: a step
    job_id = slurm_cluster.sbatch("--cpus-per-task=1", f"--output={out}", "--wrap", script, cwd=tmp_path)
    info = slurm_cluster.wait_job(job_id, timeout=60)
    assert info["JobState"] == "COMPLETED", info
    assert info["ExitCode"] == "0:0"
    lines = out.read_text().split()
    assert lines[0] == slurm_cluster.node
    assert lines[1] == "cpus=1"
    assert lines[2] == f"job={job_id}"
    assert int(lines[3]) >= 1
    assert lines[4] == slurm_cluster.node  # a job step (as submitit launches its task) ran too


@pytest.mark.slow
def test_scancel_leaves_the_job_cancelled_quickly(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch("--cpus-per-task=1", f"--output={tmp_path / 'sleep.out'}", "--wrap", "sleep 600")
    slurm_cluster.wait_job(job_id, states=["RUNNING"], timeout=30)
    started = time.monotonic()
    slurm_cluster.scancel(str(job_id))
    info = slurm_cluster.wait_job(job_id, timeout=30)
    assert info["JobState"] == "CANCELLED", info
    assert time.monotonic() - started < 20
    assert str(job_id) not in slurm_cluster.squeue().split()


@pytest.mark.slow
def test_stopping_a_cluster_leaves_no_process_and_no_directory(tmp_path):
    """Its own cluster (beside the session's, if that is up), stopped with a job still running."""
    from tests.slurm import _procs_with_env, skip_reason, slurm_cluster  # imported once loaded as a plugin

    if skip_reason():
        pytest.skip(skip_reason())
    with slurm_cluster() as cluster:
        conf, root = str(cluster.conf_path), cluster.tmpdir
        job_id = cluster.sbatch(f"--output={tmp_path / 'sleep.out'}", "--wrap", "sleep 600")
        cluster.wait_job(job_id, states=["RUNNING"], timeout=30)
        assert _procs_with_env("SLURM_CONF", conf)  # slurmctld, slurmd, slurmstepd, sleep
    assert not root.exists()
    assert _procs_with_env("SLURM_CONF", conf) == []
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_mentions(int(p), str(root))]


def _cmdline_mentions(pid: int, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False
