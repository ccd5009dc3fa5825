"""perfsweep on SLURM, for real: a sweep sent through Hydra's submitit launcher to a throwaway
single-node cluster (tests/slurm.py: munged, slurmctld, slurmd) writes its rows into the test
PostgreSQL server (tests/pg.py), one job is cancelled with scancel while it trains, and a SQLite
file on a network filesystem is refused before anything is submitted.

Skipped, saying why, where the SLURM or PostgreSQL binaries are missing or the tests are not root.
"""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from perfsweep import preflight
from perfsweep.config import ConfigError
from perfsweep.names import SCHEDULER_TIME_MARGIN_S
from tests.pg import new_database
from tests.util import TINY

pytest_plugins = ["tests.slurm", "tests.pg"]

LONG = "steps.measure=100000000"  # the grid point that is cancelled while it trains


def _rows(url: str, sql: str) -> list[dict]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(text(sql))]
    finally:
        engine.dispose()


@pytest.mark.slow
def test_slurm_sweep_into_postgres_with_a_job_cancelled(slurm_cluster, pg_url, tmp_path: Path):
    url = new_database(pg_url).replace("://postgres@", "://postgres:s3cret@")  # the server trusts local users
    tiny = [o for o in TINY if not o.startswith(("steps.measure", "report="))]
    args = ["-m", "hydra/launcher=submitit_slurm", "hydra.launcher.cpus_per_task=1", f"db.url={url}"]
    args += ["device=cpu", "timeout_s=60", "report=true", f"steps.measure=3,4,{LONG.split('=')[1]}", *tiny]
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfsweep", *args],
        cwd=tmp_path,
        # without tests/conftest.py's OMP_NUM_THREADS (1 for 2 workers on 2 cores): the job's one
        # thread must come from SLURM's one CPU
        env={k: v for k, v in slurm_cluster.client_env(PYTHONUNBUFFERED="1").items() if k != "OMP_NUM_THREADS"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        long_job = None
        while time.monotonic() < deadline and long_job is None:  # the long job trains: cancel it as a user would
            try:
                running = _rows(url, "SELECT slurm_job_id, overrides FROM runs WHERE status = 'running'")
            except Exception:  # noqa: BLE001 - tables not created yet
                running = []
            long_job = next((r["slurm_job_id"] for r in running if LONG in r["overrides"]), None)
            time.sleep(0.5)
        assert long_job, f"the long job never ran: {slurm_cluster.squeue()}"
        time.sleep(3)
        limit = slurm_cluster.job(long_job)  # scontrol takes ARRAYID_TASK
        slurm_cluster.scancel(long_job)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "1 of 3 jobs did not finish ok (1 interrupted)" in err, err[-3000:]

    runs = _rows(url, "SELECT * FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == ["ok", "ok", "interrupted"], [(r["status"], r["error"]) for r in runs]
    cancelled = runs[2]
    assert cancelled["slurm_job_id"] == long_job and "SIGTERM" in cancelled["error"], cancelled["error"]
    array = long_job.split("_")[0]
    for r in runs[:2]:
        assert r["slurm_job_id"].startswith(f"{array}_")  # one SLURM array for the sweep, a task per job
        assert r["cpus_allotted"] == 1 and r["torch_threads"] == 1  # SLURM's one CPU, not the node's
        assert r["tokens_per_s"] > 0 and r["hostname"] == slurm_cluster.node
    (sweep,) = _rows(url, "SELECT * FROM sweeps")
    # the user's command, not submitit's entry point; the password hidden
    assert sweep["command"] == shlex.join(["perfsweep", *(a.replace("s3cret", "***") for a in args)])
    # submitit's launcher logged each job's overrides in clear; its pickles must hold the password: said
    assert "s3cret" not in out + err and "db.url's password goes into submitit's job files under " in err, err
    assert sweep["hydra_launcher"] == "SlurmLauncher" and sweep["status"] == "done"
    # SLURM's time limit derived from timeout_s: perfsweep's own timeout ends a slow job first
    assert limit.get("TimeLimit") == f"00:{math.ceil((2 * 60 + SCHEDULER_TIME_MARGIN_S) / 60):02d}:00", limit
    # the summary and the report came from the database the jobs wrote
    assert "(3 runs, 2 ok)" in out and "Report:" in out, out[-2000:]
    report = Path(out.split("Report:")[1].split()[0])
    assert report.is_file() and (report.parent / "throughput.png").is_file()


def test_the_launchers_log_each_jobs_overrides_with_the_password_hidden(caplog: pytest.LogCaptureFixture):
    """Hydra's joblib and submitit launchers log "#0 : <overrides>" as typed, through their own
    loggers: perfsweep filters those, as it hides the password in its own lines."""
    import logging

    # the [slurm] and [joblib] extras ([test] has both): the GPU image of 2026-11-28 lacked joblib's
    joblib_core = pytest.importorskip(
        "hydra_plugins.hydra_joblib_launcher._core", reason="hydra-joblib-launcher not installed"
    )
    submitit_launcher = pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher", reason="hydra-submitit-launcher not installed"
    )

    import perfsweep.__main__  # noqa: F401 - the command's module adds the filters

    for log in (joblib_core.log, submitit_launcher.log):
        with caplog.at_level(logging.INFO, logger=log.name):
            log.info("\t#%d : %s", 0, "amp=true db.url=postgresql://me:s3cret@h/db")
    assert [r.getMessage() for r in caplog.records] == ["\t#0 : amp=true db.url=postgresql://me:***@h/db"] * 2


def test_sqlite_on_a_network_filesystem_is_refused_for_slurm(tmp_path: Path):
    """Read from a mount table in /proc/mounts' format: this machine has no NFS mount to test on."""
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "overlay / overlay rw,relatime 0 0\n"
        "fileserver:/export/home /home/lab\\040share nfs4 rw,vers=4.2 0 0\n"
        "lustre@o2ib:/scratch /scratch lustre rw 0 0\n"
    )
    assert preflight.filesystem_type("/home/lab share/me/results.db", mounts) == "nfs4"
    assert preflight.filesystem_type("/scratch", mounts) == "lustre"
    assert preflight.filesystem_type("/home/labX", mounts) == "overlay"  # a prefix of a name is not a mount
    with pytest.raises(ConfigError, match=r"db.url='sqlite:////home/lab share/me/results.db': .* on nfs4"):
        preflight.check_db_for_hosts("sqlite:////home/lab share/me/results.db", "SlurmLauncher", mounts)
    with pytest.raises(ConfigError, match=r"use PostgreSQL"):
        preflight.check_db_for_hosts("sqlite:////scratch/p/results.db", "SlurmLauncher", mounts)
    # one host, or a server database: fine
    preflight.check_db_for_hosts("sqlite:////home/lab share/me/results.db", "BasicLauncher", mounts)
    preflight.check_db_for_hosts("postgresql+psycopg2://me@db/perfsweep", "SlurmLauncher", mounts)
    preflight.check_db_for_hosts("sqlite:////tmp/results.db", "SlurmLauncher", mounts)


@pytest.mark.slow
def test_login_node_without_a_gpu_sends_a_cuda_sweep_to_the_nodes(slurm_cluster, pg_url, tmp_path: Path):
    """The submitting host's devices are not the jobs': device=cuda is not refused here (it would be
    for a local sweep on this GPU-less machine); the job on the node finds out, and its row says so."""
    if torch_sees_cuda():
        pytest.skip("this machine has a GPU: the job would run")
    url = new_database(pg_url)
    res = subprocess.run(
        [sys.executable, "-m", "perfsweep", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.cpus_per_task=1"]
        + [f"db.url={url}", "device=cuda", *TINY],
        cwd=tmp_path,
        env={**slurm_cluster.client_env(), "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 1, res.stderr[-3000:]
    (run,) = _rows(url, "SELECT status, error, slurm_job_id FROM runs")
    assert run["status"] == "failed" and "torch sees no CUDA device" in run["error"] and run["slurm_job_id"]


def torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
