"""Fixtures of the report tests, loaded as a pytest plugin (``pytest_plugins`` in the test modules).

``report_sweeps`` runs two tiny real sweeps once per session into one results.db: a 2x2
amp x ckpt grid and a 2x2 batch x seq_len grid. The end of each sweep already builds its
report (perfsweep.summary calls build_report), so the fixture exercises that path too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

TINY_STEPS = [
    "device=cpu",  # the report tests assert the CPU chart set and memory mode
    "model=tiny",
    "data=synthetic",
    "steps.warmup=1",
    "steps.stable_window=0",  # exactly one warmup step (the rule is tested in tests/test_timing.py)
    "steps.measure=3",
    "profile.wait=0",
    "profile.warmup=0",
    "profile.active=1",
]


@dataclass(frozen=True)
class ReportSweeps:
    workdir: Path
    db: Path
    amp_ckpt: int  # sweep id of the 2x2 amp x ckpt grid (batch=4, seq_len=32)
    batch_seq: int  # sweep id of the 2x2 batch x seq_len grid

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"


FIRST_SWEEP_STDERR = "amp_ckpt.stderr"
"""The first sweep's stderr, kept beside results.db (tests/test_report.py reads it)."""
FRESH_MATPLOTLIB = "matplotlib-config"
"""The first sweep's matplotlib folder, empty as on a machine that never drew a chart."""


def run_sweep(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "perfsweep", "-m", *args, *TINY_STEPS],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    if proc.returncode != 0:
        raise AssertionError(f"sweep {args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _build(workdir: Path) -> tuple[int, int]:
    first = run_sweep(
        ["amp=true,false", "ckpt=true,false", "batch=4", "seq_len=32"],
        workdir,
        env={"MPLCONFIGDIR": str(workdir / FRESH_MATPLOTLIB)},  # its report is that machine's first chart
    )
    (workdir / FIRST_SWEEP_STDERR).write_text(first.stderr)
    run_sweep(["batch=2,4", "seq_len=16,32"], workdir)
    import sqlite3

    with sqlite3.connect(workdir / "results.db") as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM sweeps ORDER BY id")]
    assert len(ids) == 2, ids
    return ids[0], ids[1]


@pytest.fixture(scope="session")
def report_sweeps(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> ReportSweeps:
    """Two real tiny sweeps (8 jobs, about 30 s on 2 cores) shared by all report tests.

    Under pytest-xdist the report and notebook tests may run in different workers: the first one
    to ask builds the sweeps in the run's shared temp folder while the other waits on a lock,
    and both read the same results.db (nothing writes to it after). Built twice, they cost the
    suite 30 s of its 2 cores."""
    if worker_id == "master":  # no xdist: a session is the whole run
        workdir = tmp_path_factory.mktemp("report-sweeps")
        return ReportSweeps(workdir, workdir / "results.db", *_build(workdir))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # the folder of this run's workers
    workdir, built = shared / "report-sweeps", shared / "report-sweeps.json"
    with FileLock(str(shared / "report-sweeps.lock")):
        if not built.exists():
            shutil.rmtree(workdir, ignore_errors=True)  # what a worker that failed to build left
            workdir.mkdir()
            built.write_text(json.dumps(_build(workdir)))
        amp_ckpt, batch_seq = json.loads(built.read_text())
    return ReportSweeps(workdir, workdir / "results.db", amp_ckpt, batch_seq)
