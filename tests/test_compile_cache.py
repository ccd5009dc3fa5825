"""Each compiled job's caches: Inductor's and Triton's own per job unless ``compile_cache=shared``
(issue 9.5).

One of the suite's slowest tests (three cold CPU compiles: 58 s on the 2-core VM, 232 s on the
H100 machine of 2026-11-27 beside 7 other workers), so it has a file of its own: pytest-xdist deals
out whole files, tests/conftest.py the longest first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.util import TINY, run_perfsweep
from tests.util import sqlite_rows as rows


@pytest.mark.slow
def test_compile_caches_are_isolated_per_job_unless_shared(tmp_path: Path):
    """Three identical compiled jobs: shared (cold), isolated, shared again.

    Inductor's default cache is pointed at an empty folder of this test, so the only cache a
    job can hit is one an earlier job of this sweep wrote: the isolated job compiles cold although
    the first job has just filled the user's cache, and the third job finds that cache warm.
    """
    env_cache = tmp_path / "user-inductor-cache"
    res = run_perfsweep(
        [
            "-m",
            "compile_cache=shared,isolated,shared",
            "compile=true",
            "device=cpu",
            *[o for o in TINY if not o.startswith("profile.")],
            "profile.enabled=false",
        ],
        tmp_path,
        env={"TORCHINDUCTOR_CACHE_DIR": str(env_cache)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = rows(
        tmp_path / "results.db",
        "SELECT job_num, compile_cache, compile_cache_hits, compile_time_ms, "
        "status, job_dir, predicted_peak_error FROM runs ORDER BY job_num",
    )
    assert [(r["compile_cache"], r["status"]) for r in runs] == [("shared", "ok"), ("isolated", "ok"), ("shared", "ok")]
    first, isolated, warm = runs
    assert first["compile_cache_hits"] == 0 and isolated["compile_cache_hits"] == 0  # both cold
    assert warm["compile_cache_hits"] > 0  # warmed by the first job
    assert warm["compile_time_ms"] < 0.5 * min(first["compile_time_ms"], isolated["compile_time_ms"])
    assert not (Path(isolated["job_dir"]) / "compile_cache").exists()  # the private cache goes with the job
    # compiled in fp32 the loss keeps eager's buffers: the ledger predicted the peak (it said -31% with AMP's rule)
    assert all(abs(r["predicted_peak_error"]) < 0.05 for r in runs), runs
    assert any(env_cache.iterdir())  # shared jobs used the user's cache
    # no grid point uses AMP: the CPU peak is measured in fp32 only (a bf16 product can take 0.14 s)
    (sweep,) = rows(tmp_path / "results.db", "SELECT cpu_matmul_fp32_flops, cpu_matmul_bf16_flops FROM sweeps")
    assert sweep["cpu_matmul_fp32_flops"] > 1e9 and sweep["cpu_matmul_bf16_flops"] is None
