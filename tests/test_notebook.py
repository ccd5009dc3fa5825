"""notebooks/explore_results.ipynb runs top to bottom against a database from a real sweep."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

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
    assert "backward" in text  # the stage JOIN
