"""The benchmark scripts' shared behaviour (benchmarks/_bench.py): a sweep perfsweep refuses ends
the benchmark in one line with perfsweep's reason (it was a CalledProcessError traceback that threw
the reason away), and a count of rounds too small for an interval is refused before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def bench(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_a_refused_sweep_ends_the_benchmark_in_one_line_with_perfsweeps_reason(tmp_path: Path):
    res = bench("bench_parallel.py", "--rounds", "1", "batch=0", cwd=tmp_path)  # batch=0: refused on any machine
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("bench_parallel: -m perfsweep -m launcher.parallel=1 "), line
    assert "exited 2: perfsweep: invalid config: batch=0" in line and "no job was started" in line, line


def test_one_round_is_refused_where_an_interval_is_printed(tmp_path: Path):
    res = bench("overhead.py", "--rounds", "1", cwd=tmp_path)
    assert res.returncode == 2
    assert "argument --rounds: 1: must be at least 2 (one round a side has no spread" in res.stderr
    assert not any(tmp_path.iterdir())  # nothing ran
