"""What perfsweep prints and draws from a database a live H100 sweep wrote (2026-11-26; see
tests/fixtures/h100-2026-11-26/README.md): stage GPU times from kernels attributed by launch,
the verdicts, and the README's "On a GPU" table, which must be this version's output.

Every figure is the one measured on the H100; only the reading runs here, on a copy.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from perfsweep import store, summary
from perfsweep.names import DEVICE_TIME_BY_LAUNCH
from perfsweep.report.build import make_report
from tests.util import run_perfsweep

LIVE = Path(__file__).parent / "fixtures" / "h100-2026-11-26" / "results-seed-gpt2.db"
README = Path(__file__).parent.parent / "README.md"


@pytest.fixture
def live_db(tmp_path: Path) -> Path:
    """A copy of the H100 database, upgraded to this perfsweep's schema as a user would
    (``perfsweep upgrade``): the file in fixtures stays as that machine wrote it."""
    db = tmp_path / "results.db"
    shutil.copy(LIVE, db)
    res = run_perfsweep(["upgrade", "--db", str(db)], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    return db


def _summary(db: Path, sweep_id: int, swept: list[str]) -> str:
    engine = store.connect(f"sqlite:///{db}")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            summary._print_summary(engine, sweep_id, False, swept=swept)
    finally:
        engine.dispose()
    return out.getvalue()


def test_the_readme_shows_this_versions_summary_of_the_h100_sweep(live_db: Path) -> None:
    printed = _summary(live_db, 1, ["amp", "ckpt"])
    table = printed.strip().split("\n\n")[0]  # "Sweep 1 (...)", the header and a line per job
    section = README.read_text().split("## On a GPU", 1)[1]
    block = re.search(r"```\n(Sweep 1 .*?)\n```", section, re.S)
    assert block is not None, "README's On a GPU section has no summary block"
    assert block.group(1) == "\n".join(table.splitlines()[:6])
    lines = {line.split()[0]: line for line in table.splitlines()[2:6]}
    # AMP at batch 2: the GPU waits on the host; fp32 keeps it busy
    assert lines["2"].split()[1:3] == ["on", "off"] and " 34% " in lines["2"] and lines["2"].endswith("host")
    assert lines["4"].split()[1:3] == ["off", "off"] and " 98% " in lines["4"] and lines["4"].endswith("gpu")


def _stage_rows(db: Path, uri: str = "") -> list[tuple]:
    con = sqlite3.connect(f"file:{db}{uri}", uri=True)
    try:
        return con.execute(
            "SELECT run_id, stage, device_time_ms, cpu_time_ms, device_time_source FROM stages ORDER BY id"
        ).fetchall()
    finally:
        con.close()


def test_the_h100_stage_times_outlive_the_upgrade_with_backward_counted(live_db: Path) -> None:
    """The stages the live H100 sweep stored (its kernels attributed by launch, so backward's,
    launched from autograd's thread, were counted and outweigh forward's) are the same after
    ``perfsweep upgrade``, row for row. The attribution itself is tested on the H100 traces
    (tests/test_trace.py) and, on a GPU, in a spawned sweep (tests/test_gpu.py): here the rows
    are the H100's, and what runs is the upgrade that must keep them."""
    before = _stage_rows(LIVE, "?immutable=1")  # the fixture as the H100 wrote it, opened without a write
    after = _stage_rows(live_db)
    assert after == before and len(before) > 0
    by_run: dict[int, dict[str, float]] = {}
    for run_id, stage, ms, _, source in after:
        assert source == DEVICE_TIME_BY_LAUNCH
        by_run.setdefault(run_id, {})[stage] = ms
    assert len(by_run) == 7
    for stages in by_run.values():
        assert stages["backward"] > stages["forward"] > 0 and stages["optimizer_step"] > 0


def test_report_of_the_h100_sweeps_draws_the_gpu_charts(live_db: Path, tmp_path: Path) -> None:
    """The user's command, spawned: a report of every sweep in the database, with the GPU chart
    and a breakdown that has a GPU panel; the database is left as it was."""
    before = live_db.read_bytes()
    out = tmp_path / "report"
    res = run_perfsweep(["report", "--db", str(live_db), "--sweep", "1", "--out", str(out)], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "gpu.png").stat().st_size > 0 and (out / "breakdown.png").stat().st_size > 0
    text = (out / "report.md").read_text()
    assert "| 34% | host |" in text and "| 98% | gpu |" in text
    assert live_db.read_bytes() == before
    engine = store.connect(f"sqlite:///{live_db}")
    try:
        rep = make_report(engine, [2])
    finally:
        engine.dispose()
    breakdown = rep.charts["breakdown"]
    assert len(breakdown.figure.axes) >= 2 and "GPU kernel time" in breakdown.figure.axes[1].get_title("left")
    assert rep.charts["gpu"].skipped is None


def test_a_one_config_gpu_sweep_keeps_its_gpu_chart(live_db: Path) -> None:
    """Sweep 3 ran one config (gpt2_small, 16 x 2048): its report skipped gpu.png ("only one
    config: nothing to compare"), and its kernel categories and busy share were nowhere else."""
    engine = store.connect(f"sqlite:///{live_db}")
    try:
        rep = make_report(engine, [3])
        with engine.connect() as conn:
            busy = conn.exec_driver_sql("SELECT gpu_busy_fraction FROM runs WHERE sweep_id = 3").scalar()
            kernels = conn.exec_driver_sql(
                "SELECT sum(ms_per_step) FROM kernels k JOIN runs r ON r.id = k.run_id WHERE r.sweep_id = 3"
            ).scalar()
    finally:
        engine.dispose()
    chart = rep.charts["gpu"]
    assert chart.skipped is None and len(chart.frame) == 1
    _, ax_busy, ax_kernels = chart.figure.axes[:3]
    assert [p.get_width() for p in ax_busy.patches] == pytest.approx([busy * 100])
    assert sum(p.get_width() for p in ax_kernels.patches) == pytest.approx(kernels)
