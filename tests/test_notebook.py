"""notebooks/explore_results.ipynb runs top to bottom against a database from a real sweep."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from perfsweep import metrics
from perfsweep.names import STAGES

if TYPE_CHECKING:
    from tests.conftest_report import ReportSweeps

pytest_plugins = ["tests.conftest_report"]

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore_results.ipynb"


def _kernel_or_skip() -> str:
    pytest.importorskip("nbformat", reason="nbformat not installed (pip install perfsweep[notebook])")
    pytest.importorskip("nbclient", reason="nbclient not installed (pip install perfsweep[notebook])")
    pytest.importorskip("ipykernel", reason="ipykernel not installed (pip install perfsweep[notebook])")
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip("no 'python3' Jupyter kernel is installed (python -m ipykernel install --user)")
    return "python3"


@pytest.mark.slow
def test_notebook_runs_against_a_real_sweep(
    report_sweeps: ReportSweeps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = _kernel_or_skip()
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PERFSWEEP_DB", str(report_sweeps.db))
    monkeypatch.setenv("PERFSWEEP_SWEEP", str(report_sweeps.amp_ckpt))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name=kernel, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError with the cell and traceback on any error

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2, "expected the two charts as PNG outputs"
    text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert f"looking at sweep {report_sweeps.amp_ckpt}" in text
    assert "amp=1 ckpt=1" in text  # the runs table, labelled by the differing axes
    # the runs table's range is the report's (metrics.throughput_range), not tokens per step over
    # the p90 and p10 step times (which left out the time between steps: 3,089-4,775 against 2,101-3,247)
    cell = next(c for c in nb.cells if c.cell_type == "code" and '"tokens_per_s_lo"' in c.source)
    runs_text = next(o["data"]["text/plain"] for o in cell.outputs if "text/plain" in o.get("data", {}))
    with sqlite3.connect(report_sweeps.db) as conn:
        figures = conn.execute(
            "SELECT tokens_per_s, step_time_ms_median, step_time_ms_p10, step_time_ms_p90 FROM runs "
            "WHERE sweep_id = ? ORDER BY job_num",
            (report_sweeps.amp_ckpt,),
        ).fetchall()
    first_block = runs_text.split("\n\n")[0].splitlines()[1:]  # pandas wraps wide frames in blocks of columns
    columns = runs_text.splitlines()[0].removesuffix("\\").split()
    after = len(columns) - columns.index("tokens_per_s")  # read from the right: a config's label has spaces
    shown_rows = [[float(w) for w in line.removesuffix("\\").split()[-after:][:3]] for line in first_block]
    assert len(shown_rows) == len(figures) == 4, runs_text
    for shown_row, (tps, median, p10, p90) in zip(shown_rows, figures, strict=True):
        lo, hi = metrics.throughput_range(tps, median, p10, p90)
        assert shown_row == pytest.approx([tps, lo, hi], abs=0.05 + 1e-9), (shown_row, lo, hi)
    # the stage breakdown (the JOIN cell) shows each config's stage times as stored, to 2 decimals
    shown = _breakdown_cell(nb)
    with sqlite3.connect(report_sweeps.db) as conn:
        stored = conn.execute(
            "SELECT r.amp, r.ckpt, s.stage, s.cpu_time_ms FROM stages s JOIN runs r ON r.id = s.run_id "
            "WHERE r.sweep_id = ? AND r.status = 'ok'",
            (report_sweeps.amp_ckpt,),
        ).fetchall()
    assert len(stored) == 4 * len(STAGES)  # four configs, every stage
    for amp, ckpt, stage, ms in stored:
        # pandas rounds 0.075 to 0.08 where Python's round gives 0.07, so compare with the stored value itself:
        # a figure shown to 2 decimals is within half a unit of its last place (plus float noise)
        assert shown[f"amp={amp} ckpt={ckpt}"][stage] == pytest.approx(ms, abs=0.005 + 1e-9)


def _breakdown_cell(nb) -> dict[str, dict[str, float]]:
    """The breakdown table as the notebook printed it: config label -> stage -> ms."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and "breakdown.round(2)" in c.source)
    text = next(o["data"]["text/plain"] for o in cell.outputs if "text/plain" in o.get("data", {}))
    lines = text.splitlines()
    columns = lines[0].split()[1:]  # "stage  data_to_device  forward ..."
    assert columns == [s for s in STAGES if s in columns] and "backward" in columns
    table = {}
    for line in lines[2:]:  # after the header and the index-name line ("config")
        words = line.split()
        table[" ".join(words[: -len(columns)])] = dict(zip(columns, map(float, words[-len(columns) :]), strict=True))
    return table
