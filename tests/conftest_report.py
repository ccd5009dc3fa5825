"""Fixtures of the report tests, loaded as a pytest plugin (``pytest_plugins`` in the test modules).

``report_sweeps`` runs two tiny real sweeps once per session into one results.db: a 2x2
amp x ckpt grid and a 2x2 batch x seq_len grid. The end of each sweep already builds its
report (perfsweep.summary calls build_report), so the fixture exercises that path too.
"""

from __future__ import annotations

import os
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


def run_sweep(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "perfsweep", "-m", *args, *TINY_STEPS],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if proc.returncode != 0:
        raise AssertionError(f"sweep {args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def report_sweeps(tmp_path_factory: pytest.TempPathFactory) -> ReportSweeps:
    """Two real tiny sweeps (8 jobs, about 40-60 s on 2 cores) shared by all report tests."""
    workdir = tmp_path_factory.mktemp("report-sweeps")
    run_sweep(["amp=true,false", "ckpt=true,false", "batch=4", "seq_len=32"], workdir)
    run_sweep(["batch=2,4", "seq_len=16,32"], workdir)
    db = workdir / "results.db"
    import sqlite3

    with sqlite3.connect(db) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM sweeps ORDER BY id")]
    assert len(ids) == 2, ids
    return ReportSweeps(workdir, db, amp_ckpt=ids[0], batch_seq=ids[1])
