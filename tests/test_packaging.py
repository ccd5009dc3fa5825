"""A regular (non-editable) install must carry the configs, migrations and the sweeper plugin;
its torch bound is the oldest torch the suite passed on."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from tests.util import REPO


def _setuptools_major() -> int:
    try:
        return int(version("setuptools").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 0


@pytest.mark.skipif(
    _setuptools_major() < 77, reason="building offline needs setuptools>=77 installed (the [test] extra brings it)"
)
def test_wheel_ships_configs_migrations_and_plugin(tmp_path: Path):
    # --no-build-isolation: build with the installed setuptools, so no network is needed
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("perfsweep-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        "perfsweep/conf/config.yaml",
        "perfsweep/conf/model/small.yaml",
        "perfsweep/conf/model/minigpt_seed.yaml",
        "perfsweep/conf/data/stdlib.yaml",
        "perfsweep/migrations/env.py",
        "perfsweep/migrations/script.py.mako",
        "perfsweep/report/build.py",
        "hydra_plugins/perfsweep_sweeper/__init__.py",
    }
    assert expected <= names, expected - names
    assert any(n.startswith("perfsweep/migrations/versions/0001") for n in names)
    assert any(n.startswith("perfsweep/migrations/versions/0002") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "perfsweep = perfsweep.__main__:cli" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_torch_bound_is_the_oldest_tested_and_an_older_torch_is_named():
    """pyproject's bound and names.OLDEST_TORCH are one fact; a sweep under an older torch (a
    conda environment, ``--no-deps``) says so in one line before its jobs start."""
    from perfsweep import preflight
    from perfsweep.names import OLDEST_TORCH

    bound = re.search(r'"torch>=(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text())
    assert bound is not None and (int(bound[1]), int(bound[2])) == OLDEST_TORCH
    older = f"{OLDEST_TORCH[0]}.{OLDEST_TORCH[1] - 1}.1+cu121"
    line = preflight.torch_notice(older)
    oldest = f"{OLDEST_TORCH[0]}.{OLDEST_TORCH[1]}"
    assert line is not None and len(line.splitlines()) == 1
    assert f"torch {older} is older than {oldest}" in line and line.endswith(f"install torch>={oldest}")
    assert preflight.torch_notice(f"{oldest}.0+cu124") is None and preflight.torch_notice("2.13.0+cpu") is None
    assert preflight.torch_notice("3.0.0") is None and preflight.torch_notice("nightly") is None
    assert preflight.torch_notice() is None  # the suite's own torch is one it is tested on


def test_a_sweep_says_its_torch_is_older_among_its_notices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """What the sweep and a plain run print before their jobs (preflight.start_notices) holds the
    torch notice, of the version a job stores (``runs.torch_version``, read from torch's
    version.py). An older torch cannot be installed beside the suite's, so its version is given."""
    from perfsweep import preflight, slots
    from tests.util import tiny_job

    cfg = tiny_job(tmp_path).cfg
    found = [slots.Placement(0)]
    assert not any("torch" in n for n in preflight.start_notices({}, [cfg], found))
    monkeypatch.setattr(slots, "torch_version", lambda: "2.4.1+cu121")
    notices = preflight.start_notices({}, [cfg], found)
    assert [n for n in notices if "torch" in n] == [preflight.torch_notice("2.4.1+cu121")]
